"""Three real nodes (``tests.testenv.cluster``): Services and DNS, a node that dies, a node drained, and c10d beside us.

The pods of the README's example Job are spread one per node (``tests.e2e.multi_node.spread``). A node failure is
its kubelet, containerd and containers killed after its network went silent (``Node.fail``): the Node turns
NotReady only when the node-lifecycle controller notices, and the pods on the other nodes learn of it from the
rendezvous alone. Each test that fails a node brings it back (``Node.recover``) for the next one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests.e2e.fencing import own_release_fencing
from tests.e2e.multi_node import (
    LAST_CALL_SECONDS,
    drain_and_recover,
    local_operator,
    lost_node,
    members,
    node_failure,
    node_named,
    rank0_node_killed,
    spread,
    start_spread_job,
)
from tests.e2e.placement import (
    events,
    group_ranks,
    member_ranks,
    pinned_training_pod,
    rack_order,
    racks,
    ranked_by_rack,
    rdzv_status_text,
    spare_recovery,
)
from tests.e2e.real_pods import (
    RENDEZVOUS,
    example_objects,
    host_pod,
    namespace_with_crds,
    pod_log,
    rendezvous_status,
)
from tests.helpers import holds_for
from tests.test_chart import Helm, install
from tests.testenv import ensure_binaries, wait_until
from tests.testenv.cluster import Cluster
from tests.testenv.images import import_images, venv_python
from tests.testenv.node import TOPOLOGY_KEYS
from tests.testenv.operator_image import OPERATOR_IMAGE, build_operator_image

#: The test's spec.lostNodes.failPodsAfterSeconds: the lost pod is marked Failed 10 s after its Node is NotReady.
FAIL_LOST_PODS_AFTER = 10


@pytest.fixture
def api(three_nodes: Cluster) -> client.ApiClient:
    return config.new_client_from_config(str(three_nodes.plane.admin_kubeconfig))


@pytest.fixture
def namespace3(three_nodes: Cluster, api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace on the three-node cluster, with the CRDs applied; deleted afterwards."""
    name = f"multi-{request.node.name.lower().replace('_', '-').replace('[', '-').strip(']')[-24:].strip('-')}"
    with namespace_with_crds(three_nodes.plane, api, name):
        yield name


@pytest.fixture
def recovered(three_nodes: Cluster) -> Iterator[Cluster]:
    """The cluster; every node that a test failed is brought back afterwards."""
    yield three_nodes
    for node in three_nodes.nodes:
        if not node.running:
            node.recover()


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

    web = host_pod("web", "node-1", [venv_python(), "-m", "http.server", "8080"], hostname="web-0", subdomain="web")
    probe = host_pod("probe", "node-3", [venv_python(), "-c", "import time; time.sleep(600)"])
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


def test_c10d_survivors_never_train_again_when_the_node_of_rank_0_dies(recovered: Cluster, namespace3: str) -> None:
    """Stock torchrun with torch's c10d (rank 0's store found by a headless Service's DNS name), spread the same way,
    and the same kill of the node of rank 0 (the Indexed Job's pod 0, c10d's store host): the survivors do not train
    again within 60 s, because the store died with that node. With ``--rdzv-backend=k8s`` they do:
    ``test_a_node_failure_...[torchrun-no-operator]``. First of the node failures:
    after a drain on the same cluster, c10d's own first rounds raced here (an agent re-rendezvoused and timed out
    on the new round's MASTER_ADDR key), and the baseline never trained."""
    c10d = rank0_node_killed(recovered, namespace3, "c10d", window=60)
    print(f"rank-0 node killed, c10d: {c10d}")
    assert c10d.survivors_training is None, "c10d's survivors trained again without rank 0's store"


