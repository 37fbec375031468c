"""The operator on the real API server, with real agents: conditions, Events, close, delete,
eviction of a gone pod, and an operator that dies mid-round. Hostile states: test_operator_security.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.harness import ElasticJob, training_in_world
from tests.e2e.operator_process import OperatorProcess, create_training_pod
from tests.helpers import REPO, create_rendezvous, pod_failed
from tests.testenv import ControlPlane, wait_until

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


@contextmanager
def operator_account(control_plane: ControlPlane, namespace: str) -> Iterator[Path]:
    """A kubeconfig of the operator's ServiceAccount in ``namespace``, bound to docs/operator-rbac.yaml."""
    documents = (REPO / "docs" / "operator-rbac.yaml").read_text().split("\n---\n")
    control_plane.kubectl("apply", "-f", "-", input=documents[0])
    kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "kube-rendezvous-operator")
    binding = f"kube-rendezvous-operator-{namespace}"
    control_plane.kubectl(
        "create",
        "clusterrolebinding",
        binding,
        "--clusterrole=kube-rendezvous-operator",
        f"--serviceaccount={namespace}:kube-rendezvous-operator",
    )
    try:
        yield kubeconfig
    finally:
        control_plane.kubectl("delete", "clusterrolebinding", binding, check=False)


@contextmanager
def running_operator(control_plane: ControlPlane, namespace: str, log: Path) -> Iterator[OperatorProcess]:
    """The operator watching ``namespace`` as its own ServiceAccount, bound to docs/operator-rbac.yaml."""
    with operator_account(control_plane, namespace) as kubeconfig:
        running = OperatorProcess(kubeconfig, namespace, log)
        try:
            running.start()
            yield running
        finally:
            running.stop()


@pytest.fixture
def operator(control_plane: ControlPlane, namespace: str, crds: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    with running_operator(control_plane, namespace, tmp_path / "operator.log") as running:
        yield running


MakeJob = Callable[..., ElasticJob]


def read(objects: client.CustomObjectsApi, namespace: str, name: str = "job") -> dict[str, Any]:
    found: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return dict(found)


def condition(obj: dict[str, Any], condition_type: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == condition_type), None)


def judged(obj: dict[str, Any]) -> bool:
    """Whether the operator judged the Rendezvous: its Ready condition is past the first Ready=Unknown.

    (Ready=True means the job can train: a round formed; without agents it stays False, NoStateYet.)
    """
    ready = condition(obj, "Ready")
    return ready is not None and ready.get("status") != "Unknown"


