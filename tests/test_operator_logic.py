"""The operator's pure decisions, without an API server: conditions, spec checks, state checks,
Events between state documents, pod matching, live agents and evictions.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pickle
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kube_rendezvous._rules.document import (
    NodeId,
    RendezvousDocument,
    StateDocumentError,
    decode_document,
    document_to_json,
    encode_document,
)
from kube_rendezvous._rules.intents import EVICTED_NODES_KEPT, with_evicted
from kube_rendezvous._rules.settings import RendezvousTimings
from kube_rendezvous_operator import (
    conditions_rules,
    events_rules,
    not_ready_rules,
    pods_rules,
    restarts_rules,
    writer_rules,
)

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
A, B, C, D = (NodeId(f"10.0.0.{index}", 100 + index, 0) for index in range(1, 5))


def document(**fields: Any) -> RendezvousDocument:
    return RendezvousDocument(**fields)


def events_of(found: list[events_rules.RendezvousEvent]) -> list[tuple[str, str]]:
    return [(event.reason, event.message) for event in found]


class TestSetCondition:
    def test_adds_a_missing_condition_and_keeps_the_others(self) -> None:
        others = [{"type": "Closed", "status": "False"}]
        result = conditions_rules.set_condition(others, "Ready", "True", "Valid", "ok", 3, NOW)
        assert result == [
            {"type": "Closed", "status": "False"},
            {
                "type": "Ready",
                "status": "True",
                "reason": "Valid",
                "message": "ok",
                "observedGeneration": 3,
                "lastTransitionTime": "2025-01-02T03:04:05Z",
            },
        ]

    def test_returns_none_when_nothing_changes_so_the_operator_does_not_write(self) -> None:
        current = conditions_rules.set_condition([], "Ready", "True", "Valid", "ok", 3, NOW)
        assert current is not None
        assert (
            conditions_rules.set_condition(current, "Ready", "True", "Valid", "ok", 3, NOW + timedelta(hours=1)) is None
        )

    def test_keeps_the_transition_time_when_only_the_message_changes(self) -> None:
        current = conditions_rules.set_condition([], "Ready", "False", "StateInvalid", "one", 1, NOW)
        assert current is not None
        later = conditions_rules.set_condition(
            current, "Ready", "False", "StateInvalid", "two", 1, NOW + timedelta(minutes=5)
        )
        assert later is not None and len(later) == 1
        assert later[0]["message"] == "two" and later[0]["lastTransitionTime"] == "2025-01-02T03:04:05Z"

    def test_moves_the_transition_time_when_the_status_changes(self) -> None:
        current = conditions_rules.set_condition([], "Ready", "False", "StateInvalid", "bad", 1, NOW)
        assert current is not None
        later = conditions_rules.set_condition(current, "Ready", "True", "Valid", "ok", 1, NOW + timedelta(minutes=5))
        assert later is not None and len(later) == 1
        assert later[0]["lastTransitionTime"] == "2025-01-02T03:09:05Z"

    def test_find_condition(self) -> None:
        status = {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Closed", "status": "True"}]}
        assert conditions_rules.find_condition(status, "Closed") == {"type": "Closed", "status": "True"}
        assert conditions_rules.find_condition({}, "Ready") is None


class TestSpec:
    def test_a_valid_spec_has_no_problems(self) -> None:
        assert conditions_rules.spec_problems({"minNodes": 1, "maxNodes": 4, "joinTimeoutSeconds": 600}) == []

    def test_min_above_max_is_named(self) -> None:
        (problem,) = conditions_rules.spec_problems({"minNodes": 5, "maxNodes": 4})
        assert "spec.minNodes (5)" in problem and "spec.maxNodes (4)" in problem

    def test_a_join_timeout_shorter_than_the_heartbeat_expiry_of_the_spec_is_named(self) -> None:
        spec = {"minNodes": 1, "maxNodes": 2, "joinTimeoutSeconds": 20, "keepAliveIntervalSeconds": 10}
        (problem,) = conditions_rules.spec_problems(spec)
        assert "spec.joinTimeoutSeconds (20)" in problem and "(30 s" in problem
        assert conditions_rules.spec_problems({**spec, "joinTimeoutSeconds": 30}) == []

    def test_the_join_timeout_is_checked_only_when_the_spec_sets_it(self) -> None:
        # 700 s of heartbeat expiry exceeds the default join timeout, but the launcher passes its own.
        assert conditions_rules.spec_problems({"minNodes": 1, "maxNodes": 2, "keepAliveMaxAttempts": 140}) == []

    def test_a_timing_the_agents_would_refuse_is_a_problem_naming_the_field(self) -> None:
        (problem,) = conditions_rules.spec_problems({"minNodes": 1, "maxNodes": 2, "keepAliveIntervalSeconds": 0})
        assert "spec.keepAliveIntervalSeconds" in problem

    @pytest.mark.parametrize(
        "spec",
        [{}, {"keepAliveIntervalSeconds": 2}, {"keepAliveIntervalSeconds": 4, "keepAliveMaxAttempts": 5}],
    )
    def test_heartbeat_expiry_is_the_agents_resolution_of_the_spec(self, spec: dict[str, Any]) -> None:
        expected = RendezvousTimings.resolve(None, spec).heartbeat_expiry
        assert conditions_rules.heartbeat_expiry(spec) == timedelta(seconds=expected)

    def test_heartbeat_expiry_values(self) -> None:
        assert conditions_rules.heartbeat_expiry({}) == timedelta(seconds=15)
        assert conditions_rules.heartbeat_expiry(
            {"keepAliveIntervalSeconds": 4, "keepAliveMaxAttempts": 5}
        ) == timedelta(seconds=20)
        assert conditions_rules.heartbeat_expiry({"keepAliveIntervalSeconds": -1}) == timedelta(
            seconds=15
        )  # refused: default

    def test_close_timeout_comes_from_the_spec(self) -> None:
        assert conditions_rules.timings({"closeTimeoutSeconds": 7}).close == 7
        assert conditions_rules.timings({}).close == RendezvousTimings().close


VALID = document(round=2, complete=True, participants={A: 0, B: 1}, last_heartbeats={A: NOW, B: NOW})


class TestStateCheck:
    @pytest.mark.parametrize("text", [None, ""])
    def test_no_state_yet_is_fine(self, text: str | None) -> None:
        stored = conditions_rules.read_state(text, None)
        assert stored.document is None and stored.error is None
        check = conditions_rules.check_state(stored)
        assert check.ok and check.reason == "NoStateYet"

    def test_a_valid_state_is_decoded(self) -> None:
        stored = conditions_rules.read_state(encode_document(VALID), None)
        assert stored.document == VALID and stored.error is None
        assert conditions_rules.check_state(stored) == conditions_rules.StateCheck(
            True, "StateValid", "the state is a valid state document"
        )

    def test_an_invalid_state_gives_state_invalid_with_the_validators_message(self) -> None:
        fields = {**document_to_json(VALID), "round": "3"}
        text = "kr1:" + base64.b64encode(zlib.compress(json.dumps(fields).encode())).decode()
        with pytest.raises(StateDocumentError) as raised:
            decode_document(text)
        assert raised.value.field == "round"
        stored = conditions_rules.read_state(text, None)
        assert stored.document is None and stored.error is not None and stored.error.field == "round"
        check = conditions_rules.check_state(stored)
        assert not check.ok
        assert check.reason == "StateInvalid"
        assert check.message == str(raised.value)

    def test_a_pickle_is_refused_unread(self, tmp_path: Path) -> None:
        marker = tmp_path / "ran"

        class RunsCommand:
            def __reduce__(self) -> tuple[Any, ...]:
                return (os.system, (f"touch {marker}",))

        text = "z1:" + base64.b64encode(zlib.compress(pickle.dumps(RunsCommand()))).decode()
        check = conditions_rules.check_state(conditions_rules.read_state(text, None))
        assert (check.ok, check.reason) == (False, "StateInvalid")
        assert "pickle" in check.message
        assert not marker.exists()

    def test_the_same_text_is_not_decoded_again(self, monkeypatch: pytest.MonkeyPatch) -> None:
        text = encode_document(VALID)
        first = conditions_rules.read_state(text, None)

        def fail(_: object) -> RendezvousDocument:
            raise AssertionError("decoded again")

        monkeypatch.setattr(conditions_rules, "decode_document", fail)
        again = text[:10] + text[10:]
        assert again is not text
        assert conditions_rules.read_state(again, first) is first

    def test_a_changed_text_is_decoded(self) -> None:
        first = conditions_rules.read_state(encode_document(VALID), None)
        changed = document(round=3, wait_list=frozenset({C}), last_heartbeats={C: NOW})
        second = conditions_rules.read_state(encode_document(changed), first)
        assert second.document == changed
        invalid = conditions_rules.read_state("kr1:!!", second)
        assert invalid.document is None and invalid.error is not None and invalid.error.field == "text"
        assert conditions_rules.read_state(None, invalid).error is None

    def test_a_validator_failure_fails_closed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def broken(_: object) -> RendezvousDocument:
            raise RecursionError("bug")

        monkeypatch.setattr(conditions_rules, "decode_document", broken)
        check = conditions_rules.check_state(conditions_rules.read_state("kr1:eJwDAAAAAAE=", None))
        assert (check.ok, check.reason) == (False, "StateInvalid")
        assert "RecursionError" in check.message

    def test_ready_condition(self) -> None:
        bad = conditions_rules.StateCheck(False, "StateInvalid", "status.state round: bad")
        good = conditions_rules.StateCheck(True, "StateValid", "fine")
        assert conditions_rules.ready_condition([], bad, {}, {}) == (
            "Ready",
            "False",
            "StateInvalid",
            "status.state round: bad",
        )
        assert conditions_rules.ready_condition(["spec wrong"], bad, {}, {}) == (
            "Ready",
            "False",
            "StateInvalid",
            "status.state round: bad; spec wrong",
        )
        complete = {"phase": "Complete", "round": 2, "participantCount": 2}
        assert conditions_rules.ready_condition(["a", "b"], good, complete, {}) == (
            "Ready",
            "False",
            "InvalidSpec",
            "a; b",
        )
        assert conditions_rules.ready_condition([], good, complete, {"minNodes": 2})[:3] == (
            "Ready",
            "True",
            "RoundComplete",
        )


class TestStateEvents:
    def test_first_sight_of_a_completed_closed_round(self) -> None:
        new = document(round=4, complete=True, closed=True, participants={B: 0, A: 1}, wait_list=frozenset({C}))
        assert events_of(events_rules.state_events(None, new)) == [
            ("NodeJoined", "node 10.0.0.1_101_0 joined round 4"),
            ("NodeJoined", "node 10.0.0.2_102_0 joined round 4"),
            ("RoundCompleted", "round 4 completed with 2 nodes: 10.0.0.2_102_0=0, 10.0.0.1_101_0=1"),
            ("Closed", "rendezvous closed in round 4"),
        ]

    def test_a_round_reforming_posts_nothing_until_it_forms_then_only_who_changed(self) -> None:
        """The demo's flap: survivors A and B leave round 2 and join round 3, C dies, D is new."""
        formed = document(round=2, complete=True, participants={A: 0, B: 1, C: 2})
        last = events_rules.formed_members(None, None, formed)
        steps = [
            document(round=2, complete=True, participants={B: 1, C: 2}),  # A leaves round 2
            document(round=2, complete=True, participants={C: 2}, wait_list=frozenset({A})),  # B leaves, A waits
            document(round=3, participants={A: 0}),  # C expired: round 3 opens
            document(round=3, participants={A: 0, B: 0, D: 0}, deadline=NOW),
        ]
        previous = formed
        for step in steps:
            assert events_rules.state_events(previous, step, last_formed=last) == [], step
            last = events_rules.formed_members(last, previous, step)
            previous = step
        assert last == frozenset({A, B, C})
        done = document(round=3, complete=True, participants={A: 0, B: 1, D: 2})
        assert events_of(events_rules.state_events(previous, done, last_formed=last)) == [
            ("NodeJoined", "node 10.0.0.4_104_0 joined round 3"),
            ("NodeLeft", "node 10.0.0.3_103_0 left: round 3 formed without it"),
            ("RoundCompleted", "round 3 completed with 3 nodes: 10.0.0.1_101_0=0, 10.0.0.2_102_0=1, 10.0.0.4_104_0=2"),
        ]
        assert events_rules.formed_members(last, previous, done) == frozenset({A, B, D})

    def test_a_new_leader_does_not_repeat_what_was_announced(self) -> None:
        formed = document(round=3, complete=True, participants={A: 0, B: 1})
        told = [
            ("NodeJoined", "node 10.0.0.1_101_0 joined round 3"),
            ("RoundCompleted", "round 3 completed with 2 nodes"),
        ]
        baseline, last = events_rules.announced_baseline(formed, told)
        assert events_rules.state_events(baseline, formed, last_formed=last) == []
        # Only an earlier round was announced: this one is new, so it is announced.
        baseline, last = events_rules.announced_baseline(formed, [("RoundCompleted", "round 2 completed with 2 nodes")])
        assert (baseline, last) == (None, None)
        assert "RoundCompleted" in [
            event.reason for event in events_rules.state_events(baseline, formed, last_formed=last)
        ]
        # Closed after the announced round, but not yet announced: only Closed is posted.
        closed = dataclasses.replace(formed, closed=True)
        baseline, last = events_rules.announced_baseline(closed, told)
        assert events_of(events_rules.state_events(baseline, closed, last_formed=last)) == [
            ("Closed", "rendezvous closed in round 3")
        ]

    def test_a_heartbeat_only_change_posts_nothing(self) -> None:
        later = document(round=2, complete=True, participants={A: 0, B: 1}, last_heartbeats={A: NOW, B: NOW})
        assert events_rules.state_events(VALID, later, last_formed=frozenset({A, B})) == []

    def test_an_evicted_node_gets_no_node_left(self) -> None:
        new = document(round=3, complete=True, participants={A: 0})
        found = events_rules.state_events(VALID, new, evicted=[str(B)], last_formed=frozenset({A, B}))
        assert [reason for reason, _ in events_of(found)] == ["RoundCompleted"]
        found = events_rules.state_events(VALID, new, last_formed=frozenset({A, B}))
        assert events_of(found)[0] == ("NodeLeft", "node 10.0.0.2_102_0 left: round 3 formed without it")

    def test_a_new_run_counts_everyone_as_joined_and_nobody_as_left(self) -> None:
        new = document(round=0, complete=True, participants={C: 0})
        assert events_of(events_rules.state_events(VALID, new, same_run=False, last_formed=frozenset({A, B}))) == [
            ("NodeJoined", "node 10.0.0.3_103_0 joined round 0"),
            ("RoundCompleted", "round 0 completed with 1 nodes: 10.0.0.3_103_0=0"),
        ]

    def test_round_completed_once_per_round(self) -> None:
        incomplete = document(round=2, participants={A: 0, B: 0})
        last = frozenset({A, B})
        assert [event.reason for event in events_rules.state_events(incomplete, VALID, last_formed=last)] == [
            "RoundCompleted"
        ]
        next_round = document(round=3, complete=True, participants={A: 1, B: 0})
        assert [event.reason for event in events_rules.state_events(VALID, next_round, last_formed=last)] == [
            "RoundCompleted"
        ]

    def test_closed_once(self) -> None:
        closed = document(round=2, complete=True, closed=True, participants={A: 0, B: 1})
        assert events_of(events_rules.state_events(VALID, closed, last_formed=frozenset({A, B}))) == [
            ("Closed", "rendezvous closed in round 2")
        ]
        assert events_rules.state_events(closed, closed) == []

    def test_membership_beyond_the_summarys_list_is_seen(self) -> None:
        nodes = [NodeId(f"trainer-{index:02}", 1, 0) for index in range(40)]
        new = document(round=3, complete=True, participants=dict.fromkeys(nodes[:30] + nodes[31:], 0))
        found = events_rules.state_events(VALID, new, last_formed=frozenset(nodes))
        assert events_of(found)[0] == ("NodeLeft", "node trainer-30_1_0 left: round 3 formed without it")

    def test_many_nodes_give_one_counting_event_and_a_bounded_message(self) -> None:
        nodes = [NodeId(f"trainer-{index:05}", 1, 0) for index in range(10000)]
        new = document(round=7, complete=True, participants={node: rank for rank, node in enumerate(nodes)})
        found = events_rules.state_events(None, new)
        assert [(event.reason, event.count) for event in found] == [("NodeJoined", 10000), ("RoundCompleted", 1)]
        joined, completed = found[0].message, found[1].message
        assert joined.startswith("10000 nodes joined round 7: trainer-00000_1_0, trainer-00001_1_0")
        assert joined.endswith("trainer-00015_1_0 and 9984 more")
        assert completed.startswith("round 7 completed with 10000 nodes: trainer-00000_1_0=0,")
        assert completed.endswith("trainer-00015_1_0=15 and 9984 more")
        assert len(joined) < 1024 and len(completed) < 1024  # Kopf cuts Event messages at 1024

    def test_sixteen_nodes_are_still_named_one_by_one(self) -> None:
        nodes = [NodeId(f"trainer-{index:02}", 1, 0) for index in range(events_rules.NODES_LISTED)]
        found = events_rules.state_events(None, document(complete=True, participants=dict.fromkeys(nodes, 0)))
        assert [event.count for event in found] == [1] * events_rules.NODES_LISTED + [1]


