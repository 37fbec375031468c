"""A thin JSON client for the few Kubernetes API calls the backend and the store make.

It reuses the official ``kubernetes`` client for what that does well (kubeconfig and
in-cluster credentials, token refresh, TLS, connection pooling) and skips its model layer,
which costs more CPU per call than the rendezvous can afford at hundreds of agents.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeGuard, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from .._rules.counters import Counters
from .._rules.retries import OUTAGE_RETRY, retry, retry_after_seconds

logger = logging.getLogger(__name__)

GROUP = "kube-rendezvous.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
RENDEZVOUS_PLURAL = "rendezvouses"
#: Seconds after an outage during which a 401/403 counts as the restarted server's unsynced RBAC.
RBAC_SYNC_SECONDS = 60
#: TCP keepalive of every connection to the API server: an idle connection is probed after
#: ``KEEPALIVE_IDLE_SECONDS`` and dropped after ``KEEPALIVE_PROBES`` unanswered probes
#: ``KEEPALIVE_INTERVAL_SECONDS`` apart (11 s in all), so a watch on a connection that went silent
#: (a NAT or load balancer dropped its state: no bytes, no RST) fails and is listed again.
KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 2
KEEPALIVE_PROBES = 3
#: Milliseconds data sent on a connection may stay unacknowledged before the kernel drops it
#: (``TCP_USER_TIMEOUT``): a request sent into a silent connection fails within this.
UNACKNOWLEDGED_MILLISECONDS = 10_000
KEY_PLURAL = "rendezvouskeys"
#: Connections kept per API server: a store's sets in flight (``store.SETS_IN_FLIGHT``) plus the watches and
#: Lease renewals of the process's agents. The client's default (5 per core) is 10 on 2 cores.
POOL_CONNECTIONS = 32
#: The content type of a JSON merge patch (RFC 7386).
MERGE_PATCH = "application/merge-patch+json"
#: The label that names the Rendezvous an object belongs to: its Leases, its store keys, and
#: optionally its training pods (always honoured besides ``spec.podSelector``).
RENDEZVOUS_LABEL = "kube-rendezvous.io/rendezvous"
#: The label on every store key of one incarnation of a Rendezvous: its UID.
RENDEZVOUS_UID_LABEL = "kube-rendezvous.io/rendezvous-uid"


T = TypeVar("T")


class KubernetesApiError(Exception):
    """Raised when a Kubernetes API call did not succeed: the server refused it (``ApiError``) or never answered it
    (``ApiUnavailableError``). Catch this for "any API outcome but success"; catch a subclass to tell them apart.
    """

    #: True when a retry may succeed (``call_with_retries`` retries exactly these).
    transient: bool = False


class ApiError(KubernetesApiError):
    """Raised when the API server answered with a non-2xx status; the subclass says which outcome.

    Callers catch the subclasses; ``status`` is kept for messages only.
    """

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        method: str,
        path: str,
        transient: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(self._describe(status, reason, message, method, path, retry_after))
        #: True when a retry may succeed: throttling, an unready server, or a 401/403 from a
        #: server that accepted these credentials before (a restarted API server answers 403
        #: until its RBAC caches have synced).
        self.transient = transient
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        self.path = path
        #: Seconds the answer's ``Retry-After`` header asked the client to wait before it tries again
        #: (a 429, a 503), None without one. Every retry honours it as a lower bound (``retry_after_of``).
        self.retry_after = retry_after

    @staticmethod
    def _describe(status: int, reason: str, message: str, method: str, path: str, retry_after: float | None) -> str:
        return f"{method} {path}: {status} {reason}: {message}"


class ConflictError(ApiError):
    """Raised when a precondition failed (409): a stale resourceVersion, or the name exists already."""


class NotFoundError(ApiError):
    """Raised when the object, or the resource type itself (CRD not installed), does not exist (404)."""


class GoneError(ApiError):
    """Raised when a watch's resourceVersion is too old to resume from (410); list again."""


