"""Expiry by the observer's own clock, and what a gap in its looking does (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from kube_rendezvous.document import NodeId
from kube_rendezvous.folding import Desire, JoinSettings
from kube_rendezvous.leases import OBSERVER_GAP_SECONDS, LeaseObservations, NodeRecord

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
