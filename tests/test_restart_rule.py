"""The operator's container-restart rule reads the Leases once per restart, not at every event of the pod.

Real control plane (RBAC on), the operator's own handler (``restarts.judge_restarts``) run in
this process as the operator's ServiceAccount, every request through ``tests.faultproxy`` (which
counts them, and refuses the first Lease list with a 500). The pod events are the bodies the pod
watch hands the handler; the kubelet's real restart of a container is ``test_real_node``'s.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import kopf
import pytest
from kube_rendezvous._kube.kubeapi import RENDEZVOUS_LABEL, KubernetesApi, load_api_client, resource_path
from kube_rendezvous._kube.leases import ANNOTATION_NODE, LABEL_LEASE, LEASE_PLURAL, micro_time, node_lease_name
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document
from kube_rendezvous_operator import events, pods_rules
from kube_rendezvous_operator.config import OperatorConfig
from kube_rendezvous_operator.memory import Observed, OperatorMemo, stored_state
from kube_rendezvous_operator.restarts import judge_restarts
from kubernetes import client

from tests.faultproxy import FaultProxy, proxy_kubeconfig
from tests.helpers import create_rendezvous
from tests.test_faults import fault_proxy  # noqa: F401 - a fixture
from tests.test_operator import GROUP, PLURAL, VERSION, operator_account, read
from tests.testenv import ControlPlane

POD_IP = "10.9.0.5"
#: The agent that ran in the container before the kubelet restarted it, and the one that runs now.
EARLIER = NodeId(POD_IP, 7, 0)
LATER = NodeId(POD_IP, 8, 0)
#: A node of another pod, never judged here.
OTHER = NodeId("10.9.0.6", 7, 0)


def lease(namespace: str, node: NodeId, renewed: datetime) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node_lease_name("job", node),
            "namespace": namespace,
            "labels": {RENDEZVOUS_LABEL: "job", LABEL_LEASE: "node"},
            "annotations": {ANNOTATION_NODE: str(node)},
        },
        "spec": {"holderIdentity": str(node), "leaseDurationSeconds": 15, "renewTime": micro_time(renewed)},
    }


def restarted_pod(finished: datetime) -> kopf.Body:
    """A training pod's body after the kubelet restarted its container, which ended at ``finished``."""
    return kopf.Body(
        {
            "metadata": {"name": "trainer-0", "namespace": "x", "uid": "uid-trainer-0", "labels": {}},
            "status": {
                "phase": "Running",
                "podIP": POD_IP,
                "containerStatuses": [
                    {
                        "name": "agent",
                        "restartCount": 1,
                        "state": {"running": {}},
                        "lastState": {
                            "terminated": {"exitCode": 137, "finishedAt": finished.strftime("%Y-%m-%dT%H:%M:%SZ")}
                        },
                    }
                ],
            },
        }
    )


def test_a_restart_is_judged_once_with_the_leases_and_again_only_after_a_failed_lease_list(
    control_plane: ControlPlane,
    namespace: str,
    crds: None,
    objects: client.CustomObjectsApi,
    fault_proxy: FaultProxy,  # noqa: F811 - the fixture
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    finished = now - timedelta(seconds=30)
    create_rendezvous(objects, namespace)
    document = RendezvousDocument(
        round=1, complete=True, participants={EARLIER: 0, OTHER: 1}, wait_list=frozenset({LATER})
    )
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "job", {"status": {"state": encode_document(document)}}
    )
    # Our client, not the generated one: that one re-serializes a MicroTime string into a format the server refuses.
    admin = KubernetesApi(load_api_client(str(control_plane.admin_kubeconfig), None)[0])
    for node, renewed in ((EARLIER, finished - timedelta(seconds=20)), (LATER, now), (OTHER, now)):
        admin.request("POST", resource_path(LEASE_PLURAL, namespace), body=lease(namespace, node, renewed))

    posted: list[str] = []
    # Kopf posts Events from its own engine, which does not run here: record what would be posted.
    monkeypatch.setattr(events, "post_event", lambda body, event, *_: posted.append(event.reason))
    monkeypatch.setattr(events, "post_on_related", lambda objects, event: None)  # the pod's own Event
    with operator_account(control_plane, namespace) as kubeconfig:
        proxied = proxy_kubeconfig(kubeconfig, fault_proxy.url, tmp_path / "proxied.kubeconfig")
        memo = OperatorMemo(OperatorConfig(), KubernetesApi(load_api_client(str(proxied), None)[0], 5.0))
        key = (namespace, "job")
        status = read(objects, namespace)["status"]
        memo.record(key).observed = Observed(dict(status), stored_state(memo, key, status["state"]).document)
        memo.record(key).selector = pods_rules.PodSelector({RENDEZVOUS_LABEL: "job"}, "default")

        def lease_lists() -> int:
            return sum(1 for event in fault_proxy.events if event.method == "GET" and event.path.endswith("/leases"))

        def pod_event(finished_at: datetime = finished) -> None:
            judge_restarts("MODIFIED", restarted_pod(finished_at), {RENDEZVOUS_LABEL: "job"}, namespace, memo)

        # 1. The Lease list fails: nothing is judged, nothing evicted, and the restart stays to judge.
        fault_proxy.inject("status", status=500, count=1, methods={"GET"}, path=r"/leases$")
        pod_event()
        assert lease_lists() == 1 and fault_proxy.stats()["faults"]["status"] == 1
        assert "evictedNodes" not in read(objects, namespace)["status"]
        assert memo.records[key].judged_restarts == {}

        # 2. The pod's next event judges it: the earlier agent (silent since before the restart) is
        # evicted; the other pod's node is not, nor the new agent waiting to join (no heartbeat on record).
        pod_event()
        assert lease_lists() == 2
        assert read(objects, namespace)["status"]["evictedNodes"] == [str(EARLIER)]
        assert posted == ["NodeEvicted"]

        # 3. Further events of the same restart (the pod's status updates) read nothing and write nothing.
        requests = fault_proxy.stats()["requests"]
        for _ in range(5):
            pod_event()
        assert fault_proxy.stats()["requests"] == requests
        assert posted == ["NodeEvicted"]

        # 4. A later restart of the same container is judged anew: one Lease list (its earlier agent is
        # evicted already, so nothing is written).
        pod_event(now + timedelta(seconds=1))
        assert lease_lists() == 3
        assert read(objects, namespace)["status"]["evictedNodes"] == [str(EARLIER)]
        assert posted == ["NodeEvicted"]
