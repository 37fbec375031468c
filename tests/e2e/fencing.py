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

import json
import tempfile
from pathlib import Path

from tests.test_chart import CHART, Helm
from tests.testenv.controlplane import ControlPlane, wait_until

#: The release whose policy the clusters get; cluster-scoped, so the name only tells whose it is in ``kubectl get``.
RELEASE, RELEASE_NAMESPACE = "every-namespace", "kube-rendezvous-system"
#: A namespace where a test installs a release with its own operator and policy; the cluster-wide policy skips it.
OWN_RELEASE_LABEL = "tests.kube-rendezvous.io/own-release"
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


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
    """Apply the chart's node-Lease policy to every namespace without ``OWN_RELEASE_LABEL``; wait until the API
    server has type-checked it (its status observed), which it does when it loads it."""
    plane.kubectl("apply", "-f", "-", input=_fencing_manifests(plane))

    def loaded() -> bool:
        listed = json.loads(plane.kubectl("get", "validatingadmissionpolicies", "-o", "json").stdout)["items"]
        ours = [p for p in listed if p["metadata"]["labels"].get("app.kubernetes.io/instance") == RELEASE]
        observed = [p.get("status", {}).get("observedGeneration") == p["metadata"]["generation"] for p in ours]
        return observed == [True]

    wait_until(loaded, 60, "the API server to load the cluster-wide fencing policy")


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
