"""Topology-aware ranks, hot spares and admission on the three nodes of ``tests.testenv.cluster``.

Used by ``tests/test_multi_node.py`` (each case once, asserted) and ``benchmarks/multi_node.py`` (spare vs no
spare, every repeat). The nodes get a rack label (``RACKS``) whose order is not the order of their pod
addresses, so ranks by topology differ from ranks by address: node-2's pod ranks first.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from tests.e2e.multi_node import Placement, _api, placement, spread
from tests.e2e.real_pods import (
    RENDEZVOUS,
    REPO,
    apply,
    example_objects,
    pod_log,
    rendezvous_status,
    training_pods,
    worker_rounds,
)
from tests.testenv import wait_until
from tests.testenv.cluster import Cluster

#: The Node label the tests rank by, and each node's value: address order is node-1, node-2, node-3.
RACK = "kube-rendezvous.io/test-rack"
RACKS = {"node-1": "r2", "node-2": "r1", "node-3": "r2"}
INIT_LINE = re.compile(r"group_rank (\d+) restart \d+: init_process_group world (\d+)")


@contextmanager
def racks(cluster: Cluster) -> Iterator[None]:
    """The nodes labelled with ``RACKS`` (and uncordoned) while the block runs."""
    plane = cluster.plane
    for name, rack in RACKS.items():
        plane.kubectl("label", "node", name, f"{RACK}={rack}", "--overwrite")
    try:
        yield
    finally:
        for name in RACKS:
            plane.kubectl("uncordon", name, check=False)
            plane.kubectl("label", "node", name, f"{RACK}-", check=False)


def ranked_by_rack(
    objects: list[dict[str, Any]], *, min_nodes: int | None = None, max_nodes: int | None = None
) -> list[dict[str, Any]]:
    """``objects`` with the Rendezvous ranking by ``RACK`` (``spec.topology.keys``), and, when given, its and the
    launcher's min and max nodes (``--nnodes``)."""
    for item in objects:
        if item["kind"] == "Rendezvous":
            item["spec"]["topology"] = {"keys": [RACK]}
            if min_nodes is not None and max_nodes is not None:
                item["spec"].update(minNodes=min_nodes, maxNodes=max_nodes)
        elif item["kind"] == "Job" and min_nodes is not None:
            container = item["spec"]["template"]["spec"]["containers"][0]
            container["args"] = [
                f"--nnodes={min_nodes}:{max_nodes}" if arg.startswith("--nnodes=") else arg for arg in container["args"]
            ]
    return objects


def member_ranks(status: dict[str, Any]) -> dict[str, int]:
    """Each participant's address and rank (``status.participants``)."""
    return {item["node"].rsplit("_", 2)[0]: item["rank"] for item in status.get("participants") or []}


def rack_order(pods: dict[str, tuple[str, str]]) -> dict[str, int]:
    """The ranks topology gives ``pods`` (name -> (address, node)): by rack, then address; by address."""
    ordered = sorted(pods.values(), key=lambda item: (RACKS[item[1]], item[0]))
    return {address: rank for rank, (address, _) in enumerate(ordered)}


def group_ranks(cluster: Cluster, namespace: str, pods: list[str], world: int) -> dict[str, int] | None:
    """Each pod's group rank in its workers' last start in a world of ``world`` (None until every pod has one)."""
    found: dict[str, int] = {}
    for pod in pods:
        starts = [m for line in pod_log(cluster.node, namespace, pod) if (m := INIT_LINE.search(line))]
        if not starts or int(starts[-1].group(2)) != world:
            return None
        found[pod] = int(starts[-1].group(1))
    return found


def pinned_training_pod(job: dict[str, Any], job_uid: str, name: str, node: str) -> dict[str, Any]:
    """A training pod of ``job``'s template bound to ``node`` (``spec.nodeName``: no scheduler, so a cordon does not
    keep it off), labelled only with the Rendezvous (the Job controller does not adopt it)."""
    pod = copy.deepcopy(job["spec"]["template"]["spec"])
    pod.pop("topologySpreadConstraints", None)
    pod["nodeName"] = node
    container = pod["containers"][0]
    container["env"] = [
        {"name": "JOB_UID", "value": job_uid} if item["name"] == "JOB_UID" else item for item in container["env"]
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"kube-rendezvous.io/rendezvous": RENDEZVOUS}},
        "spec": pod,
    }


