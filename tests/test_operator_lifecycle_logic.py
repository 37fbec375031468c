"""A job's whole life, the operator's pure part (issue 45): when a deleted pod stopped being trusted, and
everything the operator keeps of a Rendezvous goes when it is deleted.

The same on the real API server, with the real operator process: ``test_operator_lifecycle.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kube_rendezvous._kube.kubeapi import KubernetesApi
from kube_rendezvous._rules.document import NodeId, RendezvousDocument
from kube_rendezvous._rules.placement import PlacementSpec
from kube_rendezvous_operator import conditions_rules, lifecycle, metrics, pods_rules, resync_rules
from kube_rendezvous_operator.config import OperatorConfig
from kube_rendezvous_operator.memory import Observed, OperatorMemo, RendezvousTasks
from kubernetes import client
from prometheus_client import REGISTRY

#: When the pod's deletion was requested.
REQUESTED = datetime(2026, 12, 3, 7, 0, 0, tzinfo=timezone.utc)
KEY, OTHER = ("team-a", "job"), ("team-a", "other")


def terminating_pod(grace_seconds: int) -> dict[str, Any]:
    """A training pod whose deletion was requested at ``REQUESTED`` with ``grace_seconds`` of grace."""
    deadline = REQUESTED + timedelta(seconds=grace_seconds)
    return {
        "metadata": {
            "name": "trainer-1",
            "uid": "uid-trainer-1",
            "deletionTimestamp": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "deletionGracePeriodSeconds": grace_seconds,
        },
        "status": {"phase": "Running", "podIP": "10.0.0.7"},
    }


class TestADeletedPodEndsWhenItsDeletionIsRequested:
    """``deletionTimestamp`` is the request time plus the grace period: when the kubelet must have stopped
    the pod, not when it stopped being trusted."""

    def test_its_end_is_the_deletion_timestamp_minus_its_grace_period(self) -> None:
        later = REQUESTED + timedelta(hours=1)
        assert pods_rules.pod_gone_at(terminating_pod(300), later) == REQUESTED
        assert pods_rules.pod_gone_at(terminating_pod(0), later) == REQUESTED  # force-deleted
        no_grace = terminating_pod(30)
        del no_grace["metadata"]["deletionGracePeriodSeconds"]  # not set: the timestamp itself
        assert pods_rules.pod_gone_at(no_grace, later) == REQUESTED + timedelta(seconds=30)

    def test_a_newer_pod_heartbeating_during_the_old_pods_grace_period_keeps_its_node(self) -> None:
        # The old pod's agent went silent at its deletion; its containers exited at once and a new
        # pod got its IP, whose agent heartbeats a minute later, long before the old pod's 300 s ran out.
        dead, newer = NodeId("10.0.0.7", 1, 11), NodeId("10.0.0.7", 1, 22)
        document = RendezvousDocument(
            participants={dead: 0, newer: 1},
            last_heartbeats={dead: REQUESTED - timedelta(seconds=3), newer: REQUESTED + timedelta(seconds=60)},
        )
        now = REQUESTED + timedelta(seconds=90)
        pod = terminating_pod(300)
        assert resync_rules.nodes_to_evict_on_resync(document, [pod], now) == [dead]
        gone_at = pods_rules.pod_gone_at(pod, now)
        assert pods_rules.nodes_of_pod(pod, document.nodes(), document=document, gone_at=gone_at) == [dead]


def filled_memo() -> OperatorMemo:
    """A memo holding something of ``KEY`` and of ``OTHER`` in every field of their records."""
    memo = OperatorMemo(OperatorConfig(), KubernetesApi(client.ApiClient()))
    since = REQUESTED
    for key in (KEY, OTHER):
        record = memo.record(key)
        record.state = conditions_rules.read_state(None, None)
        record.observed = Observed({}, None)
        record.state_fingerprint = 1
        record.selector = pods_rules.PodSelector({"kube-rendezvous.io/rendezvous": key[1]}, "default")
        record.pods = {"uid-1": {"metadata": {"uid": "uid-1"}}}
        record.wake_folder = lambda: None
        record.keep_alive = 5.0
        record.placement = PlacementSpec()
        record.judged_restarts["uid-1"] = since
        record.not_ready_judged.add(("node-a", since))
        record.not_ready_spared.add(("node-a", since))
        record.not_ready_wake = asyncio.Event()
        record.fail_pods_after = timedelta(seconds=60)
        record.node_lost_told.add(("node-a", since))
        record.tasks = RendezvousTasks(f"uid-{key[1]}")
    return memo


class TestTheMemoForgetsADeletedRendezvous:
    def test_the_memo_keeps_nothing_of_a_rendezvous_outside_its_record(self) -> None:
        """Every field of the memo is shared by all Rendezvous or is the records' dict: nothing of one
        Rendezvous can be kept where ``forget`` (which drops its record) would not reach."""
        memo = OperatorMemo(OperatorConfig(), KubernetesApi(client.ApiClient()))
        collections = [
            field.name for field in dataclasses.fields(memo) if isinstance(getattr(memo, field.name), (dict, set, list))
        ]
        assert collections == ["records"]
        assert [field.name for field in dataclasses.fields(memo.node_rule)] == ["readiness", "judging"]

    def test_every_field_of_a_filled_record_is_filled(self) -> None:
        """``filled_memo`` fills every field of a record (a new field must be filled there too, so the tests
        below cover it)."""
        record = filled_memo().records[KEY]
        empty = [field.name for field in dataclasses.fields(record) if getattr(record, field.name) in (None, {}, set())]
        assert empty == []

    def test_forget_removes_everything_of_that_rendezvous_and_nothing_of_the_others(self) -> None:
        memo = filled_memo()
        kept = repr(memo.records[OTHER])
        assert memo.tracked() == {KEY, OTHER}
        memo.forget(KEY)
        assert memo.tracked() == {OTHER} and list(memo.records) == [OTHER]
        for key, record in memo.records.items():
            assert key != KEY and KEY[1] not in repr(record.selector), f"{key} holds something of {KEY}"
        assert repr(memo.records[OTHER]) == kept, "forget changed the record of another Rendezvous"
        assert memo.indexed_pods() == 1 and memo.pods_of(KEY) is None and memo.get(KEY) is None


def tasks_of(memo: OperatorMemo, key: tuple[str, str]) -> RendezvousTasks:
    record = memo.get(key)
    assert record is not None and record.tasks is not None, f"{key} has no tasks"
    return record.tasks


class TestEachRendezvousHasItsTasksForItsObject:
    """``lifecycle``: tasks per Rendezvous object (uid), stopped and forgotten with it; no finalizer needed."""

    @staticmethod
    def work(started: list[str], name: str) -> lifecycle.Work:
        async def run(stopped: asyncio.Event) -> None:
            started.append(name)
            await stopped.wait()

        return run

    def test_a_deleted_objects_tasks_stop_and_a_newer_one_of_that_name_keeps_its_own(self) -> None:
        async def scenario() -> None:
            memo = filled_memo()
            started: list[str] = []
            await lifecycle.start(memo, KEY, "uid-1", {"folder": self.work(started, "folder-1")})
            await lifecycle.start(memo, KEY, "uid-1", {"folder": self.work(started, "folder-1")})  # a later event
            await asyncio.sleep(0)
            assert started == ["folder-1"]
            ((first, _),) = tasks_of(memo, KEY).tasks.values()
            # Created anew under the same name before the DELETED event of the first was handled:
            await lifecycle.start(memo, KEY, "uid-2", {"folder": self.work(started, "folder-2")})
            await asyncio.sleep(0)
            assert first.done() and started == ["folder-1", "folder-2"]
            memo.record(KEY).observed = Observed({"round": 2}, None)  # the newer object's
            await lifecycle.forget(memo, KEY, "uid-1")  # the late DELETED event of the first: nothing of the newer goes
            assert tasks_of(memo, KEY).uid == "uid-2" and memo.records[KEY].observed == Observed({"round": 2}, None)
            await lifecycle.forget(memo, KEY, "uid-2")
            assert memo.tracked() == {OTHER}

        asyncio.run(scenario())

    def test_a_task_that_fails_starts_again_and_one_that_is_done_does_not(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(lifecycle, "RESTART_SECONDS", 0.01)

        async def scenario() -> None:
            memo = filled_memo()
            runs: list[str] = []

            async def flaky(stopped: asyncio.Event) -> None:
                runs.append("flaky")
                if len(runs) == 1:
                    raise RuntimeError("the first run fails")
                await stopped.wait()

            async def once(stopped: asyncio.Event) -> None:
                runs.append("once")

            wanted: dict[str, lifecycle.Work] = {"flaky": flaky, "once": once}
            await lifecycle.start(memo, KEY, "uid-job", wanted)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if runs.count("flaky") == 2:
                    break
            await lifecycle.start(memo, KEY, "uid-job", wanted)  # a later event
            await asyncio.sleep(0.01)
            assert runs.count("flaky") == 2 and runs.count("once") == 1
            await lifecycle.stop(memo, KEY)  # its deletion started: the tasks end, the memory stays until DELETED
            assert memo.records[KEY].tasks is None and memo.records[KEY].observed is not None

        asyncio.run(scenario())

    def test_a_task_that_finds_its_object_gone_forgets_it_without_waiting_for_itself(self) -> None:
        """The folder's watch shows the object gone when its DELETED event was missed (a long watch gap)."""

        async def scenario() -> None:
            memo = filled_memo()

            async def finds_it_gone(stopped: asyncio.Event) -> None:
                await lifecycle.forget(memo, KEY, "uid-job")

            wanted = {"folder": finds_it_gone, "resync": self.work([], "resync")}
            await lifecycle.start(memo, KEY, "uid-job", wanted)
            await asyncio.wait_for(asyncio.gather(*(task for task, _ in tasks_of(memo, KEY).tasks.values())), 2)
            assert memo.tracked() == {OTHER}

        asyncio.run(scenario())


def test_the_metrics_of_a_deleted_rendezvous_are_dropped() -> None:
    status = {"participantCount": 2, "waitingCount": 1, "round": 3, "spareCount": 1, "heldCount": 1, "state": "a"}
    metrics.observe("team-z", "gone", status, state_written=False, recovery=None)
    metrics.observe("team-z", "gone", dict(status, state="b", phase="Joining"), state_written=True, recovery=12.0)
    for reason in ("RoundCompleted", "NodeJoined", "NodeLeft", "SparePromoted", "StateInvalid"):
        metrics.count_event(reason, "team-z", "gone")
    metrics.EVICTIONS.labels(namespace="team-z", name="gone").inc()
    metrics.forget("team-z", "gone")
    left = [
        sample.name
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == "team-z" and sample.labels.get("name") == "gone"
    ]
    assert left == []
