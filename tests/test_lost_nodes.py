"""The lost-node rule on the real API server (issue #46 items 1-2): the real operator, a played Node (an object only:
no kubelet) whose Ready condition the test turns False, and played training pods bound to it.

- ``NodeLost`` names the Node, the pod and the out-of-service taint command, on the Rendezvous and on the pod,
  once per outage however many resyncs judge the Node again.
- With ``spec.lostNodes.failPodsAfterSeconds`` the pod becomes Failed with a ``DisruptionTarget`` condition once
  that many seconds passed since the Node went NotReady, and not before, and is then deleted at once (a
  finalizer, as a Job's, keeps it to be seen); a pod on a Ready Node is left alone.
- Without it the pod is untouched, even with the operator allowed to patch pods/status.

A real Node that dies, with a Job that replaces the pod, is the three-node suite's (issue #46 item 4).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_rendezvous._kube.kubeapi import KubernetesApi, load_api_client, resource_path
from kube_rendezvous._kube.leases import LEASE_PLURAL
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document
from kubernetes import client

from tests.e2e.operator_process import OperatorProcess
from tests.helpers import REPO, create_rendezvous, holds_for
from tests.test_lifecycle import create_pod_on
from tests.test_operator import GROUP, PLURAL, VERSION, operator_account
from tests.test_restart_rule import lease
from tests.testenv import ControlPlane, wait_until

LOST_ADDRESS, READY_ADDRESS = "10.9.1.5", "10.9.1.6"
AGENT = NodeId(LOST_ADDRESS, 7, 0)
#: The option's seconds in the test: long enough that "not before" is seen for well over the NotReady wait.
FAIL_AFTER = 20
TAINT = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
#: Keeps trainer-0 after its deletion, as the Job controller's tracking finalizer does, so the test sees it.
FINALIZER = "kube-rendezvous.io/test-keeps-the-pod"


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(status: str, since: datetime) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": "KubeletReady" if status == "True" else "KubeletNotReady",
        "lastTransitionTime": stamp(since),
        "lastHeartbeatTime": stamp(since),
    }


@contextmanager
def lost_nodes_operator(
    control_plane: ControlPlane, namespace: str, log: Path, grant: bool = True
) -> Iterator[OperatorProcess]:
    """The operator as its ServiceAccount bound to docs/operator-rbac.yaml and (``grant``)
    docs/operator-rbac-lost-nodes.yaml (patch on pods/status), judging NotReady Nodes at its shortest wait and
    resyncing every 2 s."""
    role = next(
        doc
        for doc in yaml.safe_load_all((REPO / "docs" / "operator-rbac-lost-nodes.yaml").read_text())
        if doc and doc["kind"] == "ClusterRole"
    )
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    binding = f"kube-rendezvous-operator-lost-nodes-{namespace}"
    with operator_account(control_plane, namespace) as kubeconfig:
        if grant:
            control_plane.kubectl(
                "create",
                "clusterrolebinding",
                binding,
                f"--clusterrole={role['metadata']['name']}",
                f"--serviceaccount={namespace}:kube-rendezvous-operator",
            )
        args = ("--node-not-ready-seconds", "1", "--resync-seconds", "2")
        try:
            with OperatorProcess(kubeconfig, namespace, log, args=args) as running:
                yield running
        finally:
            control_plane.kubectl("delete", "clusterrolebinding", binding, check=False)


class LostNode:
    """A played Node ``lost`` with pod trainer-0 (whose agent is a member of the round) and a Ready Node with
    pod trainer-1; ``go_not_ready`` turns the first NotReady."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.lost, self.ready = f"lost-{namespace[-6:]}", f"ready-{namespace[-6:]}"
        self.since: datetime | None = None

    def create(self) -> None:
        now = datetime.now(timezone.utc)
        for node in (self.lost, self.ready):
            self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
            self.core.patch_node_status(node, {"status": {"conditions": [ready_condition("True", now)]}})
        create_pod_on(self.core, self.namespace, "trainer-0", self.lost, LOST_ADDRESS)
        self.core.patch_namespaced_pod("trainer-0", self.namespace, {"metadata": {"finalizers": [FINALIZER]}})
        create_pod_on(self.core, self.namespace, "trainer-1", self.ready, READY_ADDRESS)

    def delete(self) -> None:
        with contextlib.suppress(client.ApiException):
            self.core.patch_namespaced_pod("trainer-0", self.namespace, {"metadata": {"finalizers": None}})
        for node in (self.lost, self.ready):
            self.core.delete_node(node)

    def go_not_ready(self) -> datetime:
        """Ready=Unknown from now (as the node-lifecycle controller says of a silent kubelet); returns since when."""
        self.since = datetime.now(timezone.utc).replace(microsecond=0)
        self.core.patch_node_status(self.lost, {"status": {"conditions": [ready_condition("Unknown", self.since)]}})
        return self.since

    def pod(self, name: str) -> client.V1Pod:
        return self.core.read_namespaced_pod(name, self.namespace)

    def disruption(self, name: str) -> client.V1PodCondition | None:
        conditions = self.pod(name).status.conditions or []
        return next((item for item in conditions if item.type == "DisruptionTarget"), None)

    def events(self, involved: str, reason: str) -> list[str]:
        listed = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={involved}")
        return [str(item.message) for item in listed.items if item.reason == reason]


