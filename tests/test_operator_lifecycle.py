"""A job's whole life on the real API server (issue 45): deletion needs no operator, the TTL deletes only the
object it was counted for, a deleted pod stopped being trusted when its deletion was requested, and the
operator keeps nothing of a deleted Rendezvous.

The operator runs as its own process (``OperatorProcess``) where it must; the TTL deletion and the pod rule
are the operator's own functions run in this process, against the real API server. Pure part:
``test_operator_lifecycle_logic.py``.
"""

from __future__ import annotations

import asyncio
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import kopf
import pytest
from kube_rendezvous._kube.kubeapi import RENDEZVOUS_LABEL, KubernetesApi, load_api_client, resource_path
from kube_rendezvous._kube.leases import LEASE_PLURAL
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document
from kube_rendezvous._rules.summary import parse_time
from kube_rendezvous_operator import events, pods_rules, ttl
from kube_rendezvous_operator.config import OperatorConfig
from kube_rendezvous_operator.gone_pods import evict_nodes_of_gone_pods
from kube_rendezvous_operator.memory import Observed, OperatorMemo, stored_state
from kubernetes import client

from tests.e2e.operator_process import OperatorProcess, create_training_pod
from tests.helpers import create_rendezvous
from tests.test_operator import GROUP, PLURAL, VERSION, condition, read, running_operator
from tests.test_restart_rule import lease
from tests.testenv import ControlPlane, wait_until

#: The finalizer every Rendezvous carried up to the fourth release.
PREVIOUS_FINALIZER = "kube-rendezvous.io/close-before-delete"


