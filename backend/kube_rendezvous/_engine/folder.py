"""The folder: the one writer that folds the nodes' requests into the Rendezvous, and decides expiry.

Whoever holds the writer Lease (``writer_lease.WriterLease``) runs ``Folder.run``'s leader loop: it
watches the node Leases and the Rendezvous, and whenever a request changed, a node's Lease
expired (unchanged for its expiry on this folder's clock), or a last call ended, it folds every
pending request into the state document (``folding.fold``) and writes it with one
compare-and-swap on the Rendezvous's resourceVersion. The operator runs a folder with
``preferred=True`` for every Rendezvous; every agent process runs one with ``preferred=False``,
which takes over when no operator holds it: within one retry (4 s) when the writer released the
Lease, and within ``candidate_wait``'s bound (14.2 s after its last renewal) when it died.

Two folders at once cannot lose anything: the requests are durable on the Leases, each fold
starts from the state it read, and the compare-and-swap admits one of them; the loser folds
again from the winner's state. An agent that waited too long for its request to be folded
calls ``fold_once`` itself (whoever wins the compare-and-swap folds everything pending).

This module imports no framework and no kopf: the operator and both adapters use it.

Not guaranteed: expiry needs observation. A folder that has just taken over calls no node
dead until one expiry after it first saw that node's Lease.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from .._kube.election import ElectorRun, LeaderElectionConfig
from .._kube.kubeapi import (
    RENDEZVOUS_LABEL,
    RENDEZVOUS_PLURAL,
    ConflictError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    resource_path,
    retry_after_of,
)
from .._kube.leases import LeaseObservations, NodeRecord, list_node_records, record_of
from .._kube.status import write_status
from .._kube.watchcache import WatchCache
from .._kube.writer_lease import WriterLease, WriterLock, dead_writer_seeds
from .._rules.counters import Counters
from .._rules.document import NodeId, RendezvousDocument, StateDocumentError, decode_document, encode_document
from .._rules.election_rules import LEASE_PLURAL
from .._rules.folder_rules import (
    Carry,
    Desire,
    Hold,
    JoinSettings,
    TrainingPods,
    completion_rule,
    fold_placed,
)
from .._rules.intents import EVICTED_HEARTBEAT, close_reason, fold_intents
from .._rules.leases_rules import ANNOTATION_DESIRE, ANNOTATION_ROUND, LABEL_LEASE
from .._rules.placement import STATUS_HELD_LIMIT, Domain, PlacementSpec, RankOrder, domain_ranges, topology_reason
from .._rules.retries import FAILED_FOLD_PAUSE
from .._rules.settings import DEFAULT_HEARTBEAT_EXPIRY
from .._rules.summary import departure_of, summarize_document

logger = logging.getLogger(__name__)

#: The writer election: a holder renews every 2 s and stops folding 7 s after the start of its last successful
#: renewal, below the 10 s after which a candidate may take over; a renewal that hangs is abandoned after 3 s.
WRITER_ELECTION = LeaderElectionConfig(lease_duration=10.0, renew_deadline=7.0, retry_period=2.0, request_timeout=3.0)
#: Seconds between an agent's checks whether the writer Lease is free (80-100 % of it, jittered).
CANDIDATE_RETRY_SECONDS = 4.0
#: Seconds before a candidate tries again after an election step the API server did not answer.
ELECTION_FAILED_SECONDS = 1.0
#: Seconds after the writer Lease as last seen would turn stale that a candidate looks again.
STALE_MARGIN_SECONDS = 0.2
#: Seconds between the writer's sweeps for idle node Leases (also the least idle time to delete one).
GARBAGE_SECONDS = 60.0
#: Seconds between two folds by the agents of one process while no writer folds.
SELF_FOLD_SECONDS = 0.25
#: Seconds to gather requests that arrive together into one fold, plus one second per this many nodes.
BATCH_SECONDS = 0.03
BATCH_NODES_PER_SECOND = 5000
#: Seconds between the writer's checks for expired nodes when nothing else wakes it.
TICK_SECONDS = 0.5
#: Of the shortest node expiry: how long the watch of the node Leases may hear nothing before it is listed
#: again (live nodes renew every keep-alive, a third of the expiry by default).
QUIET_FRACTION = 0.4
#: The carry rule vouches for a member of a broken round whose Lease this folder saw change within this
#: fraction of its expiry (one keep-alive and a half, by default): a member that missed more may be dead.
CARRY_FRESH_FRACTION = 0.5
#: How an agent's folder names itself as writer: this prefix, then its node (``addr_pid_localid``).
AGENT_IDENTITY_PREFIX = "agent/"


def candidate_wait(until_stale: float | None, jitter: float) -> float:
    """Seconds an agent waits before it looks at the writer Lease again.

    ``jitter`` (0.8-1.0) of ``CANDIDATE_RETRY_SECONDS``, but no later than ``STALE_MARGIN_SECONDS``
    after the Lease as last seen would turn stale (``until_stale``). So a writer that died is
    replaced at most ``CANDIDATE_RETRY_SECONDS + WRITER_ELECTION.lease_duration + STALE_MARGIN_SECONDS``
    (14.2 s) plus one request after its last renewal: a candidate sees that renewal's version within
    one retry, and takes the Lease at its first look after the version went unchanged for the
    Lease's duration on its own clock.
    """
    wait = CANDIDATE_RETRY_SECONDS * jitter
    if until_stale is None:
        return wait
    return min(wait, max(0.05, until_stale + STALE_MARGIN_SECONDS))


def owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    """An ownerReference to the Rendezvous ``obj`` (its Leases go when it goes)."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }


