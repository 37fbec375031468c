"""No last-call wait for pods that no longer exist (issue #28): with the operator, which knows the job's
training pods, a round completes as soon as every live training pod's agent joined and no pod is starting.

Real agents (tensorplay's launcher and torchrun), the real operator, real Pod objects (no kubelet runs:
the tests set their phase and IP, as ``create_training_pod`` does). Without the operator the rule does
not apply (the last test here; every other end-to-end test runs so too).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from kubernetes import client

from tests.e2e.harness import ElasticJob
from tests.e2e.operator_process import OperatorProcess, create_training_pods
from tests.helpers import create_rendezvous
from tests.testenv import ControlPlane

MakeJob = Callable[..., ElasticJob]
#: A last call no test waits out: a round that completes within the tests' deadlines did not wait for it.
LONG_LAST_CALL = "600"


@pytest.fixture
def operator(control_plane: ControlPlane, namespace: str, crds: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    from tests.test_operator import running_operator

    with running_operator(control_plane, namespace, tmp_path / "operator.log") as running:
        yield running


def status_of(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    shown = json.loads(control_plane.kubectl("-n", namespace, "get", "rdzv", "job", "-o", "json").stdout)
    return dict(shown.get("status") or {})


def formed_rounds(control_plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return list(status_of(control_plane, namespace).get("recentRounds") or [])


@pytest.mark.parametrize("launcher", ["tensorplay", "torchrun"])
def test_a_round_completes_once_every_live_training_pod_joined_and_again_after_one_is_deleted(
    operator: OperatorProcess,
    make_job: MakeJob,
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
    launcher: str,
) -> None:
    """``--nnodes=2:4`` with three pods: the round forms with three, not at max (4) and not after the 600 s
    last call. Then one pod is deleted: its node is evicted, the round breaks, and the two survivors
    form the next round at once, again without the last call."""
    create_rendezvous(objects, namespace, minNodes=2, maxNodes=4)
    core = client.CoreV1Api(admin_api)
    addresses = create_training_pods(core, namespace, [f"127.0.0.{31 + index}" for index in range(3)])
    job = make_job(
        nnodes="2:4",
        steps=40,
        step_seconds=0.5,
        launcher=launcher,
        rdzv_conf={"last_call_timeout": LONG_LAST_CALL, "keep_alive_max_attempt": "60"},
    )
    agents = job.start(addresses)
    by_group = job.wait_training(agents, what="3 agents training in a round of 3")
    assert [(item["nodes"], item.get("completedBy")) for item in formed_rounds(control_plane, namespace)] == [
        (3, "TrainingPodsJoined")
    ]
    assert all("once every live training pod joined" in agent.output() for agent in agents), job.logs()

    victim = by_group[1]
    survivors = [agent for agent in agents if agent is not victim]
    victim.kill_pod()
    core.delete_namespaced_pod(victim.name, namespace, grace_period_seconds=0)
    job.wait_training(survivors, min_step=0, what="the 2 survivors training")
    rounds = formed_rounds(control_plane, namespace)
    assert (rounds[-1]["nodes"], rounds[-1].get("completedBy")) == (2, "TrainingPodsJoined"), rounds
    assert status_of(control_plane, namespace)["evictedNodes"] == [victim.node_name]


def test_a_running_pod_whose_agent_froze_is_not_waited_for_once_its_lease_expired(
    operator: OperatorProcess,
    make_job: MakeJob,
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    """One agent of three is frozen (SIGSTOP, its workers too) while its pod stays Running. Its node goes
    when its Lease expires (3 s here), and the two survivors form the next round at once: the pod is
    live, but its agent is gone, so the 600 s last call is not waited out for it."""
    create_rendezvous(objects, namespace, minNodes=2, maxNodes=4)
    core = client.CoreV1Api(admin_api)
    addresses = create_training_pods(core, namespace, [f"127.0.0.{61 + index}" for index in range(3)])
    job = make_job(
        nnodes="2:4",
        steps=60,
        step_seconds=0.5,
        rdzv_conf={"last_call_timeout": LONG_LAST_CALL, "keep_alive_interval": "1", "keep_alive_max_attempt": "3"},
    )
    agents = job.start(addresses)
    victim = job.wait_training(agents, what="3 agents training in a round of 3")[1]
    survivors = [agent for agent in agents if agent is not victim]
    frozen = [psutil.Process(victim.process.pid), *psutil.Process(victim.process.pid).children(recursive=True)]
    try:
        for process in frozen:
            process.suspend()
        job.wait_training(survivors, min_step=0, what="the 2 survivors training")
        rounds = formed_rounds(control_plane, namespace)
        assert (rounds[-1]["nodes"], rounds[-1].get("completedBy")) == (2, "TrainingPodsJoined"), rounds
        assert core.read_namespaced_pod(victim.name, namespace).status.phase == "Running"
        departure = status_of(control_plane, namespace)["lastDeparture"]
        assert departure["nodes"] == [{"node": victim.node_name, "reason": "Expired"}], departure
    finally:
        victim.kill_pod()


def test_a_pod_still_starting_is_waited_for_until_the_last_call(
    operator: OperatorProcess,
    make_job: MakeJob,
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    """Three running pods have joined, a fourth is Pending: the round waits for it until the last call
    (8 s) ends, then completes with the three."""
    create_rendezvous(objects, namespace, minNodes=2, maxNodes=4)
    core = client.CoreV1Api(admin_api)
    addresses = create_training_pods(core, namespace, [f"127.0.0.{41 + index}" for index in range(3)])
    core.create_namespaced_pod(  # Pending: no kubelet will start it
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="trainer-3", labels={"kube-rendezvous.io/rendezvous": "job"}),
            spec=client.V1PodSpec(containers=[client.V1Container(name="agent", image="trainer:latest")]),
        ),
    )
    job = make_job(nnodes="2:4", steps=3, rdzv_conf={"last_call_timeout": "8"})
    agents = job.start(addresses)
    job.wait_training(agents, min_step=0, what="3 agents training in a round of 3")
    rounds = formed_rounds(control_plane, namespace)
    assert [(item["nodes"], item.get("completedBy")) for item in rounds] == [(3, "LastCall")], rounds
    assert job.wait(agents, 120) == [0, 0, 0], job.logs()


def test_without_the_operator_the_last_call_holds_as_before(
    make_job: MakeJob,
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
    crds: None,
) -> None:
    """The same three running training pods, all joined, but no operator: the agents' own writer knows no
    pods, so the round waits out the last call (8 s) before it completes with the three."""
    create_rendezvous(objects, namespace, minNodes=2, maxNodes=4)
    core = client.CoreV1Api(admin_api)
    addresses = create_training_pods(core, namespace, [f"127.0.0.{51 + index}" for index in range(3)])
    job = make_job(nnodes="2:4", steps=3, rdzv_conf={"last_call_timeout": "8"})
    agents = job.start(addresses)
    job.wait_training(agents, min_step=0, what="3 agents training in a round of 3")
    rounds = formed_rounds(control_plane, namespace)
    assert [(item["nodes"], item.get("completedBy")) for item in rounds] == [(3, "LastCall")], rounds
    assert not any("once every live training pod joined" in agent.output() for agent in agents), job.logs()
    assert job.wait(agents, 120) == [0, 0, 0], job.logs()
