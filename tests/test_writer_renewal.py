"""WriterRenewal (pure: a stand-in elector): the writer folds while its Lease is renewed, and stops in time."""

from __future__ import annotations

import threading
import time

import pytest
from kube_rendezvous import folder
from kube_rendezvous.folder import WriterRenewal
from kube_rendezvous.kubeapi import ApiUnavailableError

from tests.testenv import wait_until


class StandIn:
    """An elector whose renewals answer True, False, raise, or hang until released."""

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


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folder, "WRITER_RENEW_SECONDS", 0.05)
    monkeypatch.setattr(folder, "WRITER_RENEW_DEADLINE_SECONDS", 0.5)


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
