"""LeaderElectionConfig (pure, on the in-memory fake API): one validated config, an injected clock, the callbacks."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from kube_rendezvous._engine.folder import WRITER_ELECTION, WriterRenewal
from kube_rendezvous._kube.election import LeaderElectionConfig, WriterLease
from kube_rendezvous_operator.leadership import OPERATOR_ELECTION, Leadership

from tests.fakeapi import FakeKubernetesApi
from tests.testenv import wait_until


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def config(clock: FakeClock, **changes: Any) -> LeaderElectionConfig:
    return dataclasses.replace(WRITER_ELECTION, clock=clock, **changes)


@pytest.mark.parametrize(
    ("timings", "named"),
    [
        ({"retry_period": 7.0}, "retry_period (7 s) < renew_deadline (7 s)"),
        ({"renew_deadline": 10.0}, "renew_deadline (10 s) < lease_duration (10 s)"),
        ({"retry_period": 0.0}, "0 < retry_period (0 s)"),
        ({"request_timeout": 7.5}, "request_timeout (7.5 s) < renew_deadline (7 s)"),
    ],
)
def test_timings_that_would_let_two_holders_act_are_refused_with_the_field_and_the_fix(
    timings: dict[str, float], named: str
) -> None:
    with pytest.raises(ValueError) as refused:
        dataclasses.replace(WRITER_ELECTION, **timings)
    assert named in str(refused.value)
    assert "shorten" in str(refused.value)


def test_the_folder_and_the_operator_share_one_kind_of_config() -> None:
    assert isinstance(WRITER_ELECTION, LeaderElectionConfig) and isinstance(OPERATOR_ELECTION, LeaderElectionConfig)
    assert OPERATOR_ELECTION.on_stopped_leading is not None  # a leader that lost its Lease exits
    assert WRITER_ELECTION.on_stopped_leading is None


def test_a_candidate_takes_a_lease_only_after_it_stood_unchanged_for_the_duration_on_the_injected_clock() -> None:
    api: Any = FakeKubernetesApi()
    clock = FakeClock()
    holder = WriterLease(api, "ns", "job", "agent/a", config(clock), preferred=False)
    candidate = WriterLease(api, "ns", "job", "agent/b", config(clock), preferred=False)
    assert holder.try_acquire_or_renew()
    assert not candidate.try_acquire_or_renew()  # first seen now: not stale
    assert candidate.seconds_until_stale() == pytest.approx(WRITER_ELECTION.lease_duration)
    clock.now += WRITER_ELECTION.lease_duration - 0.1
    assert not candidate.try_acquire_or_renew() and candidate.holder_alive
    clock.now += 0.2
    assert candidate.try_acquire_or_renew()
    assert candidate.taken_from_stale is not None and candidate.taken_from_stale.identity == "agent/a"
    assert not holder.try_acquire_or_renew()  # its renewal is a compare-and-swap on a version it no longer has


def test_a_renewal_is_judged_against_the_renew_deadline_on_the_injected_clock() -> None:
    clock = FakeClock()

    class Silent:
        """An elector whose renewal thread never gets an answer through (it never returns)."""

        def __init__(self) -> None:
            self.config = config(clock, retry_period=3600.0, renew_deadline=3700.0, lease_duration=3800.0)

        def try_acquire_or_renew(self) -> bool:
            return True

    renewal = WriterRenewal(Silent(), "ns/job").start()  # type: ignore[arg-type]
    try:
        assert renewal.holding()
        clock.now += 3699.0
        assert renewal.holding()
        clock.now += 2.0
        assert not renewal.holding()
    finally:
        renewal.stop()


def test_the_operator_leader_calls_its_callbacks_on_start_and_on_losing_its_lease() -> None:
    api: Any = FakeKubernetesApi()
    started, stopped = threading.Event(), threading.Event()
    fast = LeaderElectionConfig(
        lease_duration=1.0,
        renew_deadline=0.5,
        retry_period=0.02,
        request_timeout=0.2,
        on_started_leading=started.set,
        on_stopped_leading=stopped.set,
    )
    leader = Leadership(api, "ns", "operator-0", fast)
    leader.acquire()
    assert started.is_set() and not stopped.is_set()
    leader.start_renewing()
    lease = api.request("GET", leader.elector._path)
    lease["spec"]["holderIdentity"] = "operator-1"  # another replica took it (as after this one froze)
    api.request("PUT", leader.elector._path, body=lease)
    wait_until(stopped.is_set, 5, "the leader's on_stopped_leading after it lost its Lease")
    leader.release()
