"""What the lost-node rule decides, as pure functions: which training pods on a NotReady Kubernetes Node are
lost (no agent of theirs heartbeats since), what the ``NodeLost`` Event tells the user to do about them, and,
when the opt-in ``spec.lostNodes.failPodsAfterSeconds`` (or the operator's default) is on, which of them to
mark Failed with a ``DisruptionTarget`` condition, when, and with which status patch.

A kubelet that died never reports its pods: they stay Running (then Terminating, once Kubernetes evicts them
after its 300 s toleration) until the Node is deleted or tainted ``node.kubernetes.io/out-of-service``, and a
Job with a ``podFailurePolicy`` creates a replacement only once the old pod is Failed. Marking the pod Failed
with ``DisruptionTarget`` is what Kubernetes' pod garbage collector does for pods on an out-of-service Node;
the examples' ``podFailurePolicy`` ignores that condition, so the Job replaces the pod and counts nothing. Then,
as the pod garbage collector does too, the pod is deleted at once (no grace: its kubelet is gone): its
ServiceAccount token stops working, so an agent of it that comes back (a partition that heals) can write
nothing, and its kubelet, once back, stops its containers. The Job's finalizer keeps the object until the Job
counted it.

Nothing here does I/O: ``lost_nodes`` feeds it the pods, the state document and the Node's NotReady since,
and posts and patches what it decides. Which pods are on a NotReady Node past its wait is ``not_ready_rules``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import RendezvousDocument, format_time

from .events_rules import RendezvousEvent, listed_names
from .not_ready_rules import not_ready_wait
from .pods_rules import known_nodes, nodes_of_pod

#: The taint that tells Kubernetes a Node is down for good: its pods are force-deleted, their volumes detached.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
#: The Event reason that names the fix for a lost Node's pods (Warning).
NODE_LOST = "NodeLost"
#: The Event reason that says the operator marked a lost Node's pods Failed (Normal).
LOST_PODS_FAILED = "LostPodsFailed"
#: The Event reason that says the operator may not mark a lost Node's pods Failed (Warning).
LOST_PODS_NOT_FAILED = "LostPodsNotFailed"
#: The pod condition the operator adds, as the pod garbage collector does: the Job's podFailurePolicy ignores it.
DISRUPTION_TARGET = "DisruptionTarget"
#: The reason of that condition (the pod garbage collector's is ``DeletionByPodGC``).
DISRUPTION_REASON = "DeletionByKubeRendezvous"
#: The phases a pod never leaves: such a pod is not marked again.
TERMINAL_PHASES = frozenset({"Failed", "Succeeded"})


def marked_by_us(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is Failed with the operator's ``DisruptionTarget`` condition (``failed_status_patch``)."""
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return status.get("phase") == "Failed" and any(
        isinstance(item, Mapping) and item.get("type") == DISRUPTION_TARGET and item.get("reason") == DISRUPTION_REASON
        for item in conditions
    )


