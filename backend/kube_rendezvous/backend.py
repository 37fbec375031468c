"""``KubernetesRendezvousBackend``: the rendezvous state as a typed document in a Rendezvous's status.

``get_state`` reads ``status.state``, decodes and validates the JSON state document
(``document``), folds the close and eviction intents in, and hands the framework a pickle that
this process made from the validated values. ``set_state`` turns the framework's state into a
document, validates it and writes it with a JSON merge patch of the status subresource that
carries ``metadata.resourceVersion`` (compare-and-swap: a stale token gets 409, nothing is
written). The same write stores the readable summary derived from that document.

Token semantics: the token is the object's ``metadata.resourceVersion``, an opaque string,
never parsed or ordered. ``set_state(state, token)`` writes only if ``token`` is the current
one; otherwise (stale, ``None`` while a state exists, or not a resourceVersion) nothing is
written and the current ``(state, token, False)`` is returned. Unlike the peer backends it
stores rendezvous states only: bytes that are not a pickled ``_RendezvousState`` get a
``RendezvousStateError``, and the state handed back is equal in meaning to the one written,
not byte-identical (it is re-pickled from the document).

Exactly once: each write carries a write id, kept in ``status.recentWriteIds`` (the last 8).
After a write with no clear answer (no answer, 429, 5xx) the object is read: the write id there
means it committed (``set_state`` answers ``has_set=True`` with the state and token as they are
now); a changed token means it never can; an unchanged token means it has not (yet), and the
same compare-and-swap is sent again: it commits at most once, because the token changes when it
does. A 409 after an unclear attempt is resolved the same way.

Outages: time while this process could not reach the API server does not count toward other
nodes' heartbeat expiry. For one heartbeat expiry after an outage, heartbeats older than its end
are handed to the framework moved forward by the outage's length (never past its end), so the
first read after the API server returns does not prune live nodes; a node that really died
still expires one heartbeat expiry after the outage.

Scale mode (``serve_node``, which both adapters call with their handler's own node): the shared
object is written only when membership changes. A heartbeat-only ``set_state`` renews this node's
Lease and writes nothing else; a join or a leave of this node becomes the node's request on its
Lease, which the folder (the operator, else an elected agent, else this agent after a grace
period) folds into the state with the framework's own rules; ``set_state`` then answers with the
folded state. Reads come from a watch of the Rendezvous shared by the process. The framework is
shown every node's heartbeat far in the future (expiry is the folder's to judge, by its own clock),
so it never prunes anyone and has nothing to renew: the process's ``leases.LeaseRenewer`` renews
this node's Lease from its join request to its leave, and the handler mixin (``rounds``) keeps the
framework's keep-alive timer off.

Not guaranteed: fencing (an agent paused past its heartbeat expiry can still write with a
token it read before the pause, as with every backend of this handler), and agreement of
clocks (heartbeat expiry compares other nodes' timestamps with the local clock).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import pickle
import random
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from .document import (
    NodeId,
    RendezvousDocument,
    StateDocumentError,
    decode_document,
    document_from_state,
    encode_document,
    state_from_document,
)
from .folder import AGENT_IDENTITY_PREFIX, DECODED, Folder, agent_folder, owner_reference, rendezvous_watch
from .folding import Change, Desire, JoinSettings, classify, satisfied
from .frameworks import Framework, next_read_waits, poll_skipped
from .frameworks import tensorplay as tensorplay_framework
from .intents import fold_intents
from .kubeapi import (
    RENDEZVOUS_PLURAL,
    ApiError,
    ApiUnavailableError,
    ConflictError,
    InvalidError,
    KubernetesApi,
    NotFoundError,
    call_with_retries,
    describe_api_error,
    resource_path,
)
from .leases import LeaseNodeLock, renewer
from .settings import RendezvousTimings
from .statecheck import load_own_state
from .summary import forming_line, summarize_document
from .watchcache import WatchCache

logger = logging.getLogger(__name__)

Token = Any
MERGE_PATCH = "application/merge-patch+json"
#: The heartbeat shown to the framework for every node in scale mode (see ``_shown``).
SHOWN_HEARTBEAT = datetime(9000, 1, 1, tzinfo=timezone.utc)
#: The pickles of the states shown in scale mode, shared by the process's handlers (a few versions).
_PICKLES: collections.OrderedDict[tuple[object, ...], bytes] = collections.OrderedDict()
_PICKLES_LOCK = threading.Lock()
#: Held while one handler pickles a new state version, so the others wait for it (single flight).
_PICKLING = threading.Lock()
#: Seconds between two log lines of an agent waiting in the join loop (who joined, who is missing).
PROGRESS_LOG_SECONDS = 10.0
#: Write ids kept in ``status.recentWriteIds`` to recognise a committed write after an unclear answer.
RECENT_WRITE_IDS = 8


def waiting_count(waiting: int, closed: bool, close_requested: bool) -> int:
    """``num_nodes_waiting``: the nodes on the wait list, and a close asked by a person counted as one
    (running agents then stop and exit); a close by an agent whose training succeeded counts as none."""
    return max(waiting, 1 if closed and close_requested else 0)


class KubernetesRendezvousBackend:
    """Rendezvous state stored as a typed document in ``status.state`` of one Rendezvous object.

    Args:
        api: the API client.
        namespace: the Rendezvous object's namespace.
        rendezvous_name: the Rendezvous object's name.
        run_id: the job's run id; a state written by another run id counts as no state.
        node_name: recorded as ``status.lastWriter``.
        retry_timeout: seconds to keep retrying while the API server is unreachable or
            throttling, before raising ``RendezvousConnectionError``.
        conflict_backoff: seconds; after k consecutive lost compare-and-swaps, wait a random
            time up to ``conflict_backoff * 2**(k-1)`` (capped at ``max_conflict_backoff``) before
            re-reading. 0 disables it.
        max_participants: the most participants a state this backend writes may hold (the
            job's max nodes); None checks only the document's own limit.
        heartbeat_expiry: seconds without a heartbeat after which a node counts as dead; also
            how long heartbeats are moved forward after an outage (module docstring).
        framework: the elastic framework whose state classes and errors to use (tensorplay's
            by default; ``frameworks.torch()`` for torchrun).
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        run_id: str,
        *,
        node_name: str | None = None,
        retry_timeout: float = 60.0,
        conflict_backoff: float = 0.02,
        max_conflict_backoff: float = 2.0,
        max_participants: int | None = None,
        heartbeat_expiry: float = 15.0,
        framework: Framework | None = None,
    ) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        if retry_timeout < 0:
            raise ValueError(f"retry_timeout must be >= 0 seconds, got {retry_timeout!r}")
        if conflict_backoff < 0 or max_conflict_backoff < conflict_backoff:
            raise ValueError(
                f"conflict_backoff ({conflict_backoff!r}) must be >= 0 and <= max_conflict_backoff "
                f"({max_conflict_backoff!r}), in seconds"
            )
        self.framework = framework or tensorplay_framework()
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.run_id = run_id
        self._node_name = node_name
        self._retry_timeout = retry_timeout
        self._conflict_backoff = conflict_backoff
        self._max_conflict_backoff = max_conflict_backoff
        self._max_participants = max_participants
        self._heartbeat_expiry = timedelta(seconds=heartbeat_expiry)
        self._conflict_streak = 0
        #: The token of the last object seen, its recent write ids, and the run id its state belongs to.
        self._recent_write_ids: tuple[str, list[str], str | None] = ("", [], None)
        self._remembered_status: tuple[str, dict[str, Any]] = ("", {})
        self._path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name)
        self._status_path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name, "status")
        #: The Rendezvous spec as read when the backend was made (create_backend fills it in).
        self.spec: dict[str, Any] = {}
        #: Whether a person asked to close the rendezvous (``spec.closed`` or a deletion), as last read.
        #: A state closed by an agent whose training succeeded is not such a request.
        self.close_requested = False
        #: The handler's timings, resolved once from rdzv-conf, the spec and the defaults.
        self.timings = RendezvousTimings()
        #: Counters for tests and benchmarks: successful writes, lost compare-and-swaps, reads (GETs),
        #: the framework's ``get_state`` calls, Lease renewals, requests and the folds this agent did itself.
        self.stats = {
            "writes": 0,
            "conflicts": 0,
            "reads": 0,
            "state_reads": 0,
            "renewals": 0,
            "requests": 0,
            "self_folds": 0,
            "overtaken": 0,
            "waiting_from_watch": 0,
        }
        #: ``nodes_waiting``'s last answer and the resourceVersion it was read from.
        self._waiting: tuple[str | None, int] = (None, 0)
        # Scale mode (serve_node): this handler's node, its Lease, the process's watch and folder.
        self.node: NodeId | None = None
        self._lease: LeaseNodeLock | None = None
        self._watch: WatchCache | None = None
        self._folder: Folder | None = None
        self._keep_alive = 5.0
        #: What the framework was last given: (token, document shown, the object's resourceVersion).
        self._given: tuple[Token | None, RendezvousDocument | None, str] | None = None
        #: Set by the handler while its join loop runs: ``get_state`` then waits for a relevant change.
        self.joining = False
        # Progress lines of the join loop (``_log_progress``): since when, last logged, last round's members.
        self._waiting_since: float | None = None
        self._progress_logged = 0.0
        self._last_members: frozenset[NodeId] | None = None
        self._last_signature: tuple[object, ...] = (None,)
        #: The document as stored (before heartbeats were synthesized), by token.
        self._stored: tuple[Token | None, RendezvousDocument | None] = (None, None)

    @property
    def name(self) -> str:
        return "k8s"

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.rendezvous_name}"

    def serve_node(self, node: NodeId, settings: JoinSettings, *, keep_alive: float, expiry: float) -> bool:
        """Switch to scale mode for the handler of ``node`` (see the module docstring).

        Returns False (and stays in compare-and-swap mode) when the Rendezvous cannot be watched,
        e.g. a Role without list/watch on rendezvouses.
        """
        watch = rendezvous_watch(self._api, self.namespace, self.rendezvous_name)
        if not watch.wait_ready(min(30.0, max(1.0, self._retry_timeout))):
            logger.warning("Rendezvous %s cannot be watched; every change is a compare-and-swap", self._where)
            return False
        obj = watch.get(self.rendezvous_name)
        self._lease = LeaseNodeLock(
            self._api,
            self.namespace,
            self.rendezvous_name,
            node,
            run_id=self.run_id,
            settings=settings,
            expiry_seconds=expiry,
            owner=owner_reference(obj) if obj else None,
        )
        self._folder = agent_folder(
            self._api, self.namespace, self.rendezvous_name, f"{AGENT_IDENTITY_PREFIX}{node}", expiry
        )
        self._watch = watch
        self._keep_alive = keep_alive
        self.node = node
        return True

    @property
    def lease(self) -> LeaseNodeLock | None:
        """This node's Lease in scale mode."""
        return self._lease

    # -- reading ---------------------------------------------------------------------------

    def _read_object(self) -> dict[str, Any]:
        self.stats["reads"] += 1
        try:
            obj: dict[str, Any] = call_with_retries(
                lambda: self._api.request("GET", self._path),
                deadline=time.monotonic() + self._retry_timeout,
                what=f"GET rendezvous {self._where}",
            )
            return self._remember(obj)
        except NotFoundError as exc:
            raise self.framework.closed_error(
                f"The Rendezvous {self._where} no longer exists (deleted); the rendezvous is over."
            ) from exc
        except ApiError as exc:
            raise self.framework.connection_error(
                describe_api_error(exc, "get", RENDEZVOUS_PLURAL, self.namespace)
            ) from exc
        except ApiUnavailableError as exc:
            raise self.framework.connection_error(
                f"The Kubernetes API server could not be reached for {self._retry_timeout:.0f} s. "
                "See the inner exception for details."
            ) from exc

    def _remember(self, obj: dict[str, Any]) -> dict[str, Any]:
        status = obj.get("status") or {}
        ids = status.get("recentWriteIds") or []
        self._recent_write_ids = (obj["metadata"]["resourceVersion"], [str(item) for item in ids], status.get("runId"))
        self._remembered_status = (obj["metadata"]["resourceVersion"], status)
        return obj

    def read_document(self, obj: dict[str, Any]) -> RendezvousDocument | None:
        """Return the validated document of ``obj`` with the intents folded in (None: no state).

        Raises:
            RendezvousStateError: ``status.state`` is not a valid state document (nothing changed).
        """
        status = obj.get("status") or {}
        encoded = status.get("state")
        foreign = status.get("runId") not in (None, self.run_id)
        if foreign and encoded:
            logger.info(
                "Rendezvous %s holds the state of run %r; run %r starts afresh over it",
                self._where,
                status.get("runId"),
                self.run_id,
            )
        document = None
        if encoded and not foreign:
            try:
                document = DECODED.decode(encoded) if self.node is not None else decode_document(encoded)
            except StateDocumentError as exc:
                raise self.framework.state_error(
                    f"The rendezvous state in {self._where} was refused, and nothing was changed: {exc}."
                ) from exc
        close = bool((obj.get("spec") or {}).get("closed")) or bool(obj["metadata"].get("deletionTimestamp"))
        self.close_requested = close
        folded = fold_intents(document, close=close, evicted=status.get("evictedNodes") or [])
        return None if folded is None else self._resume_after_outage(folded)

    def _resume_after_outage(self, document: RendezvousDocument) -> RendezvousDocument:
        """Move heartbeats older than the last outage's end forward by its length, for one expiry after it."""
        outage = self._api.last_outage
        if outage is None:
            return document
        start, end = outage
        if datetime.now(timezone.utc) > end + self._heartbeat_expiry:
            return document
        moved = {
            node: min(beat + (end - start), end) if beat < end else beat
            for node, beat in document.last_heartbeats.items()
        }
        return dataclasses.replace(document, last_heartbeats=moved)

    def _state_of(self, obj: dict[str, Any]) -> tuple[bytes, Token] | None:
        document = self._shown(obj, self.read_document(obj))
        if document is None:
            return None
        token = obj["metadata"]["resourceVersion"]
        if self.node is None:
            state = state_from_document(document, self.framework.state_class, self.framework.node_class)
            return pickle.dumps(state), token
        self._last_signature = self._signature(document)
        # The next get_state of the join loop waits on the watch for a change of this signature,
        # so the framework's 1 s poll before it adds nothing (``frameworks`` module docstring).
        next_read_waits(self.joining and self._watch is not None and self._watch.healthy)
        # In scale mode every handler of the process is shown the same state for a version:
        # pickle it once (waiting agents and the launcher's monitor loop read about once a second).
        key = (self.framework.name, token, self.run_id, self.close_requested)
        with _PICKLES_LOCK:
            data = _PICKLES.get(key)
        if data is None:
            with _PICKLING:
                with _PICKLES_LOCK:
                    data = _PICKLES.get(key)
                if data is None:
                    state = state_from_document(document, self.framework.state_class, self.framework.node_class)
                    data = pickle.dumps(state)
                    with _PICKLES_LOCK:
                        _PICKLES[key] = data
                        while len(_PICKLES) > 8:
                            _PICKLES.popitem(last=False)
        return data, token

    def _signature(self, document: RendezvousDocument | None) -> tuple[object, ...]:
        """What a joining handler's next decision depends on: round, completion, close, last call, its role."""
        if document is None or self.node is None:
            return (None,)
        node = self.node
        role = (
            ("participant", document.participants[node])
            if node in document.participants
            else "waiting"
            if node in document.wait_list
            else "redundant"
            if node in document.redundancy_list
            else None
        )
        full = len(document.participants) >= self._max_participants if self._max_participants else None
        return (document.round, document.complete, document.closed, document.deadline, role, full)

    def get_state(self) -> tuple[bytes, Token] | None:
        """Return ``(state, token)``, or None when this run has no state yet.

        Raises:
            RendezvousStateError: ``status.state`` is not a valid state document (nothing changed).
            RendezvousConnectionError: the API server is unreachable, or refused (403).
            RendezvousClosedError: the Rendezvous object was deleted.
        """
        self.stats["state_reads"] += 1
        if poll_skipped() and self.joining and self._watch is not None and self._watch.healthy:
            # The join loop had nothing to do and skipped its 1 s poll (``frameworks``): answer when
            # something it decides on changed (or after one keep-alive), so N waiting agents do not
            # each re-read every version of the state. A read no poll precedes answers at once.
            watch, name, last = self._watch, self.rendezvous_name, self._last_signature

            def changed() -> bool:
                obj = watch.get(name)
                if obj is None:
                    return True
                try:
                    return self._signature(self.read_document(obj)) != last
                except Exception:  # noqa: BLE001 - an invalid state is reported by the read that follows
                    return True

            began = time.monotonic()
            waited = watch.wait_for(changed, self._keep_alive) or time.monotonic() - began >= 1
            current = self._state_of(self._current_object())
            if not waited:  # a watch that stopped returns at once: keep the framework's poll then
                next_read_waits(False)
        else:
            current = self._state_of(self._current_object())
        self._log_progress()
        return current

    def nodes_waiting(self) -> int | None:
        """``num_nodes_waiting`` from the process's watch in scale mode, None when it must read the state.

        The launcher's monitor loop asks every few seconds (the benchmarks every 0.1 s) while the
        job trains. Answered from the validated document the process's watch decoded once, so no
        agent unpickles the whole state for it: at N=1024 that unpickling was about 1.5 cores for
        the agents of one machine. Counts the wait list, and a close asked by a person as one.
        """
        if self.node is None or self._watch is None or not self._watch.healthy:
            return None
        obj = self._watch.get(self.rendezvous_name)
        if obj is None:
            return None  # deleted: the framework's read reports it
        self.stats["waiting_from_watch"] += 1
        version = obj["metadata"]["resourceVersion"]
        if self._waiting[0] == version:  # the monitor loop asks far more often than the object changes
            return self._waiting[1]
        document = self.read_document(obj)
        answer = (
            0 if document is None else waiting_count(len(document.wait_list), document.closed, self.close_requested)
        )
        self._waiting = (version, answer)
        return answer

    def _log_progress(self) -> None:
        """While the join loop waits, log one line every ``PROGRESS_LOG_SECONDS``: who joined, who is missing."""
        document = self._stored[1]
        if document is not None and document.complete:
            self._last_members = frozenset(document.participants)
        settings = self._lease.settings if self._lease is not None else None
        if not self.joining or settings is None or document is None:
            self._waiting_since = None
            return
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since, self._progress_logged = now, now
        if now - self._progress_logged < PROGRESS_LOG_SECONDS:
            return
        self._progress_logged = now
        line = forming_line(
            document, min_nodes=settings.min_nodes, waited=now - self._waiting_since, last_members=self._last_members
        )
        if line is not None:
            logger.info("%s (Rendezvous %s)", line, self._where)

    def _current_object(self) -> dict[str, Any]:
        """The Rendezvous, from the process's watch in scale mode (no request), else from a GET."""
        if self._watch is not None and self._watch.healthy:
            obj = self._watch.get(self.rendezvous_name)
            if obj is None:
                raise self.framework.closed_error(
                    f"The Rendezvous {self._where} no longer exists (deleted); the rendezvous is over."
                )
            return self._remember(obj)
        return self._read_object()

    def _shown(self, obj: dict[str, Any], document: RendezvousDocument | None) -> RendezvousDocument | None:
        """In scale mode: the document with every heartbeat far in the future (the backend renews this
        node's Lease itself, and only the folder expires nodes: the framework has nothing to do)."""
        token = obj["metadata"]["resourceVersion"]
        self._stored = (token, document)
        if self.node is None or document is None:
            if self.node is not None:
                self._given = (None, None, token)
            return document
        # Every node is shown the same far-future heartbeat: the framework then never prunes anyone
        # nor renews anything, its own removals still find an entry (torch deletes it with ``del``),
        # and every handler of the process is shown the same bytes.
        beats = dict.fromkeys([*document.participants, *document.wait_list, *document.redundancy_list], SHOWN_HEARTBEAT)
        shown = dataclasses.replace(document, last_heartbeats=beats)
        self._given = (token, shown, token)
        return shown

    # -- writing ---------------------------------------------------------------------------

    def _decode_own(self, state: bytes) -> RendezvousDocument:
        try:
            value = load_own_state(state, self.framework.state_class, self.framework.node_class)
            return document_from_state(value, max_participants=self._max_participants)
        except ValueError as exc:  # StateDocumentError is a ValueError
            raise self.framework.state_error(f"The rendezvous state was not written to {self._where}: {exc}") from exc

    def _encode_document(self, document: RendezvousDocument) -> str:
        try:
            return encode_document(document)
        except ValueError as exc:
            raise self.framework.state_error(f"The rendezvous state was not written to {self._where}: {exc}") from exc

    def _status_for(
        self, document: RendezvousDocument, encoded: str, write_ids: list[str], token: str
    ) -> dict[str, Any]:
        status: dict[str, Any] = {
            "state": encoded,
            "stateBytes": len(encoded),
            "runId": self.run_id,
            "recentWriteIds": write_ids,
        }
        remembered_token, previous = self._remembered_status
        status.update(
            summarize_document(
                document,
                now=datetime.now(timezone.utc),
                writer=self._node_name,
                previous=previous if remembered_token == token else None,
            )
        )
        return status

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """Write ``state`` if ``token`` is the object's current resourceVersion.

        Returns ``(state, new_token, True)`` when written, else the current
        ``(state, token, False)`` (None when there is no state) without writing: for a stale
        token, for ``token=None`` while a state exists, and for a token that is not a
        resourceVersion string. A 409 is never an error here.

        Raises:
            RendezvousStateError: ``state`` is not a valid rendezvous state, would not fit in an
                object, or the stored state is invalid.
            RendezvousConnectionError: the API server is unreachable, or refused (403).
            RendezvousClosedError: the Rendezvous object was deleted.
        """
        document = self._decode_own(state)
        if self.node is not None and self._given is not None and token == self._given[0]:
            given_token, shown, object_version = self._given
            change = classify(shown if shown is not None else RendezvousDocument(), document, self.node)
            if change in (Change.HEARTBEAT, Change.NOTHING):
                if change is Change.HEARTBEAT:
                    self._renew(None)
                # Answer with the state as shown now: the renewal may have waited out an outage,
                # and the framework must not judge others by heartbeats shown before it.
                current = self._state_of(self._current_object())
                if current is None:
                    return state, token, True
                return current[0], current[1], True
            if change is not Change.OTHER:
                logger.info("node %s asks to %s (round %d)", self.node, change.value, document.round)
                return self._request(change, object_version)
            if given_token is None:
                token = object_version  # no state of this run yet: create it by compare-and-swap
            document = self._with_stored_heartbeats(document)
        encoded = self._encode_document(document)
        if token is None:
            obj = self._read_object()
            current = self._state_of(obj)
            if current is not None:
                return current[0], current[1], False
            token = obj["metadata"]["resourceVersion"]
        elif not isinstance(token, str) or not token:
            return self._lost(self._state_of(self._read_object()))

        write_id = uuid.uuid4().hex[:8]
        known_token, known_ids, known_run = self._recent_write_ids
        write_ids = [*(known_ids if known_token == token else [])[-(RECENT_WRITE_IDS - 1) :], write_id]
        body = {"metadata": {"resourceVersion": token}, "status": self._status_for(document, encoded, write_ids, token)}
        if known_token == token and known_run not in (None, self.run_id):
            body["status"]["evictedNodes"] = None  # a new run starts without the old run's evictions
        deadline = time.monotonic() + self._retry_timeout
        unclear = False
        delay = 0.1
        while True:
            try:
                written = self._api.request("PATCH", self._status_path, body=body, content_type=MERGE_PATCH)
                break
            except ConflictError:
                if not unclear:
                    # Lost the compare-and-swap: wait first, then read, so the state handed back is fresh.
                    self._back_off()
                obj = self._read_after_conflict(token)
                if unclear and (committed := self._committed(obj, write_id)) is not None:
                    return committed
                return self._lost(self._state_of(obj))
            except InvalidError as exc:
                obj = self._read_object()
                if obj["metadata"]["resourceVersion"] == token:
                    # The token was current, so the server refused the status itself.
                    raise self.framework.state_error(
                        f"The API server refused the rendezvous state for {self._where}: {exc.message}"
                    ) from exc
                return self._lost(self._state_of(obj))  # a token that is not a resourceVersion
            except NotFoundError as exc:
                raise self.framework.closed_error(f"The Rendezvous {self._where} no longer exists (deleted).") from exc
            except (ApiUnavailableError, ApiError) as exc:
                if isinstance(exc, ApiError) and not exc.transient:
                    raise self.framework.connection_error(
                        describe_api_error(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", self.namespace)
                    ) from exc
                # No clear answer: read what is stored to learn the outcome.
                if time.monotonic() + delay > deadline:
                    raise self.framework.connection_error(
                        "The Kubernetes API server gave no clear answer to a state write for "
                        f"{self._retry_timeout:.0f} s. See the inner exception for details."
                    ) from exc
                logger.info("state write had no clear answer (%s); reading the outcome", exc)
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 2.0)
                obj = self._read_object()
                if (committed := self._committed(obj, write_id)) is not None:
                    return committed
                if obj["metadata"]["resourceVersion"] != token:
                    return self._lost(self._state_of(obj))  # the token is stale: this write can never commit
                unclear = True  # not committed (yet): send the same compare-and-swap again
        self._remember(written)
        self.stats["writes"] += 1
        self._conflict_streak = 0
        return state, written["metadata"]["resourceVersion"], True

    def _read_after_conflict(self, token: str) -> dict[str, Any]:
        """After a 409: the newer object from the watch (no GET) in scale mode, else a GET."""
        watch = self._watch
        if watch is not None and watch.healthy:
            name = self.rendezvous_name

            def newer() -> bool:
                obj = watch.get(name)
                return obj is None or obj["metadata"]["resourceVersion"] != token

            if watch.wait_for(newer, 2.0):
                return self._current_object()
        return self._read_object()

    def _with_stored_heartbeats(self, document: RendezvousDocument) -> RendezvousDocument:
        """A plain write in scale mode keeps the stored heartbeats (never the synthesized ones)."""
        stored = self._stored[1]
        beats = dict(stored.last_heartbeats) if stored is not None else {}
        named = set(document.nodes())
        beats = {node: beat for node, beat in beats.items() if node in named}
        for node in named - set(beats):
            beats[node] = datetime.now(timezone.utc)
        if self.node in named and self._lease is not None and self._lease.renewed_at is not None:
            beats[self.node] = self._lease.renewed_at
        return dataclasses.replace(document, last_heartbeats=beats)

    def _renew(self, desire: Desire | None) -> None:
        lease = self._lease
        assert lease is not None
        try:
            # A renewal or request is safe to repeat (a merge patch of this node's own Lease).
            call_with_retries(
                lambda: lease.update(desire),
                deadline=time.monotonic() + self._retry_timeout,
                what=f"renew {lease.describe()}",
            )
        except ApiError as exc:
            raise self.framework.connection_error(describe_api_error(exc, "patch", "leases", self.namespace)) from exc
        except ApiUnavailableError as exc:
            raise self.framework.connection_error(
                "The Kubernetes API server did not answer a heartbeat. See the inner exception for details."
            ) from exc
        self.stats["renewals"] += 1

    def _request(self, change: Change, object_version: str) -> tuple[bytes, Token, bool] | None:
        """Record this node's join or leave on its Lease and answer with the state that folded it in.

        Waits on the watch for a state newer than ``object_version`` that reflects the request;
        when none comes within a grace period (no writer folded it), folds everything pending
        itself, and waits again. A join overtaken by a new round (asked on round r, the state is
        now past r and the fold dropped it) is answered at once with the new state and
        ``has_set=False``, as after a lost compare-and-swap, so the framework asks again for the
        round that is open now. After ``retry_timeout`` without success the current state is
        answered with ``has_set=False`` too.
        """
        assert self._watch is not None and self._folder is not None and self.node is not None
        desire = {Change.JOIN: Desire.JOIN, Change.LEAVE: Desire.LEAVE}.get(change)
        given = self._given[1] if self._given is not None else None
        asked_round = given.round if given is not None else 0
        if self._lease is not None:
            self._lease.round = asked_round
        self._renew(desire)
        lease = self._lease
        if desire is Desire.JOIN and lease is not None:
            renewer(self._api, self._keep_alive).add(lease)
        elif desire is Desire.LEAVE and lease is not None:
            renewer(self._api, self._keep_alive).remove(lease)
        self.stats["requests"] += 1
        self._folder.wake()
        node, watch, name = self.node, self._watch, self.rendezvous_name

        def folded() -> bool:
            obj = watch.get(name)
            if obj is None:
                return True
            if obj["metadata"]["resourceVersion"] == object_version:
                return False
            if desire is None:
                return True
            try:
                document = self.read_document(obj)
            except Exception:  # noqa: BLE001 - an invalid state is reported by the read that follows
                return True
            return satisfied(document, node, desire) or overtaken(document)

        def overtaken(document: RendezvousDocument | None) -> bool:
            """A join the fold dropped: the state moved past the round it was asked on."""
            return desire is Desire.JOIN and document is not None and document.round != asked_round

        deadline = time.monotonic() + self._retry_timeout
        while True:
            if self._folder.leader:
                grace = 1.0
            elif self._folder.elector.holder_alive:
                grace = 2.0
            else:
                grace = random.uniform(0.3, 0.8)
            done = watch.wait_for(folded, grace)
            obj = self._current_object()
            if done:
                current = self._state_of(obj)
                if current is None:
                    return None
                stored = self._stored[1]
                if desire is not None and not satisfied(stored, node, desire) and overtaken(stored):
                    self.stats["overtaken"] += 1
                    return self._lost(current)
                self.stats["writes"] += 1
                return current[0], current[1], True
            if time.monotonic() > deadline:
                return self._lost(self._state_of(obj))
            try:
                if self._folder.fold_pending():
                    self.stats["self_folds"] += 1
            except (ApiError, ApiUnavailableError) as exc:
                logger.info("folding the pending requests of %s failed this time: %s", self._where, exc)

    def _committed(self, obj: dict[str, Any], write_id: str) -> tuple[bytes, Token, bool] | None:
        """``(state, token, True)`` as stored now if write ``write_id`` committed, else None."""
        if write_id not in ((obj.get("status") or {}).get("recentWriteIds") or []):
            return None
        current = self._state_of(obj)  # others may have written since
        assert current is not None
        self.stats["writes"] += 1
        self._conflict_streak = 0
        return current[0], current[1], True

    def _back_off(self) -> None:
        """Wait a random time that doubles with each consecutive lost compare-and-swap.

        Without it, N agents that lose retry at once and a round costs O(N^2) writes; with it the
        retries spread out (full jitter), and the first attempt after a win is never delayed.
        """
        self._conflict_streak += 1
        if self._conflict_backoff > 0:
            limit = min(self._max_conflict_backoff, self._conflict_backoff * 2 ** min(self._conflict_streak - 1, 16))
            time.sleep(random.uniform(0, limit))

    def _lost(self, current: tuple[bytes, Token] | None) -> tuple[bytes, Token, bool] | None:
        self.stats["conflicts"] += 1
        return None if current is None else (current[0], current[1], False)
