"""Known bugs of issue #40, one test each, written before the fix (each docstring says what it showed).

Pure where the bug lives in this process's code (the in-memory fake or a stub API); the real control plane
where the bug is about the API server's answer.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import kopf
import pytest
from kube_rendezvous._adapters.handler import KubernetesRendezvousHandler
from kube_rendezvous._adapters.tensorplay import tensorplay_framework
from kube_rendezvous._cli import kubectl_rdzv
from kube_rendezvous._engine import native
from kube_rendezvous._engine.backend import KubernetesRendezvousBackend
from kube_rendezvous._engine.connection import Connection
from kube_rendezvous._engine.shared import release, shared
from kube_rendezvous._kube import kubeapi
from kube_rendezvous._kube.kubeapi import MERGE_PATCH as MERGE
from kube_rendezvous._kube.kubeapi import (
    RENDEZVOUS_LABEL,
    RENDEZVOUS_PLURAL,
    ApiUnavailableError,
    KubernetesApi,
    resource_path,
)
from kube_rendezvous._kube.leases import (
    ANNOTATION_NODE,
    LABEL_LEASE,
    LEASE_PLURAL,
    micro_time,
    node_lease_name,
    parse_micro_time,
)
from kube_rendezvous._kube.watchcache import WatchCache
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document
from kube_rendezvous._rules.settings import KubernetesRendezvousConfig, RendezvousTimings
from kube_rendezvous_operator import events, pods_rules
from kube_rendezvous_operator.config import OperatorConfig
from kube_rendezvous_operator.memory import Observed, OperatorMemo, stored_state
from kube_rendezvous_operator.restarts import judge_restarts
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

from tests.fakeapi import FakeKubernetesApi
from tests.helpers import create_rendezvous


def pickled_state(round_number: int) -> bytes:
    made = _RendezvousState()
    made.round = round_number
    return pickle.dumps(made)


# -- 2. a WatchCache re-list must not replace an object this process installed while the list was on its way ------


def rendezvous(version: str, seen: str) -> dict[str, Any]:
    return {"metadata": {"name": "rdzv", "resourceVersion": version}, "status": {"seen": seen}}


class ListRacedByAnInstall:
    """A stub API: its first list is answered with version 5 while this process's write (answered
    with version 6) is installed meanwhile; every later list shows version 6. Watches stay quiet
    until the cache ends them."""

    def __init__(self) -> None:
        self.cache: WatchCache | None = None
        self.lists = 0
        self.stopped = threading.Event()

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.lists += 1
        if self.lists == 1:
            assert self.cache is not None
            self.cache.install(rendezvous("6", "installed"))  # another thread's write answered meanwhile
            return {"items": [rendezvous("5", "listed")], "metadata": {"resourceVersion": "5"}}
        return {"items": [rendezvous("6", "listed")], "metadata": {"resourceVersion": "6"}}

    def watch(self, path: str, *, on_response: Any = None, **_: Any) -> Iterator[dict[str, Any]]:
        ended = threading.Event()

        class Response:
            def shutdown(self) -> None:
                ended.set()

        if on_response is not None:
            on_response(Response())
        while not (ended.is_set() or self.stopped.is_set()):
            ended.wait(0.05)
        return iter(())


@pytest.mark.pure
def test_a_relist_keeps_an_object_installed_while_the_list_was_on_its_way() -> None:
    """Before the fix: ``AssertionError: assert '5' == '6'`` (the list's older version replaced the write's answer)."""
    api = ListRacedByAnInstall()
    cache = WatchCache(api, "/apis/x/v1/namespaces/n/rendezvouses", {}, "test")  # type: ignore[arg-type]
    api.cache = cache
    cache.start()
    try:
        assert cache.wait_ready(5)
        found = cache.get("rdzv")
        assert found is not None and found["metadata"]["resourceVersion"] == "6"
        # The raced list is followed by another, sent after the install: it shows that version, and replaces it.
        assert cache.wait_for(
            lambda: api.lists >= 2 and (cache.get("rdzv") or {}).get("status", {}).get("seen") == "listed", 5
        )
        assert cache.objects()["rdzv"]["metadata"]["resourceVersion"] == "6"
    finally:
        api.stopped.set()
        cache.stop()


# -- 3. kubeconfig with ``context: null``, and a load error that names the caller's own fix -------------------------

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:1"}}
users:
- name: u
  user: {{token: abc}}
contexts:
- name: good
  context: {{cluster: c, user: u}}
- name: empty
  context: null
current-context: {current}
"""


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "config"
    path.write_text(KUBECONFIG.format(current="empty"))
    return path


