"""Per-node Leases (heartbeats and join/leave requests) on coordination.k8s.io/v1, and the Lease contract.

Node Lease contract (also read by the operator and ``kubectl rdzv``):
- name ``<rendezvous>-node-<12 hex of sha256(node)>`` (a hash when the Rendezvous name is long);
- labels ``kube-rendezvous.io/rendezvous=<rendezvous name>``, ``kube-rendezvous.io/lease=node``;
- annotations ``kube-rendezvous.io/node`` (``addr_pid_localid``), ``kube-rendezvous.io/desire``
  (``join`` or ``leave``), ``kube-rendezvous.io/desired-at`` (when the node asked, its clock),
  ``kube-rendezvous.io/join-settings`` (``min:max:last_call_seconds``),
  ``kube-rendezvous.io/desired-round`` (the round the node saw when it asked),
  ``kube-rendezvous.io/run-id``, and ``kube-rendezvous.io/pod-uid`` (the creating agent's pod, when it knows it:
  what the chart's fencing policy checks);
- ``spec.holderIdentity`` the node, ``spec.renewTime`` its last heartbeat,
  ``spec.leaseDurationSeconds`` its heartbeat expiry;
- owned by the Rendezvous, so deleting the Rendezvous deletes its Leases.

The writer Lease ``<rendezvous>-writer`` (label ``kube-rendezvous.io/lease=writer``, annotation
``kube-rendezvous.io/writer-priority`` ``operator`` or ``agent``) elects the one folder;
``spec.holderIdentity`` is ``operator/<pod>`` or ``agent/<node>``. Its election is in ``writer_lease``.

Not guaranteed: expiry is judged by an observer's own clock, from when it saw a Lease change
(``LeaseObservations``), never by comparing ``renewTime`` with the local clock, so a Lease
written by a node with a skewed clock expires correctly, but an observer that just started
needs one full expiry before it can call any node dead.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .._rules.document import NodeId
from .._rules.election_rules import LEASE_PLURAL, micro_time, parse_micro_time
from .._rules.folder_rules import Desire, JoinSettings, Request
from .._rules.leases_rules import (
    ANNOTATION_DESIRE,
    ANNOTATION_DESIRED_AT,
    ANNOTATION_NODE,
    ANNOTATION_POD_UID,
    ANNOTATION_ROUND,
    ANNOTATION_RUN_ID,
    ANNOTATION_SETTINGS,
    LABEL_LEASE,
)
from .kubeapi import (
    MERGE_PATCH,
    RENDEZVOUS_LABEL,
    ConflictError,
    KubernetesApi,
    NotFoundError,
    resource_path,
)

logger = logging.getLogger(__name__)

#: Longest object name Kubernetes accepts.
MAX_NAME = 253
#: Seconds without a look after which a ``LeaseObservations`` starts every clock again.
OBSERVER_GAP_SECONDS = 5.0
#: Node Lease renewals one process keeps in flight at once (threads of its ``LeaseRenewer``).
RENEWALS_IN_FLIGHT = 8
#: The longest a ``LeaseRenewer`` waits between two looks for Leases due (a quarter of its interval when shorter),
#: so a Lease is renewed soon after it is due and a stop is seen soon.
RENEWER_LOOK_SECONDS = 0.5


def _prefixed(rendezvous_name: str, suffix: str) -> str:
    if len(rendezvous_name) + len(suffix) + 1 <= MAX_NAME:
        return f"{rendezvous_name}-{suffix}"
    digest = hashlib.sha256(rendezvous_name.encode()).hexdigest()[:12]
    return f"{rendezvous_name[: MAX_NAME - len(suffix) - 14]}-{digest}-{suffix}"


def node_lease_name(rendezvous_name: str, node: NodeId) -> str:
    """The name of ``node``'s Lease for the Rendezvous ``rendezvous_name``."""
    return _prefixed(rendezvous_name, "node-" + hashlib.sha256(str(node).encode()).hexdigest()[:12])


def writer_lease_name(rendezvous_name: str) -> str:
    """The name of the writer Lease of the Rendezvous ``rendezvous_name``."""
    return _prefixed(rendezvous_name, "writer")


