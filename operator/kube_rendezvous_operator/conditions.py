"""The conditions rule: keep a Rendezvous's ``status.conditions`` (Ready, Progressing, Closed) and
``observedGeneration`` current, writing only when one changes. Its decisions are ``conditions_rules``'s.

``reconcile_spec`` is Kopf's handler for a Rendezvous's spec (created, resumed, changed); ``update_conditions``
and ``patch_status`` are this rule's writes, which ``events.observe_rendezvous`` uses as the state moves
(a round forms, completes, breaks; an invalid state) and for the Closed condition.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import kopf
from kube_rendezvous import (
    ApiError,
    ForbiddenError,
    InvalidError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    write_status,
)

from . import conditions_rules, metrics
from .memory import OperatorMemo, stored_state

logger = logging.getLogger(__name__)

#: Seconds before Kopf runs a handler again after a status write that may succeed later (throttled, unready,
#: unreachable): Kopf's own retry of the handler, not a loop of ours.
STATUS_WRITE_RETRY_SECONDS = 2


def patch_status(client: KubernetesApi, namespace: str, name: str, status: dict[str, Any], kind: str) -> bool:
    """Merge-patch the Rendezvous status (no resourceVersion: the server applies it at the latest).

    Returns False when the Rendezvous is gone (nothing to write to).

    Raises:
        kopf.PermanentError: the server refused the write for good (forbidden, invalid).
        kopf.TemporaryError: it may succeed later (throttled, unready, unreachable).
    """
    what = f"status ({kind}) of {namespace}/{name}"
    try:
        write_status(client, namespace, name, status)
    except NotFoundError:
        logger.info("did not write the %s: the Rendezvous is gone", what)
        return False
    except (ForbiddenError, InvalidError) as exc:
        metrics.RECONCILE_ERRORS.labels(handler=kind).inc()
        if exc.transient:
            raise kopf.TemporaryError(f"could not write the {what}: {exc}", delay=STATUS_WRITE_RETRY_SECONDS) from exc
        raise kopf.PermanentError(f"the API server refused to write the {what}: {exc}") from exc
    except KubernetesApiError as exc:
        metrics.RECONCILE_ERRORS.labels(handler=kind).inc()
        after = (exc.retry_after or 0.0) if isinstance(exc, ApiError) else 0.0  # a 429's Retry-After, honoured
        raise kopf.TemporaryError(
            f"could not write the {what}: {exc}", delay=max(STATUS_WRITE_RETRY_SECONDS, after)
        ) from exc
    metrics.OPERATOR_WRITES.labels(kind=kind).inc()
    return True


def update_conditions(
    client: KubernetesApi,
    namespace: str,
    name: str,
    current: dict[str, Any],
    generation: int | None,
    kind: str,
    *,
    conditions: list[conditions_rules.Condition],
    also: dict[str, Any] | None = None,
) -> None:
    """Write the ``conditions`` ``(type, status, reason, message)`` that changed, in one write with ``also``."""
    now = datetime.now(timezone.utc)
    written = list(current.get("conditions") or [])
    changed = False
    for condition_type, condition_status, reason, message in conditions:
        updated = conditions_rules.set_condition(
            written, condition_type, condition_status, reason, message, generation, now
        )
        if updated is not None:
            written, changed = updated, True
    if changed:
        fields = {"conditions": written, "observedGeneration": generation, **(also or {})}
        patch_status(client, namespace, name, fields, kind)


def reconcile_spec(
    spec: dict[str, Any],
    status: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Post Ready=Unknown on first sight, then Ready and Progressing from the spec, the state and the status
    (``conditions_rules.job_conditions``); keep observedGeneration."""
    generation = meta.get("generation")
    status = dict(status or {})
    if not status.get("conditions"):
        update_conditions(
            memo.api,
            namespace,
            name,
            status,
            generation,
            "ready-unknown",
            conditions=[("Ready", "Unknown", "Validating", "the operator is checking the spec")],
            # MIN/MAX (kubectl get rdzv) show status.minNodes/maxNodes: what the agents follow, the spec until a fold.
            also=conditions_rules.nodes_until_folded(spec, status),
        )
        status["conditions"] = [
            {
                "type": "Ready",
                "status": "Unknown",
                "reason": "Validating",
                "message": "the operator is checking the spec",
                "observedGeneration": generation,
            }
        ]
    stored = stored_state(memo, (namespace, name), status.get("state"))
    wanted = conditions_rules.job_conditions(spec, conditions_rules.check_state(stored), status, stored.document)
    update_conditions(memo.api, namespace, name, status, generation, "ready", conditions=wanted)