class ForbiddenError(ApiError):
    """Raised when the credentials were refused (401) or lack the permission (403)."""


class InvalidError(ApiError):
    """Raised when the request was malformed or failed validation (400, 422); repeating it cannot help."""


class ServerUnavailableError(ApiError):
    """Raised when the server was not ready (5xx), or throttled (429: the subclass ``ThrottledError``); a retry may
    succeed (always transient)."""


class ThrottledError(ServerUnavailableError):
    """Raised when the API server throttled the request (429 Too Many Requests): API Priority and Fairness
    rejected it (its priority level's queues were full), the server was at its in-flight limit, or the watch
    cache of the resource was still initializing (a CRD just created, a server just started).

    The server is up and answered: a 429 is never an outage (``KubernetesApi.last_outage``). It was not
    executed, and ``retry_after`` says when to try again; ``KubernetesApi.stats["throttled"]`` counts them.
    """

    @staticmethod
    def _describe(status: int, reason: str, message: str, method: str, path: str, retry_after: float | None) -> str:
        after = "" if retry_after is None else f"; Retry-After {retry_after:g} s"
        return f"{method} {path}: throttled by the API server ({status} {reason}{after}): {message}"


class ApiUnavailableError(KubernetesApiError):
    """Raised when the API server could not be reached or did not answer in time (outcome unknown)."""

    transient = True  # the server may answer the next try


_ERROR_CLASSES: dict[int, type[ApiError]] = {
    400: InvalidError,
    401: ForbiddenError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    422: InvalidError,
    429: ThrottledError,
}


def api_error(
    status: int,
    reason: str,
    message: str,
    method: str,
    path: str,
    transient: bool = False,
    retry_after: float | None = None,
) -> ApiError:
    """Return the exception for an answer with ``status``: the one place a status becomes a type.

    ``retry_after``: the seconds of the answer's ``Retry-After`` header (``retries.retry_after_seconds``).
    """
    cls = _ERROR_CLASSES.get(status) or (ServerUnavailableError if status >= 500 else ApiError)
    return cls(status, reason, message, method, path, transient or issubclass(cls, ServerUnavailableError), retry_after)


def retry_after_of(exc: BaseException) -> float:
    """The seconds ``exc``'s answer asked a retry to wait at least (its ``Retry-After``), 0 when none."""
    return (exc.retry_after or 0.0) if isinstance(exc, ApiError) else 0.0


