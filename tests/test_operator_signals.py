"""The on-call signals' pure rules (issue 48): Ready (the job can train) and Progressing (a round forms), which
state writes count, the recovery time of a broken round, and the metrics of one Rendezvous (namespace/name on
each series, the phase gauge, all dropped on deletion)."""

from __future__ import annotations

from typing import Any

import pytest
from kube_rendezvous import NodeId, RendezvousDocument
from kube_rendezvous_operator import conditions_rules, events_rules, metrics
from prometheus_client import REGISTRY

pytestmark = pytest.mark.pure

BROKEN = {"round": 3, "time": "2026-12-07T12:00:00Z", "count": 1, "nodes": [{"node": "a_1_0", "reason": "Evicted"}]}


def formed(round_number: int, at: str) -> dict[str, Any]:
    return {"round": round_number, "startTime": "2026-12-07T11:00:00Z", "formedTime": at, "nodes": 2}


VALID = conditions_rules.StateCheck(True, "StateValid", "the state is a valid state document")
SPEC = {"minNodes": 2, "maxNodes": 4}


def judged(status: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, status, reason) of Ready and Progressing for ``status``."""
    return [condition[:3] for condition in conditions_rules.job_conditions(SPEC, VALID, status, None)]


class TestJobConditions:
    @pytest.mark.parametrize(
        ("status", "ready", "progressing"),
        [
            ({}, ("False", "NoStateYet"), ("True", "WaitingForAgents")),
            (
                {"phase": "Joining", "round": 1, "participantCount": 1},
                ("False", "BelowMinNodes"),
                ("True", "RoundForming"),
            ),
            ({"phase": "LastCall", "round": 1, "participantCount": 2}, ("False", "LastCall"), ("True", "RoundForming")),
            (
                {"phase": "Complete", "round": 1, "participantCount": 2},
                ("True", "RoundComplete"),
                ("False", "RoundComplete"),
            ),
            (
                {"phase": "Complete", "round": 1, "participantCount": 3, "waitingCount": 1},
                ("True", "RoundComplete"),
                ("True", "NodesWaiting"),
            ),
            (
                {"phase": "Complete", "round": 1, "participantCount": 1, "minNodes": 2},
                ("False", "BelowMinNodes"),
                ("False", "RoundComplete"),
            ),
            (
                {"phase": "Complete", "round": 3, "participantCount": 2, "lastDeparture": {"round": 3}},
                ("False", "RoundBroken"),
                ("True", "RoundForming"),
            ),
            ({"phase": "Closed", "closed": True, "round": 4}, ("False", "Closed"), ("False", "Closed")),
        ],
    )
    def test_ready_means_the_job_can_train_and_progressing_that_a_round_forms(
        self, status: dict[str, Any], ready: tuple[str, str], progressing: tuple[str, str]
    ) -> None:
        assert judged(status) == [("Ready", *ready), ("Progressing", *progressing)]

    def test_the_agents_minimum_wins_over_the_spec(self) -> None:
        status = {"phase": "Complete", "round": 1, "participantCount": 2, "minNodes": 3}
        assert judged(status)[0] == ("Ready", "False", "BelowMinNodes")

    def test_an_invalid_state_or_spec_is_never_ready(self) -> None:
        bad = conditions_rules.StateCheck(False, "StateInvalid", "status.state round: bad")
        complete = {"phase": "Complete", "round": 1, "participantCount": 2}
        found = conditions_rules.job_conditions(SPEC, bad, complete, None)
        assert [condition[:3] for condition in found] == [
            ("Ready", "False", "StateInvalid"),
            ("Progressing", "False", "StateInvalid"),
        ]
        assert judged({**complete})[0][1] == "True"
        broken = conditions_rules.job_conditions({"minNodes": 3, "maxNodes": 1}, VALID, complete, None)
        assert broken[0][:3] == ("Ready", "False", "InvalidSpec")

    def test_messages_do_not_move_with_each_join(self) -> None:
        """A condition is written when it changes: its message names the round, not how many joined."""
        one = conditions_rules.job_conditions(
            SPEC, VALID, {"phase": "Joining", "round": 1, "participantCount": 1}, None
        )
        other = conditions_rules.job_conditions(SPEC, VALID, {"phase": "Joining", "round": 1, "waitingCount": 3}, None)
        assert one == other

    def test_the_decoded_state_wins_over_a_stale_summary(self) -> None:
        a, b = NodeId("10.0.0.1", 1, 0), NodeId("10.0.0.2", 1, 0)
        formed = RendezvousDocument(round=5, complete=True, participants={a: 0, b: 1})
        stale = {"phase": "Joining", "round": 4, "participantCount": 1}
        assert conditions_rules.job_conditions(SPEC, VALID, stale, formed)[0][:3] == ("Ready", "True", "RoundComplete")
        forming = RendezvousDocument(round=6, participants={a: 0})
        assert conditions_rules.with_document({}, forming)["phase"] == "Joining"
        assert conditions_rules.with_document({}, None) == {}


class TestStateWrites:
    def test_the_first_state_is_a_baseline_and_each_other_one_a_write(self) -> None:
        first, counted = events_rules.state_fingerprint(None, "a")
        assert not counted and first is not None
        same, counted = events_rules.state_fingerprint(first, "a")
        assert (same, counted) == (first, False)
        assert events_rules.state_fingerprint(first, "b")[1]

    def test_an_absent_state_keeps_the_last_one(self) -> None:
        first, _ = events_rules.state_fingerprint(None, "a")
        assert events_rules.state_fingerprint(first, None) == (first, False)
        assert events_rules.state_fingerprint(None, "") == (None, False)


class TestRecovery:
    def test_seconds_from_the_break_to_the_next_round_forming(self) -> None:
        before = {"lastDeparture": BROKEN, "recentRounds": [formed(3, "2026-12-07T11:50:00Z")]}
        after = dict(before, recentRounds=[formed(3, "2026-12-07T11:50:00Z"), formed(4, "2026-12-07T12:00:42Z")])
        assert events_rules.recovery_seconds(before, after) == 42.0

    def test_measured_once_and_not_for_the_rounds_after(self) -> None:
        recovered = {"lastDeparture": BROKEN, "recentRounds": [formed(4, "2026-12-07T12:00:42Z")]}
        assert events_rules.recovery_seconds(recovered, recovered) is None
        later = dict(recovered, recentRounds=[formed(4, "2026-12-07T12:00:42Z"), formed(5, "2026-12-07T12:30:00Z")])
        assert events_rules.recovery_seconds(recovered, later) is None

    def test_a_break_and_its_recovery_seen_in_one_step_count(self) -> None:
        before = {"recentRounds": [formed(3, "2026-12-07T11:50:00Z")]}
        after = {"lastDeparture": BROKEN, "recentRounds": [formed(4, "2026-12-07T12:01:00Z")]}
        assert events_rules.recovery_seconds(before, after) == 60.0

    def test_nothing_while_the_round_forms_nor_on_first_sight(self) -> None:
        forming = {"lastDeparture": BROKEN, "recentRounds": [formed(3, "2026-12-07T11:50:00Z")]}
        assert events_rules.recovery_seconds({}, forming) is None
        recovered = {"lastDeparture": BROKEN, "recentRounds": [formed(4, "2026-12-07T12:00:42Z")]}
        assert events_rules.recovery_seconds(None, recovered) is None
        assert events_rules.recovery_seconds({}, {"recentRounds": [formed(4, "2026-12-07T12:00:42Z")]}) is None


def series(namespace: str, name: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == namespace and sample.labels.get("name") == name
    }


def test_one_phase_is_1_events_name_their_rendezvous_and_every_series_goes_with_it() -> None:
    metrics.observe("team-s", "job", {"phase": "Joining", "round": 2}, state_written=False, recovery=None)
    metrics.observe("team-s", "job", {"phase": "Complete", "round": 2}, state_written=True, recovery=3.0)
    metrics.count_event("StateInvalid", "team-s", "job")
    found = series("team-s", "job")
    phases = {
        dict(labels)["phase"]: got for (sample, labels), got in found.items() if sample == "kube_rendezvous_phase"
    }
    assert phases == {"Pending": 0, "Joining": 0, "LastCall": 0, "Complete": 1, "Closed": 0}
    labels = frozenset({"namespace": "team-s", "name": "job", "reason": "StateInvalid"}.items())
    assert found[("kube_rendezvous_events_total", labels)] == 1
    assert found[("kube_rendezvous_recovery_seconds_count", frozenset({"namespace": "team-s", "name": "job"}.items()))]
    metrics.forget("team-s", "job")
    assert series("team-s", "job") == {}


def test_build_info_and_leader() -> None:
    metrics.set_leader(False)
    assert REGISTRY.get_sample_value("kube_rendezvous_operator_leader") == 0
    metrics.set_leader(True)
    assert REGISTRY.get_sample_value("kube_rendezvous_operator_leader") == 1
    assert metrics.package_version()


#: A Job's pod on Kubernetes node gpu-7 (with an owner that is not its controller).
POD: dict[str, Any] = {
    "metadata": {
        "name": "trainer-1",
        "namespace": "team-a",
        "uid": "uid-pod",
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "uid": "uid-job", "controller": True},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-a-controller", "uid": "uid-cm"},
        ],
    },
    "spec": {"nodeName": "gpu-7"},
}


class TestEvictionToldOnThePodAndItsWorkload:
    def test_the_pod_and_its_controller_are_told(self) -> None:
        told = events_rules.told_on(POD)
        assert [(item["kind"], item["metadata"]["name"], item["metadata"]["uid"]) for item in told] == [
            ("Pod", "trainer-1", "uid-pod"),
            ("Job", "llama", "uid-job"),
        ]
        assert {item["metadata"]["namespace"] for item in told} == {"team-a"}

    def test_the_event_names_the_rendezvous_the_agent_and_the_kubernetes_node(self) -> None:
        event = events_rules.pod_eviction_event("team-a", "llama", ["10.0.0.7_1_0"], POD, "pod trainer-1 is gone")
        assert (event.reason, event.count) == ("NodeEvicted", 1)
        assert event.message == (
            "rendezvous team-a/llama evicted agent 10.0.0.7_1_0 of pod trainer-1 on Kubernetes node gpu-7: "
            "pod trainer-1 is gone"
        )

    def test_an_unscheduled_pod_without_owner_is_told_alone(self) -> None:
        pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u"}}
        assert [item["kind"] for item in events_rules.told_on(pod)] == ["Pod"]
        assert " on Kubernetes node" not in events_rules.pod_eviction_event("n", "r", ["a"], pod, "gone").message


def test_the_story_of_the_rounds_is_told_on_each_workload_once() -> None:
    second = {**POD, "metadata": {**POD["metadata"], "name": "trainer-2", "uid": "uid-pod-2"}}
    alone = {"metadata": {"name": "bare", "namespace": "team-a", "uid": "uid-bare"}}
    assert [(item["kind"], item["metadata"]["name"]) for item in events_rules.workloads([POD, second, alone])] == [
        ("Job", "llama")
    ]
    completed = events_rules.RendezvousEvent("Normal", "RoundCompleted", "round 3 completed with 2 nodes: a=0, b=1")
    assert "RoundCompleted" in events_rules.WORKLOAD_REASONS and "NodeJoined" not in events_rules.WORKLOAD_REASONS
    told = events_rules.on_workload(completed, "team-a", "llama")
    assert told.message == "rendezvous team-a/llama: round 3 completed with 2 nodes: a=0, b=1"
    assert (told.type, told.reason) == ("Normal", "RoundCompleted")
