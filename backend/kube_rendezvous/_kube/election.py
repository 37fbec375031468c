"""Leader election on a coordination.k8s.io/v1 Lease (``LeaseElector``), and the writer Lease of a Rendezvous.

``LeaseElector``'s timings are one validated ``LeaderElectionConfig`` (the folder's writer election
and the operator's replica election). ``WriterLease`` elects the one folder of a Rendezvous on
``<rendezvous>-writer`` (the contract is in ``leases``), preferring the operator over agents;
``dead_writer_seeds`` dates the node of an agent writer that died from its last writer renewal.
``ElectorRun`` is the one run loop around an elector (client-go's ``LeaderElector.Run``): acquire,
then renew on a thread until the Lease is lost or the renew deadline passes; the folder and the
operator's replica election both run it, so both count a renewal alike.

Not guaranteed: that two holders never act at once. That holds only if an old holder stops acting
within ``renew_deadline`` of its last successful renewal (client-go's renew deadline): ``ElectorRun``
says when (``holding``, ``on_stopped_leading``), and its caller must stop then; an election step
only says who holds the Lease now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from .._rules.document import NodeId
from .._rules.leases_rules import LABEL_LEASE, LEASE_PLURAL, micro_time, parse_micro_time
from .kubeapi import (
    RENDEZVOUS_LABEL,
    ConflictError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    resource_path,
)
from .leases import ANNOTATION_WRITER_PRIORITY, NodeRecord, writer_lease_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaderElectionConfig:
    """The timings of one leader election, its clock and its callbacks (client-go's ``LeaderElectionConfig``).

    The holder renews every ``retry_period`` and stops acting once ``renew_deadline`` has passed since
    the start of its last successful renewal; a candidate takes the Lease once it has seen it unchanged
    for ``lease_duration`` on its own ``clock``; each request of a step may take ``request_timeout``.
    The loop that runs the election calls ``on_started_leading`` when it starts acting, and
    ``on_stopped_leading`` when it must stop: the Lease was lost or the renew deadline passed (not
    when its caller stops it).

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


@dataclass(frozen=True)
class StaleHolder:
    """The holder a candidate took a stale Lease from, as that candidate last saw it."""

    identity: str
    #: ``spec.renewTime`` of its last renewal: the old holder's own clock.
    renewed_at: datetime | None
    #: When this candidate first saw that renewal, on its own monotonic clock, or, if later, when the
    #: API server last failed or refused it (the holder may have been cut off by the same outage).
    seen_at: float


def dead_writer_seeds(holder: StaleHolder, records: list[NodeRecord], prefix: str) -> list[tuple[NodeId, str, float]]:
    """``(node, version, since)`` for the node of a writer that died, dated from its writer Lease.

    An agent writer (identity ``prefix`` + node) renews its node Lease and the writer Lease from one
    process, so both ``renewTime`` stamps come from one clock. A node Lease renewed ``d`` seconds
    after the writer Lease's last renewal (``d`` <= 0: before it) has not changed since
    ``seen_at + max(d, 0)``, where ``seen_at`` is when the candidate saw that writer renewal, on
    its own clock. Its expiry then runs from there, not from the takeover: a dead writer's node is
    removed one expiry after its death, not after failover plus an expiry. Never early: ``seen_at``
    is at or after the writer renewal itself, and ``d`` is measured on the dead process's one clock.
    ``LeaseObservations.seed`` ignores a date later than the candidate's own observation.
    """
    if holder.renewed_at is None or not holder.identity.startswith(prefix):
        return []
    writer_renewed = holder.renewed_at
    return [
        (record.node, record.version, holder.seen_at + max(0.0, (record.renewed_at - writer_renewed).total_seconds()))
        for record in records
        if f"{prefix}{record.node}" == holder.identity and record.renewed_at is not None
    ]


class LeaseElector:
    """Leader election on one coordination.k8s.io Lease, as client-go's ``leaderelection`` does it.

    ``try_acquire_or_renew`` is one step of an elector: the holder renews; a candidate takes the
    Lease when it is absent, released (empty holder), or has not changed for its
    ``leaseDurationSeconds`` on this observer's clock (so clock skew between candidates does not
    matter). Every take is a compare-and-swap on the Lease's resourceVersion, so at most one
    candidate wins a step. Subclasses may also take it from a holder of lower priority
    (``_may_preempt``).

    Not guaranteed: two holders never act at once only if the old holder stops acting within
    ``config.renew_deadline`` of its last successful renewal; the caller enforces it.
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        name: str,
        identity: str,
        config: LeaderElectionConfig,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        owner: dict[str, Any] | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.config = config
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.owner = owner
        self._path = resource_path(LEASE_PLURAL, namespace, self.name)
        #: The resourceVersion last read or written, when this clock first saw it, and its duration.
        self._observed: tuple[str, float] | None = None
        self._observed_duration = config.lease_duration
        #: The Lease as this identity's last successful write returned it, while it holds it.
        self._held: dict[str, Any] | None = None
        #: The identity holding the Lease as last seen, and whether that holder looked alive.
        self.holder: str | None = None
        self.holder_alive = False
        #: The holder of the last Lease this identity took because it was stale (None otherwise).
        self.taken_from_stale: StaleHolder | None = None
        #: When an election step last failed or was refused (this clock; -inf: never).
        self.unreachable_at = float("-inf")

    @property
    def duration(self) -> float:
        """The duration this identity writes on the Lease (``config.lease_duration``)."""
        return self.config.lease_duration

    def describe(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def _request(self, method: str, path: str | None = None, **kwargs: Any) -> Any:
        """One request on the Lease (or ``path``) within ``config.request_timeout``."""
        return self._api.request(method, path or self._path, timeout=self.config.request_timeout, **kwargs)

    def _hold(self, lease: dict[str, Any]) -> bool:
        """Hold ``lease``, the answer to this identity's write; True."""
        self._held = lease
        self._observed = (lease["metadata"]["resourceVersion"], self.config.clock())
        self.holder, self.holder_alive = self.identity, True
        return True

    def _body(self, lease: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        transitions = int(spec.get("leaseTransitions") or 0)
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = micro_time(now)
            transitions += 1 if lease else 0
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.duration)),
            renewTime=micro_time(now),
            leaseTransitions=transitions,
        )
        metadata: dict[str, Any] = dict((lease or {}).get("metadata") or {"name": self.name})
        metadata.setdefault("labels", {}).update(self.labels)
        metadata.setdefault("annotations", {}).update(self.annotations)
        if self.owner and not lease:
            metadata["ownerReferences"] = [self.owner]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _may_preempt(self, lease: dict[str, Any]) -> bool:
        """Whether this candidate takes the Lease from a live holder (never, by default)."""
        return False

    def _took_over(self) -> None:
        logger.info("%s now holds %s", self.identity, self.describe())

    def try_acquire_or_renew(self) -> bool:
        """One election step; True when this identity holds the Lease afterwards.

        Raises:
            KubernetesApiError: the API server refused or did not answer the read.
        """
        try:
            return self._step()
        except KubernetesApiError:
            # A refusal counts too: an API server that has just started refuses (403) until its
            # authorizer has synced, and the holder's renewals were refused alike.
            self.unreachable_at = self.config.clock()
            raise

    def _step(self) -> bool:
        now = datetime.now(timezone.utc)
        if self._held is not None:
            # The holder renews on the version its own last write returned: one write, no quorum
            # read (which waits behind every write etcd has not applied yet). A 409 means somebody
            # else wrote the Lease: read it and decide as a candidate would.
            try:
                return self._hold(self._request("PUT", body=self._body(self._held, now)))
            except (ConflictError, NotFoundError):
                self._held = None
        try:
            # From the API server's watch cache (resourceVersion=0), not a quorum read: N agents look
            # every few seconds, and a version the cache shows late only delays a take, whose PUT
            # is a compare-and-swap on the version it read.
            lease: dict[str, Any] | None = self._request("GET", query={"resourceVersion": "0"})
        except NotFoundError:
            lease = None
        if lease is None:
            try:
                created = self._request("POST", resource_path(LEASE_PLURAL, self.namespace), body=self._body(None, now))
            except ConflictError:
                self.holder_alive = True  # another candidate has just taken it
                return False
            self._took_over()
            return self._hold(created)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        version = lease["metadata"]["resourceVersion"]
        clock = self.config.clock()
        if self._observed is None or self._observed[0] != version:
            self._observed = (version, clock)
        self._observed_duration = float(spec.get("leaseDurationSeconds") or self.duration)
        stale = clock - self._observed[1] > self._observed_duration
        mine = holder == self.identity
        take = mine or not holder or stale or self._may_preempt(lease)
        self.holder, self.holder_alive = holder, bool(holder) and not stale
        if not take:
            self._held = None
            return False
        try:
            updated = self._request("PUT", body=self._body(lease, now))
        except (ConflictError, NotFoundError):
            return False
        if stale and holder and not mine:
            renew_time = spec.get("renewTime")
            # A holder that did not renew while this candidate could not reach the API server either may
            # have failed for the same reason: its silence counts only from when this candidate got through.
            try:
                renewed_at = parse_micro_time(renew_time) if renew_time else None
            except ValueError:  # not a MicroTime: as if it never renewed
                renewed_at = None
            self.taken_from_stale = StaleHolder(holder, renewed_at, max(self._observed[1], self.unreachable_at))
        if not mine:
            self._took_over()
        return self._hold(updated)

    def seconds_until_stale(self) -> float | None:
        """Seconds until the Lease as last seen turns stale on this clock if nobody writes it (None: never seen)."""
        if self._observed is None:
            return None
        return self._observed[1] + self._observed_duration - self.config.clock()

    def release(self) -> None:
        """Give the Lease up (empty holder) if this identity holds it, so another candidate takes over at once."""
        self._held = None
        try:
            lease = self._request("GET")
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                self._request("PUT", body=lease)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            logger.info("could not release %s: %s", self.describe(), exc)


