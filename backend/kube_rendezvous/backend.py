"""``KubernetesRendezvousBackend``: the rendezvous state in a Rendezvous object's status.

``get_state`` reads ``status.state``; ``set_state`` writes it with a JSON merge patch of the
status subresource that carries ``metadata.resourceVersion``, so the API server applies it
only if nobody wrote the object since (compare-and-swap; a stale token gets 409 and nothing is
written). The same write stores the readable summary, decoded in-process from the state this
agent produced, so ``kubectl get rdzv`` always agrees with the state.

Not guaranteed: fencing (an agent paused past its heartbeat expiry can still write with a
token it read before the pause, as with every tensorplay backend), and agreement of clocks
(heartbeat expiry compares other nodes' timestamps with the local clock).
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

from .encoding import StateEncodingError, StateTooLargeError, decode_state, encode_state
from .intents import fold_intents
from .kubeapi import RENDEZVOUS_PLURAL, ApiError, ApiUnavailableError, KubernetesApi, call_with_retries, resource_path
from .statecheck import RENDEZVOUS_MODULE, ForbiddenGlobalError, check_state_pickle
from .summary import summarize_state

logger = logging.getLogger(__name__)

Token = Any
_STATE_CLASSES = {
    (RENDEZVOUS_MODULE, "_RendezvousState"): _RendezvousState,
    (RENDEZVOUS_MODULE, "_NodeDesc"): _NodeDesc,
}
MERGE_PATCH = "application/merge-patch+json"


def describe_api_error(exc: ApiError, verb: str, resource: str, namespace: str) -> str:
    """Return a message for a failed call that names what the account lacks when it is a 403."""
    if exc.status == 403:
        return (
            f"The API server refused to {verb} {resource} in namespace {namespace!r} (403 Forbidden): "
            f"{exc.message}. Grant the training pods' ServiceAccount the kube-rendezvous agent Role "
            f"(verb {verb!r} on {resource!r} in API group 'kube-rendezvous.io'); see docs/rbac.yaml."
        )
    if exc.status == 401:
        return (
            f"The API server did not accept this process's credentials (401) on {verb} {resource}: "
            f"{exc.message}. Check the service-account token or the kubeconfig."
        )
    return f"Could not {verb} {resource} in namespace {namespace!r}: {exc}"


class KubernetesRendezvousBackend(RendezvousBackend):
    """Rendezvous state stored in ``status.state`` of one Rendezvous object.

    Args:
        api: the API client.
        namespace: the Rendezvous object's namespace.
        name: the Rendezvous object's name.
        run_id: the job's run id; a state written by another run id counts as no state.
        node_name: recorded as ``status.lastWriter``.
        retry_timeout: seconds to keep retrying while the API server is unreachable or
            throttling, before raising ``RendezvousConnectionError``.
        conflict_backoff: seconds; after k consecutive lost compare-and-swaps, wait a random
            time up to ``conflict_backoff * 2**(k-1)`` (capped at ``max_conflict_backoff``) before
            re-reading. 0 disables it.
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        name: str,
        run_id: str,
        *,
        node_name: str | None = None,
        retry_timeout: float = 60.0,
        conflict_backoff: float = 0.02,
        max_conflict_backoff: float = 2.0,
    ) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        if retry_timeout < 0:
            raise ValueError(f"retry_timeout must be >= 0 seconds, got {retry_timeout!r}")
        self._api = api
        self.namespace = namespace
        self.object_name = name
        self.run_id = run_id
        self._node_name = node_name
        self._retry_timeout = retry_timeout
        if conflict_backoff < 0 or max_conflict_backoff < conflict_backoff:
            raise ValueError(
                f"conflict_backoff ({conflict_backoff!r}) must be >= 0 and <= max_conflict_backoff "
                f"({max_conflict_backoff!r}), in seconds"
            )
        self._conflict_backoff = conflict_backoff
        self._max_conflict_backoff = max_conflict_backoff
        self._conflict_streak = 0
        self._path = resource_path(RENDEZVOUS_PLURAL, namespace, name)
        self._status_path = resource_path(RENDEZVOUS_PLURAL, namespace, name, "status")
        #: The Rendezvous spec as read when the backend was made (create_backend fills it in).
        self.spec: dict[str, Any] = {}
        #: Counters for tests and benchmarks: successful writes, lost compare-and-swaps, reads.
        self.stats = {"writes": 0, "conflicts": 0, "reads": 0}

    @property
    def name(self) -> str:
        return "k8s"

    # -- reading ---------------------------------------------------------------------------

    def _read_object(self) -> dict[str, Any]:
        self.stats["reads"] += 1
        try:
            return call_with_retries(
                lambda: self._api.request("GET", self._path),
                deadline=time.monotonic() + self._retry_timeout,
                what=f"GET rendezvous {self.namespace}/{self.object_name}",
            )
        except ApiError as exc:
            if exc.status == 404:
                raise RendezvousClosedError(
                    f"The Rendezvous {self.namespace}/{self.object_name} no longer exists (deleted); "
                    "the rendezvous is over."
                ) from exc
            raise RendezvousConnectionError(describe_api_error(exc, "get", RENDEZVOUS_PLURAL, self.namespace)) from exc
        except ApiUnavailableError as exc:
            raise RendezvousConnectionError(
                f"The Kubernetes API server could not be reached for {self._retry_timeout:.0f} s. "
                "See the inner exception for details."
            ) from exc

    def _state_of(self, obj: dict[str, Any]) -> tuple[bytes, Token] | None:
        status = obj.get("status") or {}
        encoded = status.get("state")
        foreign = status.get("runId") not in (None, self.run_id)
        if foreign and encoded:
            logger.info(
                "Rendezvous %s/%s holds the state of run %r; run %r starts afresh over it",
                self.namespace,
                self.object_name,
                status.get("runId"),
                self.run_id,
            )
        if not encoded or foreign:
            initial = self._with_intents(obj, None)
            return None if initial is None else (initial, obj["metadata"]["resourceVersion"])
        try:
            state = decode_state(encoded)
        except StateEncodingError as exc:
            raise RendezvousStateError(
                f"The rendezvous state in {self.namespace}/{self.object_name} is corrupt: {exc}. "
                "See the inner exception for details."
            ) from exc
        folded = self._with_intents(obj, state)
        return (state if folded is None else folded), obj["metadata"]["resourceVersion"]

    def _with_intents(self, obj: dict[str, Any], state: bytes | None) -> bytes | None:
        """Refuse a hostile pickle; fold spec.closed, a deletion and status.evictedNodes into the state."""
        close = bool((obj.get("spec") or {}).get("closed")) or bool(obj["metadata"].get("deletionTimestamp"))
        evicted = (obj.get("status") or {}).get("evictedNodes") or []
        decoded: Any = None
        if state is not None:
            try:
                decoded = check_state_pickle(state, _STATE_CLASSES)
            except ForbiddenGlobalError as exc:
                raise RendezvousStateError(
                    f"The rendezvous state in {self.namespace}/{self.object_name} was refused: {exc}."
                ) from exc
            except Exception:  # noqa: BLE001 - not a pickle at all: the holder reports that itself
                return state
            if not isinstance(decoded, _RendezvousState):
                return state
        if not close and not evicted:
            return state
        if decoded is None:
            if not close:
                return None
            decoded = _RendezvousState()
        if fold_intents(decoded, close=close, evicted=evicted) or state is None:
            return pickle.dumps(decoded)
        return state

    def get_state(self) -> tuple[bytes, Token] | None:
        """Return ``(state, token)``, or None when this run has no state yet.

        Raises:
            RendezvousStateError: ``status.state`` is corrupt (nothing is changed).
            RendezvousConnectionError: the API server is unreachable, or refused (403).
            RendezvousClosedError: the Rendezvous object was deleted.
        """
        return self._state_of(self._read_object())

    # -- writing ---------------------------------------------------------------------------

    def _status_for(self, state: bytes, encoded: str) -> dict[str, Any]:
        status: dict[str, Any] = {"state": encoded, "stateBytes": len(encoded), "runId": self.run_id}
        now = datetime.now(timezone.utc)
        try:
            decoded = pickle.loads(state)
            status.update(summarize_state(decoded, now=now, writer=self._node_name))
        except Exception as exc:  # noqa: BLE001 - a summary must never block the state write
            logger.debug("state is not a tensorplay rendezvous state (%s); writing no summary", exc)
            status.update({"lastChangeTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "lastWriter": self._node_name})
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
            RendezvousStateError: the encoded state would not fit in an object, or the current
                state is corrupt.
            RendezvousConnectionError: the API server is unreachable, or refused (403).
            RendezvousClosedError: the Rendezvous object was deleted.
        """
        try:
            encoded = encode_state(state)
        except StateTooLargeError as exc:
            raise RendezvousStateError(str(exc)) from exc

        if token is None:
            obj = self._read_object()
            current = self._state_of(obj)
            if current is not None:
                return current[0], current[1], False
            token = obj["metadata"]["resourceVersion"]
        elif not isinstance(token, str) or not token:
            current = self.get_state()
            return None if current is None else (current[0], current[1], False)

        body = {"metadata": {"resourceVersion": token}, "status": self._status_for(state, encoded)}
        try:
            written = self._api.request("PATCH", self._status_path, body=body, content_type=MERGE_PATCH)
        except ApiUnavailableError as exc:
            # The write may or may not have committed: decide from what is stored now.
            logger.info("state write had no answer (%s); re-reading to learn its outcome", exc)
            obj = self._read_object()
            if (obj.get("status") or {}).get("state") == encoded:
                self.stats["writes"] += 1
                return state, obj["metadata"]["resourceVersion"], True
            return self._lost(self._state_of(obj))
        except ApiError as exc:
            if exc.status in (409, 400, 422):
                # 409: stale token. 400/422: a token that is not a resourceVersion.
                if exc.status == 409:
                    self._back_off()
                return self._lost(self.get_state())
            if exc.status == 404:
                raise RendezvousClosedError(
                    f"The Rendezvous {self.namespace}/{self.object_name} no longer exists (deleted)."
                ) from exc
            if exc.transient:
                obj = self._read_object()
                if (obj.get("status") or {}).get("state") == encoded:
                    return state, obj["metadata"]["resourceVersion"], True
                return self._lost(self._state_of(obj))
            raise RendezvousConnectionError(
                describe_api_error(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", self.namespace)
            ) from exc
        self.stats["writes"] += 1
        self._conflict_streak = 0
        return state, written["metadata"]["resourceVersion"], True

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
