"""The election's record and its rules (pure): what a lock holds, what a holder writes, when a record expired.

The pure twin of ``election`` (the generic elector and its Lease lock): client-go's
``resourcelock.LeaderElectionRecord``, its form on a coordination.k8s.io/v1 Lease (the ``spec``
fields and their ``MicroTime`` times), and the decisions of client-go's ``tryAcquireOrRenew`` that
need no I/O. Nothing here knows a rendezvous: the node Leases use the same Lease collection and times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

#: The collection of coordination.k8s.io/v1 Leases.
LEASE_PLURAL = "leases"


def micro_time(moment: datetime) -> str:
    """A ``metav1.MicroTime`` string."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str) -> datetime:
    """The inverse of ``micro_time`` (also accepts whole seconds and any UTC offset): an aware UTC datetime.

    Raises:
        ValueError: not an RFC 3339 time, or one without a UTC offset (a naive time cannot be compared
            with the aware ones every other time here is).
    """
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(
            f"the time {text!r} has no UTC offset (a MicroTime ends in Z, e.g. 2026-01-02T03:04:05.000000Z)"
        )
    return moment.astimezone(timezone.utc)


@dataclass(frozen=True)
class LeaderElectionRecord:
    """What a lock holds (client-go's ``resourcelock.LeaderElectionRecord``).

    A time the lock did not say (absent, or not a time) is None; a record written with None leaves
    the lock's time as it was.
    """

    #: Who holds the lock; empty: nobody (released).
    holder_identity: str
    #: How long a candidate waits, from when it first saw this record unchanged, before it takes the lock.
    lease_duration_seconds: int
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    leader_transitions: int = 0


def lease_duration_seconds(duration: float) -> int:
    """The whole seconds a holder writes for a ``duration`` (at least 1: a Lease counts in seconds)."""
    return max(1, round(duration))


def next_record(
    previous: LeaderElectionRecord | None, identity: str, duration: float, now: datetime
) -> LeaderElectionRecord:
    """The record ``identity`` writes at ``now`` over ``previous`` (None: the lock does not exist yet).

    Its holder renews: the acquire time and the transitions stay. Anybody else takes it: acquired
    now, one transition more (none for the first record).
    """
    if previous is not None and previous.holder_identity == identity:
        return dataclasses.replace(previous, lease_duration_seconds=lease_duration_seconds(duration), renew_time=now)
    return LeaderElectionRecord(
        holder_identity=identity,
        lease_duration_seconds=lease_duration_seconds(duration),
        acquire_time=now,
        renew_time=now,
        leader_transitions=0 if previous is None else previous.leader_transitions + 1,
    )


def observed_duration(record: LeaderElectionRecord, default: float) -> float:
    """The seconds ``record`` stays valid after it was first seen: its own duration, else ``default``."""
    return float(record.lease_duration_seconds or default)


def is_expired(observed_at: float, duration: float, now: float) -> bool:
    """Whether a record first seen at ``observed_at`` and unchanged since has expired at ``now``.

    Both times are the observer's own clock, never the holder's stamps: skew between the holder's and
    the observer's clocks does not matter.
    """
    return now - observed_at > duration


def may_take(record: LeaderElectionRecord, identity: str, *, expired: bool, preempts: bool) -> bool:
    """Whether ``identity`` writes the lock that holds ``record``: it holds it already, nobody holds it
    (released), its holder's record expired, or this candidate preempts the holder."""
    return record.holder_identity == identity or not record.holder_identity or expired or preempts


def record_of_lease(spec: Mapping[str, Any]) -> LeaderElectionRecord:
    """The record a Lease's ``spec`` holds (client-go's ``LeaseSpecToLeaderElectionRecord``)."""
    return LeaderElectionRecord(
        holder_identity=str(spec.get("holderIdentity") or ""),
        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=_time_or_none(spec.get("acquireTime")),
        renew_time=_time_or_none(spec.get("renewTime")),
        leader_transitions=int(spec.get("leaseTransitions") or 0),
    )


def lease_spec(record: LeaderElectionRecord, spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with ``record`` written over it (client-go's ``LeaderElectionRecordToLeaseSpec``).

    The fields the record does not know are kept, and so is a time it does not have (None).
    """
    written = dict(spec)
    if record.acquire_time is not None:
        written["acquireTime"] = micro_time(record.acquire_time)
    written.update(holderIdentity=record.holder_identity, leaseDurationSeconds=record.lease_duration_seconds)
    if record.renew_time is not None:
        written["renewTime"] = micro_time(record.renew_time)
    written["leaseTransitions"] = record.leader_transitions
    return written


def _time_or_none(text: object) -> datetime | None:
    """A ``MicroTime`` field as a time; None when absent or not a time (as if never written)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_micro_time(text)
    except ValueError:
        return None