def member_state(control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str) -> None:
    """A formed round with trainer-0's agent, and its node Lease last renewed now (it falls silent at once)."""
    now = datetime.now(timezone.utc)
    document = RendezvousDocument(round=1, complete=True, participants={AGENT: 0}, last_heartbeats={AGENT: now})
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "job", {"status": {"state": encode_document(document)}}
    )
    admin = KubernetesApi(load_api_client(str(control_plane.admin_kubeconfig), None)[0])
    admin.request("POST", resource_path(LEASE_PLURAL, namespace), body=lease(namespace, AGENT, now))


@pytest.fixture
def played(control_plane: ControlPlane, crds: None, namespace: str, admin_api: client.ApiClient) -> Iterator[LostNode]:
    node = LostNode(client.CoreV1Api(admin_api), namespace)
    node.create()
    try:
        yield node
    finally:
        node.delete()


@contextmanager
def outage(
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    played: LostNode,
    log: Path,
    *,
    grant: bool = True,
    **spec: Any,
) -> Iterator[datetime]:
    """Rendezvous ``job`` (``spec``) with trainer-0's agent in its round, the operator running (allowed to patch
    pods/status if ``grant``) and its pod census taken, then the lost Node NotReady: yields since when."""
    create_rendezvous(objects, played.namespace, minNodes=1, maxNodes=2, **spec)
    member_state(control_plane, objects, played.namespace)
    with lost_nodes_operator(control_plane, played.namespace, log, grant) as operator:
        wait_until(lambda: operator.metric("kube_rendezvous_operator_resyncs_total") >= 1, 30, "a pod census")
        yield played.go_not_ready()


def assert_node_lost_told(played: LostNode, option: bool) -> str:
    """The one NodeLost Event on the Rendezvous (and on trainer-0): the Node, the pod, the taint command, what it
    does; whether the operator marks the pods itself."""
    assert played.since is not None
    messages = wait_until(lambda: played.events("job", "NodeLost"), 60, "NodeLost on the Rendezvous")
    assert len(messages) == 1, messages
    message = messages[0]
    assert message.startswith(
        f"Kubernetes node {played.lost} is NotReady (Ready=Unknown) since {stamp(played.since)} "
        "and the agents of pod trainer-0 on it are silent"
    ), message
    assert f"run `kubectl taint nodes {played.lost} {TAINT}`" in message
    assert "Kubernetes then force-deletes the pods on it and detaches their volumes, so the Job can replace them" in (
        message
    )
    assert ("The operator marks them Failed itself (DisruptionTarget)" in message) is option
    assert "trainer-1" not in message and played.ready not in message
    assert wait_until(lambda: played.events("trainer-0", "NodeLost"), 30, "NodeLost on the pod") == [message]
    return message


