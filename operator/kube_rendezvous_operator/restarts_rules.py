"""What the restart rule decides, as pure functions: when a container of a training pod restarted, which of
its pod's nodes died with it, and which judged restarts to keep.

Nothing here does I/O; ``restarts`` reads the pod events and the Leases and evicts what it decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import (
    RendezvousDocument,
    parse_time,
)

from .pods_rules import known_nodes, nodes_of_pod

#: node has expired anyway, and every event of the pod would re-read the Leases for nothing).
RESTART_EVICTION_WINDOW = timedelta(minutes=5)


def container_restarted_at(pod: dict[str, Any], now: datetime) -> datetime | None:
    """When a container of ``pod`` that the kubelet restarted last ended (``lastState.terminated``), if
    that was within ``RESTART_EVICTION_WINDOW``: an agent that ran in it before is dead since then.

    Not guaranteed: which container ran the agent. A sidecar's restart counts too; the heartbeat check
    of ``nodes_of_pod`` (``gone_at``) keeps a live agent from eviction all the same.
    """
    ended = [
        parse_time(terminated["finishedAt"])
        for item in (pod.get("status") or {}).get("containerStatuses") or []
        if item.get("restartCount")
        and (terminated := (item.get("lastState") or {}).get("terminated"))
        and terminated.get("finishedAt")
    ]
    latest = max(ended, default=None)
    return latest if latest is not None and now - latest <= RESTART_EVICTION_WINDOW else None


def nodes_of_restart(
    pod: dict[str, Any], stored: RendezvousDocument, document: RendezvousDocument, restarted_at: datetime
) -> list[str]:
    """The nodes of ``pod`` whose agent died when the kubelet restarted its container at ``restarted_at``.

    ``stored`` names the nodes; ``document`` carries their Leases' heartbeats: a node matched by the pod's
    addresses whose last heartbeat is no later than ``restarted_at`` (plus ``HEARTBEAT_SLACK``). A node with
    no heartbeat on record may be the restarted container's new agent: it is never among them.
    """
    matched = nodes_of_pod(pod, known_nodes(stored), document=document, gone_at=restarted_at)
    return [str(node) for node in matched if document.last_heartbeats.get(node) is not None]


def restarts_to_remember(judged: Mapping[str, datetime], now: datetime) -> dict[str, datetime]:
    """The judged restarts (pod uid -> when its container ended) still within ``RESTART_EVICTION_WINDOW``."""
    return {uid: at for uid, at in judged.items() if now - at <= RESTART_EVICTION_WINDOW}
