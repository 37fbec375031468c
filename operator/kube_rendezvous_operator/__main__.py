"""``python -m kube_rendezvous_operator``: run the operator (one active replica, standalone).

Use a Deployment with one replica and the Recreate strategy: the operator runs standalone
(no Kopf peering objects), so two replicas would both act.
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

    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )


if __name__ == "__main__":
    main()
