"""Every metric the operator advertises (docs/configuration.md, ``metrics.py``) is scraped from its ``/metrics``
after a scenario that must move it. The operator runs as its own process under its own
ServiceAccount, its requests through the fault proxy so that an error and a lost compare-and-swap
happen on purpose; the agents' states are written by a real backend.
"""

from __future__ import annotations

import pickle
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._rules.document import decode_document
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from tests.e2e.operator_process import OperatorProcess, create_training_pods
from tests.faultproxy import FaultProxy, proxy_kubeconfig
from tests.helpers import create_rendezvous, rendezvous_parameters, running_fault_proxy
from tests.test_operator import GROUP, PLURAL, VERSION, condition, judged, operator_account, read, reasons
from tests.testenv import ControlPlane, wait_until

#: Every metric of metrics.py but the placement ones (``kube_rendezvous_spare_nodes``, ``_held_nodes``,
#: ``_spare_promotions_total``: scraped on three real nodes, ``tests/test_multi_node.py``); the docs list all but
#: the Event counter.
ADVERTISED = {
    "kube_rendezvous_rounds_completed_total",
    "kube_rendezvous_node_joins_total",
    "kube_rendezvous_node_leaves_total",
    "kube_rendezvous_node_evictions_total",
    "kube_rendezvous_state_writes_total",
    "kube_rendezvous_operator_writes_total",
    "kube_rendezvous_operator_write_conflicts_total",
    "kube_rendezvous_reconcile_errors_total",
    "kube_rendezvous_participants",
    "kube_rendezvous_waiting_nodes",
    "kube_rendezvous_round",
    "kube_rendezvous_events_total",
    "kube_rendezvous_phase",
}


