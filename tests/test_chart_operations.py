"""Operating the chart: CRD upgrades, ``helm test``, aggregated roles, monitoring, the PDB, the schema
of the new options, and the operator's cluster-wide RBAC (docs/operations.md).

Everything that can reach the API server does, on the suite's real kube-apiserver with RBAC on
(tests/conftest.py). That control plane has no kubelet: pods stay Pending, so the ``helm test``
Pod is checked by rendering it, by a server-side dry run, and by running its script as a local
process under the operator's ServiceAccount against a local operator, instead of ``helm test``.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.operator_process import OperatorProcess
from tests.helpers import REPO
from tests.test_chart import (
    CHART,
    COMPONENT,
    CRD_NAMES,
    GROUP,
    PLURAL,
    VERSION,
    Helm,
    Manifest,
    Release,
    can_i,
    delete_crds,
    install,
    kubectl_json,
    objects_of,
    operator_objects,
    pod_spec,
    restore_crds,
    the,
    uninstall,
    upgrade,
)
from tests.testenv import ControlPlane, ensure_binaries, free_port, wait_until

DATA = Path(__file__).resolve().parent / "data"
METRICS_PY = REPO / "operator" / "kube_rendezvous_operator" / "metrics.py"
MONITORING_ON = (
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.grafanaDashboard.enabled=true",
)


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture
def no_crds(control_plane: ControlPlane, crds: None) -> Iterator[None]:
    """No Rendezvous CRD on the server, so that a test sees the ones its release creates; restored afterwards."""
    delete_crds(control_plane)
    try:
        yield
    finally:
        restore_crds(control_plane)


@contextlib.contextmanager
def extra_controllers(control_plane: ControlPlane, log: Path, *controllers: str) -> Iterator[None]:
    """A second kube-controller-manager running only ``controllers``, for the length of a test.

    The suite's control plane runs just the controllers every test needs (tests/testenv); the
    aggregation of ClusterRoles, Deployments and PodDisruptionBudgets need theirs, real ones.
    """
    command = [
        str(ensure_binaries().kube_controller_manager),
        f"--kubeconfig={control_plane.admin_kubeconfig}",
        f"--controllers={','.join(controllers)}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
        f"--authentication-kubeconfig={control_plane.admin_kubeconfig}",
        f"--authorization-kubeconfig={control_plane.admin_kubeconfig}",
        "--v=1",
    ]
    with log.open("ab") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield
        assert process.poll() is None, f"kube-controller-manager exited: {log.read_text()[-3000:]}"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def release_name() -> str:
    return f"rdzv-{uuid.uuid4().hex[:8]}"


def crd(control_plane: ControlPlane, name: str = "rendezvouses.kube-rendezvous.io") -> Manifest:
    found: Manifest = kubectl_json(control_plane, "get", f"crd/{name}")
    return found


def status_rules(crd_object: Manifest) -> Any:
    schema = crd_object["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["status"].get("x-kubernetes-validations")


def copy_chart(tmp_path: Path) -> Path:
    """A copy of the chart to change into an older release."""
    copy = tmp_path / "chart" / "kube-rendezvous"
    shutil.copytree(CHART, copy)
    return copy


def without_the_state_rule(path: Path) -> None:
    """Make the Rendezvous CRD at ``path`` the first release's: no validation rule on status.state."""
    document = yaml.safe_load(path.read_text())
    document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"].pop("x-kubernetes-validations")
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def create_rendezvous(admin_api: client.ApiClient, namespace: str, name: str) -> None:
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Rendezvous",
            "metadata": {"name": name},
            "spec": {"minNodes": 1, "maxNodes": 2},
        },
    )


