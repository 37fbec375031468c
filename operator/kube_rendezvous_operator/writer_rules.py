"""What the operator's folder is given, as pure functions: the census of a Rendezvous's training pods, and
its state document with the heartbeats read from the nodes' Leases.

Nothing here does I/O; ``writer`` runs the folder and reads the Leases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from kube_rendezvous import (
    NodeFacts,
    NodeId,
    PlacementSpec,
    PodAddresses,
    RendezvousDocument,
    TrainingPods,
    placement_of,
)

from .pods_rules import pod_addresses, pod_is_gone


def training_pods(
    pods: Iterable[dict[str, Any]],
    nodes: Mapping[str, NodeFacts] | None = None,
    placement: PlacementSpec | None = None,
) -> TrainingPods:
    """The census the folder completes a round by (``folder_rules.TrainingPods``) from a Rendezvous's training pods.

    With ``nodes`` (the Kubernetes Nodes, when the operator may read them) and ``placement`` (the Rendezvous's
    spec), each live pod carries its ``Placement``: its Node's domain and whether that Node admits it.
    """
    placed = nodes is not None and placement is not None
    live: list[PodAddresses] = []
    starting = 0
    for pod in pods:
        if pod_is_gone(pod, None):
            continue
        addresses = pod_addresses(pod)
        if (pod.get("status") or {}).get("phase") == "Running" and addresses.addresses:
            facts = nodes.get(str((pod.get("spec") or {}).get("nodeName"))) if nodes is not None else None
            if facts is not None and placement is not None:
                tolerations = (pod.get("spec") or {}).get("tolerations") or []
                addresses = dataclasses.replace(addresses, placement=placement_of(facts, placement, tolerations))
            live.append(addresses)
        else:
            starting += 1
    return TrainingPods(tuple(live), starting, placed)


def merge_heartbeats(
    document: RendezvousDocument, beats: dict[NodeId, datetime], *, every_node: bool = False
) -> RendezvousDocument:
    """``document`` with the heartbeats of ``beats`` (from ``heartbeats``).

    For the participants and the nodes the document has a heartbeat of; with ``every_node``, for
    every node the document names (waiting ones included), so that none is taken for silent.
    """
    if not beats:
        return document
    merged = dict(document.last_heartbeats)
    wanted = set(document.nodes()) if every_node else set(merged) | set(document.participants)
    merged.update({node: beat for node, beat in beats.items() if node in wanted})
    return dataclasses.replace(document, last_heartbeats=merged)
