"""The one way to write a Rendezvous's status: a merge patch of the status subresource, and the eviction intent.

Every writer of ``status`` goes through ``write_status``: the folder and the compare-and-swap backend
(the state, with the summary; ``token`` makes it a compare-and-swap), the operator (conditions) and
``add_evictions`` (the operator's and ``kubectl rdzv evict``'s eviction intent).

Not guaranteed: anything beyond one request per call. ``write_status`` neither retries nor reads:
callers decide what a conflict or a lost answer means (the backend's exactly-once protocol, the
folder's next fold, the operator's retry).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._rules.intents import with_evicted
from .._rules.retries import EVICTION_CONFLICT_RETRY, OUTAGE_RETRY, retry
from .kubeapi import (
    MERGE_PATCH,
    RENDEZVOUS_PLURAL,
    ConflictError,
    KubernetesApi,
    KubernetesApiError,
    call_with_retries,
    resource_path,
    retry_after_of,
)


def write_status(
    api: KubernetesApi, namespace: str, rendezvous_name: str, status: dict[str, Any], *, token: str | None = None
) -> dict[str, Any]:
    """Merge-patch ``status`` into the Rendezvous's status; with ``token``, only if that is its resourceVersion.

    Without ``token`` the server applies the patch to the latest version (no conflict is possible).
    Returns the written object.

    Raises:
        ConflictError: ``token`` is stale (nothing written).
        NotFoundError: the Rendezvous is gone.
        KubernetesApiError: refused (``ApiError``), or no answer (``ApiUnavailableError``: the outcome of the
            write is unknown).
    """
    body: dict[str, Any] = {"status": status}
    if token is not None:
        body["metadata"] = {"resourceVersion": token}
    path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name, "status")
    written: dict[str, Any] = api.request("PATCH", path, body=body, content_type=MERGE_PATCH)
    return written


def add_evictions(
    api: KubernetesApi,
    namespace: str,
    rendezvous_name: str,
    nodes: list[str],
    *,
    deadline: float,
    on_conflict: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], list[str] | None]:
    """Add ``nodes`` to ``status.evictedNodes`` by compare-and-swap, so that concurrent evictions are never lost.

    Each attempt reads the object and writes the list on its resourceVersion; a lost compare-and-swap
    (``on_conflict`` is called) waits as ``EVICTION_CONFLICT_RETRY`` says and reads again; an answer that
    never came, a 429 or a 5xx is retried as ``OUTAGE_RETRY`` says until ``deadline``, and the next read
    shows whether the write had committed (the nodes are there) before it is sent again. Returns the
    object last read and the list written (None: every node was evicted already).

    Raises:
        NotFoundError: the Rendezvous is gone.
        ConflictError: ``EVICTION_CONFLICT_RETRY.attempts`` compare-and-swaps in a row lost.
        KubernetesApiError: refused, or no answer by ``deadline``.
    """
    path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name)
    where = f"{namespace}/{rendezvous_name}"

    def attempt() -> tuple[dict[str, Any], list[str] | None]:
        obj: dict[str, Any] = call_with_retries(
            lambda: api.request("GET", path), deadline=deadline, what=f"GET rendezvous {where}"
        )
        evicted = with_evicted(obj.get("status") or {}, nodes)
        if evicted is None:
            return obj, None
        try:
            written = write_status(
                api, namespace, rendezvous_name, {"evictedNodes": evicted}, token=obj["metadata"]["resourceVersion"]
            )
        except ConflictError:
            if on_conflict is not None:
                on_conflict()
            raise
        return written, evicted

    def answered() -> tuple[dict[str, Any], list[str] | None]:
        """``attempt``, sent again (read first) while the server gives no clear answer, until ``deadline``."""
        return retry(
            OUTAGE_RETRY,
            attempt,
            retryable=lambda exc: (
                isinstance(exc, KubernetesApiError) and not isinstance(exc, ConflictError) and exc.transient
            ),
            deadline=deadline,
            what=f"an eviction write to {where}",
            wait_at_least=retry_after_of,
        )

    return retry(
        EVICTION_CONFLICT_RETRY,
        answered,
        retryable=lambda exc: isinstance(exc, ConflictError),
        deadline=math.inf,  # the policy's attempts bound it
        what=f"an eviction compare-and-swap on {where}",
    )


__all__ = ["add_evictions", "write_status"]
