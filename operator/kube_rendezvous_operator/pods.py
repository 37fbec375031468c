"""The training-pod handlers: keep each Rendezvous's pod index current, and evict the nodes of its gone pods.

A pod is a Rendezvous's training pod when its ``spec.podSelector`` (or the default for its owner's
workload kind, ``handlers_rules.pod_selector``) selects it, or when it is labelled with the Rendezvous's name.
The pod watch evicts as pods go; a task per Rendezvous (``lifecycle``) resyncs it with its listed pods,
so pods deleted or ended while the operator was down or its watch was broken are noticed too.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

import kopf
from kube_rendezvous import RENDEZVOUS_LABEL, KubernetesApiError, NodeId, RendezvousDocument, format_time, with_evicted

from . import handlers_rules, metrics
from .lifecycle import stopped_within
from .memory import Key, OperatorMemo, evict_and_report, pods_changed
from .not_ready import evict_on_not_ready
from .writer import heartbeats, merge_heartbeats, with_lease_heartbeats

logger = logging.getLogger(__name__)

#: Seconds from first seeing a Rendezvous to its first resync.
FIRST_RESYNC_SECONDS = 1.0


def rendezvouses_of_pod(memo: OperatorMemo, labels: dict[str, str] | None, namespace: str | None) -> list[str]:
    """The Rendezvous objects of ``namespace`` whose training pod a pod with ``labels`` is."""
    selectors = {name: selector for (where, name), selector in list(memo.selectors.items()) if where == namespace}
    return handlers_rules.rendezvouses_of_pod(labels, selectors, RENDEZVOUS_LABEL)


def is_training_pod(labels: dict[str, str], namespace: str | None, memo: OperatorMemo, **_: Any) -> bool:
    """Kopf's filter for the pod watch: a pod some Rendezvous selects (or that names one)."""
    return bool(rendezvouses_of_pod(memo, labels, namespace))


def evict_nodes_of_gone_pods(
    type: str | None, body: kopf.Body, labels: dict[str, str], namespace: str, memo: OperatorMemo, **_: Any
) -> None:
    """When a training pod is deleted or its containers ended, evict its nodes from its rendezvous; when
    the kubelet restarted one of its containers, evict the nodes that stopped heartbeating before that.

    A pod is a Rendezvous's training pod when its ``spec.podSelector`` (or the default for its
    owner's workload kind, ``handlers_rules.pod_selector``) selects it, or when it is labelled with the
    Rendezvous's name.
    """
    pod = dict(body)
    gone = handlers_rules.pod_is_gone(pod, type)
    restarted = None if gone else handlers_rules.container_restarted_at(pod, datetime.now(timezone.utc))
    if not gone and restarted is None:
        return
    for rendezvous in rendezvouses_of_pod(memo, labels, namespace):
        if restarted is None:
            evict_nodes_of_pod(memo, pod, namespace, rendezvous)
        else:
            judge_restart(memo, pod, namespace, rendezvous, restarted)


def track_training_pod(
    type: str | None, body: kopf.Body, labels: dict[str, str], namespace: str, memo: OperatorMemo, **_: Any
) -> None:
    """Keep each Rendezvous's pod index current (the census its folder completes rounds by)."""
    pod = dict(body)
    uid = str(pod.get("metadata", {}).get("uid") or pod.get("metadata", {}).get("name"))

    def update(pods: dict[str, dict[str, Any]]) -> None:
        if type == "DELETED":
            pods.pop(uid, None)
        else:
            pods[uid] = pod

    for rendezvous in rendezvouses_of_pod(memo, labels, namespace):
        pods_changed(memo, (namespace, rendezvous), update)


def _open_document(memo: OperatorMemo, namespace: str, rendezvous: str) -> RendezvousDocument | None:
    """The stored document of ``rendezvous`` when its nodes may be evicted (seen, valid, not closed)."""
    observed, stored = memo.observed.get((namespace, rendezvous)), memo.states.get((namespace, rendezvous))
    if observed is None or stored is None or stored.document is None:
        return None
    if observed.status.get("closed") or stored.document.closed:
        return None
    return stored.document


def evict_nodes_of_pod(memo: OperatorMemo, pod: dict[str, Any], namespace: str, rendezvous: str) -> None:
    """Evict the nodes the gone ``pod`` ran from ``rendezvous`` (not nodes alive after its end)."""
    stored = _open_document(memo, namespace, rendezvous)
    if stored is None:
        return

    gone_at = handlers_rules.pod_gone_at(pod, datetime.now(timezone.utc))
    known = handlers_rules.known_nodes(stored)
    document = with_lease_heartbeats(memo.api, stored, namespace, rendezvous)
    matched = handlers_rules.nodes_of_pod(pod, known, document=document, gone_at=gone_at)
    alive = sorted(set(handlers_rules.nodes_of_pod(pod, known)) - set(matched))
    if alive:
        logger.info(
            "pod %s/%s is gone, but nodes %s on its address heartbeat after its end: they are another pod's; "
            "not evicted",
            namespace,
            pod["metadata"]["name"],
            ", ".join(str(node) for node in alive),
        )
    evict_and_report(
        memo, namespace, rendezvous, [str(node) for node in matched], f"pod {pod['metadata']['name']} is gone"
    )


