"""The generic elector against an in-memory lock (pure): acquire, renew, lose, release, expire, callbacks.

``LeaderElector`` and ``ElectorRun`` over ``MemoryLock``, a ``ResourceLock`` that keeps one record in
memory (a compare-and-swap on its version, as the Lease lock's update is), on an injected clock:
nothing of a rendezvous, no API server. The Lease lock itself (the record on a Lease's ``spec``) is
tested at the end; the writer Lease above the elector in test_lease_elector and test_election_config.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import pytest
from kube_rendezvous._kube.election import (
    BECAME_LEADER,
    ElectorRun,
    LeaderElectionConfig,
    LeaderElector,
    LeaseLock,
    ResourceLock,
    Takeover,
)
from kube_rendezvous._kube.kubeapi import ConflictError, NotFoundError
from kube_rendezvous._rules.election_rules import (
    LeaderElectionRecord,
    is_expired,
    lease_spec,
    next_record,
    record_of_lease,
)

from tests.fakeapi import FakeKubernetesApi
from tests.test_writer_renewal import FakeClock
from tests.testenv import wait_until

pytestmark = pytest.mark.pure

FAST = LeaderElectionConfig(lease_duration=1.0, renew_deadline=0.5, retry_period=0.02, request_timeout=0.2)


class Store:
    """The one lock the candidates share: its record and version (None: it does not exist), and the events."""

    def __init__(self) -> None:
        self.record: LeaderElectionRecord | None = None
        self.version = 0
        self.events: list[tuple[str, str]] = []
        self.calls: list[str] = []


class MemoryLock:
    """A ``ResourceLock`` on ``store`` for one identity: ``update`` writes only on the version it last saw."""

    def __init__(self, store: Store, identity: str) -> None:
        self.store = store
        self._identity = identity
        self.seen: int | None = None

    @property
    def identity(self) -> str:
        return self._identity

    def describe(self) -> str:
        return "memory lock"

    def get(self, timeout: float, *, latest: bool = False) -> tuple[LeaderElectionRecord, str]:
        self.store.calls.append(f"{self._identity} get")
        if self.store.record is None:
            raise NotFoundError(404, "NotFound", "no lock", "GET", "memory")
        self.seen = self.store.version
        return self.store.record, str(self.store.version)

    def create(self, record: LeaderElectionRecord, timeout: float) -> str:
        self.store.calls.append(f"{self._identity} create")
        if self.store.record is not None:
            raise ConflictError(409, "AlreadyExists", "exists", "POST", "memory")
        return self._write(record)

    def update(self, record: LeaderElectionRecord, timeout: float) -> str:
        self.store.calls.append(f"{self._identity} update")
        if self.store.record is None:
            raise NotFoundError(404, "NotFound", "no lock", "PUT", "memory")
        if self.seen != self.store.version:
            raise ConflictError(409, "Conflict", "changed", "PUT", "memory")
        return self._write(record)

    def record_event(self, event: str) -> None:
        self.store.events.append((self._identity, event))

    def _write(self, record: LeaderElectionRecord) -> str:
        self.store.record, self.store.version = record, self.store.version + 1
        self.seen = self.store.version
        return str(self.store.version)


def candidate(store: Store, identity: str, config: LeaderElectionConfig = FAST, **options: Any) -> LeaderElector:
    lock: ResourceLock = MemoryLock(store, identity)
    return LeaderElector(lock, config, **options)


def held_and_seen(store: Store, config: LeaderElectionConfig, **options: Any) -> tuple[LeaderElector, LeaderElector]:
    """``a``, which holds the lock, and ``b`` (with ``options``), which has seen ``a``'s record once."""
    a, b = candidate(store, "a", config), candidate(store, "b", config, **options)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    return a, b


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def config(clock: FakeClock) -> LeaderElectionConfig:
    return dataclasses.replace(FAST, clock=clock)


def test_the_first_candidate_creates_the_lock_and_holds_it(config: LeaderElectionConfig) -> None:
    store = Store()
    a = candidate(store, "a", config)
    assert a.try_acquire_or_renew()
    assert store.record is not None and store.record.holder_identity == "a"
    assert store.record.leader_transitions == 0 and store.record.lease_duration_seconds == 1
    assert a.holder == "a" and a.holder_alive
    assert store.events == [("a", BECAME_LEADER)]
    assert store.calls == ["a get", "a create"]


def test_a_second_candidate_sees_a_live_holder_and_does_not_take(config: LeaderElectionConfig) -> None:
    store = Store()
    _, b = held_and_seen(store, config)
    assert b.holder == "a" and b.holder_alive
    assert b.seconds_until_stale() == pytest.approx(config.lease_duration)


