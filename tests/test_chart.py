"""The Helm chart charts/kube-rendezvous, the examples, and the operator image's build files.

Rendering tests run ``helm lint`` and ``helm template`` only. Installing tests run ``helm install``
against the real control plane, which has no kubelet: the operator's pod stays Pending, so they
check the objects and the permissions, and run the operator as a local process under the
chart's ServiceAccount and RBAC instead.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kube_rendezvous import create_backend
from kubernetes import client
from tensorplay.distributed.elastic.rendezvous.api import RendezvousConnectionError
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

from tests.e2e.operator_process import OperatorProcess
from tests.helpers import REPO, rendezvous_parameters
from tests.testenv import ControlPlane, ensure_binaries, wait_until

CHART = REPO / "charts" / "kube-rendezvous"
EXAMPLES = REPO / "examples"
GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"
CHART_CRDS = CHART / "files" / "crds"
CRD_NAMES = ("rendezvouses.kube-rendezvous.io", "rendezvouskeys.kube-rendezvous.io")
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
RELEASE_NAMESPACE = "ml-platform"

Manifest = dict[str, Any]


# -- helm --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Helm:
    """The helm binary with its own, empty cache/config/data folders."""

    binary: Path
    home: Path

    def run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        result = subprocess.run(
            [str(self.binary), *map(str, args)], capture_output=True, text=True, env=env, timeout=180
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr}")
        return result

    def template(self, *values: str, release: str = "rdzv", namespace: str = RELEASE_NAMESPACE) -> list[Manifest]:
        """Render the chart with ``--set`` ``values``; return its objects."""
        sets = [arg for value in values for arg in ("--set", value)]
        rendered = self.run("template", release, CHART, "--namespace", namespace, *sets).stdout
        return [document for document in yaml.safe_load_all(rendered) if document]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))


def objects_of(manifests: list[Manifest], kind: str, namespace: str | None = None) -> list[Manifest]:
    return [
        manifest
        for manifest in manifests
        if manifest["kind"] == kind and (namespace is None or manifest["metadata"].get("namespace") == namespace)
    ]


def the(manifests: list[Manifest], kind: str, namespace: str | None = None) -> Manifest:
    """The one object of ``kind`` (in ``namespace``); fail if there are none or several."""
    found = objects_of(manifests, kind, namespace)
    assert len(found) == 1, f"expected one {kind}, found {[m['metadata']['name'] for m in found]}"
    return found[0]


def operator_objects(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in objects_of(manifests, kind) if m["metadata"]["labels"].get(COMPONENT) == "operator"]


def training_objects(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in objects_of(manifests, kind) if m["metadata"]["labels"].get(COMPONENT) == "training-rbac"]


def pod_spec(manifests: list[Manifest]) -> Manifest:
    spec: Manifest = the(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def operator_container(manifests: list[Manifest]) -> Manifest:
    container: Manifest = pod_spec(manifests)["containers"][0]
    return container


def env_of(container: Manifest) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def documented(path: str, kind: str) -> Manifest:
    """The object of ``kind`` in docs/``path``, the documented source of the chart's RBAC."""
    return the([d for d in yaml.safe_load_all((REPO / "docs" / path).read_text()) if d], kind)


def without(rules: list[Manifest], *resources: str) -> list[Manifest]:
    return [rule for rule in rules if not set(rule["resources"]) & set(resources)]


def app_version() -> str:
    version: str = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return version


# -- rendering ---------------------------------------------------------------------------------


class TestTheChartRenders:
    @pytest.mark.parametrize("values", [[], ["rbac.scope=namespace"]], ids=["cluster-scope", "namespace-scope"])
    def test_helm_lint_reports_no_warning_or_error(self, helm: Helm, values: list[str]) -> None:
        sets = [arg for value in values for arg in ("--set", value)]
        linted = helm.run("lint", "--strict", CHART, *sets)
        assert "[WARNING]" not in linted.stdout
        assert "[ERROR]" not in linted.stdout
        assert "0 chart(s) failed" in linted.stdout

    def test_default_values_render_the_operator_its_cluster_rbac_metrics_and_the_training_rbac(
        self, helm: Helm
    ) -> None:
        kinds = sorted(manifest["kind"] for manifest in helm.template())
        assert kinds == sorted(
            [
                "CustomResourceDefinition",  # rendezvouses
                "CustomResourceDefinition",  # rendezvouskeys
                "ServiceAccount",  # the operator's
                "ServiceAccount",  # the trainer
                "ClusterRole",  # the operator's
                "ClusterRole",  # aggregated into view
                "ClusterRole",  # aggregated into edit and admin
                "ClusterRoleBinding",
                "Role",  # the trainer's
                "RoleBinding",
                "Service",
                "Deployment",
                "Pod",  # the helm test hook
            ]
        )

    def test_namespace_scope_renders_roles_in_place_of_the_cluster_wide_role(self, helm: Helm) -> None:
        manifests = helm.template("rbac.scope=namespace")
        assert [m["metadata"]["namespace"] for m in operator_objects(manifests, "Role")] == [RELEASE_NAMESPACE]
        assert [m["metadata"]["namespace"] for m in operator_objects(manifests, "RoleBinding")] == [RELEASE_NAMESPACE]
        assert len(operator_objects(manifests, "ClusterRole")) == 1  # only reads CRDs; see TestTheOperatorRBAC

    def test_every_object_carries_the_standard_labels(self, helm: Helm) -> None:
        for manifest in helm.template("rbac.scope=namespace") + helm.template():
            labels = manifest["metadata"]["labels"]
            assert labels[INSTANCE] == "rdzv"
            assert labels["app.kubernetes.io/name"] == "kube-rendezvous"
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/version"] == app_version()
            assert labels["helm.sh/chart"] == f"kube-rendezvous-{app_version()}"  # version = appVersion: test_release

    def test_every_namespaced_object_names_its_namespace(self, helm: Helm) -> None:
        cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
        for manifest in helm.template("rbac.scope=namespace") + helm.template():
            assert ("namespace" in manifest["metadata"]) == (manifest["kind"] not in cluster_scoped), manifest


