"""The operator's memory: one ``RendezvousRecord`` per Rendezvous, kept in Kopf's memo (``OperatorMemo``).

Everything the operator remembers of one Rendezvous (its observed state, its training pods, its selector,
its tasks, what its rules judged already) is a field of its record; the memo keeps the records in one dict
keyed by (namespace, name), and ``OperatorMemo.forget`` removes a deleted Rendezvous's record whole.

Nothing here does I/O (no request, no Event, no write): the rule modules read and change the records and
do their own I/O. This module registers no handler, so every rule module imports it and none imports
another for it (no import cycle).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import KubernetesApi, NodeId, PlacementSpec, RendezvousDocument

from .conditions_rules import StoredState, read_state
from .config import OperatorConfig
from .nodes import NodeReadiness
from .pods_rules import PodSelector

Key = tuple[str, str]


@dataclass(frozen=True)
class Observed:
    """What ``events.observe_rendezvous`` saw last of one Rendezvous: the base its Events are computed from."""

    status: dict[str, Any]
    #: The newest valid document seen (kept across an invalid state; dropped when the state is cleared).
    document: RendezvousDocument | None
    #: The participants of the last round seen formed (membership Events compare with it).
    formed: frozenset[NodeId] | None = None
    #: The spares (redundant nodes) seen since that round formed: one of them in the next round was promoted.
    spares: frozenset[NodeId] = frozenset()


@dataclass
class RendezvousTasks:
    """The background tasks of one Rendezvous (``lifecycle``), and the uid of the object they work for."""

    uid: str
    #: Each task by name, and the flag that asks it to end.
    tasks: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = field(default_factory=dict)


@dataclass
class RendezvousRecord:
    """Everything the operator remembers of one Rendezvous (and nothing it does: no I/O)."""

    #: The last ``status.state`` text read and its document or error (decoded only when the text changes).
    state: StoredState | None = None
    #: The last status and document seen by ``events.observe_rendezvous``.
    observed: Observed | None = None
    #: The fingerprint of the last ``status.state`` seen (``events_rules.state_fingerprint``): counts state writes.
    state_fingerprint: int | None = None
    #: Which pods are its training pods (``pods_rules.pod_selector``).
    selector: PodSelector | None = None
    #: Its training pods by uid: listed by ``resync``, kept current by ``pods.track_training_pod``.
    #: None until they were listed once (before that its census is unknown).
    pods: dict[str, dict[str, Any]] | None = None
    #: Its folder's wake-up (``writer.fold_requests``), rung when its pods or its placement change.
    wake_folder: Callable[[], object] | None = None
    #: Its keep-alive interval (its spec's, as the agents resolve it without rdzv-conf).
    keep_alive: float | None = None
    #: Its placement spec (``spec.topology``, ``spec.admission``); None: the defaults.
    placement: PlacementSpec | None = None
    #: Container restarts judged already, pod uid -> when the container ended: the pod's later events do not
    #: read the Leases again for the same restart (``restarts.judge_restart``).
    judged_restarts: dict[str, datetime] = field(default_factory=dict)
    #: The wake-up of its ``not_ready.evict_on_not_ready_nodes`` task, rung when a Node's readiness changes.
    not_ready_wake: asyncio.Event | None = None
    #: (Node, NotReady since) already judged after its grace ended, by the task or a resync.
    not_ready_judged: set[tuple[str, datetime]] = field(default_factory=set)
    #: (Node, NotReady since) whose live agents were logged as spared (logged once).
    not_ready_spared: set[tuple[str, datetime]] = field(default_factory=set)
    #: How long after its Node went NotReady a lost pod is marked Failed (``lost_nodes_rules.fail_pods_after``
    #: of its spec and the operator's default); None: never.
    fail_pods_after: timedelta | None = None
    #: (Node, NotReady since) whose lost pods were told (``NodeLost``, once per outage).
    node_lost_told: set[tuple[str, datetime]] = field(default_factory=set)
    #: Its background tasks: its folder, resync, NotReady-node rule and TTL (``lifecycle``); None while stopped.
    tasks: RendezvousTasks | None = None


@dataclass
class NodeRule:
    """What the NotReady-node rule shares over every Rendezvous (one object, shared by every copy of the memo)."""

    #: The NotReady Kubernetes Nodes (None until the operator started watching them).
    readiness: NodeReadiness | None = None
    #: One judgement at a time (a task and a resync), so one eviction posts one Event (worker threads only).
    judging: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class OperatorMemo:
    """Kopf's memo: the operator's whole memory (Kopf hands each Rendezvous a shallow copy: its fields are shared).

    ``records`` holds one ``RendezvousRecord`` per Rendezvous, keyed by (namespace, name); nothing else of
    a Rendezvous is kept between events. Reads use ``get`` (which creates nothing); writes ``record``.
    """

    config: OperatorConfig
    #: The API client (credentials from the kubeconfig or the pod's service account).
    api: KubernetesApi
    #: One record per Rendezvous the operator remembers anything of.
    records: dict[Key, RendezvousRecord] = field(default_factory=dict)
    #: Guards ``records`` and the records' pods and NotReady sets (held briefly, also from the event loop).
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: What the NotReady-node rule shares over every Rendezvous.
    node_rule: NodeRule = field(default_factory=NodeRule)

    def get(self, key: Key) -> RendezvousRecord | None:
        """The record of Rendezvous ``key``, or None when nothing is remembered of it."""
        with self.lock:
            return self.records.get(key)

    def record(self, key: Key) -> RendezvousRecord:
        """The record of Rendezvous ``key``, created empty when there is none."""
        with self.lock:
            found = self.records.get(key)
            if found is None:
                found = self.records[key] = RendezvousRecord()
            return found

    def each(self) -> list[RendezvousRecord]:
        """Every record now (a copy of the list: safe to walk while records come and go)."""
        with self.lock:
            return list(self.records.values())

    def forget(self, key: Key) -> None:
        """Drop the record of Rendezvous ``key`` whole (deleted; ``lifecycle`` stops its tasks)."""
        with self.lock:
            self.records.pop(key, None)

    def tracked(self) -> set[Key]:
        """The Rendezvous the operator keeps anything of."""
        with self.lock:
            return set(self.records)

    def indexed_pods(self) -> int:
        """How many training pods the pod index holds, over every Rendezvous."""
        with self.lock:
            return sum(len(record.pods or {}) for record in self.records.values())

    def pods_of(self, key: Key) -> list[dict[str, Any]] | None:
        """``key``'s training pods now; None until they were listed once."""
        with self.lock:
            record = self.records.get(key)
            pods = record.pods if record is not None else None
            return None if pods is None else list(pods.values())

    def wake_all(self) -> None:
        """Wake every NotReady-rule task (from the event loop: ``loop.call_soon_threadsafe``)."""
        for record in self.each():
            if record.not_ready_wake is not None:
                record.not_ready_wake.set()

    def wake_folders(self) -> None:
        """Wake every folder (a Node's labels or admission changed: fold again)."""
        for record in self.each():
            if record.wake_folder is not None:
                record.wake_folder()


def stored_state(memo: OperatorMemo, key: Key, text: object) -> StoredState:
    """The document (or error) of ``status.state`` ``text``; decoded only when it differs from the last read."""
    record = memo.record(key)
    stored = read_state(text, record.state)
    record.state = stored
    return stored
