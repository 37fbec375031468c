"""The Kopf handlers: the operator's I/O edge. Decisions live in ``logic``.

The operator is never in the data path. It watches Rendezvous objects and the training pods,
posts Events, keeps ``status.conditions`` current, evicts nodes whose pod is gone (by adding
them to ``status.evictedNodes``, which the agents fold into the state), holds a deleted
Rendezvous until its agents have closed, and deletes closed ones after their TTL. It writes to
a Rendezvous only when a condition changes or a node is evicted: never per heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import datetime, timezone
from typing import Any

import kopf
from kube_rendezvous.kubeapi import (
    GROUP,
    RENDEZVOUS_PLURAL,
    VERSION,
    ApiError,
    ApiUnavailableError,
    KubernetesApi,
    load_api_client,
    resource_path,
)

from . import logic, metrics

logger = logging.getLogger(__name__)

FINALIZER = "kube-rendezvous.io/close-before-delete"
POD_LABEL = "kube-rendezvous.io/rendezvous"
MERGE_PATCH = "application/merge-patch+json"

#: The last readable summary seen per (namespace, name); the operator's only memory.
SUMMARIES: dict[tuple[str, str], dict[str, Any]] = {}
_API: KubernetesApi | None = None


def api() -> KubernetesApi:
    """The API client, made on first use from in-cluster credentials or the kubeconfig."""
    global _API
    if _API is None:
        client, _ = load_api_client(os.environ.get("KUBECONFIG") or None, None)
        _API = KubernetesApi(client, request_timeout=15)
    return _API


def patch_status(namespace: str, name: str, status: dict[str, Any], kind: str) -> None:
    """Merge-patch the Rendezvous status (no resourceVersion: the server applies it at the latest)."""
    path = resource_path(RENDEZVOUS_PLURAL, namespace, name, "status")
    try:
        api().request("PATCH", path, body={"status": status}, content_type=MERGE_PATCH)
        metrics.OPERATOR_WRITES.labels(kind=kind).inc()
    except (ApiError, ApiUnavailableError) as exc:
        metrics.RECONCILE_ERRORS.labels(handler=kind).inc()
        raise kopf.TemporaryError(f"could not write status ({kind}) of {namespace}/{name}: {exc}", delay=2) from exc


def update_condition(
    namespace: str,
    name: str,
    current: dict[str, Any],
    generation: int | None,
    kind: str,
    *,
    condition: tuple[str, str, str, str],
) -> None:
    """Write one condition ``(type, status, reason, message)`` if it changed."""
    condition_type, condition_status, reason, message = condition
    conditions = logic.set_condition(
        list(current.get("conditions") or []),
        condition_type,
        condition_status,
        reason,
        message,
        generation,
        datetime.now(timezone.utc),
    )
    if conditions is not None:
        patch_status(namespace, name, {"conditions": conditions, "observedGeneration": generation}, kind)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep Kopf's own writes rare and under our names; serve metrics."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kube-rendezvous.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kube-rendezvous.io", key="last-handled-spec"
    )
    settings.posting.level = logging.WARNING  # handler logs stay logs; Events are the ones we post
    settings.watching.server_timeout = 300
    if os.environ.get("KUBE_RENDEZVOUS_WATCH_NAMESPACES"):
        # Named namespaces only: do not scan (list) namespaces, which namespaced RBAC forbids.
        settings.scanning.disabled = True
    metrics.serve(int(os.environ.get("METRICS_PORT", "9090")))


@kopf.on.resume(GROUP, VERSION, RENDEZVOUS_PLURAL)
@kopf.on.create(GROUP, VERSION, RENDEZVOUS_PLURAL)
@kopf.on.update(GROUP, VERSION, RENDEZVOUS_PLURAL, field="spec")
def reconcile_spec(
    spec: dict[str, Any], status: dict[str, Any], meta: dict[str, Any], namespace: str, name: str, reason: str, **_: Any
) -> None:
    """Post Ready=Unknown on first sight, then Ready=True/False from the spec; keep observedGeneration."""
    generation = meta.get("generation")
    if not status.get("conditions"):
        update_condition(
            namespace,
            name,
            status,
            generation,
            "ready-unknown",
            condition=("Ready", "Unknown", "Validating", "the operator is checking the spec"),
        )
        status = {
            **status,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "Validating",
                    "message": "the operator is checking the spec",
                    "observedGeneration": generation,
                }
            ],
        }
    problems = logic.spec_problems(spec)
    check = logic.check_stored_state((status or {}).get("state"))
    if problems:
        ready = ("Ready", "False", "InvalidSpec", "; ".join(problems))
    elif not check.ok:
        ready = ("Ready", "False", check.reason, check.message)
    else:
        ready = ("Ready", "True", "Valid", "the spec is valid; agents rendezvous through this object")
    update_condition(namespace, name, status, generation, "ready", condition=ready)


@kopf.on.event(GROUP, VERSION, RENDEZVOUS_PLURAL)
def observe_rendezvous(
    type: str | None,
    body: kopf.Body,
    spec: dict[str, Any],
    status: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    name: str,
    **_: Any,
) -> None:
    """Turn summary changes into Events and metrics; flag a corrupt or hostile state. Writes only on a change."""
    key = (namespace, name)
    if type == "DELETED":
        SUMMARIES.pop(key, None)
        metrics.forget(namespace, name)
        return
    status = dict(status or {})
    previous = SUMMARIES.get(key)
    SUMMARIES[key] = status
    metrics.observe(namespace, name, status)
    for event in logic.summary_events(previous, status):
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        metrics.count_event(event.reason, namespace, name)
    if previous is None or previous.get("state") != status.get("state"):
        check = logic.check_stored_state(status.get("state"))
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if not check.ok:
            if ready is None or ready.get("reason") != check.reason:
                kopf.event(body, type="Warning", reason=check.reason, message=check.message)
                update_condition(
                    namespace,
                    name,
                    status,
                    meta.get("generation"),
                    "state-check",
                    condition=("Ready", "False", check.reason, check.message),
                )
        elif (
            ready is not None
            and ready.get("reason") in ("StateCorrupt", "HostileState")
            and not logic.spec_problems(spec)
        ):
            update_condition(
                namespace,
                name,
                status,
                meta.get("generation"),
                "state-check",
                condition=("Ready", "True", "Valid", "the state is valid again"),
            )
    if status.get("closed"):
        closed = next((c for c in status.get("conditions") or [] if c.get("type") == "Closed"), None)
        if closed is None or closed.get("status") != "True":
            update_condition(
                namespace,
                name,
                status,
                meta.get("generation"),
                "closed",
                condition=("Closed", "True", "Closed", f"closed in round {status.get('round')}"),
            )


@kopf.on.event("", "v1", "pods", labels={POD_LABEL: kopf.PRESENT})
def evict_nodes_of_gone_pods(type: str | None, body: kopf.Body, namespace: str, **_: Any) -> None:
    """When a training pod is deleted or its containers ended, evict its nodes from its rendezvous."""
    pod = dict(body)
    if not logic.pod_is_gone(pod, type):
        return
    rendezvous = pod["metadata"].get("labels", {}).get(POD_LABEL)
    status = SUMMARIES.get((namespace, rendezvous))
    if status is None or status.get("closed"):
        return
    nodes = logic.nodes_of_pod(pod, logic.known_nodes(status))
    evicted = logic.with_evicted(status, nodes)
    if evicted is None:
        return
    patch_status(namespace, rendezvous, {"evictedNodes": evicted}, "evict")
    status["evictedNodes"] = evicted
    metrics.EVICTIONS.labels(namespace=namespace, name=rendezvous).inc(len(nodes))
    pod_name = pod["metadata"]["name"]
    logger.info("evicted %s of pod %s/%s from rendezvous %s", nodes, namespace, pod_name, rendezvous)
    try:
        rdzv_body = api().request("GET", resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous))
        kopf.event(
            kopf.Body(rdzv_body),
            type="Normal",
            reason="NodeEvicted",
            message=f"evicted {', '.join(nodes)}: pod {pod_name} is gone",
        )
    except (ApiError, ApiUnavailableError) as exc:
        logger.warning("could not post the NodeEvicted event: %s", exc)


@kopf.on.delete(GROUP, VERSION, RENDEZVOUS_PLURAL)
def close_before_delete(spec: dict[str, Any], status: dict[str, Any], meta: dict[str, Any], **_: Any) -> None:
    """Hold a deleted Rendezvous until its agents have closed it (they fold the deletion into the state)."""
    now = datetime.now(timezone.utc)
    alive = logic.live_agents(status or {}, now, logic.heartbeat_expiry(spec))
    if not alive:
        return
    deleted = datetime.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    patience = spec.get("closeTimeoutSeconds") or 30
    if (now - deleted).total_seconds() > patience:
        logger.warning("agents %s did not close within %s s; letting the Rendezvous go", alive, patience)
        return
    raise kopf.TemporaryError(f"waiting for {len(alive)} live agents to close the rendezvous", delay=1)


@kopf.daemon(
    GROUP,
    VERSION,
    RENDEZVOUS_PLURAL,
    cancellation_timeout=5,
    when=lambda spec, **_: spec.get("ttlSecondsAfterClosed") is not None,
)
async def delete_after_ttl(spec: dict[str, Any], namespace: str, name: str, stopped: Any, **_: Any) -> None:
    """Delete a closed Rendezvous ``spec.ttlSecondsAfterClosed`` seconds after its last change."""
    ttl = int(spec["ttlSecondsAfterClosed"])
    while not stopped:
        status = SUMMARIES.get((namespace, name)) or {}
        if status.get("closed") and status.get("lastChangeTime"):
            changed = datetime.strptime(status["lastChangeTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
            remaining = ttl - (datetime.now(timezone.utc) - changed).total_seconds()
            if remaining <= 0:
                await asyncio.to_thread(api().request, "DELETE", resource_path(RENDEZVOUS_PLURAL, namespace, name))
                logger.info("deleted closed Rendezvous %s/%s after its TTL of %d s", namespace, name, ttl)
                return
            await asyncio.sleep(min(remaining, 5))
        else:
            await asyncio.sleep(2)
