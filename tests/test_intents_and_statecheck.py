"""Folding intents into a document, and reading this process's own state pickles (pure)."""

from __future__ import annotations

import os
import pickle
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kube_rendezvous._rules.document import NodeId, RendezvousDocument
from kube_rendezvous._rules.intents import EVICTED_HEARTBEAT, fold_intents
from kube_rendezvous._rules.statecheck import load_own_state
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

NOW = datetime(2026, 12, 3, tzinfo=timezone.utc)
NODES = [NodeId(f"n{index}", index, 0) for index in range(3)]


def full_document() -> RendezvousDocument:
    return RendezvousDocument(
        participants={NODES[0]: 0, NODES[1]: 0},
        wait_list=frozenset({NODES[2]}),
        last_heartbeats=dict.fromkeys(NODES, NOW),
        deadline=NOW + timedelta(seconds=30),
    )


class TestFoldIntents:
    def test_close_marks_the_document_closed_once(self) -> None:
        closed = fold_intents(full_document(), close=True, evicted=[])
        assert closed is not None and closed.closed
        assert fold_intents(closed, close=True, evicted=[]) is closed

    def test_closing_before_any_state_gives_a_closed_empty_document(self) -> None:
        assert fold_intents(None, close=True, evicted=[]) == RendezvousDocument(closed=True)
        assert fold_intents(None, close=False, evicted=["n0_0_0"]) is None

    def test_evicting_a_node_expires_only_its_heartbeat(self) -> None:
        document = full_document()
        folded = fold_intents(document, close=False, evicted=[str(NODES[1])])
        assert folded is not None and folded is not document
        assert folded.last_heartbeats[NODES[1]] == EVICTED_HEARTBEAT
        assert all(folded.last_heartbeats[node] == NOW for node in (NODES[0], NODES[2]))
        assert fold_intents(folded, close=False, evicted=[str(NODES[1])]) is folded

    def test_evicting_an_unknown_node_changes_nothing(self) -> None:
        document = full_document()
        assert fold_intents(document, close=False, evicted=["nobody_1_0"]) is document


class Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo should-not-run",))


class TestLoadOwnState:
    def test_a_state_pickled_by_tensorplay_loads_with_the_real_classes(self) -> None:
        state = _RendezvousState()
        state.participants[_NodeDesc("a", 1, 0)] = 0
        state.last_heartbeats[_NodeDesc("a", 1, 0)] = NOW
        loaded = load_own_state(pickle.dumps(state), _RendezvousState, _NodeDesc)
        assert isinstance(loaded, _RendezvousState) and loaded.participants == {_NodeDesc("a", 1, 0): 0}

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (b"x", "are not one"),
            (pickle.dumps({"round": 1}), "got a pickled dict"),
            (pickle.dumps(Hostile()), r"posix\.system"),
        ],
    )
    def test_bytes_that_are_not_a_state_are_refused_with_what_they_are(self, data: bytes, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            load_own_state(data, _RendezvousState, _NodeDesc)
