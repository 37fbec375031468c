"""Which Kubernetes Nodes are NotReady, and since when: a ``watchcache.WatchCache`` of Nodes that keeps little.

The operator evicts the rendezvous nodes of training pods on a Node NotReady for its grace
(``not_ready.evict_on_not_ready_nodes``); this module only tells it which Nodes are NotReady.

It keeps no Node object: its cache's ``keep`` takes of each Node the Ready condition's status and
``lastTransitionTime`` (``not_ready_rules.node_not_ready_since``), for NotReady Nodes only, so its memory
grows with the NotReady Nodes, not with the cluster (a Node object is tens of kilobytes).

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

from kube_rendezvous import KubernetesApi, WatchCache

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
    """What the cache keeps of a Node: ``NotReady``'s fields while it is NotReady, else nothing."""
    ready = not_ready_rules.node_ready_condition(node)
    since = not_ready_rules.node_not_ready_since(node, kept["since"] if kept else datetime.now(timezone.utc))
    return None if ready is None or since is None else {"status": str(ready.get("status")), "since": since}


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
        return {name: NotReady(**kept) for name, kept in self._cache.objects().items()}

    def observe(self, node: dict[str, Any], deleted: bool = False) -> None:
        """Take one Node into account as its watch event would (for tests)."""
        self._cache.apply_event("DELETED" if deleted else "MODIFIED", node)

    def _changed(self, node: dict[str, Any] | None) -> None:
        """The cache's listener: a NotReady Node changed (``node``), or all were listed or refused (None)."""
        if node is not None:
            name = node["metadata"]["name"]
            kept = self._cache.get(name)
            if kept is not None:
                logger.info("Kubernetes node %s is NotReady (Ready=%s) since %s", name, kept["status"], kept["since"])
            else:  # what is kept is gone: a NotReady node was deleted, or is Ready again
                logger.info("Kubernetes node %s is %s", name, "gone" if _keep(node, None) else "Ready again")
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
