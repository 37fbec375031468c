"""The README's example Job spread over the three nodes of ``tests.testenv.cluster``, and the failures of a node.

Used by ``tests/test_multi_node.py`` (each case once, asserted) and ``benchmarks/multi_node.py`` (every case
repeated, timed). Each scenario returns what it measured; the times are seconds from the fault.

The manifests are ``examples/`` as shipped (``real_pods.example_objects``) plus what a multi-node test needs:

- a topology spread over ``kubernetes.io/hostname`` (``DoNotSchedule``, tainted nodes not counted), so the
  3 pods land on 3 nodes and a replacement never on a node that is down or cordoned;
- tolerations of ``node.kubernetes.io/unreachable`` and ``not-ready`` for ``TOLERATION_SECONDS`` instead of the
  300 s that the DefaultTolerationSeconds admission plugin adds: a pod of a dead node is deleted that long after
  its node turned NotReady (the README's "A node lost" says why short, with the trade-off). The examples' Jobs
  (their ``podFailurePolicy``) replace it only once it is Failed, which a dead kubelet never reports: a node
  failure here ends with the node marked out of service (``Node.mark_out_of_service``), as Kubernetes' non-graceful
  node shutdown asks of an administrator.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.e2e.operator_process import OperatorProcess
from tests.e2e.real_pods import (
    RENDEZVOUS,
    REPO,
    example_objects,
    member_addresses,
    rendezvous_status,
    round_with,
    start_training_pods,
    training_pods,
    worker_rounds,
)
from tests.testenv import wait_until
from tests.testenv.cluster import Cluster
from tests.testenv.node import Node

#: Seconds a training pod stays bound to a NotReady or unreachable node before it is deleted and replaced.
TOLERATION_SECONDS = 5
#: Without the operator's census a round of the example's 3 pods (2 to 4 nodes) forms when the last call ends.
LAST_CALL_SECONDS = 10
#: c10d's store port on rank 0's pod (torch's default).
C10D_PORT = 29400


def spread(objects: list[dict[str, Any]], toleration: int | None = TOLERATION_SECONDS) -> list[dict[str, Any]]:
    """``objects`` with the Job's pods spread one per node and a ``toleration`` of a dead node (seconds; None:
    the cluster's default, 300 s)."""
    for item in objects:
        if item["kind"] != "Job":
            continue
        pod = item["spec"]["template"]["spec"]
        labels = item["spec"]["template"]["metadata"]["labels"]
        pod["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "nodeTaintsPolicy": "Honor",
                "labelSelector": {"matchLabels": labels},
            }
        ]
        if toleration is not None:
            pod["tolerations"] = [
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": toleration}
                for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
            ]
    return objects


def c10d_objects(last_call_seconds: int = 10, **environment: str) -> list[dict[str, Any]]:
    """``examples/torch/indexed-job.yaml`` with torch's own c10d backend, as PyTorch's maintainers advise on
    Kubernetes: rank 0's store found by a headless Service's DNS name (the Indexed Job's pod 0, whose hostname
    is ``llama-train-0``), spread like ``spread``."""
    objects = spread(example_objects("torch/indexed-job.yaml", **environment))
    job = next(item for item in objects if item["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    pod["subdomain"] = RENDEZVOUS
    container = pod["containers"][0]
    endpoint = f"{RENDEZVOUS}-0.{RENDEZVOUS}:{C10D_PORT}"
    container["args"] = [
        {"--rdzv-backend=k8s": "--rdzv-backend=c10d"}.get(arg, arg)
        if not arg.startswith("--rdzv-endpoint=")
        else f"--rdzv-endpoint={endpoint}"
        for arg in container["args"]
    ]
    # The same last call as the k8s runs' Rendezvous (LAST_CALL_SECONDS of the tests): 3 of at most 4 nodes.
    container["args"].insert(0, f"--rdzv-conf=last_call_timeout={last_call_seconds}")
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": RENDEZVOUS},
            "spec": {
                "clusterIP": "None",
                # A record for each pod as soon as it has an address (c10d's store host included).
                "publishNotReadyAddresses": True,
                "selector": {"batch.kubernetes.io/job-name": RENDEZVOUS},
                "ports": [{"name": "c10d", "port": C10D_PORT}],
            },
        }
    )
    return objects