class TestTheSchemaRejectsBadValues:
    @pytest.mark.parametrize(
        ("value", "complaint"),
        [
            ("bogus=1", "additional properties 'bogus' not allowed"),
            ("image.bogus=1", "additional properties 'bogus' not allowed"),
            ("operator.resources.limits.gpu=1", "additional properties 'gpu' not allowed"),
            ("trainingRBAC.enable=false", "additional properties 'enable' not allowed"),
            ("rbac.scope=galaxy", "/rbac/scope"),
            ("watchNamespaces={Not_A_Namespace}", "/watchNamespaces/0"),
            ("metrics.port=80", "/metrics/port"),
            ("operator.verbose=maybe", "/operator/verbose"),
            # The overrides: runAsNonRoot stays true, no UID 0, no privileged container.
            ("operator.securityContext.runAsNonRoot=false", "/operator/securityContext/runAsNonRoot"),
            ("operator.podSecurityContext.runAsNonRoot=false", "/operator/podSecurityContext/runAsNonRoot"),
            ("operator.securityContext.runAsUser=0", "/operator/securityContext/runAsUser"),
            ("operator.securityContext.privileged=true", "/operator/securityContext/privileged"),
            ("operator.securityContext.bogus=1", "additional properties 'bogus' not allowed"),
            ("operator.affinity.nodeAffinty.x=1", "additional properties 'nodeAffinty' not allowed"),
            ("operator.extraEnv[0].value=x", "missing property 'name'"),
            ("operator.topologySpreadConstraints[0].maxSkew=1", "/operator/topologySpreadConstraints/0"),
            ("trainingRBAC.createNamespaces=yes", "/trainingRBAC/createNamespaces"),
        ],
    )
    def test_an_unknown_or_mistyped_value_fails_the_render(self, helm: Helm, value: str, complaint: str) -> None:
        rendered = helm.run("template", "rdzv", CHART, "--set", value, check=False)
        assert rendered.returncode != 0
        assert "values don't meet the specifications of the schema" in rendered.stderr
        assert complaint in rendered.stderr

    def test_every_object_level_of_the_schema_is_closed(self) -> None:
        def open_levels(node: Any, where: str) -> Iterator[str]:
            if isinstance(node, dict):
                if node.get("type") == "object" and node.get("additionalProperties", True) is True:
                    yield where or "/"
                for key, child in node.items():
                    yield from open_levels(child, f"{where}/{key}")
            elif isinstance(node, list):
                for index, child in enumerate(node):
                    yield from open_levels(child, f"{where}/{index}")

        schema = json.loads((CHART / "values.schema.json").read_text())
        # A parent chart's globals, and the Kubernetes types (affinity terms, selectors, ...) the
        # API server validates: every level the chart itself defines is closed.
        assert list(open_levels(schema, "")) == ["/definitions/kubernetesObject", "/properties/global"]


class TestTheChartAsASubchart:
    def test_a_parent_chart_with_global_values_renders_it(self, helm: Helm, tmp_path: Path) -> None:
        parent = tmp_path / "platform"
        parent.mkdir()
        (parent / "Chart.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v2",
                    "name": "platform",
                    "version": "1.0.0",
                    "dependencies": [
                        {"name": "kube-rendezvous", "version": app_version(), "repository": f"file://{CHART}"}
                    ],
                }
            )
        )
        (parent / "values.yaml").write_text(
            yaml.safe_dump(
                {
                    "global": {"imageRegistry": "registry.example.com", "storageClass": "fast"},
                    "kube-rendezvous": {"operator": {"replicas": 2}},
                }
            )
        )
        helm.run("dependency", "update", parent, "--skip-refresh")
        rendered = helm.run("template", "rdzv", parent, "--namespace", RELEASE_NAMESPACE, "--set", "global.team=ml")
        manifests = [document for document in yaml.safe_load_all(rendered.stdout) if document]
        assert the(manifests, "Deployment")["spec"]["replicas"] == 2
        assert len(objects_of(manifests, "CustomResourceDefinition")) == 2


class TestTheChartCrds:
    """The CRDs are templates (so ``helm upgrade`` updates them) made from files/crds/, copies of crds/."""

    def test_the_chart_holds_exactly_the_repository_crds(self) -> None:
        assert sorted(p.name for p in CHART_CRDS.iterdir()) == sorted(p.name for p in (REPO / "crds").iterdir())

    @pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "crds").glob("*.yaml")))
    def test_each_chart_crd_is_a_byte_identical_copy_of_crds(self, name: str) -> None:
        assert (CHART_CRDS / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"charts/kube-rendezvous/files/crds/{name} drifted from crds/{name}: "
            f"cp crds/{name} charts/kube-rendezvous/files/crds/"
        )

    def test_the_chart_has_no_crds_folder_which_helm_would_install_once_and_never_upgrade(self) -> None:
        assert not (CHART / "crds").exists()

    @pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "crds").glob("*.yaml")))
    def test_each_rendered_crd_is_the_repository_crd_plus_labels_and_the_keep_policy(
        self, helm: Helm, name: str
    ) -> None:
        source = yaml.safe_load((REPO / "crds" / name).read_text())
        rendered = next(
            m
            for m in objects_of(helm.template(), "CustomResourceDefinition")
            if m["metadata"]["name"] == source["metadata"]["name"]
        )
        metadata = rendered["metadata"]
        assert metadata.pop("annotations") == {"helm.sh/resource-policy": "keep"}
        labels = metadata.pop("labels")
        assert labels[INSTANCE] == "rdzv" and labels[COMPONENT] == "crds"
        assert rendered == source

    @pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "crds").glob("*.yaml")))
    def test_each_crd_file_has_a_bare_metadata_the_template_can_add_to(self, name: str) -> None:
        """templates/crds.yaml inserts labels and annotations after ``metadata:``: the file must hold none."""
        text = (REPO / "crds" / name).read_text()
        assert text.count("\nmetadata:\n") == 1
        assert yaml.safe_load(text)["metadata"].keys() == {"name"}

    def test_crds_keep_false_drops_the_keep_policy(self, helm: Helm) -> None:
        for crd in objects_of(helm.template("crds.keep=false"), "CustomResourceDefinition"):
            assert "annotations" not in crd["metadata"]

    def test_crds_install_false_renders_no_crd(self, helm: Helm) -> None:
        assert objects_of(helm.template("crds.install=false"), "CustomResourceDefinition") == []


