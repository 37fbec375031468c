"""Fold the operator's and the user's intents into a rendezvous state (pure, no I/O).

The operator never writes the state. It records intents on the Rendezvous object
(``spec.closed``, a deletion, ``status.evictedNodes``) and the agents' backend folds them into
the state it reads, so tensorplay's own code acts on them: a closed state ends the job, and an
evicted node's heartbeat is made ancient so that tensorplay's dead-node pruning removes it at
once instead of after the heartbeat timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

#: The heartbeat time given to evicted nodes: long expired on every clock.
EVICTED_HEARTBEAT = datetime(1970, 1, 1, tzinfo=timezone.utc)


def fold_intents(state: Any, *, close: bool, evicted: Iterable[str]) -> bool:
    """Apply ``close`` and ``evicted`` (node names as in the summary) to ``state`` in place.

    Returns:
        True when the state changed.
    """
    changed = False
    if close and not state.closed:
        state.closed = True
        changed = True
    evicted = set(evicted)
    if evicted:
        known = set(state.last_heartbeats) | set(state.participants) | set(state.wait_list)
        for node in known:
            if str(node) in evicted and state.last_heartbeats.get(node) != EVICTED_HEARTBEAT:
                state.last_heartbeats[node] = EVICTED_HEARTBEAT
                changed = True
    return changed