@dataclass
class Placement:
    """The training pods Running now: name -> (address, node)."""

    pods: dict[str, tuple[str, str]] = field(default_factory=dict)

    def on(self, node: str) -> list[str]:
        return sorted(pod for pod, (_, where) in self.pods.items() if where == node)

    @property
    def addresses(self) -> dict[str, str]:
        return {pod: address for pod, (address, _) in self.pods.items()}


def placement(
    core: client.CoreV1Api, namespace: str, exclude: frozenset[str] = frozenset(), nodes: int = 3, count: int = 3
) -> Placement | None:
    """The training pods once exactly ``count`` are Running with an address, on ``nodes`` distinct nodes, none in
    ``exclude``."""
    pods = [pod for pod in training_pods(core, namespace) if pod.metadata.name not in exclude]
    running = {
        pod.metadata.name: (pod.status.pod_ip, pod.spec.node_name)
        for pod in pods
        if pod.status.phase == "Running" and pod.status.pod_ip
    }
    if len(running) != count or len(pods) != count or len({node for _, node in running.values()}) != nodes:
        return None
    return Placement(running)


def members(objects: client.CustomObjectsApi, namespace: str) -> tuple[int, set[str]] | None:
    """The current round and its members' addresses, once it formed (Complete)."""
    status = rendezvous_status(objects, namespace)
    if status.get("phase") != "Complete":
        return None
    return int(status["round"]), member_addresses(status)


def log_tails(cluster: Cluster, namespace: str, pods: list[str], lines: int = 25) -> dict[str, str]:
    """The last ``lines`` of each pod's log (what a failed wait shows)."""
    found = {}
    for pod in pods:
        done = cluster.plane.kubectl("-n", namespace, "logs", pod, f"--tail={lines}", check=False)
        found[pod] = done.stdout + done.stderr
    return found


def node_named(cluster: Cluster, name: str) -> Node:
    return next(node for node in cluster.nodes if node.name == name)


def pod_index(pod: client.V1Pod) -> int:
    return int(pod.metadata.labels["batch.kubernetes.io/job-completion-index"])


@dataclass
class Recovery:
    """What a node failure or drain led to, in seconds from the fault (None: not within the window)."""

    victim_node: str
    victim_pods: list[str]
    survivors_training: float | None
    replacement_training: float | None = None
    not_ready: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def start_spread_job(
    cluster: Cluster, namespace: str, objects: list[dict[str, Any]], rendezvous: bool = True
) -> tuple[Placement, dict[str, int]]:
    """Apply ``objects``; return the 3 pods' placement once they formed a round (with ``rendezvous``; c10d has no
    Rendezvous) and each pod's workers trained in a world of 3, and each pod's rounds of 3 that trained."""
    api = _api(cluster)
    core, objects_api = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def running() -> dict[str, tuple[str, str]] | None:
        found = placement(core, namespace)
        return None if found is None else found.pods

    def formed(pods: dict[str, tuple[str, str]]) -> dict[str, Any] | None:
        return round_with(objects_api, namespace, Placement(pods).addresses, phases=("Complete",))

    started = start_training_pods(
        cluster.node,
        namespace,
        running,
        3,
        objects=objects,
        formed=formed if rendezvous else None,
        what="the 3 training pods on 3 nodes",
    )
    return Placement(started.pods), started.trained


def _api(cluster: Cluster) -> client.ApiClient:
    from kubernetes import config

    return config.new_client_from_config(str(cluster.plane.admin_kubeconfig))


def pod_zero_node(core: client.CoreV1Api, namespace: str, first: Placement) -> str:
    """The node of the Indexed Job's pod 0 (c10d's store host; the same kill for both backends)."""
    pods = {pod.metadata.name: pod for pod in training_pods(core, namespace)}
    zero = next(name for name in first.pods if pod_index(pods[name]) == 0)
    return first.pods[zero][1]


def await_replacement(
    cluster: Cluster,
    namespace: str,
    first: Placement,
    victims: list[str],
    recovery: Recovery,
    since: float,
    window: float,
) -> None:
    """Wait for the Job's replacement of ``victims`` to run on a live node and train with 3; record when, from
    ``since``, and where it landed."""
    core = client.CoreV1Api(_api(cluster))
    after = wait_until(
        lambda: placement(core, namespace, exclude=frozenset(victims), nodes=2), window, "the Job's replacement Running"
    )
    new = sorted(set(after.pods) - set(first.pods))
    recovery.details["replacement_nodes"] = [after.pods[pod][1] for pod in new]
    wait_until(
        lambda: all(worker_rounds(cluster.node, namespace, pod, 3) > 0 for pod in new),
        window,
        f"the replacement {', '.join(new)} training with 3",
    )
    recovery.replacement_training = time.monotonic() - since