def test_the_holder_renews_with_one_update_and_no_read(config: LeaderElectionConfig, clock: FakeClock) -> None:
    store = Store()
    a = candidate(store, "a", config)
    assert a.try_acquire_or_renew()
    acquired = store.record
    assert acquired is not None
    store.calls.clear()
    clock.now += 0.3
    assert a.try_acquire_or_renew()
    assert store.calls == ["a update"]
    renewed = store.record
    assert renewed is not None
    assert renewed.acquire_time == acquired.acquire_time and renewed.leader_transitions == 0
    assert renewed.renew_time is not None and acquired.renew_time is not None
    assert renewed.renew_time >= acquired.renew_time


def test_a_candidate_takes_an_expired_lock_only_after_the_duration_on_its_own_clock(
    config: LeaderElectionConfig, clock: FakeClock
) -> None:
    store = Store()
    takeovers: list[Takeover] = []
    _, b = held_and_seen(store, config, on_takeover=takeovers.append)
    first_seen = clock.now  # b saw a's record now
    clock.now += config.lease_duration  # not more than the duration: still valid
    assert not b.try_acquire_or_renew() and b.holder_alive
    clock.now += 0.01
    assert b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder_identity == "b" and store.record.leader_transitions == 1
    [takeover] = takeovers
    assert takeover.expired and takeover.previous.holder_identity == "a" and takeover.observed_at == first_seen


def test_a_holder_that_lost_the_lock_learns_it_at_its_next_renewal(
    config: LeaderElectionConfig, clock: FakeClock
) -> None:
    store = Store()
    a, b = held_and_seen(store, config)
    clock.now += config.lease_duration + 0.1  # a froze: b takes its lock
    assert b.try_acquire_or_renew()
    store.calls.clear()
    assert not a.try_acquire_or_renew()  # its update on its old version is refused, then it reads
    assert store.calls == ["a update", "a get"]
    assert a.holder == "b" and a.holder_alive


def test_a_renewal_of_a_changed_record_counts_as_a_change_for_every_observer(
    config: LeaderElectionConfig, clock: FakeClock
) -> None:
    store = Store()
    a, b = candidate(store, "a", config), candidate(store, "b", config)
    assert a.try_acquire_or_renew()
    for _ in range(5):  # a renews every 0.6 s: b never sees the record unchanged for the 1 s duration
        assert not b.try_acquire_or_renew()
        clock.now += 0.6
        assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and b.holder_alive


def test_preempts_takes_the_lock_from_a_live_holder(config: LeaderElectionConfig) -> None:
    store = Store()
    takeovers: list[Takeover] = []
    seen: list[LeaderElectionRecord] = []

    def preempts(record: LeaderElectionRecord) -> bool:
        seen.append(record)
        return record.holder_identity == "agent"

    agent = candidate(store, "agent", config)
    preferred = candidate(store, "operator", config, preempts=preempts, on_takeover=takeovers.append)
    assert agent.try_acquire_or_renew()
    assert preferred.try_acquire_or_renew()
    assert [record.holder_identity for record in seen] == ["agent"]
    [takeover] = takeovers
    assert not takeover.expired and takeover.previous.holder_identity == "agent"
    assert not agent.try_acquire_or_renew() and agent.holder == "operator"


def test_a_released_lock_is_taken_at_once_with_one_transition_more(config: LeaderElectionConfig) -> None:
    store = Store()
    takeovers: list[Takeover] = []
    a, b = held_and_seen(store, config, on_takeover=takeovers.append)
    a.release()
    assert store.record is not None and store.record.holder_identity == ""
    assert b.try_acquire_or_renew()  # released: no need to wait out the duration
    assert store.record.holder_identity == "b" and store.record.leader_transitions == 1
    [takeover] = takeovers
    assert not takeover.expired and takeover.previous.holder_identity == ""


def test_release_leaves_a_lock_held_by_another_identity_alone(config: LeaderElectionConfig, clock: FakeClock) -> None:
    store = Store()
    a, b = held_and_seen(store, config)
    clock.now += config.lease_duration + 0.1
    assert b.try_acquire_or_renew()
    a.release()
    assert store.record is not None and store.record.holder_identity == "b"


def test_a_run_releases_the_lock_on_stop_without_on_stopped_leading(config: LeaderElectionConfig) -> None:
    store = Store()
    stopped_leading = threading.Event()
    config = dataclasses.replace(config, clock=FAST.clock, on_stopped_leading=stopped_leading.set)
    a = candidate(store, "a", config)
    term = ElectorRun(a)
    assert term.acquire(threading.Event(), lambda failed: 0.0)
    term.start()
    wait_until(lambda: store.version >= 3, 5, "two renewals")
    term.stop()
    a.release()
    assert store.record is not None and store.record.holder_identity == ""
    assert not stopped_leading.is_set()  # stopped by its caller


