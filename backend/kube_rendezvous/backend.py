"""``KubernetesRendezvousBackend``: the rendezvous state as a typed document in a Rendezvous's status.

``get_state`` reads ``status.state``, decodes and validates the JSON state document
(``document``), folds the close and eviction intents in, and hands the framework a pickle that
this process made from the validated values. ``set_state`` turns the framework's state into a
document, validates it and writes it with a JSON merge patch of the status subresource that
carries ``metadata.resourceVersion`` (compare-and-swap: a stale token gets 409, nothing is
written). The same write stores the readable summary derived from that document.

Token semantics: the token is the object's ``metadata.resourceVersion``, an opaque string,
never parsed or ordered. ``set_state(state, token)`` writes only if ``token`` is the current
one; otherwise (stale, ``None`` while a state exists, or not a resourceVersion) nothing is
written and the current ``(state, token, False)`` is returned. Unlike the peer backends it
stores rendezvous states only: bytes that are not a pickled ``_RendezvousState`` get a
``RendezvousStateError``, and the state handed back is equal in meaning to the one written,
not byte-identical (it is re-pickled from the document).

Not guaranteed: fencing (an agent paused past its heartbeat expiry can still write with a
token it read before the pause, as with every backend of this handler), and agreement of
clocks (heartbeat expiry compares other nodes' timestamps with the local clock).
"""

from __future__ import annotations

import logging
import pickle
import random
import time
from datetime import datetime, timezone
from typing import Any

from tensorplay.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousStateError,
)
from tensorplay.distributed.elastic.rendezvous.core_rendezvous_backend import RendezvousBackend
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from .document import (
    RendezvousDocument,
    StateDocumentError,
    decode_document,
    document_from_state,
    encode_document,
    state_from_document,
)
from .intents import fold_intents
from .kubeapi import (
    RENDEZVOUS_PLURAL,
    ApiError,
    ApiUnavailableError,
    ConflictError,
    InvalidError,
    KubernetesApi,
    NotFoundError,
    call_with_retries,
    describe_api_error,
    resource_path,
)
from .statecheck import load_own_state
from .summary import summarize_document

logger = logging.getLogger(__name__)

Token = Any
MERGE_PATCH = "application/merge-patch+json"


