"""What a resync decides, as pure functions: which nodes to evict given every training pod listed now.

Nothing here does I/O; ``resync`` lists the pods and evicts what it decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kube_rendezvous import (
    NodeId,
    RendezvousDocument,
)

from .pods_rules import known_nodes, nodes_of_pod, pod_gone_at, pod_is_gone


def nodes_to_evict_on_resync(
    document: RendezvousDocument, pods: Iterable[dict[str, Any]], now: datetime
) -> list[NodeId]:
    """The nodes a resync evicts, given every training pod of the rendezvous that exists now.

    The pod watch misses what happened while the operator was down or its watch was broken: a
    pod deleted then is simply absent from the list, and one that ended is listed as ended. So:

    - the nodes of every listed pod that is gone (``pod_is_gone``), exactly as the pod watch
      matches them (``nodes_of_pod`` with the document and the pod's end, so a live node that
      reuses its address is never taken for it);
    - the nodes that match no listed pod at all, but only while at least one node matches a
      running pod: then the job's agents are recognised by their pods' addresses, and a node
      without a pod is one whose pod was deleted. When no node matches a running pod (pods not
      labelled, or ``--local-addr`` not the pod's IP, name or hostname), nothing is evicted for
      being pod-less.
    """
    known = known_nodes(document)
    listed = list(pods)
    evicted: set[NodeId] = set()
    matched: set[NodeId] = set()
    running_matched = False
    for pod in listed:
        of_pod = nodes_of_pod(pod, known)
        matched.update(of_pod)
        if pod_is_gone(pod, None):
            evicted.update(nodes_of_pod(pod, known, document=document, gone_at=pod_gone_at(pod, now)))
        elif of_pod:
            running_matched = True
    if running_matched:
        evicted.update(node for node in known if node not in matched)
    return sorted(evicted, key=str)