def rendezvous_exists(admin_api: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.CustomObjectsApi(admin_api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def state_rule_enforced(admin_api: client.ApiClient, namespace: str, name: str) -> bool:
    """Whether the server refuses a status.state that is no state document (a dry run)."""
    try:
        client.CustomObjectsApi(admin_api).patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": {"state": "z1:not-a-document"}},
            dry_run="All",
            _content_type="application/merge-patch+json",
        )
    except client.ApiException as exc:
        if exc.status == 422:
            return True
        raise
    return False


# -- 1. helm upgrade updates the CRDs -------------------------------------------------------------


class TestHelmUpgradeUpdatesTheCrds:
    def test_an_upgrade_replaces_the_crd_that_an_older_release_of_the_chart_installed(
        self, helm: Helm, control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, no_crds: None
    ) -> None:
        older = copy_chart(control_plane.workdir / f"older-{uuid.uuid4().hex[:6]}")
        without_the_state_rule(older / "files" / "crds" / "rendezvous.yaml")
        name = release_name()
        values = ("rbac.scope=namespace", "crds.install=true")
        install(helm, control_plane, name, namespace, *values, chart=older)
        try:
            before = crd(control_plane)
            assert status_rules(before) is None
            create_rendezvous(admin_api, namespace, "survivor")
            assert not state_rule_enforced(admin_api, namespace, "survivor")

            upgrade(helm, control_plane, name, namespace, *values)

            after = crd(control_plane)
            source = yaml.safe_load((REPO / "crds" / "rendezvous.yaml").read_text())
            assert status_rules(after) == status_rules(source)
            assert after["metadata"]["generation"] > before["metadata"]["generation"]
            assert after["metadata"]["annotations"]["meta.helm.sh/release-name"] == name
            wait_until(lambda: state_rule_enforced(admin_api, namespace, "survivor"), 60, "the new CRD to apply")
            assert rendezvous_exists(admin_api, namespace, "survivor")
        finally:
            uninstall(helm, control_plane, Release(name, namespace, "", "", []))

    def test_upgrading_from_the_crds_folder_layout_takes_the_crds_over_with_take_ownership(
        self, helm: Helm, control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, no_crds: None
    ) -> None:
        # The chart as 0.1.0 shipped it: the CRDs in crds/, which Helm installs once with no owner.
        older = copy_chart(control_plane.workdir / f"older-{uuid.uuid4().hex[:6]}")
        (older / "templates" / "crds.yaml").unlink()
        (older / "files" / "crds").rename(older / "crds")
        without_the_state_rule(older / "crds" / "rendezvous.yaml")
        name = release_name()
        install(helm, control_plane, name, namespace, "rbac.scope=namespace", chart=older)
        try:
            before = crd(control_plane)
            assert status_rules(before) is None
            assert "meta.helm.sh/release-name" not in before["metadata"].get("annotations", {})
            create_rendezvous(admin_api, namespace, "survivor")

            # Without --take-ownership Helm refuses CRDs that no release owns, and says so.
            kubeconfig = ("--kubeconfig", str(control_plane.admin_kubeconfig))
            refused = helm.run(
                "upgrade", name, CHART, "-n", namespace, *kubeconfig, "--set", "rbac.scope=namespace", check=False
            )
            assert refused.returncode != 0
            assert "invalid ownership metadata" in refused.stderr
            assert status_rules(crd(control_plane)) is None

            upgrade(helm, control_plane, name, namespace, "rbac.scope=namespace", flags=("--take-ownership",))
            after = crd(control_plane)
            assert status_rules(after) is not None
            for crd_name in CRD_NAMES:
                annotations = crd(control_plane, crd_name)["metadata"]["annotations"]
                assert annotations["meta.helm.sh/release-name"] == name
                assert annotations["helm.sh/resource-policy"] == "keep"
            wait_until(lambda: state_rule_enforced(admin_api, namespace, "survivor"), 60, "the new CRD to apply")
        finally:
            uninstall(helm, control_plane, Release(name, namespace, "", "", []))

    def test_uninstall_keeps_the_crds_and_every_rendezvous(
        self, helm: Helm, control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, no_crds: None
    ) -> None:
        release = install(helm, control_plane, release_name(), namespace, "rbac.scope=namespace", "crds.install=true")
        control_plane.wait_established(f"crd/{CRD_NAMES[0]}")
        create_rendezvous(admin_api, namespace, "survivor")
        uninstall(helm, control_plane, release)
        for crd_name in CRD_NAMES:
            assert crd(control_plane, crd_name)["metadata"].get("deletionTimestamp") is None
        assert rendezvous_exists(admin_api, namespace, "survivor")

    def test_the_documented_uninstall_completes_without_the_operator_after_it_handled_a_rendezvous(
        self,
        helm: Helm,
        control_plane: ControlPlane,
        admin_api: client.ApiClient,
        namespace: str,
        no_crds: None,
        tmp_path: Path,
    ) -> None:
        """docs/operations.md as written: ``helm uninstall``, then ``kubectl delete crd ...``, with a Rendezvous the
        operator handled and the operator gone with the release. Before, the operator's finalizer held that
        Rendezvous, and with no operator left to remove it the CRD deletion waited for ever."""
        release = install(helm, control_plane, release_name(), namespace, "rbac.scope=namespace", "crds.install=true")
        control_plane.wait_established(f"crd/{CRD_NAMES[0]}")
        kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, release.operator_account, create=False)
        wait_until(
            lambda: can_i(control_plane, kubeconfig, "watch", "rendezvouses.kube-rendezvous.io"),
            30,
            "the operator's RoleBinding to take effect",
        )
        create_rendezvous(admin_api, namespace, "handled")
        objects = client.CustomObjectsApi(admin_api)
        with OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log"):
            wait_until(
                lambda: (
                    objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "handled")  # type: ignore[union-attr]
                    .get("status", {})
                    .get("conditions")
                ),
                30,
                "the operator to handle the Rendezvous (its Ready condition)",
            )
        uninstall(helm, control_plane, release)
        deleted = control_plane.kubectl("delete", "crd", *CRD_NAMES, "--timeout=60s", check=False)
        assert deleted.returncode == 0, deleted.stderr
        for name in CRD_NAMES:
            assert control_plane.kubectl("get", f"crd/{name}", check=False).returncode != 0

    def test_without_keep_uninstall_deletes_the_crds(
        self, helm: Helm, control_plane: ControlPlane, namespace: str, no_crds: None
    ) -> None:
        release = install(
            helm,
            control_plane,
            release_name(),
            namespace,
            "rbac.scope=namespace",
            "crds.install=true",
            "crds.keep=false",
        )
        assert sorted(m["metadata"]["name"] for m in objects_of(release.manifests, "CustomResourceDefinition")) == (
            sorted(CRD_NAMES)
        )
        uninstall(helm, control_plane, release)
        wait_until(
            lambda: all(control_plane.kubectl("get", f"crd/{name}", check=False).returncode != 0 for name in CRD_NAMES),
            60,
            "the CRDs of a release without the keep policy to go with it",
        )