class TestTheOperatorDeployment:
    def test_the_image_tag_defaults_to_the_chart_app_version(self, helm: Helm) -> None:
        image = operator_container(helm.template())["image"]
        assert image == f"ghcr.io/kube-rendezvous/operator:{app_version()}"

    def test_a_set_image_tag_and_repository_replace_the_default(self, helm: Helm) -> None:
        manifests = helm.template("image.repository=registry.local/rdzv-operator", "image.tag=dev-1")
        assert operator_container(manifests)["image"] == "registry.local/rdzv-operator:dev-1"

    def test_one_replica_by_default_and_a_rolling_update_starts_the_standby_first(self, helm: Helm) -> None:
        spec = the(helm.template(), "Deployment")["spec"]
        assert spec["replicas"] == 1
        assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        env = {item["name"]: item for item in spec["template"]["spec"]["containers"][0]["env"]}
        assert env["LEADER_ELECTION"]["value"] == "true"
        assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}

    def test_it_runs_the_operator_module_on_every_namespace_by_default(self, helm: Helm) -> None:
        container = operator_container(helm.template())
        assert container["command"] == ["python", "-m", "kube_rendezvous_operator"]
        assert "--namespace" not in container.get("args", [])

    def test_metrics_port_and_log_format_reach_the_environment_the_ports_and_the_service(self, helm: Helm) -> None:
        manifests = helm.template("metrics.port=9191", "operator.logFormat=plain")
        container = operator_container(manifests)
        assert env_of(container)["METRICS_PORT"] == "9191"
        assert env_of(container)["LOG_FORMAT"] == "plain"
        assert {"name": "metrics", "containerPort": 9191, "protocol": "TCP"} in container["ports"]
        assert the(manifests, "Service")["spec"]["ports"][0]["port"] == 9191

    def test_the_default_environment_is_json_logs_and_metrics_on_9090(self, helm: Helm) -> None:
        env = env_of(operator_container(helm.template()))
        assert env == {
            "METRICS_PORT": "9090",
            "LOG_FORMAT": "json",
            "LIVENESS_ENDPOINT": "http://0.0.0.0:8080/healthz",
            "LEADER_ELECTION": "true",
            "POD_NAME": "",  # from the downward API (valueFrom)
            "POD_NAMESPACE": "",
        }

    def test_it_runs_as_a_non_root_user_on_a_read_only_root_filesystem_without_privileges(self, helm: Helm) -> None:
        manifests = helm.template()
        security = operator_container(manifests)["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == 10001
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod_spec(manifests)["securityContext"]["runAsNonRoot"] is True

    def test_only_tmp_is_writable_through_an_empty_dir(self, helm: Helm) -> None:
        manifests = helm.template()
        mounts = operator_container(manifests)["volumeMounts"]
        assert mounts == [{"name": "tmp", "mountPath": "/tmp"}]
        volume = next(v for v in pod_spec(manifests)["volumes"] if v["name"] == "tmp")
        assert "emptyDir" in volume

    def test_liveness_and_readiness_probe_healthz_on_port_8080(self, helm: Helm) -> None:
        container = operator_container(helm.template())
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["path"] == "/healthz"
            assert ports[get["port"]] == 8080

    def test_resources_come_from_values(self, helm: Helm) -> None:
        manifests = helm.template("operator.resources.requests.cpu=250m", "operator.resources.limits.memory=1Gi")
        resources = operator_container(manifests)["resources"]
        assert resources["requests"]["cpu"] == "250m"
        assert resources["limits"]["memory"] == "1Gi"

    def test_pod_labels_join_the_chart_labels_which_win(self, helm: Helm) -> None:
        manifests = helm.template("operator.podLabels.team=ml", "operator.podLabels.app\\.kubernetes\\.io/component=x")
        deployment = the(manifests, "Deployment")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["team"] == "ml"
        assert labels[COMPONENT] == "operator"
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert "team" not in deployment["metadata"]["labels"]

    def test_pod_annotations_node_selector_tolerations_and_priority_class_come_from_values(self, helm: Helm) -> None:
        manifests = helm.template(
            "operator.podAnnotations.owner=ml-platform",
            "operator.nodeSelector.pool=system",
            "operator.tolerations[0].key=dedicated",
            "operator.tolerations[0].operator=Exists",
            "operator.priorityClassName=system-cluster-critical",
        )
        deployment = the(manifests, "Deployment")
        assert deployment["spec"]["template"]["metadata"]["annotations"] == {"owner": "ml-platform"}
        spec = pod_spec(manifests)
        assert spec["nodeSelector"] == {"pool": "system"}
        assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert spec["priorityClassName"] == "system-cluster-critical"
        test_pod = the(manifests, "Pod")["spec"]  # the helm test pod schedules where the operator does
        assert test_pod["nodeSelector"] == {"pool": "system"}
        assert test_pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]

    def test_no_affinity_spread_or_scheduling_override_by_default(self, helm: Helm) -> None:
        spec = pod_spec(helm.template())
        for key in ("affinity", "topologySpreadConstraints", "nodeSelector", "tolerations", "priorityClassName"):
            assert key not in spec

    def test_affinity_comes_from_values(self, helm: Helm) -> None:
        term = "operator.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
        spec = pod_spec(
            helm.template(
                f"{term}.weight=100",
                f"{term}.podAffinityTerm.topologyKey=kubernetes.io/hostname",
                f"{term}.podAffinityTerm.labelSelector.matchLabels.app\\.kubernetes\\.io/component=operator",
            )
        )
        preferred = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred == [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {COMPONENT: "operator"}},
                },
            }
        ]

    def test_a_topology_spread_constraint_selects_the_operator_pods_unless_it_has_a_selector(self, helm: Helm) -> None:
        spread = "operator.topologySpreadConstraints"
        manifests = helm.template(
            *(f"{spread}[{i}].maxSkew=1" for i in (0, 1)),
            f"{spread}[0].topologyKey=topology.kubernetes.io/zone",
            f"{spread}[0].whenUnsatisfiable=ScheduleAnyway",
            f"{spread}[1].topologyKey=kubernetes.io/hostname",
            f"{spread}[1].whenUnsatisfiable=DoNotSchedule",
            f"{spread}[1].labelSelector.matchLabels.team=ml",
        )
        deployment = the(manifests, "Deployment")
        zone, host = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert zone == {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
        }
        assert host["labelSelector"] == {"matchLabels": {"team": "ml"}}

    def test_extra_env_follows_the_chart_environment(self, helm: Helm) -> None:
        container = operator_container(
            helm.template(
                "operator.extraEnv[0].name=HTTPS_PROXY",
                "operator.extraEnv[0].value=http://proxy:3128",
                "operator.extraEnv[1].name=TOKEN",
                "operator.extraEnv[1].valueFrom.secretKeyRef.name=token",
                "operator.extraEnv[1].valueFrom.secretKeyRef.key=value",
            )
        )
        assert container["env"][-2:] == [
            {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "value"}}},
        ]
        assert env_of(container)["METRICS_PORT"] == "9090"

    def test_security_contexts_come_from_values(self, helm: Helm) -> None:
        manifests = helm.template(
            "operator.podSecurityContext.runAsUser=2000",
            "operator.podSecurityContext.fsGroupChangePolicy=OnRootMismatch",
            "operator.securityContext.runAsUser=2000",
            "operator.securityContext.seLinuxOptions.level=s0:c1",
        )
        pod, container = pod_spec(manifests)["securityContext"], operator_container(manifests)["securityContext"]
        assert (pod["runAsUser"], pod["fsGroupChangePolicy"], pod["fsGroup"]) == (2000, "OnRootMismatch", 10001)
        assert (container["runAsUser"], container["seLinuxOptions"]) == (2000, {"level": "s0:c1"})
        assert container["readOnlyRootFilesystem"] is True  # the defaults the values left alone stay
        test_pod = the(manifests, "Pod")["spec"]
        assert test_pod["securityContext"] == pod
        assert test_pod["containers"][0]["securityContext"] == container

    @pytest.mark.parametrize(
        "values",
        [
            ["openshift=true"],
            [
                *(f"operator.podSecurityContext.{key}=null" for key in ("runAsUser", "runAsGroup", "fsGroup")),
                *(f"operator.securityContext.{key}=null" for key in ("runAsUser", "runAsGroup")),
            ],
        ],
        ids=["openshift", "null"],
    )
    def test_no_fixed_uid_where_the_platform_assigns_one_and_still_non_root(
        self, helm: Helm, values: list[str]
    ) -> None:
        manifests = helm.template(*values)
        test_pod = the(manifests, "Pod")["spec"]
        contexts = {
            "pod": pod_spec(manifests)["securityContext"],
            "container": operator_container(manifests)["securityContext"],
            "test pod": test_pod["securityContext"],
            "test container": test_pod["containers"][0]["securityContext"],
        }
        for where, context in contexts.items():
            assert not {"runAsUser", "runAsGroup", "fsGroup"} & context.keys(), where
            assert context["runAsNonRoot"] is True, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert contexts["container"]["capabilities"] == {"drop": ["ALL"]}
        assert contexts["container"]["allowPrivilegeEscalation"] is False

    def test_the_metrics_service_selects_the_operator_pod_on_its_metrics_port(self, helm: Helm) -> None:
        manifests = helm.template()
        service = the(manifests, "Service")
        pod_labels = the(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert service["spec"]["ports"] == [
            {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
        ]

    def test_the_metrics_service_can_be_left_out(self, helm: Helm) -> None:
        assert objects_of(helm.template("metrics.service.enabled=false"), "Service") == []


class TestTheOperatorRBAC:
    def test_cluster_scope_grants_the_rules_of_docs_operator_rbac_to_the_operator_account(self, helm: Helm) -> None:
        manifests = helm.template()
        role, binding = (
            the(operator_objects(manifests, "ClusterRole"), "ClusterRole"),
            the(manifests, "ClusterRoleBinding"),
        )
        assert role["rules"] == documented("operator-rbac.yaml", "ClusterRole")["rules"]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": pod_spec(manifests)["serviceAccountName"],
                "namespace": RELEASE_NAMESPACE,
            }
        ]
        assert operator_objects(manifests, "Role") == []
        assert [m["metadata"]["name"] for m in operator_objects(manifests, "ServiceAccount")] == [
            pod_spec(manifests)["serviceAccountName"]
        ]

    def test_namespace_scope_watches_and_grants_the_release_namespace_only(self, helm: Helm) -> None:
        manifests = helm.template("rbac.scope=namespace")
        cluster_wide = documented("operator-rbac.yaml", "ClusterRole")["rules"]
        assert operator_container(manifests)["args"] == ["--namespace", RELEASE_NAMESPACE]
        role = the(operator_objects(manifests, "Role"), "Role", RELEASE_NAMESPACE)
        assert role["rules"] == without(cluster_wide, "customresourcedefinitions", "namespaces", "nodes")
        # Kopf still reads CRDs cluster-wide, and the NotReady-node rule reads Nodes (cluster-scoped);
        # nothing else is cluster-wide, not even namespaces.
        assert the(operator_objects(manifests, "ClusterRole"), "ClusterRole")["rules"] == [
            rule for rule in cluster_wide if rule["resources"] in (["customresourcedefinitions"], ["nodes"])
        ]

    def test_pods_status_patch_is_granted_only_when_the_operator_marks_lost_pods_failed(self, helm: Helm) -> None:
        """operator.lostNodes.failPodsAfterSeconds (0 counts) adds exactly docs/operator-rbac-lost-nodes.yaml's
        rules (patch on pods/status, delete on pods) and the operator's default; unset, neither."""
        documented_rules = documented("operator-rbac.yaml", "ClusterRole")["rules"]
        lost_nodes = documented("operator-rbac-lost-nodes.yaml", "ClusterRole")["rules"]
        assert lost_nodes == [
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
        ]
        for values in ([], ["operator.lostNodes.failPodsAfterSeconds=null"]):
            manifests = helm.template(*values)
            assert the(operator_objects(manifests, "ClusterRole"), "ClusterRole")["rules"] == documented_rules
            assert "KUBE_RENDEZVOUS_FAIL_LOST_PODS_AFTER_SECONDS" not in env_of(operator_container(manifests))
        for seconds in ("0", "120"):
            manifests = helm.template(f"operator.lostNodes.failPodsAfterSeconds={seconds}")
            role = the(operator_objects(manifests, "ClusterRole"), "ClusterRole")
            cluster_only = ["customresourcedefinitions", "namespaces", "nodes"]
            assert role["rules"] == [
                *without(documented_rules, *cluster_only),
                *lost_nodes,
                *(rule for resource in cluster_only for rule in documented_rules if rule["resources"] == [resource]),
            ]
            assert env_of(operator_container(manifests))["KUBE_RENDEZVOUS_FAIL_LOST_PODS_AFTER_SECONDS"] == seconds
        # Namespace scope: in each watched namespace's Role (pods are namespaced), never cluster-wide.
        manifests = helm.template("rbac.scope=namespace", "operator.lostNodes.failPodsAfterSeconds=60")
        role = the(operator_objects(manifests, "Role"), "Role", RELEASE_NAMESPACE)
        assert role["rules"] == [
            *without(documented_rules, "customresourcedefinitions", "namespaces", "nodes"),
            *lost_nodes,
        ]
        cluster_role = the(operator_objects(manifests, "ClusterRole"), "ClusterRole")
        assert all(rule not in cluster_role["rules"] for rule in lost_nodes)
        no_option = helm.template("rbac.scope=namespace")
        assert all(
            rule not in lost_nodes
            for kind in ("Role", "ClusterRole")
            for manifest in operator_objects(no_option, kind)
            for rule in manifest["rules"]
        )
        refused = helm.run(
            "template", "rdzv", CHART, "--set", "operator.lostNodes.failPodsAfterSeconds=-1", check=False
        )
        assert refused.returncode != 0 and "failPodsAfterSeconds" in refused.stderr

    def test_watch_namespaces_render_one_namespace_argument_and_one_role_each(self, helm: Helm) -> None:
        manifests = helm.template("rbac.scope=namespace", "watchNamespaces={team-a,team-b}")
        assert operator_container(manifests)["args"] == ["--namespace", "team-a", "--namespace", "team-b"]
        roles = operator_objects(manifests, "Role")
        bindings = operator_objects(manifests, "RoleBinding")
        # One Role each, plus the leader election's Role for the Lease in the release namespace, which
        # no watched namespace's Role covers here.
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted([RELEASE_NAMESPACE, "team-a", "team-b"])
        assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted([RELEASE_NAMESPACE, "team-a", "team-b"])
        for binding in bindings:
            assert binding["subjects"][0]["namespace"] == RELEASE_NAMESPACE  # the operator's own account
        election = next(r for r in roles if r["metadata"]["namespace"] == RELEASE_NAMESPACE)
        assert election["rules"] == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
        ]

    def test_watch_namespaces_narrow_a_cluster_scoped_operator_too(self, helm: Helm) -> None:
        manifests = helm.template("watchNamespaces={team-a}")
        assert operator_container(manifests)["args"] == ["--namespace", "team-a"]
        assert len(objects_of(manifests, "ClusterRoleBinding")) == 1

    @pytest.mark.parametrize("scope", ["cluster", "namespace"])
    def test_two_releases_never_share_a_cluster_scoped_name_even_with_one_release_name(
        self, helm: Helm, scope: str
    ) -> None:
        def cluster_names(release: str, namespace: str) -> set[str]:
            manifests = helm.template(f"rbac.scope={scope}", release=release, namespace=namespace)
            # The CRDs are the one exception: one release installs them (crds.install=false in the others).
            return {
                m["metadata"]["name"]
                for m in manifests
                if "namespace" not in m["metadata"] and m["kind"] != "CustomResourceDefinition"
            }

        first = cluster_names("rdzv", "team-a")
        assert first
        assert first.isdisjoint(cluster_names("rdzv", "team-b"))
        assert first.isdisjoint(cluster_names("other", "team-a"))


