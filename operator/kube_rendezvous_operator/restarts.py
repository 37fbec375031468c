"""The restart rule: when the kubelet restarted a container of a training pod, evict the nodes whose agent
died with it (their Lease's last heartbeat is older than the restart), once per restart.

Its decisions are ``restarts_rules``'s; it reads the nodes' heartbeats from their Leases (``writer.heartbeats``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import kopf
from kube_rendezvous import KubernetesApiError, format_time, with_evicted

from . import pods_rules, restarts_rules
from .evictions import evict_and_report, open_document
from .memory import OperatorMemo
from .pods import rendezvouses_of_pod
from .writer import heartbeats
from .writer_rules import merge_heartbeats

logger = logging.getLogger(__name__)


def judge_restarts(
    type: str | None, body: kopf.Body, labels: dict[str, str], namespace: str, memo: OperatorMemo, **_: Any
) -> None:
    """When the kubelet restarted a container of a training pod (not gone), judge that restart for each of
    its rendezvous (``judge_restart``)."""
    pod = dict(body)
    if pods_rules.pod_is_gone(pod, type):
        return  # the gone-pod rule's
    restarted = restarts_rules.container_restarted_at(pod, datetime.now(timezone.utc))
    if restarted is None:
        return
    for rendezvous in rendezvouses_of_pod(memo, labels, namespace):
        judge_restart(memo, pod, namespace, rendezvous, restarted)


def judge_restart(
    memo: OperatorMemo, pod: dict[str, Any], namespace: str, rendezvous: str, restarted_at: datetime
) -> None:
    """Evict from ``rendezvous`` the nodes of ``pod`` whose agent died when the kubelet restarted its
    container at ``restarted_at`` (their Lease's last heartbeat is older), once per restart.

    Nothing is judged without the Leases' heartbeats: a failed Lease list leaves the restart to the
    pod's next event (else the heartbeat expiry evicts). A node with no heartbeat on record may be
    the restarted container's new agent: it is never evicted here. A restart is judged again only
    when its eviction was not written (the write failed).
    """
    key = (namespace, rendezvous)
    pod_uid = str(pod["metadata"].get("uid") or pod["metadata"]["name"])
    stored = open_document(memo, key)
    record = memo.get(key)
    if stored is None or record is None or record.judged_restarts.get(pod_uid) == restarted_at:
        return

    try:
        beats = heartbeats(memo.api, namespace, rendezvous)
    except KubernetesApiError as exc:
        logger.info(
            "restart of pod %s/%s not judged yet: its Leases could not be read (%s)",
            namespace,
            pod["metadata"]["name"],
            exc,
        )
        return
    nodes = restarts_rules.nodes_of_restart(pod, stored, merge_heartbeats(stored, beats), restarted_at)
    because = f"a container of pod {pod['metadata']['name']} ended at {format_time(restarted_at)} and restarted"
    observed = record.observed
    evict_and_report(memo, namespace, rendezvous, nodes, because, pod)
    if not nodes or (observed is not None and with_evicted(observed.status, nodes) is None):
        remembered = restarts_rules.restarts_to_remember(record.judged_restarts, datetime.now(timezone.utc))
        record.judged_restarts = {**remembered, pod_uid: restarted_at}
