"""The operator's memory (``OperatorMemo``) and its writes to a Rendezvous: what the handler modules share.

Kopf hands every handler the memo; ``handlers`` (the Rendezvous handlers and ``register``), ``pods``
(the training pods'), ``not_ready`` (the NotReady-node rule), ``writer`` (the folder) and ``lifecycle``
(each Rendezvous's tasks) all read and write it through this module, which registers no handler, so none
of them imports another handler module for it (no import cycle).

Everything the memo keeps of a Rendezvous is in one of the collections ``OperatorMemo.per_rendezvous``
lists, keyed by the Rendezvous or by a tuple that starts with it; ``OperatorMemo.forget`` empties them all
of one Rendezvous when it is deleted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

import kopf
from kube_rendezvous import (
    RENDEZVOUS_PLURAL,
    ForbiddenError,
    InvalidError,
    KubernetesApi,
    KubernetesApiError,
    NodeId,
    NotFoundError,
    PlacementSpec,
    RendezvousDocument,
    TrainingPods,
    resource_path,
    with_evicted,
    write_status,
)
from kube_rendezvous import add_evictions as evict

from . import handlers_rules, metrics
from .config import OperatorConfig
from .nodes import NodeReadiness

logger = logging.getLogger(__name__)

Key = tuple[str, str]


def owner(entry: Any) -> Key:
    """The Rendezvous an entry of a per-Rendezvous collection belongs to: the entry itself, or its first item."""
    return cast(Key, entry[0] if isinstance(entry[0], tuple) else entry)


@dataclass(frozen=True)
class Observed:
    """What ``observe_rendezvous`` saw last of one Rendezvous: the base its Events are computed from."""

    status: dict[str, Any]
    #: The newest valid document seen (kept across an invalid state; dropped when the state is cleared).
    document: RendezvousDocument | None
    #: The participants of the last round seen formed (membership Events compare with it).
    formed: frozenset[NodeId] | None = None
    #: The spares (redundant nodes) seen since that round formed: one of them in the next round was promoted.
    spares: frozenset[NodeId] = frozenset()


@dataclass
class NodeRule:
    """The state of the NotReady-node rule, shared by every copy of the memo."""

    #: The NotReady Kubernetes Nodes (None until the operator started watching them).
    readiness: NodeReadiness | None = None
    #: The wake-up of each Rendezvous's ``evict_on_not_ready_nodes`` task, rung when a Node's readiness changes.
    wakes: dict[Key, asyncio.Event] = field(default_factory=dict)
    #: (Rendezvous, Node, NotReady since) already judged after its grace ended, by the task or a resync.
    judged: set[tuple[Key, str, datetime]] = field(default_factory=set)
    #: (Rendezvous, Node, NotReady since) whose live agents were logged as spared (logged once).
    spared: set[tuple[Key, str, datetime]] = field(default_factory=set)
    #: Guards ``judged`` and ``spared`` (held briefly, also from the event loop).
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: One judgement at a time (a task and a resync), so one eviction posts one Event (worker threads only).
    judging: threading.Lock = field(default_factory=threading.Lock)

    def wake_all(self) -> None:
        """Wake every task (from the event loop: ``loop.call_soon_threadsafe``)."""
        for wake in list(self.wakes.values()):
            wake.set()


@dataclass
class RendezvousTasks:
    """The background tasks of one Rendezvous (``lifecycle``), and the uid of the object they work for."""

    uid: str
    #: Each task by name, and the flag that asks it to end.
    tasks: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = field(default_factory=dict)


@dataclass
class OperatorMemo:
    """Kopf's memo: the operator's whole memory (Kopf hands each Rendezvous a shallow copy, so the dicts are shared).

    Keyed by (namespace, name) of a Rendezvous, or by a tuple that starts with it; nothing else is kept
    between events. Every such collection is listed in ``per_rendezvous``.
    """

    config: OperatorConfig
    #: The API client (credentials from the kubeconfig or the pod's service account).
    api: KubernetesApi
    #: The last ``status.state`` text read and its document or error (decoded only when the text changes).
    states: dict[Key, handlers_rules.StoredState] = field(default_factory=dict)
    #: The last status and document seen by ``observe_rendezvous``.
    observed: dict[Key, Observed] = field(default_factory=dict)
    #: Which pods are each Rendezvous's training pods (``handlers_rules.pod_selector``).
    selectors: dict[Key, handlers_rules.PodSelector] = field(default_factory=dict)
    #: Each Rendezvous's training pods by uid: listed by ``resync_pods``, kept current by ``track_training_pod``.
    #: A Rendezvous is here only once its pods were listed (before that its census is unknown).
    pods: dict[Key, dict[str, dict[str, Any]]] = field(default_factory=dict)
    pods_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Each Rendezvous's folder's wake-up (``writer.fold_requests``), rung when its pods change.
    wake_folder: dict[Key, Any] = field(default_factory=dict)
    #: Each Rendezvous's keep-alive interval (its spec's, as the agents resolve it without rdzv-conf).
    keep_alive: dict[Key, float] = field(default_factory=dict)
    #: Each Rendezvous's placement spec (``spec.topology``, ``spec.admission``); absent: the defaults.
    placement: dict[Key, PlacementSpec] = field(default_factory=dict)
    #: The rule that evicts the nodes of training pods on NotReady Kubernetes Nodes.
    node_rule: NodeRule = field(default_factory=NodeRule)
    #: Container restarts judged already, (Rendezvous, pod uid) -> when the container ended:
    #: the pod's later events do not read the Leases again for the same restart (``pods.judge_restart``).
    judged_restarts: dict[tuple[Key, str], datetime] = field(default_factory=dict)
    #: Each Rendezvous's background tasks: its folder, resync, NotReady-node rule and TTL (``lifecycle``).
    running: dict[Key, RendezvousTasks] = field(default_factory=dict)

    def per_rendezvous(self) -> list[dict[Any, Any] | set[Any]]:
        """Every collection that keeps something of a Rendezvous (keyed by it, or by a tuple that starts with it)."""
        rule = self.node_rule
        return [
            self.states,
            self.observed,
            self.selectors,
            self.pods,
            self.wake_folder,
            self.keep_alive,
            self.placement,
            self.judged_restarts,
            self.running,
            rule.wakes,
            rule.judged,
            rule.spared,
        ]

    def forget(self, key: Key) -> None:
        """Drop everything kept of Rendezvous ``key`` (deleted; ``lifecycle`` stops its tasks)."""
        with self.pods_lock, self.node_rule.lock:
            for held in self.per_rendezvous():
                for entry in [entry for entry in list(held) if owner(entry) == key]:
                    if isinstance(held, set):
                        held.discard(entry)
                    else:
                        held.pop(entry, None)

    def tracked(self) -> set[Key]:
        """The Rendezvous the operator keeps anything of."""
        with self.pods_lock, self.node_rule.lock:
            return {owner(entry) for held in self.per_rendezvous() for entry in list(held)}

    def indexed_pods(self) -> int:
        """How many training pods the pod index holds, over every Rendezvous."""
        with self.pods_lock:
            return sum(len(pods) for pods in self.pods.values())


def training_pods(memo: OperatorMemo, key: Key) -> TrainingPods | None:
    """The census of ``key``'s training pods for its folder; None until they were listed once."""
    with memo.pods_lock:
        pods = memo.pods.get(key)
        listed = None if pods is None else list(pods.values())
    if listed is None:
        return None
    readiness = memo.node_rule.readiness
    nodes = readiness.facts() if readiness is not None and readiness.readable else None
    return handlers_rules.training_pods(listed, nodes, memo.placement.get(key, PlacementSpec()))


