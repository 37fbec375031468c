"""The operator evicts the nodes of training pods on a Kubernetes Node that went NotReady (issue #27).

Real control plane (RBAC on), the operator as a process under docs/operator-rbac.yaml, real
tensorplay agents. No kubelet runs here, so the test plays it and the node-lifecycle controller:
it creates Node objects (an admin may), writes their ``Ready`` condition through the status
subresource, and creates the training pods bound to them (``spec.nodeName``), Running with their
agents' addresses as pod IPs. A machine that dies takes its agents with it (SIGKILL) and its
pods still show Running: only the Node's ``Ready`` condition says anything. Heartbeats expire
only after 5 s x 60 = 300 s here, so a survivor re-forming within the deadlines can only come
from the operator's eviction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.e2e.harness import ElasticJob, kill_pods, training_in_world
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import REPO, create_rendezvous, holds_for
from tests.test_operator import events, operator, read  # noqa: F401 - a fixture
from tests.testenv import ControlPlane, wait_until

MakeJob = Callable[..., ElasticJob]

#: The operator's default --node-not-ready-seconds (kube_rendezvous_operator.config).
GRACE = 10.0
#: What the agents' heartbeats would take to expire here (keep_alive_max_attempt=60 x 5 s).
HEARTBEAT_EXPIRY = 300.0


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_ready(core: client.CoreV1Api, node: str, status: str, reason: str) -> None:
    """Write the Node's Ready condition as the kubelet (True, False) or the node-lifecycle controller (Unknown) does."""
    moment = now_rfc3339()
    condition = {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": f"played by the test: {reason}",
        "lastHeartbeatTime": moment,
        "lastTransitionTime": moment,
    }
    core.patch_node_status(node, {"status": {"conditions": [condition]}})


@pytest.fixture
def kubernetes_nodes(admin_api: client.ApiClient, namespace: str) -> Iterator[Callable[[str], str]]:
    """Make Ready Kubernetes Nodes named after the test's namespace (Nodes are cluster-scoped); delete them after."""
    core = client.CoreV1Api(admin_api)
    made: list[str] = []

    def make(suffix: str) -> str:
        name = f"{namespace}-{suffix}"
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        made.append(name)
        set_ready(core, name, "True", "KubeletReady")
        return name

    yield make
    for name in made:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def create_pod_on(core: client.CoreV1Api, namespace: str, name: str, node: str, address: str) -> None:
    """A training pod of Rendezvous ``job`` bound to Kubernetes Node ``node``, played Running at ``address``."""
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"kube-rendezvous.io/rendezvous": "job"}),
            spec=client.V1PodSpec(
                node_name=node,
                restart_policy="Never",
                service_account_name="trainer",
                containers=[client.V1Container(name="agent", image="trainer:latest")],
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
    )


def start_job(make_job: MakeJob) -> ElasticJob:
    return make_job(
        nnodes="1:3",
        steps=120,
        step_seconds=1.0,
        rdzv_conf={"last_call_timeout": "3", "keep_alive_max_attempt": "60"},
    )


def evicted_nodes(objects: client.CustomObjectsApi, namespace: str) -> list[str]:
    return list(read(objects, namespace).get("status", {}).get("evictedNodes") or [])


