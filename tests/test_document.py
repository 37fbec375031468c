"""The state document: round trips, size, and a decoder that refuses everything else (pure)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import time
import zlib
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_rendezvous._rules.document import (
    DOCUMENT_MARKER,
    MAX_DOCUMENT_BYTES,
    MAX_ENCODED_BYTES,
    MAX_NODES,
    NodeId,
    RendezvousDocument,
    StateDocumentError,
    StateTooLargeError,
    decode_document,
    document_from_json,
    document_from_state,
    document_to_json,
    encode_document,
    state_from_document,
    validate_document,
)
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

NOW = datetime(2026, 12, 3, 6, 0, 0, 123456, tzinfo=timezone.utc)


def frame(raw: bytes, marker: str = DOCUMENT_MARKER) -> str:
    """``raw`` (JSON text) in the kr1: framing."""
    return marker + base64.b64encode(zlib.compress(raw)).decode("ascii")


def state_fields(state: _RendezvousState) -> dict[str, Any]:
    return {name: getattr(state, name) for name in vars(_RendezvousState())}


def realistic(nodes: int, *, pid: int = 1, complete: bool = True) -> RendezvousDocument:
    """A round of ``nodes`` pods named like an Indexed Job's behind a headless Service."""
    ids = [NodeId(f"trainer-{index:04d}.trainer-headless.team-a.svc.cluster.local", pid, 0) for index in range(nodes)]
    return RendezvousDocument(
        round=7,
        complete=complete,
        participants={node: (rank if complete else 0) for rank, node in enumerate(ids)},
        last_heartbeats={
            node: NOW - timedelta(microseconds=(index * 7919) % 5_000_000) for index, node in enumerate(ids)
        },
    )


def valid_json(**changes: Any) -> dict[str, Any]:
    data = document_to_json(realistic(3))
    data.update(changes)
    return data


# -- tensorplay states, generated ------------------------------------------------------------

addresses = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)
node_descs = st.builds(_NodeDesc, addresses, st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
moments = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9000, 1, 1), timezones=st.just(timezone.utc))


@st.composite
def tensorplay_states(draw: st.DrawFn) -> _RendezvousState:
    """Any state tensorplay's transitions can produce: one role per node, ranks as tensorplay assigns them."""
    nodes = draw(st.lists(node_descs, unique=True, max_size=24))
    roles = draw(st.lists(st.sampled_from("pwrh"), min_size=len(nodes), max_size=len(nodes)))
    state = _RendezvousState()
    state.round = draw(st.integers(0, 2**31 - 1))
    state.complete = draw(st.booleans())
    state.closed = draw(st.booleans())
    state.deadline = draw(st.none() | moments)
    participants = sorted(node for node, role in zip(nodes, roles, strict=True) if role == "p")
    if state.complete:
        ranks = draw(st.permutations(range(len(participants) + draw(st.integers(0, 5)))))
        state.participants = dict(zip(participants, ranks, strict=False))
    else:
        state.participants = dict.fromkeys(participants, 0)
    state.wait_list = {node for node, role in zip(nodes, roles, strict=True) if role == "w"}
    state.redundancy_list = {node for node, role in zip(nodes, roles, strict=True) if role == "r"}
    for node, role in zip(nodes, roles, strict=True):
        if role == "h" or draw(st.booleans()):
            state.last_heartbeats[node] = draw(moments)
    return state


class TestRoundTrip:
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(tensorplay_states())
    def test_any_tensorplay_state_survives_document_text_and_back_unchanged(self, state: _RendezvousState) -> None:
        text = encode_document(document_from_state(state))
        rebuilt = state_from_document(decode_document(text), _RendezvousState, _NodeDesc)
        assert state_fields(rebuilt) == state_fields(state)
        assert isinstance(rebuilt, _RendezvousState)
        assert all(type(node) is _NodeDesc for node in rebuilt.participants)

    def test_microseconds_and_time_zones_are_kept_exactly(self) -> None:
        east = timezone(timedelta(hours=5, minutes=30))
        node = NodeId("a", 1, 0)
        document = RendezvousDocument(deadline=NOW.astimezone(east), last_heartbeats={node: NOW})
        decoded = decode_document(encode_document(document))
        assert decoded.deadline == NOW and decoded.last_heartbeats[node] == NOW
        assert decoded.deadline is not None and decoded.deadline.microsecond == 123456

    def test_encoding_is_deterministic_whatever_the_insertion_order(self) -> None:
        nodes = [NodeId(f"n{index}", index, 0) for index in range(20)]
        forward = RendezvousDocument(participants=dict.fromkeys(nodes, 0))
        backward = RendezvousDocument(participants=dict.fromkeys(reversed(nodes), 0))
        assert encode_document(forward) == encode_document(backward)

    def test_a_node_string_is_addr_pid_local_id_as_tensorplay_prints_it(self) -> None:
        assert str(NodeId("10.0.0.1", 1, 2)) == repr(_NodeDesc("10.0.0.1", 1, 2)) == "10.0.0.1_1_2"


