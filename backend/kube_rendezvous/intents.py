"""Fold the operator's and the user's intents into a rendezvous state document (pure, no I/O).

The operator never writes the state. It records intents on the Rendezvous object
(``spec.closed``, a deletion, ``status.evictedNodes``) and the agents' backend folds them into
the document it reads, so the framework's own code acts on them: a closed state ends the job,
and an evicted node's heartbeat is made ancient so that the framework's dead-node pruning
removes it at once instead of after the heartbeat timeout.

Not guaranteed: an eviction names a node by ``addr_pid_localid`` only, so it also matches a
later incarnation with the same name until the intent is gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime, timezone

from .document import RendezvousDocument

#: The heartbeat time given to evicted nodes: long expired on every clock.
EVICTED_HEARTBEAT = datetime(1970, 1, 1, tzinfo=timezone.utc)


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