def test_the_callbacks_come_in_order_new_leader_started_new_leader_stopped() -> None:
    store = Store()
    calls: list[str] = []
    stopped = threading.Event()

    def on_stopped() -> None:
        calls.append("stopped leading")
        stopped.set()

    config = dataclasses.replace(
        FAST,
        on_new_leader=lambda identity: calls.append(f"new leader {identity}"),
        on_started_leading=lambda: calls.append("started leading"),
        on_stopped_leading=on_stopped,
    )
    a = candidate(store, "a", config)
    term = ElectorRun(a)
    assert term.acquire(threading.Event(), lambda failed: 0.0)
    term.start()
    try:
        assert store.record is not None
        store.record = dataclasses.replace(store.record, holder_identity="b")  # b took it (as after a froze)
        store.version += 1
        wait_until(stopped.is_set, 5, "on_stopped_leading after the lock was lost")
    finally:
        term.stop()
    assert calls == ["new leader a", "started leading", "new leader b", "stopped leading"]
    assert term.lost


def test_a_step_the_api_server_did_not_answer_is_dated_and_raised(
    config: LeaderElectionConfig, clock: FakeClock
) -> None:
    class Down(MemoryLock):
        def get(self, timeout: float, *, latest: bool = False) -> tuple[LeaderElectionRecord, str]:
            raise ConflictError(500, "InternalError", "down", "GET", "memory")  # any KubernetesApiError

    elector = LeaderElector(Down(Store(), "a"), config)
    with pytest.raises(ConflictError):
        elector.try_acquire_or_renew()
    assert elector.unreachable_at == clock.now and elector.holder is None


class TestRules:
    """The pure rules the elector decides by."""

    NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)

    def test_the_first_record_is_acquired_now_with_no_transition(self) -> None:
        record = next_record(None, "a", 10.0, self.NOW)
        assert record == LeaderElectionRecord("a", 10, self.NOW, self.NOW, 0)

    def test_a_renewal_keeps_the_acquire_time_and_the_transitions(self) -> None:
        held = LeaderElectionRecord("a", 10, self.NOW, self.NOW, 3)
        later = self.NOW + timedelta(seconds=2)
        assert next_record(held, "a", 10.0, later) == LeaderElectionRecord("a", 10, self.NOW, later, 3)

    def test_a_take_is_acquired_now_with_one_transition_more(self) -> None:
        held = LeaderElectionRecord("a", 10, self.NOW, self.NOW, 3)
        later = self.NOW + timedelta(seconds=12)
        assert next_record(held, "b", 0.4, later) == LeaderElectionRecord("b", 1, later, later, 4)

    def test_expiry_is_strictly_after_the_duration(self) -> None:
        assert not is_expired(100.0, 10.0, 110.0)
        assert is_expired(100.0, 10.0, 110.001)


class TestLeaseLock:
    """The record on a coordination.k8s.io/v1 Lease (in-memory fake API)."""

    def test_the_record_round_trips_through_a_lease_spec_keeping_other_fields(self) -> None:
        record = LeaderElectionRecord("a", 10, TestRules.NOW, TestRules.NOW + timedelta(seconds=1), 2)
        spec = lease_spec(record, {"strategy": "OldestEmulationVersion"})
        assert spec == {
            "strategy": "OldestEmulationVersion",
            "acquireTime": "2026-12-07T12:00:00.000000Z",
            "holderIdentity": "a",
            "leaseDurationSeconds": 10,
            "renewTime": "2026-12-07T12:00:01.000000Z",
            "leaseTransitions": 2,
        }
        assert record_of_lease(spec) == record

    def test_a_time_that_is_not_a_microtime_reads_as_none_and_is_left_as_it_was(self) -> None:
        record = record_of_lease({"holderIdentity": "a", "renewTime": "yesterday"})
        assert record == LeaderElectionRecord("a", 0, None, None, 0)
        assert lease_spec(record, {"renewTime": "yesterday"})["renewTime"] == "yesterday"

    def test_the_lease_on_the_wire(self) -> None:
        api: Any = FakeKubernetesApi()
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u-1"}
        a = LeaderElector(
            LeaseLock(api, "ns", "lock", "a", labels={"app": "x"}, annotations={"note": "a's"}, owner=owner), FAST
        )
        b = LeaderElector(LeaseLock(api, "ns", "lock", "b", labels={"app": "x"}), FAST)
        assert a.try_acquire_or_renew()
        lease = api.request("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lock")
        assert lease["metadata"]["labels"] == {"app": "x"} and lease["metadata"]["annotations"] == {"note": "a's"}
        assert lease["metadata"]["ownerReferences"] == [owner]
        assert set(lease["spec"]) == {
            "acquireTime",
            "holderIdentity",
            "leaseDurationSeconds",
            "renewTime",
            "leaseTransitions",
        }
        assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 1
        a.release()
        assert b.try_acquire_or_renew()
        lease = api.request("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lock")
        assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
        assert lease["metadata"]["annotations"] == {"note": "a's"}  # b writes none of its own, and keeps a's
        assert cast(LeaseLock, b.lock).lease == lease

    def test_update_before_get_or_create_is_a_programming_error(self) -> None:
        lock = LeaseLock(cast(Any, FakeKubernetesApi()), "ns", "lock", "a")
        with pytest.raises(RuntimeError, match="before a get or create"):
            lock.update(LeaderElectionRecord("a", 1), 1.0)
