"""The NotReady-node rule: evict the nodes of training pods on a Kubernetes Node NotReady past its wait.

Its decisions are ``not_ready_rules``'s; ``nodes`` tells which Nodes are NotReady. A task per
Rendezvous (``lifecycle``) judges a Node's pods as soon as its wait ends; every resync judges them again
(``resync.resync_pods``), so the rule holds after a restart or a missed Node event too. Nodes whose
agents still heartbeat are spared.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from kube_rendezvous import KubernetesApiError, RendezvousDocument, format_time

from . import conditions_rules, lost_nodes, not_ready_rules
from .evictions import evict_and_report
from .memory import Key, OperatorMemo
from .nodes import NodeReadiness, NotReady
from .writer import heartbeats
from .writer_rules import merge_heartbeats

logger = logging.getLogger(__name__)


def not_ready_wait(memo: OperatorMemo, key: Key) -> timedelta:
    """How long after its Node went NotReady a pod of ``key`` has its nodes evicted.

    ``not_ready_rules.not_ready_wait`` of the operator's grace and ``key``'s keep-alive interval.
    """
    grace = timedelta(seconds=memo.config.node_not_ready_seconds)
    record = memo.get(key)
    keep_alive = record.keep_alive if record is not None else None
    return not_ready_rules.not_ready_wait(
        grace, conditions_rules.timings({}).keep_alive_interval if keep_alive is None else keep_alive
    )


def not_ready_nodes(memo: OperatorMemo) -> dict[str, NotReady]:
    """The NotReady Kubernetes Nodes (none while they are not watched or cannot be read)."""
    readiness = memo.node_rule.readiness
    return {} if readiness is None else readiness.not_ready()


def evict_on_not_ready(
    memo: OperatorMemo,
    key: Key,
    pods: Iterable[dict[str, Any]],
    document: RendezvousDocument,
    only: str | None = None,
) -> None:
    """Evict the nodes of ``key``'s ``pods`` that run on a Node NotReady past its wait (Node ``only``, if given).

    ``document`` must carry the nodes' current heartbeats (their Leases): a node that heartbeats
    after its Node went NotReady (plus the slack) is alive and is not evicted
    (``not_ready_rules.nodes_on_not_ready_node``).
    """
    namespace, name = key
    pods = list(pods)
    record = memo.get(key)
    if record is None:
        return  # forgotten: deleted
    observed = record.observed
    if document.closed or (observed is not None and observed.status.get("closed")):
        return
    states = not_ready_nodes(memo)
    if only is not None:
        states = {only: states[only]} if only in states else {}
    now = datetime.now(timezone.utc)
    on_nodes = not_ready_rules.pods_on_not_ready_nodes(
        pods, {node: state.since for node, state in states.items()}, now, not_ready_wait(memo, key)
    )
    for node, on_node in sorted(on_nodes.items()):
        state = states[node]
        judged = (node, state.since)
        evict, alive = not_ready_rules.nodes_on_not_ready_node(on_node, document, state.since)
        with memo.lock:
            record.not_ready_judged.add(judged)
            spare = bool(alive) and judged not in record.not_ready_spared
            if spare:
                record.not_ready_spared.add(judged)
        if spare:
            logger.info(
                "Kubernetes node %s is NotReady since %s, but nodes %s of rendezvous %s/%s on it heartbeat "
                "after that: their agents are alive; not evicted",
                node,
                format_time(state.since),
                ", ".join(str(item) for item in alive),
                namespace,
                name,
            )
        whose = "its" if len(evict) == 1 else "their"
        with memo.node_rule.judging:
            evict_and_report(
                memo,
                namespace,
                name,
                [str(item) for item in evict],
                f"{whose} Kubernetes node {node} is NotReady (Ready={state.status}) since {format_time(state.since)}",
            )
            lost_nodes.tell_node_lost(memo, key, node, state, on_node, document)
    with memo.node_rule.judging:
        lost_nodes.fail_lost_pods(memo, key, pods, document, states, now)


def evict_on_not_ready_node(memo: OperatorMemo, key: Key, node: str) -> None:
    """Judge ``key``'s pods on Node ``node`` now that its grace ended: read heartbeats, evict the silent."""
    record = memo.get(key)
    stored = record.state if record is not None else None
    if stored is None or stored.document is None:
        return
    pods = memo.pods_of(key) or []

    try:
        beats = heartbeats(memo.api, *key)
    except KubernetesApiError as exc:
        logger.info("could not read the heartbeats of %s/%s (the next resync judges node %s): %s", *key, node, exc)
        return
    evict_on_not_ready(memo, key, pods, merge_heartbeats(stored.document, beats, every_node=True), only=node)


