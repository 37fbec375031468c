"""The operator's evictions: add nodes to a Rendezvous's ``status.evictedNodes`` and tell it (``NodeEvicted``).

Every rule that evicts (``gone_pods``, ``restarts``, ``resync``, ``not_ready``) decides which nodes in its own
``_rules`` module and writes them through ``evict_and_report``: one compare-and-swap with backoff
(``add_evictions``), the eviction counted, and one Event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from kube_rendezvous import (
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    RendezvousDocument,
    with_evicted,
)
from kube_rendezvous import add_evictions as evict

from . import events, events_rules, metrics
from .memory import Key, OperatorMemo

logger = logging.getLogger(__name__)

#: Seconds an eviction keeps trying while the API server does not answer.
EVICT_SECONDS = 30.0


def open_document(memo: OperatorMemo, key: Key) -> RendezvousDocument | None:
    """The stored document of Rendezvous ``key`` when its nodes may be evicted (seen, valid, not closed)."""
    record = memo.get(key)
    if record is None or record.observed is None or record.state is None or record.state.document is None:
        return None
    if record.observed.status.get("closed") or record.state.document.closed:
        return None
    return record.state.document


def add_evictions(client: KubernetesApi, namespace: str, name: str, nodes: list[str]) -> list[str] | None:
    """Add ``nodes`` to ``status.evictedNodes`` (``status.add_evictions``: compare-and-swap with backoff).

    Returns the list written, or None when there was nothing to add, the Rendezvous is gone, or
    the write failed (logged; the event handler is not retried, so it must not raise).
    """
    try:
        _, evicted = evict(
            client,
            namespace,
            name,
            nodes,
            deadline=time.monotonic() + EVICT_SECONDS,
            on_conflict=metrics.WRITE_CONFLICTS.inc,
        )
    except NotFoundError:
        return None
    except KubernetesApiError as exc:
        metrics.RECONCILE_ERRORS.labels(handler="evict").inc()
        logger.warning("could not evict %s from %s/%s: %s", nodes, namespace, name, exc)
        return None
    if evicted is not None:
        metrics.OPERATOR_WRITES.labels(kind="evict").inc()
    return evicted


def evict_and_report(
    memo: OperatorMemo,
    namespace: str,
    rendezvous: str,
    nodes: list[str],
    because: str,
    pod: Mapping[str, Any] | None = None,
) -> bool:
    """Evict ``nodes`` from ``rendezvous`` (unless all are evicted already), count them and post NodeEvicted on
    it, and on ``pod`` (the pod the nodes ran in, when one rule knows it) and that pod's workload.

    Returns whether anything was written.
    """
    record = memo.get((namespace, rendezvous))
    observed = record.observed if record is not None else None
    if not nodes or (observed is not None and with_evicted(observed.status, nodes) is None):
        return False
    evicted = add_evictions(memo.api, namespace, rendezvous, nodes)
    if evicted is None:
        return False
    if observed is not None:
        observed.status["evictedNodes"] = evicted
    metrics.EVICTIONS.labels(namespace=namespace, name=rendezvous).inc(len(nodes))
    logger.info("evicted %s from rendezvous %s/%s: %s", nodes, namespace, rendezvous, because)
    listed = events_rules.RendezvousEvent("Normal", "NodeEvicted", f"evicted {', '.join(nodes)}: {because}")
    if not events.post_on_rendezvous(memo.api, namespace, rendezvous, listed):
        return True
    if pod is not None:
        told = events_rules.pod_eviction_event(namespace, rendezvous, nodes, pod, because)
        events.post_on_related(events_rules.told_on(pod), told)
    return True
