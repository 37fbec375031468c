"""``python -m kube_rendezvous_operator``: run the operator.

With ``--leader-election`` (the chart's default) any number of replicas may run: the one holding
the Lease ``kube-rendezvous-operator`` acts, the others stand by (``election``). Without it the
operator acts at once, standalone (no Kopf peering objects): run exactly one replica then.
"""

from __future__ import annotations

import argparse
import logging
import os

import kopf


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run Kopf until stopped."""
    parser = argparse.ArgumentParser(prog="python -m kube_rendezvous_operator", description=__doc__)
    parser.add_argument("--namespace", action="append", default=[], help="watch only these namespaces (repeatable)")
    parser.add_argument(
        "--liveness",
        default=os.environ.get("LIVENESS_ENDPOINT", "http://0.0.0.0:8080/healthz"),
        help="liveness endpoint URL (default %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("METRICS_PORT", "9090")),
        help="port of /metrics (default %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        choices=["plain", "json"],
        default=os.environ.get("LOG_FORMAT", "json"),
        help="structured JSON logs by default",
    )
    parser.add_argument(
        "--leader-election",
        action="store_true",
        default=os.environ.get("LEADER_ELECTION", "").lower() in ("1", "true", "yes"),
        help="act only while holding the Lease kube-rendezvous-operator in the operator's namespace "
        "(POD_NAMESPACE); run 2 replicas for a standby",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    os.environ["METRICS_PORT"] = str(args.metrics_port)
    if args.namespace:
        os.environ["KUBE_RENDEZVOUS_WATCH_NAMESPACES"] = ",".join(args.namespace)
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("kube_rendezvous").setLevel(logging.INFO)
    from . import handlers, writer  # noqa: F401 - registers the handlers

    def run() -> None:
        kopf.run(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
        )

    if not args.leader_election:
        run()
        return
    from kube_rendezvous.kubeapi import KubernetesApi, load_api_client

    from .election import ELECTION_REQUEST_SECONDS, Leadership, StandbyHealth, operator_namespace, replica_identity

    # Its own client, with requests shorter than the renew deadline, so a hung request cannot outlast it.
    api = KubernetesApi(load_api_client(os.environ.get("KUBECONFIG") or None, None)[0], ELECTION_REQUEST_SECONDS)
    leadership = Leadership(api, operator_namespace(), replica_identity())
    with StandbyHealth(args.liveness):
        leadership.acquire()
    leadership.start_renewing()
    try:
        run()
    finally:
        leadership.release()


if __name__ == "__main__":
    main()