def pods_changed(memo: OperatorMemo, key: Key, update: Any) -> None:
    """Apply ``update(pods)`` to ``key``'s pod index (if listed) and wake its folder."""
    with memo.pods_lock:
        if key in memo.pods:
            update(memo.pods[key])
    wake = memo.wake_folder.get(key)
    if wake is not None:
        wake()


def patch_status(client: KubernetesApi, namespace: str, name: str, status: dict[str, Any], kind: str) -> bool:
    """Merge-patch the Rendezvous status (no resourceVersion: the server applies it at the latest).

    Returns False when the Rendezvous is gone (nothing to write to).

    Raises:
        kopf.PermanentError: the server refused the write for good (forbidden, invalid).
        kopf.TemporaryError: it may succeed later (throttled, unready, unreachable).
    """
    what = f"status ({kind}) of {namespace}/{name}"
    try:
        write_status(client, namespace, name, status)
    except NotFoundError:
        logger.info("did not write the %s: the Rendezvous is gone", what)
        return False
    except (ForbiddenError, InvalidError) as exc:
        metrics.RECONCILE_ERRORS.labels(handler=kind).inc()
        if exc.transient:
            raise kopf.TemporaryError(f"could not write the {what}: {exc}", delay=2) from exc
        raise kopf.PermanentError(f"the API server refused to write the {what}: {exc}") from exc
    except KubernetesApiError as exc:
        metrics.RECONCILE_ERRORS.labels(handler=kind).inc()
        raise kopf.TemporaryError(f"could not write the {what}: {exc}", delay=2) from exc
    metrics.OPERATOR_WRITES.labels(kind=kind).inc()
    return True