class KubernetesRendezvousBackend(RendezvousBackend):
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
    """

    #: The framework's state classes; an adapter for another framework overrides these two.
    state_class: type = _RendezvousState
    node_class: type = _NodeDesc

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        run_id: str,
        *,
        node_name: str | None = None,
        retry_timeout: float = 60.0,
        conflict_backoff: float = 0.02,
        max_conflict_backoff: float = 2.0,
        max_participants: int | None = None,
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
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.run_id = run_id
        self._node_name = node_name
        self._retry_timeout = retry_timeout
        self._conflict_backoff = conflict_backoff
        self._max_conflict_backoff = max_conflict_backoff
        self._max_participants = max_participants
        self._conflict_streak = 0
        self._path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name)
        self._status_path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name, "status")
        #: The Rendezvous spec as read when the backend was made (create_backend fills it in).
        self.spec: dict[str, Any] = {}
        #: Counters for tests and benchmarks: successful writes, lost compare-and-swaps, reads.
        self.stats = {"writes": 0, "conflicts": 0, "reads": 0}

    @property
    def name(self) -> str:
        return "k8s"

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.rendezvous_name}"

    # -- reading ---------------------------------------------------------------------------

    def _read_object(self) -> dict[str, Any]:
        self.stats["reads"] += 1
        try:
            return call_with_retries(
                lambda: self._api.request("GET", self._path),
                deadline=time.monotonic() + self._retry_timeout,
                what=f"GET rendezvous {self._where}",
            )
        except NotFoundError as exc:
            raise RendezvousClosedError(
                f"The Rendezvous {self._where} no longer exists (deleted); the rendezvous is over."
            ) from exc
        except ApiError as exc:
            raise RendezvousConnectionError(describe_api_error(exc, "get", RENDEZVOUS_PLURAL, self.namespace)) from exc
        except ApiUnavailableError as exc:
            raise RendezvousConnectionError(
                f"The Kubernetes API server could not be reached for {self._retry_timeout:.0f} s. "
                "See the inner exception for details."
            ) from exc

    def read_document(self, obj: dict[str, Any]) -> RendezvousDocument | None:
        """Return the validated document of ``obj`` with the intents folded in (None: no state).

        Raises:
            RendezvousStateError: ``status.state`` is not a valid state document (nothing changed).
        """
        status = obj.get("status") or {}
        encoded = status.get("state")
        foreign = status.get("runId") not in (None, self.run_id)
        if foreign and encoded:
            logger.info(
                "Rendezvous %s holds the state of run %r; run %r starts afresh over it",
                self._where,
                status.get("runId"),
                self.run_id,
            )
        document = None
        if encoded and not foreign:
            try:
                document = decode_document(encoded)
            except StateDocumentError as exc:
                raise RendezvousStateError(
                    f"The rendezvous state in {self._where} was refused, and nothing was changed: {exc}."
                ) from exc
        close = bool((obj.get("spec") or {}).get("closed")) or bool(obj["metadata"].get("deletionTimestamp"))
        return fold_intents(document, close=close, evicted=status.get("evictedNodes") or [])

    def _state_of(self, obj: dict[str, Any]) -> tuple[bytes, Token] | None:
        document = self.read_document(obj)
        if document is None:
            return None
        state = state_from_document(document, self.state_class, self.node_class)
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

    def _encode(self, state: bytes) -> tuple[RendezvousDocument, str]:
        try:
            value = load_own_state(state, self.state_class, self.node_class)
            document = document_from_state(value, max_participants=self._max_participants)
            return document, encode_document(document)
        except ValueError as exc:  # StateDocumentError is a ValueError
            raise RendezvousStateError(f"The rendezvous state was not written to {self._where}: {exc}") from exc

    def _status_for(self, document: RendezvousDocument, encoded: str) -> dict[str, Any]:
        status: dict[str, Any] = {"state": encoded, "stateBytes": len(encoded), "runId": self.run_id}
        status.update(summarize_document(document, now=datetime.now(timezone.utc), writer=self._node_name))
        return status

    def set_state(  # type: ignore[override]
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """Write ``state`` if ``token`` is the object's current resourceVersion.

        Returns ``(state, new_token, True)`` when written, else the current
        ``(state, token, False)`` (None when there is no state) without writing: for a stale
        token, for ``token=None`` while a state exists, and for a token that is not a
        resourceVersion string. A 409 is never an error here.

        Raises:
            RendezvousStateError: ``state`` is not a valid rendezvous state, would not fit in an
                object, or the stored state is invalid.
            RendezvousConnectionError: the API server is unreachable, or refused (403).
            RendezvousClosedError: the Rendezvous object was deleted.
        """
        document, encoded = self._encode(state)
        if token is None:
            obj = self._read_object()
            current = self._state_of(obj)
            if current is not None:
                return current[0], current[1], False
            token = obj["metadata"]["resourceVersion"]
        elif not isinstance(token, str) or not token:
            return self._lost(self._state_of(self._read_object()))

        body = {"metadata": {"resourceVersion": token}, "status": self._status_for(document, encoded)}
        try:
            written = self._api.request("PATCH", self._status_path, body=body, content_type=MERGE_PATCH)
        except ApiUnavailableError as exc:
            # The write may or may not have committed: decide from what is stored now.
            logger.info("state write had no answer (%s); re-reading to learn its outcome", exc)
            return self._outcome(state, encoded)
        except ConflictError:
            self._back_off()
            return self._lost(self._state_of(self._read_object()))
        except InvalidError as exc:
            obj = self._read_object()
            if obj["metadata"]["resourceVersion"] == token:
                # The token was current, so the server refused the status itself.
                raise RendezvousStateError(
                    f"The API server refused the rendezvous state for {self._where}: {exc.message}"
                ) from exc
            return self._lost(self._state_of(obj))  # a token that is not a resourceVersion
        except NotFoundError as exc:
            raise RendezvousClosedError(f"The Rendezvous {self._where} no longer exists (deleted).") from exc
        except ApiError as exc:
            if exc.transient:
                return self._outcome(state, encoded)
            raise RendezvousConnectionError(
                describe_api_error(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", self.namespace)
            ) from exc
        self.stats["writes"] += 1
        self._conflict_streak = 0
        return state, written["metadata"]["resourceVersion"], True

    def _outcome(self, state: bytes, encoded: str) -> tuple[bytes, Token, bool] | None:
        """After a write with no clear answer: written if the stored state is ours, else lost."""
        obj = self._read_object()
        if (obj.get("status") or {}).get("state") == encoded:
            self.stats["writes"] += 1
            return state, obj["metadata"]["resourceVersion"], True
        return self._lost(self._state_of(obj))

    def _back_off(self) -> None:
        """Wait a random time that doubles with each consecutive lost compare-and-swap.

        Without it, N agents that lose retry at once and a round costs O(N^2) writes; with it the
        retries spread out (full jitter), and the first attempt after a win is never delayed.
        """
        self._conflict_streak += 1
        if self._conflict_backoff > 0:
            limit = min(self._max_conflict_backoff, self._conflict_backoff * 2 ** min(self._conflict_streak - 1, 16))
            time.sleep(random.uniform(0, limit))

    def _lost(self, current: tuple[bytes, Token] | None) -> tuple[bytes, Token, bool] | None:
        self.stats["conflicts"] += 1
        return None if current is None else (current[0], current[1], False)
