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
    )


def waiting_count(reading: RendezvousReading) -> int:
    """The wait list, and a close asked by a person counted as one (a close by an agent that succeeded: none)."""
    document = reading.document
    if document is None:
        return 1 if reading.close_requested else 0
    return max(len(document.wait_list), 1 if document.closed and reading.close_requested else 0)