@pytest.mark.pure
def test_a_context_listed_as_null_gives_no_namespace_not_an_attribute_error(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix: ``AttributeError: 'NoneType' object has no attribute 'get'`` (the kubernetes client of this
    repository refuses ``context: null`` in the loaded context first, so the listing is made to show it)."""
    kubeconfig.write_text(KUBECONFIG.format(current="good"))
    listing = ([{"name": "good", "context": None}], {"name": "good", "context": None})
    monkeypatch.setattr(kubeapi.k8s_config, "list_kube_config_contexts", lambda **_: listing)
    _, namespace = kubeapi.load_api_client(str(kubeconfig), None)
    assert namespace is None


@pytest.mark.pure
def test_a_null_current_context_is_refused_naming_the_callers_fix(kubeconfig: Path) -> None:
    """Before the fix: ``TypeError: load_api_client() got an unexpected keyword argument 'fix'``: every caller's
    message said "pass --rdzv-conf kubeconfig=PATH", the agents' option, to the operator and the plugin too."""
    with pytest.raises(ValueError, match="--rdzv-conf kubeconfig=PATH") as agent:
        kubeapi.load_api_client(str(kubeconfig), None)
    assert "context" in str(agent.value)
    with pytest.raises(ValueError) as other:
        kubeapi.load_api_client(str(kubeconfig), None, fix="pass --kubeconfig PATH")
    assert "--rdzv-conf" not in str(other.value) and "pass --kubeconfig PATH" in str(other.value)


@pytest.mark.pure
def test_the_plugin_names_its_own_options_for_a_null_context(kubeconfig: Path) -> None:
    """The plugin's message names --kubeconfig/--context, never the agents' --rdzv-conf (this one held before)."""
    with pytest.raises(kubectl_rdzv.PluginError) as failure:
        kubectl_rdzv.connect(str(kubeconfig), None)
    assert "--rdzv-conf" not in str(failure.value) and "--context" in str(failure.value)


# -- 4. parse_micro_time: aware UTC, or refused ------------------------------------------------------------------------


@pytest.mark.pure
def test_parse_micro_time_refuses_a_time_without_an_offset() -> None:
    """Before the fix: ``Failed: DID NOT RAISE <class 'ValueError'>`` (a naive datetime came back)."""
    with pytest.raises(ValueError, match="UTC offset"):
        parse_micro_time("2026-01-02T03:04:05.000006")


@pytest.mark.pure
@pytest.mark.parametrize("text", ["2026-01-02T03:04:05.000006Z", "2026-01-02T03:04:05Z", "2026-01-02T04:04:05+01:00"])
def test_parse_micro_time_returns_utc(text: str) -> None:
    parsed = parse_micro_time(text)
    assert parsed.tzinfo is not None and parsed.utcoffset() == timezone.utc.utcoffset(None)
    assert parsed.replace(microsecond=0) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert parse_micro_time(micro_time(parsed)) == parsed


# -- 1. a malformed compare-and-swap token: refused before it is sent, never an outage ------------------------------


@pytest.mark.cluster
def test_a_malformed_token_is_refused_promptly_and_is_no_outage(
    control_plane: Any, namespace: str, agent_kubeconfig: Path, objects: Any
) -> None:
    """Before the fix: the API server answered the malformed tokens with 500, which the client counted as an
    outage (``last_outage`` set, the state write retried after a back-off)."""
    create_rendezvous(objects, namespace, "rdzv", minNodes=2, maxNodes=2)
    api = KubernetesApi(kubeapi.load_api_client(str(agent_kubeconfig), None)[0])
    backend = KubernetesRendezvousBackend(
        api, namespace, "rdzv", "run-1", retry_timeout=10, conflict_backoff=0, framework=tensorplay_framework()
    )
    written = backend.set_state(pickled_state(1))
    assert written is not None and written[2] is True
    for token in ("not-a-version", "12abc", "-1", "1.5", " 5", "5 ", "0x10", "99999999999999999999999"):
        began = time.monotonic()
        answer = backend.set_state(pickled_state(2), token)
        took = time.monotonic() - began
        assert answer is not None and (answer[1], answer[2]) == (written[1], False), token
        assert took < 2, f"{token!r}: {took:.1f} s"
        assert api.last_outage is None, f"{token!r} counted as an outage"


# -- 6. the operator's restart rule: one Lease read per restart, not one per pod event ------------------------------


class CountingApi(FakeKubernetesApi):
    """The in-memory API, counting its requests by method and path."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def request(self, method: str, path: str, **options: Any) -> Any:
        self.seen.append((method, path))
        return super().request(method, path, **options)


@pytest.mark.pure
def test_a_container_restart_is_judged_with_one_lease_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Already fixed by 45cfdb2 (this guards it; ``tests/test_restart_rule.py`` is its cluster twin): every
    event of a restarted pod re-read the Leases for 5 minutes."""
    earlier, later, other = NodeId("10.9.0.5", 7, 0), NodeId("10.9.0.5", 8, 0), NodeId("10.9.0.6", 7, 0)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    finished = now - timedelta(seconds=30)
    api = CountingApi()
    namespace = "ns"
    document = RendezvousDocument(
        round=1, complete=True, participants={earlier: 0, other: 1}, wait_list=frozenset({later})
    )
    body = {
        "apiVersion": "kube-rendezvous.io/v1alpha1",
        "kind": "Rendezvous",
        "metadata": {"name": "job"},
        "spec": {"minNodes": 1, "maxNodes": 3},
    }
    api.request("POST", resource_path(RENDEZVOUS_PLURAL, namespace), body=body)
    status = {"state": encode_document(document), "runId": "run-1"}
    api.request(
        "PATCH",
        resource_path(RENDEZVOUS_PLURAL, namespace, "job", "status"),
        body={"status": status},
        content_type=MERGE,
    )
    for node, renewed in ((earlier, finished - timedelta(seconds=20)), (later, now), (other, now)):
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": node_lease_name("job", node),
                "labels": {RENDEZVOUS_LABEL: "job", LABEL_LEASE: "node"},
                "annotations": {ANNOTATION_NODE: str(node)},
            },
            "spec": {"holderIdentity": str(node), "leaseDurationSeconds": 15, "renewTime": micro_time(renewed)},
        }
        api.request("POST", resource_path(LEASE_PLURAL, namespace), body=lease)
    posted: list[str] = []
    monkeypatch.setattr(events, "post_event", lambda body, event, *_: posted.append(event.reason))
    monkeypatch.setattr(events, "post_on_related", lambda objects, event: None)  # the pod's own Event
    memo = OperatorMemo(OperatorConfig(), api)  # type: ignore[arg-type]
    key = (namespace, "job")
    stored = api.request("GET", resource_path(RENDEZVOUS_PLURAL, namespace, "job"))["status"]
    memo.record(key).observed = Observed(dict(stored), stored_state(memo, key, stored["state"]).document)
    memo.record(key).selector = pods_rules.PodSelector({RENDEZVOUS_LABEL: "job"}, "default")
    pod = kopf.Body(
        {
            "metadata": {"name": "trainer-0", "namespace": namespace, "uid": "uid-0", "labels": {}},
            "status": {
                "phase": "Running",
                "podIP": "10.9.0.5",
                "containerStatuses": [
                    {
                        "name": "agent",
                        "restartCount": 1,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"exitCode": 137, "finishedAt": micro_time(finished)[:19] + "Z"}},
                    }
                ],
            },
        }
    )
    api.seen.clear()
    for _ in range(6):  # the restarted pod's status updates: one judgement, then nothing
        judge_restarts("MODIFIED", pod, {RENDEZVOUS_LABEL: "job"}, namespace, memo)
    lease_reads = [path for method, path in api.seen if method == "GET" and path.endswith("/leases")]
    assert len(lease_reads) == 1, api.seen
    after = api.request("GET", resource_path(RENDEZVOUS_PLURAL, namespace, "job"))["status"]
    assert after["evictedNodes"] == [str(earlier)] and posted == ["NodeEvicted"]


