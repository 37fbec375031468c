"""Leader election of operator replicas: one acts, the others stand by (client-go's scheme, on a Lease).

The replica holding the Lease ``kube-rendezvous-operator`` in the operator's own namespace runs
the handlers; the others try again every ``retry_period`` of ``OPERATOR_ELECTION`` (the backend's
generic ``LeaderElector`` on a ``LeaseLock``, with its ``LeaderElectionConfig`` and run loop
``ElectorRun``, as the folder's writer election). A leader whose last successful renewal was sent
``renew_deadline`` ago, or that lost its Lease, exits at once (``on_stopped_leading``), before its
Lease (``lease_duration``) can look stale to another replica, so two replicas never act together;
its Deployment restarts it as a standby. A leader stopped with SIGTERM (a rollout, a drain)
releases the Lease on its way out, so a standby takes over within ``retry_period``.

After a leader dies without releasing (SIGKILL, a lost node), a standby holds the Lease within
``lease_duration + retry_period`` of the leader's last renewal, then starts its handlers
(``benchmarks/failover.py`` measures the whole failover).

Not guaranteed: the renew deadline is kept on the leader's monotonic clock by a thread; a leader
whose process is frozen (SIGSTOP, a paused VM) for longer than ``lease_duration`` may act once more
when it resumes, before that thread runs and exits.
"""

from __future__ import annotations

import http.server
import logging
import os
import threading
import urllib.parse
from pathlib import Path

from kube_rendezvous import ElectorRun, KubernetesApi, LeaderElectionConfig, LeaderElector, LeaseLock

logger = logging.getLogger(__name__)

#: Seconds between two "standing by" log lines of a standby.
STANDBY_LOG_SECONDS = 30.0
#: Where a pod finds its own namespace.
SERVICEACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def operator_namespace(configured: str | None) -> str:
    """The Lease's namespace: ``configured`` (``POD_NAMESPACE``), else the pod's service account's, else ``default``."""
    if configured:
        return configured
    if SERVICEACCOUNT_NAMESPACE.exists():
        return SERVICEACCOUNT_NAMESPACE.read_text().strip()
    return "default"


def exit_now() -> None:
    """What a leader does when it lost its Lease: stop acting at once (its Deployment restarts it)."""
    logging.shutdown()
    os._exit(1)


#: The name of the Lease the operator replicas elect their leader on.
LEASE_NAME = "kube-rendezvous-operator"
#: The replicas' election: renew every 2 s, exit 7 s after the last successful renewal, stale after 10 s;
#: an election request may take 3 s (well under the renew deadline).
OPERATOR_ELECTION = LeaderElectionConfig(
    lease_duration=10.0, renew_deadline=7.0, retry_period=2.0, request_timeout=3.0, on_stopped_leading=exit_now
)


class Leadership:
    """Acquire the operator's Lease before acting, renew it while acting, release it on the way out.

    One term of the backend's elector run loop (``ElectorRun``), as the folder's writer election: a
    renewal counts from when it was sent, and ``on_stopped_leading`` (``exit_now``) is called as soon
    as the Lease is lost or the renew deadline passes, even while a renewal hangs.
    """

    def __init__(
        self, api: KubernetesApi, namespace: str, identity: str, config: LeaderElectionConfig = OPERATOR_ELECTION
    ) -> None:
        self.config = config
        lock = LeaseLock(api, namespace, LEASE_NAME, identity, labels={"app.kubernetes.io/name": LEASE_NAME})
        self.elector = LeaderElector(lock, config)
        self.term = ElectorRun(self.elector)
        self._logged = float("-inf")

    def acquire(self) -> None:
        """Block until this replica holds the Lease (a standby waits here); calls ``on_started_leading``."""
        self.term.acquire(threading.Event(), self._standby)
        logger.info("%s is the leader (%s); starting the handlers", self.elector.identity, self.elector.describe())

    def _standby(self, failed: bool) -> float:
        """Log that this replica stands by (every ``STANDBY_LOG_SECONDS``); seconds until its next step."""
        now = self.config.clock()
        if now - self._logged >= STANDBY_LOG_SECONDS:
            self._logged = now
            logger.info(
                "standing by: %s is held by %s; trying every %g s",
                self.elector.describe(),
                self.elector.holder or "nobody",
                self.config.retry_period,
            )
        return self.config.retry_period

    def start_renewing(self) -> ElectorRun:
        """Renew every ``retry_period`` from a thread; ``on_stopped_leading`` on a loss or past the deadline."""
        return self.term.start()

    def release(self) -> None:
        """Stop renewing (once no renewal is in flight) and give the Lease up, so a standby takes over at once."""
        self.term.stop()
        self.elector.release()


class StandbyHealth:
    """Answers the liveness probe with 200 while this replica stands by (the handlers' server is not up yet)."""

    def __init__(self, endpoint: str) -> None:
        parsed = urllib.parse.urlparse(endpoint)
        path = parsed.path or "/"

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == path else 404)
                self.end_headers()
                self.wfile.write(b"standing by\n")

            def log_message(self, *_: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((parsed.hostname or "0.0.0.0", parsed.port or 80), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="standby-health", daemon=True)

    def __enter__(self) -> StandbyHealth:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
