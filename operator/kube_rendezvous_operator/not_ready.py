"""The NotReady-node rule: evict the nodes of training pods on a Kubernetes Node NotReady past its wait.

Its decisions are ``not_ready_rules``'s; ``nodes`` tells which Nodes are NotReady. A task per
Rendezvous (``lifecycle``) judges a Node's pods as soon as its wait ends; every resync judges them again
(``pods.resync_pods``), so the rule holds after a restart or a missed Node event too. Nodes whose
agents still heartbeat are spared.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from kube_rendezvous import KubernetesApiError, RendezvousDocument, format_time

from . import handlers_rules, not_ready_rules
from .memory import Key, OperatorMemo, evict_and_report
from .nodes import NodeReadiness, NotReady
from .writer import heartbeats, merge_heartbeats

logger = logging.getLogger(__name__)


def not_ready_wait(memo: OperatorMemo, key: Key) -> timedelta:
    """How long after its Node went NotReady a pod of ``key`` has its nodes evicted.

    ``not_ready_rules.not_ready_wait`` of the operator's grace and ``key``'s keep-alive interval.
    """
    grace = timedelta(seconds=memo.config.node_not_ready_seconds)
    return not_ready_rules.not_ready_wait(
        grace, memo.keep_alive.get(key, handlers_rules.timings({}).keep_alive_interval)
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
    observed = memo.observed.get(key)
    if document.closed or (observed is not None and observed.status.get("closed")):
        return
    states = not_ready_nodes(memo)
    if only is not None:
        states = {only: states[only]} if only in states else {}
    now = datetime.now(timezone.utc)
    on_nodes = not_ready_rules.pods_on_not_ready_nodes(
        pods, {node: state.since for node, state in states.items()}, now, not_ready_wait(memo, key)
    )
    rule = memo.node_rule
    for node, on_node in sorted(on_nodes.items()):
        state = states[node]
        judged = (key, node, state.since)
        evict, alive = not_ready_rules.nodes_on_not_ready_node(on_node, document, state.since)
        with rule.lock:
            rule.judged.add(judged)
            spare = bool(alive) and judged not in rule.spared
            if spare:
                rule.spared.add(judged)
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
        with rule.judging:
            evict_and_report(
                memo,
                namespace,
                name,
                [str(item) for item in evict],
                f"{whose} Kubernetes node {node} is NotReady (Ready={state.status}) since {format_time(state.since)}",
            )


def evict_on_not_ready_node(memo: OperatorMemo, key: Key, node: str) -> None:
    """Judge ``key``'s pods on Node ``node`` now that its grace ended: read heartbeats, evict the silent."""
    stored = memo.states.get(key)
    if stored is None or stored.document is None:
        return
    with memo.pods_lock:
        pods = list((memo.pods.get(key) or {}).values())

    try:
        beats = heartbeats(memo.api, *key)
    except KubernetesApiError as exc:
        logger.info("could not read the heartbeats of %s/%s (the next resync judges node %s): %s", *key, node, exc)
        return
    evict_on_not_ready(memo, key, pods, merge_heartbeats(stored.document, beats, every_node=True), only=node)


def due_not_ready(memo: OperatorMemo, key: Key, now: datetime) -> tuple[list[str], datetime | None]:
    """The Nodes whose grace ended for ``key``'s pods and that were not judged yet; when the next grace ends."""
    states = not_ready_nodes(memo)
    rule = memo.node_rule
    with rule.lock:  # forget what was judged of Nodes that are Ready again (or NotReady anew)
        current = {(node, state.since) for node, state in states.items()}
        rule.judged = {item for item in rule.judged if (item[1], item[2]) in current}
        rule.spared = {item for item in rule.spared if (item[1], item[2]) in current}
        judged = {item[1] for item in rule.judged if item[0] == key}
    if not states:
        return [], None
    with memo.pods_lock:
        pods = list((memo.pods.get(key) or {}).values())
    wait = not_ready_wait(memo, key)
    since = {node: state.since for node, state in states.items()}
    due = [node for node in not_ready_rules.pods_on_not_ready_nodes(pods, since, now, wait) if node not in judged]
    return due, min((moment + wait for moment in since.values() if moment + wait > now), default=None)


async def evict_on_not_ready_nodes(memo: OperatorMemo, key: Key, stopped: asyncio.Event) -> None:
    """When the grace of a Node that runs ``key``'s pods ends, judge them at once (a task, until ``stopped``).

    Wakes when a Node's readiness changes and when the next grace ends, at least every resync
    interval; the resyncs judge the Nodes again (``pods.resync_pods``).
    """
    wake = asyncio.Event()
    memo.node_rule.wakes[key] = wake
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
        if memo.node_rule.wakes.get(key) is wake:
            del memo.node_rule.wakes[key]


async def start_node_rule(memo: OperatorMemo, **_: Any) -> None:
    """Watch the Kubernetes Nodes for the NotReady-node rule (Kopf's startup)."""
    loop = asyncio.get_running_loop()
    rule = memo.node_rule

    def changed() -> None:
        loop.call_soon_threadsafe(rule.wake_all)
        for wake in list(memo.wake_folder.values()):  # a Node's labels or admission changed: fold again
            wake()

    rule.readiness = NodeReadiness(memo.api, on_change=changed).start()


async def stop_node_rule(memo: OperatorMemo, **_: Any) -> None:
    """Stop watching the Nodes (Kopf's cleanup)."""
    if memo.node_rule.readiness is not None:
        memo.node_rule.readiness.stop()
