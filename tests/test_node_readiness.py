"""NodeReadiness on WatchCache's ``keep`` and ``refused_retry``: only NotReady Nodes kept, a refusal survived (pure).

The Nodes live in ``FakeKubernetesApi`` (which models namespaced collections only) under a namespace of
their own; ``NodesApi`` maps the cluster-scoped path onto it and can refuse it (403) as RBAC would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from kube_rendezvous._kube.kubeapi import MERGE_PATCH, api_error
from kube_rendezvous_operator import nodes
from kube_rendezvous_operator.nodes import PERMISSION, NodeReadiness, NotReady

from tests.fakeapi import FakeKubernetesApi
from tests.testenv import wait_until

T0 = "2026-01-02T03:04:05Z"
T1 = "2026-01-02T03:09:05Z"


class NodesApi:
    """The fake API with ``/api/v1/nodes`` kept under namespace ``cluster``; ``refusing`` answers 403 instead.

    A refusal also ends an open watch at its next event (as the renewal of a watch would be refused).
    """

    def __init__(self) -> None:
        self.fake = FakeKubernetesApi()
        self.refusing = False
        self.refusals = 0

    def _path(self, method: str, path: str) -> str:
        if self.refusing:
            self.refusals += 1
            message = 'nodes is forbidden: User "system:serviceaccount:ops:op" cannot list resource "nodes"'
            raise api_error(403, "Forbidden", message, method, path)
        return path.replace("/api/v1/nodes", "/api/v1/namespaces/cluster/nodes")

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.fake.request(method, self._path(method, path), **kwargs)

    def watch(
        self, path: str, *, query: dict[str, Any], timeout_seconds: int, on_response: Any = None
    ) -> Iterator[dict[str, Any]]:
        for event in self.fake.watch(self._path("WATCH", path), query=query, timeout_seconds=timeout_seconds):
            self._path("WATCH", path)
            yield event

    # -- the test's kubelet ----------------------------------------------------------------

    def put_node(
        self, name: str, status: str | None, since: str | None = T0, touched: str | None = None, **labels: str
    ) -> None:
        """Create Node ``name``, or set its Ready condition (None: no condition), labels and (``touched``)
        an annotation, a change nothing kept sees."""
        condition = {"type": "Ready", "status": status, "lastTransitionTime": since}
        body = {
            "metadata": {"name": name, "labels": labels, "annotations": {"touched": touched} if touched else {}},
            "status": {"conditions": [] if status is None else [{k: v for k, v in condition.items() if v}]},
        }
        try:
            self.fake.request("GET", f"/api/v1/namespaces/cluster/nodes/{name}")
        except Exception:  # noqa: BLE001 - not found: create it
            self.fake.request("POST", "/api/v1/namespaces/cluster/nodes", body=body)
            return
        self.fake.request("PATCH", f"/api/v1/namespaces/cluster/nodes/{name}", body=body, content_type=MERGE_PATCH)

    def delete_node(self, name: str) -> None:
        self.fake.request("DELETE", f"/api/v1/namespaces/cluster/nodes/{name}")


@pytest.fixture
def api() -> Iterator[NodesApi]:
    api = NodesApi()
    yield api
    api.fake.close()  # ends the watches


@pytest.fixture
def changes() -> list[None]:
    return []


@pytest.fixture
def readiness(api: NodesApi, changes: list[None], monkeypatch: pytest.MonkeyPatch) -> Iterator[NodeReadiness]:
    monkeypatch.setattr(nodes, "FORBIDDEN_RETRY_SECONDS", 0.2)
    readiness = NodeReadiness(api, on_change=lambda: changes.append(None))  # type: ignore[arg-type]
    yield readiness
    readiness.stop()


def at(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def events_seen(readiness: NodeReadiness) -> int:
    return readiness._cache.stats["events"]


class TestWhatIsKept:
    def test_the_cache_keeps_status_and_since_of_not_ready_nodes_only_and_carries_since(
        self, api: NodesApi, readiness: NodeReadiness
    ) -> None:
        api.put_node("ready", "True")
        api.put_node("lost", "Unknown")
        api.put_node("down", "False", since=None)  # no lastTransitionTime: since when first seen
        api.put_node("unreported", None)
        assert readiness.readable is None
        before = datetime.now(timezone.utc)
        readiness.start()
        wait_until(lambda: readiness.readable, 10, "the Nodes listed")
        found = readiness.not_ready()
        assert found["lost"] == NotReady("Unknown", at(T0))
        assert found["down"].status == "False" and before <= found["down"].since <= datetime.now(timezone.utc)
        assert sorted(found) == ["down", "lost"]
        kept = readiness._cache.objects()  # never a Node object: its facts, and NotReady's fields
        assert sorted(kept) == ["down", "lost", "ready", "unreported"]
        assert all(set(value) == {"facts", "status", "since"} for value in kept.values())
        assert kept["ready"]["status"] is None and kept["unreported"]["since"] is None
        assert readiness.facts()["lost"].ready == "Unknown" and readiness.facts()["ready"].ready == "True"

        first_seen = found["down"].since
        api.put_node("down", "Unknown", since=None, touched="yes")  # still no transition time: since carried
        wait_until(lambda: readiness.not_ready()["down"].status == "Unknown", 10, "down turned Unknown")
        assert readiness.not_ready()["down"] == NotReady("Unknown", first_seen)
        api.put_node("lost", "False", since=T1)  # a new transition: its own since
        wait_until(lambda: readiness.not_ready()["lost"] == NotReady("False", at(T1)), 10, "lost's new transition")

    def test_a_node_ready_again_deleted_or_relabelled_calls_on_change_and_a_status_only_change_does_not(
        self, api: NodesApi, readiness: NodeReadiness, changes: list[None], caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger=nodes.__name__)
        api.put_node("ready", "True")
        api.put_node("lost", "Unknown")
        api.put_node("down", "False")
        readiness.start()
        wait_until(lambda: sorted(readiness.not_ready()) == ["down", "lost"], 10, "two NotReady nodes")
        called, seen = len(changes), events_seen(readiness)

        api.put_node("ready", "True", touched="yes")  # a change the NotReady set does not see
        api.put_node("lost", "Unknown", touched="yes")
        wait_until(lambda: events_seen(readiness) == seen + 2, 10, "two events")
        assert len(changes) == called

        api.put_node("lost", "True", since=T1)
        wait_until(lambda: sorted(readiness.not_ready()) == ["down"], 10, "lost Ready again")
        assert len(changes) == called + 1
        api.delete_node("down")
        wait_until(lambda: readiness.not_ready() == {}, 10, "down deleted")
        assert len(changes) == called + 2
        api.delete_node("ready")
        wait_until(lambda: events_seen(readiness) == seen + 5, 10, "the Ready node's deletion")
        assert len(changes) == called + 3  # its facts are gone (its pods' placement with them)
        assert "Kubernetes node lost is Ready again" in caplog.text
        assert "Kubernetes node down is gone" in caplog.text
        api.put_node("lost", "True", since=T1, rack="r1")  # a label: the facts change, so on_change is called
        wait_until(lambda: readiness.facts()["lost"].labels == {"rack": "r1"}, 10, "the new label")
        assert len(changes) == called + 4

    def test_the_facts_say_what_admission_and_topology_read(self, api: NodesApi, readiness: NodeReadiness) -> None:
        api.put_node("n", "True", zone="z1")
        api.fake.request(
            "PATCH",
            "/api/v1/namespaces/cluster/nodes/n",
            body={"spec": {"unschedulable": True, "taints": [{"key": "gpu-broken", "effect": "NoExecute"}]}},
            content_type=MERGE_PATCH,
        )
        readiness.start()
        wait_until(lambda: readiness.facts().get("n") and readiness.facts()["n"].unschedulable, 10, "n cordoned")
        facts = readiness.facts()["n"]
        assert facts.labels == {"zone": "z1"} and facts.no_execute == ("gpu-broken",) and facts.ready == "True"
        assert readiness.not_ready() == {}

    def test_observe_feeds_a_node_by_hand(self, api: NodesApi, changes: list[None]) -> None:
        readiness = NodeReadiness(api)  # type: ignore[arg-type]
        node = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
        readiness.observe(node)
        since = readiness.not_ready()["n"].since
        readiness.observe(node)
        assert readiness.not_ready() == {"n": NotReady("Unknown", since)}
        readiness.observe(node, deleted=True)
        assert readiness.not_ready() == {}
        assert readiness.readable is None  # never listed


class TestRefused:
    def test_a_refusal_warns_once_naming_the_permission_empties_the_set_and_is_tried_again_until_it_ends(
        self, api: NodesApi, readiness: NodeReadiness, changes: list[None], caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger=nodes.__name__)
        api.put_node("lost", "Unknown")
        readiness.start()
        wait_until(lambda: readiness.not_ready(), 10, "the NotReady node")
        called = len(changes)

        api.refusing = True  # the ClusterRole binding removed: the open watch ends and is refused
        api.put_node("lost", "Unknown", touched="yes")
        wait_until(lambda: readiness.readable is False, 10, "the refusal seen")
        assert readiness.not_ready() == {}
        assert len(changes) > called
        wait_until(lambda: api.refusals >= 4, 10, "the Nodes tried again every FORBIDDEN_RETRY_SECONDS")
        warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert PERMISSION in warnings[0] and "may not read Kubernetes Nodes" in warnings[0]
        assert "cannot list resource" in warnings[0]  # the server's own words

        api.refusing = False  # granted again: picked up without a restart
        wait_until(lambda: readiness.readable, 10, "the Nodes read again")
        assert readiness.not_ready() == {"lost": NotReady("Unknown", at(T0))}
        api.put_node("down", "False")
        wait_until(lambda: "down" in readiness.not_ready(), 10, "the watch running again")
        recovered = [record for record in caplog.records if "may read Kubernetes Nodes now" in record.getMessage()]
        assert len(recovered) == 1
        assert [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != nodes.__name__] == []

    def test_a_refusal_from_the_start_makes_readable_false(self, api: NodesApi, readiness: NodeReadiness) -> None:
        api.refusing = True
        readiness.start()
        wait_until(lambda: readiness.readable is False, 10, "the refusal seen")
        assert readiness.not_ready() == {}
