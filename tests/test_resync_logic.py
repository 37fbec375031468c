"""What the operator's resync evicts, given the pods that exist now (pure; the I/O is in test_missing_paths.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from kube_rendezvous._rules.document import NodeId, RendezvousDocument
from kube_rendezvous_operator import resync_rules

NOW = datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc)
A, B, C = NodeId("10.0.0.1", 1, 0), NodeId("10.0.0.2", 1, 0), NodeId("10.0.0.3", 1, 0)
DOCUMENT = RendezvousDocument(
    round=1,
    complete=True,
    participants={A: 0, B: 1},
    wait_list=frozenset({C}),
    last_heartbeats={A: NOW, B: NOW, C: NOW},
)


def pod(name: str, ip: str, phase: str = "Running", finished: datetime | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}
    if finished is not None:
        terminated = {"exitCode": 137, "finishedAt": finished.strftime("%Y-%m-%dT%H:%M:%SZ")}
        status["containerStatuses"] = [{"name": "agent", "state": {"terminated": terminated}}]
    return {"metadata": {"name": name}, "spec": {}, "status": status}


class TestNodesToEvictOnResync:
    def test_a_node_whose_pod_was_deleted_is_evicted_while_the_others_have_pods(self) -> None:
        pods = [pod("a", "10.0.0.1"), pod("c", "10.0.0.3")]
        assert resync_rules.nodes_to_evict_on_resync(DOCUMENT, pods, NOW) == [B]

    def test_nothing_is_evicted_when_no_node_matches_a_running_pod(self) -> None:
        # Pods not labelled, or --local-addr that is not the pod's IP, name or hostname: no node
        # is recognised by its pod, so having no pod says nothing about a node.
        assert resync_rules.nodes_to_evict_on_resync(DOCUMENT, [], NOW) == []
        assert resync_rules.nodes_to_evict_on_resync(DOCUMENT, [pod("x", "10.9.9.9")], NOW) == []

    def test_every_node_with_a_running_pod_stays(self) -> None:
        pods = [pod("a", "10.0.0.1"), pod("b", "10.0.0.2"), pod("c", "10.0.0.3")]
        assert resync_rules.nodes_to_evict_on_resync(DOCUMENT, pods, NOW) == []

    def test_a_failed_pod_that_is_still_listed_has_its_node_evicted(self) -> None:
        pods = [pod("a", "10.0.0.1"), pod("b", "10.0.0.2", "Failed", NOW), pod("c", "10.0.0.3")]
        assert resync_rules.nodes_to_evict_on_resync(DOCUMENT, pods, NOW) == [B]

    def test_a_live_node_on_an_old_failed_pods_address_is_not_taken_for_it(self) -> None:
        # The failed pod ended a minute before the node's last heartbeat: that node is another pod's.
        old = pod("old-b", "10.0.0.2", "Failed", NOW - timedelta(minutes=1))
        pods = [pod("a", "10.0.0.1"), old, pod("new-b", "10.0.0.2"), pod("c", "10.0.0.3")]
        assert resync_rules.nodes_to_evict_on_resync(DOCUMENT, pods, NOW) == []