def scrape(operator: OperatorProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample on the operator's /metrics: (name, labels) -> value (``_created`` samples left out)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, /, **labels: str) -> float:
    """The sum of the samples of ``metric`` whose labels include ``labels`` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(found for (sample, tags), found in samples.items() if sample == metric and wanted <= tags)


@pytest.fixture
def proxy(control_plane: ControlPlane, tmp_path: Path) -> Iterator[FaultProxy]:
    with running_fault_proxy(control_plane, tmp_path / "faultproxy", seed=5) as running:
        yield running


@pytest.fixture
def operator(
    control_plane: ControlPlane,
    namespace: str,
    crds: None,
    tmp_path: Path,
    proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[OperatorProcess]:
    """The operator as in test_operator.py, but every request of its own goes through ``proxy``.

    Its resync is pushed out of the test's time (one hour), so the eviction below comes from the
    pod watch alone and its compare-and-swap races with nothing but the test's own write.
    """
    monkeypatch.setenv("KUBE_RENDEZVOUS_RESYNC_SECONDS", "3600")
    with operator_account(control_plane, namespace) as direct:
        proxied = proxy_kubeconfig(direct, proxy.url, tmp_path / "operator-proxied.kubeconfig")
        running = OperatorProcess(proxied, namespace, tmp_path / "operator.log")
        try:
            running.start()
            yield running
        finally:
            running.stop()


def rendezvous_state(round_number: int, complete: bool, participants: list[str], waiting: list[str]) -> bytes:
    """A tensorplay state (what an agent hands its backend): nodes named ``addr`` with pid 1, local id 0."""
    state = _RendezvousState()
    state.round = round_number
    state.complete = complete
    now = datetime.now(timezone.utc)
    for rank, addr in enumerate(participants):
        state.participants[_NodeDesc(addr, 1, 0)] = rank if complete else 0
        state.last_heartbeats[_NodeDesc(addr, 1, 0)] = now
    for addr in waiting:
        state.wait_list.add(_NodeDesc(addr, 1, 0))
        state.last_heartbeats[_NodeDesc(addr, 1, 0)] = now
    return pickle.dumps(state)


def test_every_advertised_metric_moves_on_the_operators_metrics_endpoint(
    operator: OperatorProcess,
    proxy: FaultProxy,
    admin_api: client.ApiClient,
    namespace: str,
    agent_kubeconfig: Path,
) -> None:
    objects, core = client.CustomObjectsApi(admin_api), client.CoreV1Api(admin_api)
    before = scrape(operator)
    assert all(value(before, name) == 0 for name in ADVERTISED), "a fresh operator counts nothing"

    # 1. The operator's first status write (Ready=Unknown) is answered 503: one reconcile error,
    #    then Kopf retries it and the writes count by kind.
    proxy.inject("status", count=1, status=503, methods={"PATCH"}, path=r"/rendezvouses/job/status$")
    create_rendezvous(objects, namespace, minNodes=1, maxNodes=3)
    wait_until(lambda: judged(read(objects, namespace)), 60, "Ready judged")

    # 2. Agents' states: round 1 completes with two nodes and one waiting; then round 2 forms with the
    #    waiting one and without 127.0.0.42 (NodeJoined and NodeLeft are posted when a round forms).
    backend, _ = create_backend(rendezvous_parameters(f"{namespace}/job", agent_kubeconfig, max_nodes=3))
    first = backend.set_state(rendezvous_state(1, True, ["127.0.0.41", "127.0.0.42"], ["127.0.0.43"]))
    assert first is not None and first[2]
    wait_until(lambda: "RoundCompleted" in reasons(admin_api, namespace), 60, "RoundCompleted")
    labels = {"namespace": namespace, "name": "job"}
    wait_until(
        lambda: value(scrape(operator), "kube_rendezvous_waiting_nodes", **labels) == 1, 30, "1 waiting node counted"
    )

    # The round formed with at least minNodes: the job can train (Ready), a node waits for the next (Progressing).
    def judged_formed() -> bool:
        found = read(objects, namespace)
        ready, progressing = condition(found, "Ready") or {}, condition(found, "Progressing") or {}
        return (ready.get("reason"), progressing.get("reason")) == ("RoundComplete", "NodesWaiting")

    wait_until(judged_formed, 30, "Ready=True (RoundComplete) and Progressing=True (NodesWaiting)")
    # That write of the operator's moved the object on: the agents' next compare-and-swap reads it first.
    current = backend.get_state()
    assert current is not None
    second = backend.set_state(rendezvous_state(2, True, ["127.0.0.41", "127.0.0.43"], []), current[1])
    assert second is not None and second[2]
    wait_until(lambda: "NodeLeft" in reasons(admin_api, namespace), 60, "NodeLeft")
    written = read(objects, namespace)["status"]["state"]

    # 3. The pod of node 127.0.0.43 is deleted. The operator's read before its eviction
    #    compare-and-swap is held by the proxy while someone else writes the object, so its
    #    first write is a real 409 from the API server; the retry evicts the node.
    create_training_pods(core, namespace, ["127.0.0.41", "127.0.0.43"])
    proxy.inject("delay", count=1, methods={"GET"}, path=r"/rendezvouses/job$", delay=3.0)
    core.delete_namespaced_pod("trainer-1", namespace, grace_period_seconds=0)
    wait_until(lambda: any(event.fault == "delay" for event in proxy.events), 30, "the operator's read before evicting")

    def patched_after_the_read() -> bool:
        """Touch the object until the operator's eviction write arrives (it can only after the held read)."""
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "job", {"metadata": {"annotations": {"example.com/touch": "x"}}}
        )
        held = next(index for index, event in enumerate(proxy.events) if event.fault == "delay")
        return any(event.method == "PATCH" and event.path.endswith("/status") for event in proxy.events[held:])

    wait_until(patched_after_the_read, 30, "the operator's eviction write", interval=0.3)
    wait_until(lambda: read(objects, namespace)["status"].get("evictedNodes") == ["127.0.0.43_1_0"], 30, "evicted")

    # The operator records the eviction as an intent, then, as the preferred writer, folds it into the state.
    def folded_out() -> bool:
        status = read(objects, namespace)["status"]
        names = {str(node) for node in decode_document(status["state"]).nodes()}
        return status["state"] != written and "127.0.0.43_1_0" not in names

    wait_until(folded_out, 30, "the evicted node folded out of the state")
    assert str(read(objects, namespace)["status"].get("lastWriter")).startswith("operator/")

    def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        found = scrape(operator)
        evicted = value(found, "kube_rendezvous_node_evictions_total")
        folded = value(found, "kube_rendezvous_state_writes_total", **labels) == 2
        return found if evicted and folded else None

    after = wait_until(counted, 30, "the eviction to be counted")
    assert value(after, "kube_rendezvous_reconcile_errors_total", handler="ready-unknown") == 1
    assert value(after, "kube_rendezvous_operator_writes_total", kind="ready-unknown") == 1
    assert value(after, "kube_rendezvous_operator_writes_total", kind="ready") == 1
    assert value(after, "kube_rendezvous_operator_writes_total", kind="evict") == 1
    assert value(after, "kube_rendezvous_operator_write_conflicts_total") == 1
    assert value(after, "kube_rendezvous_node_evictions_total", **labels) == 1
    assert value(after, "kube_rendezvous_node_joins_total", **labels) == 3
    assert value(after, "kube_rendezvous_node_leaves_total", **labels) == 1
    assert value(after, "kube_rendezvous_rounds_completed_total", **labels) == 2
    # The second state and the operator's fold of the eviction (the first state is a baseline).
    assert value(after, "kube_rendezvous_state_writes_total", **labels) == 2
    assert value(after, "kube_rendezvous_participants", **labels) == 1  # the evicted node is folded out
    assert value(after, "kube_rendezvous_waiting_nodes", **labels) == 0
    assert value(after, "kube_rendezvous_round", **labels) == 2
    assert value(after, "kube_rendezvous_events_total", reason="NodeJoined") == 3
    assert value(after, "kube_rendezvous_events_total", reason="NodeEvicted", **labels) == 1
    phase = read(objects, namespace)["status"]["phase"]
    assert value(after, "kube_rendezvous_phase", phase=phase, **labels) == 1
    assert value(after, "kube_rendezvous_phase", **labels) == 1, "one phase is 1, the others 0"
    assert value(after, "kube_rendezvous_operator_leader") == 1
    assert value(after, "kube_rendezvous_operator_build_info") == 1
    moved = {name for name in ADVERTISED if value(after, name) != 0}
    assert moved == ADVERTISED - {"kube_rendezvous_waiting_nodes"}  # it was 1 above, 0 after the leave

    # The eviction broke round 2 (status.lastDeparture); round 3 forms: the recovery time is observed once.
    assert read(objects, namespace)["status"]["lastDeparture"]["round"] == 2
    assert value(after, "kube_rendezvous_recovery_seconds_count", **labels) == 0

    def third_round() -> bool:
        """Write round 3 over the newest state (the operator's condition writes move the object on too)."""
        current = backend.get_state()
        assert current is not None
        written = backend.set_state(rendezvous_state(3, True, ["127.0.0.41"], []), current[1])
        return written is not None and written[2]

    wait_until(third_round, 30, "round 3 written", interval=0.5)
    recovered = wait_until(
        lambda: value(scrape(operator), "kube_rendezvous_recovery_seconds_count", **labels) == 1 or None,
        30,
        "the recovery to be observed",
    )
    assert recovered
    assert value(scrape(operator), "kube_rendezvous_phase", phase="Complete", **labels) == 1

    # 4. The Rendezvous is deleted: every series of it goes with its record.
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job")

    def forgotten() -> bool:
        return not any({("namespace", namespace), ("name", "job")} <= tags for _, tags in scrape(operator))

    wait_until(forgotten, 30, "the deleted Rendezvous's series to be dropped")
