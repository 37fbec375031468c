"""``KubernetesRendezvousBackend``: the seed's compare-and-swap backend, on a Rendezvous's status.

For users of the framework's stock ``DynamicRendezvousHandler`` (``create_backend(params) ->
(backend, store)``, as the seed's). The ``k8s`` handler does not use it: it speaks requests and folds
(``native``).

``get_state`` reads ``status.state``, decodes and validates the JSON state document
(``document``), folds the close and eviction intents in (``intents``), and hands the framework a
pickle that this process made from the validated values. ``set_state`` turns the framework's state
into a document, validates it and writes it with a JSON merge patch of the status subresource that
carries ``metadata.resourceVersion`` (compare-and-swap: a stale token gets 409, nothing is written).
The same write stores the readable summary derived from that document.

The token is the object's ``metadata.resourceVersion``, an opaque string, never parsed or ordered.
Unlike the peer backends it stores rendezvous states only: bytes that are not a pickled
``_RendezvousState`` get a ``RendezvousStateError``, and the state handed back is equal in meaning
to the one written, not byte-identical.

Exactly once: each write carries a write id, kept in ``status.recentWriteIds`` (the last 8). After a
write with no clear answer (no answer, 429, 5xx) the object is read: the write id there means it
committed (``set_state`` answers ``has_set=True`` with the state and token as they are now); a
changed token means it never can; an unchanged token means it has not (yet), and the same
compare-and-swap is sent again: it commits at most once, because the token changes when it does.

Outages: for one heartbeat expiry after an outage, heartbeats older than its end are handed to the
framework moved forward by the outage's length (never past its end), so the first read after the
API server returns does not prune live nodes.

Not guaranteed: fencing (an agent paused past its heartbeat expiry can still write with a token it
read before the pause), agreement of clocks (the framework compares other nodes' heartbeats with
its own clock), and scale: every heartbeat is a write of the shared object (N/5 writes a second).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import socket
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from .._kube.kubeapi import (
    RENDEZVOUS_PLURAL,
    ApiError,
    ConflictError,
    InvalidError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    ThrottledError,
    call_with_retries,
    describe_api_error,
    is_resource_version,
    resource_path,
    retry_after_of,
)
from .._kube.status import write_status
from .._rules.document import (
    RendezvousDocument,
    StateDocumentError,
    document_from_state,
    encode_document,
    state_from_document,
)
from .._rules.intents import read_rendezvous
from .._rules.retries import OUTAGE_RETRY, OUTAGE_RETRY_SECONDS, STATE_CONFLICT_RETRY, retry
from .._rules.settings import DEFAULT_HEARTBEAT_EXPIRY
from .._rules.statecheck import load_own_state
from .._rules.summary import summarize_document
from .._store.store import KubernetesStore
from .connection import connect
from .frameworks import Framework

logger = logging.getLogger(__name__)

Token = Any
#: Write ids kept in ``status.recentWriteIds`` to recognise a committed write after an unclear answer.
RECENT_WRITE_IDS = 8


class KubernetesRendezvousBackend:
    """Rendezvous state stored as a typed document in ``status.state`` of one Rendezvous object.

    Args:
        api: the API client.
        namespace: the Rendezvous object's namespace.
        rendezvous_name: the Rendezvous object's name.
        run_id: the job's run id; a state written by another run id counts as no state.
        node_name: recorded as ``status.lastWriter``.
        retry_timeout: seconds to keep retrying while the API server is unreachable or
            throttling, before raising ``RendezvousConnectionError``.
        conflict_backoff: seconds; after k consecutive lost compare-and-swaps, wait a random
            time up to ``conflict_backoff * 2**(k-1)`` (capped at ``max_conflict_backoff``) before
            re-reading. 0 disables it.
        max_participants: the most participants a state this backend writes may hold (the
            job's max nodes); None checks only the document's own limit.
        heartbeat_expiry: seconds without a heartbeat after which a node counts as dead; also
            how long heartbeats are moved forward after an outage (module docstring).
        framework: the elastic framework whose state classes and errors to use (its adapter's:
            ``_adapters.tensorplay.tensorplay_framework()``, ``_adapters.torchrun.torch_framework()``).
        min_participants: the launcher's min nodes; with ``max_participants``, written as ``status.minNodes`` and
            ``status.maxNodes`` (what ``kubectl get rdzv`` shows as MIN/MAX).
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        run_id: str,
        *,
        node_name: str | None = None,
        retry_timeout: float = OUTAGE_RETRY_SECONDS,
        conflict_backoff: float = STATE_CONFLICT_RETRY.first_delay,
        max_conflict_backoff: float = STATE_CONFLICT_RETRY.max_delay,
        max_participants: int | None = None,
        heartbeat_expiry: float = DEFAULT_HEARTBEAT_EXPIRY,
        framework: Framework,
        min_participants: int | None = None,
    ) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        if retry_timeout < 0:
            raise ValueError(f"retry_timeout must be >= 0 seconds, got {retry_timeout!r}")
        if conflict_backoff < 0 or max_conflict_backoff < conflict_backoff:
            raise ValueError(
                f"conflict_backoff ({conflict_backoff!r}) must be >= 0 and <= max_conflict_backoff "
                f"({max_conflict_backoff!r}), in seconds"
            )
        #: ``STATE_CONFLICT_RETRY`` with this backend's settings.
        self._conflict_retry = dataclasses.replace(
            STATE_CONFLICT_RETRY, first_delay=conflict_backoff, max_delay=max_conflict_backoff
        )
        self.framework = framework
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.run_id = run_id
        self._node_name = node_name
        self._retry_timeout = retry_timeout
        self._max_participants = max_participants
        self._min_participants = min_participants
        self._heartbeat_expiry = timedelta(seconds=heartbeat_expiry)
        self._conflict_streak = 0
        #: The token of the last object seen and its status.
        self._remembered: tuple[str, dict[str, Any]] = ("", {})
        self._path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name)

    @property
    def name(self) -> str:
        return "k8s"

    @property
    def api(self) -> KubernetesApi:
        """The API client this backend sends its requests on (its ``stats``: requests, conflicts, bytes)."""
        return self._api

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.rendezvous_name}"

    # -- reading ---------------------------------------------------------------------------

    def _read_object(self) -> dict[str, Any]:
        try:
            obj: dict[str, Any] = call_with_retries(
                lambda: self._api.request("GET", self._path),
                deadline=time.monotonic() + self._retry_timeout,
                what=f"GET rendezvous {self._where}",
            )
        except NotFoundError as exc:
            raise self.framework.closed_error(
                f"The Rendezvous {self._where} no longer exists (deleted); the rendezvous is over."
            ) from exc
        except KubernetesApiError as exc:
            unreachable = (
                f"The Kubernetes API server could not be reached for {self._retry_timeout:.0f} s. "
                "See the inner exception for details."
            )
            raise self.framework.api_failure(exc, "get", RENDEZVOUS_PLURAL, self.namespace, unreachable) from exc
        self._remembered = (obj["metadata"]["resourceVersion"], obj.get("status") or {})
        return obj

    def _state_of(self, obj: dict[str, Any]) -> tuple[bytes, Token] | None:
        """``(state, token)`` of ``obj``: its validated document with the intents folded in, and
        heartbeats older than the last outage's end moved forward by its length, for one expiry after it.

        Raises:
            RendezvousStateError: ``status.state`` is not a valid state document (nothing changed).
        """
        try:
            reading = read_rendezvous(obj, self.run_id)
        except StateDocumentError as exc:
            raise self.framework.state_error(
                f"The rendezvous state in {self._where} was refused, and nothing was changed: {exc}."
            ) from exc
        if reading.foreign_run is not None:
            logger.info(
                "Rendezvous %s holds the state of run %r; run %r starts afresh over it",
                self._where,
                reading.foreign_run,
                self.run_id,
            )
        document = reading.document
        if document is None:
            return None
        outage = self._api.last_outage
        if outage is not None and datetime.now(timezone.utc) <= outage[1] + self._heartbeat_expiry:
            start, end = outage
            moved = {
                node: min(beat + (end - start), end) if beat < end else beat
                for node, beat in document.last_heartbeats.items()
            }
            document = dataclasses.replace(document, last_heartbeats=moved)
        state = state_from_document(document, self.framework.state_class, self.framework.node_class)
        return pickle.dumps(state), obj["metadata"]["resourceVersion"]

    def get_state(self) -> tuple[bytes, Token] | None:
        """Return ``(state, token)``, or None when this run has no state yet.

        Raises:
            RendezvousStateError: ``status.state`` is not a valid state document (nothing changed).
            RendezvousConnectionError: the API server is unreachable, or refused (403).
            RendezvousClosedError: the Rendezvous object was deleted.
        """
        return self._state_of(self._read_object())

    # -- writing ---------------------------------------------------------------------------

    def _own_document(self, state: bytes) -> tuple[RendezvousDocument, str]:
        """The validated document of the framework's ``state`` and its encoding."""
        try:
            value = load_own_state(state, self.framework.state_class, self.framework.node_class)
            document = document_from_state(value, max_participants=self._max_participants)
            return document, encode_document(document)
        except ValueError as exc:  # StateDocumentError is a ValueError
            raise self.framework.state_error(f"The rendezvous state was not written to {self._where}: {exc}") from exc

    def _status_for(self, document: RendezvousDocument, encoded: str, write_id: str, token: str) -> dict[str, Any]:
        remembered_token, remembered = self._remembered
        previous = remembered if remembered_token == token else {}
        known_ids = [str(item) for item in previous.get("recentWriteIds") or []]
        status: dict[str, Any] = {
            "state": encoded,
            "stateBytes": len(encoded),
            "runId": self.run_id,
            "recentWriteIds": [*known_ids[-(RECENT_WRITE_IDS - 1) :], write_id],
            **summarize_document(document, now=datetime.now(timezone.utc), writer=self._node_name, previous=previous),
        }
        if previous.get("runId") not in (None, self.run_id):
            status["evictedNodes"] = None  # a new run starts without the old run's evictions
        if self._min_participants is not None and self._max_participants is not None:
            # What this agent follows (its --nnodes), which kubectl get rdzv shows as MIN/MAX.
            status.update(minNodes=self._min_participants, maxNodes=self._max_participants)
        return status

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """Write ``state`` if ``token`` is the object's current resourceVersion.

        Returns ``(state, new_token, True)`` when written, else the current
        ``(state, token, False)`` (None when there is no state) without writing: for a stale
        token, for ``token=None`` while a state exists, and for a token that is not a
        resourceVersion (``kubeapi.is_resource_version``: never sent, the server would answer 500).
        A 409 is never an error here.

        Raises:
            RendezvousStateError: ``state`` is not a valid rendezvous state, would not fit in an
                object, or the stored state is invalid.
            RendezvousConnectionError: the API server is unreachable, or refused (403).
            RendezvousClosedError: the Rendezvous object was deleted.
        """
        document, encoded = self._own_document(state)
        if not is_resource_version(token):  # None, or not a resourceVersion: nothing is sent with it
            obj = self._read_object()
            current = self._state_of(obj)
            if current is not None or token is not None:  # a state exists, or the token is not a resourceVersion
                return None if current is None else (current[0], current[1], False)
            token = obj["metadata"]["resourceVersion"]
        write_id = uuid.uuid4().hex[:8]
        status = self._status_for(document, encoded, write_id, token)
        #: Whether the last write had no clear answer, and whether a write was sent again after one.
        unanswered = unclear = False

        def attempt() -> tuple[bytes, Token, bool] | None:
            nonlocal unanswered, unclear
            if unanswered:  # no clear answer to the last write: what is stored says whether it committed
                obj = self._read_object()
                if obj["metadata"]["resourceVersion"] != token:
                    return self._settled(obj, write_id)  # committed, or the token is stale: it never can
                unclear = True  # not committed (yet): send the same compare-and-swap again
            try:
                written = write_status(self._api, self.namespace, self.rendezvous_name, status, token=token)
            except ConflictError:
                if not unclear:
                    # Lost the compare-and-swap: wait a random time that doubles with each one lost in a row
                    # (N losers spread out), then read, so the state handed back is fresh.
                    self._conflict_streak += 1
                    if self._conflict_retry.first_delay > 0:
                        time.sleep(self._conflict_retry.delay(self._conflict_streak))
                return self._settled(self._read_object(), write_id)
            except InvalidError as exc:
                obj = self._read_object()
                if obj["metadata"]["resourceVersion"] == token:
                    # The token was current, so the server refused the status itself.
                    raise self.framework.state_error(
                        f"The API server refused the rendezvous state for {self._where}: {exc.message}"
                    ) from exc
                return self._settled(obj)  # a token that is not a resourceVersion
            except NotFoundError as exc:
                raise self.framework.closed_error(f"The Rendezvous {self._where} no longer exists (deleted).") from exc
            except KubernetesApiError as exc:
                if isinstance(exc, ApiError) and not exc.transient:
                    raise self.framework.connection_error(
                        describe_api_error(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", self.namespace)
                    ) from exc
                if not isinstance(exc, ThrottledError):  # a 429 is a clear answer: not executed
                    unanswered = True  # no clear answer: the next attempt reads what is stored first
                raise
            self._remembered = (written["metadata"]["resourceVersion"], written.get("status") or {})
            self._conflict_streak = 0
            return state, written["metadata"]["resourceVersion"], True

        try:
            return retry(
                OUTAGE_RETRY,
                attempt,
                retryable=lambda exc: isinstance(exc, KubernetesApiError),  # only an unclear answer escapes
                deadline=time.monotonic() + self._retry_timeout,
                what=f"a state write to {self._where}",
                wait_at_least=retry_after_of,
            )
        except KubernetesApiError as exc:
            if isinstance(exc, ThrottledError) and not unanswered:
                raise self.framework.connection_error(
                    describe_api_error(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", self.namespace)
                ) from exc
            raise self.framework.connection_error(
                "The Kubernetes API server gave no clear answer to a state write for "
                f"{self._retry_timeout:.0f} s. See the inner exception for details."
            ) from exc

    def _settled(self, obj: dict[str, Any], write_id: str | None = None) -> tuple[bytes, Token, bool] | None:
        """The outcome ``obj`` shows: ``(state, token, True)`` as stored now if write ``write_id``
        committed (others may have written since), else the current ``(state, token, False)``."""
        current = self._state_of(obj)
        committed = write_id in ((obj.get("status") or {}).get("recentWriteIds") or [])
        if committed:
            self._conflict_streak = 0
        return None if current is None else (current[0], current[1], committed)


def create_backend(params: Any, framework: Framework) -> tuple[KubernetesRendezvousBackend, KubernetesStore]:
    """The seed's compare-and-swap backend and its store, for the framework's stock ``DynamicRendezvousHandler``
    (the public ``create_backend`` is the tensorplay adapter's, with tensorplay's ``Framework`` by default).

    Args:
        params: the launcher's ``RendezvousParameters`` (tensorplay's or torch's).
        framework: whose state classes and errors to use (its adapter's).

    Raises:
        ValueError: bad parameters (endpoint, rdzv-conf values, missing object with create=false).
        RendezvousConnectionError: the API server is unreachable or refuses (403, naming the permission).
    """
    connection = connect(params, framework)
    backend = KubernetesRendezvousBackend(
        connection.api,
        connection.namespace,
        connection.rendezvous_name,
        connection.run_id,
        node_name=params.local_addr or socket.getfqdn(),
        retry_timeout=connection.config.retry_timeout,
        conflict_backoff=connection.config.conflict_backoff,
        max_conflict_backoff=max(STATE_CONFLICT_RETRY.max_delay, connection.config.conflict_backoff),
        max_participants=params.max_nodes,
        heartbeat_expiry=connection.timings.heartbeat_expiry,
        framework=framework,
        min_participants=params.min_nodes,
    )
    return backend, connection.store(framework)
