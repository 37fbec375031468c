"""Which pods are a Rendezvous's training pods, and which rendezvous nodes a pod ran, as pure functions.

Nothing here does I/O; ``pods`` keeps each Rendezvous's pod index with it, and every rule that evicts the
nodes of a pod (``gone_pods``, ``restarts``, ``resync``, ``not_ready``) matches them with ``nodes_of_pod``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import (
    NodeId,
    PodAddresses,
    RendezvousDocument,
    parse_time,
)

#: How much later than its pod's end a node's last heartbeat may be and still be that pod's (clock slack).
HEARTBEAT_SLACK = timedelta(seconds=2)


#: The pod labels a workload's controller sets, by the (API group, kind) of the Rendezvous's owner:
#: label -> which field of the owner it holds ("uid" or "name"), or a fixed value.
WORKLOAD_POD_LABELS: dict[tuple[str, str], dict[str, str]] = {
    ("batch", "Job"): {"batch.kubernetes.io/controller-uid": "uid"},
    ("jobset.x-k8s.io", "JobSet"): {"jobset.sigs.k8s.io/jobset-uid": "uid"},
    ("kubeflow.org", "PyTorchJob"): {
        "training.kubeflow.org/job-name": "name",
        "training.kubeflow.org/operator-name": "=pytorchjob-controller",
    },
    # Kubeflow Trainer runs a TrainJob as a JobSet of the same name.
    ("trainer.kubeflow.org", "TrainJob"): {"jobset.sigs.k8s.io/jobset-name": "name"},
}


@dataclass(frozen=True)
class PodSelector:
    """Which pods are a Rendezvous's training pods, and where that choice came from.

    A pod belongs to the Rendezvous when its labels contain every label of ``match_labels``
    or when it carries ``kube-rendezvous.io/rendezvous: <name>`` (always honoured).
    """

    match_labels: dict[str, str]
    #: Where ``match_labels`` came from: ``spec.podSelector``, ``owner <Kind> <name>``, or ``default``.
    source: str

    def describe(self) -> str:
        """The selector as ``kubectl get pods -l`` takes it."""
        return ",".join(f"{key}={value}" for key, value in sorted(self.match_labels.items()))


def _controller(owner_references: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The owner reference marked ``controller: true``, else the first one of a known workload kind."""
    owners = list(owner_references)
    controller = next((owner for owner in owners if owner.get("controller")), None)
    if controller is not None:
        return controller
    return next((owner for owner in owners if _workload_key(owner) in WORKLOAD_POD_LABELS), None)


def _workload_key(owner: dict[str, Any]) -> tuple[str, str]:
    api_version = str(owner.get("apiVersion") or "")
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return group, str(owner.get("kind") or "")


def pod_selector(name: str, spec: dict[str, Any], metadata: dict[str, Any], label: str) -> PodSelector:
    """The training pods of Rendezvous ``name``: ``spec.podSelector``, else its owner's pods, else ``label``.

    - ``spec.podSelector.matchLabels``, when it is set and not empty;
    - else, when the Rendezvous's controller (its ``ownerReferences``) is a Job, a JobSet, a
      PyTorchJob or a TrainJob, the labels that workload's controller puts on its pods
      (``WORKLOAD_POD_LABELS``);
    - else ``{label: name}``: pods labelled ``kube-rendezvous.io/rendezvous: <name>``.

    Not guaranteed: an owner of another kind falls back to the label; labels are matched as
    given (no ``matchExpressions``).
    """
    labels = dict(((spec.get("podSelector") or {}).get("matchLabels")) or {})
    if labels:
        return PodSelector(labels, "spec.podSelector")
    owner = _controller(metadata.get("ownerReferences") or [])
    shape = WORKLOAD_POD_LABELS.get(_workload_key(owner)) if owner is not None else None
    if owner is not None and shape is not None:
        derived = {
            key: field[1:] if field.startswith("=") else str(owner.get(field) or "") for key, field in shape.items()
        }
        if all(derived.values()):
            return PodSelector(derived, f"owner {owner.get('kind')} {owner.get('name')}")
    return PodSelector({label: name}, "default")


def selects(selector: PodSelector, labels: dict[str, str] | None) -> bool:
    """Whether a pod with ``labels`` is selected by ``selector``'s labels."""
    found = labels or {}
    return all(found.get(key) == value for key, value in selector.match_labels.items())


