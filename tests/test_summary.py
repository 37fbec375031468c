"""rendezvous_phase/summarize_document/format_time: the readable status derived from a state document (pure)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kube_rendezvous._rules.document import NodeId, RendezvousDocument
from kube_rendezvous._rules.summary import (
    PHASES,
    RECENT_ROUNDS,
    SUMMARY_LIST_LIMIT,
    completed_by_text,
    departure_line,
    departure_of,
    format_time,
    forming_line,
    parse_time,
    rendezvous_phase,
    summarize_document,
)
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def node(addr: str, pid: int = 100, local_id: int = 0) -> _NodeDesc:
    return _NodeDesc(addr, pid, local_id)


def ident(desc: _NodeDesc) -> NodeId:
    return NodeId(desc.addr, desc.pid, desc.local_id)


def like(state: _RendezvousState) -> RendezvousDocument:
    """The document of a tensorplay state, built as is (unvalidated: the summary needs no validity)."""
    return RendezvousDocument(
        round=state.round,
        complete=state.complete,
        closed=state.closed,
        deadline=state.deadline,
        participants={ident(desc): rank for desc, rank in state.participants.items()},
        wait_list=frozenset(ident(desc) for desc in state.wait_list),
        redundancy_list=frozenset(ident(desc) for desc in state.redundancy_list),
        last_heartbeats={ident(desc): moment for desc, moment in state.last_heartbeats.items()},
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it to ``status``."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class TestRendezvousPhase:
    def test_no_state_is_pending(self) -> None:
        assert rendezvous_phase(None) == "Pending"

    def test_fresh_state_is_joining(self) -> None:
        assert rendezvous_phase(like(_RendezvousState())) == "Joining"

    def test_state_with_participants_and_no_deadline_is_joining(self) -> None:
        state = _RendezvousState()
        state.participants[node("a")] = 0
        assert rendezvous_phase(like(state)) == "Joining"

    def test_deadline_set_before_completion_is_last_call(self) -> None:
        state = _RendezvousState()
        state.deadline = NOW + timedelta(seconds=30)
        assert rendezvous_phase(like(state)) == "LastCall"

    def test_complete_state_is_complete(self) -> None:
        state = _RendezvousState()
        state.complete = True
        assert rendezvous_phase(like(state)) == "Complete"

    def test_complete_state_with_a_leftover_deadline_is_complete_not_last_call(self) -> None:
        state = _RendezvousState()
        state.complete = True
        state.deadline = NOW
        assert rendezvous_phase(like(state)) == "Complete"

    def test_closed_state_is_closed(self) -> None:
        state = _RendezvousState()
        state.closed = True
        assert rendezvous_phase(like(state)) == "Closed"

    def test_closed_state_is_closed_even_if_complete_with_a_deadline(self) -> None:
        state = _RendezvousState()
        state.closed = True
        state.complete = True
        state.deadline = NOW
        assert rendezvous_phase(like(state)) == "Closed"

    def test_every_phase_returned_is_one_of_the_declared_phases(self) -> None:
        states: list[_RendezvousState | None] = [None]
        for closed in (False, True):
            for complete in (False, True):
                for deadline in (None, NOW):
                    state = _RendezvousState()
                    state.closed, state.complete, state.deadline = closed, complete, deadline
                    states.append(state)
        assert {rendezvous_phase(None if state is None else like(state)) for state in states} == set(PHASES)


class TestSummarizeDocument:
    def test_participants_are_sorted_by_rank_with_node_strings(self) -> None:
        state = _RendezvousState()
        state.participants = {node("c"): 2, node("a"): 1, node("b"): 0}

        summary = summarize_document(like(state), now=NOW)

        assert summary["participants"] == [
            {"node": "b_100_0", "rank": 0},
            {"node": "a_100_0", "rank": 1},
            {"node": "c_100_0", "rank": 2},
        ]

    def test_participants_with_equal_ranks_are_ordered_by_node_string(self) -> None:
        state = _RendezvousState()
        state.participants = {node("b"): 0, node("a"): 0}
        assert [entry["node"] for entry in summarize_document(like(state), now=NOW)["participants"]] == [
            "a_100_0",
            "b_100_0",
        ]

    def test_waiting_nodes_are_sorted_node_strings(self) -> None:
        state = _RendezvousState()
        state.wait_list = {node("z", 3, 1), node("m", 9, 0), node("a", 1, 2)}
        assert summarize_document(like(state), now=NOW)["waiting"] == ["a_1_2", "m_9_0", "z_3_1"]

    def test_counts_are_exact_while_lists_are_truncated_at_the_limit(self) -> None:
        state = _RendezvousState()
        for index in range(5):
            member, waiter = node(f"p{index}"), node(f"w{index}")
            state.participants[member] = index
            state.wait_list.add(waiter)
            state.last_heartbeats[member] = NOW

        summary = summarize_document(like(state), now=NOW, limit=2)

        assert summary["participantCount"] == 5
        assert summary["waitingCount"] == 5
        assert summary["participants"] == [{"node": "p0_100_0", "rank": 0}, {"node": "p1_100_0", "rank": 1}]
        assert summary["waiting"] == ["w0_100_0", "w1_100_0"]
        assert "heartbeats" not in summary  # the document holds them; the summary stays small

    def test_default_limit_truncates_lists_at_summary_list_limit(self) -> None:
        state = _RendezvousState()
        for index in range(SUMMARY_LIST_LIMIT + 3):
            state.participants[node("host", index)] = index
        summary = summarize_document(like(state), now=NOW)
        assert summary["participantCount"] == SUMMARY_LIST_LIMIT + 3
        assert len(summary["participants"]) == SUMMARY_LIST_LIMIT
        assert summary["participants"][-1]["rank"] == SUMMARY_LIST_LIMIT - 1

    def test_scalars_describe_round_phase_and_closed(self) -> None:
        state = _RendezvousState()
        state.round = 7
        state.closed = True
        summary = summarize_document(like(state), now=NOW)
        assert (summary["round"], summary["phase"], summary["closed"]) == (7, "Closed", True)

    def test_deadline_is_shown_during_last_call(self) -> None:
        state = _RendezvousState()
        state.deadline = datetime(2024, 5, 1, 12, 0, 30, 500_000, tzinfo=timezone.utc)
        summary = summarize_document(like(state), now=NOW)
        assert summary["phase"] == "LastCall"
        assert summary["deadline"] == "2024-05-01T12:00:30Z"

    def test_deadline_is_none_once_complete(self) -> None:
        state = _RendezvousState()
        state.complete = True
        state.deadline = NOW + timedelta(seconds=30)
        summary = summarize_document(like(state), now=NOW)
        assert summary["phase"] == "Complete"
        assert summary["deadline"] is None

    def test_deadline_is_none_when_not_set(self) -> None:
        assert summarize_document(like(_RendezvousState()), now=NOW)["deadline"] is None

    def test_last_change_time_is_now_formatted(self) -> None:
        assert summarize_document(like(_RendezvousState()), now=NOW)["lastChangeTime"] == "2024-05-01T12:00:00Z"

    def test_last_writer_is_passed_through(self) -> None:
        assert summarize_document(like(_RendezvousState()), now=NOW, writer="trainer-0")["lastWriter"] == "trainer-0"

    def test_last_writer_is_none_by_default(self) -> None:
        assert summarize_document(like(_RendezvousState()), now=NOW)["lastWriter"] is None

    def test_summary_of_a_fresh_state_has_empty_lists_and_zero_counts(self) -> None:
        assert summarize_document(like(_RendezvousState()), now=NOW) == {
            "round": 0,
            "phase": "Joining",
            "closed": False,
            "participantCount": 0,
            "waitingCount": 0,
            "participants": [],
            "waiting": [],
            "spareCount": 0,
            "spares": [],
            "deadline": None,
            "lastChangeTime": "2024-05-01T12:00:00Z",
            "lastWriter": None,
            "roundStartTime": "2024-05-01T12:00:00Z",
            "recentRounds": [],
        }

    def test_summary_is_json_serializable(self) -> None:
        state = _RendezvousState()
        state.participants[node("a")] = 0
        state.last_heartbeats[node("a")] = NOW
        state.deadline = NOW
        summary = summarize_document(like(state), now=NOW, writer="w")
        assert json.loads(json.dumps(summary)) == summary

    def test_every_value_is_a_scalar_a_list_or_none_never_a_dict(self) -> None:
        state = _RendezvousState()
        state.participants[node("a")] = 0
        state.wait_list.add(node("b"))
        state.last_heartbeats[node("a")] = NOW
        state.deadline = NOW

        for key, value in summarize_document(like(state), now=NOW, writer="w").items():
            assert value is None or isinstance(value, (bool, int, str, list)), f"{key} is {type(value).__name__}"
            if isinstance(value, list):
                assert all(isinstance(item, (dict, str)) for item in value), key

    def test_merge_patch_of_a_new_summary_replaces_the_previous_one_completely(self) -> None:
        old_state = _RendezvousState()
        old_state.participants = {node("a"): 0, node("b"): 1}
        old_state.wait_list = {node("c")}
        old_state.last_heartbeats = {node("a"): NOW, node("b"): NOW}
        old_state.deadline = NOW
        previous = {"state": "kr1:...", **summarize_document(like(old_state), now=NOW, writer="old")}

        new_state = _RendezvousState()
        new_state.round = 1
        new_state.complete = True
        new_state.deadline = NOW
        new_state.participants = {node("d"): 0}
        new_summary = summarize_document(like(new_state), now=NOW + timedelta(seconds=5))

        patched = merge_patch(previous, new_summary)

        expected = {key: value for key, value in new_summary.items() if value is not None}
        assert patched == {"state": "kr1:...", **expected}
        assert "deadline" not in patched
        assert "lastWriter" not in patched


@pytest.fixture
def local_zone_not_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the process's local time zone UTC+05:30, so treating naive times as local would show."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    assert time.timezone == -(5 * 3600 + 30 * 60)
    yield
    monkeypatch.undo()
    time.tzset()


class TestFormatTime:
    def test_aware_utc_time_is_formatted_with_z_and_whole_seconds(self) -> None:
        assert format_time(datetime(2024, 1, 2, 3, 4, 5, 678_901, tzinfo=timezone.utc)) == "2024-01-02T03:04:05Z"

    @pytest.mark.usefixtures("local_zone_not_utc")
    def test_naive_time_is_treated_as_utc_not_local_time(self) -> None:
        assert format_time(datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05Z"

    def test_non_utc_aware_time_is_converted_to_utc(self) -> None:
        moment = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5, minutes=30)))
        assert format_time(moment) == "2024-01-01T21:34:05Z"

    @pytest.mark.parametrize("hours", [-8, -1, 1, 9])
    def test_same_instant_in_any_offset_formats_identically(self, hours: int) -> None:
        moment = datetime(2024, 6, 30, 23, 59, 59, tzinfo=timezone.utc)
        assert format_time(moment.astimezone(timezone(timedelta(hours=hours)))) == "2024-06-30T23:59:59Z"


class TestParseTime:
    def test_parse_time_reads_what_format_time_writes(self) -> None:
        moment = datetime(2024, 6, 30, 23, 59, 59, tzinfo=timezone.utc)
        assert parse_time(format_time(moment)) == moment

    def test_the_summary_of_128_nodes_stays_small(self) -> None:
        state = _RendezvousState()
        for index in range(128):
            state.participants[node(f"trainer-{index:04d}.trainer-headless.team-a.svc.cluster.local", 1)] = index
        summary = summarize_document(like(state), now=NOW, writer="trainer-0000")
        assert len(summary["participants"]) == SUMMARY_LIST_LIMIT == 16
        assert len(json.dumps(summary)) < 1800


class TestRoundProgress:
    """``roundStartTime`` and ``recentRounds``: how long the current round has been forming, and the last ones took."""

    @staticmethod
    def doc(round_number: int, complete: bool = False, nodes: int = 0) -> RendezvousDocument:
        members = {NodeId(f"10.0.0.{index}", 1, 0): index for index in range(nodes)}
        return RendezvousDocument(round=round_number, complete=complete, participants=members)

    def test_the_start_is_kept_while_the_round_forms_and_the_formed_round_is_recorded_once(self) -> None:
        first = summarize_document(self.doc(3), now=NOW)
        assert first["roundStartTime"] == "2024-05-01T12:00:00Z" and first["recentRounds"] == []
        later = summarize_document(self.doc(3, nodes=1), now=NOW + timedelta(seconds=20), previous=first)
        assert later["roundStartTime"] == "2024-05-01T12:00:00Z"
        formed = summarize_document(self.doc(3, True, 2), now=NOW + timedelta(seconds=30), previous=later)
        entry = {"round": 3, "startTime": "2024-05-01T12:00:00Z", "formedTime": "2024-05-01T12:00:30Z", "nodes": 2}
        assert formed["recentRounds"] == [entry]
        again = summarize_document(self.doc(3, True, 2), now=NOW + timedelta(seconds=90), previous=formed)
        assert again["recentRounds"] == [entry], "a write within a formed round records nothing"

    def test_a_new_round_restarts_the_clock_and_only_the_last_rounds_are_kept(self) -> None:
        status: dict[str, Any] = {}
        for number in range(8):
            start = NOW + timedelta(minutes=number)
            status = summarize_document(self.doc(number), now=start, previous=status)
            assert status["roundStartTime"] == format_time(start)
            status = summarize_document(self.doc(number, True, 1), now=start + timedelta(seconds=5), previous=status)
        assert [item["round"] for item in status["recentRounds"]] == [3, 4, 5, 6, 7]
        assert len(status["recentRounds"]) == RECENT_ROUNDS

    def test_without_the_previous_status_the_round_starts_now(self) -> None:
        formed = summarize_document(self.doc(2, True, 1), now=NOW, previous=None)
        assert formed["roundStartTime"] == format_time(NOW)
        assert formed["recentRounds"] == [
            {"round": 2, "startTime": format_time(NOW), "formedTime": format_time(NOW), "nodes": 1}
        ]


class TestFormingLine:
    """The line an agent logs every 10 s while its round forms: who joined, how many more, who is missing."""

    A, B, C = NodeId("10.0.0.1", 1, 0), NodeId("10.0.0.2", 1, 0), NodeId("10.0.0.3", 1, 0)

    def test_it_counts_the_nodes_still_needed_and_names_the_last_rounds_members_that_are_missing(self) -> None:
        document = RendezvousDocument(round=4, participants={self.A: 0}, wait_list=frozenset({self.C}))
        line = forming_line(document, min_nodes=3, waited=20.4, last_members=frozenset({self.A, self.B}))
        assert line == (
            "round 4 still forming after 20 s: 1 of minNodes 3 joined (10.0.0.1_1_0); waiting for 2 more nodes; "
            "missing from the last round: 10.0.0.2_1_0; 1 waiting for the next round"
        )

    def test_in_last_call_it_says_until_when(self) -> None:
        document = RendezvousDocument(round=1, participants={self.A: 0, self.B: 0}, deadline=NOW)
        line = forming_line(document, min_nodes=2, waited=10, last_members=None)
        assert line == (
            "round 1 still forming after 10 s: 2 of minNodes 2 joined (10.0.0.1_1_0, 10.0.0.2_1_0); "
            "minNodes reached, last call until 2024-05-01T12:00:00Z"
        )

    def test_a_complete_or_closed_round_has_no_line(self) -> None:
        assert forming_line(RendezvousDocument(complete=True, participants={self.A: 0}), min_nodes=1, waited=30) is None
        assert forming_line(RendezvousDocument(closed=True), min_nodes=1, waited=30) is None


class TestDeparture:
    a, b, c = NodeId("10.0.0.1", 1, 0), NodeId("10.0.0.2", 2, 0), NodeId("10.0.0.3", 3, 0)

    def formed(self) -> RendezvousDocument:
        return RendezvousDocument(round=3, complete=True, participants={self.a: 0, self.b: 1, self.c: 2})

    def test_a_formed_round_that_loses_members_records_who_went_and_why(self) -> None:
        after = RendezvousDocument(round=3, complete=True, participants={self.a: 0})
        departure = departure_of(self.formed(), after, {self.b: "Left", self.c: "Evicted"}, NOW)
        assert departure == {
            "round": 3,
            "time": "2024-05-01T12:00:00Z",
            "count": 2,
            "nodes": [{"node": str(self.b), "reason": "Left"}, {"node": str(self.c), "reason": "Evicted"}],
        }
        assert departure_line(departure) == "2 nodes left round 3: 10.0.0.2_2_0 (left), 10.0.0.3_3_0 (evicted)"
        only = {**departure, "count": 1, "nodes": departure["nodes"][1:]}
        assert departure_line(only) == "node 10.0.0.3_3_0 was evicted from round 3"

    def test_the_last_member_leaving_starts_the_next_round_and_still_records_the_break(self) -> None:
        before = RendezvousDocument(round=3, complete=True, participants={self.a: 0})
        departure = departure_of(before, RendezvousDocument(round=4), {}, NOW)
        assert departure is not None and departure["round"] == 3
        assert departure["nodes"] == [{"node": str(self.a), "reason": "Removed"}]

    def test_only_the_first_departure_of_a_round_breaks_it(self) -> None:
        first = departure_of(
            self.formed(), RendezvousDocument(round=3, complete=True, participants={self.a: 0, self.c: 2}), {}, NOW
        )
        assert first is not None
        after = RendezvousDocument(round=3, complete=True, participants={self.c: 2})
        before = RendezvousDocument(round=3, complete=True, participants={self.a: 0, self.c: 2})
        assert departure_of(before, after, {}, NOW, first) is None  # a survivor re-rendezvousing
        assert departure_of(before, after, {}, NOW, {**first, "round": 2}) is not None

    def test_forming_rounds_closed_ones_and_gains_record_nothing(self) -> None:
        forming = RendezvousDocument(round=3, participants={self.a: 0, self.b: 0})
        assert departure_of(forming, RendezvousDocument(round=3, participants={self.a: 0}), {}, NOW) is None
        closed = RendezvousDocument(round=3, complete=True, closed=True, participants={self.a: 0})
        assert departure_of(self.formed(), closed, {}, NOW) is None
        gained = RendezvousDocument(**{**self.formed().__dict__, "wait_list": frozenset({NodeId("d", 4, 0)})})
        assert departure_of(self.formed(), gained, {}, NOW) is None
        assert departure_of(None, self.formed(), {}, NOW) is None

    def test_members_leaving_to_let_waiting_nodes_in_is_a_scale_up_not_a_break(self) -> None:
        waiting = frozenset({NodeId("10.0.0.4", 4, 0)})
        before = RendezvousDocument(**{**self.formed().__dict__, "wait_list": waiting})
        after = RendezvousDocument(round=3, complete=True, participants={self.a: 0, self.c: 2}, wait_list=waiting)
        assert departure_of(before, after, {self.b: "Left"}, NOW) is None
        # Not when one of them was evicted, expired or removed, nor when nobody waits.
        assert departure_of(before, after, {self.b: "Evicted"}, NOW) is not None
        assert departure_of(before, after, {}, NOW) is not None
        assert departure_of(self.formed(), after, {self.b: "Left"}, NOW) is not None

    def test_at_most_16_nodes_are_listed_and_the_line_says_how_many_more(self) -> None:
        many = {NodeId(f"10.1.0.{index}", index, 0): index for index in range(20)}
        departure = departure_of(
            RendezvousDocument(round=0, complete=True, participants=many), RendezvousDocument(round=1), {}, NOW
        )
        assert departure is not None and departure["count"] == 20 and len(departure["nodes"]) == 16
        assert departure_line(departure).startswith("20 nodes left round 0: 10.1.0.0_0_0 (removed), ")
        assert departure_line(departure).endswith("and 4 more")


def test_a_round_records_the_rule_that_completed_it_and_the_progress_line_names_it() -> None:
    now = datetime.now(timezone.utc)
    forming = {"round": 3, "roundStartTime": format_time(now), "phase": "LastCall", "recentRounds": []}
    formed = RendezvousDocument(round=3, complete=True, participants={NodeId("a", 1, 0): 0})
    status = summarize_document(formed, now=now, previous=forming, completed_by="TrainingPodsJoined")
    assert status["recentRounds"][-1]["completedBy"] == "TrainingPodsJoined"
    assert completed_by_text(status, 3) == " (once every live training pod joined)"
    assert completed_by_text(status, 2) == ""  # another round: the status does not say
    # Written again in the same round: the round is not recorded twice.
    again = summarize_document(formed, now=now, previous={**forming, **status}, completed_by=None)
    assert again["recentRounds"] == status["recentRounds"]
    unsaid = summarize_document(formed, now=now, previous=forming)
    assert "completedBy" not in unsaid["recentRounds"][-1] and completed_by_text(unsaid, 3) == ""
