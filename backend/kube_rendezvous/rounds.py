"""The handler fixes every framework adapter shares: a mixin over a framework's DynamicRendezvousHandler.

tensorplay's elastic package is a clone of torch's, and both handlers share three flaws that stop
a job from surviving the loss of a pod; ``RendezvousFixes`` mends them on either:

- **Bootstrap store per round.** Both reuse rank 0's bootstrap TCPStore across rounds and
  publish its address once, so after a membership change the new round's workers read the old
  round's keys and hang. Here rank 0 starts a fresh bootstrap store every round and publishes its
  address under this round's prefix of the rendezvous store.
- **SIGTERM means leave.** tensorplay's launcher closes the rendezvous in ``shutdown()`` on every
  exit of the agent, a SIGTERM included, which ends every other agent with exit code 0
  mid-training. Here only an agent whose workers succeeded closes it; any other leaves (drained,
  preempted, failed). torch's launcher never calls ``shutdown()`` after a signal, so its node
  would stay a participant until its heartbeats expired: a handler that joined a round and was
  never shut down leaves at interpreter exit (``EXIT_LEAVE_SECONDS`` at most).
- **Closed means a clean exit**, and the store of each round is labelled with the round so that
  rank 0 can delete the keys of finished rounds.

It also keeps the framework's keep-alive timer off in scale mode: the backend renews the node's
Lease itself (``leases.LeaseRenewer``) and shows the framework no heartbeat to renew, so every tick
of that timer would only re-read and unpickle the whole state. At N=1024, 128 agents of one
process spent most of its CPU there, and their Lease renewals fell behind until the folder
expired live nodes.

The adapter (``handler`` for tensorplay, ``torchrun`` for torch) puts the mixin first in the
bases, before the framework's handler, and sets ``framework`` (``frameworks.tensorplay()`` or
``frameworks.torch()``) and ``round_prefix``. Nothing here imports a framework.

Not guaranteed: ``agent_training_outcome`` finds the agent by walking the caller's stack for a
``self`` with a ``_worker_group.state``; an agent that calls ``shutdown()`` from elsewhere gets
the stock behaviour (close) unless an exception is being handled.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from .backend import KubernetesRendezvousBackend, waiting_count
from .document import NodeId
from .folding import JoinSettings
from .frameworks import Framework
from .store import KubernetesPrefixStore, KubernetesStore

logger = logging.getLogger(__name__)

#: Rounds whose store keys survive the cleanup that rank 0 runs when a round forms.
ROUNDS_KEPT_BEHIND = 1
ROUNDS_KEPT_AHEAD = 2
#: Seconds a handler that was never shut down tries to leave at interpreter exit (a kubelet's
#: default grace period after SIGTERM is 30 s; the writer Lease is released after this).
EXIT_LEAVE_SECONDS = 10.0


class WrittenOnceReads:
    """The read side of a round's store for the framework's ``RendezvousStoreInfo.build`` on ranks above 0.

    Rank 0 writes the bootstrap address once per round under the round's prefix, and nobody
    changes it, so the other ranks read it from their store's watch (``get_written_once``): no
    request each, where a GET each would be N reads at the same instant.
    """

    def __init__(self, store: KubernetesPrefixStore) -> None:
        self._store = store

    def get(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        return self._store.get_written_once(key, timeout)


class ConcurrentWrites:
    """The write side of a round's store for rank 0's ``RendezvousStoreInfo.build``: each ``set`` is sent at once.

    The framework publishes the bootstrap address as two keys one after the other (address,
    then port), and nobody reads either until both are there, so writing them side by side
    halves rank 0's step: one round trip, not two. ``flush`` waits for every write and raises
    the first failure; anything other than ``set`` flushes first, so reads see the writes.
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self._writes: list[threading.Thread] = []
        self._failures: list[BaseException] = []

    def set(self, key: str | bytes, value: str | bytes) -> None:
        def write() -> None:
            try:
                self._store.set(key, value)
            except BaseException as exc:  # noqa: BLE001 - raised by flush, in the caller's thread
                self._failures.append(exc)

        thread = threading.Thread(target=write, name="bootstrap address", daemon=True)
        thread.start()
        self._writes.append(thread)

    def flush(self) -> None:
        for thread in self._writes:
            thread.join()
        self._writes.clear()
        if self._failures:
            raise self._failures[0]

    def __getattr__(self, name: str) -> Any:
        self.flush()
        return getattr(self._store, name)


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


