"""The chart's opt-in API Priority and Fairness objects (``apiPriority``): a PriorityLevelConfiguration and a
FlowSchema (flowcontrol.apiserver.k8s.io/v1) that take the training ServiceAccounts' requests out of the built-in
workload-low level.

Rendering tests run ``helm template``. The installing test applies the rendered objects to the test control
plane and asserts that the API server accepts them and classifies a request made with a training pod's
credentials by them: APF names the FlowSchema and the priority level that handled a request in the response
headers ``X-Kubernetes-PF-FlowSchema-UID`` and ``X-Kubernetes-PF-PriorityLevel-UID``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_rendezvous import load_api_client
from kubernetes import client

from tests.test_chart import CHART, RELEASE_NAMESPACE, Helm, Manifest, objects_of, the
from tests.testenv import ControlPlane, ensure_binaries, wait_until

FLOW_SCHEMA, PRIORITY_LEVEL = "FlowSchema", "PriorityLevelConfiguration"
ENABLED = "apiPriority.enabled=true"


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))


def subjects(flow_schema: Manifest) -> list[tuple[str, str]]:
    (rule,) = flow_schema["spec"]["rules"]
    return [(s["serviceAccount"]["namespace"], s["serviceAccount"]["name"]) for s in rule["subjects"]]


class TestTheFlowSchemaRenders:
    def test_it_is_off_by_default(self, helm: Helm) -> None:
        manifests = helm.template()
        assert not objects_of(manifests, FLOW_SCHEMA) and not objects_of(manifests, PRIORITY_LEVEL)

    def test_enabled_it_renders_a_limited_queuing_priority_level_and_a_flow_schema_that_leads_to_it(
        self, helm: Helm
    ) -> None:
        manifests = helm.template(ENABLED)
        level, schema = the(manifests, PRIORITY_LEVEL), the(manifests, FLOW_SCHEMA)
        values = yaml.safe_load((CHART / "values.yaml").read_text())["apiPriority"]
        for manifest in (level, schema):
            assert manifest["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
            assert "namespace" not in manifest["metadata"]  # cluster-scoped
            assert manifest["metadata"]["labels"]["app.kubernetes.io/component"] == "api-priority"
        assert level["spec"] == {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": values["nominalConcurrencyShares"],
                "lendablePercent": values["lendablePercent"],
                "limitResponse": {"type": "Queue", "queuing": values["queuing"]},
            },
        }
        assert schema["spec"]["priorityLevelConfiguration"] == {"name": level["metadata"]["name"]}
        assert schema["spec"]["matchingPrecedence"] == values["matchingPrecedence"]
        assert 900 < values["matchingPrecedence"] < 9000  # after the system schemas, before service-accounts
        assert schema["spec"]["distinguisherMethod"] == {"type": "ByUser"}
        (rule,) = schema["spec"]["rules"]
        assert rule["resourceRules"] == [
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": True}
        ]

    def test_it_matches_the_charts_training_account_in_each_training_namespace(self, helm: Helm) -> None:
        assert subjects(the(helm.template(ENABLED), FLOW_SCHEMA)) == [(RELEASE_NAMESPACE, "trainer")]
        manifests = helm.template(
            ENABLED, "trainingRBAC.namespaces={team-a,team-b}", "trainingRBAC.serviceAccountName=worker"
        )
        assert subjects(the(manifests, FLOW_SCHEMA)) == [("team-a", "worker"), ("team-b", "worker")]
        bound = {
            (binding["metadata"]["namespace"], subject["name"])
            for binding in objects_of(manifests, "RoleBinding")
            if binding["metadata"]["labels"]["app.kubernetes.io/component"] == "training-rbac"
            for subject in binding["subjects"]
        }
        assert set(subjects(the(manifests, FLOW_SCHEMA))) == bound  # exactly the accounts the chart binds

    def test_service_accounts_of_its_own_replace_the_training_accounts(self, helm: Helm, tmp_path: Path) -> None:
        values = tmp_path / "values.yaml"
        accounts = [{"namespace": "team-c", "name": "ml"}, {"namespace": "team-d", "name": "jobs"}]
        values.write_text(yaml.safe_dump({"apiPriority": {"enabled": True, "serviceAccounts": accounts}}))
        rendered = helm.run("template", "rdzv", CHART, "--namespace", RELEASE_NAMESPACE, "-f", values).stdout
        manifests = [document for document in yaml.safe_load_all(rendered) if document]
        assert subjects(the(manifests, FLOW_SCHEMA)) == [("team-c", "ml"), ("team-d", "jobs")]

    def test_the_distinguisher_borrowing_limit_and_queuing_come_from_values(self, helm: Helm) -> None:
        manifests = helm.template(
            ENABLED,
            "apiPriority.distinguisher=ByNamespace",
            "apiPriority.borrowingLimitPercent=0",
            "apiPriority.queuing.queues=16",
            "apiPriority.nominalConcurrencyShares=100",
        )
        assert the(manifests, FLOW_SCHEMA)["spec"]["distinguisherMethod"] == {"type": "ByNamespace"}
        limited = the(manifests, PRIORITY_LEVEL)["spec"]["limited"]
        assert limited["borrowingLimitPercent"] == 0  # a 0 is kept, only null leaves it out
        assert limited["nominalConcurrencyShares"] == 100
        assert limited["limitResponse"]["queuing"]["queues"] == 16

    def test_two_releases_never_share_a_name(self, helm: Helm) -> None:
        def names(release: str, namespace: str) -> set[str]:
            manifests = helm.template(ENABLED, release=release, namespace=namespace)
            return {m["metadata"]["name"] for m in manifests if m["kind"] in (FLOW_SCHEMA, PRIORITY_LEVEL)}

        first = names("rdzv", "team-a")
        assert len(first) == 1  # the level and the schema share the one name
        assert first.isdisjoint(names("rdzv", "team-b")) and first.isdisjoint(names("other", "team-a"))

    @pytest.mark.parametrize(
        ("value", "complaint"),
        [
            ("apiPriority.distinguisher=ByPod", "/apiPriority/distinguisher"),
            ("apiPriority.matchingPrecedence=0", "/apiPriority/matchingPrecedence"),
            ("apiPriority.lendablePercent=101", "/apiPriority/lendablePercent"),
            ("apiPriority.queuing.handsize=4", "additional properties 'handsize' not allowed"),
            ("apiPriority.serviceAccounts[0].name=trainer", "missing property 'namespace'"),
        ],
    )
    def test_a_bad_value_fails_the_render(self, helm: Helm, value: str, complaint: str) -> None:
        rendered = helm.run("template", "rdzv", CHART, "--set", value, check=False)
        assert rendered.returncode != 0
        assert "values don't meet the specifications of the schema" in rendered.stderr
        assert complaint in rendered.stderr


# -- on the API server ---------------------------------------------------------------------------------

#: The response headers in which APF names the FlowSchema and the priority level that handled a request.
SCHEMA_HEADER, LEVEL_HEADER = "X-Kubernetes-PF-FlowSchema-UID", "X-Kubernetes-PF-PriorityLevel-UID"


def classification(kubeconfig: Path, namespace: str) -> tuple[str | None, str | None]:
    """The (FlowSchema UID, priority level UID) APF names for one request (a list of Rendezvous objects) made with
    ``kubeconfig``."""
    api_client, _ = load_api_client(str(kubeconfig), None)
    try:
        _, status, headers = client.CustomObjectsApi(api_client).list_namespaced_custom_object_with_http_info(
            "kube-rendezvous.io", "v1alpha1", namespace, "rendezvouses"
        )
    finally:
        api_client.close()
    assert status == 200
    return headers.get(SCHEMA_HEADER), headers.get(LEVEL_HEADER)  # case-insensitive: Go sends X-Kubernetes-Pf-...


def test_the_api_server_accepts_the_objects_and_classifies_the_training_accounts_requests_by_them(
    helm: Helm, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path
) -> None:
    release = f"apf-{uuid.uuid4().hex[:6]}"
    rendered = helm.template(ENABLED, f"trainingRBAC.namespaces={{{namespace}}}", release=release, namespace=namespace)
    objects = {m["kind"]: m for m in rendered if m["kind"] in (FLOW_SCHEMA, PRIORITY_LEVEL)}
    assert subjects(objects[FLOW_SCHEMA]) == [(namespace, "trainer")]  # the account agent_kubeconfig holds
    names = {
        kind: f"{kind.lower()}.flowcontrol.apiserver.k8s.io/{m['metadata']['name']}" for kind, m in objects.items()
    }
    before = classification(agent_kubeconfig, namespace)
    assert before[0] is not None, "the API server names no FlowSchema: is APF off?"

    def live(kind: str) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(control_plane.kubectl("get", names[kind], "-o", "json").stdout)
        return got

    control_plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in objects.values()))
    try:
        schema_uid, level_uid = live(FLOW_SCHEMA)["metadata"]["uid"], live(PRIORITY_LEVEL)["metadata"]["uid"]
        assert before[0] != schema_uid

        def dangling() -> str | None:
            conditions = live(FLOW_SCHEMA).get("status", {}).get("conditions", [])
            return next((c["status"] for c in conditions if c["type"] == "Dangling"), None)

        wait_until(lambda: dangling() == "False", 30, "the API server to find the FlowSchema's priority level")
        wait_until(
            lambda: classification(agent_kubeconfig, namespace) == (schema_uid, level_uid),
            30,
            "a request of the training ServiceAccount to be classified by the chart's FlowSchema",
        )
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", *names.values())