def exists(objects: client.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        read(objects, namespace, name)
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def finalizers(objects: client.CustomObjectsApi, namespace: str, name: str) -> list[str]:
    return list(read(objects, namespace, name)["metadata"].get("finalizers") or [])


def create_held(objects: client.CustomObjectsApi, namespace: str, name: str) -> None:
    """A Rendezvous as the previous release left it: carrying its finalizer."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Rendezvous",
        "metadata": {"name": name, "finalizers": [PREVIOUS_FINALIZER]},
        "spec": {"minNodes": 1, "maxNodes": 2},
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def delete(objects: client.CustomObjectsApi, namespace: str, name: str) -> None:
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def test_deletion_needs_no_operator_and_the_previous_releases_finalizer_is_released(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str, crds: None, tmp_path: Path
) -> None:
    # Left by the previous release: one Rendezvous carrying its finalizer, one held by it while being deleted.
    create_held(objects, namespace, "old")
    create_held(objects, namespace, "old-deleted")
    delete(objects, namespace, "old-deleted")
    assert read(objects, namespace, "old-deleted")["metadata"].get("deletionTimestamp")
    with running_operator(control_plane, namespace, tmp_path / "operator.log") as operator:
        wait_until(
            lambda: not exists(objects, namespace, "old-deleted") and not finalizers(objects, namespace, "old"),
            10,
            "the operator to release both objects of the previous release from its finalizer",
        )
        create_rendezvous(objects, namespace)
        wait_until(lambda: condition(read(objects, namespace, "job"), "Ready"), 10, "the operator to reconcile job")
        assert finalizers(objects, namespace, "job") == []
        operator.stop()
    # No operator now (uninstalled, or stopped): deleting takes no one's help.
    for name in ("job", "old"):
        delete(objects, namespace, name)
    wait_until(
        lambda: not exists(objects, namespace, "job") and not exists(objects, namespace, "old"),
        5,
        "both Rendezvous deleted with no operator running",
    )


class NotStopped(asyncio.Event):
    """A task's stop flag, never set here; false until set (as Kopf's ``stopped`` was, and ``is_set``)."""

    def __bool__(self) -> bool:
        return self.is_set()


def test_the_ttl_deletes_only_the_object_it_counted_for(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str, crds: None
) -> None:
    spec = {"minNodes": 1, "maxNodes": 1, "ttlSecondsAfterClosed": 0}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Rendezvous", "metadata": {"name": "job"}, "spec": spec}
    counted = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)["metadata"]["uid"]
    memo = OperatorMemo(OperatorConfig(), KubernetesApi(load_api_client(str(control_plane.admin_kubeconfig), None)[0]))
    # Closed long ago, as the operator last saw it; then deleted and created anew under the same name.
    memo.record((namespace, "job")).observed = Observed(
        {"closed": True, "lastChangeTime": "2026-01-01T00:00:00Z"}, None
    )
    delete(objects, namespace, "job")
    newer = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)["metadata"]["uid"]

    def ttl_delete(uid: str) -> None:
        task = ttl.delete_after_ttl(
            spec=spec, namespace=namespace, name="job", uid=uid, stopped=NotStopped(), memo=memo
        )
        asyncio.run(asyncio.wait_for(task, 20))

    ttl_delete(counted)
    assert exists(objects, namespace, "job"), "the TTL counted for the first object deleted the newer one"
    assert read(objects, namespace, "job")["metadata"]["uid"] == newer
    ttl_delete(newer)
    assert not exists(objects, namespace, "job")


def test_a_newer_pod_on_the_address_of_a_pod_in_its_grace_period_keeps_its_node(
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
    crds: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod deleted with 300 s of grace stays Terminating (its Node's kubelet never confirms); its agent went
    silent when the deletion was requested, and a newer pod's agent on its address heartbeats after that."""
    address = "10.9.0.7"
    dead, newer = NodeId(address, 7, 0), NodeId(address, 8, 0)
    api = KubernetesApi(load_api_client(str(control_plane.admin_kubeconfig), None)[0])
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    pod_body = {
        "metadata": {"name": "trainer-0", "labels": {RENDEZVOUS_LABEL: "job"}},
        "spec": {
            "nodeName": "lost-node",
            "serviceAccountName": "trainer",
            "containers": [{"name": "agent", "image": "trainer:latest"}],
        },
    }
    core.create_namespaced_pod(namespace, pod_body)
    core.patch_namespaced_pod_status(
        "trainer-0", namespace, {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
    )
    core.delete_namespaced_pod("trainer-0", namespace, grace_period_seconds=300)
    pod: dict[str, Any] = api.request("GET", f"/api/v1/namespaces/{namespace}/pods/trainer-0")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 300  # Terminating: no kubelet confirms its end
    requested = parse_time(pod["metadata"]["deletionTimestamp"]) - timedelta(seconds=300)
    create_rendezvous(objects, namespace)
    document = RendezvousDocument(round=1, complete=True, participants={dead: 0, newer: 1})
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "job", {"status": {"state": encode_document(document)}}
    )
    for node, renewed in ((dead, requested - timedelta(seconds=5)), (newer, requested + timedelta(seconds=30))):
        api.request("POST", resource_path(LEASE_PLURAL, namespace), body=lease(namespace, node, renewed))
    posted: list[str] = []
    monkeypatch.setattr(events, "post_event", lambda body, event, *_: posted.append(event.reason))
    monkeypatch.setattr(events, "post_on_related", lambda objects, event: None)  # the pod's own Event
    memo = OperatorMemo(OperatorConfig(), api)
    key = (namespace, "job")
    status = read(objects, namespace)["status"]
    memo.record(key).observed = Observed(dict(status), stored_state(memo, key, status["state"]).document)
    memo.record(key).selector = pods_rules.PodSelector({RENDEZVOUS_LABEL: "job"}, "default")

    evict_nodes_of_gone_pods("MODIFIED", kopf.Body(pod), {RENDEZVOUS_LABEL: "job"}, namespace, memo)
    assert read(objects, namespace)["status"]["evictedNodes"] == [str(dead)]
    assert posted == ["NodeEvicted"]