def due_not_ready(memo: OperatorMemo, key: Key, now: datetime) -> tuple[list[str], datetime | None]:
    """The Nodes whose grace ended for ``key``'s pods and that were not judged yet, or that have pods to mark
    Failed (``lost_nodes.fail_due``); when the next grace (or wait to mark pods Failed) ends."""
    states = not_ready_nodes(memo)
    record = memo.get(key)
    if record is None:
        return [], None  # forgotten: deleted
    with memo.lock:  # forget what was judged of Nodes that are Ready again (or NotReady anew)
        current = {(node, state.since) for node, state in states.items()}
        record.not_ready_judged = {item for item in record.not_ready_judged if item in current}
        record.not_ready_spared = {item for item in record.not_ready_spared if item in current}
        record.node_lost_told = {item for item in record.node_lost_told if item in current}
        judged = {node for node, _ in record.not_ready_judged}
    if not states:
        return [], None
    pods = memo.pods_of(key) or []
    wait = not_ready_wait(memo, key)
    since = {node: state.since for node, state in states.items()}
    due = [node for node in not_ready_rules.pods_on_not_ready_nodes(pods, since, now, wait) if node not in judged]
    failing, fail_at = lost_nodes.fail_due(memo, key, pods, since, now)
    due += [node for node in failing if node not in due]
    next_at = min((moment + wait for moment in since.values() if moment + wait > now), default=None)
    return due, min((moment for moment in (next_at, fail_at) if moment is not None), default=None)


async def evict_on_not_ready_nodes(memo: OperatorMemo, key: Key, stopped: asyncio.Event) -> None:
    """When the grace of a Node that runs ``key``'s pods ends, judge them at once (a task, until ``stopped``).

    Wakes when a Node's readiness changes and when the next grace ends, at least every resync
    interval; the resyncs judge the Nodes again (``resync.resync_pods``).
    """
    record = memo.get(key)
    if record is None:
        return  # forgotten before it started: deleted
    wake = asyncio.Event()
    record.not_ready_wake = wake
    try:
        while not stopped.is_set():
            wake.clear()
            now = datetime.now(timezone.utc)
            due, next_at = due_not_ready(memo, key, now)
            for node in due:
                await asyncio.to_thread(evict_on_not_ready_node, memo, key, node)
            delay = memo.config.resync_seconds
            if next_at is not None:
                delay = min(delay, max(0.05, (next_at - datetime.now(timezone.utc)).total_seconds()))
            waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())}
            try:
                await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
    finally:
        if record.not_ready_wake is wake:
            record.not_ready_wake = None


async def start_node_rule(memo: OperatorMemo, **_: Any) -> None:
    """Watch the Kubernetes Nodes for the NotReady-node rule (Kopf's startup)."""
    loop = asyncio.get_running_loop()

    def changed() -> None:
        loop.call_soon_threadsafe(memo.wake_all)
        memo.wake_folders()  # a Node's labels or admission changed: fold again

    memo.node_rule.readiness = NodeReadiness(memo.api, on_change=changed).start()


async def stop_node_rule(memo: OperatorMemo, **_: Any) -> None:
    """Stop watching the Nodes (Kopf's cleanup)."""
    if memo.node_rule.readiness is not None:
        memo.node_rule.readiness.stop()