# -- 2. helm test ---------------------------------------------------------------------------------


def hook_pod(manifests: list[Manifest]) -> Manifest:
    pods = [m for m in objects_of(manifests, "Pod") if m["metadata"]["labels"].get(COMPONENT) == "test"]
    assert len(pods) == 1, pods
    return pods[0]


def env_values(container: Manifest) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


class TestTheHelmTestHook:
    def test_it_is_a_test_hook_pod_that_runs_the_chart_script_under_the_operator_account(self, helm: Helm) -> None:
        manifests = helm.template()
        pod = hook_pod(manifests)
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        assert "before-hook-creation" in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["spec"]["serviceAccountName"] == pod_spec(manifests)["serviceAccountName"]
        container = pod["spec"]["containers"][0]
        assert container["image"] == pod_spec(manifests)["containers"][0]["image"]
        assert container["command"] == ["python", "-c"]
        assert container["args"] == [(CHART / "files" / "helm-test.py").read_text()]
        env = env_values(container)
        assert env["CRD_NAMES"].split() == list(CRD_NAMES)
        service = the(manifests, "Service")
        port = service["spec"]["ports"][0]["port"]
        assert env["METRICS_URL"] == f"http://{service['metadata']['name']}.ml-platform.svc:{port}/metrics"

    def test_without_the_metrics_service_it_lists_rendezvous_objects_instead(self, helm: Helm) -> None:
        env = env_values(hook_pod(helm.template("metrics.service.enabled=false"))["spec"]["containers"][0])
        assert "METRICS_URL" not in env
        assert env["WATCH_NAMESPACE"] == "ml-platform"

    def test_it_can_be_left_out(self, helm: Helm) -> None:
        assert objects_of(helm.template("tests.enabled=false"), "Pod") == []

    def test_the_api_server_admits_the_pod_under_the_restricted_pod_security_standard(
        self, helm: Helm, control_plane: ControlPlane, namespace: str
    ) -> None:
        control_plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
        pod = hook_pod(helm.template(namespace=namespace))
        control_plane.kubectl("create", "serviceaccount", pod["spec"]["serviceAccountName"], "-n", namespace)
        created = control_plane.kubectl("create", "--dry-run=server", "-f", "-", check=False, input=yaml.safe_dump(pod))
        assert created.returncode == 0, created.stderr
        assert "created (server dry run)" in created.stdout

    def test_its_script_passes_against_a_running_operator_and_fails_without_one(
        self, helm: Helm, control_plane: ControlPlane, namespace: str, crds: None, tmp_path: Path
    ) -> None:
        release = install(helm, control_plane, release_name(), namespace, "rbac.scope=namespace")
        try:
            script = hook_pod(release_test_hooks(helm, control_plane, release))["spec"]["containers"][0]["args"][0]
            kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, release.operator_account, create=False)
            wait_until(
                lambda: can_i(control_plane, kubeconfig, "watch", "rendezvouses.kube-rendezvous.io"),
                30,
                "the operator's RoleBinding to take effect",
            )

            def run(
                metrics_url: str, crd_names: str = " ".join(CRD_NAMES), watched: str = namespace
            ) -> subprocess.CompletedProcess[str]:
                env = {
                    "KUBECONFIG": str(kubeconfig),
                    "CRD_NAMES": crd_names,
                    "METRICS_URL": metrics_url,
                    "METRICS_WAIT_SECONDS": "1",  # the script's retries after a rollout, cut short here
                    "WATCH_NAMESPACE": watched,
                }
                return subprocess.run(
                    [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
                )

            with OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log") as operator:
                url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
                passed = run(url)
                assert passed.returncode == 0, passed.stderr
                assert "serves the operator's metrics" in passed.stdout
                missing = run(url, "rendezvouses.kube-rendezvous.io nothings.kube-rendezvous.io")
                assert missing.returncode == 1
                assert "CRD nothings.kube-rendezvous.io: 404" in missing.stderr
            silent = run(f"http://127.0.0.1:{free_port()}/metrics")
            assert silent.returncode == 1
            assert "FAILED" in silent.stderr
            # Without the metrics Service (no METRICS_URL) it lists Rendezvous objects instead.
            listed = run("")
            assert listed.returncode == 0, listed.stderr
            assert f"Rendezvous objects in {namespace} can be listed" in listed.stdout
            unwatched = run("", watched="kube-system")  # the namespace-scoped operator may not list there
            assert unwatched.returncode == 1
            assert "listing Rendezvous objects in kube-system: 403" in unwatched.stderr
        finally:
            uninstall(helm, control_plane, release)


def release_test_hooks(helm: Helm, control_plane: ControlPlane, release: Release) -> list[Manifest]:
    """The hooks of an installed release (``helm get hooks``): the ``helm test`` Pod helm would create."""
    hooks = helm.run(
        "get", "hooks", release.name, "-n", release.namespace, "--kubeconfig", str(control_plane.admin_kubeconfig)
    ).stdout
    return [document for document in yaml.safe_load_all(hooks) if document]


# -- 3. aggregated ClusterRoles -------------------------------------------------------------------


def aggregated(manifests: list[Manifest]) -> dict[str, Manifest]:
    roles = [
        m for m in objects_of(manifests, "ClusterRole") if m["metadata"]["labels"].get(COMPONENT) == "aggregated-rbac"
    ]
    return {role["metadata"]["name"].rsplit("-", 1)[1]: role for role in roles}


def bound_account(control_plane: ControlPlane, namespace: str, account: str, cluster_role: str) -> Path:
    """A kubeconfig of ServiceAccount ``account`` bound in ``namespace`` to the built-in ``cluster_role``."""
    kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, account)
    control_plane.kubectl(
        "create",
        "rolebinding",
        account,
        f"--clusterrole={cluster_role}",
        f"--serviceaccount={namespace}:{account}",
        "-n",
        namespace,
    )
    return kubeconfig