# -- 5. the leave at exit: states its real timeout, and is quiet when there is nothing to leave ---------------------


class DownableApi(FakeKubernetesApi):
    """The in-memory API that can go away (every request and watch fails: no answer) and counts requests."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.requests = 0

    def request(self, method: str, path: str, **options: Any) -> Any:
        self.requests += 1
        if self.down:
            raise ApiUnavailableError(f"{method} {path}: ConnectionRefusedError")
        return super().request(method, path, **options)

    def watch(self, path: str, **options: Any) -> Iterator[dict[str, Any]]:
        if self.down:
            raise ApiUnavailableError(f"WATCH {path}: ConnectionRefusedError")
        return super().watch(path, **options)


@pytest.fixture
def exit_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[DownableApi]:
    monkeypatch.setattr(native, "EXIT_LEAVE_SECONDS", 1.0)
    api = DownableApi()
    body = {
        "apiVersion": "kube-rendezvous.io/v1alpha1",
        "kind": "Rendezvous",
        "metadata": {"name": "rdzv"},
        "spec": {"minNodes": 1, "maxNodes": 2},
    }
    api.request("POST", resource_path(RENDEZVOUS_PLURAL, "exit"), body=body)
    yield api
    api.down = False
    release("exit")
    api.close()


def exit_handler(api: DownableApi, pid: int) -> KubernetesRendezvousHandler:
    """A ``k8s`` handler of Rendezvous ``exit/rdzv`` on ``api`` (max nodes 1: a join forms a round at once)."""
    obj = api.request("GET", resource_path(RENDEZVOUS_PLURAL, "exit", "rdzv"))
    config = KubernetesRendezvousConfig(name="rdzv", namespace="exit", retry_timeout=5)
    connection = Connection(api, "exit", "rdzv", obj, "job-1", RendezvousTimings(last_call=0.2), config)  # type: ignore[arg-type]
    handler = KubernetesRendezvousHandler(connection, NodeId("127.0.0.1", pid, 0), 1, 1, tensorplay_framework())
    handler.next_rendezvous()  # registers the leave at exit
    return handler


def exit_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name.startswith("kube_rendezvous") and r.levelno >= logging.WARNING
    ]


@pytest.mark.pure
def test_a_failed_leave_at_exit_warns_once_with_the_real_timeout(
    exit_api: DownableApi, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the fix: the warning said "could not be reached for 5 s" (the retry timeout), not the exit's 1 s."""
    handler = exit_handler(exit_api, 1)
    exit_api.down = True
    watch = shared(exit_api, "exit", "rdzv").watch  # type: ignore[arg-type]
    watch.refresh()  # the watch fails over to GETs, as after the API server went away
    assert watch.wait_for(lambda: not watch.healthy, 10)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kube_rendezvous"):
        handler._leave_at_exit()
    warned = exit_warnings(caplog)
    assert len(warned) == 1 and "could not leave the rendezvous job-1" in warned[0], warned
    assert "for 1 s" in warned[0] and "for 5 s" not in warned[0], warned


