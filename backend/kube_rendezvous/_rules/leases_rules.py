"""The node and writer Leases' wire format: their collection, label, annotations and times (pure).

What ``leases`` (the Leases' I/O), ``election``, the folder and the readers of Leases (the kubectl
plugin's report, the operator) agree on, without the I/O of ``leases``.
"""

from __future__ import annotations

from datetime import datetime, timezone

LEASE_PLURAL = "leases"
LABEL_LEASE = "kube-rendezvous.io/lease"
ANNOTATION_NODE = "kube-rendezvous.io/node"
ANNOTATION_DESIRE = "kube-rendezvous.io/desire"
ANNOTATION_DESIRED_AT = "kube-rendezvous.io/desired-at"
ANNOTATION_SETTINGS = "kube-rendezvous.io/join-settings"
ANNOTATION_RUN_ID = "kube-rendezvous.io/run-id"
ANNOTATION_ROUND = "kube-rendezvous.io/desired-round"
ANNOTATION_WRITER_PRIORITY = "kube-rendezvous.io/writer-priority"


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