class TestTheAggregatedRoles:
    def test_view_reads_and_edit_writes_rendezvouses_and_keys_but_no_role_writes_the_status(self, helm: Helm) -> None:
        roles = aggregated(helm.template())
        assert sorted(roles) == ["edit", "view"]
        view, edit = roles["view"], roles["edit"]
        assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
        assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
        assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
        assert view["rules"] == [
            {
                "apiGroups": ["kube-rendezvous.io"],
                "resources": ["rendezvouses", "rendezvouses/status", "rendezvouskeys"],
                "verbs": ["get", "list", "watch"],
            }
        ]
        assert edit["rules"] == [
            {
                "apiGroups": ["kube-rendezvous.io"],
                "resources": ["rendezvouses", "rendezvouskeys"],
                "verbs": ["create", "update", "patch", "delete", "deletecollection"],
            }
        ]

    def test_they_can_be_left_out(self, helm: Helm) -> None:
        assert aggregated(helm.template("rbac.aggregateToDefaultRoles=false")) == {}

    def test_the_built_in_view_edit_and_admin_roles_gain_the_rights_after_install(
        self,
        helm: Helm,
        control_plane: ControlPlane,
        admin_api: client.ApiClient,
        namespace: str,
        crds: None,
        tmp_path: Path,
    ) -> None:
        release = install(helm, control_plane, release_name(), namespace, "rbac.scope=namespace")
        aggregation = extra_controllers(control_plane, tmp_path / "kcm.log", "clusterrole-aggregation-controller")
        with aggregation, contextlib.ExitStack() as cleanup:
            cleanup.callback(uninstall, helm, control_plane, release)
            create_rendezvous(admin_api, namespace, "job")
            viewer = bound_account(control_plane, namespace, "viewer", "view")
            editor = bound_account(control_plane, namespace, "editor", "edit")
            admin = bound_account(control_plane, namespace, "admin", "admin")
            # The clusterrole-aggregation controller folds the labelled roles into view/edit/admin.
            wait_until(lambda: can_i(control_plane, viewer, "get", "rdzv"), 60, "view to aggregate the viewer role")
            wait_until(lambda: can_i(control_plane, editor, "patch", "rdzv"), 60, "edit to aggregate the edit role")
            wait_until(lambda: can_i(control_plane, admin, "delete", "rdzv"), 60, "admin to aggregate the edit role")

            # Real requests, as those accounts.
            got = control_plane.kubectl("get", "rdzv", "job", "-o", "name", kubeconfig=viewer)
            assert got.stdout.strip() == "rendezvous.kube-rendezvous.io/job"
            control_plane.kubectl("get", "rendezvouskeys", kubeconfig=viewer)
            refused = control_plane.kubectl(
                "patch", "rdzv", "job", "--type=merge", "-p", '{"spec":{"closed":true}}', kubeconfig=viewer, check=False
            )
            assert refused.returncode != 0 and "forbidden" in refused.stderr
            control_plane.kubectl(
                "patch", "rdzv", "job", "--type=merge", "-p", '{"spec":{"closed":true}}', kubeconfig=editor
            )
            closed = client.CustomObjectsApi(admin_api).get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "job"
            )
            assert closed["spec"]["closed"] is True  # type: ignore[index]
            for account in (viewer, editor, admin):
                assert not can_i(control_plane, account, "patch", "rdzv", "--subresource=status")
            assert can_i(control_plane, editor, "create", "rendezvouskeys.kube-rendezvous.io")
            assert not can_i(control_plane, viewer, "create", "rendezvouskeys.kube-rendezvous.io")


# -- 4. monitoring --------------------------------------------------------------------------------


