"""Two operator replicas with leader election: one acts, the other stands by and takes over.

Real control plane, the operator's own ServiceAccount and RBAC, real operator processes. The
failover time is a benchmark figure (``benchmarks/failover.py``), not asserted here; the tests
assert who acts, that a standby acts after the leader is SIGKILLed, and that a SIGTERMed leader
hands over at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document
from kube_rendezvous_operator.leadership import LEASE_NAME
from kubernetes import client

from tests.e2e.operator_process import OperatorProcess, create_training_pod
from tests.helpers import create_rendezvous
from tests.test_operator import judged, operator_account, read
from tests.testenv import ControlPlane, wait_until

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


class Replicas:
    """Operator replicas of one Deployment, as processes: ``--leader-election``, each with its POD_NAME."""

    def __init__(self, kubeconfig: Path, namespace: str, tmp_path: Path, stack: ExitStack) -> None:
        self.kubeconfig, self.namespace, self.tmp_path, self.stack = kubeconfig, namespace, tmp_path, stack

    def start(self, name: str) -> OperatorProcess:
        replica = OperatorProcess(
            self.kubeconfig,
            self.namespace,
            self.tmp_path / f"{name}.log",
            args=("--leader-election",),
            env={"POD_NAME": name, "POD_NAMESPACE": self.namespace},
        )
        self.stack.enter_context(replica)  # started now (healthy: the standby answers the probe too)
        return replica


@pytest.fixture
def replicas(control_plane: ControlPlane, namespace: str, crds: None, tmp_path: Path) -> Iterator[Replicas]:
    with operator_account(control_plane, namespace) as kubeconfig, ExitStack() as stack:
        yield Replicas(kubeconfig, namespace, tmp_path, stack)


def holder(admin_api: client.ApiClient, namespace: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(admin_api).read_namespaced_lease(LEASE_NAME, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease.spec.holder_identity if lease.spec is not None else None


def ready(objects: client.CustomObjectsApi, namespace: str, name: str) -> bool:
    """Whether the acting replica judged the Rendezvous (Ready past its first Unknown)."""
    return judged(read(objects, namespace, name))


def formed_state(addresses: list[str]) -> dict[str, Any]:
    """A status with a formed round of nodes ``<address>_1_0`` (what agents would have written)."""
    now = datetime.now(timezone.utc)
    nodes = [NodeId(address, 1, 0) for address in addresses]
    document = RendezvousDocument(
        round=1,
        complete=True,
        participants={node: rank for rank, node in enumerate(nodes)},
        last_heartbeats=dict.fromkeys(nodes, now),
    )
    return {"state": encode_document(document)}


def announced(admin_api: client.ApiClient, namespace: str, name: str, reason: str) -> list[str]:
    """Messages of the Events with ``reason`` posted on Rendezvous ``name``."""
    listed = client.CoreV1Api(admin_api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    # An Event repeated in place (count > 1) counts as many times as it was posted.
    return [event.message for event in listed.items if event.reason == reason for _ in range(event.count or 1)]


def test_one_replica_acts_and_after_it_is_killed_the_standby_evicts_and_reconciles(
    replicas: Replicas,
    admin_api: client.ApiClient,
    objects: client.CustomObjectsApi,
    namespace: str,
    agent_kubeconfig: Path,  # the trainer ServiceAccount the pods run as
) -> None:
    first = replicas.start("replica-a")
    wait_until(lambda: holder(admin_api, namespace) == "replica-a", 30, "replica-a to hold the Lease")
    second = replicas.start("replica-b")
    create_rendezvous(objects, namespace, "before", minNodes=1, maxNodes=2)
    wait_until(lambda: ready(objects, namespace, "before"), 60, "the leader to reconcile a Rendezvous")
    assert "is the leader" in first.log.read_text()
    assert "is the leader" not in second.log.read_text() and "standing by" in second.log.read_text()
    assert second.healthy(), "the standby answers the liveness probe"
    # Every replica serves /metrics (no scrape target is down); the leader metric tells which one acts.
    assert first.metric("kube_rendezvous_operator_leader") == 1
    assert second.metric("kube_rendezvous_operator_leader") == 0
    assert second.metric("kube_rendezvous_operator_build_info") == 1

    # A round forms while replica-a leads: it announces it once.
    objects.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "before",
        {"status": formed_state(["127.0.0.51", "127.0.0.52"])},
        _content_type="application/merge-patch+json",
    )
    wait_until(lambda: announced(admin_api, namespace, "before", "RoundCompleted"), 60, "the leader's RoundCompleted")

    version = read(objects, namespace, "before")["metadata"]["resourceVersion"]
    first.kill()  # SIGKILL: no release; the standby waits for the Lease to go stale on its own clock
    create_rendezvous(objects, namespace, "after", minNodes=1, maxNodes=2)
    wait_until(lambda: holder(admin_api, namespace) == "replica-b", 60, "the standby to take the Lease")
    wait_until(lambda: ready(objects, namespace, "after"), 60, "the new leader to reconcile a new Rendezvous")
    assert second.metric("kube_rendezvous_operator_leader") == 1
    # The new leader has seen "before" (it reconciled a newer object) and wrote nothing to it: no duplicate write.
    assert read(objects, namespace, "before")["metadata"]["resourceVersion"] == version

    # Evictions keep working across the failover: the pod of a node of the formed round is deleted.
    core = client.CoreV1Api(admin_api)
    for index, address in enumerate(["127.0.0.51", "127.0.0.52"]):
        create_training_pod(core, namespace, f"trainer-{index}", "before", address)
    core.delete_namespaced_pod("trainer-1", namespace, grace_period_seconds=0)
    wait_until(
        lambda: read(objects, namespace, "before")["status"].get("evictedNodes") == ["127.0.0.52_1_0"],
        60,
        "the new leader to evict the node of the deleted pod",
    )
    # The new leader saw the formed round for the first time, but did not announce it again.
    assert len(announced(admin_api, namespace, "before", "RoundCompleted")) == 1
    assert len(announced(admin_api, namespace, "before", "NodeJoined")) == 2
    assert "replica-b is the leader" in second.log.read_text()
    # Deletion keeps working across the failover: the new leader releases the finalizer (no agent is alive).
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "before")

    def deleted() -> bool:
        try:
            read(objects, namespace, "before")
        except client.ApiException as exc:
            return exc.status == 404
        return False

    wait_until(deleted, 60, "the new leader to let the deleted Rendezvous go")


def test_a_leader_stopped_with_sigterm_releases_the_lease_for_the_standby(
    replicas: Replicas, admin_api: client.ApiClient, objects: client.CustomObjectsApi, namespace: str
) -> None:
    first = replicas.start("replica-a")
    wait_until(lambda: holder(admin_api, namespace) == "replica-a", 30, "replica-a to hold the Lease")
    second = replicas.start("replica-b")
    first.stop()  # SIGTERM, as a rollout or a drain does
    assert first.process is not None and first.process.returncode is not None
    # Released on the way out: empty, or already taken by the standby (it tries every 2 s).
    assert holder(admin_api, namespace) in ("", "replica-b")
    wait_until(lambda: holder(admin_api, namespace) == "replica-b", 30, "the standby to take the released Lease")
    create_rendezvous(objects, namespace, "after", minNodes=1, maxNodes=2)
    wait_until(lambda: ready(objects, namespace, "after"), 60, "the new leader to reconcile")
    assert "is the leader" in second.log.read_text()