class TestSize:
    @pytest.mark.parametrize(("nodes", "limit"), [(128, 2 * 1024), (1024, 12 * 1024), (8192, 96 * 1024)])
    def test_realistic_states_stay_under_the_size_budget(self, nodes: int, limit: int) -> None:
        # The budgets leave room for the readable summary within the limits
        # (whole status 16 KiB at 1024 nodes, 128 KiB at 8192, a write at 128 nodes 4 KB).
        assert len(encode_document(realistic(nodes))) < limit

    def test_a_state_too_large_for_an_object_is_refused_naming_the_limit(self) -> None:
        with pytest.raises(StateTooLargeError, match=r"over the 1000-byte limit"):
            encode_document(realistic(200), limit=1000)

    def test_decoding_time_grows_with_size_only(self) -> None:
        text = encode_document(realistic(MAX_NODES))
        started = time.perf_counter()
        decode_document(text)
        # Generous: a linear decode of the largest state takes well under a second here.
        assert time.perf_counter() - started < 5


class TestValidation:
    def test_two_roles_for_one_node_are_refused(self) -> None:
        node = NodeId("a", 1, 0)
        with pytest.raises(StateDocumentError, match=r"in both the participants and the wait list") as error:
            validate_document(RendezvousDocument(participants={node: 0}, wait_list=frozenset({node})))
        assert error.value.field == "role"

    def test_duplicate_ranks_in_a_complete_round_are_refused(self) -> None:
        document = RendezvousDocument(complete=True, participants={NodeId("a", 1, 0): 0, NodeId("b", 1, 0): 0})
        with pytest.raises(StateDocumentError, match="rank 0 is held by two participants"):
            validate_document(document)

    def test_a_rank_before_completion_is_refused(self) -> None:
        with pytest.raises(StateDocumentError, match="before the round completed"):
            validate_document(RendezvousDocument(participants={NodeId("a", 1, 0): 3}))

    def test_more_participants_than_allowed_are_refused(self) -> None:
        document = RendezvousDocument(participants={NodeId(f"n{i}", 1, 0): 0 for i in range(3)})
        with pytest.raises(StateDocumentError, match="3 participants, more than the 2 nodes allowed"):
            validate_document(document, max_participants=2)

    def test_a_naive_heartbeat_is_refused(self) -> None:
        with pytest.raises(StateDocumentError, match="timezone-aware"):
            validate_document(RendezvousDocument(last_heartbeats={NodeId("a", 1, 0): datetime(2026, 1, 1)}))

    @pytest.mark.parametrize(
        ("node", "field"),
        [
            (NodeId("", 1, 0), "addr"),
            (NodeId("a" * 254, 1, 0), "addr"),
            (NodeId("has space", 1, 0), "addr"),
            (NodeId("a", -1, 0), "pid"),
            (NodeId("a", 2**31, 0), "pid"),
            (NodeId("a", 1, True), "localId"),  # type: ignore[arg-type]
        ],
    )
    def test_a_bad_node_is_refused_naming_the_field(self, node: NodeId, field: str) -> None:
        with pytest.raises(StateDocumentError, match=field) as error:
            validate_document(RendezvousDocument(wait_list=frozenset({node})))
        assert error.value.field.endswith(field)

    @pytest.mark.parametrize(
        ("node", "field"),
        [
            (NodeId("a", True, 0), "pid"),  # type: ignore[arg-type]  # True == 1: equal to the node seen
            (NodeId(type("Addr", (str,), {})("a"), 1, 0), "addr"),  # a str subclass equal to "a"
        ],
    )
    def test_a_node_equal_to_one_validated_before_is_still_checked_field_by_field(
        self, node: NodeId, field: str
    ) -> None:
        validate_document(RendezvousDocument(wait_list=frozenset({NodeId("a", 1, 0)})))  # remembered as valid
        with pytest.raises(StateDocumentError, match=field):
            validate_document(RendezvousDocument(wait_list=frozenset({node})))

    def test_heartbeats_outside_1970_to_9999_are_refused(self) -> None:
        early = datetime(1969, 12, 31, tzinfo=timezone.utc)
        with pytest.raises(StateDocumentError, match="heartbeat of"):
            validate_document(RendezvousDocument(last_heartbeats={NodeId("a", 1, 0): early}))

    def test_a_state_that_is_not_a_rendezvous_state_is_refused(self) -> None:
        with pytest.raises(StateDocumentError, match="not a rendezvous state"):
            document_from_state(object())


def bomb(size: int) -> str:
    compressor = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    data = compressor.compress(b'{"version":1') + b"".join(compressor.compress(chunk) for _ in range(size >> 20))
    return DOCUMENT_MARKER + base64.b64encode(data + compressor.flush()).decode("ascii")


class Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo should-not-run",))


class TestDecoderRefuses:
    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (42, "must be a string"),
            ("", "not the marker"),
            ("gzip:" + base64.b64encode(b"abc").decode(), "not the marker"),
            ("z1:" + base64.b64encode(zlib.compress(pickle.dumps(Hostile()))).decode(), "holds a pickle"),
            (base64.b64encode(pickle.dumps(Hostile())).decode(), "not the marker"),
            (DOCUMENT_MARKER + "not base64!", "invalid base64"),
            (DOCUMENT_MARKER + base64.b64encode(b"not zlib").decode(), "corrupt zlib"),
            (DOCUMENT_MARKER + base64.b64encode(zlib.compress(b"{}")[:-3]).decode(), "truncated"),
            (DOCUMENT_MARKER + base64.b64encode(zlib.compress(b"{}") + b"xx").decode(), "after its zlib stream"),
            ("kr1:" + "A" * (MAX_ENCODED_BYTES + 1), "over the"),
            (frame(b"\xff\xfe"), "not UTF-8"),
            (frame(b"[" * 100_000 + b"]" * 100_000), "not one JSON object"),
            (frame(b'{"a":{"b":1}}'), "not one JSON object"),
            (frame(b'{"a":[[1]]}'), "not one JSON object"),
            (frame(b"{"), "not one JSON object"),
            (frame(b'{"version":1,"version":1}'), "appears twice"),
            (frame(b'{"round":NaN}'), "holds NaN"),
            (frame(b'{"round":1e400}'), "non-integer number"),
            (frame(b'{"round":' + b"9" * 5000 + b"}"), "integer of 5000 digits"),
            (frame(json.dumps(valid_json(round=-1)).encode()), "round"),
            (frame(json.dumps(valid_json(round=True)).encode()), "round"),
            (frame(json.dumps(valid_json(version=2)).encode()), "not a version this release reads"),
            (frame(json.dumps(valid_json(extra=1)).encode()), "field 'extra' is not a field"),
            (frame(json.dumps(valid_json(pid=[1, 1])).encode()), "pid: has 2 entries but addr has 3"),
            (frame(json.dumps(valid_json(addr=["b", "a", "c"])).encode()), "listed twice or out of order"),
            (frame(json.dumps(valid_json(addr=["a", "a", "a"])).encode()), "listed twice or out of order"),
            (frame(json.dumps(valid_json(role=[1, 1, 7])).encode()), "role"),
            (frame(json.dumps(valid_json(rankDelta=[0, 0, 1])).encode()), "rank 0 is held by two participants"),
            (frame(json.dumps(valid_json(rankDelta=[0, 1])).encode()), "rankDelta"),
            (frame(json.dumps(valid_json(heartbeat=[-1, 0, 0], role=[0, 1, 1])).encode()), "neither a role"),
            (frame(json.dumps(valid_json(deadline=10**18)).encode()), "deadline"),
            (frame(json.dumps(valid_json(addr="abc")).encode()), "must be a list"),
            (frame(json.dumps([1, 2]).encode()), "not one JSON object"),
        ],
    )
    def test_with_a_state_error_that_names_the_problem(self, text: object, message: str) -> None:
        with pytest.raises(StateDocumentError, match=message):
            decode_document(text)

    def test_a_decompression_bomb_costs_no_more_than_the_limit(self) -> None:
        text = bomb(MAX_DOCUMENT_BYTES * 25)  # 200 MiB of spaces
        assert len(text) < 1024 * 1024  # it would fit in an object
        with pytest.raises(StateDocumentError, match="decompresses to more than"):
            decode_document(text)

    def test_more_nodes_than_the_limit_are_refused(self) -> None:
        count = MAX_NODES + 1
        data = {
            **valid_json(),
            "addr": [f"n{index:06d}" for index in range(count)],
            "pid": [1] * count,
            "localId": [0] * count,
            "role": [2] * count,
            "rankDelta": [],
            "heartbeat": [0] * count,
        }
        with pytest.raises(StateDocumentError, match=f"more than the {MAX_NODES} allowed"):
            document_from_json(data)

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=2048))
    def test_arbitrary_bytes_in_the_framing_only_ever_raise_the_state_error(self, payload: bytes) -> None:
        for text in (frame(payload), DOCUMENT_MARKER + base64.b64encode(payload).decode()):
            try:
                decode_document(text)
            except StateDocumentError:
                pass


def test_the_fuzz_script_runs_and_reports_its_outcomes() -> None:
    """A short run of scripts/fuzz_state.py (the 60 s run of docs/security.md is outside CI's timed tests)."""
    import subprocess
    import sys

    from tests.helpers import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fuzz_state.py"), "--seconds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "fuzzed" in done.stdout and "refused: text" in done.stdout
