"""The lost-node rule (issue #46 items 1-2), values in and values out: which pods on a NotReady Kubernetes Node are
lost, what ``NodeLost`` tells the user (the Node, the pods, the out-of-service taint and what it does), and, opt-in,
which pods are marked Failed with ``DisruptionTarget`` and when; then its I/O twin with a recording client: one
``NodeLost`` per outage, the pods/status patch, a refused patch marks nothing. On the API server:
``tests/test_lost_nodes.py``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kube_rendezvous import ForbiddenError
from kube_rendezvous._rules.document import NodeId, RendezvousDocument
from kube_rendezvous_operator import events, lost_nodes, lost_nodes_rules
from kube_rendezvous_operator.config import OperatorConfig
from kube_rendezvous_operator.events_rules import RendezvousEvent
from kube_rendezvous_operator.memory import OperatorMemo
from kube_rendezvous_operator.nodes import NotReady
from kube_rendezvous_operator.pods_rules import HEARTBEAT_SLACK

pytestmark = pytest.mark.pure

NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=timezone.utc)
SINCE = NOW - timedelta(seconds=60)
SILENT, ALIVE = NodeId("10.0.0.1", 7, 0), NodeId("10.0.0.2", 7, 0)
TAINT = "kubectl taint nodes gpu-7 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def pod(name: str, address: str, node: str | None = "gpu-7", **extra: Any) -> dict[str, Any]:
    status = {"phase": "Running", "podIP": address, **extra.pop("status", {})}
    meta = {"name": name, "namespace": "team-a", "uid": f"uid-{name}", **extra.pop("metadata", {})}
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


def document() -> RendezvousDocument:
    beats = {SILENT: SINCE - timedelta(seconds=3), ALIVE: SINCE + HEARTBEAT_SLACK + timedelta(seconds=1)}
    return RendezvousDocument(round=1, complete=True, participants={SILENT: 0, ALIVE: 1}, last_heartbeats=beats)


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["name"] for item in pods]


class TestTheSetting:
    def test_the_spec_overrides_the_operator_default_and_failpods_false_turns_it_off(self) -> None:
        after = lost_nodes_rules.fail_pods_after
        assert after({}, None) is None  # the default: off
        assert after({}, 90) == timedelta(seconds=90)
        assert after({"lostNodes": {"failPodsAfterSeconds": 30}}, None) == timedelta(seconds=30)
        assert after({"lostNodes": {"failPodsAfterSeconds": 0}}, 90) == timedelta(0)
        assert after({"lostNodes": {"failPods": False}}, 90) is None
        assert after({"lostNodes": {"failPods": True}}, 90) == timedelta(seconds=90)
        for malformed in ("30", True, -1, None):
            assert after({"lostNodes": {"failPodsAfterSeconds": malformed}}, None) is None
        assert after({"lostNodes": "on"}, 5) == timedelta(seconds=5)

    def test_the_operator_flag_then_the_chart_variable_then_off(self) -> None:
        assert OperatorConfig.from_arguments([], {}).fail_lost_pods_after_seconds is None
        environ = {"KUBE_RENDEZVOUS_FAIL_LOST_PODS_AFTER_SECONDS": "120"}
        assert OperatorConfig.from_arguments([], environ).fail_lost_pods_after_seconds == 120.0
        flag = ["--fail-lost-pods-after-seconds", "0"]
        assert OperatorConfig.from_arguments(flag, environ).fail_lost_pods_after_seconds == 0.0

    @pytest.mark.parametrize("value", ["-1", "nan", "inf"])
    def test_a_value_that_is_not_seconds_is_refused_naming_the_flag(self, value: str) -> None:
        with pytest.raises(ValueError, match="--fail-lost-pods-after-seconds"):
            OperatorConfig.from_arguments(["--fail-lost-pods-after-seconds", value], {})

    def test_the_wait_is_never_shorter_than_a_live_agent_needs_to_show_it_is_alive(self) -> None:
        assert lost_nodes_rules.fail_wait(timedelta(seconds=120), 5.0) == timedelta(seconds=120)
        assert lost_nodes_rules.fail_wait(timedelta(0), 5.0) == timedelta(seconds=8)  # 5 + 2 slack + 1 margin


class TestWhichPods:
    def test_a_pod_whose_agent_heartbeats_after_the_transition_is_alive_and_the_others_are_lost(self) -> None:
        pods = [pod("silent", "10.0.0.1"), pod("alive", "10.0.0.2"), pod("unjoined", "10.0.0.3")]
        assert names(lost_nodes_rules.lost_pods(pods, document(), SINCE)) == ["silent", "unjoined"]

    def test_pods_are_due_after_the_wait_unless_terminal_and_terminating_ones_count(self) -> None:
        pods = [
            pod("running", "10.0.0.1"),
            pod("terminating", "10.0.0.3", metadata={"deletionTimestamp": "2026-12-07T11:59:40Z"}),
            pod("failed", "10.0.0.4", status={"phase": "Failed"}),
            pod("succeeded", "10.0.0.5", status={"phase": "Succeeded"}),
            pod("elsewhere", "10.0.0.6", node="gpu-8"),  # Ready
            pod("unbound", "10.0.0.7", node=None),
            pod("recent", "10.0.0.8", node="gpu-9"),  # NotReady, not for long enough
        ]
        not_ready = {"gpu-7": SINCE, "gpu-9": NOW - timedelta(seconds=59)}
        due = lost_nodes_rules.pods_to_fail(pods, not_ready, NOW, timedelta(seconds=60))
        assert {node: names(items) for node, items in due.items()} == {"gpu-7": ["running", "terminating"]}
        later = lost_nodes_rules.pods_to_fail(pods, not_ready, NOW + timedelta(seconds=1), timedelta(seconds=60))
        assert sorted(later) == ["gpu-7", "gpu-9"]

    def test_the_next_moment_a_node_becomes_due(self) -> None:
        not_ready = {"gpu-7": SINCE, "gpu-9": NOW - timedelta(seconds=10)}
        wait = timedelta(seconds=30)
        assert lost_nodes_rules.next_fail_at(not_ready, NOW, wait) == NOW + timedelta(seconds=20)
        assert lost_nodes_rules.next_fail_at(not_ready, NOW + timedelta(seconds=25), wait) is None
        assert lost_nodes_rules.next_fail_at(not_ready, NOW, None) is None


class TestWhatIsTold:
    def test_node_lost_names_the_node_the_pods_the_taint_and_what_it_does(self) -> None:
        event = lost_nodes_rules.node_lost_event("gpu-7", "Unknown", SINCE, [pod("b", "1"), pod("a", "2")], None)
        assert (event.type, event.reason, event.count) == ("Warning", "NodeLost", 2)
        assert event.message.startswith(
            "Kubernetes node gpu-7 is NotReady (Ready=Unknown) since 2026-12-07T11:59:00Z and the agents of pods a, b"
        )
        assert f"run `{TAINT}`" in event.message
        assert "force-deletes the pods on it and detaches their volumes, so the Job can replace them" in event.message
        assert "marks them Failed" not in event.message

    def test_with_the_option_on_it_says_when_the_operator_marks_them_failed(self) -> None:
        event = lost_nodes_rules.node_lost_event("gpu-7", "False", SINCE, [pod("a", "1")], timedelta(seconds=90))
        assert "of pod a on it" in event.message
        assert event.message.endswith(
            "The operator marks them Failed itself (DisruptionTarget) at 2026-12-07T12:00:30Z "
            "(spec.lostNodes.failPodsAfterSeconds)."
        )

    def test_lost_pods_failed_says_what_follows(self) -> None:
        event = lost_nodes_rules.pods_failed_event("gpu-7", SINCE, [pod("a", "1")])
        assert (event.type, event.reason) == ("Normal", "LostPodsFailed")
        assert event.message.startswith(
            "marked pod a on Kubernetes node gpu-7 (NotReady since 2026-12-07T11:59:00Z) Failed with condition "
            "DisruptionTarget"
        )

    def test_the_status_patch_is_phase_failed_and_a_disruption_target_condition(self) -> None:
        assert lost_nodes_rules.failed_status_patch("gpu-7", SINCE, NOW) == {
            "status": {
                "phase": "Failed",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByKubeRendezvous",
                        "message": "kube-rendezvous: Kubernetes node gpu-7 is NotReady since 2026-12-07T11:59:00Z",
                        "lastTransitionTime": "2026-12-07T12:00:00Z",
                    }
                ],
            }
        }


class RecordingApi:
    """A KubernetesApi that answers the reads the rule makes and records its writes; refuses pod patches (or only
    pod deletes) if told."""

    def __init__(self, refuse: bool = False, refuse_delete: bool = False) -> None:
        self.patches: list[tuple[str, Any, str]] = []
        self.deletes: list[tuple[str, Any]] = []
        self.refuse, self.refuse_delete = refuse, refuse_delete

    def request(self, method: str, path: str, *, body: Any = None, content_type: str = "", **_: Any) -> Any:
        if method in ("PATCH", "DELETE"):
            if self.refuse or (method == "DELETE" and self.refuse_delete):
                raise ForbiddenError(403, "Forbidden", "pods is forbidden", method, path)
            if method == "PATCH":
                self.patches.append((path, body, content_type))
            else:
                self.deletes.append((path, body))
            return {}
        if path.endswith("/events"):
            return {"items": []}
        return {"metadata": {"name": "job", "namespace": "team-a", "uid": "rdzv-uid"}}


class TestTheRuleIO:
    @pytest.fixture
    def posted(self, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
        told: list[tuple[str, str]] = []
        monkeypatch.setattr(events, "post_event", lambda body, event, *_: told.append(("rendezvous", event.reason)))

        def on_related(objects: list[dict[str, Any]], event: RendezvousEvent) -> None:
            told.extend((item["metadata"]["name"], event.reason) for item in objects)

        monkeypatch.setattr(events, "post_on_related", on_related)
        return told

    def memo(self, api: RecordingApi, after: float | None) -> OperatorMemo:
        memo = OperatorMemo(OperatorConfig(), api)  # type: ignore[arg-type]  # the recording stand-in
        memo.record(("team-a", "job")).fail_pods_after = None if after is None else timedelta(seconds=after)
        return memo

    def test_node_lost_is_told_once_per_outage_on_the_rendezvous_and_each_lost_pod(
        self, posted: list[tuple[str, str]]
    ) -> None:
        memo = self.memo(RecordingApi(), None)
        pods = [pod("silent", "10.0.0.1"), pod("alive", "10.0.0.2")]
        for _ in range(3):  # the task, then every resync
            lost_nodes.tell_node_lost(memo, ("team-a", "job"), "gpu-7", NotReady("Unknown", SINCE), pods, document())
        assert posted == [("rendezvous", "NodeLost"), ("silent", "NodeLost")]
        # A new outage of that Node (NotReady anew) is told again; both agents are silent since then.
        later = NotReady("Unknown", NOW)
        lost_nodes.tell_node_lost(memo, ("team-a", "job"), "gpu-7", later, pods, document())
        assert posted[2:] == [("rendezvous", "NodeLost"), ("silent", "NodeLost"), ("alive", "NodeLost")]

    def test_lost_pods_are_patched_failed_through_pods_status_once_due_and_live_ones_never(
        self, posted: list[tuple[str, str]]
    ) -> None:
        api = RecordingApi()
        memo = self.memo(api, 60)
        pods = [pod("silent", "10.0.0.1"), pod("alive", "10.0.0.2")]
        states = {"gpu-7": NotReady("Unknown", SINCE)}
        lost_nodes.fail_lost_pods(memo, ("team-a", "job"), pods, document(), states, NOW - timedelta(seconds=1))
        assert api.patches == [] and posted == []  # not yet: 59 s of 60
        lost_nodes.fail_lost_pods(memo, ("team-a", "job"), pods, document(), states, NOW)
        assert [(path, kind) for path, _, kind in api.patches] == [
            ("/api/v1/namespaces/team-a/pods/silent/status", "application/strategic-merge-patch+json")
        ]
        body = api.patches[0][1]
        assert body["metadata"] == {"uid": "uid-silent"}  # never a newer pod of that name
        assert body["status"]["phase"] == "Failed"
        assert body["status"]["conditions"][0]["type"] == "DisruptionTarget"
        # Then deleted at once, as the pod garbage collector does: its token dies with it (fenced).
        assert api.deletes == [
            (
                "/api/v1/namespaces/team-a/pods/silent",
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": "uid-silent"},
                },
            )
        ]
        assert posted == [("rendezvous", "LostPodsFailed"), ("silent", "LostPodsFailed")]
        assert lost_nodes.fail_due(memo, ("team-a", "job"), pods, {"gpu-7": SINCE}, NOW)[0] == ["gpu-7"]

    def test_a_pod_marked_failed_whose_delete_was_refused_is_deleted_at_the_next_judgement_not_marked_again(
        self, posted: list[tuple[str, str]]
    ) -> None:
        states = {"gpu-7": NotReady("Unknown", SINCE)}
        refusing = RecordingApi(refuse_delete=True)
        lost_nodes.fail_lost_pods(
            self.memo(refusing, 0), ("team-a", "job"), [pod("silent", "10.0.0.1")], document(), states, NOW
        )
        assert len(refusing.patches) == 1 and refusing.deletes == []
        assert posted == [("rendezvous", "LostPodsNotFailed")]
        marked = pod("silent", "10.0.0.1")
        marked["status"].update(phase="Failed", conditions=refusing.patches[0][1]["status"]["conditions"])
        api = RecordingApi()
        lost_nodes.fail_lost_pods(self.memo(api, 0), ("team-a", "job"), [marked], document(), states, NOW)
        assert api.patches == [] and [path for path, _ in api.deletes] == ["/api/v1/namespaces/team-a/pods/silent"]
        # Being deleted (or Failed by someone else): left alone.
        marked["metadata"]["deletionTimestamp"] = "2026-12-07T12:00:01Z"
        other = pod("other", "10.0.0.3")
        other["status"]["phase"] = "Failed"
        assert lost_nodes_rules.pods_to_fail([marked, other], {"gpu-7": SINCE}, NOW, timedelta(0)) == {}

    def test_off_nothing_is_patched_and_a_refused_patch_marks_nothing_and_says_why(
        self, posted: list[tuple[str, str]]
    ) -> None:
        api = RecordingApi()
        states = {"gpu-7": NotReady("Unknown", SINCE)}
        pods = [pod("silent", "10.0.0.1")]
        lost_nodes.fail_lost_pods(self.memo(api, None), ("team-a", "job"), pods, document(), states, NOW)
        assert api.patches == [] and posted == []
        assert lost_nodes.fail_due(self.memo(api, None), ("team-a", "job"), pods, {"gpu-7": SINCE}, NOW) == ([], None)
        refusing = RecordingApi(refuse=True)
        lost_nodes.fail_lost_pods(self.memo(refusing, 0), ("team-a", "job"), pods, document(), states, NOW)
        assert posted == [("rendezvous", "LostPodsNotFailed")]  # the permission named, and no LostPodsFailed

    def test_a_refusal_names_the_permission_and_both_ways_to_grant_it(self) -> None:
        event = lost_nodes_rules.refused_event("gpu-7", lost_nodes.PERMISSION)
        assert (event.type, event.reason) == ("Warning", "LostPodsNotFailed")
        assert "lost Kubernetes node gpu-7" in event.message
        assert "patch on pods/status and delete on pods" in event.message
        assert "operator.lostNodes.failPodsAfterSeconds" in event.message
        assert "docs/operator-rbac-lost-nodes.yaml" in event.message
