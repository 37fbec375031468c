"""Recovery at scale (issue #28): from one agent's failure to every survivor holding its new ranks
(``python -m benchmarks.recovery_at_scale``).

An elastic job of N agents (``--nnodes=N-8:N``, the default 30 s last call, threads in 8 processes
plus the victim alone in a ninth, 2 workers per agent, ``TORCH_ELASTIC_WORKER_IDENTICAL=1``) forms
its round; then the victim fails. Every survivor runs the launcher's monitor loop
(``num_nodes_waiting`` every 0.1 s) and, when its round lost a member, re-rendezvouses and assigns
its ranks (``round_worker --recover``). Modes, every repeat reported:

- ``pod deleted``: the operator runs and knows the job's N pods (played: no kubelet); the victim is
  SIGKILLed and its pod deleted. The operator evicts its node, and its pods rule completes the round
  as soon as every live pod's node has joined.
- ``agent frozen``: the operator runs; the victim is SIGSTOPped and its pod stays Running. Its node
  goes by heartbeat expiry (15 s); its agent is gone, so the pods rule does not wait for its pod.
- ``pod deleted, operator stopped`` (the baseline): no operator; the agents fold. The node goes by
  heartbeat expiry and the round waits out the last call, as every failure did before the pods rule.

Phases, in seconds after the failure, each the slowest survivor's: *detected* (its
``num_nodes_waiting`` turned positive), *formed* (its ``next_rendezvous`` returned: the round and
the bootstrap address), *ranks* (its rank assignment), *held* (every survivor held its new ranks).
Writes ``benchmarks/results/recovery_at_scale.json``, a table in ``docs/benchmarks.md`` and
``docs/recovery-at-scale.png``.

Not measured: starting the workers (no backend changes that), torchrun's agent (the handler and
folder are the same; its round benchmark is in ``time_to_train``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.round_worker import agent_address
from benchmarks.run import GROUP, VERSION, Bench, agent_env, control_plane, go, round_worker, start_operator
from benchmarks.runner import AT_SCALE, Benchmark, arguments, figure, log, main, marker_handles

BASELINE = "pod deleted, operator stopped"
#: (label, the operator runs, the victim's pod is deleted, the signal the victim gets)
MODES = (
    ("pod deleted", True, True, signal.SIGKILL),
    ("agent frozen", True, False, signal.SIGSTOP),
    (BASELINE, False, False, signal.SIGKILL),
)
#: Survivors have this long to hold new ranks after the failure.
RECOVER_SECONDS = 240.0
PROCESSES = 8


def create_pods(bench: Bench, name: str, nodes: int) -> None:
    """The job's ``nodes`` pods, Running with agent ``i``'s address (no kubelet runs: we play it)."""
    from kubernetes import client, config

    from tests.e2e.operator_process import create_training_pod

    core = client.CoreV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: create_training_pod(core, "bench", f"pod-{i}", name, agent_address(i)), range(nodes)))


def start_worker(
    bench: Bench, backend: str, name: str, nodes: int, index: int, count: int, first: int, out: Path
) -> subprocess.Popen[str]:
    extra = ["--recover", str(RECOVER_SECONDS), "--addr-start", str(first)]
    with (bench.workdir / "agents.log").open("a") as log_file:  # the handlers' warnings, not the console
        return round_worker(
            backend, f"bench/{name}", "none", nodes, nodes - 8, count, out, bench.trainer, index, "identical", extra,
            stderr=log_file, env=agent_env(),
        )  # fmt: skip


def start_job(
    bench: Bench, backend: str, name: str, nodes: int, tag: str, files: int
) -> tuple[list[subprocess.Popen[str]], subprocess.Popen[str], list[Path]]:
    """The job's agents: N-1 members as threads in ``PROCESSES`` processes, the victim (the last member) alone in
    one more; and ``files`` result files, the victim's at ``PROCESSES``."""
    survivors = nodes - 1
    counts = [survivors // PROCESSES + (1 if i < survivors % PROCESSES else 0) for i in range(PROCESSES)]
    firsts = [sum(counts[:i]) for i in range(PROCESSES)]
    stamp = time.time_ns()
    outs = [bench.workdir / f"{tag}-{nodes}-{stamp}-{i}.json" for i in range(files)]
    workers = [
        start_worker(bench, backend, name, nodes, i, count, first, out)
        for i, (count, first, out) in enumerate(zip(counts, firsts, outs, strict=False))
    ]
    return workers, start_worker(bench, backend, name, nodes, PROCESSES, 1, survivors, outs[PROCESSES]), outs


def wait_for(paths: list[Path], seconds: float, what: str, workers: list[subprocess.Popen[str]]) -> None:
    """Wait until every path exists; log how many do every 15 s (a step of minutes at N=1024 shows it moves)."""
    began = time.monotonic()
    shown = began
    while any(not path.exists() for path in paths):
        now = time.monotonic()
        if now - began > seconds:
            raise RuntimeError(f"{what}: not within {seconds:.0f} s")
        if any(worker.poll() not in (None, 0) for worker in workers):
            raise RuntimeError(f"{what}: an agent process failed")
        if now - shown >= 15:
            shown = now
            log(f"  {what}: {sum(path.exists() for path in paths)}/{len(paths)} processes done, {now - began:.0f} s")
        time.sleep(0.2)


def one_run(bench: Bench, backend: str, nodes: int, mode: tuple[str, bool, bool, signal.Signals]) -> dict[str, Any]:
    """One recovery; the phases of the slowest survivor, in seconds after the failure."""
    label, operator_runs, delete_pod, sent = mode
    name = bench.new_rendezvous(nodes)
    bench.objects.patch_namespaced_custom_object(
        GROUP, VERSION, "bench", "rendezvouses", name, {"spec": {"minNodes": nodes - 8}}
    )
    operator = None
    if operator_runs:
        create_pods(bench, name, nodes)
        # A fresh operator per run: another run's cleanup (1024 pods gone) must not queue ahead of this one.
        operator = start_operator(bench, bench.workdir / f"operator-{name}")
    survivors = nodes - 1
    workers, victim, outs = start_job(bench, backend, name, nodes, "recovery", PROCESSES + 1)
    everyone = [*workers, victim]
    try:
        go(everyone, ready=True)
        wait_for(outs, 300, f"the first round of {nodes}", everyone)
        first = [item for out in outs for item in json.loads(out.read_text())["results"]]
        errors = [item["error"] for item in first if "error" in item]
        if errors or sorted(item["rank"] for item in first) != list(range(nodes)):
            raise RuntimeError(f"the first round of {nodes} was not whole: {errors[:1]}")
        if operator is not None:  # the operator folds (its pods rule applies) before the failure
            from tests.testenv import wait_until

            def operator_writes() -> bool:
                found: Any = bench.objects.get_namespaced_custom_object(GROUP, VERSION, "bench", "rendezvouses", name)
                return str((found.get("status") or {}).get("lastWriter")).startswith("operator/")

            wait_until(operator_writes, 60, "the operator writing the Rendezvous")
        time.sleep(2)  # the job trains: the first round's writes and bootstrap are over
        failed_at = time.time()
        os.kill(victim.pid, sent)
        if delete_pod:
            from kubernetes import client, config

            core = client.CoreV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
            core.delete_namespaced_pod(f"pod-{survivors}", "bench", grace_period_seconds=0)
        recovered = [Path(f"{out}.recovered") for out in outs[:-1]]
        wait_for(recovered, RECOVER_SECONDS + 30, f"{label}: survivors holding new ranks", workers)
        reports = [json.loads(path.read_text()) for path in recovered]
        results = [item for report in reports for item in report["results"]]
        errors = [item.get("error", "no restart") for item in results if "trained" not in item]
        if errors:
            raise RuntimeError(f"{label}: {len(errors)} survivors did not hold new ranks, e.g. {errors[0]}")
        worlds = sorted({item["world"] for item in results})
        given = sorted(rank for item in results for rank in item["ranks"])
        if worlds != [survivors] or given != list(range(2 * survivors)):
            raise RuntimeError(f"{label}: worlds {worlds}, ranks {given[:6]}...: not one world of the survivors")
        found = bench.objects.get_namespaced_custom_object(GROUP, VERSION, "bench", "rendezvouses", name)
        status: dict[str, Any] = found["status"]  # type: ignore[index]
        rounds = status.get("recentRounds") or [{}]
        rank0: dict[str, Any] = next(item for item in results if item["rank"] == 0)
        return {
            "detected": max(item["detected"] for item in results) - failed_at,
            "formed": max(item["formed"] for item in results) - failed_at,
            "ranks": max(item["trained"] - item["formed"] for item in results),
            "held": max(item["trained"] for item in results) - failed_at,
            "bootstrap": rank0["bootstrap"],
            "completed_by": rounds[-1].get("completedBy"),
            # API requests of the survivors' handlers from the failure to the end (Lease renewals included)
            "requests_per_survivor": sum(report["requests"] for report in reports) / survivors,
        }
    finally:
        if sent == signal.SIGSTOP:
            os.kill(victim.pid, signal.SIGCONT)
        for worker in everyone:
            worker.kill()
            worker.wait(30)
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        # The next run starts alone: its Leases are left to the garbage collector after 30 s.
        bench.retire(name, timeout=30)
        if operator_runs:  # one request: kubectl deletes (and waits for) 1024 pods one by one
            from kubernetes import client, config

            core = client.CoreV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
            core.delete_collection_namespaced_pod("bench", grace_period_seconds=0, _request_timeout=120)


TITLE, IMAGE = "Recovery at scale (issue #28)", "recovery at scale"


INTRO = """
{stamp} with {command}: one control plane, an elastic job of N agents (`--nnodes=N-8:N`, the default 30 s last call,
15 s heartbeat expiry) as threads in 8 processes, the victim alone in a ninth, 2 workers per agent with
`TORCH_ELASTIC_WORKER_IDENTICAL=1`. Seconds after the failure, each the slowest survivor's: *detected* (its
`num_nodes_waiting` turned positive), *formed* (its `next_rendezvous` returned, the bootstrap address included),
*ranks* (its rank assignment), *held* (every survivor held its new ranks). *requests/survivor*: API requests of the
survivors' handlers from the failure until they all held new ranks (heartbeats included), per survivor. *ratio*:
median *held* over the baseline's (no operator) at the same N and framework. Every repeat, in order. Starting the
workers is not included.
"""


def section(report: dict[str, Any]) -> list[str]:
    rows = [
        *(
            [
                "Merged from these invocations (`--keep`; each run's date is in the JSON): "
                + "; ".join(f"`{item}`" for item in report["invocations"])
                + ".",
                "",
            ]
            if len(report.get("invocations", [])) > 1
            else []
        ),
        "| N | framework | failure | detected | formed | ranks | held | ratio | completed by | requests/survivor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def runs_of(nodes: int, framework: str, label: str) -> list[dict[str, Any]]:
        return [
            r
            for r in report["runs"]
            if r["nodes"] == nodes and r["framework"] == framework and r["mode"] == label and "failed" not in r
        ]

    for nodes in report["sizes"]:
        for framework in report["frameworks"]:
            base = runs_of(nodes, framework, BASELINE)
            for label, *_ in MODES:
                done = runs_of(nodes, framework, label)
                failed = [
                    r
                    for r in report["runs"]
                    if r["nodes"] == nodes and r["framework"] == framework and r["mode"] == label and "failed" in r
                ]
                if not done and not failed:
                    continue
                cells = [", ".join(f"{r[key]:.1f}" for r in done) or "-" for key in ("detected", "formed", "ranks")]
                held = ", ".join(f"{r['held']:.1f}" for r in done)
                if failed:
                    held = (held + "; " if held else "") + f"failed: {failed[0]['failed'][:80]}"
                ratio = "-"
                if done and base:
                    held_median = statistics.median(r["held"] for r in done)
                    ratio = f"{held_median / statistics.median(r['held'] for r in base):.2f}"
                completed = ", ".join(sorted({str(r["completed_by"]) for r in done})) or "-"
                requests = ", ".join(f"{r['requests_per_survivor']:.1f}" for r in done) or "-"
                row = " | ".join([*cells, held, ratio, completed, requests])
                rows.append(f"| {nodes} | {framework} | {label} | {row} |")

    return rows


def plot(report: dict[str, Any]) -> Any:
    sizes = report["sizes"]
    made, axes = figure(5.0 * len(sizes), 3.6, columns=len(sizes))
    markers = {"detected": ("tab:orange", "|"), "formed": ("tab:blue", "|"), "held": ("tab:green", "o")}
    for axis, nodes in zip(axes, sizes, strict=True):
        labels: list[str] = []
        for framework in report["frameworks"]:
            for label, *_ in MODES:
                index = len(labels)
                labels.append(f"{framework}: {label}")
                for r in report["runs"]:
                    if (r["nodes"], r["framework"], r["mode"]) != (nodes, framework, label):
                        continue
                    if "failed" in r:
                        axis.scatter(0, index, color="black", marker="x")
                        continue
                    for key, (color, marker) in markers.items():
                        axis.scatter(r[key], index, color=color, marker=marker, s=80 if marker == "|" else 18)
        axis.set_yticks(range(len(labels)), labels if axis is axes[0] else [""] * len(labels), fontsize=7)
        axis.set_title(f"N={nodes}")
        axis.set_xlabel("seconds after the failure")
    axes[-1].legend(handles=marker_handles(markers), fontsize=7, loc="lower right")
    made.suptitle("Recovery at scale: every repeat (x: failed)")
    return made


def measure(bench: Bench, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    backend = "k8s" if case["framework"] == "tensorplay" else "torch-k8s"
    run = one_run(bench, backend, case["nodes"], next(mode for mode in MODES if mode[0] == case["mode"]))
    log(
        "  "
        + ", ".join(f"{k} {v:.1f}" for k, v in run.items() if isinstance(v, float))
        + f", completed by {run['completed_by']}"
    )
    return run


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    modes = [label for label, *_ in MODES if label in args.modes]
    return [
        {"nodes": nodes, "framework": framework, "mode": mode}
        for nodes in args.sizes
        for mode in modes
        for framework in args.frameworks
    ]


def merge(kept: dict[str, Any] | None, report: dict[str, Any], args: argparse.Namespace) -> None:
    """``--keep``: merge into the JSON, replacing the runs of these sizes, frameworks and modes."""
    if args.keep and kept is not None:
        redone = {(case["nodes"], case["framework"], case["mode"]) for case in cases(args)}
        runs = [r for r in kept["runs"] if (r["nodes"], r["framework"], r["mode"]) not in redone]
        for r in runs:
            r.setdefault("measured", kept["date"])
        report.update(
            sizes=sorted(set(kept["sizes"]) | set(args.sizes), reverse=True),
            frameworks=[f for f in ("tensorplay", "torch") if f in set(kept["frameworks"]) | set(args.frameworks)],
            runs=runs,
            invocations=[*kept.get("invocations", [f"{kept['date']}: --sizes {' '.join(map(str, kept['sizes']))}"])],
        )
    report.setdefault("invocations", [])
    report["invocations"].append(f"{report['date']}: {' '.join(sys.argv[1:])}")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modes", nargs="+", default=[label for label, *_ in MODES], choices=[m[0] for m in MODES])


BENCHMARK = Benchmark.of(
    globals(),
    setup=control_plane,
    sizes=[128, 1024],
    frameworks=["tensorplay", "torch"],
    fields=arguments("sizes", "repeats", "frameworks"),
    **AT_SCALE,
    dated=True,
    case_major=True,
    quick={"sizes": [16], "frameworks": ["tensorplay"], "modes": [BASELINE]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
