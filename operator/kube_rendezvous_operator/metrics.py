"""Prometheus metrics of the operator, served on ``METRICS_PORT`` (default 9090) at ``/metrics``.

Every replica serves them, a standby too (``serve`` is called before the election): ``LEADER`` says which
one acts. Every series of one Rendezvous carries its ``namespace`` and ``name`` and is removed when it is
deleted (``forget``, where the operator drops its record).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

#: The distribution whose version ``BUILD_INFO`` reports.
DISTRIBUTION = "kube-rendezvous"
#: Every ``status.phase`` of a Rendezvous (the CRD's enum): ``PHASE`` has one series per phase, 1 for the current.
PHASES = ("Pending", "Joining", "LastCall", "Complete", "Closed")
#: Buckets of ``RECOVERY`` (seconds): a fast re-rendezvous takes seconds, a replaced pod minutes.
RECOVERY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

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
EVENTS = Counter(
    "kube_rendezvous_events_total",
    "Kubernetes Events posted, by Rendezvous and reason",
    ["namespace", "name", "reason"],
)
PHASE = Gauge(
    "kube_rendezvous_phase",
    "1 for the Rendezvous's current status.phase, 0 for the others",
    ["namespace", "name", "phase"],
)
RECOVERY = Histogram(
    "kube_rendezvous_recovery_seconds",
    "Seconds from a formed round losing members (status.lastDeparture) to the next round forming",
    ["namespace", "name"],
    buckets=RECOVERY_BUCKETS,
)
PARTICIPANTS = Gauge("kube_rendezvous_participants", "Nodes in the current round", ["namespace", "name"])
WAITING = Gauge("kube_rendezvous_waiting_nodes", "Nodes waiting for the next round", ["namespace", "name"])
ROUND = Gauge("kube_rendezvous_round", "Current round number", ["namespace", "name"])
SPARES = Gauge("kube_rendezvous_spare_nodes", "Live nodes beyond maxNodes (hot spares)", ["namespace", "name"])
HELD = Gauge("kube_rendezvous_held_nodes", "Nodes whose Kubernetes Node does not admit them", ["namespace", "name"])
PROMOTIONS = Counter(
    "kube_rendezvous_spare_promotions_total", "Spares that took a lost member's place", ["namespace", "name"]
)
#: Every metric labelled with one Rendezvous, and its labels after ``namespace`` and ``name``: its series are
#: dropped when the Rendezvous is deleted (``forget``).
PER_RENDEZVOUS: tuple[tuple[MetricWrapperBase, tuple[str, ...]], ...] = (
    (ROUNDS, ()),
    (JOINS, ()),
    (LEAVES, ()),
    (EVICTIONS, ()),
    (STATE_WRITES, ()),
    (PARTICIPANTS, ()),
    (WAITING, ()),
    (ROUND, ()),
    (SPARES, ()),
    (HELD, ()),
    (PROMOTIONS, ()),
    (EVENTS, ("reason",)),
    (PHASE, ("phase",)),
    (RECOVERY, ()),
)
TRACKED = Gauge(
    "kube_rendezvous_operator_tracked_rendezvous",
    "Rendezvous the operator keeps anything of in memory (it forgets each when it is deleted)",
)
TRAINING_PODS = Gauge("kube_rendezvous_operator_training_pods", "Training pods in the operator's pod index")
RESYNCS = Counter("kube_rendezvous_operator_resyncs_total", "Resyncs of a Rendezvous with its training pods")
LEADER = Gauge(
    "kube_rendezvous_operator_leader", "1 on the replica that acts (holds the Lease, or runs alone), 0 on a standby"
)
BUILD_INFO = Gauge("kube_rendezvous_operator_build_info", "Always 1: the operator's version", ["version"])

_SERVING: list[int] = []


def package_version() -> str:
    """The installed version of the operator's package (``unknown`` when it is run from a source tree)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def serve(port: int) -> None:
    """Start the /metrics HTTP server (idempotent per process) and report the build."""
    if not _SERVING:
        BUILD_INFO.labels(package_version()).set(1)
        start_http_server(port)
        _SERVING.append(port)


def set_leader(acting: bool) -> None:
    """Say whether this replica acts (``LEADER``)."""
    LEADER.set(1 if acting else 0)


def report_memory(tracked: Callable[[], int], training_pods: Callable[[], int]) -> None:
    """Serve ``TRACKED`` and ``TRAINING_PODS`` from these functions, called at each scrape."""
    TRACKED.set_function(tracked)
    TRAINING_PODS.set_function(training_pods)


def observe(namespace: str, name: str, status: dict[str, Any], *, state_written: bool, recovery: float | None) -> None:
    """Update the gauges from a readable summary (``status``); count a state write; observe a recovery."""
    PARTICIPANTS.labels(namespace, name).set(status.get("participantCount") or 0)
    WAITING.labels(namespace, name).set(status.get("waitingCount") or 0)
    ROUND.labels(namespace, name).set(status.get("round") or 0)
    SPARES.labels(namespace, name).set(status.get("spareCount") or 0)
    HELD.labels(namespace, name).set(status.get("heldCount") or 0)
    current = status.get("phase") or "Pending"
    for phase in PHASES:
        PHASE.labels(namespace, name, phase).set(1 if phase == current else 0)
    if state_written:
        STATE_WRITES.labels(namespace, name).inc()
    if recovery is not None:
        RECOVERY.labels(namespace, name).observe(recovery)


_PER_RENDEZVOUS = {"RoundCompleted": ROUNDS, "NodeJoined": JOINS, "NodeLeft": LEAVES, "SparePromoted": PROMOTIONS}


def count_event(reason: str, namespace: str, name: str, nodes: int = 1) -> None:
    """Count an Event, and in the matching per-rendezvous counter the ``nodes`` it covers."""
    EVENTS.labels(namespace, name, reason).inc()
    if reason in _PER_RENDEZVOUS:
        _PER_RENDEZVOUS[reason].labels(namespace, name).inc(nodes)


def forget(namespace: str, name: str) -> None:
    """Drop every series of a deleted Rendezvous (whatever its other labels: reason, phase)."""
    for metric, others in PER_RENDEZVOUS:
        found = {
            (namespace, name, *(sample.labels[label] for label in others))
            for family in metric.collect()
            for sample in family.samples
            if sample.labels.get("namespace") == namespace and sample.labels.get("name") == name
        }
        for values in found:
            metric.remove(*values)
