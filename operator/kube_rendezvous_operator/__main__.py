"""``python -m kube_rendezvous_operator``: run the operator.

With ``--leader-election`` (the chart's default) any number of replicas may run: the one holding
the Lease ``kube-rendezvous-operator`` acts, the others stand by (``leadership``); every replica serves
``/metrics``, where ``kube_rendezvous_operator_leader`` tells the one that acts. Without it the
operator acts at once, standalone (no Kopf peering objects): run exactly one replica then.

Settings are resolved once (``config.OperatorConfig``) and passed explicitly: to the handlers in
Kopf's memo, and to the election.
"""

from __future__ import annotations

import logging
import os
import sys

import kopf
from kube_rendezvous import KubernetesApi, load_api_client

from .config import OperatorConfig
from .memory import OperatorMemo

#: Seconds one request of the operator's handlers may take.
REQUEST_SECONDS = 15.0

#: How an operator's user names another kubeconfig (``load_api_client``'s advice when none loads).
KUBECONFIG_FIX = "set KUBECONFIG=PATH in the operator's environment"


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run Kopf until stopped."""
    config = OperatorConfig.from_arguments(sys.argv[1:] if argv is None else argv, os.environ, os.getpid())
    kopf.configure(
        verbose=config.verbose,
        log_format=kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("kube_rendezvous").setLevel(logging.INFO)
    from . import handlers

    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    client, _ = load_api_client(config.kubeconfig, None, fix=KUBECONFIG_FIX)
    memo = OperatorMemo(config=config, api=KubernetesApi(client, REQUEST_SECONDS))

    def run() -> None:
        kopf.run(
            registry=registry,
            memo=memo,
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            liveness_endpoint=config.liveness,
        )

    if not config.leader_election:
        run()
        return
    from . import metrics
    from .leadership import OPERATOR_ELECTION, Leadership, StandbyHealth, operator_namespace

    # A standby serves /metrics too (its scrape target is up), and says it stands by (LEADER 0).
    metrics.set_leader(False)
    metrics.serve(config.metrics_port)

    # Its own client, with requests shorter than the renew deadline, so a hung request cannot outlast it.
    election_api = KubernetesApi(
        load_api_client(config.kubeconfig, None, fix=KUBECONFIG_FIX)[0], OPERATOR_ELECTION.request_timeout
    )
    leadership = Leadership(election_api, operator_namespace(config.pod_namespace), config.identity)
    with StandbyHealth(config.liveness):
        leadership.acquire()
    leadership.start_renewing()
    try:
        run()
    finally:
        leadership.release()


if __name__ == "__main__":
    main()