#: Seconds an eviction keeps trying while the API server does not answer.
EVICT_SECONDS = 30.0


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


def update_condition(
    client: KubernetesApi,
    namespace: str,
    name: str,
    current: dict[str, Any],
    generation: int | None,
    kind: str,
    *,
    condition: tuple[str, str, str, str],
    also: dict[str, Any] | None = None,
) -> None:
    """Write one condition ``(type, status, reason, message)`` if it changed, with ``also`` in the same write."""
    condition_type, condition_status, reason, message = condition
    conditions = handlers_rules.set_condition(
        list(current.get("conditions") or []),
        condition_type,
        condition_status,
        reason,
        message,
        generation,
        datetime.now(timezone.utc),
    )
    if conditions is not None:
        fields = {"conditions": conditions, "observedGeneration": generation, **(also or {})}
        patch_status(client, namespace, name, fields, kind)


def stored_state(memo: OperatorMemo, key: Key, text: object) -> handlers_rules.StoredState:
    """The document (or error) of ``status.state`` ``text``; decoded only when it differs from the last read."""
    stored = handlers_rules.read_state(text, memo.states.get(key))
    memo.states[key] = stored
    return stored


def post_event(body: kopf.Body, event: handlers_rules.RendezvousEvent, namespace: str, name: str) -> None:
    """Post ``event`` on the Rendezvous and count it."""
    kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    metrics.count_event(event.reason, namespace, name, event.count)


def evict_and_report(memo: OperatorMemo, namespace: str, rendezvous: str, nodes: list[str], because: str) -> bool:
    """Evict ``nodes`` from ``rendezvous`` (unless all are evicted already), count them and post NodeEvicted.

    Returns whether anything was written.
    """
    observed = memo.observed.get((namespace, rendezvous))
    if not nodes or (observed is not None and with_evicted(observed.status, nodes) is None):
        return False
    evicted = add_evictions(memo.api, namespace, rendezvous, nodes)
    if evicted is None:
        return False
    if observed is not None:
        observed.status["evictedNodes"] = evicted
    metrics.EVICTIONS.labels(namespace=namespace, name=rendezvous).inc(len(nodes))
    logger.info("evicted %s from rendezvous %s/%s: %s", nodes, namespace, rendezvous, because)
    try:
        rdzv_body = memo.api.request("GET", resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous))
    except KubernetesApiError as exc:
        logger.warning("could not post the NodeEvicted event: %s", exc)
        return True
    listed = handlers_rules.RendezvousEvent("Normal", "NodeEvicted", f"evicted {', '.join(nodes)}: {because}")
    post_event(kopf.Body(rdzv_body), listed, namespace, rendezvous)
    return True
