"""The Kopf handlers: the operator's I/O edge. Decisions live in ``handlers_rules``.

The operator is never required in the data path (it is the preferred writer, see ``writer``; the
agents elect one of their own when it is down). It watches Rendezvous objects and the training pods,
posts Events, keeps ``status.conditions`` current, evicts nodes whose pod is gone (by adding
them to ``status.evictedNodes``, which every writer folds into the state), and deletes closed
Rendezvous after their TTL. It also evicts
the nodes of training pods on a Kubernetes Node NotReady for ``--node-not-ready-seconds`` (``not_ready``;
``nodes`` tells which are), unless their agents still heartbeat. It writes to
a Rendezvous only when a condition changes or a node is evicted: never per heartbeat. A task
resyncs each Rendezvous with its pods (a LIST, no write unless it evicts), so pods deleted or
ended while the operator was down or its watch was broken are noticed too.

It never holds a Rendezvous: no finalizer, so deleting one (or its namespace, or the CRD) needs no
operator. Its agents take the object's disappearance as the close of their run; the operator stops
its tasks and forgets it on its DELETED event (``lifecycle``). Objects of earlier releases carry
``RELEASED_FINALIZER``: the operator removes it from every object it sees.

This module holds the Rendezvous handlers and ``register``; the training pods' handlers are in ``pods``,
the NotReady-node rule in ``not_ready``, the folder in ``writer``, each Rendezvous's tasks in
``lifecycle``, and the operator's memory (``OperatorMemo``) and its writes, which they all share, in ``memory``.

It reads ``status.state`` only through ``handlers_rules.read_state`` (the agents' bounded validator,
``decode_document``), once per change of its text; an invalid state is reported as a
``StateInvalid`` Warning and Ready=False, and is otherwise ignored.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

import kopf
from kube_rendezvous import (
    GROUP,
    RENDEZVOUS_LABEL,
    RENDEZVOUS_PLURAL,
    VERSION,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    RendezvousDocument,
    parse_time,
    resource_path,
)

from . import handlers_rules, lifecycle, metrics
from .lifecycle import stopped_within
from .memory import Key, Observed, OperatorMemo, post_event, stored_state, update_condition
from .not_ready import evict_on_not_ready_nodes, start_node_rule, stop_node_rule
from .pods import evict_nodes_of_gone_pods, is_training_pod, resync_periodically, track_training_pod
from .writer import fold_requests

logger = logging.getLogger(__name__)

#: The finalizer of the first four releases, which held every Rendezvous until the operator let it go. Kopf
#: is told it is its own finalizer: since no handler needs one now, Kopf removes it from each object it sees
#: (also from one being deleted, which then goes), so what earlier releases left can be deleted.
RELEASED_FINALIZER = "kube-rendezvous.io/close-before-delete"
#: Seconds the server keeps one of Kopf's watch requests open (Kopf then watches anew from the last event).
WATCH_SERVER_SECONDS = 25  # an integer: the server refuses timeoutSeconds=25.0
#: Seconds one of Kopf's requests may take, and its connection attempt.
REQUEST_SECONDS = 30.0
CONNECT_SECONDS = 10.0


def configure(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    """Keep Kopf's own writes rare and under our names; serve metrics."""
    settings.persistence.finalizer = RELEASED_FINALIZER
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
    metrics.report_memory(lambda: len(memo.tracked()), memo.indexed_pods)
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
            # MIN/MAX (kubectl get rdzv) show status.minNodes/maxNodes: what the agents follow, the spec until a fold.
            also=handlers_rules.nodes_until_folded(spec, status),
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
    check = handlers_rules.check_state(stored_state(memo, (namespace, name), status.get("state")))
    ready = handlers_rules.ready_condition(handlers_rules.spec_problems(spec), check)
    update_condition(memo.api, namespace, name, status, generation, "ready", condition=ready)


