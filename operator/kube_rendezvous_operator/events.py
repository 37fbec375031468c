"""The Events rule: observe each state change of a Rendezvous and tell it as Kubernetes Events and metrics.

Its decisions are ``events_rules``'s (the story of the rounds) and ``conditions_rules``'s (the state check).
``observe_rendezvous`` runs for every watch event of a Rendezvous but its last (``handlers.rendezvous_event``); it keeps
what the other rules read of it in its record: the observed status and document, its keep-alive, its
placement and its pod selector. It writes only on a change: the Ready and Progressing conditions as the
round forms, completes or breaks (or the state turns invalid), the Closed condition
(``conditions.update_conditions``), and the Events.

It reads ``status.state`` only through ``conditions_rules.read_state`` (the agents' bounded validator,
``decode_document``), once per change of its text; an invalid state is reported as a ``StateInvalid``
Warning and Ready=False, and is otherwise ignored.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf
from kube_rendezvous import (
    RENDEZVOUS_LABEL,
    RENDEZVOUS_PLURAL,
    KubernetesApi,
    KubernetesApiError,
    RendezvousDocument,
    resource_path,
)

from . import conditions_rules, events_rules, lost_nodes_rules, metrics, pods_rules
from .conditions import update_conditions
from .memory import Key, Observed, OperatorMemo, stored_state

logger = logging.getLogger(__name__)


def post_event(body: kopf.Body, event: events_rules.RendezvousEvent, namespace: str, name: str) -> None:
    """Post ``event`` on the Rendezvous and count it."""
    kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    metrics.count_event(event.reason, namespace, name, event.count)


def post_on_rendezvous(
    client: KubernetesApi, namespace: str, name: str, event: events_rules.RendezvousEvent, *, once: bool = False
) -> bool:
    """Post ``event`` on Rendezvous ``namespace/name`` read anew (a rule that has no body of it at hand).

    With ``once``, not when an Event of its reason and message was posted on it already (by this replica
    before a restart, or by an earlier leader). Returns whether it was posted; a failed read is logged.
    """
    try:
        body = client.request("GET", resource_path(RENDEZVOUS_PLURAL, namespace, name))
    except KubernetesApiError as exc:
        logger.warning("could not post the %s event on %s/%s: %s", event.reason, namespace, name, exc)
        return False
    if once and (event.reason, event.message) in announced_events(client, namespace, body.get("metadata") or {}):
        return False
    post_event(kopf.Body(body), event, namespace, name)
    return True


def tell(body: kopf.Body, event: events_rules.RendezvousEvent, key: Key, memo: OperatorMemo) -> None:
    """Post ``event`` on the Rendezvous ``key`` and, for the story of its rounds (``WORKLOAD_REASONS``), on the
    workloads of its training pods (``kubectl describe job`` shows it)."""
    namespace, name = key
    post_event(body, event, namespace, name)
    if event.reason in events_rules.WORKLOAD_REASONS:
        owners = events_rules.workloads(memo.pods_of(key) or [])
        if owners:
            post_on_related(owners, events_rules.on_workload(event, namespace, name))


def post_on_related(objects: list[dict[str, Any]], event: events_rules.RendezvousEvent) -> None:
    """Post ``event`` on other objects than a Rendezvous (a pod, its workload); counted on the Rendezvous only."""
    for involved in objects:
        kopf.event(kopf.Body(cast(kopf.RawBody, involved)), type=event.type, reason=event.reason, message=event.message)


def announced_events(client: KubernetesApi, namespace: str, meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) of the Events already posted on a Rendezvous (none when they cannot be listed)."""
    query = {"fieldSelector": f"involvedObject.uid={meta.get('uid')}"}
    try:
        listed = client.request("GET", f"/api/v1/namespaces/{namespace}/events", query=query)
    except KubernetesApiError as exc:
        logger.info("could not list the Events of %s/%s (they may be repeated): %s", namespace, meta.get("name"), exc)
        return []
    return [(str(item.get("reason")), str(item.get("message"))) for item in listed.get("items") or []]


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
    record = memo.record(key)
    previous = record.observed
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
        baseline, last_formed = events_rules.announced_baseline(stored.document, announced)
    formed = events_rules.formed_members(last_formed, baseline, document)
    seen_spares = (previous.spares if previous is not None and same_run else frozenset()) | (
        baseline.redundancy_list if baseline is not None and same_run else frozenset()
    )
    current_spares = document.redundancy_list if document is not None else frozenset()
    new_round = events_rules.newly_formed(baseline if same_run else None, document)
    record.observed = Observed(status, document, formed, current_spares if new_round else seen_spares | current_spares)
    record.keep_alive = conditions_rules.timings(spec or {}).keep_alive_interval
    record.fail_pods_after = lost_nodes_rules.fail_pods_after(spec or {}, memo.config.fail_lost_pods_after_seconds)
    placement = conditions_rules.placement_spec(spec or {})
    if record.placement != placement:
        record.placement = placement
        if record.wake_folder is not None:
            record.wake_folder()
    selector = pods_rules.pod_selector(name, spec or {}, meta or {}, RENDEZVOUS_LABEL)
    if record.selector != selector:
        record.selector = selector
        logger.info(
            "the training pods of %s/%s are those with %s (%s)", namespace, name, selector.describe(), selector.source
        )
    record.state_fingerprint, state_written = events_rules.state_fingerprint(
        record.state_fingerprint, status.get("state")
    )
    recovery = events_rules.recovery_seconds(previous.status if previous is not None else None, status)
    metrics.observe(namespace, name, status, state_written=state_written, recovery=recovery)
    check = conditions_rules.check_state(stored)
    ready = conditions_rules.find_condition(status, "Ready")
    if previous is None or previous.status.get("state") != status.get("state"):
        if not check.ok:
            reported = (
                previous is None  # a restarted operator: say it once
                and ready is not None
                and ready.get("reason") == check.reason
                and str(ready.get("message", "")).startswith(check.message)
            )
            if not reported:
                tell(body, events_rules.RendezvousEvent("Warning", check.reason, check.message), key, memo)
        if stored.document is not None:
            evicted = status.get("evictedNodes") or []
            for event in events_rules.state_events(
                baseline,
                stored.document,
                same_run=same_run,
                evicted=evicted,
                last_formed=last_formed,
                spares=seen_spares,
                close_reason=status.get("closeReason"),
            ):
                tell(body, event, key, memo)
        broken = events_rules.departure_event(previous.status if previous is not None else None, status, announced)
        if broken is not None:
            tell(body, broken, key, memo)
    held = events_rules.held_event(previous.status if previous is not None else None, status)
    if held is not None and (held.reason, held.message) not in announced:
        post_event(body, held, namespace, name)
    # One write of every condition that changed (each write replaces the whole list): Ready and Progressing once
    # reconcile_spec posted the first (Ready=Unknown) or the state is invalid, and Closed once closed.
    wanted = (
        conditions_rules.job_conditions(spec or {}, check, status, stored.document)
        if ready is not None or not check.ok
        else []
    )
    closed = conditions_rules.find_condition(status, "Closed")
    closing = bool(status.get("closed")) and (closed is None or closed.get("status") != "True")
    if closing:
        wanted.append(conditions_rules.closed_condition(status))
    if wanted:
        kind = "closed" if closing else "conditions"
        update_conditions(memo.api, namespace, name, status, meta.get("generation"), kind, conditions=wanted)