def rendezvouses_of_pod(labels: dict[str, str] | None, selectors: dict[str, PodSelector], label: str) -> list[str]:
    """The Rendezvous names (of one namespace, with their ``selectors``) that a pod with ``labels`` belongs to.

    A pod labelled ``label: <name>`` belongs to ``<name>`` even when that Rendezvous has not been
    seen yet; otherwise every Rendezvous whose selector selects the pod.
    """
    found = labels or {}
    named = found.get(label)
    matched = {name for name, selector in selectors.items() if selects(selector, found)}
    if named:
        matched.add(named)
    return sorted(matched)


def why_gone(pod: dict[str, Any], event_type: str | None) -> str | None:
    """Why a training pod can no longer run its agent, as the Events say it after the pod's name ("pod X is
    gone"); None while it can. Deleted or terminating: "is gone"; ended: "is Failed" or "is Succeeded"; every
    container ended in a pod that is not (a restart in place, or restartPolicy restarting them): "has no running
    container", since its containers come back as new agents, not as the ones evicted."""
    if event_type == "DELETED" or pod.get("metadata", {}).get("deletionTimestamp"):
        return "is gone"
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"is {status['phase']}"
    containers = status.get("containerStatuses") or []
    if containers and all((item.get("state") or {}).get("terminated") for item in containers):
        return "has no running container (they ended; restarted, they start new agents)"
    return None


def pod_is_gone(pod: dict[str, Any], event_type: str | None) -> bool:
    """Whether a training pod can no longer run its agent: deleted, terminating or all containers ended."""
    return why_gone(pod, event_type) is not None


def pod_gone_at(pod: dict[str, Any], now: datetime) -> datetime:
    """When ``pod`` stopped being trusted to run its agent: when its deletion was requested, else its
    containers' last finish, else ``now``.

    A heartbeat later than this (``nodes_of_pod``) is another pod's. The deletion request time is
    ``deletionTimestamp`` minus ``deletionGracePeriodSeconds``: the timestamp is when the kubelet must have
    stopped the pod (request plus grace), not when it was told to stop; a newer pod may reuse its address
    long before that.
    """
    metadata, status = pod.get("metadata", {}), pod.get("status") or {}
    if metadata.get("deletionTimestamp"):
        grace = timedelta(seconds=int(metadata.get("deletionGracePeriodSeconds") or 0))
        return parse_time(metadata["deletionTimestamp"]) - grace
    finished = [
        parse_time(terminated["finishedAt"])
        for item in status.get("containerStatuses") or []
        if (terminated := (item.get("state") or {}).get("terminated")) and terminated.get("finishedAt")
    ]
    return max(finished) if finished else now


def pod_addresses(pod: dict[str, Any]) -> PodAddresses:
    """The addresses an agent in ``pod`` may register under: its IPs, name and hostname."""
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec") or {}, pod.get("status") or {}
    names = frozenset({metadata.get("name"), spec.get("hostname")} - {None, ""})
    addresses = frozenset({status.get("podIP")} | {item.get("ip") for item in status.get("podIPs") or []}) - {None, ""}
    return PodAddresses(addresses, names)  # type: ignore[arg-type]  # None and "" removed


def nodes_of_pod(
    pod: dict[str, Any],
    nodes: Iterable[NodeId],
    *,
    document: RendezvousDocument | None = None,
    gone_at: datetime | None = None,
) -> list[NodeId]:
    """The rendezvous nodes an agent in ``pod`` registered, matched by pod IP, name or hostname.

    With ``document`` and ``gone_at``, a matched node whose last heartbeat is later than
    ``gone_at`` (plus ``HEARTBEAT_SLACK`` for clocks) is left out: it is alive, so it belongs to
    another pod that reused the address or the hostname (a replacement, or a new pod that got a
    dead pod's IP), and must never be evicted for this pod's end.
    """
    addresses = pod_addresses(pod)
    matched = [node for node in nodes if addresses.ran(node)]
    if document is None or gone_at is None:
        return matched
    return [
        node
        for node in matched
        if (beat := document.last_heartbeats.get(node)) is None or beat <= gone_at + HEARTBEAT_SLACK
    ]


def known_nodes(document: RendezvousDocument | None) -> list[NodeId]:
    """Every node the document names: participants, waiting, redundant and heartbeat-only nodes."""
    return [] if document is None else document.nodes()


def live_agents(document: RendezvousDocument | None, now: datetime, expiry: timedelta) -> list[str]:
    """Nodes whose last heartbeat is within ``expiry`` of ``now`` (agents' clocks; not fenced)."""
    if document is None or document.closed:
        return []
    return sorted(str(node) for node, beat in document.last_heartbeats.items() if now - beat <= expiry)
