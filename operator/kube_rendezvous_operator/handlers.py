"""The Kopf registration glue: which handler of which rule module Kopf runs for which event.

The operator is never required in the data path (it is the preferred writer, see ``writer``; the
agents elect one of their own when it is down). It watches Rendezvous objects and the training pods,
posts Events, keeps ``status.conditions`` current, evicts nodes whose pod is gone (by adding
them to ``status.evictedNodes``, which every writer folds into the state), and deletes closed
Rendezvous after their TTL. It also evicts
the nodes of training pods on a Kubernetes Node NotReady for ``--node-not-ready-seconds`` (``not_ready``;
``nodes`` tells which are), unless their agents still heartbeat. It writes to
a Rendezvous only when a condition changes or a node is evicted: never per heartbeat. A task
resyncs each Rendezvous with its pods (a LIST, no write unless it evicts), so pods deleted or
ended while the operator was down or its watch was broken are noticed too.

It never holds a Rendezvous: no finalizer, so deleting one (or its namespace, or the CRD) needs no
operator. Its agents take the object's disappearance as the close of their run; the operator stops
its tasks and forgets it on its DELETED event (``lifecycle``). Objects of earlier releases carry
``RELEASED_FINALIZER``: the operator removes it from every object it sees.

This module holds Kopf's settings, ``register`` and the one Rendezvous event handler that starts and stops each
Rendezvous's tasks (``lifecycle``). Every rule is an I/O module with a pure twin ``<module>_rules``:
``conditions`` (Ready, Progressing and Closed), ``events`` (the state changes told as Events, on the Rendezvous
and its workloads), ``pods`` (each Rendezvous's training pods), ``gone_pods`` and ``restarts`` (evictions
from the pod watch), ``resync`` (the periodic pod census), ``not_ready`` (the NotReady-node rule), ``writer``
(the folder) and ``ttl``; ``evictions`` is their one eviction write. The operator's memory is one record per
Rendezvous (``memory``), with no I/O.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from kube_rendezvous import GROUP, RENDEZVOUS_PLURAL, VERSION

from . import lifecycle, metrics, ttl_rules
from .conditions import reconcile_spec
from .events import observe_rendezvous
from .gone_pods import evict_nodes_of_gone_pods
from .memory import Key, OperatorMemo
from .not_ready import evict_on_not_ready_nodes, start_node_rule, stop_node_rule
from .pods import is_training_pod, track_training_pod
from .restarts import judge_restarts
from .resync import resync_periodically
from .ttl import delete_after_ttl
from .writer import fold_requests

logger = logging.getLogger(__name__)

#: The finalizer of the first four releases, which held every Rendezvous until the operator let it go. Kopf
#: is told it is its own finalizer: since no handler needs one now, Kopf removes it from each object it sees
#: (also from one being deleted, which then goes), so what earlier releases left can be deleted.
RELEASED_FINALIZER = "kube-rendezvous.io/close-before-delete"
#: Seconds the server keeps one of Kopf's watch requests open (Kopf then watches anew from the last event).
WATCH_SERVER_SECONDS = 25  # an integer: the server refuses timeoutSeconds=25.0
#: Seconds one of Kopf's requests may take, and its connection attempt.
REQUEST_SECONDS = 30.0
CONNECT_SECONDS = 10.0


def configure(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    """Keep Kopf's own writes rare and under our names; serve metrics (this replica acts: ``LEADER`` 1)."""
    settings.persistence.finalizer = RELEASED_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kube-rendezvous.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kube-rendezvous.io", key="last-handled-spec"
    )
    settings.posting.level = logging.WARNING  # handler logs stay logs; Events are the ones we post
    # Every watch and request has a deadline: the server ends each watch within 25 s, a stream silent
    # for 30 s (no event, no bookmark; a NAT that dropped the connection) is dropped and watched anew.
    settings.watching.server_timeout = WATCH_SERVER_SECONDS
    settings.watching.client_timeout = WATCH_SERVER_SECONDS + 5
    settings.watching.inactivity_timeout = WATCH_SERVER_SECONDS + 5
    settings.watching.connect_timeout = CONNECT_SECONDS
    settings.networking.request_timeout = REQUEST_SECONDS
    settings.networking.connect_timeout = CONNECT_SECONDS
    if memo.config.namespaces:
        # Named namespaces only: do not scan (list) namespaces, which namespaced RBAC forbids.
        settings.scanning.disabled = True
    metrics.report_memory(lambda: len(memo.tracked()), memo.indexed_pods)
    metrics.serve(memo.config.metrics_port)
    metrics.set_leader(True)


