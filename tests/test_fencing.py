"""Fencing at the API (issue #46 item 3, ``fencing.enabled``): the chart's ValidatingAdmissionPolicy lets a pod's
bound ServiceAccount token write only the node Lease its agent created (annotation ``kube-rendezvous.io/pod-uid``).

Rendered by ``helm template`` (off by default; on, a policy and its binding) and enforced by the test control plane's
API server on played pods (no kubelet): each pod's token is minted by TokenRequest bound to the pod, as the kubelet
mints the one it mounts. The policy is applied as the chart renders it, its binding narrowed to the test's
namespace so that the other tests sharing the control plane never meet it. What the policy cannot prevent is
asserted too (docs/security.md, "Fencing at the API").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._kube.kubeapi import ForbiddenError, KubernetesApi, load_api_client
from kube_rendezvous._kube.leases import LeaseNodeLock, record_of
from kube_rendezvous._rules.document import NodeId
from kube_rendezvous._rules.folder_rules import Desire, JoinSettings
from kube_rendezvous._rules.leases_rules import ANNOTATION_POD_UID, LABEL_LEASE, POD_UID_ENV
from kube_rendezvous._rules.leases_rules import ANNOTATION_WRITER_PRIORITY as WRITER_PRIORITY
from kubernetes import client, config

from tests.helpers import REPO, create_rendezvous, rendezvous_parameters
from tests.test_chart import CHART, Helm, Manifest, objects_of, the
from tests.testenv import ensure_binaries
from tests.testenv.controlplane import ControlPlane, wait_until

ENABLED = "fencing.enabled=true"
PER_JOB = "fencing.perJob=true"
#: The namespace label that binds the per-job policy.
PER_JOB_LABEL = "kube-rendezvous.io/fencing"
POLICY, BINDING = "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"
REFUSAL = "kube-rendezvous fencing"
TRAINER = "trainer"
#: The group and version of RendezvousKeys.
KEYS = ("kube-rendezvous.io", "v1alpha1")
#: The operator's ServiceAccount of release ``rdzv`` (``helm template``'s default release name here).
OPERATOR_ACCOUNT = "rdzv-kube-rendezvous-operator"


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))


class TestTheChartsPolicy:
    def test_it_is_off_by_default(self, helm: Helm) -> None:
        manifests = helm.template()
        assert objects_of(manifests, POLICY) == objects_of(manifests, BINDING) == []

    def test_on_it_is_a_denying_policy_on_node_leases_bound_by_name_that_spares_the_operator(self, helm: Helm) -> None:
        manifests = helm.template(ENABLED, release="rdzv", namespace="kr")
        policy, binding = the(manifests, POLICY), the(manifests, BINDING)
        assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
        assert "namespace" not in policy["metadata"] and "namespace" not in binding["metadata"]
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        assert spec["matchConstraints"]["objectSelector"] == {
            "matchExpressions": [{"key": LABEL_LEASE, "operator": "In", "values": ["node", "writer"]}]
        }
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
        assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
        conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
        assert "authentication.kubernetes.io/pod-uid" in conditions["from-a-pod"]
        assert f"'system:serviceaccount:kr:{OPERATOR_ACCOUNT}'" in conditions["not-the-operator"]
        assert all(
            ANNOTATION_POD_UID in v["expression"] for v in spec["variables"] if v["name"] in ("stamped", "owner")
        )

    def test_its_binding_takes_the_namespaces_of_a_label_selector_and_refuses_a_field_it_does_not_know(
        self, helm: Helm
    ) -> None:
        selector = "fencing.namespaceSelector.matchExpressions[0]"
        manifests = helm.template(
            ENABLED, f"{selector}.key=team", f"{selector}.operator=In", f"{selector}.values={{a,b}}"
        )
        assert the(manifests, BINDING)["spec"]["matchResources"] == {
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}
        }
        refused = helm.run(
            "template", "rdzv", CHART, "--set", ENABLED, "--set", "fencing.namespaceSelector.team=a", check=False
        )
        assert refused.returncode == 1 and "/fencing/namespaceSelector" in refused.stderr and "'team'" in refused.stderr

    def test_per_job_is_its_own_policy_on_leases_and_keys_bound_in_labelled_namespaces_only(self, helm: Helm) -> None:
        manifests = helm.template(PER_JOB, release="rdzv", namespace="kr")
        policy, binding = the(manifests, POLICY), the(manifests, BINDING)
        assert policy["metadata"]["name"].endswith("-job-fencing")
        assert binding["spec"]["matchResources"] == {"namespaceSelector": {"matchLabels": {PER_JOB_LABEL: "per-job"}}}
        assert "objectSelector" not in policy["spec"]["matchConstraints"]
        rules = policy["spec"]["matchConstraints"]["resourceRules"]
        assert [(r["apiGroups"], r["resources"]) for r in rules] == [
            (["coordination.k8s.io"], ["leases"]),
            (["kube-rendezvous.io"], ["rendezvouskeys"]),
        ]
        conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
        assert f"'system:serviceaccount:kr:{OPERATOR_ACCOUNT}'" in conditions["not-the-operator"]
        both = helm.template(ENABLED, PER_JOB)
        assert len(objects_of(both, POLICY)) == len(objects_of(both, BINDING)) == 2


# -- enforced by the API server ------------------------------------------------------------------------------------


def played_pod(core: client.CoreV1Api, namespace: str, name: str, account: str = TRAINER) -> str:
    """A pod of ServiceAccount ``account`` (never scheduled: no kubelet needed); its uid."""
    pod = core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                service_account_name=account,
                automount_service_account_token=False,
                containers=[client.V1Container(name="agent", image="trainer:latest")],
            ),
        ),
    )
    uid: str = pod.metadata.uid
    return uid


class Pod:
    """A played pod and the clients of its bound token: what its agent would run with."""

    def __init__(self, control_plane: ControlPlane, core: client.CoreV1Api, namespace: str, name: str, account: str):
        self.name, self.namespace = name, namespace
        self.uid = played_pod(core, namespace, name, account)
        self.kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, account, pod=(name, self.uid))
        self.client = config.new_client_from_config(str(self.kubeconfig))
        self.leases = client.CoordinationV1Api(self.client)
        self.api = KubernetesApi(load_api_client(str(self.kubeconfig), None)[0])

    def lock(self, index: int, pod_uid: str | None = "") -> LeaseNodeLock:
        """The ``LeaseNodeLock`` of node ``index`` as this pod's agent makes it (its uid, unless ``pod_uid``)."""
        return LeaseNodeLock(
            self.api,
            self.namespace,
            "job",
            NodeId(f"10.0.0.{index}", 100 + index, 0),
            run_id="run-1",
            settings=JoinSettings(1, 4, timedelta(0)),
            expiry_seconds=15,
            pod_uid=self.uid if pod_uid == "" else pod_uid,
        )