class TestTheTrainingRBAC:
    def test_it_grants_the_rules_of_docs_rbac_to_the_trainer_account(self, helm: Helm) -> None:
        manifests = helm.template()
        role = the(training_objects(manifests, "Role"), "Role", RELEASE_NAMESPACE)
        binding = the(training_objects(manifests, "RoleBinding"), "RoleBinding", RELEASE_NAMESPACE)
        account = the(training_objects(manifests, "ServiceAccount"), "ServiceAccount", RELEASE_NAMESPACE)
        assert role["rules"] == documented("rbac.yaml", "Role")["rules"]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": RELEASE_NAMESPACE}]
        assert account["metadata"]["name"] == "trainer"

    def test_it_renders_in_each_training_namespace(self, helm: Helm) -> None:
        manifests = helm.template("trainingRBAC.namespaces={team-a,team-b}")
        for kind in ("ServiceAccount", "Role", "RoleBinding"):
            assert sorted(m["metadata"]["namespace"] for m in training_objects(manifests, kind)) == ["team-a", "team-b"]

    def test_disabled_it_renders_no_trainer_account_role_or_binding(self, helm: Helm) -> None:
        manifests = helm.template("trainingRBAC.enabled=false")
        for kind in ("ServiceAccount", "Role", "RoleBinding"):
            assert training_objects(manifests, kind) == []
        assert objects_of(manifests, "Deployment")  # the operator stays

    def test_namespaces_are_not_created_by_default(self, helm: Helm) -> None:
        assert objects_of(helm.template("trainingRBAC.namespaces={team-a}"), "Namespace") == []

    def test_create_namespaces_creates_each_but_the_release_namespace_and_keeps_it(self, helm: Helm) -> None:
        manifests = helm.template(
            f"trainingRBAC.namespaces={{team-a,{RELEASE_NAMESPACE}}}", "trainingRBAC.createNamespaces=true"
        )
        namespace = the(manifests, "Namespace")
        assert namespace["metadata"]["name"] == "team-a"
        assert "namespace" not in namespace["metadata"]
        assert namespace["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert namespace["metadata"]["labels"][INSTANCE] == "rdzv"
        assert sorted(m["metadata"]["namespace"] for m in training_objects(manifests, "Role")) == [
            RELEASE_NAMESPACE,
            "team-a",
        ]

    def test_create_namespaces_does_nothing_without_the_training_rbac(self, helm: Helm) -> None:
        manifests = helm.template(
            "trainingRBAC.namespaces={team-a}", "trainingRBAC.createNamespaces=true", "trainingRBAC.enabled=false"
        )
        assert objects_of(manifests, "Namespace") == []

    def test_an_existing_account_is_bound_but_not_created(self, helm: Helm) -> None:
        manifests = helm.template(
            "trainingRBAC.createServiceAccount=false", "trainingRBAC.serviceAccountName=ml-runner"
        )
        assert training_objects(manifests, "ServiceAccount") == []
        assert the(manifests, "RoleBinding")["subjects"][0]["name"] == "ml-runner"


class TestTheImage:
    """The Dockerfile agrees with the chart (``testenv/operator_image.py`` builds it; ``test_real_node`` runs it)."""

    def test_the_image_runs_the_chart_command_as_the_chart_user_and_exposes_the_chart_ports(self, helm: Helm) -> None:
        dockerfile = (REPO / "Dockerfile").read_text()
        instructions = [line.split(None, 1) for line in dockerfile.splitlines() if re.match(r"^[A-Z]+\s", line)]
        last = {keyword: rest.strip() for keyword, rest in instructions}
        container = operator_container(helm.template())
        assert json.loads(last["ENTRYPOINT"]) == container["command"]
        assert last["USER"].split(":")[0] == str(container["securityContext"]["runAsUser"])
        assert sorted(map(int, last["EXPOSE"].split())) == sorted(port["containerPort"] for port in container["ports"])

    def test_both_stages_start_from_the_pinned_base_and_the_second_installs_the_operator_extra(self) -> None:
        dockerfile = (REPO / "Dockerfile").read_text()
        bases = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
        assert bases == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
        default = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile, re.MULTILINE)
        assert default is not None and default.group(1) == "python:3.11.7-slim-bookworm"
        assert "pip wheel --no-deps" in dockerfile
        assert "[operator]" in dockerfile

    def test_the_build_context_is_the_package_sources_only(self) -> None:
        lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
        assert lines[0] == "*"
        assert {"!pyproject.toml", "!backend/", "!operator/"} <= set(lines)