def pod(**fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "trainer-0"}, "spec": {}, "status": {"phase": "Running"}, **fields}


class TestPods:
    @pytest.mark.parametrize(
        ("body", "event_type", "gone"),
        [
            (pod(), "MODIFIED", False),
            (pod(), "DELETED", True),
            (pod(metadata={"name": "p", "deletionTimestamp": "2025-01-01T00:00:00Z"}), "MODIFIED", True),
            (pod(status={"phase": "Failed"}), None, True),
            (pod(status={"phase": "Succeeded"}), None, True),
            (pod(status={"containerStatuses": [{"state": {"terminated": {"exitCode": 1}}}]}), None, True),
            (
                pod(status={"containerStatuses": [{"state": {"terminated": {}}}, {"state": {"running": {}}}]}),
                None,
                False,
            ),
            (pod(status={"phase": "Pending", "containerStatuses": []}), None, False),
        ],
    )
    def test_pod_is_gone(self, body: dict[str, Any], event_type: str | None, gone: bool) -> None:
        assert pods_rules.pod_is_gone(body, event_type) is gone

    @pytest.mark.parametrize(
        ("body", "event_type", "why"),
        [
            (pod(), "DELETED", "is gone"),
            (pod(status={"phase": "Failed"}), None, "is Failed"),
            (pod(status={"phase": "Succeeded"}), "MODIFIED", "is Succeeded"),
            (
                pod(status={"phase": "Running", "containerStatuses": [{"state": {"terminated": {"exitCode": 143}}}]}),
                "MODIFIED",
                "has no running container (they ended; restarted, they start new agents)",
            ),
            (pod(), "MODIFIED", None),
        ],
    )
    def test_why_a_pod_is_gone_is_what_its_events_say_not_always_that_it_is_gone(
        self, body: dict[str, Any], event_type: str | None, why: str | None
    ) -> None:
        """An in-place restart ends every container of a pod that stays: its NodeEvicted must not say it is gone."""
        assert pods_rules.why_gone(body, event_type) == why

    def test_nodes_of_pod_match_by_ip_name_or_hostname_domain(self) -> None:
        nodes = [
            NodeId("10.1.0.5", 1, 0),
            NodeId("10.1.0.50", 1, 0),
            NodeId("fd00::5", 1, 0),
            NodeId("trainer-0", 2, 0),
            NodeId("trainer-0.job.ns.svc", 3, 1),
            NodeId("trainer-00", 4, 0),
            NodeId("host-a.job", 5, 0),
        ]
        body = pod(
            spec={"hostname": "host-a"},
            status={"podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]},
        )
        assert pods_rules.nodes_of_pod(body, nodes) == [
            NodeId("10.1.0.5", 1, 0),
            NodeId("fd00::5", 1, 0),
            NodeId("trainer-0", 2, 0),
            NodeId("trainer-0.job.ns.svc", 3, 1),
            NodeId("host-a.job", 5, 0),
        ]

    def test_a_pod_without_address_or_hostname_matches_only_its_name(self) -> None:
        body = {"metadata": {"name": "trainer-1"}, "spec": {"hostname": ""}, "status": {"podIP": ""}}
        assert pods_rules.nodes_of_pod(
            body, [NodeId("trainer-1", 1, 0), NodeId(".x", 1, 0), NodeId("10.0.0.1", 1, 0)]
        ) == [NodeId("trainer-1", 1, 0)]

    def test_known_nodes_include_heartbeat_only_nodes(self) -> None:
        doc = document(participants={B: 0}, wait_list=frozenset({C}), last_heartbeats={A: NOW, B: NOW})
        assert pods_rules.known_nodes(doc) == [A, B, C]
        assert pods_rules.known_nodes(None) == []


class TestEvictionAndLiveness:
    def test_with_evicted_adds_only_new_nodes(self) -> None:
        assert with_evicted({}, ["a", "b"]) == ["a", "b"]
        assert with_evicted({"evictedNodes": ["a"]}, ["a", "b"]) == ["a", "b"]
        assert with_evicted({"evictedNodes": ["a", "b"]}, ["b"]) is None
        assert with_evicted({"evictedNodes": ["a"]}, []) is None

    def test_with_evicted_keeps_the_newest_names(self) -> None:
        current = [f"n{index}" for index in range(EVICTED_NODES_KEPT)]
        result = with_evicted({"evictedNodes": current}, ["new"])
        assert result is not None and len(result) == EVICTED_NODES_KEPT
        assert result[0] == "n1" and result[-1] == "new"

    def test_live_agents_are_those_with_a_heartbeat_within_the_expiry(self) -> None:
        doc = document(
            participants={A: 0, B: 0},
            wait_list=frozenset({C}),
            last_heartbeats={
                A: NOW - timedelta(seconds=15),
                B: NOW - timedelta(seconds=15, microseconds=1),
                C: NOW + timedelta(seconds=3),  # a clock ahead of ours
                D: NOW - timedelta(seconds=1),
            },
        )
        expiry = timedelta(seconds=15)
        assert pods_rules.live_agents(doc, NOW, expiry) == [str(A), str(C), str(D)]
        assert pods_rules.live_agents(doc, NOW, timedelta(seconds=60)) == [str(A), str(B), str(C), str(D)]

    def test_a_closed_or_missing_document_has_no_live_agents(self) -> None:
        closed = document(closed=True, participants={A: 0}, last_heartbeats={A: NOW})
        assert pods_rules.live_agents(closed, NOW, timedelta(seconds=15)) == []
        assert pods_rules.live_agents(None, NOW, timedelta(seconds=15)) == []

    def test_an_evicted_nodes_folded_heartbeat_is_not_live(self) -> None:
        from kube_rendezvous._rules.intents import fold_intents

        folded = fold_intents(VALID, close=False, evicted=[str(B)])
        assert pods_rules.live_agents(folded, NOW, timedelta(seconds=15)) == [str(A)]


class TestEvictionBelongsToOneIncarnation:
    """A node is evicted for a pod's end only if it stopped heartbeating when the pod ended."""

    GONE = datetime(2026, 12, 3, 7, 0, 0, tzinfo=timezone.utc)

    def failed_pod(self) -> dict[str, Any]:
        return {
            "metadata": {"name": "trainer-1"},
            "status": {
                "phase": "Failed",
                "podIP": "10.0.0.7",
                "containerStatuses": [{"state": {"terminated": {"finishedAt": "2026-12-03T07:00:00Z"}}}],
            },
        }

    def test_the_pod_ended_when_its_containers_finished_or_when_it_was_deleted(self) -> None:
        pod = self.failed_pod()
        assert pods_rules.pod_gone_at(pod, self.GONE + timedelta(hours=1)) == self.GONE
        pod["metadata"]["deletionTimestamp"] = "2026-12-03T07:05:00Z"
        assert pods_rules.pod_gone_at(pod, self.GONE) == self.GONE + timedelta(minutes=5)
        assert pods_rules.pod_gone_at({"metadata": {}}, self.GONE) == self.GONE

    def test_a_restarted_container_dates_its_earlier_agents_end_within_the_window(self) -> None:
        pod = {
            "metadata": {"name": "trainer-1"},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"restartCount": 0, "state": {"running": {}}},
                    {
                        "restartCount": 1,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"finishedAt": "2026-12-03T07:00:00Z"}},
                    },
                ],
            },
        }
        assert not pods_rules.pod_is_gone(pod, None)
        assert restarts_rules.container_restarted_at(pod, self.GONE + timedelta(seconds=5)) == self.GONE
        late = self.GONE + restarts_rules.RESTART_EVICTION_WINDOW + timedelta(seconds=1)
        assert restarts_rules.container_restarted_at(pod, late) is None  # its node has expired by then
        never = {"status": {"containerStatuses": [{"restartCount": 0, "state": {"running": {}}}]}}
        assert restarts_rules.container_restarted_at(never, self.GONE) is None
        assert restarts_rules.container_restarted_at({"metadata": {}}, self.GONE) is None

    def test_a_live_node_that_reused_the_dead_pods_ip_is_never_evicted(self) -> None:
        dead, reused = NodeId("10.0.0.7", 1, 11), NodeId("10.0.0.7", 1, 22)
        document = RendezvousDocument(
            participants={dead: 0, reused: 0},
            last_heartbeats={dead: self.GONE - timedelta(seconds=3), reused: self.GONE + timedelta(minutes=2)},
        )
        pod = self.failed_pod()
        assert pods_rules.nodes_of_pod(pod, document.nodes()) == [dead, reused]  # the address alone matches both
        assert pods_rules.nodes_of_pod(pod, document.nodes(), document=document, gone_at=self.GONE) == [dead]

    def test_a_heartbeat_within_the_clock_slack_of_the_end_still_counts_as_the_dead_pods(self) -> None:
        node = NodeId("10.0.0.7", 1, 11)
        document = RendezvousDocument(last_heartbeats={node: self.GONE + pods_rules.HEARTBEAT_SLACK})
        assert pods_rules.nodes_of_pod(self.failed_pod(), [node], document=document, gone_at=self.GONE) == [node]