def not_ready(core: client.CoreV1Api, node: str) -> bool:
    """Whether Node ``node``'s Ready condition is not True (read from the API server only)."""
    conditions = core.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status != "True" for c in conditions)


def fail_node_and_recover(
    cluster: Cluster,
    namespace: str,
    first: Placement,
    trained: dict[str, int],
    victim_node: str,
    window: float = 180,
    replacement: bool = True,
) -> Recovery:
    """Kill ``victim_node`` (kubelet, containerd and its containers); time the survivors' next training round and,
    with ``replacement``, the replacement's, once the node is NotReady and marked out of service
    (``Node.mark_out_of_service``). The node stays down (``Node.recover`` brings it back)."""
    api = _api(cluster)
    core = client.CoreV1Api(api)
    victims = first.on(victim_node)
    survivors = sorted(set(first.pods) - set(victims))
    node_named(cluster, victim_node).fail()
    failed = time.monotonic()
    recovery = Recovery(victim_node, victims, None)

    def survivors_trained() -> bool:
        if recovery.not_ready is None and not_ready(core, victim_node):
            recovery.not_ready = time.monotonic() - failed
        return all(worker_rounds(cluster.node, namespace, pod) > trained[pod] for pod in survivors)

    try:
        wait_until(survivors_trained, window, f"the pods on the other nodes ({', '.join(survivors)}) training again")
    except TimeoutError:
        recovery.details["logs"] = log_tails(cluster, namespace, survivors)
        return recovery
    recovery.survivors_training = time.monotonic() - failed
    if replacement:
        # The machine is gone for good: the administrator says so (a cloud's node lifecycle deletes the Node). The
        # examples' Jobs replace only Failed pods (their podFailurePolicy), and a dead kubelet fails none.
        wait_until(lambda: not_ready(core, victim_node), window, f"{victim_node} NotReady")
        node_named(cluster, victim_node).mark_out_of_service()
        recovery.details["out_of_service"] = time.monotonic() - failed
        await_replacement(cluster, namespace, first, victims, recovery, failed, window)
    return recovery


def drain_and_recover(
    cluster: Cluster, namespace: str, first: Placement, trained: dict[str, int], node: str, window: float = 180
) -> Recovery:
    """``kubectl drain`` ``node`` (cordon, then the eviction API for each pod, PodDisruptionBudgets honoured); time
    the survivors' next training round and the replacement's. The node is uncordoned afterwards."""
    api = _api(cluster)
    victims = first.on(node)
    survivors = sorted(set(first.pods) - set(victims))
    plane = cluster.plane
    command = [str(plane.binaries.kubectl), f"--kubeconfig={plane.admin_kubeconfig}", "drain", node]
    command += ["--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={int(window)}s"]
    drained = time.monotonic()
    drain = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    recovery = Recovery(node, victims, None)
    try:
        try:
            wait_until(
                lambda: all(worker_rounds(cluster.node, namespace, pod) > trained[pod] for pod in survivors),
                window,
                f"the pods on the other nodes ({', '.join(survivors)}) training again",
            )
        except TimeoutError:
            drain.kill()
            output, _ = drain.communicate(timeout=30)
            recovery.details["drain"] = {"exit": drain.returncode, "output": output[-2000:]}
            recovery.details["status"] = rendezvous_status(client.CustomObjectsApi(api), namespace)
            recovery.details["logs"] = log_tails(cluster, namespace, survivors)
            return recovery
        recovery.survivors_training = time.monotonic() - drained
        await_replacement(cluster, namespace, first, victims, recovery, drained, window)
        output, _ = drain.communicate(timeout=window)
        recovery.details["drain"] = {"exit": drain.returncode, "output": output[-2000:]}
        return recovery
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait(10)
        plane.kubectl("uncordon", node)


