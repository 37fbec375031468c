"""Three real nodes (``tests.testenv.cluster``): Services and DNS, a node that dies, a node drained, and c10d beside us.

The pods of the README's example Job are spread one per node (``tests.e2e.multi_node.spread``). A node failure is
its kubelet, containerd and containers killed after its network went silent (``Node.fail``): the Node turns
NotReady only when the node-lifecycle controller notices, and the pods on the other nodes learn of it from the
rendezvous alone. Each test that fails a node brings it back (``Node.recover``) for the next one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests.e2e.multi_node import (
    LAST_CALL_SECONDS,
    drain_and_recover,
    local_operator,
    node_failure,
    node_named,
    rank0_node_killed,
    spread,
    start_spread_job,
)
from tests.e2e.real_pods import REPO, example_objects, rendezvous_status
from tests.helpers import holds_for
from tests.test_chart import Helm, install
from tests.testenv import ensure_binaries, wait_until
from tests.testenv.cluster import Cluster
from tests.testenv.images import TRAINING_IMAGE, import_images, training_mounts, venv_python
from tests.testenv.node import TOPOLOGY_KEYS
from tests.testenv.operator_image import OPERATOR_IMAGE, build_operator_image


@pytest.fixture
def api(three_nodes: Cluster) -> client.ApiClient:
    return config.new_client_from_config(str(three_nodes.plane.admin_kubeconfig))


@pytest.fixture
def namespace3(three_nodes: Cluster, api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace on the three-node cluster, with the CRDs applied; deleted afterwards."""
    plane = three_nodes.plane
    plane.kubectl("apply", "-f", str(REPO / "crds"))
    plane.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd/rendezvouses.kube-rendezvous.io")
    name = f"multi-{request.node.name.lower().replace('_', '-').replace('[', '-').strip(']')[-24:].strip('-')}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, grace_period_seconds=0)


@pytest.fixture
def recovered(three_nodes: Cluster) -> Iterator[Cluster]:
    """The cluster; every node that a test failed is brought back afterwards."""
    yield three_nodes
    for node in three_nodes.nodes:
        if not node.running:
            node.recover()


def _pod(name: str, node: str, command: list[str], **spec: Any) -> dict[str, Any]:
    mounts = training_mounts()
    container = {
        "name": "main",
        "image": TRAINING_IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
        "volumeMounts": [
            {"name": f"host-{i}", "mountPath": inside, "readOnly": True} for i, (_, inside) in enumerate(mounts)
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "containers": [container],
            "volumes": [{"name": f"host-{i}", "hostPath": {"path": host}} for i, (host, _) in enumerate(mounts)],
            **spec,
        },
    }


PROBE = """
import json, socket, ssl, sys, urllib.request
names = sys.argv[1:]
found = {}
for name in names:
    try:
        found[name] = socket.gethostbyname(name)
    except OSError as exc:
        found[name] = type(exc).__name__
found["web-ip"] = urllib.request.urlopen("http://web-ip/", timeout=5).status
context = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
token = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()
request = urllib.request.Request("https://kubernetes.default.svc/version", headers={"Authorization": "Bearer " + token})
found["api"] = json.load(urllib.request.urlopen(request, context=context, timeout=5))["gitVersion"]
print(json.dumps(found))
"""


