"""The ``k8s`` rendezvous handler on its own protocol: ask on the node's Lease, wait on the watch, confirm.

Framework-neutral; the adapters (``handler`` for tensorplay, ``torchrun`` for torch) add the
framework's ``RendezvousHandler`` base and its classes. The flows are in docs/architecture.md:

- **Ask**: ``join`` (scoped to a round: ``folder_rules.join_scope``) or ``leave``, on the node's own Lease
  (``leases.LeaseNodeLock``), renewed every keep-alive by the process's ``leases.LeaseRenewer`` from the
  first join to the leave: that is its heartbeat.
- **Wait**: a folder folds the requests into the state (``folder_rules.fold``); the handler waits on the
  process's watch until the state shows its request taken in. A join overtaken by a new round is asked
  again in the open round.
- **Confirm**: rank 0 starts a fresh bootstrap TCPStore every round (a reused one would hand a new
  round's workers the old round's keys) and publishes its address under the round's prefix of the
  store; the keys written once per round (``Framework.written_once``) are read from the watch and
  written in bundles.

What the launcher asks of the handler, answered from the watch (no request):

- ``num_nodes_waiting``: the wait list, a close asked by a person as one, and the members this node's
  round lost (``folder_rules.lost_members``), so the launcher restarts the survivors of a broken round at once.
- ``shutdown``: closes the rendezvous when this agent's workers succeeded (it entered its exit barrier),
  and otherwise leaves it. A node never shut down (torch's launcher after a signal) leaves at
  interpreter exit (``EXIT_LEAVE_SECONDS`` at most).
- ``set_closed``: closes it (one fold with the close, by compare-and-swap).

Not guaranteed: fencing (an agent paused past its heartbeat expiry still holds its last answer);
freshness of what ``num_nodes_waiting`` and ``is_closed`` say (the watch's delay, normally
milliseconds); success seen by an agent that skips its exit barrier (it then leaves, never closes).
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from .._kube.kubeapi import (
    RENDEZVOUS_PLURAL,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    call_with_retries,
    is_gone,
    resource_path,
)
from .._kube.leases import LeaseNodeLock
from .._rules.counters import Counters
from .._rules.document import NodeId, RendezvousDocument, StateDocumentError
from .._rules.folder_rules import Desire, JoinSettings, carried, join_scope, lost_members, role_of, satisfied
from .._rules.intents import RendezvousReading, close_cause, read_rendezvous, waiting_count
from .._rules.leases_rules import POD_UID_ENV
from .._rules.retries import CLOSE_RETRY, FENCED_REJOIN_PAUSE, WATCH_CATCH_UP_PAUSE, retry
from .._rules.summary import completed_by_text, forming_line
from .._store.prefixstore import KubernetesPrefixStore
from .._store.store import KubernetesStore
from .connection import Connection, connect, incarnation_node
from .folder import AGENT_IDENTITY_PREFIX, owner_reference
from .frameworks import Framework
from .shared import shared

logger = logging.getLogger(__name__)

BACKEND_NAME = "k8s"
#: Rounds whose store keys survive the cleanup that rank 0 runs when a round forms.
ROUNDS_KEPT_BEHIND = 1
ROUNDS_KEPT_AHEAD = 2
#: Seconds a handler that was never shut down tries to leave at interpreter exit (a kubelet's
#: default grace period after SIGTERM is 30 s; the writer Lease is released after this).
EXIT_LEAVE_SECONDS = 10.0
#: Seconds between two log lines of an agent whose round does not form (who joined, who is missing).
PROGRESS_LOG_SECONDS = 10.0

HandlerT = TypeVar("HandlerT", bound="NativeHandler")
T = TypeVar("T")


class NativeHandler:
    """The ``k8s`` handler's protocol (module docstring); an adapter adds the framework's base class.

    Args:
        connection: the API client, the Rendezvous (owner of this node's Lease), run id and timings.
        node: this agent incarnation (``incarnation_node``).
        min_nodes, max_nodes: the launcher's ``--nnodes``.
        framework: whose classes and errors to use.
    """

    def __init__(
        self, connection: Connection, node: NodeId, min_nodes: int, max_nodes: int, framework: Framework
    ) -> None:
        api, namespace, rendezvous_name = connection.api, connection.namespace, connection.rendezvous_name
        timings = connection.timings
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.run_id = connection.run_id
        #: The UID of the Rendezvous this run uses: another object of the same name is not this run's.
        self.rendezvous_uid = str(connection.rendezvous["metadata"]["uid"])
        self.node = node
        self.timings = timings
        self.framework = framework
        self._store = connection.store(framework)
        self._retry_timeout = connection.config.retry_timeout
        self._join_settings = JoinSettings(min_nodes, max_nodes, timedelta(seconds=timings.last_call))
        self._shared = shared(api, namespace, rendezvous_name)
        self._watch = self._shared.watch
        self._owner = owner_reference(connection.rendezvous)
        self._lease = self._lease_of(node)
        self._folder = self._shared.folder(f"{AGENT_IDENTITY_PREFIX}{node}", timings.heartbeat_expiry)
        self._renewer = self._shared.renewer(timings.keep_alive_interval)
        #: The round this node last formed and its members (``num_nodes_waiting``'s lost-member rule).
        self._round: tuple[int, frozenset[NodeId]] | None = None
        #: ``num_nodes_waiting``'s last answer and the resourceVersion it was computed from.
        self._waiting: tuple[str | None, int] = (None, 0)
        #: Whether this agent entered its exit barrier (its workers succeeded).
        self.succeeded = False
        self._shutdown_result: bool | None = None
        self._leaves_at_exit = False
        self._bootstrap_server: Any = None
        #: Wall-clock time (``time.time()``) the last join saw its round formed, before the bootstrap step.
        self.joined_at: float | None = None
        #: The last round's bootstrap step, in seconds: ``server`` (rank 0's TCPStore), ``address``
        #: (publishing or reading it), and the store's ``requests`` and ``retries`` in it.
        self.bootstrap_seconds: dict[str, float] | None = None
        #: What this handler did, for tests and benchmarks.
        self.stats = Counters("requests", "self_folds", "overtaken", "carried", "waiting_answers", "fenced")
        #: When this live node first saw its own eviction (``time.monotonic()``), while it waits to join again.
        self._evicted_seen: float | None = None
        #: How long it waits (``FENCED_REJOIN_PAUSE`` in a pod, whose deletion brings a SIGTERM; else none).
        self._rejoin_pause = FENCED_REJOIN_PAUSE if os.environ.get(POD_UID_ENV) else 0.0

    def _lease_of(self, node: NodeId) -> LeaseNodeLock:
        """The Lease on which ``node`` asks to join or leave and heartbeats."""
        return LeaseNodeLock(
            self._api,
            self.namespace,
            self.rendezvous_name,
            node,
            run_id=self.run_id,
            settings=self._join_settings,
            expiry_seconds=self.timings.heartbeat_expiry,
            owner=self._owner,
            pod_uid=os.environ.get(POD_UID_ENV) or None,
        )

    def _fenced(self, reading: RendezvousReading) -> bool:
        """If this live node was evicted (``status.evictedNodes``), become a new incarnation that may join again.

        An eviction names one incarnation (``addr_pid_localid``) and stays for the run, so the evicted name can
        never rejoin: a live agent evicted by mistake (a healed partition, ``kubectl rdzv evict`` of a live node)
        takes a new local id and a new Lease, and joins as a new member; its old Lease is no longer renewed. In a
        pod it does so only ``FENCED_REJOIN_PAUSE`` after it first saw the eviction (False until then, while
        ``rejoin_pending``): a pod being deleted gets its SIGTERM meanwhile and never rejoins.
        """
        if str(self.node) not in reading.evicted:
            self._evicted_seen = None
            return False
        now = time.monotonic()
        if self._evicted_seen is None:
            self._evicted_seen = now
            if self._rejoin_pause > 0:
                logger.warning(
                    "node %s was evicted from Rendezvous %s while alive (status.evictedNodes); unless it is stopped "
                    "first (its pod being deleted), it joins again as a new node in %g s",
                    self.node,
                    self._where,
                    self._rejoin_pause,
                )
        if now - self._evicted_seen < self._rejoin_pause:
            return False
        self._evicted_seen = None
        old = self.node
        self._renewer.remove(self._lease)
        self.node = incarnation_node(old.addr)
        self._lease = self._lease_of(self.node)
        self._round = None
        self.stats.add("fenced")
        logger.warning(
            "node %s was evicted from Rendezvous %s while alive (status.evictedNodes); it joins again as node %s",
            old,
            self._where,
            self.node,
        )
        return True

    @property
    def rejoin_pending(self) -> bool:
        """Whether this live node saw its own eviction and waits out ``FENCED_REJOIN_PAUSE`` before it joins again."""
        return self._evicted_seen is not None

    @classmethod
    def from_parameters(cls: type[HandlerT], params: Any, framework: Framework) -> HandlerT:
        """The handler for the launcher's ``RendezvousParameters`` (what each framework's registry calls).

        Raises:
            ValueError: bad parameters, naming the field and the fix.
            RendezvousConnectionError: the API server is unreachable or refuses (403, naming the permission).
        """
        connection = connect(params, framework)
        node = incarnation_node(params.local_addr)
        logger.info("this agent is rendezvous node %s", node)
        return cls(connection, node, params.min_nodes, params.max_nodes, framework)

    @property
    def api(self) -> KubernetesApi:
        """The API client this handler sends its requests on (its ``stats``: the requests, conflicts and bytes of
        every store, watch and Lease of this handler's process that share it)."""
        return self._api

    @property
    def rendezvous_store(self) -> KubernetesStore:
        """The Rendezvous's key/value store, whose views are the rounds' stores (``RendezvousInfo.store``); its
        ``stats``, what it did."""
        return self._store

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.rendezvous_name}"

    # -- the framework's RendezvousHandler interface ------------------------------------------

    def get_backend(self) -> str:
        return BACKEND_NAME

    def get_run_id(self) -> str:
        return self.run_id

    @property
    def use_agent_store(self) -> bool:
        """Whether the workers use rank 0's bootstrap store (the frameworks' own switch)."""
        return os.getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1"

    def next_rendezvous(self) -> Any:
        """Leave the round this node is in, join the next, and return its rank, world size and bootstrap store.

        Raises:
            RendezvousGracefulExitError: the rendezvous is closed (``spec.closed``, the object
                deleted, or the job done): the agent stops its workers and exits cleanly.
            RendezvousTimeoutError: no round formed within the join timeout.
            RendezvousConnectionError: the API server could not be reached for ``retry_timeout``.
            RendezvousStateError: the stored state is not a valid state document.
        """
        if not self._leaves_at_exit:
            self._leaves_at_exit = True
            atexit.register(self._leave_at_exit)
        previous, self._round = self._round, None
        deadline = time.monotonic() + self.timings.join
        try:
            reading = self._read(deadline)
            if self._fenced(reading):
                previous = None  # a new member: nothing carried over
            document = reading.document
            last_members = previous[1] if previous else None
            if previous is not None and document is not None and carried(document, self.node, previous[0]):
                # The fold opened the next round with this node in it (its round broke): nothing to ask.
                self.stats.add("carried")
                logger.info("node %s was carried into round %d", self.node, document.round)
                reading = self._settle(Desire.JOIN, deadline, last_members, ask=False)
            else:
                if document is not None and self.node in document.participants:
                    self._settle(Desire.LEAVE, deadline)
                reading = self._settle(Desire.JOIN, deadline, last_members)
        except self.framework.closed_error as exc:
            self._record_closed()
            cause = close_cause(self._own(self._watch.get(self.rendezvous_name)))
            logger.warning(
                "run %s ended, this agent stops and exits 0: %s (Rendezvous %s)", self.run_id, cause, self._where
            )
            raise self.framework.graceful_exit_error(f"the rendezvous {self.run_id} is closed: {cause}") from exc
        document = reading.document
        assert document is not None
        self.joined_at = time.time()
        self._round = (document.round, frozenset(document.participants))
        self._waiting = ("", 0)  # a carried node's round may be in the very version that broke its last one
        return self._confirm(document)

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join, a close asked by a person as one, and the members this node's round lost.

        A rendezvous closed by an agent whose training succeeded counts as none: the other agents'
        workers are finishing too, and restarting them now would kill them before they are done.
        """
        obj = self._own(self._watch.get(self.rendezvous_name))
        if obj is None:
            return 1 if self._watch.healthy else 0  # deleted: the next rendezvous exits cleanly
        self.stats.add("waiting_answers")
        version = obj["metadata"]["resourceVersion"]
        if self._waiting[0] == version:  # the monitor loop asks far more often than the object changes
            return self._waiting[1]
        reading = self._reading_of(obj)
        answer = waiting_count(reading)
        if answer == 0 and self._round is not None:
            lost = lost_members(reading.document, self._round[1])
            if lost:
                logger.warning(
                    "round %d lost %s: restarting to re-rendezvous (Rendezvous %s)",
                    self._round[0],
                    ", ".join(sorted(str(node) for node in lost)[:8]),
                    self._where,
                )
                answer = len(lost)
        self._waiting = (version, answer)
        return answer

    def is_closed(self) -> bool:
        try:
            reading = self._read()
        except self.framework.closed_error:
            return True  # deleted
        return reading.document is not None and reading.document.closed

    def set_closed(self) -> None:
        """Close the rendezvous: every agent stops at its next rendezvous, and no node joins any more."""
        if not self._close(time.monotonic() + self.timings.close):
            raise self.framework.timeout_error(f"the rendezvous {self.run_id} could not be closed in time")

    def shutdown(self) -> bool:
        """Close the rendezvous if this agent's workers succeeded, otherwise leave it; only the first call decides.

        The elastic agent calls it on every exit path: after its workers succeeded, after they
        failed for good, and (tensorplay) on a SIGTERM. Only success closes; otherwise this node
        leaves and the survivors re-form. Returns False when that could not be written in the
        close timeout.
        """
        if self._shutdown_result is None:
            if self.succeeded:  # said at WARNING, the default level: why this agent exits 0
                logger.warning(
                    "run %s finished: this agent's workers succeeded; it closes Rendezvous %s and exits",
                    self.run_id,
                    self._where,
                )
            self._shutdown_result = self._end(self._close if self.succeeded else self._leave, self.timings.close)
        return self._shutdown_result

    def _end(self, end: Callable[[float], bool], seconds: float) -> bool:
        """``end`` (a close or a leave) within ``seconds``, then stop this node's bootstrap store."""
        try:
            return end(time.monotonic() + seconds)
        finally:
            self._stop_bootstrap_store()

    # -- asking and waiting -------------------------------------------------------------------

    def _own(self, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """``obj`` if it is this run's Rendezvous; None (deleted, for this run) if it is another of the same name."""
        if obj is None or str((obj.get("metadata") or {}).get("uid")) != self.rendezvous_uid:
            return None
        return obj

    def _reading_of(self, obj: dict[str, Any]) -> RendezvousReading:
        try:
            return read_rendezvous(obj, self.run_id, self._shared.decoded.decode)
        except StateDocumentError as exc:
            raise self.framework.state_error(
                f"The rendezvous state in {self._where} was refused, and nothing was changed: {exc}."
            ) from exc

    def _call(
        self, call: Callable[[], T], deadline: float | None, what: str, verb: str, resource: str, unreachable: str
    ) -> T:
        """``call`` retried until ``deadline`` (the join waits out an outage until its join timeout, a leave
        until the close timeout, the leave at exit ``EXIT_LEAVE_SECONDS``; else ``retry_timeout`` from now).
        ``{seconds}`` in ``unreachable`` becomes the seconds it was retried for.

        Raises:
            RendezvousConnectionError: it failed (``Framework.api_failure``: ``unreachable`` unless refused).
        """
        now = time.monotonic()
        until = now + self._retry_timeout if deadline is None else deadline
        unreachable = unreachable.replace("{seconds}", f"{max(0.0, until - now):.0f}")
        unreachable += " See the inner exception for details."
        try:
            return call_with_retries(call, deadline=until, what=what)
        except KubernetesApiError as exc:
            raise self.framework.api_failure(exc, verb, resource, self.namespace, unreachable) from exc

    def _read(self, deadline: float | None = None) -> RendezvousReading:
        """The Rendezvous from the process's watch (no request), or a GET while the watch is down (until ``deadline``).

        Raises:
            RendezvousClosedError: the Rendezvous was deleted.
        """

        def get() -> Any:
            try:
                return self._api.request("GET", resource_path(RENDEZVOUS_PLURAL, self.namespace, self.rendezvous_name))
            except NotFoundError:
                return None

        if self._watch.healthy:
            obj = self._watch.get(self.rendezvous_name)
        else:
            unreachable = "The Kubernetes API server could not be reached for {seconds} s."
            obj = self._call(get, deadline, f"GET rendezvous {self._where}", "get", RENDEZVOUS_PLURAL, unreachable)
        obj = self._own(obj)
        if obj is None:
            raise self.framework.closed_error(f"The Rendezvous {self._where} no longer exists (deleted).")
        return self._reading_of(obj)

    def _ask(self, desire: Desire, round_number: int, deadline: float | None = None) -> None:
        """Write ``desire`` for ``round_number`` on this node's Lease until ``deadline`` (a merge patch)."""
        lease = self._lease
        lease.round = round_number
        unreachable = f"The Kubernetes API server did not take this node's {desire.value} request."
        what = f"ask to {desire.value} on {lease.describe()}"
        self._call(lambda: lease.update(desire), deadline, what, "patch", "leases", unreachable)
        if desire is Desire.JOIN:
            self._renewer.add(lease)
        else:
            self._renewer.remove(lease)
        self.stats.add("requests")
        logger.info("node %s asks to %s (round %d)", self.node, desire.value, round_number)
        self._folder.wake()

    def _settle(
        self, desire: Desire, deadline: float, last_members: frozenset[NodeId] | None = None, *, ask: bool = True
    ) -> RendezvousReading:
        """Ask for ``desire`` (unless the state has it already: ``ask=False``) and wait until the state shows it
        taken in (a join: a complete round with this node).

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousTimeoutError: not taken in by ``deadline``.
        """
        reading = self._read(deadline)
        asked = join_scope(reading.document) if desire is Desire.JOIN else self._lease.round
        if ask and not (desire is Desire.JOIN and self.rejoin_pending):
            self._ask(desire, asked, deadline)
        waiting_since = progress_logged = time.monotonic()
        last_held: str | None = None
        last_change = waiting_since
        while True:
            document = reading.document
            if reading.close_requested or (document is not None and document.closed):
                raise self.framework.closed_error(f"the Rendezvous {self._where} is closed")
            if desire is Desire.JOIN and self._fenced(reading):
                asked = join_scope(document)
                self._ask(desire, asked, deadline)
                last_change = time.monotonic()
            if desire is Desire.JOIN and self.rejoin_pending:
                # Evicted, waiting out FENCED_REJOIN_PAUSE: the evicted name asks and folds nothing meanwhile.
                seen = self._evicted_seen if self._evicted_seen is not None else time.monotonic()
                left = self._rejoin_pause - (time.monotonic() - seen)
                self._changed_since(reading.version, max(WATCH_CATCH_UP_PAUSE, left))
                reading = self._read(deadline)
                continue
            if desire is Desire.LEAVE and satisfied(document, self.node, desire):
                return reading
            if desire is Desire.JOIN and document is not None:
                if document.complete and self.node in document.participants:
                    return reading
                if role_of(document, self.node) is None and join_scope(document) != asked:
                    # Overtaken: the round it asked for formed or ended before a fold took the join in.
                    self.stats.add("overtaken")
                    asked = join_scope(document)
                    self._ask(desire, asked, deadline)
                    last_change = time.monotonic()
                if document.complete:
                    last_members = frozenset(document.participants)
            now = time.monotonic()
            held = reading.held.get(str(self.node)) if desire is Desire.JOIN else None
            spare = document is not None and role_of(document, self.node) == "redundant"
            if desire is Desire.JOIN and spare:
                # A spare waits as long as it is one (torch's redundancy list never times out either). A node its
                # Kubernetes Node holds back does not: a hold counts against the join timeout, so it ends.
                deadline = max(deadline, now + self.timings.join)
            if now > deadline:
                if desire is Desire.JOIN:
                    self._give_up()
                raise self.framework.timeout_error(
                    f"node {self.node} was not taken into a round of {self._where} within "
                    f"{self.timings.join if desire is Desire.JOIN else self.timings.close:g} s"
                    + (f"; it was held back all along: {held}" if held is not None else "")
                )
            if held is not None and (held != last_held or now - progress_logged >= PROGRESS_LOG_SECONDS):
                progress_logged, last_held = now, held
                logger.info(
                    "node %s waits, not admitted to a new round: %s (Rendezvous %s)", self.node, held, self._where
                )
            elif desire is Desire.JOIN and document is not None and now - progress_logged >= PROGRESS_LOG_SECONDS:
                progress_logged = now
                line = forming_line(
                    document,
                    min_nodes=self._join_settings.min_nodes,
                    waited=now - waiting_since,
                    last_members=last_members,
                )
                if line is not None:
                    logger.info("%s (Rendezvous %s)", line, self._where)
            grace = self._grace()
            if now - last_change >= grace and held is None and self._needs_fold(document, desire):
                self._fold_myself()
                last_change = time.monotonic()
            if self._changed_since(reading.version, min(grace, max(0.0, deadline - now) + 0.01)):
                last_change = time.monotonic()
            reading = self._read(deadline)

    def _changed_since(self, version: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for the watch to show a version other than ``version`` (or the object gone)."""

        def changed() -> bool:
            obj = self._watch.get(self.rendezvous_name)
            return obj is None or obj["metadata"]["resourceVersion"] != version

        return self._watch.wait_for(changed, timeout)

    def _grace(self) -> float:
        """Seconds to wait for a writer before folding itself: longer while a writer is alive."""
        if self._folder.leader:
            return 1.0
        if self._folder.elector.holder_alive:
            return 2.0
        return random.uniform(0.3, 0.8)

    def _needs_fold(self, document: RendezvousDocument | None, desire: Desire) -> bool:
        """Whether a fold is due: this node's request is not taken in, or a last call has ended."""
        if not satisfied(document, self.node, desire):
            return True
        if document is None or document.complete or document.deadline is None:
            return False
        return document.deadline.timestamp() < time.time()

    def _fold_myself(self) -> None:
        try:
            if self._folder.fold_pending():
                self.stats.add("self_folds")
        except KubernetesApiError as exc:
            logger.info("folding the pending requests of %s failed this time: %s", self._where, exc)

    def _give_up(self) -> None:
        """At the join timeout: ask to leave (as the framework removes itself), without waiting."""
        try:
            self._ask(Desire.LEAVE, self._lease.round, time.monotonic() + self.timings.heartbeat)
        except self.framework.rendezvous_error as exc:
            logger.info("could not withdraw the join of %s: %s", self.node, exc)

    # -- confirming a round -------------------------------------------------------------------

    def _round_store(self, round_number: int) -> KubernetesPrefixStore:
        """The agent's view of one round's store: keys prefixed and labelled, sets pipelined, rank keys bundled."""
        prefix = self.framework.round_prefix.format(run_id=self.run_id, round=round_number)
        once = self.framework.written_once
        return KubernetesPrefixStore(
            prefix, self._store, round_number, self._saw_write, pipelined=True, written_once=once
        )

    def _saw_write(self, key: str) -> None:
        if key.startswith(self.framework.exit_barrier_prefix):
            self.succeeded = True  # the agent enters its exit barrier only after its workers succeeded

    def wrap_store(self, store: KubernetesPrefixStore) -> Any:
        """The round's store as the framework's agent wants it (an adapter may wrap it)."""
        return store

    def _confirm(self, document: RendezvousDocument) -> Any:
        """Rank 0 hosts a fresh bootstrap store and publishes it under the round's prefix; the others read it."""
        rank, world_size = document.participants[self.node], len(document.participants)
        round_store = self._round_store(document.round)
        self._stop_bootstrap_store()
        server_port = None
        server_seconds = 0.0
        if rank == 0 and self.use_agent_store:
            began = time.monotonic()
            self._bootstrap_server = self.framework.create_store_server(self.node.addr)
            server_port = int(self._bootstrap_server.port)
            server_seconds = time.monotonic() - began
        served = time.monotonic()
        before = dict(self._store.stats)
        # rank 0's two keys (address, port) are written once: one bundle; the others read them from the watch
        store_info = self.framework.store_info_class.build(
            rank, round_store, local_addr=self.node.addr, server_port=server_port
        )
        round_store.flush()
        self.bootstrap_seconds = {
            "server": server_seconds,
            "address": time.monotonic() - served,
            "requests": self._store.stats["requests"] - before["requests"],
            "retries": self._store.stats["conflicts"] - before["conflicts"],
        }
        if rank == 0:  # after publishing: the cleanup is off the round's critical path
            kept = range(max(0, document.round - ROUNDS_KEPT_BEHIND), document.round + ROUNDS_KEPT_AHEAD + 1)
            self._store.delete_rounds_except(kept)
        obj = self._watch.get(self.rendezvous_name) or {}
        logger.info(
            "round %d formed%s: rank %d of %d, bootstrap store %s:%s",
            document.round,
            completed_by_text(obj.get("status"), document.round),
            rank,
            world_size,
            store_info.master_addr,
            store_info.master_port,
        )
        return self.framework.info_class(self.wrap_store(round_store), rank, world_size, store_info)

    def _stop_bootstrap_store(self) -> None:
        server, self._bootstrap_server = self._bootstrap_server, None
        if server is not None and hasattr(server, "stop"):
            try:
                server.stop()
            except Exception as exc:  # noqa: BLE001 - an old server that will not stop is harmless
                logger.debug("stopping the previous bootstrap store failed: %s", exc)

    # -- leaving and closing ------------------------------------------------------------------

    def _leave(self, deadline: float, *, at_exit: bool = False) -> bool:
        """Leave without closing; False when that could not be written by ``deadline``.

        ``at_exit``: a Lease or namespace found gone (404, or a namespace being deleted) means there is
        nothing to leave, said at debug level; any other failure warns.
        """
        try:
            reading = self._read(deadline)
            if reading.document is not None and not reading.document.closed and not reading.close_requested:
                self._settle(Desire.LEAVE, deadline)
                logger.info("left the rendezvous %s without closing it (the agent did not succeed)", self.run_id)
                return True
        except self.framework.closed_error:
            pass
        except self.framework.rendezvous_error as exc:
            if at_exit and is_gone(exc.__cause__):
                logger.debug("nothing to leave in %s at exit: %s", self.run_id, exc)
                return True
            logger.warning("could not leave the rendezvous %s: %s", self.run_id, exc)
            return False
        self._renewer.remove(self._lease)  # nothing to leave: no state, or a closed rendezvous takes no one
        return True

    def _close(self, deadline: float) -> bool:
        """Fold a close into the state (with whatever is pending); False when not written by ``deadline``."""
        self._renewer.remove(self._lease)

        def closed() -> bool:
            """One look, and one fold of the close if it is not closed yet: whether the rendezvous is closed."""
            try:
                reading = self._read(deadline)
                if reading.document is not None and reading.document.closed:
                    return True  # closed by this fold, by another agent's, or by a person (an intent)
                if not self._folder.fold_once(close=True):
                    self._changed_since(reading.version, 1.0)
            except self.framework.closed_error:
                return True
            return False

        failed = (KubernetesApiError, self.framework.rendezvous_error)
        try:
            while time.monotonic() < deadline:
                if retry(
                    CLOSE_RETRY,
                    closed,
                    retryable=lambda exc: isinstance(exc, failed),
                    deadline=deadline,
                    what=f"closing the rendezvous {self.run_id}",
                ):
                    return True
        except failed as exc:
            logger.info("closing the rendezvous %s failed: %s", self.run_id, exc)
        logger.warning("could not close the rendezvous %s in time", self.run_id)
        return False

    def _record_closed(self) -> None:
        """Write the closed state a person's close produced (best effort), so the summary and kubectl say Closed."""
        try:
            self._folder.fold_pending()
        except Exception as exc:  # noqa: BLE001 - the object may be gone already; the exit stays clean
            logger.info("could not record the closed state: %s", exc)

    def _leave_at_exit(self) -> None:
        """At interpreter exit: leave if ``shutdown()`` was never called (torch's launcher after a signal).

        Nothing to leave, said at debug level and without a request: this node's last request was a leave
        (or it never asked), or this process released the Rendezvous already (``shared.release``: its
        watch and renewals are stopped, the heartbeat expiry takes the node out). A Rendezvous closed or
        deleted, or a namespace gone, is found quietly too (``_leave``); any other failure warns once.
        """
        if self._shutdown_result is not None:
            return
        if self._lease.desire is not Desire.JOIN or self._shared.stopped:
            logger.debug("nothing to leave in %s at exit (node %s)", self.run_id, self.node)
            self._shutdown_result = self._end(lambda _: True, 0.0)
            return
        logger.info(
            "exiting without a shutdown of the rendezvous handler (a signal ended the agent): leaving %s",
            self.run_id,
        )
        self._shutdown_result = self._end(lambda deadline: self._leave(deadline, at_exit=True), EXIT_LEAVE_SECONDS)


__all__ = ["BACKEND_NAME", "NativeHandler"]
