"""Expiry by the observer's own clock, and what a gap in its looking does (pure)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

from kube_rendezvous._engine.folder import AGENT_IDENTITY_PREFIX
from kube_rendezvous._kube.leases import OBSERVER_GAP_SECONDS, LeaseObservations, NodeRecord
from kube_rendezvous._kube.writer_lease import StaleHolder, dead_writer_seeds
from kube_rendezvous._rules.document import NodeId
from kube_rendezvous._rules.folder_rules import Desire, JoinSettings

NODE = NodeId("10.0.0.1", 7, 1)


def record(version: str) -> NodeRecord:
    return NodeRecord(
        node=NODE,
        desire=Desire.JOIN,
        settings=JoinSettings(1, 1, timedelta(seconds=30)),
        desired_at=datetime(2026, 12, 3, tzinfo=timezone.utc),
        run_id="run",
        version=version,
        expiry_seconds=15.0,
    )


def watch_every_second(observations: LeaseObservations, start: int, end: int, version: str = "1") -> None:
    for second in range(start, end + 1):
        observations.observe([record(version)], now=float(second))


def test_a_lease_unchanged_for_its_expiry_while_the_observer_looks_is_expired() -> None:
    observations = LeaseObservations()
    watch_every_second(observations, 0, 16)
    assert observations.expired([record("1")], [NODE], 15.0, now=16.0) == {NODE}


def test_a_renewed_lease_is_not_expired() -> None:
    observations = LeaseObservations()
    watch_every_second(observations, 0, 10)
    watch_every_second(observations, 11, 20, version="2")
    assert observations.expired([record("2")], [NODE], 15.0, now=20.0) == set()


def test_changed_within_tells_a_recent_renewal_from_an_old_one_and_an_unseen_lease() -> None:
    observations = LeaseObservations()
    assert not observations.changed_within(NODE, 7.5, now=0.0)  # never seen: not vouched for
    watch_every_second(observations, 0, 5)
    assert observations.changed_within(NODE, 7.5, now=5.0)
    watch_every_second(observations, 6, 9)
    assert not observations.changed_within(NODE, 7.5, now=9.0)  # unchanged since second 0
    watch_every_second(observations, 10, 10, version="2")
    assert observations.changed_within(NODE, 7.5, now=10.0)


def test_after_a_gap_in_looking_every_clock_starts_again() -> None:
    # The observer was frozen from 10 s to 30 s: the renewals of the gap may still wait in its watch.
    observations = LeaseObservations()
    watch_every_second(observations, 0, 10)
    watch_every_second(observations, 30, 44)
    assert observations.gaps == 1
    assert observations.expired([record("1")], [NODE], 15.0, now=44.0) == set()
    watch_every_second(observations, 45, 46)
    assert observations.expired([record("1")], [NODE], 15.0, now=46.0) == {NODE}  # 16 s after the restart


def test_a_freeze_between_looking_and_judging_judges_nobody() -> None:
    observations = LeaseObservations()
    watch_every_second(observations, 0, 14)
    frozen_until = 14.0 + OBSERVER_GAP_SECONDS + 10
    assert observations.expired([record("1")], [NODE], 15.0, now=frozen_until) == set()
    assert observations.gaps == 1


# -- a dead agent writer: its node's expiry runs from the writer Lease's last renewal ----------

WRITER_RENEWED = datetime(2026, 12, 4, 3, 0, 0, tzinfo=timezone.utc)
OTHER = NodeId("10.0.0.2", 8, 1)


def renewed(node: NodeId, at: datetime, version: str = "1") -> NodeRecord:
    return dataclasses.replace(record(version), node=node, renewed_at=at)


def test_a_dead_writers_node_lease_renewed_before_its_writer_lease_is_dated_from_that_renewal() -> None:
    holder = StaleHolder(f"{AGENT_IDENTITY_PREFIX}{NODE}", WRITER_RENEWED, seen_at=100.0)
    records = [renewed(NODE, WRITER_RENEWED - timedelta(seconds=3)), renewed(OTHER, WRITER_RENEWED)]
    assert dead_writer_seeds(holder, records, AGENT_IDENTITY_PREFIX) == [(NODE, "1", 100.0)]


def test_a_dead_writers_node_lease_renewed_after_its_writer_lease_is_dated_that_much_later() -> None:
    # Both stamps come from the dead process's clock: 2.5 s after the writer renewal the candidate saw
    # at 100 s on its own clock. (The old rule left this node unseeded: failover plus a whole expiry.)
    later = [renewed(NODE, WRITER_RENEWED + timedelta(seconds=2.5))]
    holder = StaleHolder(f"{AGENT_IDENTITY_PREFIX}{NODE}", WRITER_RENEWED, seen_at=100.0)
    assert dead_writer_seeds(holder, later, AGENT_IDENTITY_PREFIX) == [(NODE, "1", 102.5)]
    observations = LeaseObservations()
    observations.observe(later, now=112.0)
    observations.seed(NODE, "1", 102.5)
    for second in range(113, 118):
        observations.observe(later, now=float(second))
    assert observations.expired(later, [NODE], 15.0, now=117.0) == set()
    observations.observe(later, now=117.6)
    assert observations.expired(later, [NODE], 15.0, now=117.6) == {NODE}  # not 127 s


def test_no_seed_when_the_writer_was_not_an_agent_or_its_renewal_is_unknown() -> None:
    earlier = [renewed(NODE, WRITER_RENEWED - timedelta(seconds=1))]
    operator = StaleHolder("operator/kube-rendezvous-0", WRITER_RENEWED, seen_at=100.0)
    assert dead_writer_seeds(operator, earlier, AGENT_IDENTITY_PREFIX) == []
    unknown = StaleHolder(f"{AGENT_IDENTITY_PREFIX}{NODE}", None, seen_at=100.0)
    assert dead_writer_seeds(unknown, earlier, AGENT_IDENTITY_PREFIX) == []
    unrenewed = [dataclasses.replace(record("1"), node=NODE, renewed_at=None)]
    holder = StaleHolder(f"{AGENT_IDENTITY_PREFIX}{NODE}", WRITER_RENEWED, seen_at=100.0)
    assert dead_writer_seeds(holder, unrenewed, AGENT_IDENTITY_PREFIX) == []


def test_a_seeded_node_expires_one_expiry_after_the_writer_was_last_seen_and_a_renewal_undoes_the_seed() -> None:
    observations = LeaseObservations()
    # Taken over at 112 s: the writer Lease was last seen changing at 100 s.
    observations.observe([record("1")], now=112.0)
    observations.seed(NODE, "1", 100.0)
    observations.observe([record("1")], now=114.0)
    assert observations.expired([record("1")], [NODE], 15.0, now=114.0) == set()
    observations.observe([record("1")], now=115.5)
    assert observations.expired([record("1")], [NODE], 15.0, now=115.5) == {NODE}  # not 127 s
    renewing = LeaseObservations()
    renewing.observe([record("1")], now=112.0)
    renewing.seed(NODE, "1", 100.0)
    renewing.observe([record("2")], now=113.0)  # it renewed after all: a live node
    assert renewing.expired([record("2")], [NODE], 15.0, now=120.0) == set()


def test_a_seed_never_makes_a_node_look_younger_nor_applies_to_another_version() -> None:
    observations = LeaseObservations()
    observations.observe([record("1")], now=50.0)
    observations.seed(NODE, "1", 60.0)
    assert observations.idle_for(NODE, now=70.0) == 20.0
    observations.seed(NODE, "2", 10.0)
    assert observations.idle_for(NODE, now=70.0) == 20.0