def rdzv_status_text(cluster: Cluster, namespace: str) -> str:
    """What ``kubectl rdzv status`` prints (the plugin found on PATH, as users run it)."""
    plugin = REPO / ".venv" / "bin"
    environment = dict(
        os.environ,
        PATH=f"{plugin}{os.pathsep}{os.environ.get('PATH', '')}",
        KUBECONFIG=str(cluster.plane.admin_kubeconfig),
    )
    result = subprocess.run(
        [str(cluster.plane.binaries.kubectl), "rdzv", "-n", namespace, "status", RENDEZVOUS],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def events(core: client.CoreV1Api, namespace: str, reason: str) -> list[str]:
    return [item.message for item in core.list_namespaced_event(namespace, field_selector=f"reason={reason}").items]


@dataclass
class SpareRecovery:
    """A member pod deleted while a spare waits: seconds from the deletion."""

    #: The round formed again at full size (``maxNodes``).
    formed: float | None = None
    #: Every member of the new round trained a step in it.
    training: float | None = None
    #: The Job's replacement pod Running (it joins as the new spare, or as a member without a spare).
    replacement_running: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def spare_objects(spares: int, launcher: str = "torch/indexed-job.yaml") -> list[dict[str, Any]]:
    """The example Job of ``launcher``, 3 pods spread one per node, ranked by ``RACK``: with ``spares`` 1 a round
    takes 2 (``--nnodes=1:2``) and the third pod waits as a spare; with 0 a round takes all 3 (``--nnodes=1:3``)."""
    objects = spread(example_objects(launcher, last_call_seconds=10, STEPS="100000", STEP_SECONDS="0.5"))
    return ranked_by_rack(objects, min_nodes=1, max_nodes=3 - spares)


def spare_recovery(
    cluster: Cluster, namespace: str, spares: int, launcher: str = "torch/indexed-job.yaml"
) -> SpareRecovery:
    """Start the job of ``spare_objects``, delete the member pod of rank 0 once the round trains, and time the
    recovery to full size. The operator must run (it evicts; without it the agent's leave alone says it)."""
    api = _api(cluster)
    core, objects_api = client.CoreV1Api(api), client.CustomObjectsApi(api)
    full = 3 - spares
    apply(cluster.node, namespace, spare_objects(spares, launcher))
    first: Placement = wait_until(lambda: placement(core, namespace), 180, "3 training pods Running on 3 nodes")
    by_address = {address: pod for pod, (address, _) in first.pods.items()}

    def formed(after_round: int = -1, spare_count: int | None = spares) -> dict[str, Any] | None:
        status = rendezvous_status(objects_api, namespace)
        full_round = status.get("phase") == "Complete" and status.get("participantCount") == full
        later = status.get("round", -1) > after_round
        return status if full_round and later and spare_count in (None, status.get("spareCount")) else None

    status = wait_until(formed, 120, f"a round of {full} with {spares} spare")
    members = [by_address[address] for address in member_ranks(status)]
    wait_until(lambda: group_ranks(cluster, namespace, members, full), 120, f"the members training with {full}")
    recovery = SpareRecovery()
    recovery.details.update(round_before=status["round"], ranks_before=member_ranks(status), pods=first.pods)
    recovery.details["spares_before"] = [node.rsplit("_", 2)[0] for node in status.get("spares") or []]
    victim = next(pod for pod in members if member_ranks(status)[first.pods[pod][0]] == 0)
    recovery.details["victim"] = victim
    trained_before = {pod: worker_rounds(cluster.node, namespace, pod, full) for pod in first.pods}
    since, since_wall = time.monotonic(), time.time()
    cluster.plane.kubectl("-n", namespace, "delete", "pod", victim, "--wait=false")
    after = wait_until(lambda: formed(status["round"], None), 90, f"a round of {full} again")
    recovery.formed = time.monotonic() - since
    recovery.details["round_after"] = after["round"]
    recovery.details["ranks_after"] = member_ranks(after)
    current = {pod.status.pod_ip: pod.metadata.name for pod in training_pods(core, namespace) if pod.status.pod_ip}
    new_members = [current.get(address) or by_address.get(address) or address for address in member_ranks(after)]
    recovery.details["members_after"] = new_members

    def trained_again() -> bool:
        return all(
            worker_rounds(cluster.node, namespace, pod, full) > trained_before.get(pod, 0) for pod in new_members
        )

    wait_until(trained_again, 90, f"the new round's members training with {full}")
    recovery.training = time.monotonic() - since
    replacement = wait_until(
        lambda: placement(core, namespace, exclude=frozenset({victim}), nodes=3), 120, "the Job's replacement Running"
    )
    new_pods = sorted(set(replacement.pods) - set(first.pods))
    started = [
        state.running.started_at.timestamp()
        for pod in new_pods
        for item in core.read_namespaced_pod(pod, namespace).status.container_statuses or []
        if (state := item.state) is not None and state.running is not None and state.running.started_at is not None
    ]  # the container's start, as its kubelet recorded it (seconds precision), not when this wait noticed
    recovery.replacement_running = max(started) - since_wall if started else time.monotonic() - since
    recovery.details["replacement"] = new_pods
    recovery.details["placement_after"] = replacement.pods
    return recovery
