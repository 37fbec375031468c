"""Read a Rendezvous object as the agents see it: this run's document with the intents folded in (pure, no I/O).

Besides the state document, a Rendezvous carries intents that any writer folds in:
``spec.closed`` or a deletion (a person asked to close: the agents stop and exit 0) and
``status.evictedNodes`` (the operator saw those nodes' pods gone). ``fold_intents`` applies them to a
document: closed, and the evicted nodes' heartbeats made ancient, which the folder treats as dead
(and the framework's own pruning too, for the CAS backend's users).

Not guaranteed: an eviction names a node by ``addr_pid_localid`` only, so it also matches a
later incarnation with the same name until the intent is gone (a new run clears it).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .document import RendezvousDocument, decode_document

#: The heartbeat time given to evicted nodes: long expired on every clock.
EVICTED_HEARTBEAT = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Evictions kept in ``status.evictedNodes`` (the oldest dropped first; the CRD's maxItems).
EVICTED_NODES_KEPT = 256


def with_evicted(status: dict[str, Any], nodes: list[str]) -> list[str] | None:
    """``status.evictedNodes`` with ``nodes`` added (bounded), or None when all are there already."""
    current = list(status.get("evictedNodes") or [])
    added = [node for node in nodes if node not in current]
    if not added:
        return None
    return (current + added)[-EVICTED_NODES_KEPT:]


def fold_intents(
    document: RendezvousDocument | None, *, close: bool, evicted: Iterable[str]
) -> RendezvousDocument | None:
    """Return ``document`` with ``close`` and ``evicted`` (node names) applied.

    Returns the same object when nothing changes; a closed empty document when there is no
    document yet and ``close`` is set; None when there is none and nothing to close.
    """
    if document is None:
        return RendezvousDocument(closed=True) if close else None
    changes: dict[str, object] = {}
    if close and not document.closed:
        changes["closed"] = True
    names = set(evicted)
    if names:
        heartbeats = dict(document.last_heartbeats)
        for node in document.nodes():
            if str(node) in names and heartbeats.get(node) != EVICTED_HEARTBEAT:
                heartbeats[node] = EVICTED_HEARTBEAT
                changes["last_heartbeats"] = heartbeats
    return dataclasses.replace(document, **changes) if changes else document  # type: ignore[arg-type]


@dataclass(frozen=True)
class RendezvousReading:
    """One version of a Rendezvous, as the agents of run ``run_id`` read it."""

    #: Its resourceVersion (the compare-and-swap token).
    version: str
    #: This run's document with the intents folded in (None: no state of this run yet).
    document: RendezvousDocument | None
    #: Whether a person asked to close (``spec.closed``, a deletion); a close by an agent whose
    #: training succeeded is not such a request.
    close_requested: bool
    #: The run id of a state that belongs to another run (it counts as no state), else None.
    foreign_run: str | None = None
    #: The nodes the folder holds back (``status.heldNodes``: their Kubernetes Node does not admit them), with why.
    held: Mapping[str, str] = field(default_factory=dict)
    #: The node names evicted from this run (``status.evictedNodes``): a live agent named here is fenced.
    evicted: frozenset[str] = frozenset()


def read_rendezvous(
    obj: dict[str, Any], run_id: str, decode: Callable[[str], RendezvousDocument] = decode_document
) -> RendezvousReading:
    """Read ``obj`` (a Rendezvous) for run ``run_id``.

    Raises:
        StateDocumentError: ``status.state`` is not a valid state document (naming the field).
    """
    status = obj.get("status") or {}
    metadata = obj.get("metadata") or {}
    encoded = status.get("state")
    stored_run = status.get("runId")
    foreign = stored_run not in (None, run_id)
    document = decode(encoded) if encoded and not foreign else None
    close = bool((obj.get("spec") or {}).get("closed")) or bool(metadata.get("deletionTimestamp"))
    return RendezvousReading(
        version=str(metadata.get("resourceVersion", "")),
        document=fold_intents(document, close=close, evicted=status.get("evictedNodes") or []),
        close_requested=close,
        foreign_run=str(stored_run) if foreign and encoded else None,
        held={
            str(item.get("node")): str(item.get("reason"))
            for item in status.get("heldNodes") or []
            if isinstance(item, dict) and not foreign
        },
        evicted=frozenset(str(node) for node in status.get("evictedNodes") or []),
    )


def waiting_count(reading: RendezvousReading) -> int:
    """The wait list, and a close asked by a person counted as one (a close by an agent that succeeded: none)."""
    document = reading.document
    if document is None:
        return 1 if reading.close_requested else 0
    return max(len(document.wait_list), 1 if document.closed and reading.close_requested else 0)


class Found(enum.Enum):
    """What a run does with the Rendezvous it finds under its name (``judge_found``)."""

    #: Use it: its own, a new one, or one whose state belongs to no ended run.
    USE = "use"
    #: Wait for it to go: it is being deleted (a deletion closes only the run that was using it).
    WAIT_FOR_DELETION = "wait for deletion"
    #: Replace it (or refuse it): it records the end of another run, which this run must not take as its own.
    REPLACE = "replace"


@dataclass(frozen=True)
class FoundVerdict:
    """``judge_found``'s answer and why, in words for the agent's log and errors."""

    action: Found
    why: str = ""
    #: The run whose end the object records (``Found.REPLACE``).
    ended_run: str | None = None


def judge_found(obj: dict[str, Any], run_id: str | None) -> FoundVerdict:
    """What run ``run_id`` (None: unset, the object's UID will be the run id) does with ``obj``, found at start.

    The rule (the README's "Runs never inherit each other's end"):

    - An object being deleted is nobody's any more: a new run waits until it is gone, then creates its own
      (or waits for a person to re-apply one). A deletion closes only the run that was using the object.
    - An object that records the end of another run (``spec.closed`` or a closed state, and ``status.runId``
      names another run) is replaced: that close or success was that run's.
    - Anything else is used: a state of another run that did not end counts as no state (``read_rendezvous``).

    With the run id unset, the object's UID is the run id, so an object that stays is one run for ever:
    a re-run under the same name cannot be told from a late member (set ``--rdzv-id`` to the workload's UID).
    """
    metadata = obj.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        finalizers = ", ".join(metadata.get("finalizers") or []) or "none"
        return FoundVerdict(
            Found.WAIT_FOR_DELETION,
            f"it is being deleted (deletionTimestamp {metadata['deletionTimestamp']}, finalizers: {finalizers})",
        )
    if run_id is None:
        return FoundVerdict(Found.USE)
    status = obj.get("status") or {}
    stored_run = status.get("runId")
    ended = bool((obj.get("spec") or {}).get("closed")) or bool(status.get("closed"))
    if ended and stored_run is not None and str(stored_run) != run_id:
        when = status.get("lastChangeTime") or "an unknown time"
        how = "closed by a person (spec.closed)" if (obj.get("spec") or {}).get("closed") else "closed"
        return FoundVerdict(Found.REPLACE, f"it was {how} for run {stored_run} at {when}", ended_run=str(stored_run))
    return FoundVerdict(Found.USE)


def close_cause(obj: dict[str, Any] | None) -> str:
    """Why run's Rendezvous ``obj`` (None: deleted) ended, who ended it and when, in words for the agent's log.

    A person's close names the field manager that set ``spec.closed`` and when (its ``managedFields`` entry:
    ``kubectl`` for ``kubectl patch``, ``kubectl-rdzv`` for ``kubectl rdzv close``); a deletion names its time;
    otherwise the run finished (an agent's workers succeeded and it closed the rendezvous).
    """
    if obj is None:
        return "the Rendezvous was deleted (a deletion closes the run that uses it)"
    metadata = obj.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return f"the Rendezvous is being deleted (deletionTimestamp {metadata['deletionTimestamp']})"
    if (obj.get("spec") or {}).get("closed"):
        setters = [
            entry
            for entry in metadata.get("managedFields") or []
            if isinstance(entry, dict) and "f:closed" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
        ]
        if setters:
            entry = setters[-1]
            return f"a person closed it (spec.closed, set by {entry.get('manager')} at {entry.get('time')})"
        return "a person closed it (spec.closed)"
    status = obj.get("status") or {}
    return f"the run finished: an agent's workers succeeded and closed it (at {status.get('lastChangeTime')})"


def close_reason(obj: dict[str, Any]) -> str:
    """``status.closeReason`` of the fold that closes run's Rendezvous ``obj``: ``Requested: ...`` when a person set
    ``spec.closed`` (who and when, ``close_cause``), else ``Succeeded: ...`` (an agent's workers succeeded)."""
    if (obj.get("spec") or {}).get("closed"):
        return f"Requested: {close_cause(obj)}"
    return "Succeeded: the run finished: an agent's workers succeeded and closed it"
