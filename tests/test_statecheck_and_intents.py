"""The restricted unpickler and the intent folding (pure)."""

from __future__ import annotations

import os
import pickle
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kube_rendezvous.intents import EVICTED_HEARTBEAT, fold_intents
from kube_rendezvous.statecheck import ForbiddenGlobalError, check_state_pickle
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState


class Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo should-not-run",))


def full_state() -> _RendezvousState:
    state = _RendezvousState()
    nodes = [_NodeDesc(f"n{i}", i, 0) for i in range(3)]
    now = datetime.now(timezone.utc)
    state.participants = {nodes[0]: 0, nodes[1]: 1}
    state.wait_list = {nodes[2]}
    state.redundancy_list = set()
    state.last_heartbeats = {node: now for node in nodes}
    state.deadline = now + timedelta(seconds=30)
    return state


class TestCheckStatePickle:
    def test_a_genuine_state_passes_with_stand_ins_and_without_tensorplay_classes(self) -> None:
        check_state_pickle(pickle.dumps(full_state()))

    def test_a_genuine_state_is_rebuilt_with_the_real_classes_when_given(self) -> None:
        module = "tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous"
        classes = {(module, "_RendezvousState"): _RendezvousState, (module, "_NodeDesc"): _NodeDesc}
        rebuilt = check_state_pickle(pickle.dumps(full_state()), classes)
        assert isinstance(rebuilt, _RendezvousState)
        assert sorted(rebuilt.participants.values()) == [0, 1]

    @pytest.mark.parametrize("payload", [Hostile(), {"x": Hostile()}, [1, Hostile()]], ids=["top", "nested", "list"])
    def test_a_pickle_that_names_another_callable_is_refused_before_it_runs(self, payload: object) -> None:
        with pytest.raises(ForbiddenGlobalError, match=r"posix\.system"):
            check_state_pickle(pickle.dumps(payload))


class TestFoldIntents:
    def test_close_marks_the_state_closed_once(self) -> None:
        state = full_state()
        assert fold_intents(state, close=True, evicted=[]) is True
        assert state.closed is True
        assert fold_intents(state, close=True, evicted=[]) is False

    def test_evicting_a_node_expires_only_its_heartbeat(self) -> None:
        state = full_state()
        victim = next(node for node, rank in state.participants.items() if rank == 1)
        before = dict(state.last_heartbeats)
        assert fold_intents(state, close=False, evicted=[str(victim)]) is True
        assert state.last_heartbeats[victim] == EVICTED_HEARTBEAT
        assert all(state.last_heartbeats[node] == before[node] for node in before if node != victim)
        assert fold_intents(state, close=False, evicted=[str(victim)]) is False

    def test_evicting_an_unknown_node_changes_nothing(self) -> None:
        state = full_state()
        assert fold_intents(state, close=False, evicted=["nobody_1_0"]) is False