@pytest.mark.parametrize(
    ("job_file", "operator"),
    [("training-job.yaml", True), ("torch/indexed-job.yaml", False)],
    ids=["tensorplay-operator", "torchrun-no-operator"],
)
def test_a_node_failure_leaves_the_pods_on_the_other_nodes_training_and_the_replacement_joins(
    recovered: Cluster, namespace3: str, tmp_path: Path, job_file: str, operator: bool
) -> None:
    """The node of rank 0's pod dies (network silent, then kubelet, containerd and containers killed).

    With the operator (heartbeats set to expire after 90 s, so that only its rule can act), the Node turns
    NotReady and the operator evicts the nodes of the pods bound to it; without it, the heartbeats expire (15 s).
    Either way the pods on the other two nodes train on in a new round, and the Job's replacement pod, created
    once the node is marked out of service, lands on a live node and joins them (waited for with the operator).
    Both launchers: tensorplay's with the operator, stock torchrun without it (the k8s side of ``test_c10d_...``:
    the same kill, rank 0's node, where c10d's survivors never train again)."""
    process = local_operator(recovered, namespace3, tmp_path / "operator.log") if operator else None
    # The replacement after a node loss is Kubernetes' (the out-of-service taint, the pod garbage collector, the
    # Job): waited for once, with the operator.
    recovery = node_failure(recovered, namespace3, process, job_file, replacement=operator)
    print(f"node failure ({'operator' if operator else 'no operator'}): {recovery}")
    assert recovery.survivors_training is not None, f"the pods on the other nodes did not train again: {recovery}"
    after = recovery.details["after"]
    rank0 = recovery.details["rank0"]
    assert after is not None and after[0] > recovery.details["round_before"] and rank0 not in after[1]
    if operator:
        assert recovery.replacement_training is not None
        assert recovery.victim_node not in recovery.details["replacement_nodes"]
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
        "rbac.scope=namespace", "podDisruptionBudget.enabled=true", *own_release_fencing(plane, namespace3),
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


def test_ranks_follow_the_nodes_topology_and_an_agent_on_a_cordoned_node_waits_until_uncordoned(
    recovered: Cluster, api: client.ApiClient, namespace3: str, tmp_path: Path
) -> None:
    """tensorplay's launcher, the operator running, ranks by a rack label whose order is not the pods' addresses'
    (``placement.RACKS``: node-2's pod ranks first). Then node-1 is cordoned and a fourth agent starts there (a pod
    bound to it): it is held, the round is left alone, and ``kubectl rdzv status``, the status and an Event say
    why; once node-1 is uncordoned it joins and the round re-forms with 4, still ranked by rack."""
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    plane = recovered.plane
    with racks(recovered), local_operator(recovered, namespace3, tmp_path / "operator.log") as operator:
        manifests = ranked_by_rack(spread(example_objects(last_call_seconds=LAST_CALL_SECONDS)))
        first, _ = start_spread_job(recovered, namespace3, manifests)
        status = rendezvous_status(objects, namespace3)
        expected = rack_order(first.pods)
        assert member_ranks(status) == expected, "ranked by rack, then address"
        assert expected[first.pods[first.on("node-2")[0]][0]] == 0, "not the address order"
        assert status["topology"] == {
            "order": "Topology",
            "domains": [
                {"domain": "r1", "firstRank": 0, "lastRank": 0},
                {"domain": "r2", "firstRank": 1, "lastRank": 2},
            ],
        }
        ranks = wait_until(lambda: group_ranks(recovered, namespace3, list(first.pods), 3), 60, "the workers' ranks")
        assert ranks == {pod: expected[address] for pod, (address, _) in first.pods.items()}, "the launcher's ranks"

        plane.kubectl("cordon", "node-1")
        job = next(item for item in manifests if item["kind"] == "Job")
        uid = client.BatchV1Api(api).read_namespaced_job(RENDEZVOUS, namespace3).metadata.uid
        core.create_namespaced_pod(namespace3, pinned_training_pod(job, uid, "extra-on-node-1", "node-1"))
        held = wait_until(
            lambda: (now := rendezvous_status(objects, namespace3)).get("heldCount") == 1 and now,
            90,
            "the agent on the cordoned node held",
            explain=lambda: "\n".join(pod_log(recovered.node, namespace3, "extra-on-node-1")[-10:]),
        )
        reason = "NodeCordoned: Kubernetes node node-1 is cordoned (spec.unschedulable)"
        (item,) = held["heldNodes"]
        assert item["reason"] == reason
        holds_for(
            lambda: (
                (now := rendezvous_status(objects, namespace3))["round"] == status["round"]
                and now["participantCount"] == 3
                and not now["waitingCount"]
            ),
            5,
            "the round left alone, nothing waiting",
        )
        assert f"{item['node']}: {reason}" in rdzv_status_text(recovered, namespace3)
        wait_until(lambda: operator.metric("kube_rendezvous_held_nodes") == 1, 30, "the held node counted")
        assert any(
            item["node"] in message and "NodeCordoned" in message for message in events(core, namespace3, "NodeHeld")
        )
        assert any(
            "waits, not admitted to a new round: NodeCordoned" in line
            for line in pod_log(recovered.node, namespace3, "extra-on-node-1")
        )

        plane.kubectl("uncordon", "node-1")
        extra_ip = core.read_namespaced_pod("extra-on-node-1", namespace3).status.pod_ip
        four = wait_until(
            lambda: (
                (now := rendezvous_status(objects, namespace3)).get("phase") == "Complete"
                and extra_ip in member_ranks(now)
                and now
            ),
            90,
            "a round of 4 with the agent of node-1",
        )
        assert not four.get("heldCount") and four["participantCount"] == 4
        pods = {**first.pods, "extra-on-node-1": (extra_ip, "node-1")}
        assert member_ranks(four) == rack_order(pods)
        assert wait_until(lambda: group_ranks(recovered, namespace3, list(pods), 4), 90, "training with 4") == {
            pod: rack_order(pods)[address] for pod, (address, _) in pods.items()
        }