def needs_marking(pod: Mapping[str, Any]) -> bool:
    """Whether a due lost pod still needs the status patch (it is not in a terminal phase yet)."""
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def fail_pods_after(spec: Mapping[str, Any], default: float | None) -> timedelta | None:
    """How long after its Node went NotReady a Rendezvous's lost pods are marked Failed; None: never.

    ``spec.lostNodes.failPods`` false turns it off; else ``spec.lostNodes.failPodsAfterSeconds``, else
    ``default`` (the operator's ``--fail-lost-pods-after-seconds``; None: off). Malformed values (the CRD's
    schema refuses them) count as absent.
    """
    lost = spec.get("lostNodes")
    lost = lost if isinstance(lost, Mapping) else {}
    if lost.get("failPods") is False:
        return None
    seconds = lost.get("failPodsAfterSeconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        seconds = default
    return None if seconds is None else timedelta(seconds=seconds)


def fail_wait(after: timedelta, keep_alive_interval: float) -> timedelta:
    """How long after its Node went NotReady a lost pod is marked Failed: ``after``, but never before a live
    agent on that Node had the time to heartbeat past the transition (``not_ready_rules.not_ready_wait``), so
    a pod whose agent still runs (only its kubelet failed) is known alive and never marked."""
    return not_ready_wait(after, keep_alive_interval)


def pod_is_alive(pod: dict[str, Any], document: RendezvousDocument, since: datetime) -> bool:
    """Whether an agent of ``pod`` (on a Node NotReady ``since``) heartbeats after ``since`` plus the slack.

    A pod whose agents are all silent since then, or that has none in the document, is not (it is lost).
    """
    known = known_nodes(document)
    matched = nodes_of_pod(pod, known)
    silent = nodes_of_pod(pod, known, document=document, gone_at=since)
    return len(silent) < len(matched)


def lost_pods(pods: Iterable[dict[str, Any]], document: RendezvousDocument, since: datetime) -> list[dict[str, Any]]:
    """The pods among ``pods`` (all on one Node NotReady ``since``) with no live agent (``pod_is_alive``)."""
    return [pod for pod in pods if not pod_is_alive(pod, document, since)]


def pods_to_fail(
    pods: Iterable[dict[str, Any]],
    not_ready: Mapping[str, datetime],
    now: datetime,
    wait: timedelta,
) -> dict[str, list[dict[str, Any]]]:
    """The pods to mark Failed (and delete) now, by Node: bound to a Node NotReady (``not_ready``: name -> since)
    for ``wait`` (``fail_wait``) or more by ``now``, and either not in a terminal phase yet, or marked Failed by
    the operator (``marked_by_us``) and not deleted yet (a delete that did not go through is tried again). Pods
    Kubernetes is deleting count while not terminal (the taint manager's eviction leaves them Terminating for as
    long as the kubelet is gone); whether their agents are alive is ``lost_pods``'s to say."""
    found: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        since = not_ready.get(node) if isinstance(node, str) else None
        deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
        if since is None or now - since < wait or not (needs_marking(pod) or (marked_by_us(pod) and not deleting)):
            continue
        found.setdefault(str(node), []).append(pod)
    return found


def next_fail_at(not_ready: Mapping[str, datetime], now: datetime, wait: timedelta | None) -> datetime | None:
    """The next moment a NotReady Node's pods become due to be marked Failed (None: none, or off)."""
    if wait is None:
        return None
    return min((since + wait for since in not_ready.values() if since + wait > now), default=None)


def pods_named(pods: Iterable[Mapping[str, Any]]) -> str:
    """``pod a`` or ``pods a, b`` (sorted; the first ``NODES_LISTED``, then how many more)."""
    names = sorted(str((pod.get("metadata") or {}).get("name")) for pod in pods)
    return f"{'pod' if len(names) == 1 else 'pods'} {listed_names(names)}"


def taint_command(node: str) -> str:
    """The command that tells Kubernetes Node ``node`` is down for good."""
    return f"kubectl taint nodes {node} {OUT_OF_SERVICE_TAINT}"


def node_lost_event(
    node: str, status: str, since: datetime, pods: list[dict[str, Any]], fail_after: timedelta | None
) -> RendezvousEvent:
    """``NodeLost``: the Node, its lost pods, the command that frees them and what it does (and, with the
    opt-in on, when the operator marks them Failed itself)."""
    message = (
        f"Kubernetes node {node} is NotReady (Ready={status}) since {format_time(since)} and the agents of "
        f"{pods_named(pods)} on it are silent: its kubelet cannot report them, so they are not marked "
        "Failed and their Job does not replace them (they stay Terminating once evicted). If the machine is down, "
        f"run `{taint_command(node)}`: Kubernetes then force-deletes the pods on it and detaches their volumes, "
        "so the Job can replace them (remove the taint once the machine is back)."
    )
    if fail_after is not None:
        message += (
            f" The operator marks them Failed itself (DisruptionTarget) at "
            f"{format_time(since + fail_after)} (spec.lostNodes.failPodsAfterSeconds)."
        )
    return RendezvousEvent("Warning", NODE_LOST, message, len(pods))


def pods_failed_event(node: str, since: datetime, pods: list[dict[str, Any]]) -> RendezvousEvent:
    """``LostPodsFailed``: the operator marked ``pods`` on lost Node ``node`` Failed, and what follows."""
    message = (
        f"marked {pods_named(pods)} on Kubernetes node {node} (NotReady since {format_time(since)}) "
        f"Failed with condition {DISRUPTION_TARGET} and deleted them, as Kubernetes' pod garbage collector does on an "
        "out-of-service node: a Job whose podFailurePolicy ignores DisruptionTarget replaces them without counting "
        "a failure. If the machine is only partitioned, their containers run on until its kubelet is back and stops "
        "them, but their ServiceAccount tokens no longer work: their agents cannot rejoin or write"
    )
    return RendezvousEvent("Normal", LOST_PODS_FAILED, message, len(pods))


def refused_event(node: str, permission: str) -> RendezvousEvent:
    """``LostPodsNotFailed``: the API server refused to let the operator mark the pods of ``node`` Failed."""
    message = (
        f"could not mark the pods of lost Kubernetes node {node} Failed and delete them: the operator's "
        "ServiceAccount needs "
        f"{permission}; set the chart value operator.lostNodes.failPodsAfterSeconds (it grants it) or apply "
        "docs/operator-rbac-lost-nodes.yaml. Until then, the NodeLost Event names the fix"
    )
    return RendezvousEvent("Warning", LOST_PODS_NOT_FAILED, message)


def failed_status_patch(node: str, since: datetime, now: datetime) -> dict[str, Any]:
    """The strategic merge patch of a lost pod's status: phase Failed and a ``DisruptionTarget`` condition
    (conditions merge by type: the pod's other conditions stay)."""
    condition = {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": DISRUPTION_REASON,
        "message": f"kube-rendezvous: Kubernetes node {node} is NotReady since {format_time(since)}",
        "lastTransitionTime": format_time(now),
    }
    return {"status": {"phase": "Failed", "conditions": [condition]}}
