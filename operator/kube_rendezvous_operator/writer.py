"""The operator as the preferred writer: one folder per Rendezvous, and heartbeats read from Leases.

For every Rendezvous a task (``lifecycle``) runs the agents' ``Folder`` with ``preferred=True``:
it takes the writer Lease (from an agent at once), folds the nodes' join and leave requests
into the state in batches, and expires nodes whose Lease stops changing, by its own clock.
With the operator stopped, an agent takes the writer Lease within its duration (10 s).

``heartbeats`` gives the operator's other rules (``gone_pods``, ``restarts``, ``resync``, ``not_ready``) each
node's last heartbeat from its Lease: the state document no longer carries heartbeats.

Each folder runs in a thread of its own, never in Kopf's executor: that pool has a few threads
(``min(32, cores + 4)``), and a folder holds its thread for the life of its Rendezvous, so with more
Rendezvous objects than threads every other sync handler (conditions, evictions, resyncs) would
wait forever.

Not guaranteed: Lease ``renewTime`` values are the agents' clocks; they are used only where the
first release already compared agents' heartbeats with pod and deletion times (with slack).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime

from kube_rendezvous import (
    ANNOTATION_NODE,
    LABEL_LEASE,
    LEASE_PLURAL,
    RENDEZVOUS_LABEL,
    Folder,
    KubernetesApi,
    KubernetesApiError,
    NodeId,
    PlacementSpec,
    RendezvousDocument,
    TrainingPods,
    object_watch,
    parse_micro_time,
    parse_node,
    resource_path,
)

from . import writer_rules
from .lifecycle import TASK_END_SECONDS, forget, stopped_within
from .memory import Key, OperatorMemo

logger = logging.getLogger(__name__)

#: Seconds between two looks at the folder's watch for its Rendezvous gone (a deletion the operator missed).
GONE_CHECK_SECONDS = 5.0
#: Seconds between two looks whether the folder's thread ended once asked to (it releases the writer Lease), up to
#: ``TASK_END_SECONDS``: a thread cannot be awaited, and a short look ends the task soon after the thread.
THREAD_END_POLL_SECONDS = 0.1


async def fold_requests(memo: OperatorMemo, key: Key, uid: str, stopped: asyncio.Event) -> None:
    """Hold the writer Lease of Rendezvous ``key`` (object ``uid``) and fold its nodes' requests until ``stopped``.

    When the folder's watch of the object shows it gone or another object (its DELETED event was missed: a
    watch gap longer than the server keeps events), the operator forgets it (``lifecycle.forget``).
    """
    namespace, name = key
    done = threading.Event()
    watch = object_watch(memo.api, namespace, name).start()
    folder = Folder(
        memo.api,
        namespace,
        name,
        identity=memo.config.writer_identity,
        preferred=True,
        rendezvous=watch,
        training_pods=lambda: training_pods(memo, key),
    )
    record = memo.record(key)
    record.wake_folder = folder.wake
    thread = threading.Thread(target=folder.run, args=(done,), name=f"folder {namespace}/{name}", daemon=True)
    thread.start()
    gone = False
    try:
        while not gone and not await stopped_within(stopped, GONE_CHECK_SECONDS):
            found = watch.get(name) if watch.healthy else {"metadata": {"uid": uid}}
            gone = found is None or found["metadata"].get("uid") != uid
    finally:
        done.set()
        deadline = asyncio.get_running_loop().time() + TASK_END_SECONDS
        while thread.is_alive() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(THREAD_END_POLL_SECONDS)
        watch.stop()
        if record.wake_folder == folder.wake:
            record.wake_folder = None
    if gone:
        logger.info("rendezvous %s/%s was deleted (its event missed): the operator forgets it", namespace, name)
        await forget(memo, key, uid)


def training_pods(memo: OperatorMemo, key: Key) -> TrainingPods | None:
    """The census of ``key``'s training pods for its folder; None until they were listed once."""
    listed = memo.pods_of(key)
    if listed is None:
        return None
    record = memo.get(key)
    placement = record.placement if record is not None else None
    readiness = memo.node_rule.readiness
    nodes = readiness.facts() if readiness is not None and readiness.readable else None
    return writer_rules.training_pods(listed, nodes, placement or PlacementSpec())


def heartbeats(client: KubernetesApi, namespace: str, rendezvous_name: str) -> dict[NodeId, datetime]:
    """Each node's last heartbeat (its Lease's renewTime), from the API server's watch cache."""
    listed = client.request(
        "GET",
        resource_path(LEASE_PLURAL, namespace),
        query={"labelSelector": f"{RENDEZVOUS_LABEL}={rendezvous_name},{LABEL_LEASE}=node", "resourceVersion": "0"},
    )
    beats: dict[NodeId, datetime] = {}
    for item in listed.get("items", []):
        try:
            node = parse_node(item["metadata"]["annotations"][ANNOTATION_NODE])
            beats[node] = parse_micro_time(item["spec"]["renewTime"])
        except (KeyError, TypeError, ValueError):
            continue
    return beats


def with_lease_heartbeats(
    client: KubernetesApi, document: RendezvousDocument | None, namespace: str, rendezvous_name: str
) -> RendezvousDocument | None:
    """``document`` with each node's heartbeat taken from its Lease where it has one (unchanged on error)."""
    if document is None:
        return None
    try:
        beats = heartbeats(client, namespace, rendezvous_name)
    except KubernetesApiError:
        return document
    return writer_rules.merge_heartbeats(document, beats)


__all__ = [
    "GONE_CHECK_SECONDS",
    "THREAD_END_POLL_SECONDS",
    "fold_requests",
    "heartbeats",
    "training_pods",
    "with_lease_heartbeats",
]
