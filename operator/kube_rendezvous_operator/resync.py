"""The resync rule: a task per Rendezvous (``lifecycle``) lists its training pods every ``--resync-seconds``,
refreshes its pod index, and evicts what the pod watch missed: the nodes of pods deleted or ended while the
operator was down or its watch was broken. Its decisions are ``resync_rules``'s.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

from kube_rendezvous import RENDEZVOUS_LABEL, KubernetesApiError, NodeId

from . import conditions_rules, metrics, pods_rules, resync_rules
from .evictions import evict_and_report
from .lifecycle import stopped_within
from .memory import Key, OperatorMemo
from .not_ready import evict_on_not_ready
from .pods import pods_changed
from .writer import heartbeats
from .writer_rules import merge_heartbeats

logger = logging.getLogger(__name__)

#: Seconds from first seeing a Rendezvous to its first resync.
FIRST_RESYNC_SECONDS = 1.0


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
    evicted) and evicts the nodes ``resync_rules.nodes_to_evict_on_resync`` finds: those of gone pods,
    and those without any pod while the others are recognised by their pods. Then, with the
    same pods and heartbeats, the nodes of pods on a Kubernetes Node NotReady past its grace
    (``not_ready.evict_on_not_ready``), so that rule holds after a restart or a missed Node event too.
    Once ``stopped`` (the Rendezvous was deleted) it keeps nothing of what it listed.
    """
    namespace, name = key
    record = memo.get(key)
    observed = record.observed if record is not None else None
    status = dict(observed.status if observed is not None else {})
    if status.get("closed"):
        return
    selector = (record.selector if record is not None else None) or pods_rules.PodSelector(
        {RENDEZVOUS_LABEL: name}, "default"
    )
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
    with memo.lock:
        record = memo.records.get(key)
        if stopped.is_set() or record is None:
            return  # forgotten (``OperatorMemo.forget`` takes this lock after the flag is set)
        record.pods = dict(pods)
        state = record.state
    pods_changed(memo, key, lambda _: None)
    document = conditions_rules.read_state(status.get("state"), state).document
    if document is None or document.closed:
        return

    try:
        beats: dict[NodeId, datetime] | None = heartbeats(memo.api, namespace, name)
    except KubernetesApiError:
        beats = None
    now = datetime.now(timezone.utc)
    nodes = resync_rules.nodes_to_evict_on_resync(merge_heartbeats(document, beats or {}), pods.values(), now)
    already = set(status.get("evictedNodes") or [])
    evicting = [str(node) for node in nodes if str(node) not in already]
    evict_and_report(memo, namespace, name, evicting, "pod gone (resync)")
    if beats is not None and not stopped.is_set():  # never judge a NotReady node's agents without their heartbeats
        evict_on_not_ready(memo, key, pods.values(), merge_heartbeats(document, beats, every_node=True))