@pytest.mark.parametrize(
    ("launcher", "operator"),
    [("torch/indexed-job.yaml", True), ("training-job.yaml", False)],
    ids=["torchrun-operator", "tensorplay-no-operator"],
)
def test_a_spare_takes_a_deleted_members_place_before_the_replacement_starts(
    recovered: Cluster, api: client.ApiClient, namespace3: str, tmp_path: Path, launcher: str, operator: bool
) -> None:
    """3 pods, ``--nnodes=1:2``: one spare. The member of rank 0 is deleted: the spare is promoted at once and the
    round of 2 trains again before the Job's replacement pod has started; the replacement becomes the new spare.
    Stock torchrun with the operator (which ranks by rack, and posts a SparePromoted Event naming the spare), and
    tensorplay's launcher without it (the agents fold; ranks follow addresses, and the status says why)."""
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    promotions = 0.0
    with racks(recovered), contextlib.ExitStack() as stack:
        process = (
            stack.enter_context(local_operator(recovered, namespace3, tmp_path / "operator.log")) if operator else None
        )
        recovery = spare_recovery(recovered, namespace3, spares=1, launcher=launcher)
        status = rendezvous_status(objects, namespace3)
        if process is not None:
            promotions = process.metric("kube_rendezvous_spare_promotions_total")
            wait_until(lambda: process.metric("kube_rendezvous_spare_nodes") == 1, 60, "the replacement, a spare")
    print(f"spare promoted ({launcher}, operator {operator}): {recovery}")
    details = recovery.details
    pods = details["pods"]
    (spare,) = details["spares_before"]
    assert spare in details["ranks_after"], "the spare is in the new round"
    assert recovery.training is not None and recovery.replacement_running is not None
    assert recovery.training < recovery.replacement_running, "trained again before the replacement started"
    members_before = {pod: where for pod, where in pods.items() if where[0] != spare}
    survivors = {pod: where for pod, where in pods.items() if pod != details["victim"]}
    if operator:
        assert details["ranks_before"] == rack_order(members_before)
        assert details["ranks_after"] == rack_order(survivors), "the new round ranked by rack too"
        assert any(spare in message for message in events(core, namespace3, "SparePromoted"))
        assert promotions == 1, "the operator's metrics count the promotion"
    else:
        by_address = sorted(address for address, _ in survivors.values())
        assert details["ranks_after"] == {address: rank for rank, address in enumerate(by_address)}
        assert status["topology"]["order"] == "Address" and "does not know the Nodes" in status["topology"]["reason"]


