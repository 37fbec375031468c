"""WriterRenewal (pure: a stand-in elector): the writer folds while its Lease is renewed, and stops in time."""

from __future__ import annotations

import threading
import time

import pytest
from kube_rendezvous._engine import folder
from kube_rendezvous._engine.folder import WriterRenewal
from kube_rendezvous._kube.election import LeaderElectionConfig
from kube_rendezvous._kube.kubeapi import ApiUnavailableError

from tests.testenv import wait_until

FAST = LeaderElectionConfig(lease_duration=1.0, renew_deadline=0.5, retry_period=0.05, request_timeout=0.2)


class StandIn:
    """An elector whose renewals answer True, False, raise, or hang until released."""

    config = FAST

    def __init__(self, answer: bool | None = True) -> None:
        self.answer = answer  # None: hang until ``release``
        self.calls = 0
        self.released = threading.Event()

    def try_acquire_or_renew(self) -> bool:
        self.calls += 1
        if self.answer is None:
            self.released.wait(30)
            return True
        return self.answer


def test_it_keeps_holding_while_renewals_succeed() -> None:
    elector = StandIn(True)
    renewal = WriterRenewal(elector, "ns/rdzv").start()  # type: ignore[arg-type]
    try:
        wait_until(lambda: elector.calls >= 15, 5, "15 renewals")  # 0.75 s: past the deadline
        assert renewal.holding()
    finally:
        renewal.stop()


def test_a_refused_renewal_stops_the_holding_at_once() -> None:
    elector = StandIn(False)
    renewal = WriterRenewal(elector, "ns/rdzv").start()  # type: ignore[arg-type]
    try:
        wait_until(lambda: not renewal.holding(), 5, "the holding ends")
        assert renewal.lost and elector.calls == 1
    finally:
        renewal.stop()


def test_a_renewal_that_hangs_ends_the_holding_at_the_deadline_not_later() -> None:
    # The API server answered a Lease PUT after 10-25 s at N=1024: the writer must not fold past its deadline.
    elector = StandIn(None)
    renewal = WriterRenewal(elector, "ns/rdzv").start()  # type: ignore[arg-type]
    began = time.monotonic()
    try:
        wait_until(lambda: not renewal.holding(), 5, "the holding ends")
        assert time.monotonic() - began < 3.0  # the deadline is 0.5 s; the hung renewal lasts 30 s
        assert not renewal.lost  # not refused: it may hold again once the answer comes
    finally:
        elector.released.set()
        renewal.stop()


def test_failed_renewals_are_retried_and_count_as_no_renewal() -> None:
    class Failing(StandIn):
        def try_acquire_or_renew(self) -> bool:
            self.calls += 1
            raise ApiUnavailableError("PUT leases/rdzv-writer: connection refused")

    elector = Failing()
    renewal = WriterRenewal(elector, "ns/rdzv").start()  # type: ignore[arg-type]
    try:
        wait_until(lambda: not renewal.holding(), 5, "the holding ends")
        assert elector.calls >= 3 and not renewal.lost
    finally:
        renewal.stop()


class TestCandidateWait:
    """When an agent looks at the writer Lease again: its failover bound (pure)."""

    def test_a_candidate_that_has_not_seen_the_lease_waits_its_jittered_retry(self) -> None:
        assert folder.candidate_wait(None, 0.8) == pytest.approx(0.8 * folder.CANDIDATE_RETRY_SECONDS)
        assert folder.candidate_wait(None, 1.0) == folder.CANDIDATE_RETRY_SECONDS

    def test_it_looks_again_just_after_the_lease_as_seen_would_turn_stale(self) -> None:
        assert folder.candidate_wait(1.5, 1.0) == pytest.approx(1.5 + folder.STALE_MARGIN_SECONDS)
        assert folder.candidate_wait(30.0, 0.9) == pytest.approx(0.9 * folder.CANDIDATE_RETRY_SECONDS)
        assert folder.candidate_wait(-3.0, 1.0) == 0.05  # stale already: look (and take) now

    def test_a_writer_that_died_is_replaced_within_the_bound_after_its_last_renewal(self) -> None:
        # Simulate a candidate's looks on its own clock: the writer renews every 2 s until it dies
        # at ``death``; a look sees the version of the last renewal before it, and the candidate
        # takes the Lease at its first look after that version went unchanged for the duration.
        bound = folder.CANDIDATE_RETRY_SECONDS + folder.WRITER_ELECTION.lease_duration + folder.STALE_MARGIN_SECONDS
        assert bound <= 15.0  # issue #12: failover of the writer is bounded (<= 15 s)
        for phase in (0.0, 0.7, 1.3, 1.99):
            for death in (0.0, 3.1, 5.0, 7.9):
                for jitter in (0.8, 0.9, 1.0):
                    last = max(t for t in (phase + 2.0 * k for k in range(-5, 10)) if t <= death)
                    clock, seen, seen_at = 0.0, None, 0.0
                    while True:
                        version = max(t for t in (phase + 2.0 * k for k in range(-5, 10)) if t <= min(clock, death))
                        if version != seen:
                            seen, seen_at = version, clock
                        elif clock - seen_at > folder.WRITER_ELECTION.lease_duration:
                            break  # stale on this clock: the candidate takes it now
                        until_stale = seen_at + folder.WRITER_ELECTION.lease_duration - clock
                        clock += folder.candidate_wait(until_stale, jitter)
                    assert folder.WRITER_ELECTION.lease_duration < clock - last <= bound + 1e-9, (phase, death, jitter)
