"""The writer Lease of a Rendezvous: the election of its one folder, on the generic elector (``election``).

The rendezvous' writer rules sit here, above the elector, and reach it only through its public seams:
- ``WriterLock`` is a ``LeaseLock`` on ``<rendezvous>-writer`` (the contract is in ``leases``) that
  writes the rendezvous' labels and the writer priority (``operator`` or ``agent``), and whose
  ``preempts`` is the writer priority rule: the operator takes the Lease from an agent at once,
  agents take it only when it is absent, released or stale.
- ``WriterLease`` is the ``LeaderElector`` on that lock; its ``on_takeover`` keeps the holder a
  candidate took a stale Lease from (``StaleHolder``), and ``dead_writer_seeds`` dates that dead
  agent writer's node from its last writer renewal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._rules.document import NodeId
from .._rules.election_rules import LeaderElectionRecord
from .._rules.leases_rules import ANNOTATION_WRITER_PRIORITY, LABEL_LEASE
from .election import LeaderElectionConfig, LeaderElector, LeaseLock, Takeover
from .kubeapi import RENDEZVOUS_LABEL, KubernetesApi
from .leases import NodeRecord, writer_lease_name

#: The writer priority of the operator's folder, which takes the writer Lease from an agent's.
PRIORITY_OPERATOR = "operator"
#: The writer priority of an agent process's folder.
PRIORITY_AGENT = "agent"


class WriterLock(LeaseLock):
    """The writer Lease of one Rendezvous, as a lock: the operator's folder (``preferred``) preferred over agents'."""

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        identity: str,
        *,
        preferred: bool,
        owner: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            api,
            namespace,
            writer_lease_name(rendezvous_name),
            identity,
            labels={RENDEZVOUS_LABEL: rendezvous_name, LABEL_LEASE: "writer"},
            annotations={ANNOTATION_WRITER_PRIORITY: PRIORITY_OPERATOR if preferred else PRIORITY_AGENT},
            owner=owner,
        )
        self.rendezvous_name = rendezvous_name
        self.preferred = preferred

    def describe(self) -> str:
        return f"writer {super().describe()}"

    def holder_priority(self) -> str | None:
        """The writer priority on the Lease as this lock last read or wrote it (None: none)."""
        metadata = (self.lease or {}).get("metadata") or {}
        priority = (metadata.get("annotations") or {}).get(ANNOTATION_WRITER_PRIORITY)
        return None if priority is None else str(priority)

    def preempts(self, record: LeaderElectionRecord) -> bool:
        """The writer priority rule, for ``LeaderElector``: the operator takes the Lease holding ``record``
        (as this lock has just read it) from a live holder that is not the operator."""
        return self.preferred and self.holder_priority() != PRIORITY_OPERATOR


@dataclass(frozen=True)
class StaleHolder:
    """The holder a candidate took a stale Lease from, as that candidate last saw it."""

    identity: str
    #: ``spec.renewTime`` of its last renewal: the old holder's own clock.
    renewed_at: datetime | None
    #: When this candidate first saw that renewal, on its own monotonic clock, or, if later, when the
    #: API server last failed or refused it (the holder may have been cut off by the same outage).
    seen_at: float


def dead_writer_seeds(holder: StaleHolder, records: list[NodeRecord], prefix: str) -> list[tuple[NodeId, str, float]]:
    """``(node, version, since)`` for the node of a writer that died, dated from its writer Lease.

    An agent writer (identity ``prefix`` + node) renews its node Lease and the writer Lease from one
    process, so both ``renewTime`` stamps come from one clock. A node Lease renewed ``d`` seconds
    after the writer Lease's last renewal (``d`` <= 0: before it) has not changed since
    ``seen_at + max(d, 0)``, where ``seen_at`` is when the candidate saw that writer renewal, on
    its own clock. Its expiry then runs from there, not from the takeover: a dead writer's node is
    removed one expiry after its death, not after failover plus an expiry. Never early: ``seen_at``
    is at or after the writer renewal itself, and ``d`` is measured on the dead process's one clock.
    ``LeaseObservations.seed`` ignores a date later than the candidate's own observation.
    """
    if holder.renewed_at is None or not holder.identity.startswith(prefix):
        return []
    writer_renewed = holder.renewed_at
    return [
        (record.node, record.version, holder.seen_at + max(0.0, (record.renewed_at - writer_renewed).total_seconds()))
        for record in records
        if f"{prefix}{record.node}" == holder.identity and record.renewed_at is not None
    ]


class WriterLease(LeaderElector):
    """The election of the one folder of a Rendezvous: a ``LeaderElector`` on its ``WriterLock``, with the
    writer priority rule (``WriterLock.preempts``).

    ``taken_from_stale`` is the holder of the last writer Lease this identity took because it was
    stale (None otherwise, or once its reader took it).
    """

    def __init__(self, lock: WriterLock, config: LeaderElectionConfig) -> None:
        super().__init__(lock, config, preempts=lock.preempts, on_takeover=self._keep_stale_holder)
        #: The lock, as its own type (its ``owner`` may be set once the Rendezvous is known).
        self.writer_lock = lock
        self.taken_from_stale: StaleHolder | None = None

    def _keep_stale_holder(self, takeover: Takeover) -> None:
        """Keep the holder of a stale Lease this identity took; its silence counts only from when this
        candidate got through (a holder that did not renew while this candidate could not reach the API
        server either may have failed for the same reason)."""
        previous = takeover.previous
        if takeover.expired and previous.holder_identity:
            seen_at = max(takeover.observed_at, self.unreachable_at)
            self.taken_from_stale = StaleHolder(previous.holder_identity, previous.renew_time, seen_at)
