"""Elastic tensorplay jobs end to end: real agents as separate processes, each with a
ServiceAccount token as a pod would have, rendezvousing through a Rendezvous object on the
real API server. The operator is NOT running: the data path needs only the API server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.harness import ElasticJob, training_in_world
from tests.helpers import holds_for
from tests.testenv import ControlPlane, wait_until

MakeJob = Callable[..., ElasticJob]


def rendezvous_status(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    shown = json.loads(control_plane.kubectl("-n", namespace, "get", "rdzv", "job", "-o", "json").stdout)
    status: dict[str, Any] = shown.get("status", {})
    return status


def assert_one_correct_world(results: list[dict[str, Any]], world_size: int) -> None:
    in_world = [item for item in results if item["world_size"] == world_size]
    assert sorted(item["rank"] for item in in_world) == list(range(world_size)), in_world
    assert all(sum_ == item["expected"] for item in in_world for sum_ in item["sums"])
    assert item_groups(in_world) == set(range(world_size // 2))


def item_groups(results: list[dict[str, Any]]) -> set[int]:
    return {item["group_rank"] for item in results}


class TestOneRound:
    def test_three_agents_with_two_workers_each_all_reduce_with_unique_global_ranks(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        job = make_job(nnodes="3")
        started = time.monotonic()
        agents = job.start(3)
        assert job.wait(agents, 180) == [0, 0, 0], job.logs()
        print(f"\n3 agents x 2 workers, one round and 3 all_reduces: {time.monotonic() - started:.1f} s")
        results = job.results()
        assert len(results) == 6
        assert_one_correct_world(results, 6)
        status = rendezvous_status(control_plane, namespace)
        assert (status["phase"], status["round"], status["participantCount"]) == ("Closed", 0, 3)


class TestElasticity:
    # rank 0 only: another pod's loss, SIGKILLed, runs on real pods (test_real_node.py's SIGKILLed container) and
    # through the expiry of a silenced survivor (test_network.py).
    @pytest.mark.parametrize("victim_group_rank", [0], ids=["rank-0-agent"])
    def test_survivors_of_a_killed_pod_form_a_new_round_and_finish(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str, victim_group_rank: int
    ) -> None:
        job = make_job(nnodes="2:3", steps=10, step_seconds=1.0, rdzv_conf={"last_call_timeout": "5"})
        agents = job.start(3)
        victim = job.wait_training(agents)[victim_group_rank]
        killed_at = time.monotonic()
        victim.kill_pod()
        survivors = [agent for agent in agents if agent is not victim]
        job.wait_training(survivors, min_step=0, what="survivors training in a new round")
        print(f"\nsurvivors trained again {time.monotonic() - killed_at:.1f} s after the kill")
        assert job.wait(survivors, 180) == [0, 0], job.logs()
        assert_one_correct_world(job.last_results(), 4)
        status = rendezvous_status(control_plane, namespace)
        assert status["round"] >= 1
        assert status["participantCount"] == 2
        print(control_plane.kubectl("-n", namespace, "get", "rdzv", "-o", "wide").stdout)

    def test_a_late_agent_joins_the_next_round_when_max_nodes_allows(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        job = make_job(nnodes="2:3", steps=12, step_seconds=1.0, rdzv_conf={"last_call_timeout": "1"})
        first = job.start_training(2)
        late = job.start_agent("late")
        assert job.wait([*first, late], 240) == [0, 0, 0], job.logs()
        assert_one_correct_world(job.last_results(), 6)
        status = rendezvous_status(control_plane, namespace)
        assert status["round"] >= 1 and status["participantCount"] == 3


class TestSigtermMeansLeave:
    def test_a_drained_pod_leaves_and_the_survivors_finish_every_step(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        job = make_job(nnodes="2:3", steps=10, step_seconds=1.0, rdzv_conf={"last_call_timeout": "5"})
        agents = job.start(3)
        victim = job.wait_training(agents)[1]

        def participants() -> set[str]:
            return {item["node"] for item in rendezvous_status(control_plane, namespace).get("participants", [])}

        assert victim.node_name in participants()
        signalled_at = time.monotonic()
        victim.terminate()
        wait_until(lambda: victim.node_name not in participants(), 30, "the drained node to leave the participants")
        print(f"\nthe drained node left {time.monotonic() - signalled_at:.1f} s after SIGTERM")
        assert rendezvous_status(control_plane, namespace)["phase"] != "Closed"
        assert job.wait([victim], 60) != [0], victim.output()[-3000:]
        survivors = [agent for agent in agents if agent is not victim]
        assert job.wait(survivors, 240) == [0, 0], job.logs()
        results = job.last_results()
        assert_one_correct_world(results, 4)
        assert all(len(item["sums"]) == 10 for item in results)
        assert rendezvous_status(control_plane, namespace)["phase"] == "Closed"  # closed by success only

    def test_when_every_pod_is_signalled_no_agent_exits_0_and_the_rendezvous_stays_open(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        job = make_job(nnodes="2", steps=60, step_seconds=1.0)
        agents = job.start_training(2)
        for agent in agents:
            agent.terminate()
        codes = job.wait(agents, 60)
        assert all(code != 0 for code in codes), (codes, job.logs())
        assert job.results() == []
        assert rendezvous_status(control_plane, namespace)["phase"] != "Closed"


class TestApiServerRestart:
    def test_the_round_completes_when_the_api_server_restarts_mid_rendezvous(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        job = make_job(nnodes="3", steps=2)
        first = job.start(2)
        wait_until(
            lambda: rendezvous_status(control_plane, namespace).get("participantCount") == 2,
            120,
            "two agents to join the round",
        )
        control_plane.restart_apiserver(downtime=3)
        third = job.start_agent()
        assert job.wait([*first, third], 240) == [0, 0, 0], job.logs()
        assert_one_correct_world(job.results(), 6)

    def test_a_training_job_survives_a_30_s_outage_without_losing_a_node(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        # The outage is twice the heartbeat expiry (15 s) and half the retry timeout (60 s).
        job = make_job(nnodes="3", steps=45, step_seconds=1.0)
        agents = job.start_training(3)
        control_plane.restart_apiserver(downtime=30)
        assert job.wait(agents, 240) == [0, 0, 0], job.logs()
        results = job.results()
        assert_one_correct_world(results, 6)
        # Nobody was pruned mid-training: no worker restarted and the rendezvous never re-formed.
        assert len(results) == 6 and {item["restart"] for item in results} == {0}
        assert rendezvous_status(control_plane, namespace)["round"] == 0, rendezvous_status(control_plane, namespace)


class TestTheSinglePointOfFailure:
    def test_with_p10d_killing_the_agent_that_hosts_the_tcp_store_hangs_the_survivors(self, make_job: MakeJob) -> None:
        job = make_job(backend="p10d", nnodes="2:3", steps=10, step_seconds=1.0, rdzv_conf={"last_call_timeout": "5"})
        agents = job.start_training(3)
        host = next(agent for agent in agents if "hosts the rendezvous TCP store" in agent.output())
        host.kill_pod()
        survivors = [agent for agent in agents if agent is not host]
        holds_for(
            lambda: all(agent.alive() for agent in survivors) and not training_in_world(survivors, 4, min_step=0),
            45,
            "p10d survivors hung (alive, never training in a new round)",
        )
        assert job.results() == []