def exported_metrics() -> dict[str, set[str]]:
    """Every metric that operator/kube_rendezvous_operator/metrics.py defines: exposed name -> label names
    (a histogram's ``_bucket`` also has ``le``)."""
    found: dict[str, set[str]] = {}
    kinds = ("Counter", "Gauge", "Histogram")
    for node in ast.walk(ast.parse(METRICS_PY.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in kinds:
            name = node.args[0]
            assert isinstance(name, ast.Constant) and isinstance(name.value, str)
            labels: set[str] = set()
            if len(node.args) > 2 and isinstance(node.args[2], ast.List):
                labels = {str(item.value) for item in node.args[2].elts if isinstance(item, ast.Constant)}
            if node.func.id == "Histogram":
                found[f"{name.value}_bucket"] = labels | {"le"}
                found[f"{name.value}_sum"] = found[f"{name.value}_count"] = labels
                continue
            exposed = name.value if node.func.id == "Gauge" or name.value.endswith("_total") else f"{name.value}_total"
            found[exposed] = labels
    return found


METRIC = re.compile(r"\bkube_rendezvous_[a-z_]+\b")
GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")


def check_query(query: str, where: str) -> list[str]:
    """Problems of a PromQL ``query``: unknown metrics, grouping labels a metric lacks, unbalanced brackets."""
    metrics = exported_metrics()
    problems = []
    used = set(METRIC.findall(query))
    if not used:
        problems.append(f"{where}: no operator metric in {query!r}")
    for name in used - metrics.keys():
        problems.append(f"{where}: {name} is not a metric of metrics.py")
    for labels in GROUPING.findall(query):
        for label in (label.strip() for label in labels.split(",") if label.strip()):
            for name in used & metrics.keys():
                if label not in metrics[name]:
                    problems.append(f"{where}: {name} has no label {label}")
    for opening, closing in ("()", "[]", "{}"):
        if query.count(opening) != query.count(closing):
            problems.append(f"{where}: unbalanced {opening}{closing} in {query!r}")
    return problems


def dashboard() -> Manifest:
    loaded: Manifest = json.loads((CHART / "files" / "dashboards" / "kube-rendezvous.json").read_text())
    return loaded


class TestMonitoring:
    def test_nothing_that_needs_the_prometheus_operator_renders_by_default(self, helm: Helm) -> None:
        kinds = {m["kind"] for m in helm.template()}
        assert not kinds & {"ServiceMonitor", "PrometheusRule", "ConfigMap"}

    @pytest.mark.parametrize(
        ("toggle", "kind"),
        [
            ("metrics.serviceMonitor.enabled", "ServiceMonitor"),
            ("metrics.prometheusRule.enabled", "PrometheusRule"),
            ("metrics.grafanaDashboard.enabled", "ConfigMap"),
        ],
    )
    def test_each_toggle_renders_its_object_alone(self, helm: Helm, toggle: str, kind: str) -> None:
        manifests = helm.template(f"{toggle}=true")
        rendered = {m["kind"] for m in manifests} & {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
        assert rendered == {kind}

    def test_the_service_monitor_scrapes_the_metrics_service_port_keeping_the_rendezvous_labels(
        self, helm: Helm
    ) -> None:
        manifests = helm.template("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom")
        monitor, service = the(manifests, "ServiceMonitor"), the(manifests, "Service")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml-platform"]}
        assert monitor["metadata"]["labels"]["release"] == "prom"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == service["spec"]["ports"][0]["name"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["honorLabels"] is True

    def test_a_service_monitor_without_the_service_is_refused_with_a_reason(self, helm: Helm) -> None:
        rendered = helm.run(
            "template",
            "rdzv",
            CHART,
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.service.enabled=false",
            check=False,
        )
        assert rendered.returncode != 0
        assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in rendered.stderr

    def test_the_alerts_cover_a_stuck_round_an_eviction_storm_and_an_invalid_state(self, helm: Helm) -> None:
        rule = the(helm.template("metrics.prometheusRule.enabled=true"), "PrometheusRule")
        alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
        assert {"KubeRendezvousStuckJoining", "KubeRendezvousEvictionStorm", "KubeRendezvousStateInvalid"} <= set(
            alerts
        )
        assert "kube_rendezvous_waiting_nodes" in alerts["KubeRendezvousStuckJoining"]["expr"]
        assert 'kube_rendezvous_phase{phase=~"Joining|LastCall"}' in alerts["KubeRendezvousStuckJoining"]["expr"]
        assert "kube_rendezvous_node_evictions_total" in alerts["KubeRendezvousEvictionStorm"]["expr"]
        assert 'reason="StateInvalid"' in alerts["KubeRendezvousStateInvalid"]["expr"]
        # It names the object: the Events counter carries the Rendezvous's namespace and name.
        assert "by (namespace, name)" in alerts["KubeRendezvousStateInvalid"]["expr"]
        assert "$labels.name" in alerts["KubeRendezvousStateInvalid"]["annotations"]["summary"]
        for alert in alerts.values():
            assert alert["labels"]["severity"] in ("warning", "critical")
            assert alert["annotations"]["summary"]

    def test_alert_thresholds_come_from_values(self, helm: Helm) -> None:
        rule = the(
            helm.template(
                "metrics.prometheusRule.enabled=true",
                "metrics.prometheusRule.stuckJoiningFor=42m",
                "metrics.prometheusRule.evictionStormThreshold=17",
            ),
            "PrometheusRule",
        )
        alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
        assert "[42m]" in alerts["KubeRendezvousStuckJoining"]["expr"]
        assert alerts["KubeRendezvousEvictionStorm"]["expr"].strip().endswith("> 17")

    def test_every_alert_uses_only_metrics_and_labels_the_operator_exports(self, helm: Helm) -> None:
        rule = the(helm.template("metrics.prometheusRule.enabled=true"), "PrometheusRule")
        problems = [
            problem
            for group in rule["spec"]["groups"]
            for alert in group["rules"]
            for problem in check_query(alert["expr"], alert["alert"])
        ]
        assert problems == []

    def test_every_dashboard_query_uses_only_metrics_and_labels_the_operator_exports(self) -> None:
        queries = [
            (f"panel {panel['title']!r}", target["expr"])
            for panel in dashboard()["panels"]
            for target in panel["targets"]
        ]
        queries += [
            (f"variable {v['name']}", v["definition"])
            for v in dashboard()["templating"]["list"]
            if v["type"] == "query"
        ]
        assert len(queries) > 10
        assert [problem for where, query in queries for problem in check_query(query, where)] == []

    def test_the_checker_catches_a_metric_or_label_the_operator_does_not_export(self) -> None:
        assert check_query("rate(kube_rendezvous_rounds_total[5m])", "x")  # the real one is rounds_completed
        assert check_query("sum by (pod) (kube_rendezvous_round)", "x")
        assert check_query("sum(kube_rendezvous_round", "x")

    def test_the_dashboard_config_map_carries_the_chart_file_for_the_grafana_sidecar(self, helm: Helm) -> None:
        manifests = helm.template(
            "metrics.grafanaDashboard.enabled=true",
            "metrics.grafanaDashboard.namespace=monitoring",
            "metrics.grafanaDashboard.annotations.grafana_folder=Training",
        )
        config_map = the(manifests, "ConfigMap")
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "monitoring"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "Training"}
        assert json.loads(config_map["data"]["kube-rendezvous.json"]) == dashboard()
        assert dashboard()["uid"] == "kube-rendezvous"

    def test_with_the_prometheus_operator_crds_the_chart_installs_its_monitoring_objects(
        self, helm: Helm, control_plane: ControlPlane, namespace: str, crds: None, monitoring_crds: None
    ) -> None:
        manifests = helm.template(*MONITORING_ON, namespace=namespace)
        monitoring = [m for m in manifests if m["kind"] in ("ServiceMonitor", "PrometheusRule", "ConfigMap")]
        # Strict server-side validation: a field the CRD schema does not know is an error, not pruned.
        checked = control_plane.kubectl(
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
            check=False,
            input=yaml.safe_dump_all(monitoring),
        )
        assert checked.returncode == 0, checked.stderr
        release = install(helm, control_plane, release_name(), namespace, "rbac.scope=namespace", *MONITORING_ON)
        try:
            found = kubectl_json(
                control_plane,
                "get",
                "servicemonitors,prometheusrules,configmaps",
                "-n",
                namespace,
                "-l",
                f"app.kubernetes.io/instance={release.name}",
            )
            kinds = sorted(item["kind"] for item in found["items"])
            assert kinds == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]
            rule = next(item for item in found["items"] if item["kind"] == "PrometheusRule")
            assert [r["alert"] for r in rule["spec"]["groups"][0]["rules"]][:3] == [
                "KubeRendezvousStuckJoining",
                "KubeRendezvousEvictionStorm",
                "KubeRendezvousStateInvalid",
            ]
        finally:
            uninstall(helm, control_plane, release)

    def test_the_api_server_refuses_a_service_monitor_with_a_bad_interval(
        self, control_plane: ControlPlane, namespace: str, monitoring_crds: None
    ) -> None:
        """The vendored CRD validates: the install above passing means something."""
        bad = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "bad", "namespace": namespace},
            "spec": {"selector": {}, "endpoints": [{"port": "metrics", "interval": "often"}]},
        }
        refused = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", check=False, input=yaml.safe_dump(bad))
        assert refused.returncode != 0
        assert "interval" in refused.stderr


