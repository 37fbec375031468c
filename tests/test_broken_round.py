"""A round that loses a member restarts at once, whatever its workers are doing (tensorplay's launcher and torchrun).

Measured before the lost-member rule: the survivors' workers waited in ``init_process_group``
for a world that would never come, until the process group timeout (30 min), while their agents saw
healthy workers and nobody waiting. Here one agent's workers are held before ``init_process_group``
(``HOLD_BEFORE_INIT``), so the others' workers are certainly waiting there when that agent goes:
the test does not depend on timing. Each test prints the time from the fault to every survivor's
workers training in the new round.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.harness import Agent, ElasticJob, entering_init
from tests.e2e.operator_process import OperatorProcess, create_training_pods
from tests.helpers import create_rendezvous
from tests.testenv import ControlPlane, wait_until

MakeJob = Callable[..., ElasticJob]
LAUNCHERS = ["tensorplay", "torchrun"]
#: The last call of these jobs: round 0 forms when the third agent joins (max), not on a timer.
LAST_CALL = "15"
#: A bound far below the 30 min the survivors waited without the rule (the launcher's monitor interval
#: is 0.5 s here; one round formation is the last call of 15 s plus seconds).
RECOVERY_BOUND = 90


def status_of(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    shown = json.loads(control_plane.kubectl("-n", namespace, "get", "rdzv", "job", "-o", "json").stdout)
    return dict(shown.get("status") or {})


def start_three_with_one_held(job: ElasticJob, addresses: list[str]) -> tuple[Agent, list[Agent]]:
    """Three agents whose round forms with all three; the third's workers hold before init_process_group."""
    survivors = job.start(addresses[:2])
    victim = job.start_agent("trainer-2", local_addr=addresses[2], env={"HOLD_BEFORE_INIT": "1"})
    agents = [*survivors, victim]
    wait_until(
        lambda: all(entering_init(agent, 6) == job.nproc_per_node for agent in agents),
        120,
        "every worker of a round of 3 agents announcing init_process_group",
    )
    return victim, survivors


def recovered(job: ElasticJob, survivors: list[Agent], since: float, what: str) -> float:
    """Wait for every survivor's workers to train in a new round of 2 agents; return the seconds it took."""
    job.wait_training(survivors, min_step=0, timeout=RECOVERY_BOUND, what=f"survivors training after {what}")
    seconds = time.monotonic() - since
    print(f"\n{what}: every survivor trained again {seconds:.1f} s later")
    assert job.wait(survivors, 240) == [0, 0], job.logs()
    return seconds


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_participant_sigtermed_while_the_others_workers_start_breaks_the_round_at_once(
    make_job: MakeJob, control_plane: ControlPlane, namespace: str, launcher: str
) -> None:
    job = make_job(nnodes="2:3", steps=3, launcher=launcher, rdzv_conf={"last_call_timeout": LAST_CALL})
    victim, survivors = start_three_with_one_held(job, ["127.0.0.1"] * 3)
    signalled = time.monotonic()
    victim.terminate()
    recovered(job, survivors, signalled, f"{launcher}: SIGTERM of a participant while the others' workers start")
    departure = status_of(control_plane, namespace)["lastDeparture"]
    assert (departure["round"], departure["nodes"]) == (0, [{"node": victim.node_name, "reason": "Left"}])
    assert any("lost" in agent.output() and "re-rendezvous" in agent.output() for agent in survivors), job.logs()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_participant_sigtermed_while_the_others_train_breaks_the_round_at_once(
    make_job: MakeJob, control_plane: ControlPlane, namespace: str, launcher: str
) -> None:
    job = make_job(
        nnodes="2:3", steps=20, step_seconds=0.5, launcher=launcher, rdzv_conf={"last_call_timeout": LAST_CALL}
    )
    agents = job.start(3)
    victim = job.wait_training(agents)[1]
    signalled = time.monotonic()
    victim.terminate()
    survivors = [agent for agent in agents if agent is not victim]
    recovered(job, survivors, signalled, f"{launcher}: SIGTERM of a participant while the others train")
    departure = status_of(control_plane, namespace)["lastDeparture"]
    assert departure["nodes"] == [{"node": victim.node_name, "reason": "Left"}]


@pytest.fixture
def operator(control_plane: ControlPlane, namespace: str, crds: None, tmp_path: Path) -> Any:
    from tests.test_operator import running_operator

    with running_operator(control_plane, namespace, tmp_path / "operator.log") as running:
        yield running


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_participants_pod_deleted_while_the_others_workers_start_is_evicted_and_breaks_the_round(
    operator: OperatorProcess,
    make_job: MakeJob,
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
    launcher: str,
) -> None:
    # Heartbeats expire only after 5 s x 60 = 300 s: the round can only break through the eviction.
    create_rendezvous(objects, namespace, minNodes=2, maxNodes=3)
    core = client.CoreV1Api(admin_api)
    addresses = create_training_pods(core, namespace, [f"127.0.0.{21 + index}" for index in range(3)])
    job = make_job(
        nnodes="2:3",
        steps=3,
        launcher=launcher,
        rdzv_conf={"last_call_timeout": LAST_CALL, "keep_alive_max_attempt": "60"},
    )
    victim, survivors = start_three_with_one_held(job, addresses)
    killed = time.monotonic()
    victim.kill_pod()  # the pod's death: no leave is written
    core.delete_namespaced_pod(victim.name, namespace, grace_period_seconds=0)
    recovered(job, survivors, killed, f"{launcher}: pod of a participant deleted while the others' workers start")
    # The carry rule: the fold that evicted it opened round 1 with the survivors in it, so they asked nothing.
    assert all("was carried into round 1" in agent.output() for agent in survivors), job.logs()
    status = status_of(control_plane, namespace)
    assert status["evictedNodes"] == [victim.node_name]
    assert status["lastDeparture"]["nodes"] == [{"node": victim.node_name, "reason": "Evicted"}]
    listed = core.list_namespaced_event(namespace, field_selector="involvedObject.name=job").items
    broken = [item.message for item in listed if item.reason == "RoundBroken"]
    assert broken == [f"node {victim.node_name} was evicted from round 0; its other members re-rendezvous without it"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_planned_scale_up_re_forms_the_round_with_no_round_broken_warning(
    operator: OperatorProcess,
    make_job: MakeJob,
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
    launcher: str,
) -> None:
    # The members leave and join again to let a waiting node in (the framework's scale-up): nothing broke.
    create_rendezvous(objects, namespace, minNodes=2, maxNodes=3)
    job = make_job(nnodes="2:3", steps=30, step_seconds=0.5, launcher=launcher, rdzv_conf={"last_call_timeout": "2"})
    first = job.start_training(2)
    agents = [*first, job.start_agent()]
    job.wait_training(agents, min_step=0, what="3 agents training together after the scale-up")
    core = client.CoreV1Api(admin_api)

    def events() -> list[tuple[str, str]]:
        listed = core.list_namespaced_event(namespace, field_selector="involvedObject.name=job").items
        return [(item.reason, item.message) for item in listed]

    wait_until(
        lambda: any(reason == "RoundCompleted" and "with 3 nodes" in message for reason, message in events()),
        30,
        "the RoundCompleted Event of the round of 3",
    )
    assert not [item for item in events() if item[0] == "RoundBroken"], events()
    assert not status_of(control_plane, namespace).get("lastDeparture")
    assert job.wait(agents, 240) == [0, 0, 0], job.logs()