# -- the examples ------------------------------------------------------------------------------


def example(name: str) -> list[Manifest]:
    return [document for document in yaml.safe_load_all((EXAMPLES / name).read_text()) if document]


class TestTheExamples:
    def test_they_name_no_namespace_so_they_apply_into_any(self) -> None:
        for path in EXAMPLES.rglob("*.yaml"):
            for manifest in example(str(path.relative_to(EXAMPLES))):
                assert "namespace" not in manifest["metadata"], f"{path.name}: {manifest['metadata']}"

    def test_the_example_role_grants_exactly_docs_rbac(self) -> None:
        manifests = example("training-job.yaml")
        assert the(manifests, "Role")["rules"] == documented("rbac.yaml", "Role")["rules"]
        assert the(manifests, "RoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": "trainer"}]

    def test_the_job_pods_carry_the_rendezvous_label_and_run_the_launcher_against_it(self) -> None:
        rendezvous = the(example("rendezvous.yaml"), "Rendezvous")
        job = the(example("training-job.yaml"), "Job")
        name = rendezvous["metadata"]["name"]
        pod = job["spec"]["template"]
        container = pod["spec"]["containers"][0]
        assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == (
            "Indexed",
            3,
            3,
        )
        assert pod["metadata"]["labels"]["kube-rendezvous.io/rendezvous"] == name
        assert pod["spec"]["serviceAccountName"] == "trainer"
        assert pod["spec"]["restartPolicy"] == "Never"
        assert container["command"] + container["args"] == [
            "python",
            "-m",
            "kube_rendezvous.run",
            "--nnodes=2:4",
            "--nproc-per-node=1",
            "--rdzv-backend=k8s",
            f"--rdzv-endpoint=$(POD_NAMESPACE)/{name}",
            "--rdzv-id=$(JOB_UID)",
            "--local-addr=$(POD_IP)",
            "--max-restarts=3",
            "train.py",
        ]
        fields = {
            item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"] for item in container["env"] if "valueFrom" in item
        }
        assert fields == {
            "POD_NAMESPACE": "metadata.namespace",
            "POD_IP": "status.podIP",
            "JOB_UID": "metadata.labels['batch.kubernetes.io/controller-uid']",
            "POD_UID": "metadata.uid",  # the stamp the fencing policy checks (docs/security.md)
        }
        # Identical pods: the frameworks' own fast path for worker ranks, no store round trip (#28).
        values = {item["name"]: item["value"] for item in container["env"] if "value" in item}
        assert values == {"TORCH_ELASTIC_WORKER_IDENTICAL": "1"}
        assert (rendezvous["spec"]["minNodes"], rendezvous["spec"]["maxNodes"]) == (2, 4)

    @pytest.mark.parametrize("name", ["indexed-job", "jobset", "pytorchjob", "trainjob"])
    def test_each_torch_workload_runs_stock_torchrun_with_the_k8s_backend_and_a_run_id(self, name: str) -> None:
        text = yaml.safe_dump_all(example(f"torch/{name}.yaml"))
        assert "torchrun" in text
        env_names = set(re.findall(r"name: (PET_RDZV_\w+)", text))
        by_flags = "--rdzv-backend=k8s" in text and "--rdzv-endpoint=" in text and "--rdzv-id=" in text
        by_env = {"PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID"} <= env_names
        assert by_flags or by_env, f"{name} selects neither by flags nor by PET_RDZV_* variables"
        assert "rdzvBackend" not in text  # PyTorchJob's enum has no k8s: flags, not elasticPolicy

    def test_the_torchrun_indexed_job_is_a_valid_job_for_the_api_server(
        self, control_plane: ControlPlane, namespace: str
    ) -> None:
        done = control_plane.kubectl(
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-n",
            namespace,
            "-f",
            str(EXAMPLES / "torch" / "indexed-job.yaml"),
        )
        assert "job.batch/llama-train created (server dry run)" in done.stdout

    def test_kubectl_applies_them_into_a_namespace(
        self, control_plane: ControlPlane, namespace: str, crds: None
    ) -> None:
        control_plane.kubectl("apply", "--validate=strict", "-f", str(EXAMPLES), "-n", namespace)
        applied = kubectl_json(control_plane, "get", "rendezvous,job,serviceaccount,role,rolebinding", "-n", namespace)
        names = {(item["kind"], item["metadata"]["name"]) for item in applied["items"]}
        assert {
            ("Rendezvous", "llama-train"),
            ("Job", "llama-train"),
            ("ServiceAccount", "trainer"),
            ("Role", "kube-rendezvous-agent"),
            ("RoleBinding", "kube-rendezvous-agent"),
        } <= names

    def test_the_example_trainer_can_join_the_example_rendezvous(
        self, control_plane: ControlPlane, namespace: str, crds: None
    ) -> None:
        control_plane.kubectl("apply", "-f", str(EXAMPLES), "-n", namespace)
        kubeconfig = trainer_kubeconfig(control_plane, namespace)
        backend, _ = create_backend(
            rendezvous_parameters(f"{namespace}/llama-train", kubeconfig, min_nodes=2, max_nodes=4, create="false")
        )
        written = backend.set_state(pickle.dumps(_RendezvousState()))
        assert written is not None and written[2] is True


