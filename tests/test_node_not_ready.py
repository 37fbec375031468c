"""The operator without permission to read Nodes warns once, naming the permission, and goes on (issue #27).

The NotReady rule itself runs on real kubelets: ``tests/test_multi_node.py`` (a node that dies while its pods
train: the operator evicts its pods' nodes; a kubelet that goes silent while its pod trains on: the live agent
is spared) and ``tests/test_real_node.py`` (the one node fails). This case needs no kubelet: it is about RBAC.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.e2e.operator_process import OperatorProcess
from tests.helpers import REPO, create_rendezvous
from tests.test_operator import events, judged, operator, read  # noqa: F401 - a fixture
from tests.testenv import ControlPlane, wait_until


@contextmanager
def operator_without_nodes(control_plane: ControlPlane, namespace: str, log: Path) -> Iterator[OperatorProcess]:
    """The operator as its own ServiceAccount bound to docs/operator-rbac.yaml minus the nodes rule."""
    documents = [doc for doc in yaml.safe_load_all((REPO / "docs" / "operator-rbac.yaml").read_text()) if doc]
    role: dict[str, Any] = next(doc for doc in documents if doc["kind"] == "ClusterRole")
    name = f"kube-rendezvous-operator-no-nodes-{namespace}"
    role["metadata"] = {"name": name}
    documented = len(role["rules"])
    role["rules"] = [rule for rule in role["rules"] if "nodes" not in rule["resources"]]
    assert 0 < len(role["rules"]) == documented - 1
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "kube-rendezvous-operator")
    control_plane.kubectl(
        "create",
        "clusterrolebinding",
        name,
        f"--clusterrole={name}",
        f"--serviceaccount={namespace}:kube-rendezvous-operator",
    )
    running = OperatorProcess(kubeconfig, namespace, log)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        control_plane.kubectl("delete", "clusterrolebinding", name, check=False)
        control_plane.kubectl("delete", "clusterrole", name, check=False)


class TestWithoutPermissionToReadNodes:
    def test_the_operator_warns_once_naming_the_permission_and_goes_on_without_the_rule(
        self,
        control_plane: ControlPlane,
        crds: None,
        objects: client.CustomObjectsApi,
        namespace: str,
        tmp_path: Path,
    ) -> None:
        with operator_without_nodes(control_plane, namespace, tmp_path / "operator.log") as running:

            def warnings() -> list[str]:
                lines = running.log.read_text().splitlines()
                return [line for line in lines if "may not read Kubernetes Nodes" in line]

            wait_until(warnings, 60, "the operator's warning about Nodes")
            # It goes on: it reconciles a Rendezvous as ever (Ready judged), and stays up.
            create_rendezvous(objects, namespace)
            wait_until(
                lambda: judged(read(objects, namespace)), 60, "Ready judged by an operator that may not read Nodes"
            )
            assert running.healthy()
            found = warnings()
            assert len(found) == 1, found
            assert "get, list and watch on nodes" in found[0] and "ClusterRole" in found[0]
