"""The gone-pod rule: when a training pod is deleted or its containers ended, evict its nodes from its rendezvous.

Its decisions are ``gone_pods_rules``'s (and ``pods_rules``'s: which pods are gone, since when). The pod watch
evicts as pods go; ``resync`` notices the pods that went while the operator was down or its watch was broken.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import kopf

from . import gone_pods_rules, pods_rules
from .evictions import evict_and_report, open_document
from .memory import OperatorMemo
from .pods import rendezvouses_of_pod
from .writer import with_lease_heartbeats

logger = logging.getLogger(__name__)


def evict_nodes_of_gone_pods(
    type: str | None, body: kopf.Body, labels: dict[str, str], namespace: str, memo: OperatorMemo, **_: Any
) -> None:
    """When a training pod is deleted or its containers ended, evict its nodes from its rendezvous."""
    pod = dict(body)
    why = pods_rules.why_gone(pod, type)
    if why is None:
        return
    for rendezvous in rendezvouses_of_pod(memo, labels, namespace):
        evict_nodes_of_pod(memo, pod, namespace, rendezvous, why)


def evict_nodes_of_pod(memo: OperatorMemo, pod: dict[str, Any], namespace: str, rendezvous: str, why: str) -> None:
    """Evict the nodes the gone ``pod`` ran from ``rendezvous`` (not nodes alive after its end); the Events say
    the pod ``why`` (``pods_rules.why_gone``)."""
    stored = open_document(memo, (namespace, rendezvous))
    if stored is None:
        return

    now = datetime.now(timezone.utc)
    document = with_lease_heartbeats(memo.api, stored, namespace, rendezvous)
    matched, alive = gone_pods_rules.nodes_of_gone_pod(pod, stored, document, now)
    if alive:
        logger.info(
            "pod %s/%s %s, but nodes %s on its address heartbeat after its end: they are another pod's; not evicted",
            namespace,
            pod["metadata"]["name"],
            why,
            ", ".join(str(node) for node in alive),
        )
    evict_and_report(
        memo, namespace, rendezvous, [str(node) for node in matched], f"pod {pod['metadata']['name']} {why}", pod
    )
