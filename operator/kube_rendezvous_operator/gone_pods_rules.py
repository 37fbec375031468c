"""What the gone-pod rule decides, as pure functions: which rendezvous nodes a gone training pod ran.

Nothing here does I/O; ``gone_pods`` watches the pods, reads the Leases and evicts what it decides.
Whether a pod is gone, and since when, is ``pods_rules``'s (``pod_is_gone``, ``pod_gone_at``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kube_rendezvous import NodeId, RendezvousDocument

from .pods_rules import known_nodes, nodes_of_pod, pod_gone_at


def nodes_of_gone_pod(
    pod: dict[str, Any], stored: RendezvousDocument, document: RendezvousDocument | None, now: datetime
) -> tuple[list[NodeId], list[NodeId]]:
    """(to evict, alive) among the nodes of ``stored`` that the gone ``pod`` ran, matched by its addresses.

    With ``document`` (``stored`` with its Leases' heartbeats), a node that heartbeats after the pod's end
    (``pod_gone_at``, ``now`` when it tells none) is alive: another pod's that reused the address; it is listed
    as such, never evicted.
    """
    known = known_nodes(stored)
    matched = nodes_of_pod(pod, known, document=document, gone_at=pod_gone_at(pod, now))
    alive = sorted(set(nodes_of_pod(pod, known)) - set(matched))
    return matched, alive