def is_gone(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the object or its namespace is gone (404), or the namespace is being deleted."""
    return isinstance(exc, NotFoundError) or (
        isinstance(exc, ForbiddenError) and "because it is being terminated" in exc.message
    )


def describe_api_error(exc: ApiError, verb: str, resource: str, namespace: str) -> str:
    """Return a message for a failed call; for a refusal it names the permission to grant."""
    if isinstance(exc, ForbiddenError) and exc.status == 401:
        return (
            f"The API server did not accept this process's credentials (401) on {verb} {resource}: "
            f"{exc.message}. Check the service-account token or the kubeconfig."
        )
    if isinstance(exc, ThrottledError):
        return (
            f"The API server throttled {verb} {resource} in namespace {namespace!r} (429 Too Many Requests) until "
            f"the retries ran out: it is up but busy, and API Priority and Fairness queues these credentials' "
            f"requests behind other tenants'. Give the training ServiceAccounts a priority level of their own "
            f"(the chart's apiPriority.enabled; docs/configuration.md). {exc}"
        )
    if isinstance(exc, ForbiddenError):
        group = "coordination.k8s.io" if resource.startswith("leases") else GROUP
        return (
            f"The API server refused to {verb} {resource} in namespace {namespace!r} (403 Forbidden): "
            f"{exc.message}. Grant the training pods' ServiceAccount the kube-rendezvous agent Role "
            f"(verb {verb!r} on {resource!r} in API group {group!r}); see docs/rbac.yaml."
        )
    return f"Could not {verb} {resource} in namespace {namespace!r}: {exc}"


def is_resource_version(token: object) -> TypeGuard[str]:
    """Whether ``token`` has the shape of a resourceVersion this project's API servers issue: a decimal
    unsigned 64-bit number (etcd's revision). A shape check, never an order.

    The API server answers a precondition on any other resourceVersion with 500 (it fails to parse it),
    an answer that reads as an outage; such a token is refused before it is sent instead.
    """
    return (
        isinstance(token, str) and 0 < len(token) <= 20 and token.isascii() and token.isdigit() and int(token) < 2**64
    )


def resource_path(plural: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    """Return the URL path of a kube-rendezvous.io resource, or of Leases (collection when ``name`` is None)."""
    group_version = "coordination.k8s.io/v1" if plural == "leases" else f"{GROUP}/{VERSION}"
    path = f"/apis/{group_version}/namespaces/{quote(namespace, safe='')}/{plural}"
    if name is not None:
        path += "/" + quote(name, safe="")
    if subresource is not None:
        path += "/" + subresource
    return path


def _permission(method: str, path: str) -> tuple[str, str, str]:
    """Return (verb, resource, subresource) of a request path, ignoring namespace and name."""
    parts = path.split("?")[0].strip("/").split("/")
    tail = parts[parts.index("namespaces") + 2 :] if "namespaces" in parts else parts[-1:]
    resource = tail[0] if tail else ""
    subresource = tail[2] if len(tail) > 2 else ""
    verb = method if len(tail) > 1 or method in ("POST", "WATCH") else method + "-collection"
    return verb, resource, subresource


class KubernetesApi:
    """Issue JSON requests and watches through a ``kubernetes.client.ApiClient``.

    Args:
        api_client: carries the credentials and TLS settings (kubeconfig or in-cluster).
        request_timeout: seconds to wait for one answer (connect and read).
    """

    def __init__(self, api_client: k8s_client.ApiClient, request_timeout: float = 30.0) -> None:
        if request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive seconds, got {request_timeout!r}")
        self.api_client = api_client
        self.request_timeout = request_timeout
        #: Counters for benchmarks: requests, 409s, 429s (``throttled``: API Priority and Fairness, never an
        #: outage), request and response body bytes, dropped pooled connections.
        self.stats = Counters("requests", "conflicts", "throttled", "bytes_sent", "bytes_received", "pool_drops")
        #: (verb, resource, subresource) the server has allowed this client before.
        self._allowed_before: set[tuple[str, str, str]] = set()
        #: Wall-clock time of the last answer that was not 429/5xx, and of the first failure (no answer, 5xx) since.
        self._last_answer: datetime | None = None
        self._failing_since: datetime | None = None
        #: The last outage this client saw: (last answer before it, first answer after it), UTC. A 429 neither
        #: starts nor ends one: the server answered (it is up), it only asked the client to come back later.
        self.last_outage: tuple[datetime, datetime] | None = None

    def _unavailable(self) -> None:
        if self._failing_since is None:
            self._failing_since = datetime.now(timezone.utc)

    def _answered(self) -> None:
        now = datetime.now(timezone.utc)
        if self._failing_since is not None:
            self.last_outage = (self._last_answer or self._failing_since, now)
            self._failing_since = None
        self._last_answer = now

    def _serialize(
        self, method: str, path: str, query: dict[str, Any] | None, content_type: str
    ) -> tuple[str, dict[str, str]]:
        _, url, headers, _, _ = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=[(key, value) for key, value in (query or {}).items() if value is not None],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        return url, headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """Send one request and return the decoded JSON answer.

        Raises:
            ApiError: the server answered with a non-2xx status.
            ApiUnavailableError: no answer (refused, reset, timed out); a write's outcome is unknown.
        """
        url, headers = self._serialize(method, path, query, content_type)
        limit = timeout or self.request_timeout
        self.stats.add("requests")
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        self.stats.add("bytes_sent", len(payload or b""))
        try:
            response = self.api_client.rest_client.pool_manager.request(
                method,
                url,
                body=payload,
                headers=headers,
                timeout=urllib3.Timeout(connect=min(limit, 10.0), read=limit),
                preload_content=True,
                # Never re-send behind the caller's back: a write whose answer was lost must be
                # resolved by the caller (operation ids), and hidden retries overshoot deadlines.
                retries=False,
            )
            data = response.data
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._unavailable()
            self._drop_connections(exc)
            raise ApiUnavailableError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        self.stats.add("bytes_received", len(data))
        if response.status == 409:
            self.stats.add("conflicts")
        if response.status == 429:
            self.stats.add("throttled")
        elif response.status >= 500:
            self._unavailable()
        else:
            self._answered()
        if not 200 <= response.status < 300:
            message = data.decode("utf-8", "replace")
            try:
                message = json.loads(data).get("message", message)
            except ValueError:
                pass
            raise self._refusal(response, message, method, path)
        self._allowed_before.add(_permission(method, path))
        return json.loads(data) if data else None

    def _drop_connections(self, failure: BaseException) -> None:
        """After a request timed out, close every pooled connection, so the next request dials anew.

        A connection that went silent (no bytes, no RST) times out every request sent on it, and
        so may the other pooled connections to the same server (client-go closes them all too).
        """
        if isinstance(failure, (urllib3.exceptions.TimeoutError, urllib3.exceptions.ProtocolError, TimeoutError)):
            self.stats.add("pool_drops")
            self.api_client.rest_client.pool_manager.clear()

    def _refusal(self, response: Any, message: str, method: str, path: str) -> ApiError:
        """The error for a non-2xx answer. A 401/403 may pass (transient): the permission worked
        before, or the server has just come back (a restarted API server refuses until its RBAC
        caches have synced)."""
        outage = self.last_outage
        flapping = response.status in (401, 403) and (
            _permission(method, path) in self._allowed_before
            or (outage is not None and datetime.now(timezone.utc) - outage[1] < timedelta(seconds=RBAC_SYNC_SECONDS))
        )
        retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        return api_error(response.status, str(response.reason), message, method, path, flapping, retry_after)

    def watch(
        self,
        path: str,
        *,
        query: dict[str, Any],
        timeout_seconds: int,
        on_response: Callable[[Any], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield watch events (``{"type": ..., "object": ...}``, bookmarks included) until the server ends the watch.

        ``on_response`` gets the open response, whose ``shutdown()`` ends a blocked read from another
        thread. The server ends the watch after ``timeout_seconds``; a connection that goes silent
        before that is dropped by TCP keepalive (``KEEPALIVE_*``), and any read waits at most 15 s
        past ``timeout_seconds``.

        Raises:
            GoneError: the resourceVersion is too old to resume from (list again).
            ApiError: the watch request itself was refused, or the server sent another ERROR event.
            ApiUnavailableError: the connection failed or dropped.
        """
        watch_query = dict(query, watch="true", allowWatchBookmarks="true", timeoutSeconds=timeout_seconds)
        self.stats.add("requests")
        url, headers = self._serialize("GET", path, watch_query, "application/json")
        try:
            response = self.api_client.rest_client.pool_manager.request(
                "GET",
                url,
                headers=headers,
                preload_content=False,
                timeout=urllib3.Timeout(connect=min(self.request_timeout, 10.0), read=timeout_seconds + 15),
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._drop_connections(exc)
            raise ApiUnavailableError(f"WATCH {path}: {type(exc).__name__}: {exc}") from exc
        if on_response is not None:
            on_response(response)
        try:
            if response.status != 200:
                if response.status == 429:
                    self.stats.add("throttled")
                raise self._refusal(response, response.read().decode("utf-8", "replace"), "WATCH", path)
            self._allowed_before.add(_permission("WATCH", path))
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            status = event.get("object") or {}
                            raise api_error(
                                int(status.get("code") or 500),
                                str(status.get("reason") or "WatchError"),
                                str(status.get("message") or ""),
                                "WATCH",
                                path,
                            )
                        yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._drop_connections(exc)
            raise ApiUnavailableError(f"WATCH {path} dropped: {type(exc).__name__}: {exc}") from exc
        finally:
            response.close()  # a watch ended early (stopped, refreshed) leaves unread bytes: never reuse it
            response.release_conn()


def call_with_retries(call: Callable[[], T], *, deadline: float, what: str) -> T:
    """Run ``call`` until it succeeds, retrying unavailability and transient statuses until ``deadline``.

    Waits as ``retries.OUTAGE_RETRY`` says (0.1 s doubling to 2 s, half jittered), and never less than an
    answer's ``Retry-After`` (a 429 from API Priority and Fairness, a 503). Only for calls that are safe to
    repeat (reads, and writes whose preconditions make a repeat harmless).

    Raises:
        ApiError: a status that is not retryable, or the last one at the deadline.
        ApiUnavailableError: still unreachable at the deadline.
    """
    return retry(OUTAGE_RETRY, call, retryable=is_transient, deadline=deadline, what=what, wait_at_least=retry_after_of)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an API outcome that a retry may change (no answer, or a transient status)."""
    return isinstance(exc, KubernetesApiError) and exc.transient


def socket_options() -> list[tuple[int, int, int]]:
    """urllib3's default options (no Nagle) plus keepalive and the user timeout, where the platform has them."""
    options = [*urllib3.connection.HTTPConnection.default_socket_options, (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_SECONDS),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_SECONDS),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", UNACKNOWLEDGED_MILLISECONDS),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


#: What an agent passes to name its kubeconfig: ``load_api_client``'s default advice.
AGENT_KUBECONFIG_FIX = "pass --rdzv-conf kubeconfig=PATH"


def load_api_client(
    kubeconfig: str | None, context: str | None, *, fix: str = AGENT_KUBECONFIG_FIX
) -> tuple[k8s_client.ApiClient, str | None]:
    """Return an API client and the kubeconfig context's namespace (None in-cluster, or none set).

    In-cluster credentials (the pod's service-account token, refreshed as it rotates) are
    used when running in a pod and no kubeconfig is given; otherwise the kubeconfig. ``fix`` is
    how the caller's user names another kubeconfig (the agents' ``--rdzv-conf``, the plugin's
    ``--kubeconfig``, the operator's ``--kubeconfig``): the error message advises it.

    Raises:
        ValueError: no usable credentials; the message says what to pass.
    """
    in_cluster = (
        os.environ.get("KUBERNETES_SERVICE_HOST")
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    )
    configuration: k8s_client.Configuration = type.__call__(k8s_client.Configuration)  # never the process default
    configuration.socket_options = socket_options()
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, POOL_CONNECTIONS)
    try:
        if kubeconfig is None and in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
            return k8s_client.ApiClient(configuration), None
        k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
        api_client = k8s_client.ApiClient(configuration)
        contexts, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            active = next((item for item in contexts if item["name"] == context), active)
        settings = (active or {}).get("context") or {}  # a context may be listed as ``context: null``
        namespace = settings.get("namespace") if isinstance(settings, dict) else None
        return api_client, str(namespace) if namespace else None
    except (k8s_config.ConfigException, OSError, TypeError, AttributeError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        named = f" (context {context!r})" if context else ""
        raise ValueError(
            f"No Kubernetes credentials: not in a pod, and the kubeconfig {where!r}{named} could not be loaded "
            f"({exc}). Run in a pod with a ServiceAccount, or {fix}."
        ) from exc