def local_operator(
    cluster: Cluster, namespace: str, log: Path, lost_nodes: bool = False, env: dict[str, str] | None = None
) -> OperatorProcess:
    """The operator as a local process with its documented RBAC (and, with ``lost_nodes``, the opt-in
    docs/operator-rbac-lost-nodes.yaml), watching ``namespace`` (not started); ``env`` is added to its
    environment (a previous release on ``PYTHONPATH``)."""
    plane = cluster.plane
    plane.kubectl("create", "namespace", "kube-rendezvous-system", check=False)
    plane.kubectl("apply", "-f", str(REPO / "docs" / "operator-rbac.yaml"))
    if lost_nodes:
        plane.kubectl("apply", "-f", str(REPO / "docs" / "operator-rbac-lost-nodes.yaml"))
    kubeconfig = plane.serviceaccount_kubeconfig("kube-rendezvous-system", "kube-rendezvous-operator")
    return OperatorProcess(kubeconfig, namespace, log, env=env)


@dataclass
class LostNode(Recovery):
    """A lost Node's story, in seconds from the fault (None: not seen within the window): the Node NotReady (from
    ``Recovery``), the operator's ``NodeLost`` Event, the out-of-service taint (by a human, when played), the lost
    pod Failed or gone, its replacement Running (and, from ``Recovery``, training), and the survivors training."""

    node_lost: float | None = None
    tainted: float | None = None
    pod_failed: float | None = None
    replacement_running: float | None = None


def lost_node(
    cluster: Cluster,
    namespace: str,
    fail_after: int | None,
    *,
    partition: bool = False,
    human: bool = False,
    window: float = 300,
) -> LostNode:
    """The README's example Job spread over the nodes, the pods keeping the default 300 s toleration, with the
    caller's operator running (``spec.lostNodes.failPodsAfterSeconds`` = ``fail_after``; None: not set); then the
    node of the second pod is lost: with ``partition`` cut off (its pods' packets dropped, its kubelet stopped:
    the pod's processes live on), else dead (``Node.fail``). With ``human``, an administrator taints the Node out of
    service the moment it is NotReady (what the tests did before the operator could). Times the Node NotReady,
    ``NodeLost`` (when the operator posts it), the survivors training, the pod Failed or gone, and the
    replacement Running and training with 3. Returns the story; the node stays lost (``Node.recover``)."""
    api = _api(cluster)
    core, objects_api = client.CoreV1Api(api), client.CustomObjectsApi(api)
    manifests = spread(example_objects(last_call_seconds=LAST_CALL_SECONDS), toleration=None)
    if fail_after is not None:
        rendezvous = next(m for m in manifests if m["kind"] == "Rendezvous")
        rendezvous["spec"]["lostNodes"] = {"failPodsAfterSeconds": fail_after}
    first, trained = start_spread_job(cluster, namespace, manifests)
    victim = sorted(first.pods)[1]
    address, where = first.pods[victim]
    node = node_named(cluster, where)
    survivors = sorted(set(first.pods) - {victim})
    victim_uid = core.read_namespaced_pod(victim, namespace).metadata.uid
    if partition:
        node.isolate()
        node.stop_kubelet()
    else:
        node.fail()
    fault = time.monotonic()
    before = rendezvous_status(objects_api, namespace)["round"]
    story = LostNode(where, [victim], None, details={"round_before": before, "victim_uid": victim_uid})

    def seen() -> bool:
        now = time.monotonic() - fault
        if story.not_ready is None and not_ready(core, where):
            story.not_ready = now
        if human and story.not_ready is not None and story.tainted is None:
            node.mark_out_of_service()
            story.tainted = time.monotonic() - fault
        if story.node_lost is None and any(
            item.reason == "NodeLost" and item.involved_object.name == RENDEZVOUS
            for item in core.list_namespaced_event(namespace).items
        ):
            story.node_lost = now
        if story.survivors_training is None and all(
            worker_rounds(cluster.node, namespace, pod) > trained[pod] for pod in survivors
        ):
            story.survivors_training = now
        if story.pod_failed is None:
            old = {pod.metadata.name: pod for pod in training_pods(core, namespace)}.get(victim)
            if old is None or old.status.phase == "Failed":
                story.pod_failed = now
        if story.replacement_running is None and placement(core, namespace, exclude=frozenset([victim]), nodes=2):
            story.replacement_running = now
        return story.survivors_training is not None and story.replacement_running is not None

    try:
        wait_until(seen, window, "the survivors training and the replacement Running")
        await_replacement(cluster, namespace, first, [victim], story, fault, window)
    except TimeoutError:
        story.details["logs"] = log_tails(cluster, namespace, survivors)
        story.details["status"] = rendezvous_status(objects_api, namespace)
        return story
    story.details.update(victim_address=address, after=members(objects_api, namespace))
    return story


