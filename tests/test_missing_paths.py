"""Paths real clusters take that the other suites did not: a Job pod that failed and stays, a pod
deleted while the operator was down, a watch answered 410 Gone after an etcd compaction, and the
original clients of an agent across an API server restart. Real control plane, no mocks.
"""

from __future__ import annotations

import base64
import json
import pickle
import threading
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._rules.document import document_from_state
from kube_rendezvous._store.store import KubernetesStore
from kubernetes import client
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from tests.e2e.harness import Agent, ElasticJob
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import create_rendezvous, holds_for, pod_failed, rendezvous_parameters
from tests.test_operator import events, judged, read, running_operator
from tests.testenv import ControlPlane, wait_until

MakeJob = Callable[..., ElasticJob]


@pytest.fixture
def operator(control_plane: ControlPlane, namespace: str, crds: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    with running_operator(control_plane, namespace, tmp_path / "operator.log") as running:
        yield running


def create_job_pod(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    address: str,
    labels: dict[str, str] | None = None,
    owner: client.V1OwnerReference | None = None,
) -> None:
    """A Job's pod (``restartPolicy: Never``) played Running at ``address``; labelled for Rendezvous ``job``
    unless ``labels`` are given; controlled by ``owner`` when given."""
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name,
                labels=labels or {"kube-rendezvous.io/rendezvous": "job"},
                owner_references=[owner] if owner is not None else None,
            ),
            spec=client.V1PodSpec(
                restart_policy="Never",
                service_account_name="trainer",
                containers=[client.V1Container(name="agent", image="trainer:latest")],
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
    )


def suspended_job(admin_api: client.ApiClient, namespace: str) -> client.V1OwnerReference:
    """A suspended Job (it creates no pod): the controller owner of the test's pods, which exists."""
    job = client.BatchV1Api(admin_api).create_namespaced_job(
        namespace,
        client.V1Job(
            metadata=client.V1ObjectMeta(name="trainers"),
            spec=client.V1JobSpec(
                suspend=True,
                template=client.V1PodTemplateSpec(
                    spec=client.V1PodSpec(
                        restart_policy="Never", containers=[client.V1Container(name="agent", image="trainer:latest")]
                    )
                ),
            ),
        ),
    )
    assert job.metadata is not None
    return client.V1OwnerReference(
        api_version="batch/v1", kind="Job", name="trainers", uid=job.metadata.uid, controller=True
    )


def two_agents_training(
    core: client.CoreV1Api,
    namespace: str,
    objects: client.CustomObjectsApi,
    make_job: MakeJob,
    owner: client.V1OwnerReference | None = None,
) -> tuple[ElasticJob, Agent, Agent]:
    """Rendezvous ``job`` (1..2 nodes), two labelled Job pods and their agents training together.

    Heartbeats expire only after 5 s x 60 = 300 s: a survivor re-forming within the tests'
    deadlines can only come from the operator's eviction. Returns (job, victim, survivor).
    """
    create_rendezvous(objects, namespace, minNodes=1, maxNodes=2)
    addresses = ["127.0.0.31", "127.0.0.32"]
    for index, address in enumerate(addresses):
        create_job_pod(core, namespace, f"trainer-{index}", address, owner=owner)
    job = make_job(
        nnodes="1:2",
        steps=40,
        step_seconds=1.0,
        rdzv_conf={"last_call_timeout": "3", "keep_alive_max_attempt": "60"},
    )
    agents = job.start_training(addresses)
    return job, agents[1], agents[0]


