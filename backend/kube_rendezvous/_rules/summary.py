"""The readable part of ``Rendezvous.status``, derived from a state document (pure, no I/O).

The agents store it in the same compare-and-swap write as the encoded document, so
``kubectl get rdzv`` always agrees with the state. It is small on purpose (counts plus the
first ``SUMMARY_LIST_LIMIT`` nodes): the operator and the kubectl plugin decode the document
itself when they need every node.

It also says how long the current round has been forming (``roundStartTime``, kept from the
previous status while the round number stays) and how long the last rounds took to form
(``recentRounds``, one entry written when a round completes).

Not guaranteed: ``lastChangeTime``, ``roundStartTime`` and the times in ``recentRounds`` are the
writing agent's (or operator's) clock; a round whose state was written without the previous
status at hand (a writer that lost track of it) restarts its ``roundStartTime``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .document import NodeId, RendezvousDocument
from .folder_rules import CompletedBy

#: Most participants and waiting nodes listed in the summary (the counts are exact).
SUMMARY_LIST_LIMIT = 16

PHASES = ("Pending", "Joining", "LastCall", "Complete", "Closed")
#: Rounds listed in ``status.recentRounds`` (oldest dropped first; the CRD's maxItems).
RECENT_ROUNDS = 5


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


def round_progress(
    document: RendezvousDocument, previous: Mapping[str, Any] | None, now: datetime, completed_by: str | None = None
) -> dict[str, Any]:
    """``roundStartTime`` and ``recentRounds`` for a write of ``document`` over the ``previous`` status
    (``completed_by``: the rule that completed the round in this write, ``folder_rules.completion_rule``)."""
    before = previous or {}
    same_round = before.get("round") == document.round and isinstance(before.get("roundStartTime"), str)
    start = str(before["roundStartTime"]) if same_round else format_time(now)
    rounds = [item for item in before.get("recentRounds") or [] if isinstance(item, dict)]
    formed_before = same_round and before.get("phase") in ("Complete", "Closed")
    if document.complete and not formed_before:
        formed: dict[str, Any] = {"round": document.round, "startTime": start, "formedTime": format_time(now)}
        formed["nodes"] = len(document.participants)
        if completed_by is not None:
            formed["completedBy"] = completed_by
        rounds = [*rounds, formed]
    return {"roundStartTime": start, "recentRounds": rounds[-RECENT_ROUNDS:]}


#: How an agent's progress line names each rule that completes a round (``folder_rules.CompletedBy``).
COMPLETED_BY_TEXT = {
    CompletedBy.MAX_NODES.value: "with max nodes",
    CompletedBy.LAST_CALL.value: "at the end of the last call",
    CompletedBy.TRAINING_PODS_JOINED.value: "once every live training pod joined",
}


def completed_by_text(status: Mapping[str, Any] | None, round_number: int) -> str:
    """`` (once every live training pod joined)``-style words for round ``round_number``'s rule, from
    ``status.recentRounds``; empty when the status does not say (yet)."""
    for item in reversed((status or {}).get("recentRounds") or []):
        if isinstance(item, dict) and item.get("round") == round_number:
            text = COMPLETED_BY_TEXT.get(str(item.get("completedBy")))
            return f" ({text})" if text else ""
    return ""


def summarize_document(
    document: RendezvousDocument,
    *,
    now: datetime,
    writer: str | None = None,
    limit: int = SUMMARY_LIST_LIMIT,
    previous: Mapping[str, Any] | None = None,
    completed_by: str | None = None,
) -> dict[str, Any]:
    """Return the ``status`` fields that describe ``document``, written over the ``previous`` status.

    Every field is a scalar, a list or explicitly ``None`` so that a JSON merge patch of the
    result replaces the previous summary completely (``None`` removes a field).
    """
    ranked = sorted(document.participants.items(), key=lambda item: (item[1], item[0]))
    waiting = sorted(document.wait_list)
    spares = sorted(document.redundancy_list)
    return {
        "round": document.round,
        "phase": rendezvous_phase(document),
        "closed": document.closed,
        "participantCount": len(ranked),
        "waitingCount": len(waiting),
        "participants": [{"node": str(node), "rank": rank} for node, rank in ranked[:limit]],
        "waiting": [str(node) for node in waiting[:limit]],
        "spareCount": len(spares),
        "spares": [str(node) for node in spares[:limit]],
        "deadline": format_time(document.deadline) if document.deadline is not None and not document.complete else None,
        "lastChangeTime": format_time(now),
        "lastWriter": writer,
        **round_progress(document, previous, now, completed_by),
    }


def departure_of(
    before: RendezvousDocument | None,
    after: RendezvousDocument,
    reasons: Mapping[NodeId, str],
    now: datetime,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """``status.lastDeparture`` when going from ``before`` to ``after`` broke a formed round, else None.

    A formed round (complete, not closed) that loses participants is broken: its other members'
    agents restart (``folder_rules.lost_members``), carried into the next round by the fold when it can
    (``folder_rules``'s carry rule). Only the first departure of a round is recorded: None when
    ``previous`` (the last ``lastDeparture``) is of the same round. ``reasons`` says why each node
    went (``Left``, ``Evicted``, ``Expired``; ``Removed`` when unknown or not carried). Lists at most
    ``SUMMARY_LIST_LIMIT`` nodes; ``count`` is exact.

    Members that leave by request while nodes wait to join break nothing: that is a scale-up (every
    member leaves and joins again to let the waiting nodes in), and the next round forms with them.
    """
    if before is None or not before.complete or before.closed or after.closed:
        return None
    if previous is not None and previous.get("round") == before.round:
        return None
    gone = sorted(set(before.participants) - set(after.participants))
    if not gone or (before.wait_list and all(reasons.get(node) == "Left" for node in gone)):
        return None
    return {
        "round": before.round,
        "time": format_time(now),
        "count": len(gone),
        "nodes": [{"node": str(node), "reason": reasons.get(node, "Removed")} for node in gone[:SUMMARY_LIST_LIMIT]],
    }


def departure_line(departure: Mapping[str, Any]) -> str:
    """``node X left round 3`` (was evicted from, expired in) for a ``status.lastDeparture``; several: who and why."""
    nodes = [item for item in departure.get("nodes") or [] if isinstance(item, Mapping)]
    count = int(departure.get("count") or len(nodes))
    round_number = departure.get("round")
    if count == 1 and len(nodes) == 1:
        verbs = {"Evicted": "was evicted from", "Expired": "expired in", "Removed": "was removed from"}
        return f"node {nodes[0].get('node')} {verbs.get(str(nodes[0].get('reason')), 'left')} round {round_number}"
    listed = ", ".join(f"{item.get('node')} ({str(item.get('reason', 'Left')).lower()})" for item in nodes)
    more = f" and {count - len(nodes)} more" if count > len(nodes) else ""
    return f"{count} nodes left round {round_number}: {listed}{more}"


def forming_line(
    document: RendezvousDocument, *, min_nodes: int, waited: float, last_members: frozenset[NodeId] | None = None
) -> str | None:
    """One log line for an agent waiting ``waited`` seconds in a round that is not complete: who is there
    and who is missing (None when the round is complete or closed).

    "Missing" names the members of the last round this agent saw formed that have not joined this
    one; nodes that never joined any round cannot be named, only counted.
    """
    if document.complete or document.closed:
        return None
    present = sorted(document.participants)
    needed = max(0, min_nodes - len(present))
    named = ", ".join(str(node) for node in present[:SUMMARY_LIST_LIMIT]) or "none"
    if len(present) > SUMMARY_LIST_LIMIT:
        named += f" and {len(present) - SUMMARY_LIST_LIMIT} more"
    line = f"round {document.round} still forming after {waited:.0f} s: "
    line += f"{len(present)} of minNodes {min_nodes} joined ({named})"
    if needed:
        line += f"; waiting for {needed} more node{'s' if needed != 1 else ''}"
    elif document.deadline is not None:
        line += f"; minNodes reached, last call until {format_time(document.deadline)}"
    gone = sorted((last_members or frozenset()) - set(document.participants) - set(document.wait_list))
    if gone:
        listed = ", ".join(str(node) for node in gone[:SUMMARY_LIST_LIMIT])
        more = f" and {len(gone) - SUMMARY_LIST_LIMIT} more" if len(gone) > SUMMARY_LIST_LIMIT else ""
        line += f"; missing from the last round: {listed}{more}"
    if document.wait_list:
        line += f"; {len(document.wait_list)} waiting for the next round"
    return line