# -- installing --------------------------------------------------------------------------------


def kubectl_json(control_plane: ControlPlane, *args: str) -> Any:
    return json.loads(control_plane.kubectl(*args, "-o", "json").stdout)


def trainer_kubeconfig(control_plane: ControlPlane, namespace: str, account: str = "trainer") -> Path:
    """A pod's credentials for ``account`` (which exists already), once its Role binding is in effect."""
    kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, account)
    wait_until(
        lambda: can_i(control_plane, kubeconfig, "patch", "rendezvouses.kube-rendezvous.io", "--subresource=status"),
        30,
        f"the RoleBinding of {namespace}/{account} to take effect",
    )
    return kubeconfig


def can_i(control_plane: ControlPlane, kubeconfig: Path, *question: str) -> bool:
    answer = control_plane.kubectl("auth", "can-i", *question, kubeconfig=kubeconfig, check=False)
    return answer.stdout.strip() == "yes"


@dataclass
class Release:
    name: str
    namespace: str
    install_output: str
    install_warnings: str
    manifests: list[Manifest]

    @property
    def operator_account(self) -> str:
        account: str = pod_spec(self.manifests)["serviceAccountName"]
        return account


def install(
    helm: Helm, control_plane: ControlPlane, name: str, namespace: str, *values: str, chart: Path = CHART
) -> Release:
    """``helm install``; ``values`` are ``--set`` values.

    The CRDs are cluster-wide and belong to one release, so a release installed here leaves them
    out (crds.install=false; the session's ``crds`` fixture or the test provides them) unless
    ``values`` hold crds.install=true, which overrides.
    """
    return _helm_apply(helm, control_plane, "install", name, namespace, chart, ("crds.install=false", *values))


def upgrade(
    helm: Helm,
    control_plane: ControlPlane,
    name: str,
    namespace: str,
    *values: str,
    chart: Path = CHART,
    flags: tuple[str, ...] = (),
) -> Release:
    """``helm upgrade`` of release ``name`` to ``chart`` with ``--set`` ``values`` (no other value kept)."""
    return _helm_apply(helm, control_plane, "upgrade", name, namespace, chart, values, flags)


def _helm_apply(
    helm: Helm,
    control_plane: ControlPlane,
    verb: str,
    name: str,
    namespace: str,
    chart: Path,
    values: tuple[str, ...],
    flags: tuple[str, ...] = (),
) -> Release:
    sets = [arg for value in values for arg in ("--set", value)]
    kubeconfig = ("--kubeconfig", str(control_plane.admin_kubeconfig))
    done = helm.run(verb, name, chart, "--namespace", namespace, *kubeconfig, *flags, *sets)
    manifest = helm.run("get", "manifest", name, "--namespace", namespace, *kubeconfig).stdout
    return Release(name, namespace, done.stdout, done.stderr, [d for d in yaml.safe_load_all(manifest) if d])


def crd_names_in_use(control_plane: ControlPlane) -> list[str]:
    found = control_plane.kubectl("get", "crd", "-o", "name", check=False).stdout.split()
    return [name for name in CRD_NAMES if f"customresourcedefinition.apiextensions.k8s.io/{name}" in found]