class TestFailedPodIsEvicted:
    def test_a_job_pod_that_failed_and_is_not_deleted_has_its_node_evicted(
        self,
        operator: OperatorProcess,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
    ) -> None:
        core = client.CoreV1Api(admin_api)
        owner = suspended_job(admin_api, namespace)
        job, victim, survivor = two_agents_training(core, namespace, objects, make_job, owner)
        victim.kill_pod()
        pod_failed(core, namespace, victim.name)
        job.wait_training([survivor], min_step=0, what="the survivor training alone")
        assert read(objects, namespace)["status"]["evictedNodes"] == [victim.node_name]
        # Nobody deleted the pod: it is still there, Failed (a Job keeps failed pods for its backoff and logs).
        pod = core.read_namespaced_pod(victim.name, namespace)
        assert pod.status is not None and pod.metadata is not None
        assert pod.status.phase == "Failed" and pod.metadata.deletion_timestamp is None
        evicted = [message for _, reason, message in events(admin_api, namespace) if reason == "NodeEvicted"]
        assert evicted == [f"evicted {victim.node_name}: pod {victim.name} is Failed"]  # pods_rules.why_gone
        # Told on the pod too, naming the rendezvous, the agent and why.
        selector = f"involvedObject.name={victim.name},reason=NodeEvicted"
        on_pod = wait_until(
            lambda: [e.message for e in core.list_namespaced_event(namespace, field_selector=selector).items],
            30,
            "NodeEvicted on the pod",
        )
        assert len(on_pod) == 1
        assert on_pod[0].startswith(f"rendezvous {namespace}/job evicted agent {victim.node_name} of pod {victim.name}")
        assert on_pod[0].endswith(f": pod {victim.name} is Failed")
        # And on the pods' Job: the eviction and the story of the rounds (kubectl describe job).
        on_job = wait_until(
            lambda: {
                (e.reason, e.message)
                for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=trainers").items
            },
            30,
            "Events on the Job",
        )
        assert ("NodeEvicted", on_pod[0]) in on_job
        assert any(
            reason == "RoundCompleted" and message.startswith(f"rendezvous {namespace}/job: round ")
            for reason, message in on_job
        )


class TestResyncOnStart:
    def test_a_pod_deleted_while_the_operator_was_down_is_evicted_after_it_restarts(
        self,
        operator: OperatorProcess,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        make_job: MakeJob,
    ) -> None:
        core = client.CoreV1Api(admin_api)
        job, victim, survivor = two_agents_training(core, namespace, objects, make_job)
        operator.kill()
        victim.kill_pod()
        core.delete_namespaced_pod(victim.name, namespace, grace_period_seconds=0)
        wait_until(
            lambda: not core.list_namespaced_pod(namespace, field_selector=f"metadata.name={victim.name}").items,
            30,
            "the pod to be gone",
        )
        # The DELETED event happened while nobody watched: only a resync can notice the node has no pod.
        operator.start()
        job.wait_training([survivor], min_step=0, what="the survivor training alone")
        assert read(objects, namespace)["status"]["evictedNodes"] == [victim.node_name]
        evicted = [message for _, reason, message in events(admin_api, namespace) if reason == "NodeEvicted"]
        assert evicted == [f"evicted {victim.node_name}: pod gone (resync)"]
        assert operator.metric("kube_rendezvous_node_evictions_total") == 1