class RendezvousFixes:
    """Mixin for a framework's DynamicRendezvousHandler; see the module docstring."""

    #: The framework whose classes and errors to use, set by the adapter.
    framework: Framework
    #: The key prefix of a round's store (``{run_id}`` and ``{round}`` are filled in).
    round_prefix: str

    #: What the first ``shutdown()`` returned (None: not shut down yet).
    _shutdown_result: bool | None = None
    #: Whether ``_leave_at_exit`` is registered with atexit (on the first join).
    _leaves_at_exit = False
    #: Wall-clock time (``time.time()``) the last join saw its round formed, before the store's
    #: bootstrap step; benchmarks split a round's time into joining and bootstrapping with it.
    joined_at: float | None = None
    #: The last round's bootstrap step, in seconds: ``server`` starting rank 0's bootstrap TCPStore
    #: (0 on other ranks), ``address`` publishing its address (rank 0) or reading it (the others).
    bootstrap_seconds: dict[str, float] | None = None

    # The framework handler's attributes this mixin uses.
    _state_holder: Any
    _settings: Any
    _store: Any
    _this_node: Any
    _op_executor: Any
    _heartbeat_lock: Any
    _shared_tcp_store_server: Any
    _bootstrap_store_info: Any
    _stop_heartbeats: Any
    _get_deadline: Any
    _get_world: Any
    _get_store: Any
    _create_tcp_store_server: Any
    use_agent_store: Any

    def _round_store(self, store: KubernetesStore) -> KubernetesPrefixStore:
        round_number = self._state_holder.state.round
        if not isinstance(store, KubernetesStore):
            raise TypeError(f"{type(self).__name__} needs a KubernetesStore, got {type(store).__name__}")
        prefix = self.round_prefix.format(run_id=self._settings.run_id, round=round_number)
        return KubernetesPrefixStore(prefix, store, round_number=round_number)

    def _stop_bootstrap_store(self) -> None:
        server, self._shared_tcp_store_server = self._shared_tcp_store_server, None
        if server is not None and hasattr(server, "stop"):
            try:
                server.stop()
            except Exception as exc:  # noqa: BLE001 - an old server that will not stop is harmless
                logger.debug("stopping the previous bootstrap store failed: %s", exc)

    def next_rendezvous(self) -> Any:
        """Join the next round; rank 0 hosts a fresh bootstrap store and publishes it under the round's prefix.

        Raises:
            RendezvousGracefulExitError: the rendezvous is closed (``spec.closed``, the object
                deleted, or the job done), so the agent stops its workers and exits cleanly.
        """
        try:
            return self._next_round()
        except self.framework.closed_error as exc:
            self._record_closed()
            raise self.framework.graceful_exit_error(
                f"the rendezvous {self._settings.run_id} is closed: {exc}"
            ) from exc

    def _record_closed(self) -> None:
        """Write the closed state a close intent produced, so the summary and kubectl say Closed."""
        try:
            with self._heartbeat_lock:
                if self._state_holder.state.closed:
                    self._state_holder.mark_dirty()
                    self._state_holder.sync()
        except Exception as exc:  # noqa: BLE001 - the object may be gone already; the exit stays clean
            logger.info("could not record the closed state: %s", exc)

    def _start_heartbeats(self) -> None:
        """The framework's keep-alive timer, except in scale mode, where the backend heartbeats (module docstring)."""
        backend = getattr(self._state_holder, "_backend", None)
        if isinstance(backend, KubernetesRendezvousBackend) and backend.lease is not None:
            self._stop_heartbeats()
            return
        super()._start_heartbeats()  # type: ignore[misc]

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join; a close requested by a person counts as one, so running agents stop and exit.

        A rendezvous closed by an agent whose training succeeded does not: the other agents' workers
        are finishing too, and restarting them now would kill them before they are done.
        """
        backend = getattr(self._state_holder, "_backend", None)
        waiting = getattr(backend, "nodes_waiting", None)
        if waiting is not None and (answer := waiting()) is not None:
            return int(answer)  # scale mode: from the process's watch, without the framework's state
        with self._heartbeat_lock:
            self._state_holder.sync()
            state = self._state_holder.state
            requested = getattr(backend, "close_requested", True)
            return waiting_count(len(state.wait_list), state.closed, requested)

    def _next_round(self) -> Any:
        if not self._leaves_at_exit:
            self._leaves_at_exit = True
            atexit.register(self._leave_at_exit)
        self._stop_heartbeats()
        if self._state_holder.state.round == 0:
            self.framework.delay((0, 0.3))
        deadline = self._get_deadline(self._settings.timeout.join)
        self._op_executor.run(self.framework.exit_op_class(), deadline)
        backend = getattr(self._state_holder, "_backend", None)
        cache_seconds = getattr(self._state_holder, "_cache_duration", None)
        if backend is not None:
            backend.joining = True  # its reads may wait for a change that matters to this loop
            if cache_seconds is not None:
                # Its reads wait on a watch, so the loop skips the framework's 1 s poll
                # (``frameworks``); the state holder must then read, not answer from its 1 s cache.
                self._state_holder._cache_duration = 0
        try:
            self._op_executor.run(self.framework.join_op_class(), deadline, self._get_deadline)
        finally:
            if backend is not None:
                backend.joining = False
                if cache_seconds is not None:
                    self._state_holder._cache_duration = cache_seconds
        self.joined_at = time.time()
        self._start_heartbeats()
        rank, world_size = self._get_world()
        state = self._state_holder.state
        round_store = self._get_store()
        self._stop_bootstrap_store()
        server_port = None
        server_seconds = 0.0
        if rank == 0 and self.use_agent_store:
            began = time.monotonic()
            self._shared_tcp_store_server = self._create_tcp_store_server(self._this_node.addr, 0)
            server_port = int(self._shared_tcp_store_server.port)
            server_seconds = time.monotonic() - began
        served = time.monotonic()
        stats = getattr(self._store, "stats", None)
        before = dict(stats) if isinstance(stats, dict) else {}
        # rank 0 publishes the bootstrap address; the others read it from their store's watch
        publish = ConcurrentWrites(round_store)
        self._bootstrap_store_info = self.framework.store_info_class.build(
            rank,
            publish if rank == 0 else WrittenOnceReads(self._round_store(self._store)),
            local_addr=self._this_node.addr,
            server_port=server_port,
        )
        publish.flush()
        self.bootstrap_seconds = {"server": server_seconds, "address": time.monotonic() - served}
        if isinstance(stats, dict):  # the store's requests and lost or unclear writes in this step
            self.bootstrap_seconds.update(
                requests=stats.get("requests", 0) - before.get("requests", 0),
                retries=stats.get("conflicts", 0) - before.get("conflicts", 0),
            )
        if rank == 0:  # after publishing: the cleanup is off the round's critical path
            self._store.delete_rounds_except(
                range(max(0, state.round - ROUNDS_KEPT_BEHIND), state.round + ROUNDS_KEPT_AHEAD + 1)
            )
        logger.info(
            "round %d formed: rank %d of %d, bootstrap store %s:%s",
            state.round,
            rank,
            world_size,
            self._bootstrap_store_info.master_addr,
            self._bootstrap_store_info.master_port,
        )
        return self.framework.info_class(round_store, rank, world_size, self._bootstrap_store_info)

    def shutdown(self) -> bool:
        """Close the rendezvous only when this agent's training succeeded; otherwise leave it.

        The elastic agent calls ``shutdown()`` on every exit path: after its workers succeeded,
        after they failed for good, and on a SIGTERM (a drain, a preemption, a spot reclaim).
        Only success closes the rendezvous here; otherwise this node leaves (it is removed from
        the participants) and the survivors re-form. Called by code that is not an elastic
        agent, it closes as the stock handler does, unless an exception is being handled. Only
        the first call decides: the launcher calls it again after the agent did.
        """
        if self._shutdown_result is not None:
            return self._shutdown_result
        outcome = agent_training_outcome()
        try:
            if outcome == "SUCCEEDED" or (outcome is None and sys.exc_info()[0] is None):
                self._shutdown_result = bool(super().shutdown())  # type: ignore[misc]
            else:
                self._shutdown_result = self.leave()
            return self._shutdown_result
        finally:
            self._stop_bootstrap_store()

    def leave(self, timeout: float | None = None) -> bool:
        """Leave the rendezvous without closing it; return False when that could not be written.

        Tries for ``timeout`` seconds (default: the close timeout).
        """
        self._stop_heartbeats()
        deadline = self._get_deadline(self._settings.timeout.close if timeout is None else timedelta(seconds=timeout))
        try:
            self._op_executor.run(self.framework.exit_op_class(), deadline)
        except self.framework.rendezvous_error as exc:
            logger.warning("could not leave the rendezvous %s: %s", self._settings.run_id, exc)
            return False
        logger.info("left the rendezvous %s without closing it (the agent did not succeed)", self._settings.run_id)
        return True

    def _leave_at_exit(self) -> None:
        """At interpreter exit: leave if ``shutdown()`` was never called (torch's launcher after a signal)."""
        if self._shutdown_result is not None:
            return
        logger.info(
            "exiting without a shutdown of the rendezvous handler (a signal ended the agent): leaving %s",
            self._settings.run_id,
        )
        try:
            self._shutdown_result = self.leave(EXIT_LEAVE_SECONDS)
        finally:
            self._stop_bootstrap_store()


def serve_node(backend: KubernetesRendezvousBackend, node: Any, min_nodes: int, max_nodes: int) -> None:
    """Put ``backend`` in scale mode for the handler of ``node`` (a framework ``_NodeDesc``)."""
    timings = backend.timings
    backend.serve_node(
        NodeId(node.addr, node.pid, node.local_id),
        JoinSettings(min_nodes, max_nodes, timedelta(seconds=timings.last_call)),
        keep_alive=timings.keep_alive_interval,
        expiry=timings.keep_alive_interval * timings.keep_alive_max_attempt,
    )