def test_a_lost_node_s_pod_is_replaced_with_no_human_and_fenced_when_its_partition_heals(
    recovered: Cluster, api: client.ApiClient, namespace3: str, tmp_path: Path
) -> None:
    """Issue #46 on three real nodes. The node of one pod is cut off: its pods' packets dropped and its kubelet
    stopped, while the pod's agent and workers live on. The Node turns NotReady; the operator posts ``NodeLost``
    on the Rendezvous and on the pod, naming the Node, the pod and the out-of-service taint command; the
    survivors train on. With ``spec.lostNodes.failPodsAfterSeconds`` the operator marks the pod Failed
    (``DisruptionTarget``) and deletes it; the Job replaces it (the pods keep the default 300 s toleration and
    nobody taints the Node), and the replacement trains with the survivors. Then the partition heals: the old
    pod's agent, still running, can write nothing (its token died with its pod), never rejoins, no round breaks,
    and the kubelet, back, stops the old containers."""
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    operator = local_operator(recovered, namespace3, tmp_path / "operator.log", lost_nodes=True)
    with operator:
        story = lost_node(recovered, namespace3, FAIL_LOST_PODS_AFTER, partition=True)
        print(f"lost node, partitioned: {story}")
        assert story.replacement_training is not None, f"the replacement did not train: {story}"
        victim = story.victim_pods[0]
        node = node_named(recovered, story.victim_node)
        # Told: NodeLost names the fix on the Rendezvous and the pod; LostPodsFailed says what the operator did.
        lost = events(core, namespace3, "NodeLost")
        assert lost and all(f"Kubernetes node {story.victim_node} is NotReady" in m for m in lost), lost
        assert f"pod {victim}" in lost[0]
        assert f"kubectl taint nodes {story.victim_node} node.kubernetes.io/out-of-service" in lost[0]
        involved = {
            item.involved_object.name
            for item in core.list_namespaced_event(namespace3).items
            if item.reason == "NodeLost"
        }
        assert involved == {RENDEZVOUS, victim}
        failed = events(core, namespace3, "LostPodsFailed")
        assert failed and f"pod {victim} on Kubernetes node {story.victim_node}" in failed[0]
        # No human: the Node was never tainted out of service.
        taints = core.read_node(story.victim_node).spec.taints or []
        assert all(taint.key != "node.kubernetes.io/out-of-service" for taint in taints), taints
        after = story.details["after"]
        assert after is not None and story.details["victim_address"] not in after[1] and len(after[1]) == 3
        round_after = after[0]
        assert round_after <= story.details["round_before"] + 2, "the round broke more than once for the lost node"
        # The partition heals (its network first, the kubelet a little later): the old pod's processes are still
        # running and reach the API server again, with the token of a pod that no longer exists.
        old_lines = len(pod_log(recovered.node, namespace3, victim))
        assert pod_processes(story.details["victim_uid"]), "the cut-off pod's processes did not live on"
        address = story.details["victim_address"]
        leases = client.CoordinationV1Api(api)
        node.reconnect()
        healed = datetime.now(timezone.utc)

        def fenced() -> bool:
            now = members(objects, namespace3)
            written = [
                lease.metadata.name
                for lease in leases.list_namespaced_lease(namespace3).items
                if address in f"{lease.spec.holder_identity} {lease.metadata.annotations}"
                and lease.spec.renew_time is not None
                and lease.spec.renew_time > healed
            ]
            return now is not None and now[0] == round_after and address not in now[1] and not written

        holds_for(fenced, 20, "the round unbroken, the fenced pod's agent not in it and none of its Leases written")
        since = pod_log(recovered.node, namespace3, victim)[old_lines:]
        print("the fenced agent after its network came back:", *since[-15:], sep="\n  ")
        assert not any("init_process_group" in line for line in since), since[-20:]
        assert any("401 Unauthorized" in line for line in since), since[-20:]  # refused, its token died with its pod
        node.start_kubelet()
        wait_until(node.ready, 120, f"{story.victim_node} Ready again")
        wait_until(lambda: not pod_processes(story.details["victim_uid"]), 120, f"the kubelet to stop the old {victim}")
        holds_for(fenced, 5, "the round unbroken once the kubelet is back")


def pod_processes(uid: str) -> list[int]:
    """The processes of the pod of ``uid`` on this machine (its containers' cgroups name it)."""
    marks = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            groups = (entry / "cgroup").read_text()
        except OSError:
            continue
        if any(mark in groups for mark in marks):
            found.append(int(entry.name))
    return found