class WriterLease(LeaseElector):
    """The writer Lease of one Rendezvous: ``LeaseElector`` with the operator preferred over agents.

    The operator (``preferred``) takes the Lease from an agent at once; agents take it only when
    it is absent, released or stale.
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        identity: str,
        config: LeaderElectionConfig,
        *,
        preferred: bool,
        owner: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            api,
            namespace,
            writer_lease_name(rendezvous_name),
            identity,
            config,
            labels={RENDEZVOUS_LABEL: rendezvous_name, LABEL_LEASE: "writer"},
            annotations={ANNOTATION_WRITER_PRIORITY: "operator" if preferred else "agent"},
            owner=owner,
        )
        self.rendezvous_name = rendezvous_name
        self.preferred = preferred

    def describe(self) -> str:
        return f"writer Lease {self.namespace}/{self.name}"

    def _may_preempt(self, lease: dict[str, Any]) -> bool:
        priority = (lease["metadata"].get("annotations") or {}).get(ANNOTATION_WRITER_PRIORITY)
        return self.preferred and priority != "operator"

    def _took_over(self) -> None:
        logger.info("%s now folds requests for %s/%s", self.identity, self.namespace, self.rendezvous_name)


class Elector(Protocol):
    """What ``ElectorRun`` needs of an elector: ``LeaseElector`` (tests pass stand-ins)."""

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

    ``acquire`` takes election steps until this identity holds the Lease (then calls
    ``config.on_started_leading``); ``start`` renews it every ``config.retry_period`` on a thread of
    its own, so a renewal that waits on a slow API server holds back nothing of the holder's work.
    The term ends when a renewal step answers that this identity no longer holds the Lease
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
    conservative choice: the API server wrote the Lease after the request was sent, and a candidate
    first sees that write no earlier, then waits ``lease_duration`` on its own clock before taking the
    Lease; a holder that stops ``renew_deadline`` (< ``lease_duration``) after the *send* therefore
    stops before any candidate may take over, however long the answer took to come back. Counted
    from the answer, a slow answer would stretch the holder's term by its own latency, up to
    ``request_timeout`` per request of the step, past the point a candidate may take over.
    """

    def __init__(self, elector: Elector) -> None:
        self.elector = elector
        self.config = elector.config
        #: When the last successful step was sent (``config.clock``); -inf until ``acquire`` succeeded.
        self.renewed_at = float("-inf")
        #: True once a renewal step answered that this identity does not hold the Lease.
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
        """One election step: True when this identity holds the Lease (``renewed_at`` is when it was sent),
        False when not, None when the API server refused or did not answer (logged)."""
        held, sent = self._try()
        if held:
            self.renewed_at = sent
        return held

    def acquire(self, stopped: threading.Event, pause: Callable[[bool], float]) -> bool:
        """Take election steps until this identity holds the Lease (True) or ``stopped`` is set (False).

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
            self._wake.wait(max(0.001, min(remaining, self.config.retry_period)))
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
