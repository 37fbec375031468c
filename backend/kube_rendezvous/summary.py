"""The readable part of ``Rendezvous.status``, derived from a rendezvous state (pure, no I/O).

The agents store it in the same compare-and-swap write as the encoded state, so
``kubectl get rdzv`` always agrees with the state. The operator reads only this summary and
never decodes the state itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

#: Most participants, waiting nodes and heartbeats listed in the summary (counts are exact).
SUMMARY_LIST_LIMIT = 128

PHASES = ("Pending", "Joining", "LastCall", "Complete", "Closed")


class RendezvousStateLike(Protocol):
    """The fields of tensorplay's ``_RendezvousState`` that the summary reads."""

    @property
    def round(self) -> int: ...
    @property
    def complete(self) -> bool: ...
    @property
    def deadline(self) -> datetime | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def participants(self) -> Mapping[Any, int]: ...
    @property
    def wait_list(self) -> set[Any]: ...
    @property
    def last_heartbeats(self) -> Mapping[Any, datetime]: ...


def format_time(moment: datetime) -> str:
    """Return ``moment`` as an RFC 3339 UTC timestamp with seconds precision."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rendezvous_phase(state: RendezvousStateLike | None) -> str:
    """Return the phase shown by ``kubectl get rdzv`` for ``state`` (None: no state yet)."""
    if state is None:
        return "Pending"
    if state.closed:
        return "Closed"
    if state.complete:
        return "Complete"
    if state.deadline is not None:
        return "LastCall"
    return "Joining"


def summarize_state(
    state: RendezvousStateLike, *, now: datetime, writer: str | None = None, limit: int = SUMMARY_LIST_LIMIT
) -> dict[str, Any]:
    """Return the ``status`` fields that describe ``state``.

    Every field is a scalar, a list or explicitly ``None`` so that a JSON merge patch of the
    result replaces the previous summary completely (``None`` removes a field).
    """
    ranked = sorted(state.participants.items(), key=lambda item: (item[1], str(item[0])))
    waiting = sorted(str(node) for node in state.wait_list)
    heartbeats = sorted(state.last_heartbeats.items(), key=lambda item: str(item[0]))
    return {
        "round": int(state.round),
        "phase": rendezvous_phase(state),
        "closed": bool(state.closed),
        "participantCount": len(ranked),
        "waitingCount": len(waiting),
        "participants": [{"node": str(node), "rank": int(rank)} for node, rank in ranked[:limit]],
        "waiting": waiting[:limit],
        "heartbeats": [{"node": str(node), "time": format_time(time)} for node, time in heartbeats[:limit]],
        "deadline": format_time(state.deadline) if state.deadline is not None and not state.complete else None,
        "lastChangeTime": format_time(now),
        "lastWriter": writer,
    }
