"""The Kopf handlers: the operator's I/O edge. Decisions live in ``logic``.

The operator is never required in the data path (it is the preferred writer, see ``writer``; the
agents elect one of their own when it is down). It watches Rendezvous objects and the training pods,
posts Events, keeps ``status.conditions`` current, evicts nodes whose pod is gone (by adding
them to ``status.evictedNodes``, which every writer folds into the state), holds a deleted
Rendezvous until its agents have closed, and deletes closed ones after their TTL. It also evicts
the nodes of training pods on a Kubernetes Node NotReady for ``--node-not-ready-seconds`` (``not_ready``;
``nodes`` tells which are), unless their agents still heartbeat. It writes to
a Rendezvous only when a condition changes or a node is evicted: never per heartbeat. A timer
resyncs each Rendezvous with its pods (a LIST, no write unless it evicts), so pods deleted or
ended while the operator was down or its watch was broken are noticed too.

This module holds the operator's memory (``OperatorMemo``), its writes, the Rendezvous handlers
and ``register``; the training pods' handlers are in ``pods``, the NotReady-node rule in ``not_ready``.

It reads ``status.state`` only through ``logic.read_state`` (the agents' bounded validator,
``decode_document``), once per change of its text; an invalid state is reported as a
``StateInvalid`` Warning and Ready=False, and is otherwise ignored.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import kopf
from kube_rendezvous.document import NodeId, RendezvousDocument
from kube_rendezvous.folding import TrainingPods
from kube_rendezvous.intents import with_evicted
from kube_rendezvous.kubeapi import (
    GROUP,
    RENDEZVOUS_LABEL,
    RENDEZVOUS_PLURAL,
    VERSION,
    ApiError,
    ApiUnavailableError,
    ForbiddenError,
    InvalidError,
    KubernetesApi,
    NotFoundError,
    resource_path,
)
from kube_rendezvous.status import add_evictions as evict
from kube_rendezvous.status import write_status
from kube_rendezvous.summary import parse_time

from . import logic, metrics
from .config import OperatorConfig
from .nodes import NodeReadiness

logger = logging.getLogger(__name__)

FINALIZER = "kube-rendezvous.io/close-before-delete"
#: Seconds the server keeps one of Kopf's watch requests open (Kopf then watches anew from the last event).
WATCH_SERVER_SECONDS = 25  # an integer: the server refuses timeoutSeconds=25.0
#: Seconds one of Kopf's requests may take, and its connection attempt.
REQUEST_SECONDS = 30.0
CONNECT_SECONDS = 10.0

Key = tuple[str, str]


@dataclass(frozen=True)
class Observed:
    """What ``observe_rendezvous`` saw last of one Rendezvous: the base its Events are computed from."""

    status: dict[str, Any]
    #: The newest valid document seen (kept across an invalid state; dropped when the state is cleared).
    document: RendezvousDocument | None
    #: The participants of the last round seen formed (membership Events compare with it).
    formed: frozenset[NodeId] | None = None


@dataclass
class NodeRule:
    """The state of the NotReady-node rule, shared by every copy of the memo."""

    #: The NotReady Kubernetes Nodes (None until the operator started watching them).
    readiness: NodeReadiness | None = None
    #: The wake-up of each Rendezvous's ``evict_on_not_ready_nodes`` daemon, rung when a Node's readiness changes.
    wakes: dict[Key, asyncio.Event] = field(default_factory=dict)
    #: (Rendezvous, Node, NotReady since) already judged after its grace ended, by the daemon or a resync.
    judged: set[tuple[Key, str, datetime]] = field(default_factory=set)
    #: (Rendezvous, Node, NotReady since) whose live agents were logged as spared (logged once).
    spared: set[tuple[Key, str, datetime]] = field(default_factory=set)
    #: Guards ``judged`` and ``spared`` (held briefly, also from the event loop).
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: One judgement at a time (a daemon and a resync), so one eviction posts one Event (worker threads only).
    judging: threading.Lock = field(default_factory=threading.Lock)

    def wake_all(self) -> None:
        """Wake every daemon (from the event loop: ``loop.call_soon_threadsafe``)."""
        for wake in list(self.wakes.values()):
            wake.set()


@dataclass
class OperatorMemo:
    """Kopf's memo: the operator's whole memory (Kopf hands each Rendezvous a shallow copy, so the dicts are shared).

    Keyed by (namespace, name) of a Rendezvous; nothing else is kept between events.
    """

    config: OperatorConfig
    #: The API client (credentials from the kubeconfig or the pod's service account).
    api: KubernetesApi
    #: The last ``status.state`` text read and its document or error (decoded only when the text changes).
    states: dict[Key, logic.StoredState] = field(default_factory=dict)
    #: The last status and document seen by ``observe_rendezvous``.
    observed: dict[Key, Observed] = field(default_factory=dict)
    #: Which pods are each Rendezvous's training pods (``logic.pod_selector``).
    selectors: dict[Key, logic.PodSelector] = field(default_factory=dict)
    #: Each Rendezvous's training pods by uid: listed by ``resync_pods``, kept current by ``track_training_pod``.
    #: A Rendezvous is here only once its pods were listed (before that its census is unknown).
    pods: dict[Key, dict[str, dict[str, Any]]] = field(default_factory=dict)
    pods_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Each Rendezvous's folder's wake-up (``writer.fold_requests``), rung when its pods change.
    wake_folder: dict[Key, Any] = field(default_factory=dict)
    #: Each Rendezvous's keep-alive interval (its spec's, as the agents resolve it without rdzv-conf).
    keep_alive: dict[Key, float] = field(default_factory=dict)
    #: The rule that evicts the nodes of training pods on NotReady Kubernetes Nodes.
    node_rule: NodeRule = field(default_factory=NodeRule)
    #: Container restarts judged already, (namespace, Rendezvous, pod uid) -> when the container ended:
    #: the pod's later events do not read the Leases again for the same restart (``pods.judge_restart``).
    judged_restarts: dict[tuple[str, str, str], datetime] = field(default_factory=dict)


def training_pods(memo: OperatorMemo, key: Key) -> TrainingPods | None:
    """The census of ``key``'s training pods for its folder; None until they were listed once."""
    with memo.pods_lock:
        pods = memo.pods.get(key)
        listed = None if pods is None else list(pods.values())
    return None if listed is None else logic.training_pods(listed)


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
    except (ApiError, ApiUnavailableError) as exc:
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
    except (ApiError, ApiUnavailableError) as exc:
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
) -> None:
    """Write one condition ``(type, status, reason, message)`` if it changed."""
    condition_type, condition_status, reason, message = condition
    conditions = logic.set_condition(
        list(current.get("conditions") or []),
        condition_type,
        condition_status,
        reason,
        message,
        generation,
        datetime.now(timezone.utc),
    )
    if conditions is not None:
        patch_status(client, namespace, name, {"conditions": conditions, "observedGeneration": generation}, kind)