class TestLostNode:
    def test_node_lost_names_the_fix_once_and_with_the_option_the_pod_is_failed_after_its_seconds_not_before(
        self, control_plane: ControlPlane, objects: client.CustomObjectsApi, played: LostNode, tmp_path: Path
    ) -> None:
        spec = {"lostNodes": {"failPodsAfterSeconds": FAIL_AFTER}}
        with outage(control_plane, objects, played, tmp_path / "operator.log", **spec) as since:
            message = assert_node_lost_told(played, option=True)
            assert f"at {stamp(since + timedelta(seconds=FAIL_AFTER))}" in message
            # Not before its seconds: Running, no DisruptionTarget, until a second before they end.
            remaining = (since + timedelta(seconds=FAIL_AFTER - 1) - datetime.now(timezone.utc)).total_seconds()
            assert remaining > 5, "the NodeLost Event came too late to see the pod not failed before its time"
            holds_for(
                lambda: played.pod("trainer-0").status.phase == "Running" and played.disruption("trainer-0") is None,
                remaining,
                "trainer-0 Running until its seconds end",
            )
            wait_until(
                lambda: played.pod("trainer-0").status.phase == "Failed", 30, "trainer-0 Failed after its seconds"
            )
            failed_at = datetime.now(timezone.utc)
            assert failed_at >= since + timedelta(seconds=FAIL_AFTER)
            condition = played.disruption("trainer-0")
            assert condition is not None
            assert (condition.status, condition.reason) == ("True", "DeletionByKubeRendezvous")
            assert (
                condition.message == f"kube-rendezvous: Kubernetes node {played.lost} is NotReady since {stamp(since)}"
            )
            assert condition.last_transition_time >= since + timedelta(seconds=FAIL_AFTER)
            # Then deleted at once, as the pod garbage collector does (its token dies with it).
            deleted = wait_until(
                lambda: played.pod("trainer-0").metadata.deletion_timestamp is not None, 30, "trainer-0 deleted"
            )
            assert deleted and played.pod("trainer-0").metadata.deletion_grace_period_seconds == 0
            for involved in ("job", "trainer-0"):
                told = wait_until(
                    lambda on=involved: played.events(on, "LostPodsFailed"), 30, f"LostPodsFailed on {involved}"
                )
                assert told[0].startswith(
                    f"marked pod trainer-0 on Kubernetes node {played.lost} (NotReady since {stamp(since)}) Failed "
                    "with condition DisruptionTarget"
                ), told
            # The pod on the Ready Node is left alone; NodeLost stays one Event over the resyncs since.
            holds_for(
                lambda: (
                    played.pod("trainer-1").status.phase == "Running"
                    and played.disruption("trainer-1") is None
                    and len(played.events("job", "NodeLost")) == len(played.events("job", "LostPodsFailed")) == 1
                ),
                5,
                "trainer-1 untouched, one NodeLost and one LostPodsFailed over the resyncs",
            )

    def test_without_the_option_the_pod_is_told_about_and_left_alone(
        self, control_plane: ControlPlane, objects: client.CustomObjectsApi, played: LostNode, tmp_path: Path
    ) -> None:
        with outage(control_plane, objects, played, tmp_path / "operator.log") as since:
            assert_node_lost_told(played, option=False)
            # Well past any wait (the option's default is off; the operator may patch pods/status here).
            until = (since + timedelta(seconds=FAIL_AFTER + 5) - datetime.now(timezone.utc)).total_seconds()
            holds_for(
                lambda: played.pod("trainer-0").status.phase == "Running" and played.disruption("trainer-0") is None,
                max(until, 10),
                "trainer-0 untouched",
            )
            assert played.events("job", "LostPodsFailed") == []
            assert len(played.events("job", "NodeLost")) == 1

    def test_an_operator_not_allowed_to_patch_pod_status_says_so_once_and_marks_nothing(
        self, control_plane: ControlPlane, objects: client.CustomObjectsApi, played: LostNode, tmp_path: Path
    ) -> None:
        """The spec asks for it, but the operator has only docs/operator-rbac.yaml (the chart without its value)."""
        spec = {"lostNodes": {"failPodsAfterSeconds": 0}}
        with outage(control_plane, objects, played, tmp_path / "operator.log", grant=False, **spec):
            assert_node_lost_told(played, option=True)
            refused = wait_until(lambda: played.events("job", "LostPodsNotFailed"), 30, "LostPodsNotFailed")
            assert refused == [
                f"could not mark the pods of lost Kubernetes node {played.lost} Failed and delete them: the operator's "
                "ServiceAccount needs patch on pods/status and delete on pods (core API group); set the chart value "
                "operator.lostNodes.failPodsAfterSeconds (it grants it) or apply docs/operator-rbac-lost-nodes.yaml. "
                "Until then, the NodeLost Event names the fix"
            ]
            holds_for(lambda: played.pod("trainer-0").status.phase == "Running", 6, "trainer-0 untouched")
            assert len(played.events("job", "LostPodsNotFailed")) == 1  # over 3 resyncs
            assert played.events("job", "LostPodsFailed") == []


class TestTheSpec:
    def test_the_crd_refuses_failpods_false_beside_seconds_and_negative_seconds_naming_the_field(
        self, crds: None, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        for lost_nodes, said in (
            ({"failPods": False, "failPodsAfterSeconds": 30}, "spec.lostNodes.failPods false turns the rule off"),
            ({"failPodsAfterSeconds": -1}, "spec.lostNodes.failPodsAfterSeconds"),
        ):
            with pytest.raises(client.ApiException) as refused:
                create_rendezvous(objects, namespace, lostNodes=lost_nodes)
            assert refused.value.status == 422 and said in str(refused.value.body), refused.value.body
        create_rendezvous(objects, namespace, lostNodes={"failPods": False})