def delete_crds(control_plane: ControlPlane) -> None:
    """Delete the Rendezvous CRDs (and so every object of them) and wait until they are gone.

    Objects that an operator of an earlier test left with its finalizer (no operator runs now)
    would hold the CRDs forever: their finalizers are removed first.
    """
    for crd in crd_names_in_use(control_plane):
        plural = crd.split(".", 1)[0]
        for line in control_plane.kubectl(
            "get",
            plural,
            "-A",
            "-o",
            'jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"\\n"}{end}',
            check=False,
        ).stdout.split():
            object_namespace, object_name = line.split("/", 1)
            control_plane.kubectl(
                "patch",
                plural,
                object_name,
                "-n",
                object_namespace,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )
        control_plane.kubectl("delete", f"crd/{crd}", "--wait=false")
    wait_until(lambda: crd_names_in_use(control_plane) == [], 60, "the Rendezvous CRDs to be deleted")


def crd_names_being_deleted(control_plane: ControlPlane) -> list[str]:
    """Those of the Rendezvous CRDs that are on the server with a deletionTimestamp (going away)."""
    shown = json.loads(control_plane.kubectl("get", "crd", "-o", "json").stdout)
    return [
        item["metadata"]["name"]
        for item in shown.get("items") or []
        if item["metadata"]["name"] in CRD_NAMES and item["metadata"].get("deletionTimestamp")
    ]


def restore_crds(control_plane: ControlPlane) -> None:
    """Put crds/ back exactly as the session's ``crds`` fixture applied it: no Helm labels, no owner.

    A CRD still going away (a release's uninstall deleted it) is waited for first: replaced while it
    terminates, it would be gone a moment later, and every later test of the session without it."""
    wait_until(lambda: crd_names_being_deleted(control_plane) == [], 120, "the Rendezvous CRDs being deleted to go")
    for path in sorted((REPO / "crds").glob("*.yaml")):
        verb = (
            "replace"
            if yaml.safe_load(path.read_text())["metadata"]["name"] in crd_names_in_use(control_plane)
            else "create"
        )
        control_plane.kubectl(verb, "--save-config", "-f", str(path))
    control_plane.wait_established(*(f"crd/{crd}" for crd in CRD_NAMES))


@pytest.fixture
def no_crds(control_plane: ControlPlane, crds: None) -> Iterator[None]:
    """No Rendezvous CRD on the server, so that a test sees the ones its release creates; restored afterwards."""
    delete_crds(control_plane)
    try:
        yield
    finally:
        restore_crds(control_plane)


def uninstall(helm: Helm, control_plane: ControlPlane, release: Release) -> None:
    helm.run(
        "uninstall",
        release.name,
        "--namespace",
        release.namespace,
        "--kubeconfig",
        str(control_plane.admin_kubeconfig),
        "--ignore-not-found",
    )


@pytest.fixture
def release(helm: Helm, control_plane: ControlPlane, namespace: str, crds: None) -> Iterator[Release]:
    """The chart installed into the test's namespace, namespace-scoped, CRDs from ``crds``; uninstalled afterwards."""
    installed = install(helm, control_plane, f"rdzv-{uuid.uuid4().hex[:8]}", namespace, "rbac.scope=namespace")
    yield installed
    uninstall(helm, control_plane, installed)


@pytest.fixture
def other_namespace(admin_api: client.ApiClient) -> Iterator[str]:
    """A second fresh namespace, deleted afterwards."""
    name = f"elsewhere-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"kube-rendezvous.io/test": "true"}))
    )
    yield name
    core.delete_namespace(name)


def release_objects(control_plane: ControlPlane, release: str) -> list[str]:
    """Every operator-side object labelled with the release, in any namespace or cluster-wide."""
    selector = f"{INSTANCE}={release}"
    namespaced = control_plane.kubectl(
        "get", "deployments,services,serviceaccounts,roles,rolebindings", "-A", "-l", selector, "-o", "name"
    ).stdout.split()
    cluster = control_plane.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name"
    ).stdout.split()
    return namespaced + cluster


