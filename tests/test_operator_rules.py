"""The pure twins the operator's rules gained when each rule became one module (issue 50): the gone-pod rule's,
the restart rule's and the TTL rule's decisions, values in and values out."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kube_rendezvous._rules.document import NodeId, RendezvousDocument
from kube_rendezvous_operator import gone_pods_rules, restarts_rules, ttl_rules

pytestmark = pytest.mark.pure

NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=timezone.utc)
DEAD, NEWER, ELSEWHERE = NodeId("10.0.0.7", 1, 11), NodeId("10.0.0.7", 1, 22), NodeId("10.0.0.8", 1, 33)


def pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "trainer-0", "uid": "uid-0"},
        "status": {"phase": "Running", "podIP": "10.0.0.7", **status},
    }


def document(beats: dict[NodeId, datetime]) -> RendezvousDocument:
    return RendezvousDocument(participants={DEAD: 0, NEWER: 1, ELSEWHERE: 2}, last_heartbeats=beats)


class TestGonePods:
    def test_the_nodes_of_a_gone_pod_are_evicted_and_a_node_alive_on_its_address_is_not(self) -> None:
        ended = NOW - timedelta(seconds=30)
        gone = pod(
            phase="Failed", containerStatuses=[{"state": {"terminated": {"finishedAt": "2026-12-07T11:59:30Z"}}}]
        )
        beats = {DEAD: ended - timedelta(seconds=5), NEWER: NOW, ELSEWHERE: ended - timedelta(seconds=5)}
        stored = document({})
        assert gone_pods_rules.nodes_of_gone_pod(gone, stored, document(beats), NOW) == ([DEAD], [NEWER])

    def test_without_the_leases_every_node_on_its_address_is_its(self) -> None:
        stored = document({})
        assert gone_pods_rules.nodes_of_gone_pod(pod(phase="Failed"), stored, None, NOW) == ([DEAD, NEWER], [])


class TestRestarts:
    def test_the_nodes_silent_since_the_restart_are_its_and_one_without_a_heartbeat_is_not(self) -> None:
        restarted = NOW - timedelta(seconds=20)
        beats = {DEAD: restarted - timedelta(seconds=10), ELSEWHERE: restarted - timedelta(seconds=10)}
        assert restarts_rules.nodes_of_restart(pod(), document({}), document(beats), restarted) == [str(DEAD)]
        later = {DEAD: restarted - timedelta(seconds=10), NEWER: NOW}
        assert restarts_rules.nodes_of_restart(pod(), document({}), document(later), restarted) == [str(DEAD)]

    def test_a_judged_restart_is_remembered_within_its_window_only(self) -> None:
        window = restarts_rules.RESTART_EVICTION_WINDOW
        judged = {"recent": NOW - window, "old": NOW - window - timedelta(seconds=1)}
        assert restarts_rules.restarts_to_remember(judged, NOW) == {"recent": NOW - window}


class TestTtl:
    def test_a_rendezvous_has_a_ttl_when_its_spec_sets_one(self) -> None:
        assert ttl_rules.has_ttl({"ttlSecondsAfterClosed": 0})
        assert not ttl_rules.has_ttl({"minNodes": 1})

    def test_the_ttl_counts_from_the_last_change_of_a_closed_rendezvous(self) -> None:
        closed = {"closed": True, "lastChangeTime": "2026-12-07T11:59:00Z"}
        assert ttl_rules.ttl_remaining(closed, 90, NOW) == 30.0
        assert ttl_rules.ttl_remaining(closed, 30, NOW) == -30.0

    @pytest.mark.parametrize(
        "status",
        [
            {"lastChangeTime": "2026-12-07T11:59:00Z"},  # not closed
            {"closed": True},  # no time
            {"closed": True, "lastChangeTime": "yesterday"},  # unreadable
        ],
    )
    def test_nothing_counts_while_it_is_open_or_its_time_cannot_be_read(self, status: dict[str, Any]) -> None:
        assert ttl_rules.ttl_remaining(status, 30, NOW) is None