def judge_restart(
    memo: OperatorMemo, pod: dict[str, Any], namespace: str, rendezvous: str, restarted_at: datetime
) -> None:
    """Evict from ``rendezvous`` the nodes of ``pod`` whose agent died when the kubelet restarted its
    container at ``restarted_at`` (their Lease's last heartbeat is older), once per restart.

    Nothing is judged without the Leases' heartbeats: a failed Lease list leaves the restart to the
    pod's next event (else the heartbeat expiry evicts). A node with no heartbeat on record may be
    the restarted container's new agent: it is never evicted here. A restart is judged again only
    when its eviction was not written (the write failed).
    """
    judged = ((namespace, rendezvous), str(pod["metadata"].get("uid") or pod["metadata"]["name"]))
    stored = _open_document(memo, namespace, rendezvous)
    if stored is None or memo.judged_restarts.get(judged) == restarted_at:
        return

    try:
        beats = heartbeats(memo.api, namespace, rendezvous)
    except KubernetesApiError as exc:
        logger.info(
            "restart of pod %s/%s not judged yet: its Leases could not be read (%s)",
            namespace,
            pod["metadata"]["name"],
            exc,
        )
        return
    document = merge_heartbeats(stored, beats)
    matched = handlers_rules.nodes_of_pod(
        pod, handlers_rules.known_nodes(stored), document=document, gone_at=restarted_at
    )
    nodes = [str(node) for node in matched if document.last_heartbeats.get(node) is not None]
    because = f"a container of pod {pod['metadata']['name']} ended at {format_time(restarted_at)} and restarted"
    observed = memo.observed.get((namespace, rendezvous))
    evict_and_report(memo, namespace, rendezvous, nodes, because)
    if not nodes or (observed is not None and with_evicted(observed.status, nodes) is None):
        now = datetime.now(timezone.utc)
        for key, at in list(memo.judged_restarts.items()):
            if now - at > handlers_rules.RESTART_EVICTION_WINDOW:
                memo.judged_restarts.pop(key, None)
        memo.judged_restarts[judged] = restarted_at


async def resync_periodically(memo: OperatorMemo, key: Key, stopped: asyncio.Event) -> None:
    """``resync_pods`` of ``key`` every ``--resync-seconds`` (the first ``FIRST_RESYNC_SECONDS`` after it was
    seen), in a worker thread, until ``stopped``."""
    delay = FIRST_RESYNC_SECONDS
    while not await stopped_within(stopped, delay):
        await asyncio.to_thread(resync_pods, memo, key, stopped)
        metrics.RESYNCS.inc()
        delay = memo.config.resync_seconds


def resync_pods(memo: OperatorMemo, key: Key, stopped: asyncio.Event) -> None:
    """Evict what the pod watch missed: nodes of pods deleted or ended while the operator was down.

    Lists the Rendezvous's training pods (one LIST per interval, no write unless a node is
    evicted) and evicts the nodes ``handlers_rules.nodes_to_evict_on_resync`` finds: those of gone pods,
    and those without any pod while the others are recognised by their pods. Then, with the
    same pods and heartbeats, the nodes of pods on a Kubernetes Node NotReady past its grace
    (``not_ready.evict_on_not_ready``), so that rule holds after a restart or a missed Node event too.
    Once ``stopped`` (the Rendezvous was deleted) it keeps nothing of what it listed.
    """
    namespace, name = key
    observed = memo.observed.get(key)
    status = dict(observed.status if observed is not None else {})
    if status.get("closed"):
        return
    selector = memo.selectors.get(key) or handlers_rules.PodSelector({RENDEZVOUS_LABEL: name}, "default")
    selectors = [selector.describe()]
    if selector.match_labels != {RENDEZVOUS_LABEL: name}:
        selectors.append(f"{RENDEZVOUS_LABEL}={name}")  # pods labelled with its name are its pods too
    pods: dict[str, dict[str, Any]] = {}
    try:
        for label_selector in selectors:
            listed = memo.api.request(
                "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": label_selector}
            )
            for pod in listed.get("items") or []:
                pods[pod["metadata"].get("uid") or pod["metadata"]["name"]] = pod
    except KubernetesApiError as exc:
        metrics.RECONCILE_ERRORS.labels(handler="resync").inc()
        logger.warning("could not list the pods of rendezvous %s/%s: %s", namespace, name, exc)
        return
    with memo.pods_lock:
        if stopped.is_set():
            return  # forgotten (``OperatorMemo.forget`` takes this lock after the flag is set)
        memo.pods[key] = dict(pods)
    pods_changed(memo, key, lambda _: None)
    document = handlers_rules.read_state(status.get("state"), memo.states.get(key)).document
    if document is None or document.closed:
        return

    try:
        beats: dict[NodeId, datetime] | None = heartbeats(memo.api, namespace, name)
    except KubernetesApiError:
        beats = None
    now = datetime.now(timezone.utc)
    nodes = handlers_rules.nodes_to_evict_on_resync(merge_heartbeats(document, beats or {}), pods.values(), now)
    already = set(status.get("evictedNodes") or [])
    evicting = [str(node) for node in nodes if str(node) not in already]
    evict_and_report(memo, namespace, name, evicting, "pod gone (resync)")
    if beats is not None and not stopped.is_set():  # never judge a NotReady node's agents without their heartbeats
        evict_on_not_ready(memo, key, pods.values(), merge_heartbeats(document, beats, every_node=True))