def node_lease(name: str, pod_uid: str | None) -> dict[str, Any]:
    annotations = {} if pod_uid is None else {ANNOTATION_POD_UID: pod_uid}
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "labels": {LABEL_LEASE: "node"}, "annotations": annotations},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 15},
    }


def writer_lease(name: str, priority: str, holder: str) -> dict[str, Any]:
    lease = node_lease(name, None)
    lease["metadata"]["labels"][LABEL_LEASE] = "writer"
    lease["metadata"]["annotations"] = {WRITER_PRIORITY: priority}
    lease["spec"]["holderIdentity"] = holder
    return lease


def refused(call: Any) -> str:
    """The message of the 403 the policy answers ``call()`` with (fails if it is allowed)."""
    with pytest.raises(client.ApiException) as caught:
        call()
    assert caught.value.status == 403, caught.value
    message: str = json.loads(caught.value.body)["message"]
    assert REFUSAL in message, message
    return message


def apply(control_plane: ControlPlane, manifests: list[Manifest]) -> None:
    """``kubectl apply`` ``manifests`` as the admin."""
    control_plane.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    )


@pytest.fixture
def fencing(
    helm: Helm, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path, admin_api: client.ApiClient
) -> Iterator[list[Manifest]]:
    """The chart's policy and binding (released in ``namespace``), the binding narrowed to ``namespace`` by the
    chart's ``fencing.namespaceSelector``; removed."""
    only_here = f"fencing.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={namespace}"
    manifests = [m for m in helm.template(ENABLED, only_here, namespace=namespace) if m["kind"] in (POLICY, BINDING)]
    assert the(manifests, BINDING)["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    apply(control_plane, manifests)
    try:
        probe = Pod(control_plane, client.CoreV1Api(admin_api), namespace, "probe", TRAINER)
        admin = client.CoordinationV1Api(admin_api)

        def enforced() -> bool:
            try:
                probe.leases.create_namespaced_lease(namespace, node_lease("probe", None))
            except client.ApiException as exc:
                return exc.status == 403 and REFUSAL in exc.body
            admin.delete_namespaced_lease("probe", namespace)
            return False

        wait_until(enforced, 60, "the fencing policy to be enforced")
        yield manifests
    finally:
        for manifest in manifests:
            control_plane.kubectl("delete", manifest["kind"], manifest["metadata"]["name"], "--ignore-not-found")


class TestFencedNodeLeases:
    def test_a_pod_bound_token_names_its_pod_in_the_user_info(
        self, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path, admin_api: client.ApiClient
    ) -> None:
        """What the policy reads: the API server (1.30+) puts a bound token's pod in the user info's extra."""
        pod = Pod(control_plane, client.CoreV1Api(admin_api), namespace, "a", TRAINER)
        review = client.AuthenticationV1Api(pod.client).create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
        )
        user = review.status.user_info
        assert user.username == f"system:serviceaccount:{namespace}:{TRAINER}"
        assert user.extra["authentication.kubernetes.io/pod-name"] == ["a"]
        assert user.extra["authentication.kubernetes.io/pod-uid"] == [pod.uid]

    def test_a_pod_writes_its_own_node_lease_and_no_other_pods(
        self,
        control_plane: ControlPlane,
        namespace: str,
        agent_kubeconfig: Path,
        admin_api: client.ApiClient,
        fencing: list[Manifest],
    ) -> None:
        core, admin = client.CoreV1Api(admin_api), client.CoordinationV1Api(admin_api)
        a, b = (Pod(control_plane, core, namespace, name, TRAINER) for name in ("a", "b"))
        # A's agent creates, renews and re-asks on its own Lease, stamped with its uid.
        lock = a.lock(1)
        lock.create(Desire.JOIN)
        lock.update()
        lock.update(Desire.LEAVE)
        stored = admin.read_namespaced_lease(lock.name, namespace)
        assert stored.metadata.annotations[ANNOTATION_POD_UID] == a.uid
        record = record_of(client.ApiClient().sanitize_for_serialization(stored))
        assert record is not None and record.desire is Desire.LEAVE
        # B cannot renew, rewrite or delete it, nor make one in A's name, nor one without its own uid.
        renewal = {"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}
        message = refused(lambda: b.leases.patch_namespaced_lease(lock.name, namespace, renewal))
        owned = f"pod b may write only the node Lease it created, and Lease {lock.name} was created by pod uid {a.uid}"
        assert owned in message
        with pytest.raises(ForbiddenError):
            b.lock(1).update(Desire.JOIN)  # B's agent with A's node: its create conflicts, then its patch is refused
        refused(lambda: b.leases.delete_namespaced_lease(lock.name, namespace))
        refused(lambda: b.leases.create_namespaced_lease(namespace, node_lease("posing-as-a", a.uid)))
        message = refused(lambda: b.leases.create_namespaced_lease(namespace, node_lease("unstamped", None)))
        assert "set env POD_UID from the downward API (fieldRef metadata.uid)" in message
        with pytest.raises(ForbiddenError):
            b.lock(2, pod_uid=None).create(Desire.JOIN)  # an agent without POD_UID is refused at its first write
        # Nor can A hand its Lease to B.
        handover = {"metadata": {"annotations": {ANNOTATION_POD_UID: b.uid}}}
        refused(lambda: a.leases.patch_namespaced_lease(lock.name, namespace, handover))
        assert admin.read_namespaced_lease(lock.name, namespace).metadata.annotations[ANNOTATION_POD_UID] == a.uid
        # A deletes its own; an admin (no pod identity) writes and deletes any.
        a.leases.delete_namespaced_lease(lock.name, namespace)
        b.lock(3).create(Desire.JOIN)
        admin.patch_namespaced_lease(b.lock(3).name, namespace, renewal)
        admin.delete_namespaced_lease(b.lock(3).name, namespace)

    def test_a_pod_writes_a_writer_lease_as_an_agent_only(
        self,
        control_plane: ControlPlane,
        namespace: str,
        agent_kubeconfig: Path,
        admin_api: client.ApiClient,
        fencing: list[Manifest],
    ) -> None:
        """A pod's agent takes and renews the writer Lease with the agents' priority (the writer rules: its expiry
        is not checked, a policy has no clock); it cannot pose as the operator, which would hold it for ever."""
        a = Pod(control_plane, client.CoreV1Api(admin_api), namespace, "a", TRAINER)
        lease = writer_lease("job-writer", "agent", "agent/10.0.0.1_101_0")
        a.leases.create_namespaced_lease(namespace, lease)
        a.leases.patch_namespaced_lease("job-writer", namespace, {"spec": {"holderIdentity": "agent/10.0.0.2_102_0"}})
        message = refused(lambda: a.leases.create_namespaced_lease(namespace, writer_lease("x-writer", "operator", "")))
        assert "may write writer Lease x-writer only as an agent" in message
        refused(lambda: a.leases.create_namespaced_lease(namespace, writer_lease("x-writer", "agent", "operator/pod")))
        pose = {"metadata": {"annotations": {WRITER_PRIORITY: "operator"}}}
        refused(lambda: a.leases.patch_namespaced_lease("job-writer", namespace, pose))
        # The operator's writes stand; a pod takes its Lease back as an agent (once stale: the rule it cannot check).
        admin = client.CoordinationV1Api(admin_api)
        admin.patch_namespaced_lease(
            "job-writer", namespace, {"metadata": pose["metadata"], "spec": {"holderIdentity": "operator/op"}}
        )
        takeover = {
            "metadata": {"annotations": {WRITER_PRIORITY: "agent"}},
            "spec": {"holderIdentity": "agent/10.0.0.1_101_0"},
        }
        a.leases.patch_namespaced_lease("job-writer", namespace, takeover)

    def test_the_operators_account_and_tokens_bound_to_no_pod_are_not_restricted(
        self,
        control_plane: ControlPlane,
        namespace: str,
        agent_kubeconfig: Path,
        admin_api: client.ApiClient,
        fencing: list[Manifest],
    ) -> None:
        """The operator's own pods (its folder deletes idle Leases) pass; so does a token bound to no pod, of any
        account: what the policy cannot prevent (docs/security.md)."""
        core = client.CoreV1Api(admin_api)
        a = Pod(control_plane, core, namespace, "a", TRAINER)
        lock = a.lock(1)
        lock.create(Desire.JOIN)
        unbound = client.CoordinationV1Api(config.new_client_from_config(str(agent_kubeconfig)))
        unbound.patch_namespaced_lease(lock.name, namespace, {"metadata": {"labels": {"checked": "true"}}})
        account = OPERATOR_ACCOUNT
        control_plane.kubectl(
            "-n",
            namespace,
            "create",
            "role",
            "operator-leases",
            "--verb=delete",
            "--resource=leases.coordination.k8s.io",
        )
        control_plane.kubectl(
            "-n",
            namespace,
            "create",
            "rolebinding",
            "operator-leases",
            "--role=operator-leases",
            f"--serviceaccount={namespace}:{account}",
        )
        control_plane.kubectl("-n", namespace, "create", "serviceaccount", account)
        operator = Pod(control_plane, core, namespace, "operator", account)
        wait_until(
            lambda: (
                control_plane.kubectl(
                    "auth", "can-i", "delete", "leases", "-n", namespace, kubeconfig=operator.kubeconfig, check=False
                ).stdout.strip()
                == "yes"
            ),
            30,
            "the operator's RoleBinding to apply",
        )
        operator.leases.delete_namespaced_lease(lock.name, namespace)

    def test_a_deleted_pods_token_is_refused(
        self, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path, admin_api: client.ApiClient
    ) -> None:
        """Fencing Kubernetes gives with no policy: a bound token dies with its pod (a Failed pod's does not), once the
        API server's cache of successful authentications (10 s) forgets it."""
        core = client.CoreV1Api(admin_api)
        a = Pod(control_plane, core, namespace, "a", TRAINER)
        a.leases.list_namespaced_lease(namespace)
        core.delete_namespaced_pod("a", namespace, grace_period_seconds=0)
        deleted = time.monotonic()

        def unauthorized() -> bool:
            try:
                a.leases.list_namespaced_lease(namespace)
            except client.ApiException as exc:
                assert exc.status == 401, exc
                return True
            return False

        wait_until(unauthorized, 30, "the deleted pod's token to be refused")
        assert time.monotonic() - deleted < 15

    def test_an_agent_run_with_its_pods_token_and_uid_joins_and_heartbeats(
        self,
        control_plane: ControlPlane,
        namespace: str,
        agent_kubeconfig: Path,
        admin_api: client.ApiClient,
        objects: client.CustomObjectsApi,
        fencing: list[Manifest],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A real ``k8s`` handler with pod A's bound token and ``POD_UID`` set (as the examples set it) forms its round,
        folds it itself (no operator) and renews its stamped Lease under the policy."""
        from kube_rendezvous._adapters.handler import create_k8s_handler

        a = Pod(control_plane, client.CoreV1Api(admin_api), namespace, "a", TRAINER)
        create_rendezvous(objects, namespace, minNodes=1, maxNodes=1)
        monkeypatch.setenv(POD_UID_ENV, a.uid)
        handler = create_k8s_handler(
            rendezvous_parameters(
                f"{namespace}/job", a.kubeconfig, min_nodes=1, max_nodes=1, create="false", keep_alive_interval="1"
            )
        )
        try:
            info = handler.next_rendezvous()
            assert (info.rank, info.world_size) == (0, 1)
            admin = client.CoordinationV1Api(admin_api)
            (lease,) = admin.list_namespaced_lease(namespace, label_selector=f"{LABEL_LEASE}=node").items
            assert lease.metadata.annotations[ANNOTATION_POD_UID] == a.uid
            renewed = lease.spec.renew_time

            def heartbeat() -> bool:
                again = admin.read_namespaced_lease(lease.metadata.name, namespace)
                return bool(again.spec.renew_time != renewed)

            wait_until(heartbeat, 30, "the agent's Lease to be renewed")
        finally:
            handler.shutdown()


@pytest.fixture
def per_job_fencing(helm: Helm, control_plane: ControlPlane, namespace: str, crds: None) -> Iterator[list[Manifest]]:
    """The chart's per-job policy and binding, ``namespace`` labelled for it (the only one so labelled); removed."""
    manifests = [m for m in helm.template(PER_JOB, namespace=namespace) if m["kind"] in (POLICY, BINDING)]
    control_plane.kubectl("label", "namespace", namespace, f"{PER_JOB_LABEL}=per-job")
    apply(control_plane, manifests)
    try:
        yield manifests
    finally:
        for manifest in manifests:
            control_plane.kubectl("delete", manifest["kind"], manifest["metadata"]["name"], "--ignore-not-found")


def labelled_lease(name: str, rendezvous: str) -> dict[str, Any]:
    lease = node_lease(name, None)
    lease["metadata"]["labels"]["kube-rendezvous.io/rendezvous"] = rendezvous
    return lease


class TestPerJobFencing:
    def test_a_jobs_account_writes_only_its_own_rendezvouss_leases_and_keys(
        self,
        control_plane: ControlPlane,
        namespace: str,
        admin_api: client.ApiClient,
        objects: client.CustomObjectsApi,
        per_job_fencing: list[Manifest],
    ) -> None:
        """examples/rbac-per-job.yaml's job (ServiceAccount and Rendezvous llama-train) beside job other-job: with the
        policy, llama-train's token (bound to no pod) cannot create, write or delete other-job's Leases or keys; it
        still reads them (admission sees writes only)."""
        for name in ("llama-train", "other-job"):
            create_rendezvous(objects, namespace, name)
        control_plane.kubectl("-n", namespace, "apply", "-f", str(REPO / "examples" / "rbac-per-job.yaml"))
        kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "llama-train")
        # Its own job works: a backend and store (keys labelled llama-train), a node Lease labelled llama-train.
        _, store = wait_until(
            lambda: create_backend(rendezvous_parameters(f"{namespace}/llama-train", kubeconfig, create="false")),
            30,
            "the per-job RoleBinding to take effect",
        )
        leases = client.CoordinationV1Api(config.new_client_from_config(str(kubeconfig)))

        def enforced() -> bool:
            try:
                leases.create_namespaced_lease(namespace, labelled_lease("probe", "other-job"))
            except client.ApiException as exc:
                return exc.status == 403 and REFUSAL in exc.body
            client.CoordinationV1Api(admin_api).delete_namespaced_lease("probe", namespace)
            return False

        wait_until(enforced, 60, "the per-job policy to be enforced")
        store.set("mine", b"1")
        assert store.get("mine") == b"1"
        leases.create_namespaced_lease(namespace, labelled_lease("mine", "llama-train"))
        leases.delete_namespaced_lease("mine", namespace)
        # Another job's: refused, naming the rule; an admin's writes pass.
        message = refused(lambda: leases.create_namespaced_lease(namespace, labelled_lease("theirs", "other-job")))
        assert "ServiceAccount llama-train writes only the Leases and keys of Rendezvous llama-train" in message
        assert "leases theirs is labelled kube-rendezvous.io/rendezvous=other-job" in message
        client.CoordinationV1Api(admin_api).create_namespaced_lease(namespace, labelled_lease("theirs", "other-job"))
        refused(lambda: leases.patch_namespaced_lease("theirs", namespace, {"spec": {"leaseDurationSeconds": 1}}))
        refused(lambda: leases.delete_namespaced_lease("theirs", namespace))
        relabel = {"metadata": {"labels": {"kube-rendezvous.io/rendezvous": "llama-train"}}}
        refused(lambda: leases.patch_namespaced_lease("theirs", namespace, relabel))
        squatter = node_lease("other-job-writer", None)  # unlabelled, named as other-job's writer Lease
        del squatter["metadata"]["labels"]
        refused(lambda: leases.create_namespaced_lease(namespace, squatter))
        unrelated = node_lease("some-app-leader", None)  # another application's Lease: not the policy's business
        del unrelated["metadata"]["labels"]
        leases.create_namespaced_lease(namespace, unrelated)
        admin_config = control_plane.admin_kubeconfig
        _, their_store = create_backend(rendezvous_parameters(f"{namespace}/other-job", admin_config, create="false"))
        their_store.set("theirs", b"1")
        keys = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
        (key,) = keys.list_namespaced_custom_object(
            "kube-rendezvous.io",
            "v1alpha1",
            namespace,
            "rendezvouskeys",
            label_selector="kube-rendezvous.io/rendezvous=other-job",
        )["items"]
        name = key["metadata"]["name"]
        message = refused(
            lambda: keys.delete_namespaced_custom_object(
                "kube-rendezvous.io", "v1alpha1", namespace, "rendezvouskeys", name
            )
        )
        assert f"rendezvouskeys {name} is labelled kube-rendezvous.io/rendezvous=other-job" in message
        key["metadata"]["labels"]["kube-rendezvous.io/rendezvous"] = "llama-train"
        refused(lambda: keys.replace_namespaced_custom_object(*KEYS, namespace, "rendezvouskeys", name, key))
        assert their_store.get("theirs") == b"1"
