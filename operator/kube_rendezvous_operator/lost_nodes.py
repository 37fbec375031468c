"""The lost-node rule: tell the fix for the pods of a lost Kubernetes Node (``NodeLost``) and, opt-in, mark them
Failed with a ``DisruptionTarget`` condition so their Job replaces them (``LostPodsFailed``).

Its decisions are ``lost_nodes_rules``'s. The NotReady-node rule (``not_ready.evict_on_not_ready``, from its
task and every resync) calls it with the pods on each NotReady Node, the state document with its heartbeats and
the Nodes' NotReady since: ``tell_node_lost`` when it judges a Node past its wait, ``fail_lost_pods`` each time.

``NodeLost`` is posted once per Node outage (Node and NotReady since) per Rendezvous: a restarted operator or
a new leader finds it among the Rendezvous's Events and does not repeat it. A pod is marked Failed through
the pods/status subresource, then deleted at once, as Kubernetes' pod garbage collector does, so that its
ServiceAccount token stops working (a fenced pod's agent cannot rejoin when its machine comes back): the two
permissions this adds, granted by the chart only when it is on. Without them the operator posts one
``LostPodsNotFailed`` Warning naming them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import (
    ConflictError,
    ForbiddenError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    RendezvousDocument,
)

from . import conditions_rules, events, events_rules, lost_nodes_rules
from .memory import Key, OperatorMemo
from .nodes import NotReady

logger = logging.getLogger(__name__)

#: The content type of a strategic merge patch: the pod's conditions merge by type (the others stay).
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
#: What the operator's ServiceAccount needs to mark pods Failed and delete them (the chart's
#: operator.lostNodes.failPodsAfterSeconds).
PERMISSION = "patch on pods/status and delete on pods (core API group)"


def tell(memo: OperatorMemo, key: Key, event: events_rules.RendezvousEvent, pods: Iterable[dict[str, Any]]) -> bool:
    """Post ``event`` on Rendezvous ``key`` once (``events.post_on_rendezvous``) and, if posted, on each of ``pods``."""
    if not events.post_on_rendezvous(memo.api, *key, event, once=True):
        return False
    events.post_on_related([events_rules.pod_reference(pod) for pod in pods], event)
    return True


def fail_wait(memo: OperatorMemo, key: Key) -> timedelta | None:
    """How long after its Node went NotReady a lost pod of ``key`` is marked Failed; None: never."""
    record = memo.get(key)
    after = record.fail_pods_after if record is not None else None
    if after is None or record is None:
        return None
    keep_alive = record.keep_alive
    default = conditions_rules.timings({}).keep_alive_interval
    return lost_nodes_rules.fail_wait(after, default if keep_alive is None else keep_alive)


def tell_node_lost(
    memo: OperatorMemo,
    key: Key,
    node: str,
    state: NotReady,
    on_node: list[dict[str, Any]],
    document: RendezvousDocument,
) -> None:
    """``NodeLost`` on Rendezvous ``key`` and its lost pods among ``on_node`` (on ``node``, NotReady past its wait)."""
    lost = lost_nodes_rules.lost_pods(on_node, document, state.since)
    record = memo.get(key)
    if not lost or record is None:
        return
    told = (node, state.since)
    with memo.lock:
        if told in record.node_lost_told:
            return
        record.node_lost_told.add(told)
    event = lost_nodes_rules.node_lost_event(node, state.status, state.since, lost, fail_wait(memo, key))
    if tell(memo, key, event, lost):
        logger.warning("rendezvous %s/%s: %s", *key, event.message)


def mark_failed(client: KubernetesApi, pod: Mapping[str, Any], node: str, since: datetime, now: datetime) -> bool:
    """Patch ``pod``'s status to phase Failed with a ``DisruptionTarget`` condition; whether it was marked.

    The patch names the pod's uid, so a newer pod of that name is never marked (the server refuses the change).

    Raises:
        ForbiddenError: the operator may not patch pods/status (``PERMISSION``).
    """
    meta = pod.get("metadata") or {}
    patch = lost_nodes_rules.failed_status_patch(node, since, now)
    patch["metadata"] = {"uid": meta.get("uid")}
    path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}/status"
    try:
        client.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH)
    except NotFoundError:
        return False  # gone already: nothing left to replace
    except ForbiddenError:
        raise
    except KubernetesApiError as exc:
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        logger.warning("could not mark pod %s Failed (the next judgement tries again): %s", name, exc)
        return False
    return True


def delete_failed(client: KubernetesApi, pod: Mapping[str, Any]) -> bool:
    """Delete ``pod`` at once (no grace: its kubelet is gone), naming its uid; whether the delete went through.

    As the pod garbage collector does after marking a pod of an out-of-service Node Failed: the pod's bound
    ServiceAccount token stops working with it, and its kubelet, once back, stops its containers.

    Raises:
        ForbiddenError: the operator may not delete pods (``PERMISSION``).
    """
    meta = pod.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": meta.get("uid")},
    }
    try:
        client.request("DELETE", f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}", body=body)
    except (NotFoundError, ConflictError):
        return True  # gone already, or a newer pod of that name: this one is gone
    except ForbiddenError:
        raise
    except KubernetesApiError as exc:
        logger.warning("could not delete pod %s (the next judgement tries again): %s", name, exc)
        return False
    return True


def fail_lost_pods(
    memo: OperatorMemo,
    key: Key,
    pods: Iterable[dict[str, Any]],
    document: RendezvousDocument,
    states: Mapping[str, NotReady],
    now: datetime,
) -> None:
    """Mark Failed the lost pods of ``key`` among ``pods`` on the NotReady Nodes ``states`` whose wait ended.

    ``document`` must carry the nodes' current heartbeats: a pod with a live agent is never marked.
    """
    wait = fail_wait(memo, key)
    if wait is None:
        return
    due = lost_nodes_rules.pods_to_fail(pods, {node: state.since for node, state in states.items()}, now, wait)
    for node, on_node in sorted(due.items()):
        state = states[node]
        lost = lost_nodes_rules.lost_pods(on_node, document, state.since)
        try:
            failed = [
                pod
                for pod in lost
                if (not lost_nodes_rules.needs_marking(pod) or mark_failed(memo.api, pod, node, state.since, now))
                and delete_failed(memo.api, pod)
            ]
        except ForbiddenError as exc:
            refused = lost_nodes_rules.refused_event(node, PERMISSION)
            logger.warning("rendezvous %s/%s: %s: %s", *key, refused.message, exc)
            events.post_on_rendezvous(memo.api, *key, refused, once=True)
            return
        if failed:
            event = lost_nodes_rules.pods_failed_event(node, state.since, failed)
            logger.info("rendezvous %s/%s: %s", *key, event.message)
            tell(memo, key, event, failed)


def fail_due(
    memo: OperatorMemo, key: Key, pods: Iterable[dict[str, Any]], since: Mapping[str, datetime], now: datetime
) -> tuple[list[str], datetime | None]:
    """The NotReady Nodes (``since``: name -> NotReady since) with pods of ``key`` to mark Failed now, and when
    the next Node's wait ends (None: none, or the rule is off for ``key``)."""
    wait = fail_wait(memo, key)
    if wait is None:
        return [], None
    due = lost_nodes_rules.pods_to_fail(pods, since, now, wait)
    return sorted(due), lost_nodes_rules.next_fail_at(since, now, wait)