@pytest.fixture(scope="session")
def monitoring_crds(control_plane: ControlPlane) -> None:
    """The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs (reduced copies in tests/data)."""
    paths = sorted(DATA.glob("monitoring.coreos.com_*.yaml"))
    for path in paths:
        control_plane.kubectl("apply", "-f", str(path))
    names = [f"crd/{yaml.safe_load(path.read_text())['metadata']['name']}" for path in paths]
    control_plane.wait_established(*names)


# -- 5. the PodDisruptionBudget and replicas ------------------------------------------------------


class TestThePodDisruptionBudget:
    def test_it_is_off_by_default(self, helm: Helm) -> None:
        assert objects_of(helm.template(), "PodDisruptionBudget") == []

    def test_it_allows_one_unavailable_operator_pod_and_never_sets_min_available(self, helm: Helm) -> None:
        manifests = helm.template("podDisruptionBudget.enabled=true")
        budget = the(manifests, "PodDisruptionBudget")
        assert budget["spec"]["maxUnavailable"] == 1
        assert "minAvailable" not in budget["spec"]
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        pod_labels = the(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    @pytest.mark.parametrize("replicas", [0, 1, 2])
    def test_replicas_come_from_values(self, helm: Helm, replicas: int) -> None:
        manifests = helm.template(f"operator.replicas={replicas}")
        assert the(manifests, "Deployment")["spec"]["replicas"] == replicas

    def test_a_drain_evicts_the_single_ready_operator_pod(
        self,
        helm: Helm,
        control_plane: ControlPlane,
        admin_api: client.ApiClient,
        namespace: str,
        crds: None,
        tmp_path: Path,
    ) -> None:
        controllers = ("deployment-controller", "replicaset-controller", "disruption-controller")
        release = install(
            helm, control_plane, release_name(), namespace, "rbac.scope=namespace", "podDisruptionBudget.enabled=true"
        )
        core = client.CoreV1Api(admin_api)
        policy = client.PolicyV1Api(admin_api)
        with extra_controllers(control_plane, tmp_path / "kcm.log", *controllers), contextlib.ExitStack() as cleanup:
            cleanup.callback(uninstall, helm, control_plane, release)
            selector = ",".join(f"{k}={v}" for k, v in pod_spec_labels(release).items())
            pods = wait_until(
                lambda: core.list_namespaced_pod(namespace, label_selector=selector).items,
                60,
                "the Deployment's operator pod",
            )
            pod = pods[0].metadata.name
            # No kubelet here: mark the pod Running and Ready as the kubelet would, so the budget
            # counts one healthy pod of one (the case of a drain in a real cluster).
            core.patch_namespaced_pod_status(
                pod,
                namespace,
                {
                    "status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                    }
                },
            )
            budget_name = the(release.manifests, "PodDisruptionBudget")["metadata"]["name"]

            def budget_status() -> Any:
                status = policy.read_namespaced_pod_disruption_budget(budget_name, namespace).status
                return status if status is not None and status.current_healthy == 1 else None

            status = wait_until(budget_status, 60, "the disruption controller to count the healthy operator pod")
            assert (status.expected_pods, status.desired_healthy, status.disruptions_allowed) == (1, 0, 1)
            policy_eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
            core.create_namespaced_pod_eviction(pod, namespace, policy_eviction)  # a 429 would raise


def pod_spec_labels(release: Release) -> dict[str, str]:
    labels: dict[str, str] = the(release.manifests, "Deployment")["spec"]["selector"]["matchLabels"]
    return labels


# -- 6. the schema of the new options -------------------------------------------------------------


class TestTheSchemaOfTheOperationsOptions:
    @pytest.mark.parametrize(
        ("value", "complaint"),
        [
            ("crds.install=maybe", "/crds/install"),
            ("crds.upgrade=true", "additional properties 'upgrade' not allowed"),
            ("operator.replicas=6", "/operator/replicas"),
            ("operator.replicas=-1", "/operator/replicas"),
            ("rbac.aggregateToDefaultRoles=yes", "/rbac/aggregateToDefaultRoles"),
            ("metrics.serviceMonitor.enable=true", "additional properties 'enable' not allowed"),
            ("metrics.serviceMonitor.interval=often", "/metrics/serviceMonitor/interval"),
            ("metrics.prometheusRule.stuckJoiningFor=15", "/metrics/prometheusRule/stuckJoiningFor"),
            ("metrics.prometheusRule.evictionStormThreshold=0", "/metrics/prometheusRule/evictionStormThreshold"),
            ("metrics.prometheusRule.labels.bad\\ key=x", "'bad key' does not match pattern"),
            ("metrics.grafanaDashboard.namespace=Not_A_Namespace", "/metrics/grafanaDashboard/namespace"),
            ("tests.enabled=1", "/tests/enabled"),
            ("podDisruptionBudget.maxUnavailable=0", "/podDisruptionBudget/maxUnavailable"),
            ("podDisruptionBudget.minAvailable=1", "additional properties 'minAvailable' not allowed"),
        ],
    )
    def test_a_bad_value_fails_the_render_with_a_schema_error_naming_it(
        self, helm: Helm, value: str, complaint: str
    ) -> None:
        rendered = helm.run("template", "rdzv", CHART, "--set", value, check=False)
        assert rendered.returncode != 0
        assert "values don't meet the specifications of the schema" in rendered.stderr
        assert complaint in rendered.stderr

    def test_every_new_toggle_is_in_the_schema_and_the_values(self) -> None:
        schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        for path in (
            "crds.install",
            "crds.keep",
            "operator.replicas",
            "rbac.aggregateToDefaultRoles",
            "metrics.serviceMonitor.enabled",
            "metrics.prometheusRule.enabled",
            "metrics.grafanaDashboard.enabled",
            "tests.enabled",
            "podDisruptionBudget.enabled",
            "podDisruptionBudget.maxUnavailable",
        ):
            node, value = schema, values
            *parents, leaf = path.split(".")
            for key in parents:
                node, value = node[key]["properties"], value[key]
            assert leaf in node, path
            assert leaf in value, path


# -- 7. the operator's cluster-wide RBAC ----------------------------------------------------------


@pytest.fixture
def cluster_operator_account(
    helm: Helm, control_plane: ControlPlane, namespace: str
) -> Iterator[tuple[str, list[Manifest]]]:
    """The chart's rbac.scope=cluster ServiceAccount, ClusterRole and binding, applied; their user name."""
    rendered = helm.template("rbac.scope=cluster", release=release_name(), namespace=namespace)
    manifests = operator_objects(rendered, "ServiceAccount")
    rbac = [
        m
        for m in rendered
        if m["kind"] in ("ClusterRole", "ClusterRoleBinding") and m["metadata"]["labels"].get(COMPONENT) == "operator"
    ]
    assert [m["kind"] for m in rbac] == ["ClusterRole", "ClusterRoleBinding"]
    applied = manifests + rbac
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(applied))
    account = manifests[0]["metadata"]["name"]
    try:
        yield f"system:serviceaccount:{namespace}:{account}", rbac
    finally:
        for m in rbac:
            control_plane.kubectl("delete", m["kind"].lower(), m["metadata"]["name"], "--ignore-not-found")


