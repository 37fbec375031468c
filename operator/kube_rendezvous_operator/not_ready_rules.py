"""What the NotReady-node rule decides, as pure functions: which Kubernetes Nodes are NotReady, since
when, how long the rule waits, and which rendezvous nodes of the pods on such a Node it evicts.

Nothing here does I/O: ``nodes`` feeds it Node objects and ``not_ready`` the training pods and the
state document; they act on the answers. How pods and heartbeats are matched is ``pods_rules``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import NodeId, RendezvousDocument, parse_time

from .pods_rules import HEARTBEAT_SLACK, known_nodes, nodes_of_pod, pod_is_gone

#: How late after its previous one a live agent's Lease renewal may still be stamped, beyond its
#: keep-alive interval (the renewer polls every 0.5 s at most; a renewal takes a round trip).
RENEWAL_MARGIN = timedelta(seconds=1)


def node_ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``Ready`` condition of a Kubernetes Node, or None when it has none (a node not yet reported)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return next(
        (item for item in conditions if isinstance(item, Mapping) and item.get("type") == "Ready"),
        None,
    )


def node_not_ready_since(node: Mapping[str, Any], seen: datetime | None = None) -> datetime | None:
    """Since when a Kubernetes Node is NotReady: its ``Ready`` condition's ``lastTransitionTime``.

    NotReady is ``Ready`` ``False`` (the kubelet says so) or ``Unknown`` (the node-lifecycle
    controller's verdict when the kubelet went silent). None when the node is Ready, or has no
    ``Ready`` condition at all. A NotReady condition without a readable ``lastTransitionTime``
    counts from ``seen`` (when the caller first saw it NotReady), or is None without one.
    """
    ready = node_ready_condition(node)
    if ready is None or ready.get("status") not in ("False", "Unknown"):
        return None
    try:
        return parse_time(str(ready["lastTransitionTime"]))
    except (KeyError, TypeError, ValueError):
        return seen


def not_ready_wait(grace: timedelta, keep_alive_interval: float) -> timedelta:
    """How long after a node went NotReady its pods' rendezvous nodes may be evicted.

    ``grace`` (the operator's ``--node-not-ready-seconds``), but never less than one keep-alive
    after the ``HEARTBEAT_SLACK`` past the transition: by then a live agent on that node has
    stamped a heartbeat later than the transition plus the slack, so ``nodes_of_pod`` spares it.
    """
    return max(grace, timedelta(seconds=keep_alive_interval) + HEARTBEAT_SLACK + RENEWAL_MARGIN)


def pods_on_not_ready_nodes(
    pods: Iterable[dict[str, Any]], not_ready: Mapping[str, datetime], now: datetime, wait: timedelta
) -> dict[str, list[dict[str, Any]]]:
    """The training pods on each Kubernetes node NotReady for ``wait`` or more by ``now``, by node name.

    ``not_ready`` maps node names to when they went NotReady (``node_not_ready_since``). Pods that
    are gone already are left to the pod rule (``pod_is_gone``); pods not bound to a node are left out.
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        since = not_ready.get(node) if isinstance(node, str) else None
        if since is None or now - since < wait or pod_is_gone(pod, None):
            continue
        found.setdefault(str(node), []).append(pod)
    return found


def nodes_on_not_ready_node(
    pods: Iterable[dict[str, Any]], document: RendezvousDocument, since: datetime
) -> tuple[list[NodeId], list[NodeId]]:
    """(to evict, alive) among the rendezvous nodes of ``pods``, all on one node NotReady ``since``.

    A node is evicted only if its last heartbeat is no later than ``since`` plus
    ``HEARTBEAT_SLACK`` (``nodes_of_pod`` with ``gone_at=since``): an agent that still heartbeats
    on a NotReady node (only its kubelet failed) is alive, and is listed as such instead.
    """
    known = known_nodes(document)
    evict: set[NodeId] = set()
    matched: set[NodeId] = set()
    for pod in pods:
        matched.update(nodes_of_pod(pod, known))
        evict.update(nodes_of_pod(pod, known, document=document, gone_at=since))
    return sorted(evict, key=str), sorted(matched - evict, key=str)