def parse_node(text: str) -> NodeId:
    """``addr_pid_localid`` back to a NodeId (the address may itself hold underscores).

    Raises:
        ValueError: not ``addr_pid_localid`` with integer pid and local id.
    """
    addr, pid, local_id = text.rsplit("_", 2)
    if not addr:
        raise ValueError(f"node {text!r:.80} has no address")
    return NodeId(addr, int(pid), int(local_id))


@dataclass(frozen=True)
class NodeRecord:
    """What one node's Lease says."""

    node: NodeId
    desire: Desire
    settings: JoinSettings
    desired_at: datetime
    run_id: str
    #: The Lease's resourceVersion; a change means the node is alive (to an observer).
    version: str
    #: Heartbeat expiry of this node, seconds.
    expiry_seconds: float
    #: The round the node saw when it asked.
    round: int | None = None
    #: ``spec.renewTime``: the node's own clock at its last renewal (compared only with the same
    #: process's other stamps, never with the observer's clock).
    renewed_at: datetime | None = None

    def request(self) -> Request:
        return Request(self.node, self.desire, self.settings, self.desired_at, self.round)


def record_of(lease: dict[str, Any]) -> NodeRecord | None:
    """The record of a node Lease, or None when it is not one or is malformed (logged, skipped)."""
    metadata = lease.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    try:
        return NodeRecord(
            node=parse_node(annotations[ANNOTATION_NODE]),
            desire=Desire(annotations[ANNOTATION_DESIRE]),
            settings=JoinSettings.parse(annotations[ANNOTATION_SETTINGS]),
            desired_at=parse_micro_time(annotations[ANNOTATION_DESIRED_AT]),
            run_id=str(annotations.get(ANNOTATION_RUN_ID, "")),
            version=str(metadata.get("resourceVersion", "")),
            expiry_seconds=float((lease.get("spec") or {}).get("leaseDurationSeconds") or 15),
            round=int(annotations[ANNOTATION_ROUND]) if ANNOTATION_ROUND in annotations else None,
            renewed_at=parse_micro_time(renewed) if (renewed := (lease.get("spec") or {}).get("renewTime")) else None,
        )
    except (KeyError, ValueError, TypeError) as exc:
        logger.warning("skipping malformed node Lease %s: %s", metadata.get("name"), exc)
        return None