def test_the_operator_keeps_nothing_of_a_deleted_rendezvous(
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
    crds: None,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    names = ["job-0", "job-1", "job-2"]
    for index, name in enumerate(names):
        create_rendezvous(objects, namespace, name)
        for pod in range(2):
            create_training_pod(core, namespace, f"{name}-{pod}", name, f"10.9.{index}.{pod + 1}")
    with running_operator(control_plane, namespace, tmp_path / "operator.log") as operator:

        def held() -> tuple[float, float]:
            return (
                operator.metric("kube_rendezvous_operator_tracked_rendezvous"),
                operator.metric("kube_rendezvous_operator_training_pods"),
            )

        wait_until(lambda: held() == (3, 6), 15, "the operator to track 3 Rendezvous and list their 6 pods")
        for name in names:
            delete(objects, namespace, name)
        wait_until(
            lambda: held() == (0, 0), 10, "the operator to forget the deleted Rendezvous", explain=lambda: str(held())
        )


#: Rendezvous created and deleted by the memory test (issue 50: one record per Rendezvous, dropped whole).
MANY = 1000
#: Of those, the ones that live (with their tasks, a folder each, and a training pod) until they are deleted.
LIVE = 10
#: A finalizer of the test's own: it holds the others while they are deleted (their deletion started).
TEST_HOLD = "tests.kube-rendezvous.io/hold"


def per_rendezvous_series(operator: OperatorProcess, namespace: str) -> list[str]:
    """The operator's metric series labelled with a Rendezvous of ``namespace`` (its other public memory)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    return [line for line in lines if not line.startswith("#") and f'namespace="{namespace}"' in line]


#: Seconds the operator may take to list, then to forget, a thousand Rendezvous (a helper saw 60 s missed at load 12).
FORGET_SECONDS = 180


def test_the_operator_holds_nothing_of_a_thousand_deleted_rendezvous(
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
    crds: None,
    tmp_path: Path,
) -> None:
    """1,000 Rendezvous, tracked by the operator process, then deleted: its memory, seen through its metrics
    (the records it keeps, the pods it indexes, every series labelled with a Rendezvous), holds nothing of them.

    ``LIVE`` of them live, each with a training pod, their tasks and a folder; the others are tracked while
    their deletion has started (held by ``TEST_HOLD``: what the operator keeps of them is their record, which
    its Rendezvous watch fills, and no task), then go when the hold is released. A thousand live ones would
    run a thousand folders, each renewing its writer Lease every 2 s: beyond the test's API server.
    """
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    live, held_names = [f"live-{index}" for index in range(LIVE)], [f"held-{index}" for index in range(MANY - LIVE)]

    def create_deleted(name: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Rendezvous",
            "metadata": {"name": name, "finalizers": [TEST_HOLD]},
            "spec": {"minNodes": 1, "maxNodes": 2},
        }
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        delete(objects, namespace, name)

    def release(name: str) -> None:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": None}}
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create_deleted, held_names))
        for index, name in enumerate(live):
            create_rendezvous(objects, namespace, name)
            create_training_pod(core, namespace, f"{name}-0", name, f"10.9.{index}.1")
        with running_operator(control_plane, namespace, tmp_path / "operator.log") as operator:

            def held() -> tuple[float, float]:
                return (
                    operator.metric("kube_rendezvous_operator_tracked_rendezvous"),
                    operator.metric("kube_rendezvous_operator_training_pods"),
                )

            # Deadlines for a loaded machine (CI's parallel workers): the claim is what it keeps, not how fast.
            wait_until(
                lambda: held() == (MANY, LIVE),
                FORGET_SECONDS,
                f"the operator to track {MANY} Rendezvous and list the {LIVE} pods of the live ones",
                explain=lambda: str(held()),
            )
            assert len(per_rendezvous_series(operator, namespace)) >= MANY
            list(pool.map(lambda name: delete(objects, namespace, name), live))
            list(pool.map(release, held_names))
            wait_until(
                lambda: held() == (0, 0) and not per_rendezvous_series(operator, namespace),
                FORGET_SECONDS,
                f"the operator to forget the {MANY} deleted Rendezvous",
                explain=lambda: f"{held()}, {len(per_rendezvous_series(operator, namespace))} series left",
            )
