"""A busy, shared API server (issue 49, item 3): a 429 is throttling, not an outage.

API Priority and Fairness answers a request its priority level cannot queue with 429 Too Many
Requests and a ``Retry-After`` header (so does the in-flight limit of a server without it). What is
asserted:

- Pure: ``retries.retry`` and ``RetryPolicy.wait`` honour a ``Retry-After`` as a lower bound (an
  injected clock and sleep: no waiting), and give up at once when it would end past the deadline;
  ``retry_after_seconds`` reads both forms of the header; a 429 becomes a ``ThrottledError`` whose
  text says throttling, never unreachable; ``KubernetesApi`` counts it in ``stats["throttled"]`` and
  never records it as an outage (``last_outage``, which moves heartbeats forward).
- Through the fault proxy in front of the real API server: a read and a state write answered 429
  with ``Retry-After: 2`` are sent again no sooner than 2 s after the 429 (the proxy's own
  timestamps), succeed, are counted as throttled, and nothing in the log calls it an outage.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any, cast

import pytest
from kube_rendezvous import KubernetesRendezvousBackend, create_backend
from kube_rendezvous._kube.kubeapi import (
    KubernetesApi,
    ServerUnavailableError,
    ThrottledError,
    api_error,
    call_with_retries,
    describe_api_error,
    is_transient,
    retry_after_of,
)
from kube_rendezvous._rules.retries import OUTAGE_RETRY, RetryPolicy, retry, retry_after_seconds
from kube_rendezvous._store.store import KubernetesStore
from kubernetes import client as k8s_client
from urllib3 import HTTPHeaderDict

from benchmarks.busy_server import OUTAGE_WORDS
from tests.faultproxy import FaultProxy, proxy_kubeconfig
from tests.helpers import rendezvous_parameters, running_fault_proxy
from tests.test_faults import state
from tests.test_retries import FakeTime, failing, longest
from tests.testenv import ControlPlane


def throttled(retry_after: float | None = 2.0) -> ThrottledError:
    error = api_error(
        429, "TooManyRequests", "Too many requests, please try again later.", "GET", "/x", False, retry_after
    )
    assert isinstance(error, ThrottledError)
    return error


# -- the policy (pure) -----------------------------------------------------------------------


def test_a_retry_after_is_a_lower_bound_of_the_wait_never_shortened() -> None:
    policy = RetryPolicy(first_delay=0.1, max_delay=2.0, jitter_floor=0.5)
    assert policy.wait(1, at_least=3.0, uniform=longest) == 3.0  # the server's 3 s, not the policy's 0.1
    assert policy.wait(6, at_least=1.0, uniform=longest) == 2.0  # the policy's longer wait stays
    assert policy.wait(1, uniform=longest) == policy.delay(1, longest)


def test_retry_waits_out_each_retry_after_then_returns() -> None:
    fake = FakeTime()
    result = retry(
        OUTAGE_RETRY,
        failing([throttled(2.0), throttled(5.0), api_error(503, "ServiceUnavailable", "", "GET", "/x")]),
        retryable=is_transient,
        deadline=fake.now + 60,
        what="GET /x",
        wait_at_least=retry_after_of,
        clock=fake.clock,
        sleep=fake.sleep,
        uniform=longest,
    )
    assert result == "done"
    assert fake.slept == [2.0, 5.0, OUTAGE_RETRY.longest(3)]  # a 503 without Retry-After: the policy's wait


def test_a_retry_after_past_the_deadline_ends_the_call_at_once_rather_than_retry_sooner() -> None:
    fake = FakeTime()
    with pytest.raises(ThrottledError):
        retry(
            OUTAGE_RETRY,
            failing([throttled(30.0)]),
            retryable=is_transient,
            deadline=fake.now + 10,
            what="GET /x",
            wait_at_least=retry_after_of,
            clock=fake.clock,
            sleep=fake.sleep,
        )
    assert fake.slept == []


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("1", 1.0), (" 7 ", 7.0), ("0", 0.0), ("-4", 0.0), (None, None), ("", None), ("soon", None)],
)
def test_retry_after_seconds_reads_delta_seconds(header: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(header) == seconds


def test_retry_after_seconds_reads_an_http_date_from_now() -> None:
    now = datetime(2026, 12, 7, 18, 0, 0, tzinfo=timezone.utc)
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=12), usegmt=True), now) == 12.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=12), usegmt=True), now) == 0.0


# -- the error (pure) ------------------------------------------------------------------------


def test_a_429_is_a_transient_throttled_error_that_carries_its_retry_after_and_says_throttling() -> None:
    error = throttled(3.0)
    assert isinstance(error, ServerUnavailableError) and is_transient(error)
    assert error.retry_after == 3.0 and retry_after_of(error) == 3.0
    assert "throttled" in str(error) and "Retry-After 3 s" in str(error)
    message = describe_api_error(error, "get", "rendezvouses", "team-a")
    assert "throttled" in message and "apiPriority" in message
    for text in (str(error), message):
        assert not OUTAGE_WORDS.search(text), text
    assert retry_after_of(api_error(503, "ServiceUnavailable", "", "GET", "/x")) == 0.0
    assert retry_after_of(ValueError("not an API outcome")) == 0.0


class _Response:
    def __init__(self, status: int, headers: dict[str, str] | None = None, data: bytes = b"{}") -> None:
        self.status = status
        self.reason = {200: "OK", 429: "Too Many Requests", 503: "Service Unavailable"}[status]
        self.headers = HTTPHeaderDict(headers or {})
        self.data = data


class _FakeApiClient:
    """Just what ``KubernetesApi.request`` uses of a ``kubernetes.client.ApiClient``: answers from a list."""

    def __init__(self, answers: list[_Response]) -> None:
        self.answers = answers
        self.rest_client = self
        self.pool_manager = self

    def param_serialize(self, **_: Any) -> tuple[str, str, dict[str, str], None, None]:
        return "GET", "https://api.invalid/x", {}, None, None

    def request(self, *_: Any, **__: Any) -> _Response:
        return self.answers.pop(0)


def test_the_client_counts_a_429_as_throttled_and_never_as_an_outage() -> None:
    answers = [
        _Response(429, {"retry-after": "1"}),  # header names are case-insensitive
        _Response(200),
        _Response(503),
        _Response(429, {"Retry-After": "4"}),
        _Response(200),
    ]
    api = KubernetesApi(cast(k8s_client.ApiClient, _FakeApiClient(answers)))
    with pytest.raises(ThrottledError) as raised:
        api.request("GET", "/x")
    assert raised.value.retry_after == 1.0
    api.request("GET", "/x")
    assert api.last_outage is None  # a 429 between two answers: no outage
    assert api.stats["throttled"] == 1
    with pytest.raises(ServerUnavailableError):
        api.request("GET", "/x")  # a 503 starts one ...
    with pytest.raises(ThrottledError):
        api.request("GET", "/x")  # ... which a 429 does not end: the server only asked to come back later
    assert api.last_outage is None
    api.request("GET", "/x")
    assert api.last_outage is not None  # the 200 ends it
    assert api.stats["throttled"] == 2 and api.stats["requests"] == 5


# -- through the fault proxy (the real API server) -----------------------------------------------

#: The Retry-After the proxy's 429 carries (whole seconds), and the client's request and retry timeouts.
RETRY_AFTER = 2
REQUEST_TIMEOUT = 2.0
RETRY_TIMEOUT = 20.0
RENDEZVOUS_PATH = r"/rendezvouses/rdzv$"
STATUS_PATH = r"/rendezvouses/rdzv/status$"


@pytest.fixture
def proxy(control_plane: ControlPlane, tmp_path: Path) -> Iterator[FaultProxy]:
    """A fault proxy in front of the test control plane's API server, stopped (joined) afterwards."""
    with running_fault_proxy(control_plane, tmp_path / "faultproxy", seed=49) as running:
        yield running


