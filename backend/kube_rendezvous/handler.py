"""The ``k8s`` rendezvous handler for tensorplay: its DynamicRendezvousHandler over the Kubernetes API.

A thin adapter: the fixes live in ``rounds.RendezvousFixes`` (a fresh bootstrap store every
round, SIGTERM means leave, closed means a clean exit), the state in the framework-neutral
backend. tensorplay's C++ ``PrefixStore`` refuses Python stores, so each round's view of the
store is a ``KubernetesPrefixStore``.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import timedelta
from typing import Any, cast

from tensorplay.distributed.elastic.rendezvous.api import (
    RendezvousParameters,
    RendezvousTimeout,
)
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    _NodeDesc,
)

from . import frameworks
from .factory import create_backend
from .rounds import RendezvousFixes, serve_node

logger = logging.getLogger(__name__)

BACKEND_NAME = "k8s"


class KubernetesRendezvousHandler(RendezvousFixes, DynamicRendezvousHandler):
    """tensorplay's DynamicRendezvousHandler with this project's fixes (``rounds.RendezvousFixes``)."""

    framework = frameworks.tensorplay()
    round_prefix = "tp_elastic/rendezvous/{run_id}/{round}"

    def _wrap_store(self, store: Any) -> Any:
        # tensorplay's C++ PrefixStore refuses Python stores: prefix in Python.
        return self._round_store(store)


def create_k8s_handler(params: RendezvousParameters) -> KubernetesRendezvousHandler:
    """Create the ``k8s`` handler from the launcher's parameters (the registry's creator).

    Timings come from ``RendezvousTimings.resolve``: ``--rdzv-conf`` first, then the Rendezvous
    spec, then the defaults. The launcher always passes ``join_timeout`` (its ``--rdzv-timeout``).
    """
    backend, store = create_backend(params)
    timings = backend.timings
    settings = RendezvousSettings(
        run_id=backend.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        timeout=RendezvousTimeout(
            join=timedelta(seconds=timings.join),
            last_call=timedelta(seconds=timings.last_call),
            close=timedelta(seconds=timings.close),
            heartbeat=timedelta(seconds=timings.heartbeat),
        ),
        keep_alive_interval=timedelta(seconds=timings.keep_alive_interval),
        keep_alive_max_attempt=timings.keep_alive_max_attempt,
    )
    node = incarnation_node(params.local_addr)
    logger.info("this agent is rendezvous node %s", node)
    serve_node(backend, node, params.min_nodes, params.max_nodes)
    return KubernetesRendezvousHandler(
        backend=cast(Any, backend),
        settings=settings,
        local_addr=params.local_addr,
        node_rank=params.node_rank,
        run_id=backend.run_id,
        store=cast(Any, store),
        backend_name=BACKEND_NAME,
        node=node,
    )


def incarnation_node(local_addr: str | None) -> _NodeDesc:
    """This agent's node: its address and pid, and a random local id unique to this incarnation.

    In a pod the agent is PID 1 and an Indexed Job's replacement pod keeps the hostname (and may
    get the IP) of the pod it replaces, so ``addr_pid_0`` would name both. The random local id
    tells them apart: an eviction of the old node never matches the new one.
    """
    return _NodeDesc(local_addr or socket.getfqdn(), os.getpid(), secrets.randbelow(2**31))


def register() -> None:
    """Register rendezvous backend ``k8s`` with tensorplay's handler registry (idempotent).

    tensorplay 1.0.0 never loads the ``tp.elastic.handlers`` entry points, so launch code
    must call this before it builds its rendezvous handler; ``kube_rendezvous.run`` does.
    """
    from tensorplay.distributed.elastic.rendezvous.api import get_registry

    get_registry().register(BACKEND_NAME, create_k8s_handler)
