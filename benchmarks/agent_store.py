"""The store after the round (issue #12, property 5): tensorplay's rank assignment and exit barrier at N agents.

For each N: N agents (threads in 8 processes, ``benchmarks.store_worker``) run tensorplay's own
``_assign_worker_ranks`` and exit ``barrier`` against our store, and against p10d's TCPStore in
the same run. Reports every repeat: seconds, store requests in all and per agent (each agent's
own requests plus each process's one list and watch of the keys), folds of adds and lost compare-and-swaps.

Writes benchmarks/results/agent_store.json, a section of docs/benchmarks.md and
docs/agent-store.png. Usage: python -m benchmarks.agent_store [--sizes 128 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.run import Bench, agent_env, control_plane, go
from benchmarks.runner import AT_SCALE, REPO, Benchmark, figure, main
from benchmarks.scale import percentile

PROCESSES = 8


def run_once(bench: Bench, backend: str, nodes: int, limit: float) -> dict[str, Any]:
    """One rank assignment and exit barrier of ``nodes`` agents; timings and request counts."""
    from tests.testenv import free_port

    host = None
    if backend == "p10d":
        port = free_port()
        host = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.store_host", "--framework", "tensorplay", "--port", str(port)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert host.stdout is not None and host.stdout.readline().strip() == "ready"
        endpoint = f"127.0.0.1:{port}"
    else:
        endpoint = f"bench/{bench.new_rendezvous(nodes)}"
    per = [nodes // PROCESSES + (1 if i < nodes % PROCESSES else 0) for i in range(PROCESSES)]
    firsts = [sum(per[:i]) for i in range(PROCESSES)]
    outs = [bench.workdir / f"store-{backend}-{nodes}-{time.time_ns()}-{i}.json" for i in range(PROCESSES)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.store_worker",
                "--backend",
                backend,
                "--endpoint",
                endpoint,
                "--nodes",
                str(nodes),
                "--first-rank",
                str(first),
                "--threads",
                str(count),
                "--kubeconfig",
                str(bench.trainer),
                "--out",
                str(out),
            ],
            cwd=REPO,
            env=agent_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for first, count, out in zip(firsts, per, outs, strict=True)
    ]
    try:
        go(workers, ready=True)
        deadline = time.monotonic() + limit
        for worker in workers:
            worker.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{backend}: {nodes} agents did not finish within {limit:.0f} s") from exc
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        if host is not None:
            host.communicate(timeout=30)
        if bench.current is not None:
            bench.retire(bench.current)
            bench.current = None
    reports = [json.loads(out.read_text()) for out in outs]
    results = [item for report in reports for item in report["results"]]
    errors = [item["error"] for item in results if "error" in item]
    if errors:
        raise RuntimeError(f"{backend} N={nodes}: {len(errors)} agents failed, e.g. {errors[0]}")
    ranks = sorted(item["global_rank"] for item in results)
    assert ranks == list(range(nodes)), f"global ranks {ranks[:10]}..."  # every worker got a distinct rank
    start = min(report["started"] for report in reports)
    run: dict[str, Any] = {
        "seconds": max(report["started"] - start + item["seconds"] for report in reports for item in report["results"]),
        "assigned_seconds": max(
            report["started"] - start + item["assigned"] for report in reports for item in report["results"]
        ),
    }
    if backend == "k8s":
        own = sum(item["requests"] for report in reports for item in report["store"])
        watch = sum(item["lists"] + item["watches"] for report in reports for item in report["watches"])
        run.update(
            requests=own + watch,
            requests_per_agent=(own + watch) / nodes,
            watch_requests=watch,
            conflicts=sum(item["conflicts"] for report in reports for item in report["store"]),
            folds=sum(item.get("folds", 0) for report in reports for item in report["store"]),
        )
    return run


class Stores:
    """The control plane, and the N at which each backend failed (it is not tried at a larger N)."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.failed_at: dict[str, int] = {}

    def measure(self, case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
        backend, nodes = case["backend"], case["nodes"]
        if backend in self.failed_at:
            return {"failed": f"not tried: {backend} already failed at N={self.failed_at[backend]}"}
        try:
            return run_once(self.bench, backend, nodes, args.p10d_limit if backend == "p10d" else args.limit)
        except Exception as exc:  # noqa: BLE001 - a failed repeat is a result
            self.failed_at[backend] = nodes
            return {"failed": f"{type(exc).__name__}: {exc}"[:300]}


@contextmanager
def stores(workdir: Path, args: argparse.Namespace) -> Iterator[Stores]:
    with control_plane(workdir) as bench:
        yield Stores(bench)


TITLE = "The store after the round: rank assignment and exit barrier"


def section(report: dict[str, Any]) -> list[str]:
    """The section of docs/benchmarks.md and docs/agent-store.png from ``report``."""
    lines = [
        f"Measured {report['date']} on one {report['machine']} machine. Command: `python -m benchmarks.agent_store`. "
        "Raw: [benchmarks/results/agent_store.json](../benchmarks/results/agent_store.json). "
        "Plot: ![agent store](agent-store.png)",
        "",
        "N agents (threads in 8 processes) run tensorplay's own `SimpleElasticAgent._assign_worker_ranks` and exit "
        "`barrier` unchanged: every agent sets its role, rank 0 reads all N and sets N assignments, every agent reads "
        "its own, then every agent adds to one counter twice (arrive, depart). Requests: every store request of "
        "every agent plus each process's one list and watch of the keys.",
        "",
        "| N | store | every repeat (s) | p50 | p90 | / p10d p90 | of which rank assignment (s) | requests in all "
        "| requests / agent | folds of adds in all | lost compare-and-swaps in all |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    failures: list[str] = []
    p90s: dict[tuple[str, int], float] = {}
    for row in report["rows"]:
        done = [run for run in row["runs"] if "seconds" in run]
        if done:
            p90s[(row["backend"], row["nodes"])] = percentile([run["seconds"] for run in done], 0.9)
    for row in report["rows"]:
        runs = row["runs"]
        done = [run for run in runs if "seconds" in run]
        every = ", ".join(f"{run['seconds']:.2f}" if "seconds" in run else "failed" for run in runs)
        p50 = f"{statistics.median(run['seconds'] for run in done):.2f}" if done else "n/a"
        p90 = p90s.get((row["backend"], row["nodes"]))
        base = p90s.get(("p10d", row["nodes"]))
        ratio = f"{p90 / base:.2f}x" if p90 and base and row["backend"] != "p10d" else ""
        requests = ", ".join(str(run["requests"]) for run in done if "requests" in run)
        per = ", ".join(f"{run['requests_per_agent']:.1f}" for run in done if "requests_per_agent" in run)
        conflicts = ", ".join(str(run["conflicts"]) for run in done if "conflicts" in run)
        folds = ", ".join(str(run["folds"]) for run in done if "folds" in run)
        assigned = ", ".join(f"{run['assigned_seconds']:.2f}" for run in done if "assigned_seconds" in run)
        name = "ours (k8s)" if row["backend"] == "k8s" else "p10d TCPStore"
        shown = "n/a" if p90 is None else f"{p90:.2f}"
        lines.append(
            f"| {row['nodes']} | {name} | {every} | {p50} | {shown} | {ratio} | {assigned} | {requests} | {per} "
            f"| {folds} | {conflicts} |"
        )
        failures += [f"\n{name} N={row['nodes']} failed: `{run['failed'][:200]}`" for run in runs if "failed" in run]
    return lines + failures


def plot(report: dict[str, Any]) -> Any:
    made, (left, right) = figure(10, 4, columns=2)
    for index, backend in enumerate(("p10d", "k8s")):
        xs, ys, rx, ry = [], [], [], []
        for row in report["rows"]:
            if row["backend"] != backend:
                continue
            for run in row["runs"]:
                if "seconds" in run:
                    xs.append(row["nodes"] * (1 + 0.04 * index))
                    ys.append(run["seconds"])
                if "requests" in run:
                    rx.append(row["nodes"])
                    ry.append(run["requests"])
        left.plot(xs, ys, "os"[index], label=f"{backend} (every repeat)")
        if rx:
            right.plot(rx, ry, "s", label=f"{backend} requests (every repeat)")
    sizes = sorted({row["nodes"] for row in report["rows"]})
    right.plot(sizes, [5 * n for n in sizes], "--", label="5 per agent")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("agents N")
        axis.legend()
    left.set_ylabel("seconds: rank assignment + exit barrier")
    right.set_ylabel("store requests in all")
    return made


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--p10d-max", type=int, default=1024)
    parser.add_argument("--p10d-limit", type=float, default=60.0, help="seconds; p10d answers in 2 s or never")


BENCHMARK = Benchmark.of(
    globals(),
    cases=lambda args: [
        {"backend": backend, "nodes": nodes}
        for nodes in args.sizes
        for backend in (("p10d", "k8s") if nodes <= args.p10d_max else ("k8s",))
    ],
    measure=lambda stores, case, repeat, args: stores.measure(case, args),
    setup=stores,
    sizes=[128, 1024],
    limit=300.0,
    table="rows",
    grouped=True,
    **AT_SCALE,
    at_end=False,
    case_major=True,
    quick={"sizes": [16]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
