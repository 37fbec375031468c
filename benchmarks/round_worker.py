"""One benchmark worker process: T rendezvous handlers in threads join one round together.

Backends: ``k8s`` and ``p10d`` through tensorplay's registry; ``torch-k8s`` and ``torch-c10d``
through torch's (stock torchrun's handlers).

Prints ``ready`` once its handlers exist, waits for ``go`` on stdin, runs ``next_rendezvous``
in every thread, writes a JSON report to ``--out`` and optionally keeps heartbeating for
``--hold`` seconds (steady-state measurement).

``--assign-ranks``: after its round, every thread runs its framework's own
``SimpleElasticAgent._assign_worker_ranks`` on the store the round returned, as the launcher does
before it starts workers (``identical``: with ``TORCH_ELASTIC_WORKER_IDENTICAL=1``, the
frameworks' path without the store).

``--recover SECONDS`` (with ``--assign-ranks``): after the first round, the launcher's monitor loop
on every handler; a handler whose ``num_nodes_waiting`` turns positive (its round lost a member)
re-rendezvouses and assigns its ranks again, as the launcher restarts its workers. Writes
``--out`` + ``.recovered`` when every handler has, or after SECONDS. ``--addr-start I``: thread t
registers the address ``agent_address(I + t)``, one per agent, as pods have (the operator's pod
rule matches agents to pods by address).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from benchmarks.runner import api_requests, in_threads, library_counters


def create_handler(backend: str, params: dict[str, Any]) -> Any:
    """A handler for ``backend`` from its framework's own registry."""
    if backend.startswith("torch-"):
        from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        return get_rendezvous_handler(TorchParameters(backend=backend.removeprefix("torch-"), **params))
    from kube_rendezvous import register
    from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters, get_registry

    register()
    return get_registry().create_handler(RendezvousParameters(backend=backend, **params))


#: Workers per agent in the rank assignment (``--nproc-per-node``).
LOCAL_WORKERS = 2


def agent_address(index: int) -> str:
    """The loopback address of agent ``index`` (Linux routes all of 127.0.0.0/8 to lo): 127.1.x.y."""
    return f"127.1.{index // 200}.{index % 200 + 1}"


class _Agent:
    """What ``_assign_worker_ranks`` takes as ``self``: neither framework's reads anything of it."""


def assign_ranks(backend: str, handler: Any, store: Any, rank: int, world: int) -> list[int]:
    """The framework's own rank assignment for an agent of ``rank`` in a round of ``world`` agents;
    returns its workers' global ranks."""
    if backend.startswith("torch-"):
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec
    else:
        from tensorplay.distributed.elastic.agent.server.api import (  # type: ignore[assignment]
            SimpleElasticAgent,
            WorkerSpec,
        )
    spec = WorkerSpec(role="trainer", local_world_size=LOCAL_WORKERS, rdzv_handler=handler, entrypoint="train.py")
    workers = SimpleElasticAgent._assign_worker_ranks(_Agent(), store, rank, world, spec)
    return [worker.global_rank for worker in workers]