class Folder:
    """Folds requests for one Rendezvous; ``run`` elects and loops, ``fold_once`` folds now."""

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        *,
        identity: str,
        preferred: bool,
        rendezvous: WatchCache,
        default_expiry: float = DEFAULT_HEARTBEAT_EXPIRY,
        decode: Callable[[str], RendezvousDocument] = decode_document,
        training_pods: Callable[[], TrainingPods | None] | None = None,
        election: LeaderElectionConfig = WRITER_ELECTION,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.identity = identity
        self.preferred = preferred
        self.default_expiry = default_expiry
        #: The watch of the Rendezvous object (started by whoever made it).
        self.rendezvous = rendezvous
        self._decode = decode
        #: The job's training pods, where this folder knows them (the operator's pod watch); None: unknown.
        self.training_pods = training_pods
        self.elector = WriterLease(WriterLock(api, namespace, rendezvous_name, identity, preferred=preferred), election)
        self.observations = LeaseObservations(self.where)
        self.leases: WatchCache | None = None
        self.leader = False
        #: The last term in which this folder held the writer Lease (None: it never held it).
        self.term: ElectorRun | None = None
        self._lease_epoch = 0
        self._requests_seen: dict[str, tuple[object, ...]] = {}
        self._collected_at = time.monotonic()
        self._self_folded_at = -SELF_FOLD_SECONDS
        #: The topology domain of each node this folder saw placed (a lost member's pod is gone when it is
        #: lost; its spare is picked by the domain it had). Trimmed to the nodes of the last document.
        self._domains: dict[NodeId, Domain] = {}
        #: The nodes that were members of a formed round of run ``_members_run`` and still have a Lease: a cordon
        #: alone does not hold them back (``Placement.hold_for``), so a member whose round broke keeps training.
        self._members: set[NodeId] = set()
        self._members_run: str | None = None
        self._wake = threading.Event()
        self._fold_lock = threading.Lock()
        #: Counters for tests and benchmarks.
        self.stats = Counters("folds", "writes", "conflicts", "expired", "quiet_refreshes")
        self.rendezvous.add_listener(lambda _: self._wake.set())

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.rendezvous_name}"

    def wake(self) -> None:
        """Ask the leader loop to fold soon (a request changed)."""
        self._wake.set()

    # -- one fold --------------------------------------------------------------------------

    def _records(self) -> list[NodeRecord]:
        if self.leases is not None and self.leases.healthy:
            return [record for item in self.leases.objects().values() if (record := record_of(item)) is not None]
        records, _ = list_node_records(self._api, self.namespace, self.rendezvous_name)
        return records

    def _object(self) -> dict[str, Any] | None:
        if self.rendezvous.healthy:
            return self.rendezvous.get(self.rendezvous_name)
        try:
            obj: dict[str, Any] = self._api.request(
                "GET", resource_path(RENDEZVOUS_PLURAL, self.namespace, self.rendezvous_name)
            )
            return obj
        except NotFoundError:
            return None

    def fold_pending(self) -> bool:
        """``fold_once`` for an agent whose request waited too long; the agents of one process
        fold at most once per ``SELF_FOLD_SECONDS`` between them."""
        now = time.monotonic()
        with self._fold_lock:
            if now - self._self_folded_at < SELF_FOLD_SECONDS:
                return False
            self._self_folded_at = now
        # While another folder (the operator) holds the writer Lease, the nodes it held back stay held.
        return self.fold_once(keep_held=self.elector.holder_alive and not self.leader)

    def fold_once(self, *, judge_expiry: bool = False, close: bool = False, keep_held: bool = False) -> bool:
        """Fold every pending request (and ``close`` the rendezvous) into the current state; True when written.

        ``keep_held``: a folder that does not know where nodes run keeps the nodes the status says are
        held (``status.heldNodes``) held, as the writer that held them would.

        Raises:
            KubernetesApiError: the API server refused or did not answer (nothing lost:
                the requests stay on their Leases for the next fold).
        """
        with self._fold_lock:
            obj = self._object()
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return False
            return self._fold(obj, self._records(), judge_expiry=judge_expiry, close=close, keep_held=keep_held)

    def _fold(
        self,
        obj: dict[str, Any],
        records: list[NodeRecord],
        *,
        judge_expiry: bool,
        close: bool,
        keep_held: bool = False,
    ) -> bool:
        self.stats.add("folds")
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        now = datetime.now(timezone.utc)
        stored_run = status.get("runId")
        run_id = self._run_of(stored_run, records, judge_expiry)
        if run_id is None:
            return False
        document: RendezvousDocument | None = None
        if status.get("state") and stored_run == run_id:
            try:
                document = self._decode(status["state"])
            except StateDocumentError as exc:
                logger.warning("not folding into %s: its state is invalid (%s)", self.where, exc)
                return False
        stored = document
        close = close or bool(spec.get("closed"))
        document = fold_intents(document, close=close, evicted=status.get("evictedNodes") or [])
        current = [record for record in records if record.run_id == run_id]
        dead: set[NodeId] = set()
        if document is not None:
            dead |= {node for node, beat in document.last_heartbeats.items() if beat == EVICTED_HEARTBEAT}
        reasons = dict.fromkeys(dead, "Evicted")
        leases = self.leases
        judge_expiry = judge_expiry and self._lease_view_fresh(current)  # a view that may miss renewals: no expiry
        if judge_expiry and leases is not None and leases.epoch != self._lease_epoch:
            # The watch listed again: renewals in the gap went unseen, so every clock starts again.
            self._lease_epoch = leases.epoch
            self.observations.restart()
        if judge_expiry:
            self._observe(current)
            # Nodes without a Lease count only where nodes keep Leases: agents that heartbeat in the
            # state itself (compare-and-swap mode, the first release) are never expired from here.
            named = document.nodes() if document is not None and current else []
            expired = self.observations.expired(current, named, self.default_expiry)
            if expired & set(named):
                self.stats.add("expired", len(expired & set(named)))
                logger.warning(
                    "%s: removing nodes whose Lease was not renewed within its expiry: %s",
                    self.where,
                    ", ".join(sorted(str(node) for node in expired & set(named))),
                )
            reasons.update(dict.fromkeys(expired - dead, "Expired"))
            dead |= expired
        requests = [record.request() for record in current if record.node not in dead]
        reasons.update({request.node: "Left" for request in requests if request.desire is Desire.LEAVE})
        settings = self._settings(spec, current)
        pods = self.training_pods() if self.training_pods is not None else None
        if pods is not None:
            pods = pods.without_gone_agents(dead, [record.node for record in current if record.node not in dead])
        # Carry only where the participants keep Leases (native handlers): a stock handler over the
        # compare-and-swap backend keeps its heartbeats in the state and would not follow a carried round.
        leased = {record.node for record in current}
        native = document is not None and all(node in leased or node in dead for node in document.participants)
        carry = self._vouched(pods, current) if pods is not None and judge_expiry and native and leased else None
        self._remember_members(run_id, stored, leased)
        domain, hold = self._placement(pods, status if keep_held else None)
        result = fold_placed(
            document, requests, dead=dead, now=now, settings=settings, pods=pods, carry=carry, domain=domain, hold=hold
        )
        folded = result.document
        self._remember_members(run_id, folded, leased)
        if folded == (stored or RendezvousDocument()) and (stored_run == run_id or stored is None):
            return False  # nothing to change in what is stored
        departure = departure_of(stored, folded, reasons, now, status.get("lastDeparture"))
        rule = completion_rule(document, folded, settings, now)
        if rule is not None and rule is not rule.MAX_NODES:
            logger.info("%s: round %d completed (%s)", self.where, folded.round, rule.value)
        keys = self._topology_keys(spec)
        placed = self._placement_status(folded, rule is not None, domain, pods, result.held, keys)
        # What the agents follow (their --nnodes), which kubectl get rdzv shows: it may differ from the spec's.
        placed.update(minNodes=settings.min_nodes, maxNodes=settings.max_nodes)
        if folded.closed and (stored is None or not stored.closed):
            placed["closeReason"] = close_reason(obj)  # who closed this run, and when (the status says it)
        if domain is not None:
            kept = set(folded.nodes())
            self._domains = {node: value for node, value in self._domains.items() if node in kept}
        return self._write(obj, folded, run_id, now, departure, None if rule is None else rule.value, placed)

    def _remember_members(self, run_id: str, document: RendezvousDocument | None, leased: set[NodeId]) -> None:
        """Remember the members of ``document``'s round if it formed (``_members``: they trained in run ``run_id``,
        so a cordon alone no longer holds them); forget them with their Lease, and all of them with the run."""
        if run_id != self._members_run:
            self._members, self._members_run = set(), run_id
        if document is not None and document.complete:
            self._members |= set(document.participants)
        self._members &= leased | set(document.participants if document is not None else ())

    def _run_of(self, stored_run: str | None, records: list[NodeRecord], judge_expiry: bool) -> str | None:
        """The run this fold is for: the stored one while one of its nodes has a Lease that has not expired (asking to
        join, or to leave: the survivors of a broken round leave it before they join the next), else the newest other
        run that has a node asking to join, else the newest run with a Lease at all.

        A run whose agents were all killed (its Job deleted, its pods gone) leaves its Leases behind, asking to join
        for ever; before this rule those Leases kept the stored run the run of every fold, so a re-run under the same
        name with a new ``--rdzv-id`` was never folded (the generated lifecycle test: run, SIGTERM, SIGKILL of the
        rest, run). The first version of the rule kept the stored run only while one of its nodes asked to *join*:
        when every member of the re-run's round left it at once (one SIGTERMed, the survivor leaving to re-join), the
        dead run's Leases took the fold, and the survivor waited for ever (seed 318 of the generated test). Expiry
        is judged only where it may be (``judge_expiry``), as for the nodes of a round.
        """
        if not records:
            return stored_run
        own = [record for record in records if record.run_id == stored_run]
        if own:
            if not (judge_expiry and self._lease_view_fresh(own)):
                return stored_run  # its nodes cannot be judged now: it stays the run
            self._observe(own)
            expired = self.observations.expired(own, [], self.default_expiry)
            if any(record.node not in expired for record in own):
                return stored_run
        others = [record for record in records if record.run_id != stored_run]
        joining = [record for record in others if record.desire is Desire.JOIN]
        if joining:
            return max(joining, key=lambda record: record.desired_at).run_id
        return stored_run if own else max(records, key=lambda record: record.desired_at).run_id

    def _placement(
        self, pods: TrainingPods | None, held_status: dict[str, Any] | None
    ) -> tuple[Callable[[NodeId], Domain | None] | None, Hold | None]:
        """The placement rules of this fold: each node's domain and hold, from the pods' placements where this
        folder knows them (the operator), else the holds ``held_status`` lists (``keep_held``), else none."""
        if pods is not None and pods.placed:
            placement_of = pods.placement_of()
            known = self._domains

            def domain(node: NodeId) -> Domain | None:
                placement = placement_of(node)
                if placement is None:
                    return known.get(node)
                known[node] = placement.domain
                return placement.domain

            def hold(node: NodeId) -> str | None:
                placement = placement_of(node)
                return None if placement is None else placement.hold_for(node in self._members)

            return domain, hold
        if held_status is not None:
            held = {
                str(item.get("node")): str(item.get("reason") or "held")
                for item in held_status.get("heldNodes") or []
                if isinstance(item, dict)
            }
            if held:
                return None, lambda node: held.get(str(node))
        return None, None

    def _placement_status(
        self,
        document: RendezvousDocument,
        formed: bool,
        domain: Callable[[NodeId], Domain | None] | None,
        pods: TrainingPods | None,
        held: Mapping[NodeId, str],
        keys: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """``status.topology`` (when a round formed in this write) and ``status.heldNodes``/``heldCount``."""
        status: dict[str, Any] = {
            "heldCount": len(held) or None,
            "heldNodes": [{"node": str(node), "reason": held[node]} for node in sorted(held)[:STATUS_HELD_LIMIT]]
            or None,
        }
        if formed:
            if domain is not None:
                ranked = sorted(document.participants, key=lambda node: document.participants[node])
                status["topology"] = {"order": RankOrder.TOPOLOGY.value, "domains": domain_ranges(ranked, domain)}
                reason = topology_reason(keys, [domain(node) for node in ranked])
                if reason is not None:
                    status["topology"]["reason"] = reason
            else:
                why = (
                    "the operator may not read Kubernetes Nodes"
                    if pods is not None
                    else "ranked by a folder that does not know the Nodes (the operator folds when it runs)"
                )
                status["topology"] = {"order": RankOrder.ADDRESS.value, "reason": why}
        return status

    @staticmethod
    def _topology_keys(spec: dict[str, Any]) -> tuple[str, ...]:
        """The keys the spec names in ``topology.keys`` (none when unset: most of the well-known default keys are
        missing on any one cluster, which is no typo; none for a spec the operator reports as invalid)."""
        if (spec.get("topology") or {}).get("keys") is None:
            return ()
        try:
            return PlacementSpec.from_spec(spec).topology_keys
        except ValueError:
            return ()

    def _vouched(self, pods: TrainingPods, records: list[NodeRecord]) -> Carry:
        """The carry rule's judgement: a member whose pod is live and whose Lease changed recently."""
        on_live_pod = pods.on_live_pod()
        expiry = {record.node: record.expiry_seconds for record in records}
        return lambda node: (
            node in expiry
            and on_live_pod(node)
            and self.observations.changed_within(node, expiry[node] * CARRY_FRESH_FRACTION)
        )

    @staticmethod
    def _settings(spec: dict[str, Any], records: list[NodeRecord]) -> JoinSettings:
        if records:
            return collections.Counter(record.settings for record in records).most_common(1)[0][0]
        low = int(spec.get("minNodes") or 1)
        return JoinSettings(low, max(low, int(spec.get("maxNodes") or low)), timedelta(seconds=30))

    def _write(
        self,
        obj: dict[str, Any],
        document: RendezvousDocument,
        run_id: str,
        now: datetime,
        departure: dict[str, Any] | None,
        completed_by: str | None = None,
        placed: dict[str, Any] | None = None,
    ) -> bool:
        encoded = encode_document(document)
        status: dict[str, Any] = {"state": encoded, "stateBytes": len(encoded), "runId": run_id, **(placed or {})}
        status.update(
            summarize_document(
                document, now=now, writer=self.identity, previous=obj.get("status"), completed_by=completed_by
            )
        )
        if departure is not None:
            status["lastDeparture"] = departure
        if (obj.get("status") or {}).get("runId") not in (None, run_id):
            # A new run starts without the old run's evictions and departures.
            status.update(evictedNodes=None, recentWriteIds=[], lastDeparture=departure)
        try:
            written = write_status(
                self._api, self.namespace, self.rendezvous_name, status, token=obj["metadata"]["resourceVersion"]
            )
        except ConflictError:
            self.stats.add("conflicts")
            return False
        except NotFoundError:
            return False
        self.stats.add("writes")
        self.rendezvous.install(written)
        return True

    # -- the elected loop ------------------------------------------------------------------

    def run(self, stopped: threading.Event, on_error: Callable[[Exception], None] | None = None) -> None:
        """Elect, and fold while holding the writer Lease, until ``stopped``.

        Each term is one ``ElectorRun`` of the writer Lease: it acquires, renews on its own thread, and
        says when to stop folding (``holding``); a term that ended is followed by a new election.
        """
        while not stopped.is_set():
            self._own_writer_lease()
            term = ElectorRun(self.elector)
            if not term.acquire(stopped, self._candidate_pause):
                break
            self.leader, self.term = True, term
            self._start_lease_watch()
            term.start()
            try:
                self._fold_while(term, stopped, on_error)
            finally:
                term.stop()
            if not term.holding():
                self.leader = False
                logger.info(
                    "%s stops folding for %s: its writer Lease was not renewed in time", self.identity, self.where
                )
        if self.leader:
            self.elector.release()
        self._stop_lease_watch()

    def _own_writer_lease(self) -> None:
        """Let a writer Lease this folder creates go with the Rendezvous (its ownerReference), once known."""
        if self.elector.writer_lock.owner is None:
            with contextlib.suppress(KubernetesApiError):
                if (obj := self._object()) is not None:
                    self.elector.writer_lock.owner = owner_reference(obj)

    def _candidate_pause(self, failed: bool) -> float:
        """Seconds until the next election step of a folder that does not hold the writer Lease."""
        self.leader = False
        self._stop_lease_watch()
        self._own_writer_lease()
        if failed:  # not a stale Lease to take at once: the API server did not answer
            return ELECTION_FAILED_SECONDS * random.uniform(0.8, 1.2)
        if self.preferred:
            return self.elector.config.retry_period * random.uniform(0.8, 1.2)
        return candidate_wait(self.elector.seconds_until_stale(), random.uniform(0.8, 1.0))

    def _fold_while(
        self, term: ElectorRun, stopped: threading.Event, on_error: Callable[[Exception], None] | None
    ) -> None:
        """Fold whatever is asked while ``term`` holds the writer Lease."""
        while not stopped.is_set() and term.holding():
            if time.monotonic() > self._collected_at + GARBAGE_SECONDS:
                self._collected_at = time.monotonic()
                self._collect_garbage()
            timeout = self._tick()
            woken = self._wake.wait(timeout)
            if stopped.is_set():
                break
            if not woken and timeout >= TICK_SECONDS and not self._expiry_due():
                continue  # a quiet tick: nothing asked, no last call ending, nobody expired
            self._wake.clear()
            # Gather the requests that arrive together: longer for larger jobs (fewer writes).
            stopped.wait(BATCH_SECONDS + len(self._requests_seen) / BATCH_NODES_PER_SECOND)
            try:
                self.fold_once(judge_expiry=True)
            except KubernetesApiError as exc:
                if on_error is not None:
                    on_error(exc)
                logger.info("fold for %s failed this time: %s", self.where, exc)
                stopped.wait(max(FAILED_FOLD_PAUSE, retry_after_of(exc)))  # never sooner than a 429's Retry-After

    def _collect_garbage(self) -> None:
        """Delete node Leases that stopped changing long ago and whose node the state no longer names."""
        leases = self.leases
        if leases is None or not leases.healthy:
            return
        document = self._stored(self.rendezvous.get(self.rendezvous_name))
        if document is None:
            return
        named = set(document.nodes())
        for name, item in leases.objects().items():
            record = record_of(item)
            if record is None or record.node in named:
                continue
            if self.observations.idle_for(record.node) > max(GARBAGE_SECONDS, 4 * record.expiry_seconds):
                try:
                    self._api.request("DELETE", resource_path(LEASE_PLURAL, self.namespace, name))
                    self.observations.forget(record.node)
                except NotFoundError:
                    pass
                except KubernetesApiError as exc:
                    logger.info("could not delete the idle Lease %s: %s", name, exc)
                    return

    def _expiry_due(self) -> bool:
        """Whether an expiry changes what a fold would do: a node the state names has a Lease that stopped changing
        for its expiry, or every Lease of the stored run did while another run asks to join (``_run_of`` hands the
        fold to that run then).

        Without the second half a writer that took over kept a killed run's fold for ever when that run's state
        named none of its nodes (a round just broken, no participants yet): the re-run's agents had asked before
        the takeover, renewed their Leases and asked nothing more, and nothing woke the writer (seed 449 of the
        generated lifecycle test)."""
        leases = self.leases
        obj = self.rendezvous.get(self.rendezvous_name)
        if leases is None or obj is None or not self._lease_view_fresh(None):
            return False
        if leases.epoch != self._lease_epoch:
            return True  # the fold restarts the observations
        records = [record for item in leases.objects().values() if (record := record_of(item)) is not None]
        self._observe(records)
        document = self._stored(obj) if records else None
        named = document.nodes() if document is not None else []
        expired = self.observations.expired(records, named, self.default_expiry)
        if expired & set(named):
            return True
        stored_run = (obj.get("status") or {}).get("runId")
        own = [record for record in records if record.run_id == stored_run]
        return (
            bool(own)
            and all(record.node in expired for record in own)
            and any(record.run_id != stored_run and record.desire is Desire.JOIN for record in records)
        )

    def _lease_view_fresh(self, records: list[NodeRecord] | None) -> bool:
        """Whether the watch of the node Leases can be trusted to show every renewal now.

        Live nodes renew every keep-alive, so a watch that heard nothing for longer than
        ``QUIET_FRACTION`` of the shortest expiry has gone silent (a dropped connection that TCP has
        not noticed yet) or every node is gone: it is listed again now, and expiry waits for it.
        """
        leases = self.leases
        if leases is None or not leases.healthy:
            return False
        expiries = [record.expiry_seconds for record in records or []] or [self.default_expiry]
        if leases.quiet_for() > min(expiries) * QUIET_FRACTION:
            self.stats.add("quiet_refreshes")
            leases.refresh()
            return False
        return True

    def _observe(self, records: list[NodeRecord]) -> None:
        """Observe the node Leases; just after taking the writer Lease from a dead agent writer,
        date that agent's node Lease from the writer Lease's last renewal (``dead_writer_seeds``)."""
        self.observations.observe(records)
        holder, self.elector.taken_from_stale = self.elector.taken_from_stale, None
        if holder is not None:
            for node, version, since in dead_writer_seeds(holder, records, AGENT_IDENTITY_PREFIX):
                self.observations.seed(node, version, since)
                logger.info(
                    "%s: the writer %s stopped renewing; its node's Lease counts as unchanged since then",
                    self.where,
                    holder.identity,
                )

    def _tick(self) -> float:
        """Seconds until the loop must look again: a last call ending, or the expiry check."""
        document = self._stored(self.rendezvous.get(self.rendezvous_name))
        if document is None or document.deadline is None:
            return TICK_SECONDS
        return min(TICK_SECONDS, max(0.0, (document.deadline - datetime.now(timezone.utc)).total_seconds() + 0.01))

    def _stored(self, obj: dict[str, Any] | None) -> RendezvousDocument | None:
        """The state document of ``obj`` (empty when it has none); None without ``obj`` or when it is invalid."""
        if obj is None:
            return None
        text = (obj.get("status") or {}).get("state")
        try:
            return self._decode(text) if text else RendezvousDocument()
        except StateDocumentError:
            return None

    def _start_lease_watch(self) -> None:
        if self.leases is None:
            self._lease_epoch = -1  # a new watch: observe every Lease afresh
            self._requests_seen = {}
            selector = f"{RENDEZVOUS_LABEL}={self.rendezvous_name},{LABEL_LEASE}=node"
            self.leases = WatchCache(
                self._api,
                resource_path(LEASE_PLURAL, self.namespace),
                {"labelSelector": selector},
                f"node Leases of {self.where}",
            )
            self.leases.add_listener(self._on_lease)
            self.leases.start()

    def _on_lease(self, lease: dict[str, Any] | None) -> None:
        """Wake the loop for a new or changed request, not for a heartbeat (a renewal changes no annotation)."""
        if lease is None:
            self._wake.set()
            return
        metadata = lease.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        request = (
            annotations.get(ANNOTATION_DESIRE),
            annotations.get(ANNOTATION_ROUND),
            metadata.get("deletionTimestamp"),
        )
        name = str(metadata.get("name"))
        if self._requests_seen.get(name) != request:
            self._requests_seen[name] = request
            self._wake.set()

    def _stop_lease_watch(self) -> None:
        if self.leases is not None:
            self.leases.stop()
            self.leases = None
