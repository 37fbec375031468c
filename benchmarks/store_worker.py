"""One agent-store benchmark process: T agents in threads run tensorplay's own store steps of a round.

After a round forms, tensorplay's elastic agent uses the rendezvous store twice (BRIEF fact 6):
``SimpleElasticAgent._assign_worker_ranks`` (every agent sets its role, rank 0 reads all N and
sets N assignments, every agent reads its own) and, at the end, the exit barrier
(``tensorplay.distributed.elastic.utils.store.barrier``: every agent adds to one counter and waits
for the last). This runs both, tensorplay's code unchanged, on ``k8s`` (our store, a round prefix
as the handler gives it) or on ``p10d`` (a TCPStore client). Prints ``ready``, waits for ``go``,
writes a JSON report to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from types import SimpleNamespace
from typing import Any

from benchmarks.runner import in_threads, key_watch_caches, round_store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True, choices=["k8s", "p10d"])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--first-rank", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from benchmarks.run import lower_priority

    lower_priority()
    from tensorplay.distributed.elastic.agent.server.api import SimpleElasticAgent
    from tensorplay.distributed.elastic.utils.store import barrier

    stores: list[Any] = []
    raw: list[Any] = []
    for _ in range(args.threads):
        if args.backend == "k8s":
            from kube_rendezvous import create_backend
            from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters

            params = RendezvousParameters(
                backend="k8s",
                endpoint=args.endpoint,
                run_id="none",
                min_nodes=args.nodes,
                max_nodes=args.nodes,
                config={"kubeconfig": args.kubeconfig, "create": "false"},
            )
            _, store = create_backend(params)
            raw.append(store)
            stores.append(round_store(store))
        else:
            from tensorplay.distributed import TCPStore

            host, port = args.endpoint.rsplit(":", 1)
            stores.append(TCPStore(host, int(port), is_master=False, timeout=600))
    print("ready", flush=True)
    input()
    spec = SimpleNamespace(role="default", local_world_size=1)
    results: list[dict[str, Any]] = [{} for _ in stores]
    started = time.time()

    def agent(index: int) -> None:
        rank = args.first_rank + index
        store = stores[index]
        try:
            workers = SimpleElasticAgent._assign_worker_ranks(None, store, rank, args.nodes, spec)  # type: ignore[arg-type]
            assigned = time.time() - started
            with barrier(store, args.nodes, key_prefix="torchelastic/agent/terminal_state", timeout=600):
                pass
            results[index] = {
                "rank": rank,
                "global_rank": workers[0].global_rank,
                "assigned": assigned,
                "seconds": time.time() - started,
            }
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            results[index] = {"error": f"{type(exc).__name__}: {exc}", "seconds": time.time() - started}

    in_threads(agent, len(stores))
    counts = [dict(store.stats) for store in raw]
    caches = key_watch_caches(raw)  # the process's key watches
    watches = {id(cache): dict(cache.stats) for cache in caches}
    with open(args.out, "w") as handle:
        json.dump({"started": started, "results": results, "store": counts, "watches": list(watches.values())}, handle)
    os._exit(0)


if __name__ == "__main__":
    main()