def events(admin_api: client.ApiClient, namespace: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every Event on the Rendezvous ``job``."""
    listed = client.CoreV1Api(admin_api).list_namespaced_event(namespace, field_selector="involvedObject.name=job")
    return [(str(item.type), str(item.reason), str(item.message)) for item in listed.items]


def reasons(admin_api: client.ApiClient, namespace: str) -> list[str]:
    return [reason for _, reason, _ in events(admin_api, namespace)]


def gone(objects: client.CustomObjectsApi, namespace: str) -> bool:
    try:
        read(objects, namespace)
    except client.ApiException as exc:
        return bool(exc.status == 404)
    return False


class TestConditionsAndEvents:
    def test_ready_condition_then_events_for_joins_the_round_and_close(
        self,
        operator: OperatorProcess,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
    ) -> None:
        create_rendezvous(objects, namespace, minNodes=2, maxNodes=2)
        ready = wait_until(lambda: condition(read(objects, namespace), "Ready"), 30, "a Ready condition")
        wait_until(lambda: judged(read(objects, namespace)), 30, "Ready judged")
        obj = read(objects, namespace)
        # No agent yet: the job cannot train (Ready=False), it waits for its agents (Progressing=True).
        assert (condition(obj, "Ready") or {}).get("reason") == "NoStateYet"
        assert (condition(obj, "Progressing") or {}).get("status") == "True"
        assert ready["observedGeneration"] == obj["metadata"]["generation"]
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]

        job = make_job(nnodes="2")
        agents = [job.start_agent() for _ in range(2)]
        assert job.wait(agents, 120) == [0, 0], job.logs()
        wait_until(lambda: "Closed" in reasons(admin_api, namespace), 30, "a Closed event")
        seen = events(admin_api, namespace)
        assert [reason for _, reason, _ in seen].count("NodeJoined") == 2
        completed = [message for _, reason, message in seen if reason == "RoundCompleted"]
        assert completed and completed[0].startswith("round 0 completed with 2 nodes")
        wait_until(lambda: (condition(read(objects, namespace), "Closed") or {}).get("status") == "True", 30, "Closed")
        assert (condition(read(objects, namespace), "Closed") or {}).get("reason") == "Succeeded"  # the run finished
        wait_until(lambda: (condition(read(objects, namespace), "Ready") or {}).get("reason") == "Closed", 30, "closed")
        assert (condition(read(objects, namespace), "Progressing") or {}).get("status") == "False"
        assert operator.metric("kube_rendezvous_rounds_completed_total") >= 1
        assert operator.metric("kube_rendezvous_node_joins_total") == 2

    def test_a_closed_rendezvous_is_deleted_after_its_ttl(
        self, operator: OperatorProcess, objects: client.CustomObjectsApi, namespace: str, make_job: MakeJob
    ) -> None:
        create_rendezvous(objects, namespace, minNodes=1, maxNodes=1, ttlSecondsAfterClosed=1)
        job = make_job(nnodes="1")
        assert job.wait([job.start_agent()], 120) == [0], job.logs()
        wait_until(lambda: gone(objects, namespace), 60, "the operator to delete the closed Rendezvous")


class TestDeclarativeClose:
    def test_patching_spec_closed_ends_waiting_agents_cleanly(
        self,
        operator: OperatorProcess,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
    ) -> None:
        create_rendezvous(objects, namespace, minNodes=3, maxNodes=3)
        job = make_job(nnodes="3")
        agents = [job.start_agent() for _ in range(2)]
        wait_until(lambda: read(objects, namespace).get("status", {}).get("participantCount") == 2, 60, "2 joined")
        objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job", {"spec": {"closed": True}})
        assert job.wait(agents, 90) == [0, 0], job.logs()
        wait_until(lambda: "Closed" in reasons(admin_api, namespace), 30, "a Closed event")
        # Who closed it and when, in the status, the condition and the Event (a person, not the run's success).
        said = "a person closed it (spec.closed, set by OpenAPI-Generator at "
        assert read(objects, namespace)["status"]["closeReason"].startswith(f"Requested: {said}")
        wait_until(
            lambda: (condition(read(objects, namespace), "Closed") or {}).get("reason") == "Requested", 30, "why"
        )
        closed = [message for _, reason, message in events(admin_api, namespace) if reason == "Closed"]
        assert closed and said in closed[0], closed

    def test_deleting_a_rendezvous_with_training_agents_lets_it_go_at_once_and_they_exit_0(
        self, operator: OperatorProcess, objects: client.CustomObjectsApi, namespace: str, make_job: MakeJob
    ) -> None:
        create_rendezvous(objects, namespace, minNodes=2, maxNodes=2)
        job = make_job(nnodes="2", steps=60, step_seconds=1.0)
        agents = [job.start_agent() for _ in range(2)]
        wait_until(lambda: training_in_world(agents, 4), 120, "2 agents training")
        objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job")
        assert gone(objects, namespace)  # no finalizer: nothing holds it, with or without the operator
        assert job.wait(agents, 90) == [0, 0], job.logs()
        assert all("the Rendezvous was deleted" in agent.output() for agent in agents), job.logs()


class TestEviction:
    def test_deleting_a_training_pod_evicts_its_node_so_survivors_reform_without_waiting_for_heartbeats(
        self,
        operator: OperatorProcess,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
    ) -> None:
        # Heartbeats expire only after 5 s x 60 = 300 s here: recovery within the deadline below
        # can only come from the operator's eviction.
        create_rendezvous(objects, namespace, minNodes=2, maxNodes=3)
        core = client.CoreV1Api(admin_api)
        addresses = [f"127.0.0.{11 + index}" for index in range(3)]
        for index, address in enumerate(addresses):
            create_training_pod(core, namespace, f"trainer-{index}", "job", address)
        job = make_job(
            nnodes="2:3",
            steps=30,
            step_seconds=1.0,
            rdzv_conf={"last_call_timeout": "5", "keep_alive_max_attempt": "60"},
        )
        agents = [job.start_agent(f"trainer-{index}", local_addr=address) for index, address in enumerate(addresses)]
        by_group = wait_until(lambda: training_in_world(agents, 6), 120, "3 agents training together")
        victim = by_group[1]
        killed_at = time.monotonic()
        victim.kill_pod()
        core.delete_namespaced_pod(victim.name, namespace, grace_period_seconds=0)
        survivors = [agent for agent in agents if agent is not victim]
        wait_until(lambda: training_in_world(survivors, 4, min_step=0), 120, "survivors training in a new round")
        print(f"\nwith eviction, survivors trained again {time.monotonic() - killed_at:.1f} s after the kill")
        evicted = read(objects, namespace)["status"]["evictedNodes"]
        assert evicted == [victim.node_name] and evicted[0].startswith(f"{addresses[int(victim.name[-1])]}_")
        assert "NodeEvicted" in reasons(admin_api, namespace)

        # The Job replaces the pod: same name, same IP, PID 1 again. Its new node is another
        # incarnation, which the old eviction does not touch: it rejoins and trains.
        create_training_pod(core, namespace, victim.name, "job", addresses[int(victim.name[-1])])
        replacement = job.start_agent(f"{victim.name}-replacement", local_addr=addresses[int(victim.name[-1])])
        wait_until(lambda: training_in_world([*survivors, replacement], 6, min_step=0), 120, "the replacement training")
        assert replacement.node_name != victim.node_name
        assert read(objects, namespace)["status"]["evictedNodes"] == evicted
        job.stop()

    def test_a_healthy_pod_that_got_a_dead_pods_ip_is_never_evicted(
        self,
        operator: OperatorProcess,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
    ) -> None:
        create_rendezvous(objects, namespace, minNodes=2, maxNodes=2)
        core = client.CoreV1Api(admin_api)
        addresses = ["127.0.0.21", "127.0.0.22"]
        for index, address in enumerate(addresses):
            create_training_pod(core, namespace, f"new-{index}", "job", address)
        job = make_job(nnodes="2", steps=12, step_seconds=1.0)
        agents = [job.start_agent(f"new-{index}", local_addr=address) for index, address in enumerate(addresses)]
        wait_until(lambda: training_in_world(agents, 4), 120, "2 agents training together")
        # A pod that failed a minute ago and held 127.0.0.22 before: the operator sees it now
        # (as after its own restart) and must not take the live node on that IP for its own.
        create_training_pod(core, namespace, "old-1", "job", addresses[1])
        pod_failed(core, namespace, "old-1", finished=datetime.now(timezone.utc) - timedelta(minutes=1), reason=None)
        wait_until(
            lambda: "pod " + namespace + "/old-1 is Failed, but nodes" in operator.log.read_text(),
            60,
            "the operator to look at the failed pod",
        )
        assert not read(objects, namespace)["status"].get("evictedNodes")
        assert job.wait(agents, 120) == [0, 0], job.logs()
        assert {item["world_size"] for item in job.results()} == {4}


class TestOperatorOutage:
    def test_a_round_completes_while_the_operator_is_dead_and_it_catches_up_after_a_restart(
        self, operator: OperatorProcess, objects: client.CustomObjectsApi, namespace: str, make_job: MakeJob
    ) -> None:
        create_rendezvous(objects, namespace, minNodes=2, maxNodes=2)
        wait_until(lambda: judged(read(objects, namespace)), 30, "Ready judged")
        job = make_job(nnodes="2")
        first = job.start_agent()
        wait_until(lambda: read(objects, namespace).get("status", {}).get("participantCount") == 1, 60, "1 joined")
        operator.kill()
        second = job.start_agent()
        assert job.wait([first, second], 120) == [0, 0], job.logs()
        assert read(objects, namespace)["status"]["closed"] is True
        assert condition(read(objects, namespace), "Closed") is None  # nobody was there to say so
        operator.start()
        wait_until(
            lambda: (condition(read(objects, namespace), "Closed") or {}).get("status") == "True",
            60,
            "the restarted operator to catch up",
        )


class TestEvictionWrites:
    def test_concurrent_evictions_are_never_lost(
        self,
        objects: client.CustomObjectsApi,
        namespace: str,
        control_plane: ControlPlane,
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from kube_rendezvous._kube.kubeapi import KubernetesApi, load_api_client
        from kube_rendezvous_operator import evictions

        create_rendezvous(objects, namespace)
        api = KubernetesApi(load_api_client(str(control_plane.admin_kubeconfig), None)[0])
        nodes = [f"10.0.0.{index}_1_{index}" for index in range(8)]
        with ThreadPoolExecutor(len(nodes)) as pool:
            written = list(pool.map(lambda node: evictions.add_evictions(api, namespace, "job", [node]), nodes))
        assert all(item is not None and node in item for node, item in zip(nodes, written, strict=True))
        assert sorted(read(objects, namespace)["status"]["evictedNodes"]) == sorted(nodes)


class TestManyRendezvous:
    def test_with_more_rendezvous_than_executor_threads_a_new_one_is_still_reconciled(
        self, operator: OperatorProcess, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        """Each Rendezvous has a folder running for its whole life. Run as a sync Kopf daemon, each
        held one of Kopf's executor threads (min(32, cores + 4)), and past that count no other sync
        handler ran again: no condition, no eviction, no timer. 40 exceeds the pool on any machine."""
        for index in range(40):
            create_rendezvous(objects, namespace, f"job-{index:02}", minNodes=1, maxNodes=2)
        wait_until(
            lambda: judged(read(objects, namespace, "job-39")),
            120,
            "the 40th Rendezvous to be judged",
        )
        create_rendezvous(objects, namespace, "one-more", minNodes=1, maxNodes=2)
        wait_until(
            lambda: judged(read(objects, namespace, "one-more")),
            60,
            f"a Rendezvous created after 40 others to be judged (operator log: {operator.log})",
        )