def observe_rendezvous(
    body: kopf.Body,
    spec: dict[str, Any],
    status: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    name: str,
    memo: OperatorMemo,
) -> None:
    """Turn state changes into Events and metrics; flag an invalid state. Writes only on a change."""
    key = (namespace, name)
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
        baseline, last_formed = handlers_rules.announced_baseline(stored.document, announced)
    formed = handlers_rules.formed_members(last_formed, baseline, document)
    seen_spares = (previous.spares if previous is not None and same_run else frozenset()) | (
        baseline.redundancy_list if baseline is not None and same_run else frozenset()
    )
    current_spares = document.redundancy_list if document is not None else frozenset()
    new_round = handlers_rules.newly_formed(baseline if same_run else None, document)
    memo.observed[key] = Observed(
        status, document, formed, current_spares if new_round else seen_spares | current_spares
    )
    memo.keep_alive[key] = handlers_rules.timings(spec or {}).keep_alive_interval
    placement = handlers_rules.placement_spec(spec or {})
    if memo.placement.get(key) != placement:
        memo.placement[key] = placement
        wake = memo.wake_folder.get(key)
        if wake is not None:
            wake()
    selector = handlers_rules.pod_selector(name, spec or {}, meta or {}, RENDEZVOUS_LABEL)
    if memo.selectors.get(key) != selector:
        memo.selectors[key] = selector
        logger.info(
            "the training pods of %s/%s are those with %s (%s)", namespace, name, selector.describe(), selector.source
        )
    metrics.observe(namespace, name, status)
    if previous is None or previous.status.get("state") != status.get("state"):
        check = handlers_rules.check_state(stored)
        ready = handlers_rules.find_condition(status, "Ready")
        if not check.ok:
            reported = (
                previous is None  # a restarted operator: say it once
                and ready is not None
                and ready.get("reason") == check.reason
                and str(ready.get("message", "")).startswith(check.message)
            )
            if not reported:
                post_event(
                    body, handlers_rules.RendezvousEvent("Warning", check.reason, check.message), namespace, name
                )
        if not check.ok or (ready is not None and ready.get("reason") == handlers_rules.STATE_INVALID):
            update_condition(
                memo.api,
                namespace,
                name,
                status,
                meta.get("generation"),
                "state-check",
                condition=handlers_rules.ready_condition(handlers_rules.spec_problems(spec), check),
            )
        if stored.document is not None:
            evicted = status.get("evictedNodes") or []
            for event in handlers_rules.state_events(
                baseline,
                stored.document,
                same_run=same_run,
                evicted=evicted,
                last_formed=last_formed,
                spares=seen_spares,
                close_reason=status.get("closeReason"),
            ):
                post_event(body, event, namespace, name)
        broken = handlers_rules.departure_event(previous.status if previous is not None else None, status, announced)
        if broken is not None:
            post_event(body, broken, namespace, name)
    held = handlers_rules.held_event(previous.status if previous is not None else None, status)
    if held is not None and (held.reason, held.message) not in announced:
        post_event(body, held, namespace, name)
    if status.get("closed"):
        closed = handlers_rules.find_condition(status, "Closed")
        if closed is None or closed.get("status") != "True":
            update_condition(
                memo.api,
                namespace,
                name,
                status,
                meta.get("generation"),
                "closed",
                condition=handlers_rules.closed_condition(status),
            )