class TestRoundBroken:
    departure: ClassVar[dict[str, Any]] = {
        "round": 3,
        "time": "2025-01-02T03:04:05Z",
        "count": 1,
        "nodes": [{"node": "n_1_0", "reason": "Left"}],
    }

    def test_a_new_departure_posts_one_warning_naming_the_node_and_the_round(self) -> None:
        event = events_rules.departure_event({}, {"lastDeparture": self.departure})
        assert event == events_rules.RendezvousEvent(
            "Warning", "RoundBroken", "node n_1_0 left round 3; its other members re-rendezvous without it", 1
        )

    def test_the_same_departure_is_not_posted_twice_nor_after_a_restart(self) -> None:
        status = {"lastDeparture": self.departure}
        assert events_rules.departure_event(status, status) is None
        assert events_rules.departure_event({}, {}) is None
        first = events_rules.departure_event(None, status)
        assert first is not None
        assert events_rules.departure_event(None, status, [(first.reason, first.message)]) is None


class TestTrainingPodsCensus:
    """``writer_rules.training_pods``: the census the operator's folder completes a round by."""

    @staticmethod
    def pod(name: str, phase: str, ip: str | None = None, **extra: Any) -> dict[str, Any]:
        status: dict[str, Any] = {"phase": phase, **({"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {})}
        return {"metadata": {"name": name, **extra}, "spec": {"hostname": f"{name}-host"}, "status": status}

    def test_running_pods_are_live_pending_ones_starting_and_gone_ones_neither(self) -> None:
        pods = [
            self.pod("a", "Running", "10.0.0.1"),
            self.pod("b", "Pending"),
            self.pod("c", "Running"),  # no IP yet: still starting
            self.pod("d", "Running", "10.0.0.4", deletionTimestamp="2026-12-04T00:00:00Z"),
            self.pod("e", "Succeeded", "10.0.0.5"),
        ]
        census = writer_rules.training_pods(pods)
        assert census.starting == 2
        assert [sorted(item.addresses) for item in census.live] == [["10.0.0.1"]]
        assert census.live[0].names == frozenset({"a", "a-host"})
        assert census.live[0].ran(NodeId("a-host", 1, 0)) and census.live[0].ran(NodeId("10.0.0.1", 7, 0))
        assert pods_rules.nodes_of_pod(pods[0], [NodeId("10.0.0.1", 7, 0), NodeId("10.0.0.2", 7, 0)]) == [
            NodeId("10.0.0.1", 7, 0)
        ]


class TestNodeNotReady:
    """A Kubernetes Node NotReady past the grace: which pods' nodes the operator evicts (``not_ready_rules``)."""

    SINCE = NOW - timedelta(seconds=30)

    @staticmethod
    def node(status: str | None, since: str | None = "2025-01-02T03:03:35Z", name: str = "node-a") -> dict[str, Any]:
        conditions: list[dict[str, Any]] = [{"type": "MemoryPressure", "status": "False"}]
        if status is not None:
            ready = {"type": "Ready", "status": status, "reason": "NodeStatusUnknown"}
            conditions.append(ready if since is None else {**ready, "lastTransitionTime": since})
        return {"metadata": {"name": name}, "status": {"conditions": conditions}}

    @staticmethod
    def pod(name: str, ip: str, node: str | None = "node-a", **status: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {} if node is None else {"nodeName": node}
        return {
            "metadata": {"name": name},
            "spec": spec,
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], **status},
        }

    @pytest.mark.parametrize("status", ["False", "Unknown"])
    def test_a_node_whose_ready_condition_is_false_or_unknown_is_not_ready_since_its_transition(
        self, status: str
    ) -> None:
        assert not_ready_rules.node_not_ready_since(self.node(status)) == self.SINCE

    @pytest.mark.parametrize("status", ["True", None, "Maybe"])
    def test_a_ready_node_or_one_without_a_ready_condition_is_not_not_ready(self, status: str | None) -> None:
        assert not_ready_rules.node_not_ready_since(self.node(status)) is None
        assert not_ready_rules.node_not_ready_since({"metadata": {"name": "n"}}) is None

    @pytest.mark.parametrize("since", [None, "yesterday", ""])
    def test_a_not_ready_condition_without_a_readable_transition_counts_from_when_it_was_seen(
        self, since: str | None
    ) -> None:
        assert not_ready_rules.node_not_ready_since(self.node("Unknown", since), seen=NOW) == NOW
        assert not_ready_rules.node_not_ready_since(self.node("Unknown", since)) is None

    def test_the_wait_is_the_grace_but_never_shorter_than_a_keep_alive_past_the_slack(self) -> None:
        grace = timedelta(seconds=10)
        assert not_ready_rules.not_ready_wait(grace, 5.0) == grace  # the defaults: 5 + 2 + 1 < 10
        assert not_ready_rules.not_ready_wait(grace, 30.0) == timedelta(seconds=33)
        assert not_ready_rules.not_ready_wait(timedelta(seconds=1), 5.0) == timedelta(seconds=8)
        # The default grace is shorter than the agents' default heartbeat expiry: it acts first.
        from kube_rendezvous_operator.config import NODE_NOT_READY_SECONDS

        defaults = RendezvousTimings()
        wait = not_ready_rules.not_ready_wait(timedelta(seconds=NODE_NOT_READY_SECONDS), defaults.keep_alive_interval)
        assert wait < timedelta(seconds=defaults.heartbeat_expiry)

    def test_only_live_pods_on_a_node_not_ready_for_the_wait_are_taken(self) -> None:
        pods = [
            self.pod("a", "10.0.0.1"),
            self.pod("b", "10.0.0.2", node="node-b"),  # NotReady, but not for long enough
            self.pod("c", "10.0.0.3", node="node-c"),  # Ready
            self.pod("d", "10.0.0.4", phase="Failed"),  # gone: the pod rule's
            self.pod("e", "10.0.0.5", node=None),  # not scheduled
            self.pod("f", "10.0.0.6"),
        ]
        not_ready = {"node-a": self.SINCE, "node-b": NOW - timedelta(seconds=9)}
        found = not_ready_rules.pods_on_not_ready_nodes(pods, not_ready, NOW, timedelta(seconds=10))
        assert {node: [item["metadata"]["name"] for item in items] for node, items in found.items()} == {
            "node-a": ["a", "f"]
        }
        later = not_ready_rules.pods_on_not_ready_nodes(
            pods, not_ready, NOW + timedelta(seconds=1), timedelta(seconds=10)
        )
        assert sorted(later) == ["node-a", "node-b"]

    def test_silent_agents_are_evicted_and_an_agent_heartbeating_after_the_transition_is_spared(self) -> None:
        slack = pods_rules.HEARTBEAT_SLACK
        silent, within_slack, alive, no_beat = (NodeId(f"10.0.0.{index}", 7, 0) for index in (1, 2, 3, 4))
        doc = document(
            participants={silent: 0, within_slack: 1, alive: 2},
            wait_list=frozenset({no_beat}),
            last_heartbeats={
                silent: self.SINCE - timedelta(seconds=40),  # its machine died before the kubelet was missed
                within_slack: self.SINCE + slack,
                alive: self.SINCE + slack + timedelta(microseconds=1),  # only the kubelet failed
            },
        )
        pods = [self.pod(f"p{index}", f"10.0.0.{index}") for index in (1, 2, 3, 4)]
        evict, spared = not_ready_rules.nodes_on_not_ready_node(pods, doc, self.SINCE)
        assert evict == [silent, within_slack, no_beat]
        assert spared == [alive]

    def test_nodes_of_other_pods_are_never_taken(self) -> None:
        other = NodeId("10.0.0.9", 7, 0)
        doc = document(participants={other: 0}, last_heartbeats={other: self.SINCE - timedelta(seconds=60)})
        assert not_ready_rules.nodes_on_not_ready_node([self.pod("a", "10.0.0.1")], doc, self.SINCE) == ([], [])


class TestNodeNotReadySetting:
    """``--node-not-ready-seconds``: flag, then the chart's variable, then the default."""

    def test_the_default_and_the_environment_and_the_flag(self) -> None:
        from kube_rendezvous_operator.config import NODE_NOT_READY_SECONDS, OperatorConfig

        assert OperatorConfig.from_arguments([], {}).node_not_ready_seconds == NODE_NOT_READY_SECONDS == 10.0
        environ = {"KUBE_RENDEZVOUS_NODE_NOT_READY_SECONDS": "25"}
        assert OperatorConfig.from_arguments([], environ).node_not_ready_seconds == 25.0
        flag = ["--node-not-ready-seconds", "4.5"]
        assert OperatorConfig.from_arguments(flag, environ).node_not_ready_seconds == 4.5

    @pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
    def test_a_value_that_is_not_positive_seconds_is_refused_naming_the_flag(self, value: str) -> None:
        from kube_rendezvous_operator.config import OperatorConfig

        with pytest.raises(ValueError, match="--node-not-ready-seconds"):
            OperatorConfig.from_arguments(["--node-not-ready-seconds", value], {})
