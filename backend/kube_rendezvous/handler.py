"""The ``k8s`` rendezvous handler: tensorplay's DynamicRendezvousHandler over the Kubernetes API.

Three changes to the stock handler, all needed for a job to survive the loss of a pod:

- the rendezvous store is a ``KubernetesStore``, and tensorplay's C++ ``PrefixStore`` refuses
  Python stores, so each round's view is a ``KubernetesPrefixStore``;
- tensorplay 1.0.0 reuses rank 0's bootstrap TCPStore and publishes its address at the store
  root, so after a membership change the new round's workers read the old round's keys and
  hang. Here rank 0 starts a fresh bootstrap store every round and publishes its address under
  this round's prefix;
- the stock ``shutdown()`` closes the rendezvous on every exit of the agent, a SIGTERM included,
  which ends every other agent with exit code 0. Here only an agent whose workers succeeded
  closes it; any other leaves (drained, preempted, failed), and the survivors re-form.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
from datetime import timedelta
from typing import Any, cast

from tensorplay.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeout,
)
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    _NodeDesc,
    _RendezvousExitOp,
    _RendezvousJoinOp,
)
from tensorplay.distributed.elastic.rendezvous.utils import _delay

from .factory import create_backend
from .store import KubernetesPrefixStore, KubernetesStore

logger = logging.getLogger(__name__)

BACKEND_NAME = "k8s"
#: Rounds whose store keys survive the cleanup that rank 0 runs when a round forms.
ROUNDS_KEPT_BEHIND = 1
ROUNDS_KEPT_AHEAD = 2


class KubernetesRendezvousHandler(DynamicRendezvousHandler):
    """A DynamicRendezvousHandler whose store and bootstrap address are safe across rounds."""

    #: What the first ``shutdown()`` returned (None: not shut down yet).
    _shutdown_result: bool | None = None

    def _wrap_store(self, store: Any) -> KubernetesPrefixStore:
        round_number = self._state_holder.state.round
        if not isinstance(store, KubernetesStore):
            raise TypeError(f"KubernetesRendezvousHandler needs a KubernetesStore, got {type(store).__name__}")
        return KubernetesPrefixStore(
            f"tp_elastic/rendezvous/{self._settings.run_id}/{round_number}", store, round_number=round_number
        )

    def _stop_bootstrap_store(self) -> None:
        server, self._shared_tcp_store_server = self._shared_tcp_store_server, None
        if server is not None:
            try:
                server.stop()  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - an old server that will not stop is harmless
                logger.debug("stopping the previous bootstrap store failed: %s", exc)

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round; rank 0 hosts a fresh bootstrap store and publishes it under the round's prefix.

        Raises:
            RendezvousGracefulExitError: the rendezvous is closed (``spec.closed``, the object
                deleted, or the job done), so the agent stops its workers and exits cleanly.
        """
        try:
            return self._next_round()
        except RendezvousClosedError as exc:
            self._record_closed()
            raise RendezvousGracefulExitError(f"the rendezvous {self._run_id} is closed: {exc}") from exc

    def _record_closed(self) -> None:
        """Write the closed state a close intent produced, so the summary and kubectl say Closed."""
        try:
            with self._heartbeat_lock:
                if self._state_holder.state.closed:
                    self._state_holder.mark_dirty()
                    self._state_holder.sync()
        except Exception as exc:  # noqa: BLE001 - the object may be gone already; the exit stays clean
            logger.info("could not record the closed state: %s", exc)

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join; a closed rendezvous counts as one so that running agents stop and exit."""
        with self._heartbeat_lock:
            self._state_holder.sync()
            state = self._state_holder.state
            return max(len(state.wait_list), 1 if state.closed else 0)

    def _next_round(self) -> RendezvousInfo:
        self._stop_heartbeats()
        if self._state_holder.state.round == 0:
            _delay((0, 0.3))
        deadline = self._get_deadline(self._settings.timeout.join)
        self._executor.run(_RendezvousExitOp(), deadline)
        self._executor.run(_RendezvousJoinOp(), deadline, self._get_deadline)
        self._start_heartbeats()
        rank, world_size = self._get_world()
        state = self._state_holder.state
        round_store = self._get_store()
        self._stop_bootstrap_store()
        server_port = None
        if rank == 0:
            if self.use_agent_store:
                self._shared_tcp_store_server = self._create_tcp_store_server(self._this_node.addr, 0)
                server_port = int(cast(Any, self._shared_tcp_store_server).port)
            assert isinstance(self._store, KubernetesStore)
            self._store.delete_rounds_except(
                range(max(0, state.round - ROUNDS_KEPT_BEHIND), state.round + ROUNDS_KEPT_AHEAD + 1)
            )
        self._bootstrap_store_info = RendezvousStoreInfo.build(
            rank, round_store, local_addr=self._this_node.addr, server_port=server_port
        )
        logger.info(
            "round %d formed: rank %d of %d, bootstrap store %s:%s",
            state.round,
            rank,
            world_size,
            self._bootstrap_store_info.master_addr,
            self._bootstrap_store_info.port,
        )
        return RendezvousInfo(
            store=round_store,
            rank=rank,
            world_size=world_size,
            bootstrap_store_info=self._bootstrap_store_info,
            participants=sorted(state.participants),
            wait_list=sorted(state.wait_list),
        )

    def shutdown(self) -> bool:
        """Close the rendezvous only when this agent's training succeeded; otherwise leave it.

        The elastic agent calls ``shutdown()`` on every exit path: after its workers succeeded,
        after they failed for good, and on a SIGTERM (a drain, a preemption, a spot reclaim).
        The stock handler closes the rendezvous on all of them, which ends every other agent
        with exit code 0 mid-training. Here only success closes it; otherwise this node leaves
        (it is removed from the participants) and the survivors re-form. Called by code that
        is not an elastic agent, it closes as the stock handler does, unless an exception is
        being handled. Only the first call decides: the launcher calls it again after the agent
        did, from its own exception handler.
        """
        if self._shutdown_result is not None:
            return self._shutdown_result
        outcome = agent_training_outcome()
        try:
            if outcome == "SUCCEEDED" or (outcome is None and sys.exc_info()[0] is None):
                self._shutdown_result = bool(super().shutdown())
            else:
                self._shutdown_result = self.leave()
            return self._shutdown_result
        finally:
            self._stop_bootstrap_store()

    def leave(self) -> bool:
        """Leave the rendezvous without closing it; return False when that could not be written."""
        self._stop_heartbeats()
        deadline = self._get_deadline(self._settings.timeout.close)
        try:
            self._executor.run(_RendezvousExitOp(), deadline)
        except RendezvousError as exc:
            logger.warning("could not leave the rendezvous %s: %s", self._run_id, exc)
            return False
        logger.info("left the rendezvous %s without closing it (the agent did not succeed)", self._run_id)
        return True


def agent_training_outcome() -> str | None:
    """The state name of the calling elastic agent's worker group, or None when no agent called.

    tensorplay's and torch's agents call the handler's ``shutdown()`` from ``_shutdown`` with
    ``self._worker_group.state`` already set (``SUCCEEDED`` only after the workers succeeded).
    """
    frame = sys._getframe(1)
    for _ in range(12):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        agent = frame.f_locals.get("self")
        group = getattr(agent, "_worker_group", None)
        state = getattr(group, "state", None)
        if state is not None:
            return str(getattr(state, "name", state))
    return None


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
    return KubernetesRendezvousHandler(
        backend=backend,
        settings=settings,
        local_addr=params.local_addr,
        node_rank=params.node_rank,
        run_id=backend.run_id,
        store=store,
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