def write_json(path: str, report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` whole or not at all: the driver reads a file as soon as it exists."""
    with open(path + ".part", "w") as handle:
        json.dump(report, handle)
    os.replace(path + ".part", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True, choices=["k8s", "p10d", "torch-k8s", "torch-c10d"])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--nodes", type=int, required=True, help="max_nodes (and min_nodes unless --min-nodes)")
    parser.add_argument("--min-nodes", type=int, help="min_nodes (default: --nodes)")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--out", required=True)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--assign-ranks", choices=["none", "store", "identical"], default="none")
    parser.add_argument(
        "--monitor-interval",
        type=float,
        default=0.1,
        help="while holding, call num_nodes_waiting on every handler this often, as the launcher's monitor loop does",
    )
    parser.add_argument("--recover", type=float, default=0.0)
    parser.add_argument("--addr-start", type=int)
    args = parser.parse_args()
    os.environ["TORCH_ELASTIC_WORKER_IDENTICAL"] = "1" if args.assign_ranks == "identical" else "0"
    from benchmarks.run import lower_priority

    lower_priority()
    if os.environ.get("BENCH_LOG"):  # the handlers' own log lines, timestamped, on stderr
        import logging

        line = f"%(asctime)s w{args.worker} %(threadName)s %(name)s: %(message)s"
        logging.basicConfig(level=logging.INFO, format=line)
    config: dict[str, Any] = {"last_call_timeout": 30, "join_timeout": 900}
    config.update(json.loads(os.environ.get("BENCH_RDZV_CONF", "{}")))
    if args.backend.endswith("k8s"):
        config.update(kubeconfig=args.kubeconfig, create="false")
    else:
        config.update(is_host="false", read_timeout=600)
    if args.backend.startswith("torch-"):
        config["timeout"] = config.pop("join_timeout")  # torchrun's name
    handlers = []
    for position in range(args.threads):
        params = {
            "endpoint": args.endpoint,
            "run_id": args.run_id,
            "min_nodes": args.nodes if args.min_nodes is None else args.min_nodes,
            "max_nodes": args.nodes,
            "local_addr": "127.0.0.1" if args.addr_start is None else agent_address(args.addr_start + position),
            **{key: value for key, value in config.items()},
        }
        if not args.backend.startswith("torch-"):
            params = {key: params[key] for key in ("endpoint", "run_id", "min_nodes", "max_nodes", "local_addr")}
            params["config"] = dict(config)
        handlers.append(create_handler(args.backend, params))
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.time()
    results: list[dict[str, Any]] = [{} for _ in handlers]

    def join(index: int) -> None:
        try:
            info = handlers[index].next_rendezvous()
            results[index] = {"seconds": time.time() - started, "rank": info.rank, "world": info.world_size}
            joined_at = getattr(handlers[index], "joined_at", None)
            if joined_at is not None:  # ours: the round formed here; the rest is the store's bootstrap step
                results[index]["joined"] = joined_at - started
            bootstrap = getattr(handlers[index], "bootstrap_seconds", None)
            if bootstrap is not None:  # ours: rank 0 starting its TCPStore, then publishing (or reading) its address
                results[index]["bootstrap"] = bootstrap
            if args.assign_ranks != "none":
                began = time.time()
                ranks = assign_ranks(args.backend, handlers[index], info.store, info.rank, info.world_size)
                results[index].update(ranks=ranks, assign=time.time() - began, trained=time.time() - started)
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            results[index] = {"error": f"{type(exc).__name__}: {exc}", "seconds": time.time() - started}

    in_threads(join, len(handlers))

    def stats() -> tuple[list[dict[str, int]], list[dict[str, int]]]:
        """Per handler of ours: its API client's counters, and its own and its store's counters."""
        counted = [found for found in map(library_counters, handlers) if found is not None]  # not p10d's, c10d's
        return [api for api, _ in counted], [counts for _, counts in counted]

    api_stats, backend_stats = stats()
    report = {"started": started, "results": results, "api": api_stats, "backend": backend_stats}
    write_json(args.out, report)
    if args.hold:
        # The launcher's monitor loop: num_nodes_waiting on every agent, every monitor interval.
        until = time.monotonic() + args.hold
        while time.monotonic() < until:
            for handler in handlers:
                handler.num_nodes_waiting()
            time.sleep(args.monitor_interval)
        api_after, backend_after = stats()
        write_json(args.out + ".hold", {"api": api_after, "backend": backend_after})
    if args.recover:
        recover(args.backend, handlers, args.recover, args.monitor_interval, args.out + ".recovered")
    os._exit(0)  # do not close the rendezvous or wait for tensorplay's threads


def recover(backend: str, handlers: list[Any], seconds: float, interval: float, out: str) -> None:
    """The launcher's monitor loop and restart: see ``--recover``. Times are ``time.time()``."""
    results: list[dict[str, Any]] = [{} for _ in handlers]

    def again(index: int, detected: float) -> None:
        handler = handlers[index]
        try:
            info = handler.next_rendezvous()
            formed = time.time()
            ranks = assign_ranks(backend, handler, info.store, info.rank, info.world_size)
            results[index] = {
                "detected": detected,
                "formed": formed,
                "trained": time.time(),
                "rank": info.rank,
                "world": info.world_size,
                "ranks": ranks,
                "bootstrap": getattr(handler, "bootstrap_seconds", None),
            }
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            results[index] = {"error": f"{type(exc).__name__}: {exc}", "detected": detected}

    before = api_requests(handlers)
    started: dict[int, threading.Thread] = {}
    until = time.monotonic() + seconds
    while time.monotonic() < until and len(started) < len(handlers):
        for index, handler in enumerate(handlers):
            if index not in started and handler.num_nodes_waiting() > 0:
                started[index] = threading.Thread(target=again, args=(index, time.time()), daemon=True)
                started[index].start()
        time.sleep(interval)
    for thread in started.values():
        thread.join(max(0.0, until - time.monotonic()))
    write_json(out, {"results": results, "requests": api_requests(handlers) - before})


if __name__ == "__main__":
    main()
