"""LeaderElectionConfig (pure, on the in-memory fake API): one validated config, an injected clock, the callbacks.

The run loop that judges renewals on that clock and calls the callbacks is tested in test_writer_renewal (ElectorRun).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kube_rendezvous._engine.folder import WRITER_ELECTION
from kube_rendezvous._kube.election import LeaderElectionConfig
from kube_rendezvous._kube.writer_lease import WriterLease, WriterLock
from kube_rendezvous_operator.leadership import OPERATOR_ELECTION

from tests.fakeapi import FakeKubernetesApi


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
    holder = WriterLease(WriterLock(api, "ns", "job", "agent/a", preferred=False), config(clock))
    candidate = WriterLease(WriterLock(api, "ns", "job", "agent/b", preferred=False), config(clock))
    assert holder.try_acquire_or_renew()
    assert not candidate.try_acquire_or_renew()  # first seen now: not stale
    assert candidate.seconds_until_stale() == pytest.approx(WRITER_ELECTION.lease_duration)
    clock.now += WRITER_ELECTION.lease_duration - 0.1
    assert not candidate.try_acquire_or_renew() and candidate.holder_alive
    clock.now += 0.2
    assert candidate.try_acquire_or_renew()
    assert candidate.taken_from_stale is not None and candidate.taken_from_stale.identity == "agent/a"
    assert not holder.try_acquire_or_renew()  # its renewal is a compare-and-swap on a version it no longer has