def etcd(control_plane: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One call to etcd's v3 JSON gateway (the control plane's etcd serves plain HTTP on loopback)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{control_plane.etcd_port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        found: dict[str, Any] = json.loads(answer.read())
    return found


def compact_etcd(control_plane: ControlPlane) -> int:
    """Compact etcd's history up to its current revision (physically); return that revision."""
    revision = int(etcd(control_plane, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    etcd(control_plane, "/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


class TestWatchGoneAfterCompaction:
    def test_a_blocking_get_whose_watch_is_compacted_away_lists_again_and_still_wakes(
        self,
        control_plane: ControlPlane,
        admin_api: client.ApiClient,
        namespace: str,
        agent_kubeconfig: Path,
    ) -> None:
        endpoint = f"{namespace}/rdzv"
        _, waiter = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
        _, writer = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
        outcome: list[bytes | BaseException] = []

        def blocking_get() -> None:
            try:
                outcome.append(waiter.get("late", timeout=150))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                outcome.append(exc)

        thread = threading.Thread(target=blocking_get)
        thread.start()
        cache = waiter._key_cache()  # the process's watch of the keys, listed when the store was made
        assert cache is not None
        wait_until(lambda: waiter.stats["shared_waits"] == 1 and cache.healthy, 10, "the get to wait")
        lists = cache.stats["lists"]
        core = client.CoreV1Api(admin_api)
        for index in range(5):  # history the watch never sees (another resource), then compacted away
            core.create_namespaced_config_map(
                namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"filler-{index}"))
            )
        compacted = compact_etcd(control_plane)
        # The restart drops the watch; resumed from its old resourceVersion, it is answered 410 Gone.
        control_plane.restart_apiserver(downtime=1)
        wait_until(lambda: cache.stats["lists"] > lists and cache.healthy, 60, "the shared watch to list again")
        writer.set("late", "after the compaction")
        thread.join(150)
        assert outcome == [b"after the compaction"], f"compacted at revision {compacted}"
        assert waiter.stats["watch_wakeups"] == 1  # woken by the new watch, after listing again


class TestOriginalClientsAcrossARestart:
    def test_a_store_and_a_backend_made_before_a_restart_keep_working_after_it(
        self, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path
    ) -> None:
        backend, store = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig))
        assert isinstance(store, KubernetesStore)
        store.set("before", "1")
        assert store.add("counter", 2) == 2
        first = _RendezvousState()
        first.round = 1
        written = backend.set_state(pickle.dumps(first))
        assert written is not None and written[2]
        token = written[1]

        control_plane.restart_apiserver(downtime=2)

        # The same objects, their connection pools and credentials: nothing made anew.
        assert store.get("before") == b"1"
        store.set("after", "2")
        assert store.get("after", timeout=10) == b"2"
        assert store.add("counter", 3) == 5
        assert store.compare_and_swap("after", "2", "3") == (True, b"2")
        second = _RendezvousState()
        second.round = 2
        answer = backend.set_state(pickle.dumps(second), token)
        assert answer is not None
        stored, new_token, has_set = answer
        assert has_set and new_token != token
        assert document_from_state(pickle.loads(stored)).round == 2
        current = backend.get_state()
        assert current is not None and current[1] == new_token


class TestResyncIsQuiet:
    def test_a_resync_with_nothing_to_evict_writes_nothing_to_the_rendezvous(
        self,
        control_plane: ControlPlane,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        crds: None,
        agent_kubeconfig: Path,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setenv("KUBE_RENDEZVOUS_RESYNC_SECONDS", "1")
        create_rendezvous(objects, namespace, minNodes=1, maxNodes=2)
        backend, _ = create_backend(rendezvous_parameters(f"{namespace}/job", agent_kubeconfig, max_nodes=2))
        state = _RendezvousState()
        for address in ("127.0.0.51", "127.0.0.52"):
            node = _NodeDesc(address, 1, 0)
            state.participants[node] = 0
            state.last_heartbeats[node] = datetime.now(timezone.utc)
        assert backend.set_state(pickle.dumps(state)) is not None
        core = client.CoreV1Api(admin_api)
        for index, address in enumerate(("127.0.0.51", "127.0.0.52")):
            create_job_pod(core, namespace, f"trainer-{index}", address)
        with running_operator(control_plane, namespace, tmp_path / "operator.log") as operator:

            def resyncs() -> float:
                return operator.metric("kube_rendezvous_operator_resyncs_total")

            wait_until(lambda: judged(read(objects, namespace)), 30, "Ready judged")
            wait_until(lambda: resyncs() >= 1, 30, "a first resync")
            version = read(objects, namespace)["metadata"]["resourceVersion"]
            before = resyncs()
            holds_for(
                lambda: read(objects, namespace)["metadata"]["resourceVersion"] == version,
                6,
                "the Rendezvous unchanged while the operator resyncs",
            )
            assert resyncs() >= before + 3
        assert "evictedNodes" not in read(objects, namespace)["status"]