def allowed(control_plane: ControlPlane, user: str, *question: str) -> bool:
    answer = control_plane.kubectl("auth", "can-i", *question, f"--as={user}", check=False)
    return answer.stdout.strip() == "yes"


#: Every request the operator makes (docs/operator-rbac.yaml, kube_rendezvous_operator.handlers):
#: across every namespace, and in one it has never seen.
OPERATOR_NEEDS = [
    ("list", "rendezvouses.kube-rendezvous.io", "-A"),
    ("watch", "rendezvouses.kube-rendezvous.io", "-A"),
    ("get", "rendezvouses.kube-rendezvous.io", "-n", "team-z"),
    ("patch", "rendezvouses.kube-rendezvous.io", "-n", "team-z"),
    ("delete", "rendezvouses.kube-rendezvous.io", "-n", "team-z"),
    ("get", "rendezvouses.kube-rendezvous.io", "--subresource=status", "-n", "team-z"),
    ("patch", "rendezvouses.kube-rendezvous.io", "--subresource=status", "-n", "team-z"),
    ("list", "pods", "-A"),
    ("watch", "pods", "-A"),
    ("get", "pods", "-n", "team-z"),
    ("create", "events", "-n", "team-z"),
    ("patch", "events", "-n", "team-z"),
    ("create", "events.events.k8s.io", "-n", "team-z"),
    *((verb, "leases.coordination.k8s.io", "-n", "team-z") for verb in ("get", "create", "update", "patch", "delete")),
    ("list", "leases.coordination.k8s.io", "-A"),
    ("watch", "leases.coordination.k8s.io", "-A"),
    ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
    ("list", "namespaces"),
    ("watch", "namespaces"),
]