class LeaseNodeLock:
    """A node's record as a coordination.k8s.io/v1 Lease (the contract in the module docstring).

    Every call is one request. ``update`` is a JSON merge patch without a resourceVersion: only
    this node writes its Lease, so it never conflicts, and a renewal is a small write to a small
    object that no agent watches.
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        node: NodeId,
        *,
        run_id: str,
        settings: JoinSettings,
        expiry_seconds: float,
        owner: dict[str, Any] | None = None,
        pod_uid: str | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.node = node
        self.run_id = run_id
        self.settings = settings
        self.expiry_seconds = expiry_seconds
        self.owner = owner
        #: The uid of this agent's pod, stamped on the Lease at creation (never changed by a renewal), or None.
        self.pod_uid = pod_uid
        self.name = node_lease_name(rendezvous_name, node)
        self._path = resource_path(LEASE_PLURAL, namespace, self.name)
        self.desire: Desire | None = None
        #: The round this node saw when it last asked (set by the backend before ``update``).
        self.round = 0
        self._asked_round = -1
        #: When this node's heartbeat last reached the API server (its own clock), or None.
        self.renewed_at: datetime | None = None

    def describe(self) -> str:
        return f"Lease {self.namespace}/{self.name} of node {self.node}"

    def _annotations(self, desire: Desire, now: datetime) -> dict[str, str]:
        return {
            ANNOTATION_ROUND: str(self.round),
            ANNOTATION_NODE: str(self.node),
            ANNOTATION_DESIRE: desire.value,
            ANNOTATION_DESIRED_AT: micro_time(now),
            ANNOTATION_SETTINGS: self.settings.encode(),
            ANNOTATION_RUN_ID: self.run_id,
        }

    def create(self, desire: Desire, timeout: float | None = None) -> None:
        now = datetime.now(timezone.utc)
        metadata: dict[str, Any] = {
            "name": self.name,
            "labels": {RENDEZVOUS_LABEL: self.rendezvous_name, LABEL_LEASE: "node"},
            "annotations": self._annotations(desire, now),
        }
        if self.pod_uid:
            metadata["annotations"][ANNOTATION_POD_UID] = self.pod_uid
        if self.owner:
            metadata["ownerReferences"] = [self.owner]
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": str(self.node),
                "leaseDurationSeconds": max(1, round(self.expiry_seconds)),
                "acquireTime": micro_time(now),
                "renewTime": micro_time(now),
            },
        }
        try:
            self._api.request("POST", resource_path(LEASE_PLURAL, self.namespace), body=body, timeout=timeout)
        except ConflictError:  # ours already (an earlier attempt whose answer was lost): patch it instead
            self.desire = desire  # so that ``update`` patches, never creates again
            self.update(desire, timeout)
            return
        self.desire = desire
        self._asked_round = self.round
        self.renewed_at = now

    def update(self, desire: Desire | None = None, timeout: float | None = None) -> None:
        """Renew the heartbeat, and record ``desire`` when given; creates the Lease if it is gone.

        ``timeout``: seconds the request may take (the client's default when None).
        """
        if self.desire is None:
            self.create(desire or Desire.JOIN, timeout)
            return
        now = datetime.now(timezone.utc)
        body: dict[str, Any] = {"spec": {"renewTime": micro_time(now)}}
        if desire is not None and (desire is not self.desire or self.round != self._asked_round):
            body["metadata"] = {"annotations": self._annotations(desire, now)}
        try:
            self._api.request("PATCH", self._path, body=body, content_type=MERGE_PATCH, timeout=timeout)
        except NotFoundError:  # deleted behind our back (the Rendezvous was recreated): start again
            self.desire = None
            self.create(desire or Desire.JOIN, timeout)
            return
        if desire is not None:
            self.desire = desire
            self._asked_round = self.round
        self.renewed_at = now


def list_node_records(api: KubernetesApi, namespace: str, rendezvous_name: str) -> tuple[list[NodeRecord], str]:
    """Every node record of the Rendezvous, from the API server's watch cache, and the list's resourceVersion."""
    listed = api.request(
        "GET",
        resource_path(LEASE_PLURAL, namespace),
        query={"labelSelector": f"{RENDEZVOUS_LABEL}={rendezvous_name},{LABEL_LEASE}=node", "resourceVersion": "0"},
    )
    records = [record for item in listed.get("items", []) if (record := record_of(item)) is not None]
    return records, str(listed["metadata"]["resourceVersion"])


class LeaseObservations:
    """When each Lease last changed, by this observer's own monotonic clock (skew-free expiry).

    An observer that did not look for more than ``OBSERVER_GAP_SECONDS`` (its process frozen,
    paused or starved, even between ``observe`` and ``expired``) starts every clock again: the
    renewals of that gap may still wait unread in its watch, so silence proves nothing yet.
    Not guaranteed: expiry is late by up to one gap plus the expiry when the observer keeps
    stalling; it is never early.
    """

    def __init__(self, where: str = "") -> None:
        #: What is observed (``namespace/name``), for the log line a gap writes.
        self.where = where
        self._seen: dict[NodeId, tuple[str, float]] = {}
        self._absent_since: dict[NodeId, float] = {}
        #: When ``observe`` last ran (this observer's clock), or None before the first time.
        self._looked_at: float | None = None
        #: How many times a gap made every clock start again (tests and logs).
        self.gaps = 0

    def _continuous(self, clock: float) -> bool:
        """False (and every clock restarted) when this observer did not look for a gap."""
        if self._looked_at is not None and clock - self._looked_at > OBSERVER_GAP_SECONDS:
            logger.warning(
                "%s: the writer did not look at the Leases for %.1f s (frozen or starved); judging expiry afresh",
                self.where,
                clock - self._looked_at,
            )
            self.gaps += 1
            self.restart(clock)
            self._looked_at = clock
            return False
        return True

    def observe(self, records: list[NodeRecord], now: float | None = None) -> None:
        clock = time.monotonic() if now is None else now
        self._continuous(clock)
        self._looked_at = clock
        for record in records:
            previous = self._seen.get(record.node)
            if previous is None or previous[0] != record.version:
                self._seen[record.node] = (record.version, clock)
            self._absent_since.pop(record.node, None)

    def restart(self, now: float | None = None) -> None:
        """Start every observation afresh (after a gap in which changes may have gone unseen)."""
        clock = time.monotonic() if now is None else now
        self._seen = {node: (version, clock) for node, (version, _) in self._seen.items()}
        self._absent_since = dict.fromkeys(self._absent_since, clock)

    def seed(self, node: NodeId, version: str, since: float) -> None:
        """Count ``node``'s Lease at ``version`` as unchanged since ``since`` (this observer's clock),
        if that is earlier than this observer saw it change; a later version restarts it as usual."""
        seen = self._seen.get(node)
        if seen is not None and seen[0] == version and since < seen[1]:
            self._seen[node] = (version, since)

    def forget(self, node: NodeId) -> None:
        self._seen.pop(node, None)

    def changed_within(self, node: NodeId, seconds: float, now: float | None = None) -> bool:
        """Whether this observer saw ``node``'s Lease change within the last ``seconds`` (False when never seen)."""
        seen = self._seen.get(node)
        return seen is not None and (time.monotonic() if now is None else now) - seen[1] <= seconds

    def idle_for(self, node: NodeId, now: float | None = None) -> float:
        """Seconds since ``node``'s Lease last changed (0 when never seen)."""
        clock = time.monotonic() if now is None else now
        seen = self._seen.get(node)
        return 0.0 if seen is None else clock - seen[1]

    def expired(
        self, records: list[NodeRecord], named: list[NodeId], default_expiry: float, now: float | None = None
    ) -> set[NodeId]:
        """Nodes whose Lease has not changed for its expiry, and nodes ``named`` in the state with no
        Lease for ``default_expiry`` (both measured from when this observer first saw them)."""
        clock = time.monotonic() if now is None else now
        if not self._continuous(clock):
            return set()
        by_node = {record.node: record for record in records}
        dead = set()
        for node, (_, changed) in self._seen.items():
            record = by_node.get(node)
            expiry = record.expiry_seconds if record else default_expiry
            if clock - changed > expiry:
                dead.add(node)
        for node in named:
            if node in by_node or node in self._seen:
                continue
            since = self._absent_since.setdefault(node, clock)
            if clock - since > default_expiry:
                dead.add(node)
        return dead


