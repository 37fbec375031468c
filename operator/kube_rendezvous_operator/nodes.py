"""Which Kubernetes Nodes are NotReady, and since when: a lean list-then-watch of Nodes, in one thread.

The operator evicts the rendezvous nodes of training pods on a Node NotReady for its grace
(``not_ready.evict_on_not_ready_nodes``); this module only tells it which Nodes are NotReady.

It keeps no Node object: of each event it keeps the Ready condition's status and
``lastTransitionTime`` (``not_ready_logic.node_not_ready_since``), for NotReady Nodes only, so its memory
grows with the NotReady Nodes, not with the cluster (a Node object is tens of kilobytes, and
``watchcache.WatchCache`` keeps whole objects).

Not Kopf's watch: Kopf retries a watch the server refuses (403) a few times and then stops the
whole operator. Nodes are cluster-scoped, so reading them needs a ClusterRole even when the
operator watches named namespaces; when it is missing this logs one warning naming the
permission, the operator goes on without the rule, and Nodes are tried again every
``FORBIDDEN_RETRY_SECONDS`` (a permission granted later is picked up without a restart).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kube_rendezvous.kubeapi import (
    ApiError,
    ApiUnavailableError,
    ForbiddenError,
    GoneError,
    KubernetesApi,
    backoff,
)

from . import not_ready_logic

logger = logging.getLogger(__name__)

NODES_PATH = "/api/v1/nodes"
#: Seconds a watch of the Nodes lasts before the server ends it and it is renewed (jittered down by up to a quarter).
WATCH_SECONDS = 60
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


class NodeReadiness:
    """The NotReady Nodes of the cluster, by name, kept current by a watch thread."""

    def __init__(self, api: KubernetesApi, on_change: Callable[[], object] | None = None) -> None:
        """``on_change`` is called (from the watch thread, quickly) whenever the NotReady set may have changed."""
        self._api = api
        self._on_change = on_change
        self._not_ready: dict[str, NotReady] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        #: None until the Nodes were listed once; False while the server refuses to list them.
        self.readable: bool | None = None
        self._warned = False

    def start(self) -> NodeReadiness:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="watch Kubernetes Nodes", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; a read blocked on the server is ended at once."""
        self._stopped.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception as exc:  # noqa: BLE001 - a response that is already closed
                logger.debug("interrupting the watch of Nodes: %s", exc)

    def not_ready(self) -> dict[str, NotReady]:
        """The NotReady Nodes now (empty while they cannot be read)."""
        with self._lock:
            return dict(self._not_ready)

    def observe(self, node: dict[str, Any], deleted: bool = False) -> None:
        """Take one Node (from a list or a watch event) into account."""
        name = (node.get("metadata") or {}).get("name")
        if not name:
            return
        ready = not_ready_logic.node_ready_condition(node)
        with self._lock:
            previous = self._not_ready.get(name)
            since = (
                None if deleted else not_ready_logic.node_not_ready_since(node, previous.since if previous else _now())
            )
            if since is None or ready is None:
                self._not_ready.pop(name, None)
                changed = previous is not None
            else:
                current = NotReady(str(ready.get("status")), since)
                self._not_ready[name] = current
                changed = current != previous
        if changed:
            if since is not None and ready is not None:
                logger.info("Kubernetes node %s is NotReady (Ready=%s) since %s", name, ready.get("status"), since)
            elif previous is not None:
                logger.info("Kubernetes node %s is %s", name, "gone" if deleted else "Ready again")
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _list(self) -> str:
        listed = self._api.request("GET", NODES_PATH, query={"resourceVersion": "0"})
        previous = self.not_ready()
        current: dict[str, NotReady] = {}
        for item in listed.get("items") or []:
            name = (item.get("metadata") or {}).get("name")
            ready = not_ready_logic.node_ready_condition(item)
            since = not_ready_logic.node_not_ready_since(item, previous[name].since if name in previous else _now())
            if name and ready is not None and since is not None:
                current[str(name)] = NotReady(str(ready.get("status")), since)
        with self._lock:
            self._not_ready = current
        if self.readable is False:
            logger.info("the operator may read Kubernetes Nodes now: pods on NotReady nodes are evicted again")
        self.readable = True
        self._changed()
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _hold(self, response: Any) -> None:
        self._response = response
        if self._stopped.is_set():
            response.shutdown()

    def _refused(self, exc: ForbiddenError) -> None:
        self.readable = False
        with self._lock:
            had = bool(self._not_ready)
            self._not_ready.clear()
        if had:
            self._changed()
        if not self._warned:
            self._warned = True
            logger.warning(
                "the operator may not read Kubernetes Nodes (%s): its ServiceAccount needs %s; "
                "until it has it, the nodes of training pods on a NotReady node are not evicted early, "
                "only when their heartbeats expire. Trying again every %g s",
                exc.message,
                PERMISSION,
                FORBIDDEN_RETRY_SECONDS,
            )

    def _run(self) -> None:
        failures = 0
        resource_version: str | None = None
        while not self._stopped.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                for event in self._api.watch(
                    NODES_PATH,
                    query={"resourceVersion": resource_version},
                    timeout_seconds=int(WATCH_SECONDS * random.uniform(0.75, 1.0)),
                    on_response=self._hold,
                ):
                    node = event.get("object") or {}
                    resource_version = (node.get("metadata") or {}).get("resourceVersion") or resource_version
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.observe(node, deleted=event.get("type") == "DELETED")
                    if self._stopped.is_set():
                        return
                failures = 0
            except GoneError:
                resource_version = None
            except ForbiddenError as exc:
                resource_version = None
                if exc.transient:  # a permission the server granted before: RBAC caches syncing
                    failures += 1
                else:
                    self._refused(exc)
                    self._stopped.wait(FORBIDDEN_RETRY_SECONDS)
                    continue
            except (ApiError, ApiUnavailableError) as exc:
                if self._stopped.is_set():
                    return
                failures += 1
                logger.info("watch of Kubernetes Nodes interrupted (%s); listing again", exc)
                resource_version = None
            except Exception:  # this thread must outlive a malformed object
                failures += 1
                logger.exception("watch of Kubernetes Nodes failed; listing again")
                resource_version = None
            finally:
                self._response = None
            if failures:
                self._stopped.wait(backoff(failures + 1, 0.2, 5.0, floor=0.5))


def _now() -> datetime:
    return datetime.now(timezone.utc)


__all__ = ["FORBIDDEN_RETRY_SECONDS", "PERMISSION", "NodeReadiness", "NotReady"]