def test_three_nodes_carry_topology_labels_and_route_services_and_dns_between_them(
    three_nodes: Cluster, api: client.ApiClient, namespace3: str
) -> None:
    """Each node is its own kubelet with its own labels; a pod on node-3 resolves a ClusterIP Service, a headless
    Service's pod by hostname and the ``kubernetes`` Service, reaches a pod on node-1 through kube-proxy, and a
    name outside the cluster fails at once (NXDOMAIN, no timeout)."""
    core = client.CoreV1Api(api)
    nodes = {node.metadata.name: node.metadata.labels for node in core.list_node().items}
    assert sorted(nodes) == ["node-1", "node-2", "node-3"]
    zones = {name: labels["topology.kubernetes.io/zone"] for name, labels in nodes.items()}
    assert zones == {"node-1": "zone-a", "node-2": "zone-a", "node-3": "zone-b"}
    assert all(set(TOPOLOGY_KEYS) <= set(labels) for labels in nodes.values())

    web = _pod("web", "node-1", [venv_python(), "-m", "http.server", "8080"], hostname="web-0", subdomain="web")
    probe = _pod("probe", "node-3", [venv_python(), "-c", "import time; time.sleep(600)"])
    services = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-ip"},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    ]  # fmt: skip
    plane = three_nodes.plane
    plane.kubectl("-n", namespace3, "apply", "-f", "-", input=yaml.safe_dump_all([web, probe, *services]))

    def running() -> dict[str, str] | None:
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace3).items}
        ok = len(pods) == 2 and all(p.status.phase == "Running" and p.status.pod_ip for p in pods.values())
        return {name: p.status.pod_ip for name, p in pods.items()} if ok else None

    addresses = wait_until(running, 120, "the web and probe pods Running")
    names = [f"web-ip.{namespace3}.svc.cluster.local", f"web-0.web.{namespace3}.svc", "web", "no-such-name.example"]

    def probed() -> dict[str, Any] | None:
        done = plane.kubectl("-n", namespace3, "exec", "probe", "--", venv_python(), "-c", PROBE, *names, check=False)
        return yaml.safe_load(done.stdout) if done.returncode == 0 else None

    found = wait_until(probed, 60, "the probe pod to resolve and reach the Services")
    web_ip = core.read_namespaced_service("web-ip", namespace3).spec.cluster_ip
    assert found == {
        names[0]: web_ip,
        names[1]: addresses["web"],
        "web": addresses["web"],
        "no-such-name.example": "gaierror",
        "web-ip": 200,
        "api": "v1.37.2",
    }


@pytest.mark.parametrize("operator", [True, False], ids=["operator", "no-operator"])
def test_a_node_failure_leaves_the_pods_on_the_other_nodes_training_and_the_replacement_joins(
    recovered: Cluster, namespace3: str, tmp_path: Path, operator: bool
) -> None:
    """The node of rank 0's pod dies (network silent, then kubelet, containerd and containers killed).

    With the operator (heartbeats set to expire after 90 s, so that only its rule can act), the Node turns
    NotReady and the operator evicts the nodes of the pods bound to it; without it, the heartbeats expire (15 s).
    Either way the pods on the other two nodes train on in a new round, and the Job's replacement pod, created
    once the dead pod's toleration ran out, lands on a live node and joins them."""
    process = local_operator(recovered, namespace3, tmp_path / "operator.log") if operator else None
    recovery = node_failure(recovered, namespace3, process)
    print(f"node failure ({'operator' if operator else 'no operator'}): {recovery}")
    assert recovery.survivors_training is not None, f"the pods on the other nodes did not train again: {recovery}"
    assert recovery.replacement_training is not None
    assert recovery.victim_node not in recovery.details["replacement_nodes"]
    after = recovery.details["after"]
    rank0 = recovery.details["rank0"]
    assert after is not None and after[0] > recovery.details["round_before"] and rank0 not in after[1]
    assert len(after[1]) == 3
    if operator:
        assert rank0 in {node.rsplit("_", 2)[0] for node in recovery.details["evicted"]}, recovery.details["evicted"]
        assert recovery.survivors_training < 90, "the operator, not the 90 s heartbeat expiry, removed the node"