class LeaseRenewer:
    """Renews the node Leases of this process every keep-alive, several at a time.

    The framework never sees a heartbeat in scale mode: a node heartbeats while its process
    lives and its handler wants to be in the rendezvous (from its join request to its leave).
    A renewal that fails is retried at the next tick; the folder expires a node only after a
    whole expiry without one. Renewals run on a pool of ``RENEWALS_IN_FLIGHT`` threads, and a
    Lease is never renewed twice at once, so one slow answer (a throttled server queues a
    request for seconds) cannot hold back the heartbeats of the process's other nodes.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._leases: dict[int, LeaseNodeLock] = {}
        self._in_flight: set[int] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=RENEWALS_IN_FLIGHT, thread_name_prefix="lease renewal")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease renewer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Renew nothing more (renewals in flight finish)."""
        self._stopped.set()

    def add(self, lease: LeaseNodeLock) -> None:
        with self._lock:
            self._leases[id(lease)] = lease

    def remove(self, lease: LeaseNodeLock) -> None:
        with self._lock:
            self._leases.pop(id(lease), None)

    def _renew(self, lease: LeaseNodeLock) -> None:
        try:
            lease.update(None, timeout=self.interval)  # a renewal never waits past the next one
        except Exception as exc:  # noqa: BLE001 - retried at the next tick
            logger.info("could not renew %s: %s", lease.describe(), exc)
        finally:
            with self._lock:
                self._in_flight.discard(id(lease))

    def _run(self) -> None:
        while not self._stopped.wait(min(RENEWER_LOOK_SECONDS, self.interval / 4)):
            now = datetime.now(timezone.utc)
            with self._lock:
                due = [
                    (key, lease)
                    for key, lease in self._leases.items()
                    if key not in self._in_flight
                    and (lease.renewed_at is None or (now - lease.renewed_at).total_seconds() >= self.interval)
                ]
                self._in_flight.update(key for key, _ in due)
            try:
                for _, lease in due:
                    self._pool.submit(self._renew, lease)
            except RuntimeError:  # the interpreter is exiting and has shut the pool down
                return
