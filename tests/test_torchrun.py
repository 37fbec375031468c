"""Stock ``torchrun --rdzv-backend=k8s`` end to end: PyTorch agents (torch's own launcher, which
finds ``k8s`` through its ``torchrun.handlers`` entry point) meet through a Rendezvous object on
the real API server, as pods with a ServiceAccount token would, and train over gloo on CPU.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from kube_rendezvous._kube.leases import writer_lease_name

from tests.e2e.harness import ElasticJob
from tests.test_elastic_job import assert_one_correct_world, rendezvous_status
from tests.testenv import ControlPlane, wait_until

MakeJob = Callable[..., ElasticJob]
#: What the writer logs when it removes nodes because their heartbeats expired (not a leave).
EXPIRY_LINE = "removing nodes whose Lease was not renewed"


def participant_nodes(control_plane: ControlPlane, namespace: str) -> set[str]:
    return {item["node"] for item in rendezvous_status(control_plane, namespace).get("participants", [])}


def writer_node(control_plane: ControlPlane, namespace: str) -> str:
    """The node whose agent holds the writer Lease of Rendezvous ``job`` ("" when none does)."""
    shown = control_plane.kubectl("-n", namespace, "get", "lease", writer_lease_name("job"), "-o", "json").stdout
    holder = str((json.loads(shown).get("spec") or {}).get("holderIdentity") or "")
    return holder.removeprefix("agent/")


@pytest.fixture
def make_job(make_job: MakeJob) -> MakeJob:
    """The jobs of this module run stock torchrun."""
    return functools.partial(make_job, launcher="torchrun")


class TestTorchStore:
    """``TorchKubernetesStore`` under torch's own C++ ``PrefixStore``, on the real API server."""

    def test_every_call_torchs_agent_and_barriers_make_works_through_a_cpp_prefix_store(
        self, namespace: str, agent_kubeconfig: Path
    ) -> None:
        import subprocess
        import sys

        from tests.helpers import REPO

        done = subprocess.run(
            [sys.executable, "-m", "tests.e2e.torch_store_check", f"{namespace}/job", str(agent_kubeconfig)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-3000:]


class TestTorchrun:
    @pytest.mark.parametrize("selected_by", ["flags", "PET_RDZV_environment"])
    def test_three_pods_with_two_workers_each_all_reduce_with_unique_global_ranks(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str, selected_by: str
    ) -> None:
        job = make_job(nnodes="3", select_by_environment=selected_by != "flags")
        agents = job.start(3)
        assert job.wait(agents, 180) == [0, 0, 0], job.logs()
        results = job.results()
        assert len(results) == 6
        assert_one_correct_world(results, 6)
        status = rendezvous_status(control_plane, namespace)
        assert (status["phase"], status["round"], status["participantCount"]) == ("Closed", 0, 3)

    # rank 0 only: the loss of another pod is the same path for tensorplay's launcher and torchrun
    # (SIGKILLed on real pods: test_real_node.py) and runs on real pods in test_workloads.py.
    @pytest.mark.parametrize("victim_group_rank", [0], ids=["rank-0-pod"])
    def test_survivors_of_a_killed_pod_form_a_new_round_and_finish(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str, victim_group_rank: int
    ) -> None:
        job = make_job(nnodes="2:3", steps=10, step_seconds=1.0, rdzv_conf={"last_call_timeout": "5"})
        agents = job.start(3)
        victim = job.wait_training(agents)[victim_group_rank]
        victim.kill_pod()
        survivors = [agent for agent in agents if agent is not victim]
        job.wait_training(survivors, min_step=0, what="survivors training in a new round")
        assert job.wait(survivors, 180) == [0, 0], job.logs()
        assert_one_correct_world(job.last_results(), 4)
        assert rendezvous_status(control_plane, namespace)["round"] >= 1

    @pytest.mark.parametrize("victim_role", ["writer", "not-writer"])
    def test_a_sigterm_pod_leaves_and_the_others_finish_every_step(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str, victim_role: str
    ) -> None:
        """torch's launcher never calls ``shutdown()`` after a signal: the handler leaves at exit.

        The drained node must leave by its own request, not be removed when its heartbeats
        expire, and when it was the writer it hands the writer Lease over on its way out.
        """
        job = make_job(nnodes="2:3", steps=10, step_seconds=1.0, rdzv_conf={"last_call_timeout": "5"})
        agents = job.start_training(3)
        by_node = {agent.node_name: agent for agent in agents}
        writer = wait_until(lambda: by_node.get(writer_node(control_plane, namespace)), 30, "an agent writer")
        victim = writer if victim_role == "writer" else next(agent for agent in agents if agent is not writer)
        victim.terminate()
        try:
            wait_until(
                lambda: victim.node_name not in participant_nodes(control_plane, namespace),
                30,
                "the drained node to leave the participants",
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{job.logs()}") from None
        assert rendezvous_status(control_plane, namespace)["phase"] != "Closed"
        assert job.wait([victim], 60) != [0], victim.output()[-3000:]
        # Read at once: without a release the survivors take the writer Lease only after it went
        # unrenewed for its whole duration (10 s).
        assert writer_node(control_plane, namespace) != victim.node_name, victim.output()[-3000:]
        assert "left the rendezvous" in victim.output(), victim.output()[-3000:]
        survivors = [agent for agent in agents if agent is not victim]
        assert job.wait(survivors, 240) == [0, 0], job.logs()
        assert not any(EXPIRY_LINE in agent.output() for agent in agents), job.logs()
        results = job.last_results()
        assert_one_correct_world(results, 4)
        assert all(len(item["sums"]) == 10 for item in results)

    def test_a_late_pod_joins_the_next_round(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        job = make_job(nnodes="2:3", steps=12, step_seconds=1.0, rdzv_conf={"last_call_timeout": "1"})
        first = job.start_training(2)
        late = job.start_agent("late")
        assert job.wait([*first, late], 240) == [0, 0, 0], job.logs()
        assert_one_correct_world(job.last_results(), 6)
        status = rendezvous_status(control_plane, namespace)
        assert status["round"] >= 1 and status["participantCount"] == 3

    def test_training_goes_on_through_an_api_server_restart(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        job = make_job(nnodes="3", steps=30, step_seconds=1.0)
        agents = job.start_training(3)
        control_plane.restart_apiserver(downtime=5)
        assert job.wait(agents, 240) == [0, 0, 0], job.logs()
        results = job.results()
        assert_one_correct_world(results, 6)
        assert {item["restart"] for item in results} == {0}


def test_the_torch_adapter_never_loads_tensorplay() -> None:
    """tensorplay and torch cannot share a process: the second one's pybind types abort it."""
    import subprocess
    import sys

    probe = (
        "import sys, torch.distributed\n"
        "import kube_rendezvous._adapters.torchrun\n"
        "kube_rendezvous._adapters.torchrun.torch_framework()\n"
        "loaded = sorted(name for name in sys.modules if name.split('.')[0] == 'tensorplay')\n"
        "print(loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