def node_failure(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess | None,
    job_file: str = "training-job.yaml",
    replacement: bool = True,
) -> Recovery:
    """The example Job of ``job_file`` (tensorplay's launcher, or ``torch/indexed-job.yaml``: stock torchrun) spread
    over the nodes; the node of rank 0's pod fails; the survivors and the replacement timed.

    With ``operator`` (started here, stopped after), the heartbeats are set to expire after 90 s, so that only its
    NotReady and pod rules can remove the dead node; without it, the default 15 s expiry does."""
    objects = client.CustomObjectsApi(_api(cluster))
    manifests = spread(example_objects(job_file, last_call_seconds=LAST_CALL_SECONDS))
    if operator is not None:
        rendezvous = next(m for m in manifests if m["kind"] == "Rendezvous")
        rendezvous["spec"].update(keepAliveIntervalSeconds=10, keepAliveMaxAttempts=9)
        operator.start()
    try:
        first, trained = start_spread_job(cluster, namespace, manifests)
        status = rendezvous_status(objects, namespace)
        rank0 = next(p["node"].rsplit("_", 2)[0] for p in status["participants"] if p["rank"] == 0)
        victim = next(node for address, node in first.pods.values() if address == rank0)
        recovery = fail_node_and_recover(cluster, namespace, first, trained, victim, replacement=replacement)
        recovery.details.update(round_before=status["round"], rank0=rank0, first=first.pods)
        recovery.details["after"] = members(objects, namespace)
        recovery.details["evicted"] = rendezvous_status(objects, namespace).get("evictedNodes") or []
        return recovery
    finally:
        if operator is not None:
            operator.stop()


def rank0_node_killed(cluster: Cluster, namespace: str, backend: str, window: float = 90) -> Recovery:
    """Stock torchrun, ``--rdzv-backend`` ``k8s`` or ``c10d`` (``c10d_objects``), spread over the nodes; the node of
    the Indexed Job's pod 0 (c10d's store host) fails; the survivors (and, for k8s, the replacement) timed. The
    Job is deleted and the node recovered afterwards."""
    environment = {"STEPS": "100000", "STEP_SECONDS": "0.5"}
    if backend == "k8s":
        manifests = spread(
            example_objects("torch/indexed-job.yaml", last_call_seconds=LAST_CALL_SECONDS, **environment)
        )
    else:
        manifests = c10d_objects(LAST_CALL_SECONDS, **environment)
    core = client.CoreV1Api(_api(cluster))
    first, trained = start_spread_job(cluster, namespace, manifests, rendezvous=backend == "k8s")
    victim = pod_zero_node(core, namespace, first)
    try:
        return fail_node_and_recover(cluster, namespace, first, trained, victim, window, replacement=backend == "k8s")
    finally:
        plane = cluster.plane
        plane.kubectl("-n", namespace, "delete", "job", RENDEZVOUS, "--wait=false", check=False)
        plane.kubectl("-n", namespace, "delete", "pods", "--all", "--grace-period=0", "--force", check=False)
        node_named(cluster, victim).recover()
        wait_until(lambda: not core.list_namespaced_pod(namespace).items, 120, "the pods gone")


@contextmanager
def three_node_cluster(workdir: Path, crds: bool = True) -> Iterator[Cluster]:
    """A control plane of its own with three real nodes and (with ``crds``) the CRDs applied, stopped afterwards (the
    benchmarks')."""
    from tests.testenv import ControlPlane

    plane = ControlPlane(workdir / "control-plane", with_node=True)
    plane.start()
    cluster = Cluster(plane, nodes=3)
    try:
        cluster.start()
        if crds:
            plane.kubectl("apply", "-f", str(REPO / "crds"))
            plane.wait_established("crd/rendezvouses.kube-rendezvous.io", "crd/rendezvouskeys.kube-rendezvous.io")
        yield cluster
    finally:
        cluster.stop()
        plane.stop()
