"""What the rules read of the Kubernetes Nodes: which are NotReady and since when, and each Node's labels,
cordon, NoExecute taints and True conditions (``placement.NodeFacts``). A ``watchcache.WatchCache`` that keeps little.

The operator evicts the rendezvous nodes of training pods on a Node NotReady for its grace
(``not_ready.evict_on_not_ready_nodes``), ranks a round's members by their Nodes' topology labels and
holds back nodes whose Node does not admit them (``placement``); this module only tells it about the Nodes.

It keeps no Node object: its cache's ``keep`` takes of each Node its ``NodeFacts`` (labels, ``spec.unschedulable``,
taint keys and condition types: about a kilobyte) and, while NotReady, the Ready condition's status and
``lastTransitionTime`` (``not_ready_rules.node_not_ready_since``). A Node object is tens of kilobytes, and the
status updates that make most of its events change nothing kept, so they wake no one.

Not Kopf's watch: Kopf retries a watch the server refuses (403) a few times and then stops the
whole operator. Nodes are cluster-scoped, so reading them needs a ClusterRole even when the
operator watches named namespaces; when it is missing this logs one warning naming the
permission, the operator goes on without the rule, and Nodes are tried again every
``FORBIDDEN_RETRY_SECONDS`` (a permission granted later is picked up without a restart).

Not guaranteed: that a NotReady Node is known at once (the set is as late as the watch, and empty
while the Nodes cannot be read), nor the exact since of a condition without a ``lastTransitionTime``
(then when this process first saw it NotReady).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kube_rendezvous import KubernetesApi, NodeFacts, WatchCache, node_facts

from . import not_ready_rules

logger = logging.getLogger(__name__)

#: Seconds between two attempts to read the Nodes after the server refused to let the operator.
FORBIDDEN_RETRY_SECONDS = 300.0
#: What the operator's ServiceAccount needs for this rule (docs/operator-rbac.yaml).
PERMISSION = "get, list and watch on nodes (core API group, cluster-scoped: a ClusterRole)"


@dataclass(frozen=True)
class NotReady:
    """A Node's ``Ready`` condition while it is not True."""

    #: ``False`` (the kubelet says so) or ``Unknown`` (the node-lifecycle controller lost the kubelet).
    status: str
    #: The condition's ``lastTransitionTime`` (or when this operator first saw it NotReady).
    since: datetime


def _keep(node: dict[str, Any], kept: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the cache keeps of a Node: its ``NodeFacts``, and ``NotReady``'s fields while it is NotReady."""
    ready = not_ready_rules.node_ready_condition(node)
    seen = kept["since"] if kept and kept.get("since") else datetime.now(timezone.utc)
    since = not_ready_rules.node_not_ready_since(node, seen)
    not_ready = ready is not None and since is not None
    return {
        "facts": node_facts(node),
        "status": str(ready.get("status")) if not_ready and ready is not None else None,
        "since": since if not_ready else None,
    }


class NodeReadiness:
    """The NotReady Nodes of the cluster, by name, kept current by a watch thread."""

    def __init__(self, api: KubernetesApi, on_change: Callable[[], object] | None = None) -> None:
        """``on_change`` is called (from the watch thread, quickly) whenever the NotReady set may have changed."""
        self._on_change = on_change
        self._cache = WatchCache(
            api,
            "/api/v1/nodes",
            {"resourceVersion": "0"},  # lists from the API server's cache; the watch goes on from the list's version
            "Kubernetes Nodes",
            keep=_keep,
            refused_retry=FORBIDDEN_RETRY_SECONDS,
        )
        self._cache.add_listener(self._changed)
        self._warned = self._refused = False
        self._not_ready_names: set[str] = set()

    @property
    def readable(self) -> bool | None:
        """None until the Nodes were listed once; False while the server refuses to list them."""
        return False if not self._cache.supported else True if self._cache.epoch else None

    def start(self) -> NodeReadiness:
        self._cache.start()
        return self

    def stop(self) -> None:
        """Stop watching; a read blocked on the server is ended at once."""
        self._cache.stop()

    def not_ready(self) -> dict[str, NotReady]:
        """The NotReady Nodes now (empty while they cannot be read)."""
        return {
            name: NotReady(kept["status"], kept["since"])
            for name, kept in self._cache.objects().items()
            if kept.get("status") is not None
        }

    def facts(self) -> dict[str, NodeFacts]:
        """Every Node's ``NodeFacts`` by name (empty while the Nodes cannot be read)."""
        return {name: kept["facts"] for name, kept in self._cache.objects().items()}

    def observe(self, node: dict[str, Any], deleted: bool = False) -> None:
        """Take one Node into account as its watch event would (for tests)."""
        self._cache.apply_event("DELETED" if deleted else "MODIFIED", node)

    def _changed(self, node: dict[str, Any] | None) -> None:
        """The cache's listener: a NotReady Node changed (``node``), or all were listed or refused (None)."""
        if node is None:  # listed (or refused): every Node at once
            self._not_ready_names = set(self.not_ready())
        if node is not None:
            name = node["metadata"]["name"]
            kept = self._cache.get(name)
            was = name in self._not_ready_names
            if kept is not None and kept.get("status") is not None:
                self._not_ready_names.add(name)
                logger.info("Kubernetes node %s is NotReady (Ready=%s) since %s", name, kept["status"], kept["since"])
            elif kept is None:
                self._not_ready_names.discard(name)
                if was:
                    logger.info("Kubernetes node %s is gone", name)
            elif was:
                self._not_ready_names.discard(name)
                logger.info("Kubernetes node %s is Ready again", name)
        elif not self._cache.supported:
            self._refused = True
            if not self._warned:
                self._warned = True
                logger.warning(
                    "the operator may not read Kubernetes Nodes (%s): its ServiceAccount needs %s; "
                    "until it has it, the nodes of training pods on a NotReady node are not evicted early, "
                    "only when their heartbeats expire. Trying again every %g s",
                    getattr(self._cache.refused, "message", "refused"),
                    PERMISSION,
                    FORBIDDEN_RETRY_SECONDS,
                )
        elif self._refused:
            self._refused = False
            logger.info("the operator may read Kubernetes Nodes now: pods on NotReady nodes are evicted again")
        if self._on_change is not None:
            self._on_change()


__all__ = ["FORBIDDEN_RETRY_SECONDS", "PERMISSION", "NodeReadiness", "NotReady"]