def test_a_silent_kubelet_does_not_evict_the_agent_that_still_heartbeats_on_its_node(
    recovered: Cluster, api: client.ApiClient, namespace3: str, tmp_path: Path
) -> None:
    """Only one node's kubelet dies: its Node turns NotReady, but its pod's agent and workers run on and
    heartbeat. The operator judges the NotReady node, spares the live agent, and the round is never broken;
    the kubelet comes back and the Node is Ready again. (The pods keep the default 300 s toleration here, so
    no pod deletion interferes.)"""
    objects = client.CustomObjectsApi(api)
    with local_operator(recovered, namespace3, tmp_path / "operator.log") as operator:
        first, _ = start_spread_job(
            recovered, namespace3, spread(example_objects(last_call_seconds=LAST_CALL_SECONDS), toleration=None)
        )
        status = rendezvous_status(objects, namespace3)
        victim = sorted(first.pods)[1]
        address, where = first.pods[victim]
        node = node_named(recovered, where)
        node.stop_kubelet()
        wait_until(lambda: not node.ready(), 90, f"{where} NotReady")
        spared = f"Kubernetes node {where} is NotReady since"

        def judged() -> bool:
            lines = operator.log.read_text().splitlines()
            return any(spared in line and "heartbeat after that" in line and address in line for line in lines)

        wait_until(judged, 60, "the operator to judge the NotReady node and spare its live agent")
        holds_for(
            lambda: (
                (now := rendezvous_status(objects, namespace3)).get("round") == status["round"]
                and not now.get("evictedNodes")
            ),
            12,
            "the round unbroken and no eviction of a live agent",
        )
        node.recover()
    assert rendezvous_status(objects, namespace3).get("round") == status["round"]


def test_kubectl_drain_of_the_operators_node_leaves_the_job_training_on_the_other_nodes(
    three_nodes: Cluster, api: client.ApiClient, namespace3: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The operator runs as the chart's Deployment with its PodDisruptionBudget; ``kubectl drain`` of its node (which
    also runs one training pod) evicts both through the eviction API. The training pod's agent gets SIGTERM and
    leaves; the others train on in a new round, the replacement joins on another node, and the operator is back
    on another node."""
    plane = three_nodes.plane
    image = build_operator_image()
    for node in three_nodes.nodes:
        import_images(node.containerd_socket, [image])
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    helm = Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))
    install(
        helm, plane, "rdzv", namespace3,
        f"image.repository={repository}", f"image.tag={tag}", "image.pullPolicy=Never",
        "rbac.scope=namespace", "podDisruptionBudget.enabled=true",
    )  # fmt: skip
    core = client.CoreV1Api(api)

    def operator_node() -> str | None:
        pods = core.list_namespaced_pod(namespace3, label_selector="app.kubernetes.io/component=operator").items
        ready = [
            p
            for p in pods
            if p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]
        return ready[0].spec.node_name if len(ready) == 1 else None

    where = wait_until(operator_node, 180, "the operator pod Ready")
    budgets = client.PolicyV1Api(api).list_namespaced_pod_disruption_budget(namespace3).items
    assert [b.spec.max_unavailable for b in budgets] == [1], "the chart's PodDisruptionBudget guards the operator"
    first, trained = start_spread_job(
        three_nodes, namespace3, spread(example_objects(last_call_seconds=LAST_CALL_SECONDS))
    )
    recovery = drain_and_recover(three_nodes, namespace3, first, trained, where)
    print(f"kubectl drain {where}: {recovery}")
    assert recovery.survivors_training is not None, f"the pods on the other nodes did not train again: {recovery}"
    assert recovery.replacement_training is not None
    assert where not in recovery.details["replacement_nodes"]
    assert recovery.details["drain"]["exit"] == 0, recovery.details["drain"]
    moved = wait_until(lambda: (node := operator_node()) and node != where and node, 180, "the operator elsewhere")
    assert moved != where


def test_c10d_beside_k8s_when_the_node_of_rank_0_dies(recovered: Cluster, namespace3: str) -> None:
    """Stock torchrun on the same three pods, the same kill of the node of the Indexed Job's pod 0: with torch's
    c10d (rank 0's store found by a headless Service's DNS name) the survivors do not train again within 60 s,
    because the store died with that node; with ``--rdzv-backend=k8s`` they do, and the replacement joins."""
    results = {"k8s": rank0_node_killed(recovered, namespace3, "k8s")}
    results["c10d"] = rank0_node_killed(recovered, namespace3, "c10d", window=60)
    print(f"rank-0 node killed: {results}")
    assert results["k8s"].survivors_training is not None and results["k8s"].replacement_training is not None
    assert results["c10d"].survivors_training is None, "c10d's survivors trained again without rank 0's store"