def rendezvous_tasks(memo: OperatorMemo, key: Key, spec: dict[str, Any], uid: str) -> dict[str, lifecycle.Work]:
    """The background tasks of Rendezvous ``key`` (object ``uid``), by name: what Kopf's daemons and timer were."""
    namespace, name = key
    tasks: dict[str, lifecycle.Work] = {
        "folder": lambda stopped: fold_requests(memo, key, uid, stopped),
        "resync": lambda stopped: resync_periodically(memo, key, stopped),
        "not-ready": lambda stopped: evict_on_not_ready_nodes(memo, key, stopped),
    }
    if ttl_rules.has_ttl(spec):
        tasks["ttl"] = lambda stopped: delete_after_ttl(dict(spec), namespace, name, uid, stopped, memo)
    return tasks


async def rendezvous_event(
    type: str | None,
    body: kopf.Body,
    spec: dict[str, Any],
    status: dict[str, Any],
    meta: dict[str, Any],
    namespace: str,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """Each watch event of a Rendezvous: run its tasks while it lives, stop them when its deletion starts, and
    forget everything of it once it is deleted; observe its state (``observe_rendezvous``, in a worker thread)."""
    key = (namespace, name)
    uid = str(meta.get("uid"))
    if type == "DELETED":
        await lifecycle.forget(memo, key, uid)
        metrics.forget(namespace, name)
        return
    if meta.get("deletionTimestamp"):
        await lifecycle.stop(memo, key)
    else:
        await lifecycle.start(memo, key, uid, rendezvous_tasks(memo, key, spec or {}, uid))
    await asyncio.to_thread(observe_rendezvous, body, spec, status, meta, namespace, name, memo)


async def stop_rendezvous_tasks(memo: OperatorMemo, **_: Any) -> None:
    """Stop every Rendezvous's tasks (Kopf's cleanup): each folder releases its writer Lease."""
    await lifecycle.stop_all(memo)


def register(registry: kopf.OperatorRegistry) -> None:
    """Register every handler on ``registry`` (the settings reach them in Kopf's memo, ``OperatorMemo.config``)."""
    rendezvous = (GROUP, VERSION, RENDEZVOUS_PLURAL)
    # Kopf's own watches log in as our API client does: the kubeconfig, else the pod's service account.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    kopf.on.startup(registry=registry)(start_node_rule)
    kopf.on.cleanup(registry=registry)(stop_rendezvous_tasks)
    kopf.on.cleanup(registry=registry)(stop_node_rule)
    for on in (kopf.on.resume, kopf.on.create):
        on(*rendezvous, registry=registry)(reconcile_spec)
    kopf.on.update(*rendezvous, field="spec", registry=registry)(reconcile_spec)
    # No daemon, timer or on.delete handler: Kopf would hold every Rendezvous with a finalizer for them.
    kopf.on.event(*rendezvous, registry=registry)(rendezvous_event)
    kopf.on.event("", "v1", "pods", when=is_training_pod, registry=registry)(evict_nodes_of_gone_pods)
    kopf.on.event("", "v1", "pods", when=is_training_pod, registry=registry)(judge_restarts)
    kopf.on.event("", "v1", "pods", when=is_training_pod, registry=registry)(track_training_pod)
