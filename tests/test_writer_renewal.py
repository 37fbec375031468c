"""ElectorRun, the one election run loop of the writer renewal and of the operator's replicas (pure).

Stand-in electors (renewals that answer True, False, raise, or hang) and the in-memory fake API,
with the injected clock where the timing is judged: the holder keeps holding while renewals
succeed, stops at once when its Lease is lost, at the renew deadline (not later) when renewals
hang or fail, and both users count a renewal from when it was sent.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, cast

import pytest
from kube_rendezvous._engine import folder
from kube_rendezvous._engine.folder import Folder
from kube_rendezvous._kube.election import ElectorRun, LeaderElectionConfig
from kube_rendezvous._kube.kubeapi import ApiUnavailableError, resource_path
from kube_rendezvous._kube.watchcache import WatchCache
from kube_rendezvous._rules.election_rules import LEASE_PLURAL
from kube_rendezvous_operator import leadership
from kube_rendezvous_operator.leadership import STANDBY_LOG_SECONDS, Leadership

from tests.fakeapi import FakeKubernetesApi
from tests.testenv import wait_until

FAST = LeaderElectionConfig(lease_duration=1.0, renew_deadline=0.5, retry_period=0.05, request_timeout=0.2)


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class StandIn:
    """An elector whose steps answer True, False, raise, or hang until released."""

    identity = "agent/a"
    holder: str | None = "agent/a"

    def __init__(self, answer: bool | None = True, config: LeaderElectionConfig = FAST) -> None:
        self.config = config
        self.answer = answer  # None: hang until ``release``
        self.calls = 0
        self.released = threading.Event()

    def describe(self) -> str:
        return "Lease ns/stand-in"

    def try_acquire_or_renew(self) -> bool:
        self.calls += 1
        if self.answer is None:
            self.released.wait(30)
            return True
        if not self.answer:
            self.holder = "agent/b"
        return self.answer


class Failing(StandIn):
    def try_acquire_or_renew(self) -> bool:
        self.calls += 1
        raise ApiUnavailableError("PUT leases/rdzv-writer: connection refused")


def held(elector: StandIn) -> ElectorRun:
    """A term of ``elector`` that has acquired its Lease (one successful step), not started yet."""
    term = ElectorRun(elector)
    answer, elector.answer = elector.answer, True
    assert term.acquire(threading.Event(), lambda failed: 0.0)
    elector.answer = answer
    return term


def with_stop(elector: StandIn) -> tuple[StandIn, threading.Event]:
    """``elector`` on a copy of its config whose ``on_stopped_leading`` sets the returned event."""
    stopped = threading.Event()
    elector.config = dataclasses.replace(elector.config, on_stopped_leading=stopped.set)
    return elector, stopped


def test_it_keeps_holding_while_renewals_succeed() -> None:
    elector, stopped = with_stop(StandIn(True))
    term = held(elector).start()
    try:
        wait_until(lambda: elector.calls >= 15, 5, "15 renewals")  # 0.75 s: past the deadline
        assert term.holding() and not stopped.is_set()
    finally:
        term.stop()
    assert not stopped.is_set()  # stopped by its caller: no on_stopped_leading


def test_a_refused_renewal_ends_the_term_at_once_and_calls_on_stopped_leading() -> None:
    # The operator exits at once when its Lease is lost (``exit_now``); the folder stops folding.
    elector, stopped = with_stop(StandIn(False))
    term = held(elector).start()
    try:
        wait_until(stopped.is_set, 5, "on_stopped_leading after the Lease was lost")
        assert term.lost and not term.holding() and elector.calls == 2  # the acquiring step, one renewal
    finally:
        term.stop()


def test_a_renewal_that_hangs_ends_the_holding_at_the_deadline_not_later() -> None:
    # The API server answered a Lease PUT after 10-25 s at N=1024: the writer must not fold past its deadline,
    # and the operator must exit at its deadline, not when the hung renewal returns.
    elector, stopped = with_stop(StandIn(None))
    term = held(elector)
    began = time.monotonic()
    term.start()
    try:
        wait_until(lambda: not term.holding(), 5, "the holding ends")
        wait_until(stopped.is_set, 5, "on_stopped_leading at the deadline")
        assert time.monotonic() - began < 3.0  # the deadline is 0.5 s; the hung renewal lasts 30 s
        assert not term.lost  # not refused: the API server did not answer in time
        renewed_at = term.renewed_at
        elector.released.set()  # the hung renewal is answered now, after the deadline: too late
        time.sleep(0.2)
        assert not term.holding() and term.renewed_at == renewed_at and elector.calls == 2
    finally:
        elector.released.set()
        term.stop()


def test_failed_renewals_are_retried_and_count_as_no_renewal() -> None:
    elector, stopped = with_stop(Failing())
    term = ElectorRun(elector)
    term.renewed_at = FAST.clock()  # as if a step sent now had acquired it
    term.start()
    try:
        wait_until(lambda: not term.holding(), 5, "the holding ends")
        wait_until(stopped.is_set, 5, "on_stopped_leading at the deadline")
        assert elector.calls >= 3 and not term.lost
    finally:
        term.stop()


def test_a_failed_or_refused_step_does_not_acquire_and_pauses_as_told() -> None:
    pauses: list[bool] = []
    stopped = threading.Event()

    def pause(failed: bool) -> float:
        pauses.append(failed)
        if len(pauses) % 2 == 0:
            stopped.set()
        return 0.0

    elector: StandIn = Failing()
    assert not ElectorRun(elector).acquire(stopped, pause)
    elector, stopped = StandIn(False), threading.Event()
    assert not ElectorRun(elector).acquire(stopped, pause)
    assert pauses == [True, True, False, False]


def test_a_renewal_is_judged_against_the_renew_deadline_on_the_injected_clock() -> None:
    clock = FakeClock()
    slow = dataclasses.replace(FAST, clock=clock, retry_period=3600.0, renew_deadline=3700.0, lease_duration=3800.0)
    term = held(StandIn(True, slow)).start()  # its first renewal comes after an hour: never, here
    try:
        assert term.holding() and term.renewed_at == clock.now
        clock.now += 3699.0
        assert term.holding()
        clock.now += 2.0
        assert not term.holding()
    finally:
        term.stop()


class SlowLeases(FakeKubernetesApi):
    """The fake API, where every request on the Lease ``name`` takes ``latency`` s of the injected clock.

    Records the clock when each renewal (a PUT with a holder) was sent and when it was answered.
    """

    def __init__(self, clock: FakeClock, name: str, latency: float = 2.0) -> None:
        super().__init__()
        self.clock, self.name, self.latency = clock, name, latency
        self.puts: list[tuple[float, float]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if not path.endswith(f"/leases/{self.name}") and not (method == "POST" and path.endswith("/leases")):
            return super().request(method, path, **kwargs)
        sent = self.clock.now
        self.clock.now += self.latency
        answer = super().request(method, path, **kwargs)
        if method == "PUT" and kwargs["body"]["spec"]["holderIdentity"]:  # a renewal, not the release
            self.puts.append((sent, self.clock.now))
        return answer


class NoRendezvous:
    """A watch of a Rendezvous that does not exist (the folder then only holds its writer Lease)."""

    healthy = True

    def add_listener(self, listener: Any) -> None:
        pass

    def get(self, name: str) -> None:
        return None


def operator_term(api: SlowLeases, config: LeaderElectionConfig) -> tuple[ElectorRun, Any]:
    leader = Leadership(cast(Any, api), "ns", "operator-0", config)
    leader.acquire()
    leader.start_renewing()
    return leader.term, leader.release


def folder_term(api: SlowLeases, config: LeaderElectionConfig) -> tuple[ElectorRun, Any]:
    rendezvous = cast(WatchCache, NoRendezvous())
    writer = Folder(
        cast(Any, api), "ns", "job", identity="agent/a", preferred=False, rendezvous=rendezvous, election=config
    )
    stopped = threading.Event()
    thread = threading.Thread(target=writer.run, args=(stopped,), daemon=True)
    thread.start()
    term = wait_until(lambda: writer.term, 5, "the folder to hold its writer Lease")

    def stop() -> None:
        stopped.set()
        thread.join(10)

    return term, stop


USERS = pytest.mark.parametrize(
    ("user", "lease"), [(operator_term, leadership.LEASE_NAME), (folder_term, "job-writer")]
)


@USERS
def test_both_users_count_the_acquiring_step_from_when_it_was_sent(user: Any, lease: str) -> None:
    clock = FakeClock()
    # No renewal within the test (the first comes after an hour of real time): the term is the acquiring step's.
    config = dataclasses.replace(
        FAST, clock=clock, retry_period=3600.0, renew_deadline=3700.0, lease_duration=3800.0, request_timeout=3.0
    )
    api = SlowLeases(clock, lease)  # each Lease request: 2 s of the injected clock
    term, stop = user(api, config)
    try:
        assert clock.now >= 1004.0  # the step read, then created the Lease: 4 s on the injected clock
        assert term.renewed_at == 1000.0 and term.holding()  # counted from its send, not its answer
    finally:
        stop()


@USERS
def test_both_users_count_a_renewal_from_when_it_was_sent_not_when_it_was_answered(user: Any, lease: str) -> None:
    clock = FakeClock()
    config = dataclasses.replace(FAST, clock=clock, lease_duration=10.0, renew_deadline=7.0, request_timeout=3.0)
    api = SlowLeases(clock, lease)  # each Lease request: 2 s of the injected clock
    term, stop = user(api, config)
    try:
        wait_until(lambda: len(api.puts) >= 3, 5, "three renewals")
    finally:
        stop()  # returns once no renewal is in flight
    sent, answered = api.puts[-1]
    assert answered - sent == 2.0 and term.renewed_at == sent


def test_a_standby_logs_every_standby_log_seconds(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    standby = Leadership(cast(Any, FakeKubernetesApi()), "ns", "operator-1", dataclasses.replace(FAST, clock=clock))
    steps = 0

    def step() -> bool:
        """Held by operator-0 for 12 steps, STANDBY_LOG_SECONDS / 4 apart on the injected clock; free at the 13th."""
        nonlocal steps
        steps += 1
        clock.now += STANDBY_LOG_SECONDS / 4
        standby.elector.holder = "operator-0"
        return steps == 13

    monkeypatch.setattr(standby.elector, "try_acquire_or_renew", step)
    caplog.set_level(logging.INFO, logger=leadership.__name__)
    standby.acquire()
    logged = [record.getMessage() for record in caplog.records if record.getMessage().startswith("standing by")]
    assert len(logged) == 3  # after steps 1, 5 and 9 of the 12 it waited after
    assert all("held by operator-0" in message for message in logged)
    assert standby.term.renewed_at == clock.now - STANDBY_LOG_SECONDS / 4  # the 13th step, when sent


def test_the_operator_leader_calls_its_callbacks_on_start_and_on_losing_its_lease() -> None:
    api: Any = FakeKubernetesApi()
    started, stopped = threading.Event(), threading.Event()
    fast = dataclasses.replace(FAST, retry_period=0.02, on_started_leading=started.set, on_stopped_leading=stopped.set)
    leader = Leadership(api, "ns", "operator-0", fast)
    leader.acquire()
    assert started.is_set() and not stopped.is_set()
    leader.start_renewing()
    path = resource_path(LEASE_PLURAL, "ns", leadership.LEASE_NAME)
    lease = api.request("GET", path)
    lease["spec"]["holderIdentity"] = "operator-1"  # another replica took it (as after this one froze)
    api.request("PUT", path, body=lease)
    wait_until(stopped.is_set, 5, "the leader's on_stopped_leading after it lost its Lease")
    assert leader.term.lost
    leader.release()


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
