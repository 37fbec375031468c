"""Prometheus metrics of the operator, served on ``METRICS_PORT`` (default 9090) at ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, start_http_server

ROUNDS = Counter(
    "kube_rendezvous_rounds_completed_total", "Rounds completed, as seen by the operator", ["namespace", "name"]
)
JOINS = Counter("kube_rendezvous_node_joins_total", "Nodes that joined a rendezvous", ["namespace", "name"])
LEAVES = Counter(
    "kube_rendezvous_node_leaves_total", "Nodes that left a rendezvous (not evicted)", ["namespace", "name"]
)
EVICTIONS = Counter(
    "kube_rendezvous_node_evictions_total", "Nodes evicted because their pod was gone", ["namespace", "name"]
)
STATE_WRITES = Counter(
    "kube_rendezvous_state_writes_total",
    "Changes of the state observed (agents' successful compare-and-swaps)",
    ["namespace", "name"],
)
WRITE_CONFLICTS = Counter(
    "kube_rendezvous_operator_write_conflicts_total", "409 Conflicts on the operator's own writes"
)
OPERATOR_WRITES = Counter(
    "kube_rendezvous_operator_writes_total", "The operator's writes to Rendezvous objects", ["kind"]
)
RECONCILE_ERRORS = Counter("kube_rendezvous_reconcile_errors_total", "Failed operator actions", ["handler"])
EVENTS = Counter("kube_rendezvous_events_total", "Kubernetes Events posted", ["reason"])
PARTICIPANTS = Gauge("kube_rendezvous_participants", "Nodes in the current round", ["namespace", "name"])
WAITING = Gauge("kube_rendezvous_waiting_nodes", "Nodes waiting for the next round", ["namespace", "name"])
ROUND = Gauge("kube_rendezvous_round", "Current round number", ["namespace", "name"])
SPARES = Gauge("kube_rendezvous_spare_nodes", "Live nodes beyond maxNodes (hot spares)", ["namespace", "name"])
HELD = Gauge("kube_rendezvous_held_nodes", "Nodes whose Kubernetes Node does not admit them", ["namespace", "name"])
PROMOTIONS = Counter(
    "kube_rendezvous_spare_promotions_total", "Spares that took a lost member's place", ["namespace", "name"]
)
#: Every series labelled with one Rendezvous: dropped when it is deleted (``forget``).
PER_RENDEZVOUS = (
    ROUNDS,
    JOINS,
    LEAVES,
    EVICTIONS,
    STATE_WRITES,
    PARTICIPANTS,
    WAITING,
    ROUND,
    SPARES,
    HELD,
    PROMOTIONS,
)
TRACKED = Gauge(
    "kube_rendezvous_operator_tracked_rendezvous",
    "Rendezvous the operator keeps anything of in memory (it forgets each when it is deleted)",
)
TRAINING_PODS = Gauge("kube_rendezvous_operator_training_pods", "Training pods in the operator's pod index")
RESYNCS = Counter("kube_rendezvous_operator_resyncs_total", "Resyncs of a Rendezvous with its training pods")

_LAST_STATE: dict[tuple[str, str], Any] = {}


def serve(port: int) -> None:
    """Start the /metrics HTTP server (idempotent per process)."""
    if ("serving", "") not in _LAST_STATE:
        start_http_server(port)
        _LAST_STATE[("serving", "")] = True


def report_memory(tracked: Callable[[], int], training_pods: Callable[[], int]) -> None:
    """Serve ``TRACKED`` and ``TRAINING_PODS`` from these functions, called at each scrape."""
    TRACKED.set_function(tracked)
    TRAINING_PODS.set_function(training_pods)


def observe(namespace: str, name: str, status: dict[str, Any]) -> None:
    """Update the gauges and the state-write counter from a readable summary (``status``)."""
    PARTICIPANTS.labels(namespace, name).set(status.get("participantCount") or 0)
    WAITING.labels(namespace, name).set(status.get("waitingCount") or 0)
    ROUND.labels(namespace, name).set(status.get("round") or 0)
    SPARES.labels(namespace, name).set(status.get("spareCount") or 0)
    HELD.labels(namespace, name).set(status.get("heldCount") or 0)
    key = (namespace, name)
    fingerprint = hash(status.get("state"))
    if status.get("state") and _LAST_STATE.get(key) != fingerprint:
        if key in _LAST_STATE:
            STATE_WRITES.labels(namespace, name).inc()
        _LAST_STATE[key] = fingerprint


_PER_RENDEZVOUS = {"RoundCompleted": ROUNDS, "NodeJoined": JOINS, "NodeLeft": LEAVES, "SparePromoted": PROMOTIONS}


def count_event(reason: str, namespace: str, name: str, nodes: int = 1) -> None:
    """Count an Event, and in the matching per-rendezvous counter the ``nodes`` it covers."""
    EVENTS.labels(reason).inc()
    if reason in _PER_RENDEZVOUS:
        _PER_RENDEZVOUS[reason].labels(namespace, name).inc(nodes)


def forget(namespace: str, name: str) -> None:
    """Drop the series of a deleted Rendezvous."""
    _LAST_STATE.pop((namespace, name), None)
    for metric in PER_RENDEZVOUS:
        try:
            metric.remove(namespace, name)
        except KeyError:
            pass