def stored_state(memo: OperatorMemo, key: Key, text: object) -> logic.StoredState:
    """The document (or error) of ``status.state`` ``text``; decoded only when it differs from the last read."""
    stored = logic.read_state(text, memo.states.get(key))
    memo.states[key] = stored
    return stored


def post_event(body: kopf.Body, event: logic.RendezvousEvent, namespace: str, name: str) -> None:
    """Post ``event`` on the Rendezvous and count it."""
    kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    metrics.count_event(event.reason, namespace, name, event.count)


def configure(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    """Keep Kopf's own writes rare and under our names; serve metrics."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kube-rendezvous.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kube-rendezvous.io", key="last-handled-spec"
    )
    settings.posting.level = logging.WARNING  # handler logs stay logs; Events are the ones we post
    # Every watch and request has a deadline: the server ends each watch within 25 s, a stream silent
    # for 30 s (no event, no bookmark; a NAT that dropped the connection) is dropped and watched anew.
    settings.watching.server_timeout = WATCH_SERVER_SECONDS
    settings.watching.client_timeout = WATCH_SERVER_SECONDS + 5
    settings.watching.inactivity_timeout = WATCH_SERVER_SECONDS + 5
    settings.watching.connect_timeout = CONNECT_SECONDS
    settings.networking.request_timeout = REQUEST_SECONDS
    settings.networking.connect_timeout = CONNECT_SECONDS
    if memo.config.namespaces:
        # Named namespaces only: do not scan (list) namespaces, which namespaced RBAC forbids.
        settings.scanning.disabled = True
    metrics.serve(memo.config.metrics_port)


def reconcile_spec(
    spec: dict[str, Any],
    status: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Post Ready=Unknown on first sight, then Ready=True/False from the spec and the state; keep observedGeneration."""
    generation = meta.get("generation")
    status = dict(status or {})
    if not status.get("conditions"):
        update_condition(
            memo.api,
            namespace,
            name,
            status,
            generation,
            "ready-unknown",
            condition=("Ready", "Unknown", "Validating", "the operator is checking the spec"),
        )
        status["conditions"] = [
            {
                "type": "Ready",
                "status": "Unknown",
                "reason": "Validating",
                "message": "the operator is checking the spec",
                "observedGeneration": generation,
            }
        ]
    check = logic.check_state(stored_state(memo, (namespace, name), status.get("state")))
    ready = logic.ready_condition(logic.spec_problems(spec), check)
    update_condition(memo.api, namespace, name, status, generation, "ready", condition=ready)


def observe_rendezvous(
    type: str | None,
    body: kopf.Body,
    spec: dict[str, Any],
    status: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Turn state changes into Events and metrics; flag an invalid state. Writes only on a change."""
    key = (namespace, name)
    if type == "DELETED":
        memo.observed.pop(key, None)
        memo.states.pop(key, None)
        memo.selectors.pop(key, None)
        memo.keep_alive.pop(key, None)
        metrics.forget(namespace, name)
        return
    status = dict(status or {})
    previous = memo.observed.get(key)
    stored = stored_state(memo, key, status.get("state"))
    baseline = previous.document if previous is not None else None
    if stored.document is not None:
        document: RendezvousDocument | None = stored.document
    elif stored.error is None:
        document = None  # no state (cleared): the next one starts afresh
    else:
        document = baseline  # an invalid state changes nothing the agents agreed on
    same_run = previous is None or previous.status.get("runId") in (None, status.get("runId"))
    last_formed = previous.formed if previous is not None and same_run else None
    announced: list[tuple[str, str]] = []
    if previous is None and (stored.document is not None or status.get("lastDeparture")):
        # First sight (a new leader, a restart): what was announced already is not announced again.
        announced = announced_events(memo.api, namespace, meta)
    if previous is None and stored.document is not None:
        baseline, last_formed = logic.announced_baseline(stored.document, announced)
    memo.observed[key] = Observed(status, document, logic.formed_members(last_formed, baseline, document))
    memo.keep_alive[key] = logic.timings(spec or {}).keep_alive_interval
    selector = logic.pod_selector(name, spec or {}, meta or {}, RENDEZVOUS_LABEL)
    if memo.selectors.get(key) != selector:
        memo.selectors[key] = selector
        logger.info(
            "the training pods of %s/%s are those with %s (%s)", namespace, name, selector.describe(), selector.source
        )
    metrics.observe(namespace, name, status)
    if previous is None or previous.status.get("state") != status.get("state"):
        check = logic.check_state(stored)
        ready = logic.find_condition(status, "Ready")
        if not check.ok:
            reported = (
                previous is None  # a restarted operator: say it once
                and ready is not None
                and ready.get("reason") == check.reason
                and str(ready.get("message", "")).startswith(check.message)
            )
            if not reported:
                post_event(body, logic.RendezvousEvent("Warning", check.reason, check.message), namespace, name)
        if not check.ok or (ready is not None and ready.get("reason") == logic.STATE_INVALID):
            update_condition(
                memo.api,
                namespace,
                name,
                status,
                meta.get("generation"),
                "state-check",
                condition=logic.ready_condition(logic.spec_problems(spec), check),
            )
        if stored.document is not None:
            evicted = status.get("evictedNodes") or []
            for event in logic.state_events(
                baseline, stored.document, same_run=same_run, evicted=evicted, last_formed=last_formed
            ):
                post_event(body, event, namespace, name)
        broken = logic.departure_event(previous.status if previous is not None else None, status, announced)
        if broken is not None:
            post_event(body, broken, namespace, name)
    if status.get("closed"):
        closed = logic.find_condition(status, "Closed")
        if closed is None or closed.get("status") != "True":
            update_condition(
                memo.api,
                namespace,
                name,
                status,
                meta.get("generation"),
                "closed",
                condition=("Closed", "True", "Closed", f"closed in round {status.get('round')}"),
            )


def announced_events(client: KubernetesApi, namespace: str, meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) of the Events already posted on a Rendezvous (none when they cannot be listed)."""
    query = {"fieldSelector": f"involvedObject.uid={meta.get('uid')}"}
    try:
        listed = client.request("GET", f"/api/v1/namespaces/{namespace}/events", query=query)
    except (ApiError, ApiUnavailableError) as exc:
        logger.info("could not list the Events of %s/%s (they may be repeated): %s", namespace, meta.get("name"), exc)
        return []
    return [(str(item.get("reason")), str(item.get("message"))) for item in listed.get("items") or []]


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
    except (ApiError, ApiUnavailableError) as exc:
        logger.warning("could not post the NodeEvicted event: %s", exc)
        return True
    listed = logic.RendezvousEvent("Normal", "NodeEvicted", f"evicted {', '.join(nodes)}: {because}")
    post_event(kopf.Body(rdzv_body), listed, namespace, rendezvous)
    return True


def close_before_delete(
    spec: dict[str, Any],
    status: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Hold a deleted Rendezvous until its agents have closed it (they fold the deletion into the state)."""
    now = datetime.now(timezone.utc)
    from .writer import with_lease_heartbeats  # heartbeats live on the nodes' Leases

    stored = stored_state(memo, (namespace, name), (status or {}).get("state")).document
    document = with_lease_heartbeats(memo.api, stored, namespace, name)
    alive = logic.live_agents(document, now, logic.heartbeat_expiry(spec))
    if not alive:
        return
    deleted = parse_time(meta["deletionTimestamp"])
    patience = logic.timings(spec).close
    if (now - deleted).total_seconds() > patience:
        logger.warning("%d agents did not close within %g s; letting the Rendezvous go", len(alive), patience)
        return
    raise kopf.TemporaryError(f"waiting for {len(alive)} live agents to close the rendezvous", delay=1)


def has_ttl(spec: dict[str, Any], **_: Any) -> bool:
    """Kopf's filter for ``delete_after_ttl``: the Rendezvous has ``spec.ttlSecondsAfterClosed``."""
    return spec.get("ttlSecondsAfterClosed") is not None


async def delete_after_ttl(
    spec: dict[str, Any], namespace: str, name: str, stopped: Any, memo: OperatorMemo, **_: Any
) -> None:
    """Delete a closed Rendezvous ``spec.ttlSecondsAfterClosed`` seconds after its last change."""
    ttl = int(spec["ttlSecondsAfterClosed"])
    while not stopped:
        observed = memo.observed.get((namespace, name))
        status = observed.status if observed is not None else {}
        try:
            changed = parse_time(status["lastChangeTime"]) if status.get("closed") else None
        except (KeyError, TypeError, ValueError):
            changed = None
        if changed is None:
            await asyncio.sleep(2)
            continue
        remaining = ttl - (datetime.now(timezone.utc) - changed).total_seconds()
        if remaining > 0:
            await asyncio.sleep(min(remaining, 5))
            continue
        try:
            await asyncio.to_thread(memo.api.request, "DELETE", resource_path(RENDEZVOUS_PLURAL, namespace, name))
        except NotFoundError:
            return
        except (ApiError, ApiUnavailableError) as exc:
            logger.warning("could not delete closed Rendezvous %s/%s after its TTL: %s", namespace, name, exc)
            await asyncio.sleep(5)
            continue
        logger.info("deleted closed Rendezvous %s/%s after its TTL of %d s", namespace, name, ttl)
        return


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Register every handler on ``registry``, with the timings of ``config`` (its resync interval)."""
    # Imported here: pods and not_ready import this module (the memo and its writes).
    from .not_ready import evict_on_not_ready_nodes, start_node_rule, stop_node_rule
    from .pods import evict_nodes_of_gone_pods, is_training_pod, resync_pods, track_training_pod
    from .writer import FOLDER_STOP_SECONDS, fold_requests

    rendezvous = (GROUP, VERSION, RENDEZVOUS_PLURAL)
    # Kopf's own watches log in as our API client does: the kubeconfig, else the pod's service account.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    kopf.on.startup(registry=registry)(start_node_rule)
    kopf.on.cleanup(registry=registry)(stop_node_rule)
    for on in (kopf.on.resume, kopf.on.create):
        on(*rendezvous, registry=registry)(reconcile_spec)
    kopf.on.update(*rendezvous, field="spec", registry=registry)(reconcile_spec)
    kopf.on.event(*rendezvous, registry=registry)(observe_rendezvous)
    kopf.on.event("", "v1", "pods", when=is_training_pod, registry=registry)(evict_nodes_of_gone_pods)
    kopf.on.event("", "v1", "pods", when=is_training_pod, registry=registry)(track_training_pod)
    kopf.timer(*rendezvous, interval=config.resync_seconds, initial_delay=1, registry=registry)(resync_pods)
    kopf.on.delete(*rendezvous, registry=registry)(close_before_delete)
    kopf.daemon(*rendezvous, cancellation_timeout=5, when=has_ttl, registry=registry)(delete_after_ttl)
    kopf.daemon(*rendezvous, cancellation_timeout=FOLDER_STOP_SECONDS + 5, registry=registry)(fold_requests)
    kopf.daemon(*rendezvous, cancellation_timeout=5, registry=registry)(evict_on_not_ready_nodes)
