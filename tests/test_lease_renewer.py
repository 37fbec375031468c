"""The process's Lease renewer: one slow renewal never holds back the heartbeats of the others.

Found at N=1024 (128 agents per benchmark process): renewing one by one, a single answer the
API server queued for seconds made the process's other 127 Leases miss their expiry, and the
operator removed live nodes. Pure: the Leases here are stand-ins that count their renewals.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any, cast

from kube_rendezvous._kube.leases import RENEWALS_IN_FLIGHT, LeaseNodeLock, LeaseRenewer

from tests.testenv import wait_until


class StandInLease:
    def __init__(self, name: str, gate: threading.Event | None = None) -> None:
        self.name = name
        self.gate = gate
        self.renewals = 0
        self.concurrent = 0
        self.most_concurrent = 0
        self.renewed_at: datetime | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.name

    def update(self, desire: Any = None, timeout: float | None = None) -> None:
        with self._lock:
            self.concurrent += 1
            self.most_concurrent = max(self.most_concurrent, self.concurrent)
        try:
            if self.gate is not None:
                self.gate.wait(30)
            self.renewals += 1
            self.renewed_at = datetime.now(timezone.utc)
        finally:
            with self._lock:
                self.concurrent -= 1


def test_a_renewal_stuck_on_a_slow_answer_does_not_hold_back_the_other_leases() -> None:
    gate = threading.Event()
    stuck = StandInLease("stuck", gate)
    others = [StandInLease(f"lease-{index}") for index in range(3 * RENEWALS_IN_FLIGHT)]
    renewer = LeaseRenewer(interval=0.2)
    try:
        for lease in [stuck, *others]:
            renewer.add(cast(LeaseNodeLock, lease))
        wait_until(lambda: all(lease.renewals >= 3 for lease in others), 20, "the other Leases to be renewed")
        assert stuck.renewals == 0
        assert stuck.most_concurrent == 1  # never renewed twice at once while its answer is pending
    finally:
        gate.set()
        for lease in [stuck, *others]:
            renewer.remove(cast(LeaseNodeLock, lease))
    wait_until(lambda: stuck.renewals >= 1, 20, "the stuck renewal to finish once answered")
