"""The scale design on the real API server: Leases for heartbeats, one folder, reads from a watch.

Agents here are our ``k8s`` handler for tensorplay in several processes
(``benchmarks.round_worker``), as the benchmark runs them; every version of the
Rendezvous written during a round is decoded and checked by a server-side watch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous._rules.document import decode_document
from kubernetes import client, watch

from tests.helpers import REPO, create_rendezvous, holds_for
from tests.test_operator import running_operator
from tests.testenv import ControlPlane, wait_until

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


class Workers:
    """``benchmarks.round_worker`` processes: T handlers each, told to join together."""

    def __init__(self, tmp_path: Path, kubeconfig: Path, endpoint: str, nodes: int) -> None:
        self.tmp_path, self.kubeconfig, self.endpoint, self.nodes = tmp_path, kubeconfig, endpoint, nodes
        self.processes: list[tuple[subprocess.Popen[str], Path]] = []

    def start(self, threads: int, hold: float = 0.0) -> subprocess.Popen[str]:
        out = self.tmp_path / f"worker-{len(self.processes)}.json"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.round_worker",
                "--backend",
                "k8s",
                "--endpoint",
                self.endpoint,
                "--run-id",
                "none",
                "--nodes",
                str(self.nodes),
                "--threads",
                str(threads),
                "--kubeconfig",
                str(self.kubeconfig),
                "--out",
                str(out),
                "--hold",
                str(hold),
            ],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
        self.processes.append((process, out))
        return process

    def results(self, timeout: float) -> list[dict[str, Any]]:
        wait_until(lambda: all(out.exists() for _, out in self.processes), timeout, "every handler's round")
        found = []
        for _, out in self.processes:
            found.extend(json.loads(out.read_text())["results"])
        return found

    def counters(self) -> list[dict[str, int]]:
        """Each handler's backend and store counters (``store_requests``: its store's own requests)."""
        return [item for _, out in self.processes for item in json.loads(out.read_text())["backend"]]

    def stop(self) -> None:
        for process, _ in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(10)


@pytest.fixture
def workers(tmp_path: Path, agent_kubeconfig: Path, namespace: str) -> Iterator[Any]:
    made: list[Workers] = []

    def make(name: str, nodes: int) -> Workers:
        made.append(Workers(tmp_path, agent_kubeconfig, f"{namespace}/{name}", nodes))
        return made[-1]

    yield make
    for each in made:
        each.stop()


class StateRecorder:
    """Every version of one Rendezvous, from a watch: resourceVersions and decoded documents."""

    def __init__(self, admin_api: client.ApiClient, namespace: str, name: str) -> None:
        self.objects = client.CustomObjectsApi(admin_api)
        self.namespace, self.name = namespace, name
        self.versions: list[dict[str, Any]] = []
        self._stop = threading.Event()
        listed = self.objects.list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={name}"
        )
        self._version = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for event in watch.Watch().stream(
                self.objects.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                field_selector=f"metadata.name={self.name}",
                resource_version=self._version,
                timeout_seconds=1,
            ):
                self._version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] == "MODIFIED":
                    self.versions.append(event["object"])

    def stop(self) -> list[dict[str, Any]]:
        time.sleep(1)
        self._stop.set()
        self._thread.join(10)
        return self.versions


def assert_every_state_valid(versions: list[dict[str, Any]], max_nodes: int) -> None:
    """Unique ranks 0..n-1 once complete, participants <= max, no node in two roles, in every version."""
    states = [obj["status"]["state"] for obj in versions if (obj.get("status") or {}).get("state")]
    assert states, "no state was written"
    for text in states:
        document = decode_document(text, max_participants=max_nodes)  # refuses a node in two roles
        assert len(document.participants) <= max_nodes
        assert not set(document.participants) & (document.wait_list | document.redundancy_list)
        if document.complete:
            assert sorted(document.participants.values()) == list(range(len(document.participants)))


def test_a_heartbeat_never_changes_the_rendezvous(
    workers: Any, namespace: str, admin_api: client.ApiClient, agent_kubeconfig: Path
) -> None:
    create_rendezvous(client.CustomObjectsApi(admin_api), namespace, "hb", minNodes=4, maxNodes=4)
    group = workers("hb", 4)
    group.start(4, hold=30)
    results = group.results(120)
    assert sorted(item["rank"] for item in results) == [0, 1, 2, 3]
    objects = client.CustomObjectsApi(admin_api)
    before = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "hb")["metadata"][
        "resourceVersion"
    ]
    coordination = client.CoordinationV1Api(admin_api)
    selector = "kube-rendezvous.io/rendezvous=hb,kube-rendezvous.io/lease=node"

    def renew_times() -> dict[str, str]:
        leases = coordination.list_namespaced_lease(namespace, label_selector=selector).items
        return {lease.metadata.name: str(lease.spec.renew_time) for lease in leases}

    first = renew_times()
    assert len(first) == 4
    # Every node renews its own Lease (keep-alive 5 s) ...
    wait_until(
        lambda: all(renew_times()[name] != first[name] for name in first), 30, "every node's Lease to be renewed"
    )
    # ... and the shared object was not written meanwhile.
    after = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "hb")["metadata"]["resourceVersion"]
    assert after == before
    # Reads come from the process's watch: over the 30 s hold, with the launcher's monitor loop calling
    # num_nodes_waiting every 0.1 s, the 4 agents made fewer requests than one GET per agent per
    # second alone would cost (Lease renewals and the writer's election are most of what they made).
    process, out = group.processes[0]
    process.wait(90)
    during = sum(item["requests"] for item in json.loads(Path(str(out) + ".hold").read_text())["api"])
    during -= sum(item["requests"] for item in json.loads(out.read_text())["api"])
    assert during < 4 * 30, f"{during} requests in 30 s"
    # ... and the monitor loop's num_nodes_waiting was answered from the watch: about 300 calls per
    # handler in 30 s, none of them a request (the count above) and none of them a framework state.
    held = json.loads(Path(str(out) + ".hold").read_text())["backend"]
    assert all(item["waiting_answers"] > 100 for item in held), held


def test_a_round_of_32_agents_completes_with_no_operator_and_every_state_is_valid(
    workers: Any, namespace: str, admin_api: client.ApiClient
) -> None:
    create_rendezvous(client.CustomObjectsApi(admin_api), namespace, "solo", minNodes=32, maxNodes=32)
    recorder = StateRecorder(admin_api, namespace, "solo")
    group = workers("solo", 32)
    for _ in range(4):
        group.start(8)
    results = group.results(180)
    versions = recorder.stop()
    assert all("error" not in item for item in results), results
    assert sorted(item["rank"] for item in results) == list(range(32))
    assert {item["world"] for item in results} == {32}
    assert_every_state_valid(versions, 32)
    # The bootstrap address: rank 0 writes it (two keys written once: one bundle), the 31 others read it from
    # their watch.
    store_requests = sorted(item["store_requests"] for item in group.counters())
    assert store_requests[:31] == [0] * 31, store_requests
    # Every handler times its bootstrap step (benchmark column); only rank 0 starts a TCPStore.
    assert all({"server", "address", "requests", "retries"} <= set(item["bootstrap"]) for item in results), results[:2]
    assert [item["bootstrap"]["requests"] for item in results if item["rank"] == 0] == [1]
    assert all(item["bootstrap"]["server"] == 0.0 for item in results if item["rank"] != 0)
    assert [item["bootstrap"]["server"] > 0.0 for item in results if item["rank"] == 0] == [True]
    # Folded in batches: far fewer writes of the shared object than one per agent.
    assert len(versions) < 32, f"{len(versions)} writes of the shared Rendezvous for 32 joins"
    writers = {obj["status"].get("lastWriter") for obj in versions}
    assert all(str(writer).startswith("agent/") for writer in writers), writers
    # Progress for kubectl: one start time for the whole round, and the round recorded once when it formed.
    starts = {obj["status"].get("roundStartTime") for obj in versions if obj["status"].get("round") == 0}
    assert len(starts) == 1 and None not in starts, starts
    final = versions[-1]["status"]
    assert [(item["round"], item["nodes"]) for item in final["recentRounds"]] == [(0, 32)]
    assert final["recentRounds"][0]["startTime"] == starts.pop() <= final["recentRounds"][0]["formedTime"]


def test_killing_the_operator_mid_round_still_completes_the_round(
    workers: Any, namespace: str, admin_api: client.ApiClient, control_plane: ControlPlane, tmp_path: Path
) -> None:
    create_rendezvous(client.CustomObjectsApi(admin_api), namespace, "failover", minNodes=8, maxNodes=8)
    objects = client.CustomObjectsApi(admin_api)
    recorder = StateRecorder(admin_api, namespace, "failover")
    group = workers("failover", 8)
    with running_operator(control_plane, namespace, tmp_path / "operator.log") as operator:

        def folded_by_operator() -> bool:
            status = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "failover").get("status")
            return bool(status) and str(status.get("lastWriter")).startswith("operator/")

        group.start(4)
        wait_until(folded_by_operator, 60, "the operator to fold the first joins")
        operator.kill()  # SIGKILL: the writer dies holding the writer Lease
        group.start(4)
        results = group.results(120)
    versions = recorder.stop()
    assert sorted(item["rank"] for item in results) == list(range(8))
    assert_every_state_valid(versions, 8)
    assert str(versions[-1]["status"].get("lastWriter")).startswith("agent/")


def test_every_lease_of_a_rendezvous_goes_with_it(workers: Any, namespace: str, admin_api: client.ApiClient) -> None:
    # The writer Lease too: an agent elected writer (no operator here) creates it owned by the Rendezvous.
    objects = client.CustomObjectsApi(admin_api)
    create_rendezvous(objects, namespace, "gone", minNodes=2, maxNodes=2)
    group = workers("gone", 2)
    group.start(2)
    assert sorted(item["rank"] for item in group.results(120)) == [0, 1]
    leases = client.CoordinationV1Api(admin_api)

    def kinds() -> set[str]:
        listed = leases.list_namespaced_lease(namespace, label_selector="kube-rendezvous.io/rendezvous=gone")
        return {str((item.metadata.labels or {}).get("kube-rendezvous.io/lease")) for item in listed.items}

    assert kinds() == {"node", "writer"}
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gone")
    wait_until(lambda: kinds() == set(), 60, "the garbage collector to delete every Lease of the Rendezvous")


def test_a_writer_frozen_past_the_expiry_mid_round_loses_no_join_and_removes_no_renewing_node(
    workers: Any, namespace: str, admin_api: client.ApiClient, control_plane: ControlPlane, tmp_path: Path
) -> None:
    # Chaos of issue #12: the operator (the writer) is frozen (SIGSTOP) for 20 s mid-round, longer than
    # the 15 s expiry. The agents fold without it; once it resumes, it must not take the renewals it
    # has not seen yet for silence and remove live nodes.
    objects = client.CustomObjectsApi(admin_api)
    create_rendezvous(objects, namespace, "frozen", minNodes=8, maxNodes=8)
    recorder = StateRecorder(admin_api, namespace, "frozen")
    group = workers("frozen", 8)
    log = tmp_path / "operator.log"

    def status() -> dict[str, Any]:
        return objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "frozen").get("status") or {}

    with running_operator(control_plane, namespace, log) as operator:
        assert operator.process is not None
        group.start(4, hold=120)
        wait_until(lambda: str(status().get("lastWriter")).startswith("operator/"), 60, "the operator to fold")
        os.killpg(operator.process.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            group.start(4, hold=120)
            results = group.results(120)  # the round forms while the writer is frozen
            wait_until(lambda: time.monotonic() - frozen_at >= 20, 30, "20 s of freeze")
        finally:
            os.killpg(operator.process.pid, signal.SIGCONT)
        assert sorted(item["rank"] for item in results) == list(range(8))
        # Resumed: it renews its writer Lease and judges expiry again, and removes nobody.
        wait_until(lambda: "judging expiry afresh" in log.read_text(), 30, "the operator to notice its freeze")
        holds_for(
            lambda: status().get("participantCount") == 8 and not status().get("evictedNodes"),
            20,
            "all 8 live nodes in the round",
        )
        assert "removing nodes whose Lease was not renewed" not in log.read_text()
    versions = recorder.stop()
    assert_every_state_valid(versions, 8)
