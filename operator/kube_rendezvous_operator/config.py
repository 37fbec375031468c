"""The operator's settings, resolved once from its command line (pure, no I/O).

``OperatorConfig.from_arguments`` is the one place they are read: flags first, then the environment
variables the chart sets, then the defaults. The result is passed explicitly to the handlers (in
Kopf's memo) and to the election; nothing reads the environment after that.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The default of ``--node-not-ready-seconds``. Shorter than the agents' default heartbeat expiry
#: (``RendezvousTimings``: 5 s x 3 = 15 s), so it acts before the expiry would, yet two keep-alives
#: long, so a Ready condition that flips for a moment (a kubelet restart, one missed status update)
#: evicts nothing. The node-lifecycle controller itself marks a silent node Unknown only after its
#: --node-monitor-grace-period (40-50 s upstream); a kubelet that reports Ready=False is alive and
#: says so at once. Either way an agent that still heartbeats is never evicted (``pods_rules.nodes_of_pod``).
NODE_NOT_READY_SECONDS = 10.0


def add_number_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    kind: type[int] | type[float],
    fallback: str | int | float,
    purpose: str,
) -> None:
    """Add ``flag``, a number of ``kind``: given, argparse converts it; else ``fallback`` converted (the text of an
    environment variable the chart sets, else the field's default), which its help shows.

    Raises:
        ValueError: ``fallback`` is not a number of ``kind``.
    """
    parser.add_argument(flag, type=kind, default=kind(fallback), help=f"{purpose} (default %(default)s)")


@dataclass(frozen=True)
class OperatorConfig:
    """How this operator runs.

    Attributes:
        namespaces: the namespaces it watches; empty: the whole cluster.
        liveness: the URL of its liveness endpoint.
        metrics_port: the port of ``/metrics``.
        log_format: ``json`` or ``plain``.
        leader_election: act only while holding the Lease ``kube-rendezvous-operator``.
        resync_seconds: seconds between two resyncs of a Rendezvous with its pods.
        node_not_ready_seconds: how long a Kubernetes Node must have been NotReady (its ``Ready``
            condition ``False`` or ``Unknown``, counted from that condition's ``lastTransitionTime``)
            before the nodes of the training pods on it are evicted (``NODE_NOT_READY_SECONDS``).
        fail_lost_pods_after_seconds: the default of ``spec.lostNodes.failPodsAfterSeconds``: how long after
            its Kubernetes Node went NotReady a training pod whose agents are silent is marked Failed with a
            ``DisruptionTarget`` condition, so its Job replaces it (``lost_nodes``). None (the default): off,
            except for a Rendezvous that sets it. Needs patch on pods/status.
        identity: this replica's name (``POD_NAME``, else host and pid).
        pod_namespace: the operator's own namespace (the election Lease's), None when unknown.
        kubeconfig: a kubeconfig to use instead of in-cluster credentials.
        verbose: Kopf's verbose logging.
    """

    namespaces: tuple[str, ...] = ()
    liveness: str = "http://0.0.0.0:8080/healthz"
    metrics_port: int = 9090
    log_format: str = "json"
    leader_election: bool = False
    resync_seconds: float = 10.0
    node_not_ready_seconds: float = NODE_NOT_READY_SECONDS
    fail_lost_pods_after_seconds: float | None = None
    identity: str = "operator"
    pod_namespace: str | None = None
    kubeconfig: str | None = None
    verbose: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.metrics_port < 65536:
            raise ValueError(f"--metrics-port {self.metrics_port}: must be a port number (1-65535)")
        if self.resync_seconds <= 0:
            raise ValueError(f"--resync-seconds {self.resync_seconds:g}: must be positive seconds")
        if not 0 < self.node_not_ready_seconds < float("inf"):
            raise ValueError(f"--node-not-ready-seconds {self.node_not_ready_seconds:g}: must be positive seconds")
        seconds = self.fail_lost_pods_after_seconds
        if seconds is not None and not 0 <= seconds < float("inf"):
            raise ValueError(f"--fail-lost-pods-after-seconds {seconds:g}: must be seconds, 0 or more")
        if self.log_format not in ("json", "plain"):
            raise ValueError(f"--log-format {self.log_format!r}: must be json or plain")

    @property
    def writer_identity(self) -> str:
        """This operator's identity on the writer Lease of each Rendezvous."""
        return f"operator/{self.identity}"

    @classmethod
    def from_arguments(cls, argv: Sequence[str], environ: Mapping[str, str], pid: int = 0) -> OperatorConfig:
        """Parse ``argv``; flags not given fall back to ``environ`` (what the chart sets), then the defaults.

        Raises:
            SystemExit: a malformed flag (argparse prints which, and the usage).
            ValueError: a value out of range, naming the flag.
        """
        parser = argparse.ArgumentParser(
            prog="python -m kube_rendezvous_operator", description="The kube-rendezvous operator."
        )
        parser.add_argument("--namespace", action="append", default=[], help="watch only these namespaces (repeatable)")
        parser.add_argument(
            "--liveness",
            default=environ.get("LIVENESS_ENDPOINT", cls.liveness),
            help="liveness endpoint URL (default %(default)s)",
        )
        add_number_flag(
            parser, "--metrics-port", int, environ.get("METRICS_PORT", cls.metrics_port), "port of /metrics"
        )
        parser.add_argument(
            "--log-format",
            choices=["plain", "json"],
            default=environ.get("LOG_FORMAT", cls.log_format),
            help="structured JSON logs by default",
        )
        parser.add_argument(
            "--leader-election",
            action="store_true",
            default=environ.get("LEADER_ELECTION", "").lower() in ("1", "true", "yes"),
            help="act only while holding the Lease kube-rendezvous-operator in the operator's namespace "
            "(POD_NAMESPACE); run 2 replicas for a standby",
        )
        add_number_flag(
            parser,
            "--resync-seconds",
            float,
            environ.get("KUBE_RENDEZVOUS_RESYNC_SECONDS", cls.resync_seconds),
            "seconds between resyncs of each Rendezvous with its pods",
        )
        add_number_flag(
            parser,
            "--node-not-ready-seconds",
            float,
            environ.get("KUBE_RENDEZVOUS_NODE_NOT_READY_SECONDS", cls.node_not_ready_seconds),
            "evict the nodes of training pods on a Kubernetes Node NotReady for this long",
        )
        parser.add_argument(
            "--fail-lost-pods-after-seconds",
            type=float,
            default=float(environ["KUBE_RENDEZVOUS_FAIL_LOST_PODS_AFTER_SECONDS"])
            if environ.get("KUBE_RENDEZVOUS_FAIL_LOST_PODS_AFTER_SECONDS")
            else None,
            help="mark Failed (DisruptionTarget) the training pods with silent agents on a Kubernetes Node NotReady "
            "for this long, so their Job replaces them; the default of spec.lostNodes.failPodsAfterSeconds "
            "(default: off). Needs patch on pods/status",
        )
        parser.add_argument("--verbose", action="store_true")
        args = parser.parse_args(list(argv))
        return cls(
            namespaces=tuple(args.namespace),
            liveness=args.liveness,
            metrics_port=args.metrics_port,
            log_format=args.log_format,
            leader_election=args.leader_election,
            resync_seconds=args.resync_seconds,
            node_not_ready_seconds=args.node_not_ready_seconds,
            fail_lost_pods_after_seconds=args.fail_lost_pods_after_seconds,
            identity=environ.get("POD_NAME") or f"{socket.gethostname()}-{pid}",
            pod_namespace=environ.get("POD_NAMESPACE") or None,
            kubeconfig=environ.get("KUBECONFIG") or None,
            verbose=args.verbose,
        )
