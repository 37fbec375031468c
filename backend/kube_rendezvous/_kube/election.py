"""Leader election on a lock (client-go's ``leaderelection``), and its one lock: a coordination.k8s.io Lease.

- ``ResourceLock`` is the seam (client-go's ``resourcelock.Interface``): get, create and update a
  ``LeaderElectionRecord``, record an event, say who this candidate is and what the lock is.
  ``LeaseLock`` is its implementation on one coordination.k8s.io/v1 Lease.
- ``LeaderElectionConfig``: the timings of one election, its clock and its callbacks, validated.
- ``LeaderElector``: the election steps over any ``ResourceLock`` (acquire or renew, release).
- ``ElectorRun``: the one run loop around an elector (client-go's ``LeaderElector.Run``): acquire,
  then renew on a thread until the lock is lost or the renew deadline passes.

This module knows nothing of a rendezvous. Its users add their rules through public seams: their
lock (its name, labels and annotations), ``LeaderElector``'s ``preempts`` (may this candidate take
the lock from a live holder) and ``on_takeover`` (the record a take replaced). The writer Lease of a
Rendezvous (``writer_lease``) and the operator's replica election are its users.

Not guaranteed: that two holders never act at once. That holds only if an old holder stops acting
within ``renew_deadline`` of its last successful renewal (client-go's renew deadline): ``ElectorRun``
says when (``holding``, ``on_stopped_leading``), and its caller must stop then; an election step
only says who holds the lock now.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from .._rules.election_rules import (
    LEASE_PLURAL,
    LeaderElectionRecord,
    is_expired,
    lease_spec,
    may_take,
    next_record,
    observed_duration,
    record_of_lease,
)
from .kubeapi import ConflictError, KubernetesApi, KubernetesApiError, NotFoundError, resource_path

logger = logging.getLogger(__name__)

#: The event a candidate records on its lock when it takes it (client-go's).
BECAME_LEADER = "became leader"
#: The shortest wait of a leader's deadline watch between two looks at its term: a term that ends now is looked
#: at again after this, never in a busy loop.
DEADLINE_LOOK_FLOOR_SECONDS = 0.001


@dataclass(frozen=True)
class LeaderElectionConfig:
    """The timings of one leader election, its clock and its callbacks (client-go's ``LeaderElectionConfig``).

    The holder renews every ``retry_period`` and stops acting once ``renew_deadline`` has passed since
    the start of its last successful renewal; a candidate takes the lock once it has seen it unchanged
    for ``lease_duration`` on its own ``clock``; each request of a step may take ``request_timeout``.
    The loop that runs the election calls ``on_started_leading`` when it starts acting, and
    ``on_stopped_leading`` when it must stop: the lock was lost or the renew deadline passed (not
    when its caller stops it). The elector calls ``on_new_leader`` with the holder's identity (empty:
    released) after a step that saw the holder change, from the step's thread: it must not block.

    Raises ``ValueError`` on construction unless 0 < retry_period < renew_deadline < lease_duration
    and 0 < request_timeout < renew_deadline: a holder must stop before a candidate may take over.
    """

    lease_duration: float
    renew_deadline: float
    retry_period: float
    request_timeout: float
    clock: Callable[[], float] = time.monotonic
    on_started_leading: Callable[[], None] | None = None
    on_stopped_leading: Callable[[], None] | None = None
    on_new_leader: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"LeaderElectionConfig: needs 0 < retry_period ({self.retry_period:g} s) < renew_deadline "
                f"({self.renew_deadline:g} s) < lease_duration ({self.lease_duration:g} s); shorten retry_period "
                "or renew_deadline, or lengthen lease_duration"
            )
        if not 0 < self.request_timeout < self.renew_deadline:
            raise ValueError(
                f"LeaderElectionConfig: needs 0 < request_timeout ({self.request_timeout:g} s) < renew_deadline "
                f"({self.renew_deadline:g} s), so a hung request cannot outlast the deadline; shorten request_timeout"
            )


class ResourceLock(Protocol):
    """The lock an elector takes (client-go's ``resourcelock.Interface``); ``LeaseLock`` is one.

    ``get`` answers the record with the lock's version as read (a change means somebody wrote the
    lock: client-go compares the raw record); ``create`` and ``update`` answer the version they
    wrote. ``update`` is a compare-and-swap on the version this lock last read or wrote. Each
    request may take ``timeout`` seconds (client-go's context).
    """

    @property
    def identity(self) -> str:
        """Who this candidate is: the holder identity it writes."""
        ...

    def describe(self) -> str:
        """The lock, for logs."""
        ...

    def get(self, timeout: float, *, latest: bool = False) -> tuple[LeaderElectionRecord, str]:
        """The record and version of the lock: the API server's newest if ``latest``, else as its cache shows it.

        Raises:
            NotFoundError: the lock does not exist.
            KubernetesApiError: the API server refused or did not answer.
        """
        ...

    def create(self, record: LeaderElectionRecord, timeout: float) -> str:
        """Create the lock holding ``record``; its version.

        Raises:
            ConflictError: the lock exists (another candidate has just created it).
            KubernetesApiError: the API server refused or did not answer.
        """
        ...

    def update(self, record: LeaderElectionRecord, timeout: float) -> str:
        """Write ``record`` on the lock as last read or written; its new version.

        Raises:
            ConflictError: somebody wrote the lock since.
            NotFoundError: the lock is gone.
            KubernetesApiError: the API server refused or did not answer.
        """
        ...

    def record_event(self, event: str) -> None:
        """Say that this candidate's ``event`` happened on the lock (``BECAME_LEADER``)."""
        ...


class LeaseLock:
    """A ``ResourceLock`` on one coordination.k8s.io/v1 Lease (client-go's ``resourcelock.LeaseLock``).

    ``labels`` and ``annotations`` go on every write of this identity; ``owner`` (an
    ownerReference), when set, on the Lease it creates. ``get`` reads from the API server's watch
    cache (resourceVersion=0) unless ``latest``: candidates look often, and a version the cache
    shows late only delays a take, whose update is a compare-and-swap on the version read.
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        owner: dict[str, Any] | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self._identity = identity
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.owner = owner
        self._path = resource_path(LEASE_PLURAL, namespace, name)
        #: The Lease as last read or written (None: neither yet); ``update`` writes on its resourceVersion.
        self.lease: dict[str, Any] | None = None

    @property
    def identity(self) -> str:
        return self._identity

    def describe(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def get(self, timeout: float, *, latest: bool = False) -> tuple[LeaderElectionRecord, str]:
        query = None if latest else {"resourceVersion": "0"}
        return self._keep(self._api.request("GET", self._path, query=query, timeout=timeout))

    def create(self, record: LeaderElectionRecord, timeout: float) -> str:
        metadata: dict[str, Any] = {
            "name": self.name,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
        }
        if self.owner:
            metadata["ownerReferences"] = [self.owner]
        body = self._body(metadata, lease_spec(record, {}))
        return self._keep(
            self._api.request("POST", resource_path(LEASE_PLURAL, self.namespace), body=body, timeout=timeout)
        )[1]

    def update(self, record: LeaderElectionRecord, timeout: float) -> str:
        if self.lease is None:
            raise RuntimeError(f"LeaseLock.update of {self.describe()} before a get or create: no version to write on")
        metadata = dict(self.lease["metadata"])
        metadata["labels"] = {**(metadata.get("labels") or {}), **self.labels}
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **self.annotations}
        body = self._body(metadata, lease_spec(record, self.lease.get("spec") or {}))
        return self._keep(self._api.request("PUT", self._path, body=body, timeout=timeout))[1]

    def record_event(self, event: str) -> None:
        logger.info("%s %s (%s)", self._identity, event, self.describe())

    @staticmethod
    def _body(metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _keep(self, lease: dict[str, Any]) -> tuple[LeaderElectionRecord, str]:
        """Keep ``lease`` (the next update writes on its version); its record and version."""
        self.lease = lease
        return record_of_lease(lease.get("spec") or {}), str(lease["metadata"]["resourceVersion"])


@dataclass(frozen=True)
class Takeover:
    """A candidate's take of a lock another identity held or had released: the record it replaced."""

    #: The record as this candidate last read it before its take (``holder_identity`` empty: released).
    previous: LeaderElectionRecord
    #: Whether that record had expired: unchanged for its duration on this candidate's clock. A take of a
    #: record that had not was of a released lock, or this candidate preempted its holder (``preempts``).
    expired: bool
    #: When this candidate first saw that record (its version), on ``config.clock``.
    observed_at: float


class LeaderElector:
    """Leader election on one ``ResourceLock``, as client-go's ``LeaderElector`` does it.

    ``try_acquire_or_renew`` is one step: the holder renews; a candidate takes the lock when it is
    absent, released (empty holder), or has not changed for its duration on this observer's clock
    (so clock skew between candidates does not matter), or when ``preempts`` says this candidate
    takes it from its live holder (given the record as read; never, by default). Every take is a
    compare-and-swap on the lock's version, so at most one candidate wins a step. After a take from
    another identity it calls ``on_takeover`` with the record it replaced, before the step returns.

    Not guaranteed: two holders never act at once only if the old holder stops acting within
    ``config.renew_deadline`` of its last successful renewal; the caller enforces it.
    """

    def __init__(
        self,
        lock: ResourceLock,
        config: LeaderElectionConfig,
        *,
        preempts: Callable[[LeaderElectionRecord], bool] | None = None,
        on_takeover: Callable[[Takeover], None] | None = None,
    ) -> None:
        self.lock = lock
        self.config = config
        self.preempts = preempts
        self.on_takeover = on_takeover
        #: The version last read or written, when this clock first saw it, and its duration.
        self._observed: tuple[str, float] | None = None
        self._observed_duration = config.lease_duration
        #: The record this identity's last successful write put on the lock, while it holds it.
        self._held: LeaderElectionRecord | None = None
        #: The identity holding the lock as last seen, and whether that holder looked alive.
        self.holder: str | None = None
        self.holder_alive = False
        #: When an election step last failed or was refused (this clock; -inf: never).
        self.unreachable_at = float("-inf")
        self._reported: str | None = None  # the holder ``on_new_leader`` was last called with

    @property
    def identity(self) -> str:
        return self.lock.identity

    @property
    def duration(self) -> float:
        """The duration this identity writes on the lock (``config.lease_duration``)."""
        return self.config.lease_duration

    def describe(self) -> str:
        return self.lock.describe()

    def try_acquire_or_renew(self) -> bool:
        """One election step; True when this identity holds the lock afterwards.

        Raises:
            KubernetesApiError: the API server refused or did not answer the read.
        """
        try:
            held = self._step()
        except KubernetesApiError:
            # A refusal counts too: an API server that has just started refuses (403) until its
            # authorizer has synced, and the holder's renewals were refused alike.
            self.unreachable_at = self.config.clock()
            raise
        if self.holder is not None and self.holder != self._reported:
            self._reported = self.holder
            if self.config.on_new_leader is not None:
                self.config.on_new_leader(self.holder)
        return held

    def _hold(self, record: LeaderElectionRecord, version: str) -> bool:
        """Hold the lock, on which this identity's write put ``record`` at ``version``; True."""
        self._held = record
        self._observed = (version, self.config.clock())
        self.holder, self.holder_alive = self.identity, True
        return True

    def _step(self) -> bool:
        now = datetime.now(timezone.utc)
        timeout = self.config.request_timeout
        if self._held is not None:
            # The holder renews on the version its own last write returned: one write, no quorum
            # read (which waits behind every write etcd has not applied yet). A 409 means somebody
            # else wrote the lock: read it and decide as a candidate would.
            renewal = next_record(self._held, self.identity, self.duration, now)
            try:
                return self._hold(renewal, self.lock.update(renewal, timeout))
            except (ConflictError, NotFoundError):
                self._held = None
        try:
            read: tuple[LeaderElectionRecord, str] | None = self.lock.get(timeout)
        except NotFoundError:
            read = None
        if read is None:
            return self._create(now)
        record, version = read
        clock = self.config.clock()
        if self._observed is None or self._observed[0] != version:
            self._observed = (version, clock)
        observed_at = self._observed[1]
        self._observed_duration = observed_duration(record, self.duration)
        expired = is_expired(observed_at, self._observed_duration, clock)
        mine = record.holder_identity == self.identity
        preempts = self.preempts is not None and self.preempts(record)
        self.holder, self.holder_alive = record.holder_identity, bool(record.holder_identity) and not expired
        if not may_take(record, self.identity, expired=expired, preempts=preempts):
            self._held = None
            return False
        claim = next_record(record, self.identity, self.duration, now)
        try:
            version = self.lock.update(claim, timeout)
        except (ConflictError, NotFoundError):
            return False
        if not mine:
            if self.on_takeover is not None:
                self.on_takeover(Takeover(record, expired, observed_at))
            self.lock.record_event(BECAME_LEADER)
        return self._hold(claim, version)

    def _create(self, now: datetime) -> bool:
        """The step on a lock that does not exist: create it holding this identity."""
        first = next_record(None, self.identity, self.duration, now)
        try:
            version = self.lock.create(first, self.config.request_timeout)
        except ConflictError:
            self.holder_alive = True  # another candidate has just taken it
            return False
        self.lock.record_event(BECAME_LEADER)
        return self._hold(first, version)

    def seconds_until_stale(self) -> float | None:
        """Seconds until the lock as last seen turns stale on this clock if nobody writes it (None: never seen)."""
        if self._observed is None:
            return None
        return self._observed[1] + self._observed_duration - self.config.clock()

    def release(self) -> None:
        """Give the lock up (empty holder) if this identity holds it, so another candidate takes over at once."""
        self._held = None
        try:
            record, _ = self.lock.get(self.config.request_timeout, latest=True)
            if record.holder_identity == self.identity:
                self.lock.update(dataclasses.replace(record, holder_identity=""), self.config.request_timeout)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            logger.info("could not release %s: %s", self.describe(), exc)


class Elector(Protocol):
    """What ``ElectorRun`` needs of an elector: ``LeaderElector`` (tests pass stand-ins)."""

    @property
    def config(self) -> LeaderElectionConfig: ...

    @property
    def identity(self) -> str: ...

    @property
    def holder(self) -> str | None: ...

    def describe(self) -> str: ...

    def try_acquire_or_renew(self) -> bool: ...


class ElectorRun:
    """One term of one elector, as client-go's ``LeaderElector.Run``: acquire, then renew until it ends.

    ``acquire`` takes election steps until this identity holds the lock (then calls
    ``config.on_started_leading``); ``start`` renews it every ``config.retry_period`` on a thread of
    its own, so a renewal that waits on a slow API server holds back nothing of the holder's work.
    The term ends when a renewal step answers that this identity no longer holds the lock
    (``lost``: another identity holds it, or this one's compare-and-swap lost), or when
    ``config.renew_deadline`` has passed since ``renewed_at``; then ``holding`` is False, and
    ``config.on_stopped_leading`` is called at once (from a thread of its own, even while a renewal
    hangs). A renewal step that failed (``ApiError``: the API server answered an error;
    ``ApiUnavailableError``: it did not answer) is logged, counts as no renewal, and is tried again
    at the next ``retry_period`` until the deadline. No
    renewal starts after the term ended, and none answered after it revives it. ``stop`` ends the
    term without ``on_stopped_leading`` (its caller stops). A new term is a new ``ElectorRun``.

    When a renewal counts: ``renewed_at`` is when the last successful step (the acquiring one, then
    each renewal) was *sent*, on ``config.clock``, not when its answer came. That is the
    conservative choice: the API server wrote the lock after the request was sent, and a candidate
    first sees that write no earlier, then waits ``lease_duration`` on its own clock before taking the
    lock; a holder that stops ``renew_deadline`` (< ``lease_duration``) after the *send* therefore
    stops before any candidate may take over, however long the answer took to come back. Counted
    from the answer, a slow answer would stretch the holder's term by its own latency, up to
    ``request_timeout`` per request of the step, past the point a candidate may take over.
    """

    def __init__(self, elector: Elector) -> None:
        self.elector = elector
        self.config = elector.config
        #: When the last successful step was sent (``config.clock``); -inf until ``acquire`` succeeded.
        self.renewed_at = float("-inf")
        #: True once a renewal step answered that this identity does not hold the lock.
        self.lost = False
        self._over = False  # the deadline was seen passed: no later answer revives the term
        self._lock = threading.Lock()  # orders a renewal's answer against the deadline's judgement
        self._stopping = threading.Event()
        self._wake = threading.Event()  # the deadline watch looks again now: lost, or stopped
        self._threads: list[threading.Thread] = []

    def holding(self) -> bool:
        """Whether the holder may act: not ``lost``, and ``renewed_at`` within ``renew_deadline`` of now."""
        return not self.lost and not self._over and self.config.clock() - self.renewed_at < self.config.renew_deadline

    def describe(self) -> str:
        return self.elector.describe()

    def step(self) -> bool | None:
        """One election step: True when this identity holds the lock (``renewed_at`` is when it was sent),
        False when not, None when the API server refused or did not answer (logged)."""
        held, sent = self._try()
        if held:
            self.renewed_at = sent
        return held

    def acquire(self, stopped: threading.Event, pause: Callable[[bool], float]) -> bool:
        """Take election steps until this identity holds the lock (True) or ``stopped`` is set (False).

        After a step that did not take it, waits ``pause(failed)`` seconds (``failed``: the API server
        refused or did not answer it) unless ``stopped``. On taking it, calls ``on_started_leading``.
        """
        while not stopped.is_set():
            held = self.step()
            if held:
                if self.config.on_started_leading is not None:
                    self.config.on_started_leading()
                return True
            stopped.wait(pause(held is None))
        return False

    def start(self) -> ElectorRun:
        """Renew from a thread of its own (and watch the deadline, if ``on_stopped_leading`` is set)."""
        name = f"renewal of {self.describe()}"
        self._threads.append(threading.Thread(target=self._renew, name=name, daemon=True))
        if self.config.on_stopped_leading is not None:
            self._threads.append(threading.Thread(target=self._watch_deadline, name=f"deadline of {name}", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """End the term; returns once no renewal is in flight (the elector is the caller's again)."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def _try(self) -> tuple[bool | None, float]:
        """One election step and when it was sent; None for a step the API server refused or did not answer."""
        sent = self.config.clock()
        try:
            return self.elector.try_acquire_or_renew(), sent
        except KubernetesApiError as exc:
            logger.info("election step of %s on %s failed this time: %s", self.elector.identity, self.describe(), exc)
            return None, sent

    def _renew(self) -> None:
        while not self._stopping.wait(self.config.retry_period) and self.holding():
            held, sent = self._try()
            if held is None:
                continue  # no renewal: tried again next period, until the deadline
            if not held:
                self.lost = True
                self._wake.set()
                return
            with self._lock:
                if not self.holding():
                    return  # answered after the deadline: the term is over, its holder may have stopped
                self.renewed_at = sent

    def _watch_deadline(self) -> None:
        """Call ``on_stopped_leading`` as soon as the term ends on its own: lost, or past the deadline."""
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return
                if not self.holding():
                    self._over = True
                    break
                remaining = self.renewed_at + self.config.renew_deadline - self.config.clock()
            self._wake.wait(max(DEADLINE_LOOK_FLOOR_SECONDS, min(remaining, self.config.retry_period)))
        if self.lost:
            logger.error("lost %s to %s; stopping at once", self.describe(), self.elector.holder or "nobody")
        else:
            logger.error(
                "could not renew %s for %g s (the renew deadline); stopping at once",
                self.describe(),
                self.config.renew_deadline,
            )
        callback = self.config.on_stopped_leading
        if callback is not None:
            callback()