@pytest.mark.pure
def test_a_leave_at_exit_with_nothing_to_leave_is_quiet(
    exit_api: DownableApi, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the fix: ``could not leave the rendezvous job-1: The Kubernetes API server did not take this node's
    leave request`` after 1 s, for a handler whose rendezvous this process had released (as every test's namespace
    does at its end, before the exit) and whose API server was gone; and a request for one that had left already."""
    left = exit_handler(exit_api, 1)
    left.shutdown()  # not succeeded: it leaves now
    left._shutdown_result = None  # as if the framework had left without a shutdown (its last ask was a leave)
    released = exit_handler(exit_api, 2)
    release("exit")
    exit_api.down = True
    caplog.clear()
    began, requests = time.monotonic(), exit_api.requests
    with caplog.at_level(logging.DEBUG, logger="kube_rendezvous"):
        left._leave_at_exit()
        released._leave_at_exit()
    assert exit_warnings(caplog) == []
    assert (exit_api.requests, time.monotonic() - began < 0.5) == (requests, True)


@pytest.mark.pure
def test_a_leave_at_exit_into_a_gone_namespace_is_quiet(
    exit_api: DownableApi, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix: ``could not leave the rendezvous job-1: Could not patch leases ... 404`` (a warning) when
    the node's Lease and its namespace were gone while the Rendezvous was still shown (held by a finalizer)."""
    handler = exit_handler(exit_api, 1)
    answer = exit_api.request

    def gone(method: str, path: str, **options: Any) -> Any:
        if "/leases" in path and method in ("PATCH", "POST"):
            raise kubeapi.api_error(404, "NotFound", 'namespaces "exit" not found', method, path)
        return answer(method, path, **options)

    monkeypatch.setattr(exit_api, "request", gone)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kube_rendezvous"):
        handler._leave_at_exit()
    assert exit_warnings(caplog) == []