@pytest.fixture
def proxied(
    namespace: str, agent_kubeconfig: Path, proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> tuple[KubernetesRendezvousBackend, KubernetesStore]:
    """Backend and store of an agent whose every request goes through the fault proxy (it creates the Rendezvous);
    the library's log lines from INFO up are captured."""
    caplog.set_level(logging.INFO, logger="kube_rendezvous")
    kubeconfig = proxy_kubeconfig(agent_kubeconfig, proxy.url, tmp_path / "proxied.kubeconfig")
    parameters = rendezvous_parameters(
        f"{namespace}/rdzv", kubeconfig, request_timeout=REQUEST_TIMEOUT, retry_timeout=RETRY_TIMEOUT
    )
    return create_backend(parameters)


def retried_after(proxy: FaultProxy, method: str, path: str) -> float:
    """Seconds from the proxy's one 429 on ``method`` ``path`` to the next request of the same (the retry)."""
    same = [event for event in proxy.events if event.method == method and re.search(path, event.path)]
    index = next(i for i, event in enumerate(same) if event.upstream_status == 429)
    assert index + 1 < len(same), f"no retry after the 429: {same}"
    return same[index + 1].at - same[index].at


def assert_retried_as_throttling(
    proxy: FaultProxy, backend: KubernetesRendezvousBackend, caplog: pytest.LogCaptureFixture, method: str, path: str
) -> None:
    """The one 429 the proxy injected on ``method`` ``path`` was retried no sooner than its Retry-After, counted as
    throttling, not recorded as an outage, and logged as throttling with no outage wording."""
    assert proxy.stats()["status_codes"] == {429: 1}
    assert retried_after(proxy, method, path) >= RETRY_AFTER
    # At least the injected one; the key watch may have met a real one (a new CRD's watch cache initializing).
    assert backend.api.stats["throttled"] >= 1
    assert backend.api.last_outage is None
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("kube_rendezvous")]
    assert any("throttled" in line for line in lines), lines
    assert not [line for line in lines if OUTAGE_WORDS.search(line)], lines