#: What it must never be able to do.
OPERATOR_MUST_NOT = [
    ("delete", "pods", "-n", "team-z"),
    ("create", "pods", "-n", "team-z"),
    ("create", "pods/eviction", "-n", "team-z"),
    ("get", "secrets", "-n", "team-z"),
    ("list", "secrets", "-A"),
    ("create", "rendezvouses.kube-rendezvous.io", "-n", "team-z"),
    ("update", "rendezvouses.kube-rendezvous.io", "--subresource=status", "-n", "team-z"),
    ("get", "rendezvouskeys.kube-rendezvous.io", "-n", "team-z"),
    ("delete", "namespaces"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("impersonate", "serviceaccounts", "-n", "team-z"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("*", "*"),
]


class TestTheOperatorClusterRBAC:
    def test_the_operator_account_may_make_every_request_the_operator_makes_in_every_namespace(
        self, control_plane: ControlPlane, cluster_operator_account: tuple[str, list[Manifest]]
    ) -> None:
        user, _ = cluster_operator_account
        wait_until(lambda: allowed(control_plane, user, *OPERATOR_NEEDS[0]), 30, "the ClusterRoleBinding to apply")
        refused = [" ".join(question) for question in OPERATOR_NEEDS if not allowed(control_plane, user, *question)]
        assert refused == []

    def test_every_verb_of_every_rendered_rule_is_granted_cluster_wide(
        self, control_plane: ControlPlane, cluster_operator_account: tuple[str, list[Manifest]]
    ) -> None:
        user, rbac = cluster_operator_account
        wait_until(lambda: allowed(control_plane, user, *OPERATOR_NEEDS[0]), 30, "the ClusterRoleBinding to apply")
        questions = []
        for rule in the(rbac, "ClusterRole")["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    base, _, subresource = resource.partition("/")
                    qualified = f"{base}.{group}" if group else base
                    extra = [f"--subresource={subresource}"] if subresource else []
                    questions += [(verb, qualified, *extra, "-A") for verb in rule["verbs"]]
        assert len(questions) >= 25
        assert [" ".join(q) for q in questions if not allowed(control_plane, user, *q)] == []

    def test_the_operator_account_is_refused_what_the_operator_must_not_do(
        self, control_plane: ControlPlane, cluster_operator_account: tuple[str, list[Manifest]]
    ) -> None:
        user, _ = cluster_operator_account
        wait_until(lambda: allowed(control_plane, user, *OPERATOR_NEEDS[0]), 30, "the ClusterRoleBinding to apply")
        granted = [" ".join(question) for question in OPERATOR_MUST_NOT if allowed(control_plane, user, *question)]
        assert granted == []