def announced_events(client: KubernetesApi, namespace: str, meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) of the Events already posted on a Rendezvous (none when they cannot be listed)."""
    query = {"fieldSelector": f"involvedObject.uid={meta.get('uid')}"}
    try:
        listed = client.request("GET", f"/api/v1/namespaces/{namespace}/events", query=query)
    except KubernetesApiError as exc:
        logger.info("could not list the Events of %s/%s (they may be repeated): %s", namespace, meta.get("name"), exc)
        return []
    return [(str(item.get("reason")), str(item.get("message"))) for item in listed.get("items") or []]


def has_ttl(spec: dict[str, Any]) -> bool:
    """Whether the Rendezvous has ``spec.ttlSecondsAfterClosed`` (then ``delete_after_ttl`` runs for it)."""
    return spec.get("ttlSecondsAfterClosed") is not None


async def delete_after_ttl(
    spec: dict[str, Any], namespace: str, name: str, uid: str, stopped: asyncio.Event, memo: OperatorMemo
) -> None:
    """Delete closed Rendezvous object ``uid`` ``spec.ttlSecondsAfterClosed`` seconds after its last change.

    The DELETE carries ``uid`` as a precondition: an object created anew under that name meanwhile is
    another run's, and is left alone.
    """
    ttl = int(spec["ttlSecondsAfterClosed"])
    path = resource_path(RENDEZVOUS_PLURAL, namespace, name)
    while not stopped.is_set():
        observed = memo.observed.get((namespace, name))
        status = observed.status if observed is not None else {}
        try:
            changed = parse_time(status["lastChangeTime"]) if status.get("closed") else None
        except (KeyError, TypeError, ValueError):
            changed = None
        if changed is None:
            await stopped_within(stopped, 2)
            continue
        remaining = ttl - (datetime.now(timezone.utc) - changed).total_seconds()
        if remaining > 0:
            await stopped_within(stopped, min(remaining, 5))
            continue
        try:
            await asyncio.to_thread(memo.api.request, "DELETE", path, body={"preconditions": {"uid": uid}})
        except NotFoundError:
            return
        except KubernetesApiError as exc:
            # A 409 (the precondition failed), or no answer (the outcome is unknown): read what is there now.
            if not await asyncio.to_thread(is_object, memo.api, path, uid):
                logger.info(
                    "closed Rendezvous %s/%s is gone or another object now: not deleted after its TTL", namespace, name
                )
                return
            logger.warning("could not delete closed Rendezvous %s/%s after its TTL: %s", namespace, name, exc)
            await stopped_within(stopped, 5)
            continue
        logger.info("deleted closed Rendezvous %s/%s after its TTL of %d s", namespace, name, ttl)
        return


def is_object(client: KubernetesApi, path: str, uid: str) -> bool:
    """Whether the object at ``path`` is object ``uid`` (also when it cannot be read: then it may be)."""
    try:
        found = client.request("GET", path)
    except NotFoundError:
        return False
    except KubernetesApiError:
        return True
    return bool(found["metadata"].get("uid") == uid)


def rendezvous_tasks(memo: OperatorMemo, key: Key, spec: dict[str, Any], uid: str) -> dict[str, lifecycle.Work]:
    """The background tasks of Rendezvous ``key`` (object ``uid``), by name: what Kopf's daemons and timer were."""
    namespace, name = key
    tasks: dict[str, lifecycle.Work] = {
        "folder": lambda stopped: fold_requests(memo, key, uid, stopped),
        "resync": lambda stopped: resync_periodically(memo, key, stopped),
        "not-ready": lambda stopped: evict_on_not_ready_nodes(memo, key, stopped),
    }
    if has_ttl(spec):
        tasks["ttl"] = lambda stopped: delete_after_ttl(dict(spec), namespace, name, uid, stopped, memo)
    return tasks


async def rendezvous_event(
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
    """Each watch event of a Rendezvous: run its tasks while it lives, stop them when its deletion starts, and
    forget everything of it once it is deleted; observe its state (``observe_rendezvous``, in a worker thread)."""
    key = (namespace, name)
    uid = str(meta.get("uid"))
    if type == "DELETED":
        await lifecycle.forget(memo, key, uid)
        metrics.forget(namespace, name)
        return
    if meta.get("deletionTimestamp"):
        await lifecycle.stop(memo, key)
    else:
        await lifecycle.start(memo, key, uid, rendezvous_tasks(memo, key, spec or {}, uid))
    await asyncio.to_thread(observe_rendezvous, body, spec, status, meta, namespace, name, memo)


async def stop_rendezvous_tasks(memo: OperatorMemo, **_: Any) -> None:
    """Stop every Rendezvous's tasks (Kopf's cleanup): each folder releases its writer Lease."""
    await lifecycle.stop_all(memo)


def register(registry: kopf.OperatorRegistry) -> None:
    """Register every handler on ``registry`` (the settings reach them in Kopf's memo, ``OperatorMemo.config``)."""
    rendezvous = (GROUP, VERSION, RENDEZVOUS_PLURAL)
    # Kopf's own watches log in as our API client does: the kubeconfig, else the pod's service account.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    kopf.on.startup(registry=registry)(start_node_rule)
    kopf.on.cleanup(registry=registry)(stop_rendezvous_tasks)
    kopf.on.cleanup(registry=registry)(stop_node_rule)
    for on in (kopf.on.resume, kopf.on.create):
        on(*rendezvous, registry=registry)(reconcile_spec)
    kopf.on.update(*rendezvous, field="spec", registry=registry)(reconcile_spec)
    # No daemon, timer or on.delete handler: Kopf would hold every Rendezvous with a finalizer for them.
    kopf.on.event(*rendezvous, registry=registry)(rendezvous_event)
    kopf.on.event("", "v1", "pods", when=is_training_pod, registry=registry)(evict_nodes_of_gone_pods)
    kopf.on.event("", "v1", "pods", when=is_training_pod, registry=registry)(track_training_pod)