class TestNotReadyNode:
    def test_the_nodes_of_dead_pods_on_a_not_ready_node_are_evicted_after_the_grace_and_survivors_reform(
        self,
        operator: OperatorProcess,  # noqa: F811 - the fixture
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
        kubernetes_nodes: Callable[[str], str],
    ) -> None:
        core = client.CoreV1Api(admin_api)
        create_rendezvous(objects, namespace, minNodes=1, maxNodes=3)
        failing, healthy = kubernetes_nodes("failing"), kubernetes_nodes("healthy")
        placement = {"trainer-0": (healthy, "127.0.0.61"), "trainer-1": (failing, "127.0.0.62")}
        placement["trainer-2"] = (failing, "127.0.0.63")
        for name, (node, address) in placement.items():
            create_pod_on(core, namespace, name, node, address)
        job = start_job(make_job)
        agents = [job.start_agent(name, local_addr=address) for name, (_, address) in placement.items()]
        wait_until(lambda: training_in_world(agents, 6), 120, "3 agents training together")
        survivor, victims = agents[0], agents[1:]
        victim_nodes = sorted(victim.node_name for victim in victims)

        # The machine dies: its agents with it; its pods still say Running. The node-lifecycle
        # controller later marks the Node Unknown (played at once here: the hardest case for timing).
        kill_pods(victims)
        set_ready(core, failing, "Unknown", "NodeStatusUnknown")
        not_ready_at = time.monotonic()
        wait_until(lambda: evicted_nodes(objects, namespace) == victim_nodes, 60, "the dead agents' nodes evicted")
        took = time.monotonic() - not_ready_at
        print(f"\nNotReady to eviction: {took:.1f} s (grace {GRACE:g} s, heartbeat expiry {HEARTBEAT_EXPIRY:g} s)")
        # Not before the grace (the transition time has whole seconds), and well before the expiry.
        assert GRACE - 1.0 <= took < GRACE + 10.0

        wait_until(lambda: training_in_world([survivor], 2, min_step=0), 120, "the survivor training alone")
        print(f"NotReady to the survivor training again: {time.monotonic() - not_ready_at:.1f} s")
        # (No lastDeparture check: the survivor's own workers fail first, their gloo peers gone, so
        # its agent leaves round 0 and that is the departure recorded; the victims' nodes still
        # held the next round until evicted, as heartbeats expire only after 300 s.)
        evictions = [message for _, reason, message in events(admin_api, namespace) if reason == "NodeEvicted"]
        assert len(evictions) == 1, evictions
        assert evictions[0].startswith(f"evicted {', '.join(victim_nodes)}: their Kubernetes node {failing} ")
        assert "is NotReady (Ready=Unknown) since" in evictions[0]
        assert survivor.alive()
        job.stop()

    def test_an_agent_that_still_heartbeats_on_a_not_ready_node_is_never_evicted(
        self,
        operator: OperatorProcess,  # noqa: F811 - the fixture
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
        kubernetes_nodes: Callable[[str], str],
    ) -> None:
        core = client.CoreV1Api(admin_api)
        create_rendezvous(objects, namespace, minNodes=1, maxNodes=3)
        lost_kubelet, healthy = kubernetes_nodes("lost-kubelet"), kubernetes_nodes("healthy")
        placement = {"trainer-0": (healthy, "127.0.0.71"), "trainer-1": (lost_kubelet, "127.0.0.72")}
        for name, (node, address) in placement.items():
            create_pod_on(core, namespace, name, node, address)
        job = start_job(make_job)
        agents = [job.start_agent(name, local_addr=address) for name, (_, address) in placement.items()]
        wait_until(lambda: training_in_world(agents, 4), 120, "2 agents training together")
        on_lost = agents[1]

        # Only the kubelet failed: the Node goes Unknown, its agent keeps training and heartbeating.
        set_ready(core, lost_kubelet, "Unknown", "NodeStatusUnknown")
        spared = f"Kubernetes node {lost_kubelet} is NotReady since"
        alive = f"but nodes {on_lost.node_name} of rendezvous {namespace}/job on it heartbeat after that"
        wait_until(
            lambda: any(spared in line and alive in line for line in operator.log.read_text().splitlines()),
            GRACE + 20,
            "the operator to judge the NotReady node and spare its live agent",
        )
        # Judged again by every resync (1 s + 10 s): still never evicted, and nothing breaks.
        holds_for(lambda: evicted_nodes(objects, namespace) == [], 12, "no eviction of a live agent")
        assert training_in_world(agents, 4, min_step=0)
        assert "NodeEvicted" not in [reason for _, reason, _ in events(admin_api, namespace)]
        job.stop()


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
            # It goes on: it reconciles a Rendezvous as ever (Ready=True), and stays up.
            create_rendezvous(objects, namespace)
            wait_until(
                lambda: any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in read(objects, namespace).get("status", {}).get("conditions") or []
                ),
                60,
                "Ready=True from an operator that may not read Nodes",
            )
            assert running.healthy()
            found = warnings()
            assert len(found) == 1, found
            assert "get, list and watch on nodes" in found[0] and "ClusterRole" in found[0]
