"""The readable part of ``Rendezvous.status``, derived from a state document (pure, no I/O).

The agents store it in the same compare-and-swap write as the encoded document, so
``kubectl get rdzv`` always agrees with the state. It is small on purpose (counts plus the
first ``SUMMARY_LIST_LIMIT`` nodes): the operator and the kubectl plugin decode the document
itself when they need every node.

Not guaranteed: ``lastChangeTime`` is the writing agent's clock.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .document import RendezvousDocument

#: Most participants and waiting nodes listed in the summary (the counts are exact).
SUMMARY_LIST_LIMIT = 16

PHASES = ("Pending", "Joining", "LastCall", "Complete", "Closed")


def format_time(moment: datetime) -> str:
    """Return ``moment`` as an RFC 3339 UTC timestamp with seconds precision."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """Return the UTC datetime of an RFC 3339 timestamp with seconds precision (``format_time``'s)."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def rendezvous_phase(document: RendezvousDocument | None) -> str:
    """Return the phase shown by ``kubectl get rdzv`` for ``document`` (None: no state yet)."""
    if document is None:
        return "Pending"
    if document.closed:
        return "Closed"
    if document.complete:
        return "Complete"
    if document.deadline is not None:
        return "LastCall"
    return "Joining"


def summarize_document(
    document: RendezvousDocument, *, now: datetime, writer: str | None = None, limit: int = SUMMARY_LIST_LIMIT
) -> dict[str, Any]:
    """Return the ``status`` fields that describe ``document``.

    Every field is a scalar, a list or explicitly ``None`` so that a JSON merge patch of the
    result replaces the previous summary completely (``None`` removes a field).
    """
    ranked = sorted(document.participants.items(), key=lambda item: (item[1], item[0]))
    waiting = sorted(document.wait_list)
    return {
        "round": document.round,
        "phase": rendezvous_phase(document),
        "closed": document.closed,
        "participantCount": len(ranked),
        "waitingCount": len(waiting),
        "participants": [{"node": str(node), "rank": rank} for node, rank in ranked[:limit]],
        "waiting": [str(node) for node in waiting[:limit]],
        "deadline": format_time(document.deadline) if document.deadline is not None and not document.complete else None,
        "lastChangeTime": format_time(now),
        "lastWriter": writer,
    }
