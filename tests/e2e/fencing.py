"""The chart's fencing policy on every real-node cluster of the tests (issue #46: "everything of today still passes
with the policy installed").

Every cluster that ``tests/conftest.py`` starts with real nodes gets the node-Lease policy as the chart renders it
(``fencing.enabled``), bound in every namespace but those where a test installs a release of the chart with its own
operator in a pod: the policy spares the operator of the release that installed it, by its ServiceAccount, so such
a test labels its namespace (``own_release_fencing``) and its release brings its own policy, bound to that namespace
alone. The workload cluster installs the chart with fencing on for every namespace and removes this one first
(``unfence_every_namespace``).

Operators run as local processes (``tests.e2e.operator_process``) carry no pod identity and are not restricted;
every agent in a pod is, from its first write.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from kubernetes import client, config

from tests.test_chart import CHART, Helm
from tests.testenv.controlplane import ControlPlane, wait_until

#: The release whose policy the clusters get; cluster-scoped, so the name only tells whose it is in ``kubectl get``.
RELEASE, RELEASE_NAMESPACE = "every-namespace", "kube-rendezvous-system"
#: A namespace where a test installs a release with its own operator and policy; the cluster-wide policy skips it.
OWN_RELEASE_LABEL = "tests.kube-rendezvous.io/own-release"
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
#: Where ``fence_every_namespace`` checks that the policy is enforced; deleted afterwards.
PROBE_NAMESPACE = "fencing-probe"


def _fencing_manifests(plane: ControlPlane) -> str:
    with tempfile.TemporaryDirectory(prefix="helm-") as home:
        helm = Helm(plane.binaries.helm, Path(home))
        rendered = helm.run(
            "template", RELEASE, CHART, "--namespace", RELEASE_NAMESPACE, "--show-only", "templates/fencing.yaml",
            "--set", "fencing.enabled=true",
            "--set", f"fencing.namespaceSelector.matchExpressions[0].key={OWN_RELEASE_LABEL}",
            "--set", "fencing.namespaceSelector.matchExpressions[0].operator=DoesNotExist",
        )  # fmt: skip
    return rendered.stdout


def fence_every_namespace(plane: ControlPlane) -> None:
    """Apply the chart's node-Lease policy to every namespace without ``OWN_RELEASE_LABEL``, and wait until the API
    server enforces it: a pod's token (never scheduled, bound by TokenRequest as the kubelet binds the one it
    mounts) is refused an unstamped node Lease with the policy's message."""
    plane.kubectl("apply", "-f", "-", input=_fencing_manifests(plane))
    api = config.new_client_from_config(str(plane.admin_kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=PROBE_NAMESPACE)))
    try:
        rules = [client.V1PolicyRule(api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["create"])]
        client.RbacAuthorizationV1Api(api).create_namespaced_role(
            PROBE_NAMESPACE, client.V1Role(metadata=client.V1ObjectMeta(name="probe"), rules=rules)
        )
        plane.kubectl(
            "-n", PROBE_NAMESPACE, "create", "rolebinding", "probe", "--role=probe",
            f"--serviceaccount={PROBE_NAMESPACE}:probe",
        )  # fmt: skip
        plane.kubectl("-n", PROBE_NAMESPACE, "create", "serviceaccount", "probe")
        pod = core.create_namespaced_pod(
            PROBE_NAMESPACE,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="probe"),
                spec=client.V1PodSpec(
                    service_account_name="probe",
                    scheduler_name="never-scheduled",
                    containers=[client.V1Container(name="probe", image="probe")],
                ),
            ),
        )
        kubeconfig = plane.serviceaccount_kubeconfig(
            PROBE_NAMESPACE, "probe", create=False, pod=(pod.metadata.name, pod.metadata.uid)
        )
        leases = client.CoordinationV1Api(config.new_client_from_config(str(kubeconfig)))
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name="probe-node-000000000000", labels={"kube-rendezvous.io/lease": "node"})
        )

        def refused() -> bool:
            try:
                leases.create_namespaced_lease(PROBE_NAMESPACE, lease)
            except client.ApiException as exc:
                return exc.status == 403 and "kube-rendezvous fencing" in (exc.body or "")
            client.CoordinationV1Api(api).delete_namespaced_lease(lease.metadata.name, PROBE_NAMESPACE)
            return False

        wait_until(refused, 60, "the API server to enforce the cluster-wide fencing policy")
    finally:
        core.delete_namespace(PROBE_NAMESPACE)


def unfence_every_namespace(plane: ControlPlane) -> None:
    """Remove ``fence_every_namespace``'s policy and binding (a chart release with fencing on takes over)."""
    for kind in KINDS:
        plane.kubectl("delete", kind, "-l", f"app.kubernetes.io/instance={RELEASE}", "--ignore-not-found")


def own_release_fencing(plane: ControlPlane, namespace: str) -> tuple[str, ...]:
    """Label ``namespace`` out of the cluster-wide policy; return the ``--set`` values under which a release
    installed there fences ``namespace`` with its own policy, which spares its own operator."""
    plane.kubectl("label", "namespace", namespace, f"{OWN_RELEASE_LABEL}=true", "--overwrite")
    return (
        "fencing.enabled=true",
        f"fencing.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={namespace}",
    )