def test_a_read_answered_429_is_retried_after_its_retry_after_and_counted_as_throttling(
    proxied: tuple[KubernetesRendezvousBackend, KubernetesStore], proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    backend, _ = proxied
    proxy.inject("status", count=1, status=429, retry_after=RETRY_AFTER, methods={"GET"}, path=RENDEZVOUS_PATH)
    backend.get_state()  # succeeds
    assert_retried_as_throttling(proxy, backend, caplog, "GET", RENDEZVOUS_PATH)


def test_a_state_write_answered_429_is_sent_again_after_its_retry_after_without_a_read_between(
    proxied: tuple[KubernetesRendezvousBackend, KubernetesStore], proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    backend, _ = proxied
    proxy.inject("status", count=1, status=429, retry_after=RETRY_AFTER, methods={"PATCH"}, path=STATUS_PATH)
    written = backend.set_state(state(1), None)
    assert written is not None and written[2], "the write was taken"
    assert_retried_as_throttling(proxy, backend, caplog, "PATCH", STATUS_PATH)
    # A 429 is a clear answer (not executed): the retry is the same write, no read of the outcome first.
    patches = [event for event in proxy.events if event.method == "PATCH"]
    between = [event for event in proxy.events if patches[0].at < event.at < patches[1].at]
    assert not [event for event in between if event.method == "GET" and re.search(RENDEZVOUS_PATH, event.path)], between


def test_call_with_retries_gives_up_at_once_on_a_retry_after_past_its_deadline(
    proxied: tuple[KubernetesRendezvousBackend, KubernetesStore], proxy: FaultProxy
) -> None:
    backend, _ = proxied
    path = f"/apis/kube-rendezvous.io/v1alpha1/namespaces/{backend.namespace}/rendezvouses/rdzv"
    seen = len(proxy.events)
    proxy.inject("status", count=1, status=429, retry_after=30, methods={"GET"}, path=RENDEZVOUS_PATH)
    with pytest.raises(ThrottledError) as raised:
        call_with_retries(
            lambda: backend.api.request("GET", path), deadline=time.monotonic() + 5, what="GET rendezvous"
        )
    assert raised.value.retry_after == 30.0
    assert len([event for event in proxy.events[seen:] if event.path == path]) == 1  # no retry sooner than asked