class TestInstallingTheChart:
    def test_it_creates_the_crds_the_operator_deployment_accounts_rbac_and_service(
        self, helm: Helm, control_plane: ControlPlane, namespace: str, no_crds: None
    ) -> None:
        release = install(
            helm, control_plane, f"rdzv-{uuid.uuid4().hex[:8]}", namespace, "rbac.scope=namespace", "crds.install=true"
        )
        try:
            self._check_the_objects_of(control_plane, release)
        finally:
            uninstall(helm, control_plane, release)

    @staticmethod
    def _check_the_objects_of(control_plane: ControlPlane, release: Release) -> None:
        for crd in CRD_NAMES:  # no CRD existed before the install (no_crds): this release created them
            control_plane.wait_established(f"crd/{crd}")
            metadata = kubectl_json(control_plane, "get", f"crd/{crd}")["metadata"]
            assert metadata["annotations"]["meta.helm.sh/release-name"] == release.name
            assert metadata["annotations"]["meta.helm.sh/release-namespace"] == release.namespace
            assert metadata["annotations"]["helm.sh/resource-policy"] == "keep"
            assert metadata["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        selector = f"{INSTANCE}={release.name}"
        found = kubectl_json(
            control_plane,
            "get",
            "deployments,serviceaccounts,roles,rolebindings,services",
            "-n",
            release.namespace,
            "-l",
            selector,
        )
        by_kind: dict[str, set[str]] = {}
        for item in found["items"]:
            by_kind.setdefault(item["kind"], set()).add(item["metadata"]["name"])
        operator = f"{release.name}-kube-rendezvous-operator"
        agent = f"{release.name}-kube-rendezvous-agent"
        assert by_kind == {
            "Deployment": {operator},
            "ServiceAccount": {operator, "trainer"},
            "Role": {operator, agent},
            "RoleBinding": {operator, agent},
            "Service": {f"{release.name}-kube-rendezvous-metrics"},
        }
        deployment = next(item for item in found["items"] if item["kind"] == "Deployment")
        assert deployment["spec"]["replicas"] == 1
        cluster = control_plane.kubectl("get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name")
        # The CRD reader and its binding, the roles aggregated into view and into edit/admin.
        assert len(cluster.stdout.split()) == 4

    def test_its_notes_tell_how_to_start_a_rendezvous_and_follow_it(self, release: Release) -> None:
        assert f"kubectl -n {release.namespace} get rdzv" in release.install_output
        assert f"--rdzv-backend=k8s --rdzv-endpoint={release.namespace}/my-job" in release.install_output
        assert "serviceAccountName: trainer" in release.install_output

    def test_the_trainer_account_can_run_the_backend_and_its_store(
        self, control_plane: ControlPlane, release: Release
    ) -> None:
        kubeconfig = trainer_kubeconfig(control_plane, release.namespace)
        backend, store = create_backend(rendezvous_parameters(f"{release.namespace}/rdzv", kubeconfig))
        written = backend.set_state(pickle.dumps(_RendezvousState()))
        assert written is not None
        assert written[2] is True and pickle.loads(written[0]).round == 0
        store.set("key", b"value")
        assert store.get("key") == b"value"

    def test_the_trainer_account_is_refused_a_rendezvous_in_another_namespace(
        self, control_plane: ControlPlane, release: Release, other_namespace: str
    ) -> None:
        kubeconfig = trainer_kubeconfig(control_plane, release.namespace)
        with pytest.raises(RendezvousConnectionError, match="403"):
            create_backend(rendezvous_parameters(f"{other_namespace}/rdzv", kubeconfig))

    def test_the_namespace_scoped_operator_may_act_in_its_namespace_only(
        self, control_plane: ControlPlane, release: Release, other_namespace: str
    ) -> None:
        kubeconfig = control_plane.serviceaccount_kubeconfig(release.namespace, release.operator_account, create=False)
        wait_until(
            lambda: can_i(control_plane, kubeconfig, "watch", "rendezvouses.kube-rendezvous.io"),
            30,
            "the operator's RoleBinding to take effect",
        )
        assert can_i(control_plane, kubeconfig, "list", "customresourcedefinitions.apiextensions.k8s.io")
        assert not can_i(control_plane, kubeconfig, "watch", "rendezvouses.kube-rendezvous.io", "-A")
        assert not can_i(control_plane, kubeconfig, "list", "pods", "-n", other_namespace)
        assert not can_i(control_plane, kubeconfig, "list", "namespaces")

    def test_the_operator_runs_under_the_chart_account_and_rbac(
        self, control_plane: ControlPlane, release: Release, admin_api: client.ApiClient, tmp_path: Path
    ) -> None:
        kubeconfig = control_plane.serviceaccount_kubeconfig(release.namespace, release.operator_account, create=False)
        wait_until(
            lambda: can_i(
                control_plane, kubeconfig, "patch", "rendezvouses.kube-rendezvous.io", "--subresource=status"
            ),
            30,
            "the operator's RoleBinding to take effect",
        )
        objects = client.CustomObjectsApi(admin_api)
        # As the chart's Deployment runs it: leader election on, its pod name and namespace from the downward API.
        env = {item["name"]: item.get("value") for item in operator_container(release.manifests)["env"]}
        assert env["LEADER_ELECTION"] == "true"
        election = {"LEADER_ELECTION": "true", "POD_NAME": "operator-0", "POD_NAMESPACE": release.namespace}
        with OperatorProcess(kubeconfig, release.namespace, tmp_path / "operator.log", env=election) as operator:
            objects.create_namespaced_custom_object(
                GROUP,
                VERSION,
                release.namespace,
                PLURAL,
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Rendezvous",
                    "metadata": {"name": "job"},
                    "spec": {"minNodes": 1, "maxNodes": 2},
                },
            )
            # With --namespace the operator does not scan (list) namespaces, which namespace scope
            # does not grant, so it serves the named namespace at once.
            wait_until(
                lambda: ready(objects, release.namespace, "job") == "False",  # judged: no agent, it cannot train yet
                60,
                f"the operator to judge the Rendezvous's Ready (operator log: {operator.log})",
            )
            assert "operator-0 is the leader" in operator.log.read_text()  # the chart's Role allows the election
            # Deleting it while the operator runs lets the operator release its finalizer.
            objects.delete_namespaced_custom_object(GROUP, VERSION, release.namespace, PLURAL, "job")
            wait_until(lambda: gone(objects, release.namespace, "job"), 60, "the operator to release the Rendezvous")

    def test_the_operator_pod_meets_the_restricted_pod_security_standard(
        self, helm: Helm, control_plane: ControlPlane, namespace: str
    ) -> None:
        levels = ("enforce", "warn")
        control_plane.kubectl(
            "label", "namespace", namespace, *(f"pod-security.kubernetes.io/{level}=restricted" for level in levels)
        )
        installed = install(helm, control_plane, f"rdzv-{uuid.uuid4().hex[:8]}", namespace, "rbac.scope=namespace")
        try:
            # The API server warns about a Deployment whose pods the namespace would refuse.
            assert "PodSecurity" not in installed.install_warnings
        finally:
            uninstall(helm, control_plane, installed)

    def test_two_releases_of_one_name_install_side_by_side_in_two_namespaces(
        self, helm: Helm, control_plane: ControlPlane, namespace: str, other_namespace: str
    ) -> None:
        name = f"rdzv-{uuid.uuid4().hex[:8]}"
        first = install(helm, control_plane, name, namespace)
        try:
            second = install(helm, control_plane, name, other_namespace)
            try:
                cluster_wide = control_plane.kubectl(
                    "get", "clusterroles,clusterrolebindings", "-l", f"{INSTANCE}={name}", "-o", "name"
                ).stdout.split()
                # Per release: the operator's ClusterRole and binding, the two aggregated ClusterRoles.
                assert len(cluster_wide) == 8
            finally:
                uninstall(helm, control_plane, second)
        finally:
            uninstall(helm, control_plane, first)

    def test_a_missing_training_namespace_fails_the_install_and_create_namespaces_creates_and_keeps_it(
        self, helm: Helm, control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str
    ) -> None:
        team = f"team-{uuid.uuid4().hex[:6]}"
        name = f"rdzv-{uuid.uuid4().hex[:8]}"
        values = ("rbac.scope=namespace", f"trainingRBAC.namespaces={{{namespace},{team}}}")
        sets = [arg for value in ("crds.install=false", *values) for arg in ("--set", value)]
        kubeconfig = ("--kubeconfig", str(control_plane.admin_kubeconfig))
        refused = helm.run("install", name, CHART, "--namespace", namespace, *kubeconfig, *sets, check=False)
        assert refused.returncode != 0
        assert f'namespaces "{team}" not found' in refused.stderr  # the error docs/operations.md quotes
        helm.run("uninstall", name, "--namespace", namespace, *kubeconfig, "--ignore-not-found")
        core = client.CoreV1Api(admin_api)
        installed = install(helm, control_plane, name, namespace, *values, "trainingRBAC.createNamespaces=true")
        try:
            assert control_plane.kubectl("get", "role", "-n", team, "-l", f"{INSTANCE}={name}", "-o", "name").stdout
            uninstall(helm, control_plane, installed)
            assert core.read_namespace(team).status.phase == "Active"  # helm.sh/resource-policy: keep
        finally:
            uninstall(helm, control_plane, installed)
            core.delete_namespace(team)

    def test_uninstall_leaves_no_operator_object_behind(
        self, helm: Helm, control_plane: ControlPlane, release: Release
    ) -> None:
        assert release_objects(control_plane, release.name)
        uninstall(helm, control_plane, release)
        wait_until(lambda: release_objects(control_plane, release.name) == [], 30, "the release's objects to go")
        # This release left the CRDs to the session (crds.install=false); they stay.
        # tests/test_chart_operations.py checks that a release's own CRDs stay too (keep policy).
        for crd in CRD_NAMES:
            control_plane.kubectl("get", f"crd/{crd}")


def ready(objects: client.CustomObjectsApi, namespace: str, name: str) -> str | None:
    found = cast(dict[str, Any], objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    conditions = (found.get("status") or {}).get("conditions") or []
    return next((str(c["status"]) for c in conditions if c["type"] == "Ready"), None)


def gone(objects: client.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except client.ApiException as exc:
        return bool(exc.status == 404)
    return False
