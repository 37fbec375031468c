"""Scale benchmarks (issue #12) on the real control plane, beside tensorplay's p10d in the same run.

For each N: one round (min = max = N) of tensorplay handlers with p10d, with k8s while the
operator runs (the preferred writer), and with k8s while it is stopped (an agent is elected
writer), every repeat reported. Per round: the shared Rendezvous object's writes (counted by a
server-side watch), API requests and 409s per agent. Then steady state (handlers holding the
formed round, the launcher's monitor loop calling ``num_nodes_waiting`` every 0.1 s): writes
per second to the Rendezvous and to the Leases, kube-apiserver and etcd CPU. Chaos: the writer
(the operator) frozen for 20 s mid-round, and one agent SIGKILLed mid-join. Then recovery after a
SIGKILL, repeated, split into the rendezvous and the workers' restart.

Writes benchmarks/results/scale.json, docs/scale.md (spliced into docs/benchmarks.md) and
docs/scale.png. Usage: python -m benchmarks.scale [--sizes 8 32 128 512 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.report import new_report, save_report, splice
from benchmarks.run import GROUP, RESULTS, VERSION, WRITER_VICTIM, Bench, recovery, start_operator, started
from benchmarks.runner import figure, log, quick_mode, repeated, save_figure

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (p90 of 3 values is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    done = [run for run in runs if "seconds" in run]
    summary: dict[str, Any] = {"runs": runs}
    if done:
        seconds = [run["seconds"] for run in done]
        summary.update(p50=statistics.median(seconds), p90=percentile(seconds, 0.9), max=max(seconds))
    summary["failed"] = [run["failed"] for run in runs if "failed" in run]
    return summary


def rounds(bench: Bench, label: str, backend: str, nodes: int, repeats: int, limit: float) -> dict[str, Any]:
    runs = repeated(f"{label} N={nodes}", repeats, lambda: bench.round(backend, nodes, limit=limit), (RuntimeError,))
    return {"label": label, "nodes": nodes, **summarize(runs)}


FREEZE_SECONDS = 20.0
AFTER_SECONDS = 20.0


def freeze_writer(bench: Bench, operator: subprocess.Popen[bytes], log_path: Path, nodes: int) -> Any:
    """Chaos for ``Bench.round``: freeze the operator (SIGSTOP) for 20 s once it folded the first joins.

    Then, for 20 s after it resumes, check every second that the round keeps all ``nodes`` and that
    nothing was evicted or removed (the agents keep renewing: the round is held).
    """

    def during(name: str) -> dict[str, Any]:
        logged_before = log_path.stat().st_size if log_path.exists() else 0  # only this round's lines count

        def status() -> dict[str, Any]:
            obj = bench.objects.get_namespaced_custom_object(GROUP, VERSION, "bench", "rendezvouses", name)
            return dict(obj.get("status") or {})

        deadline = time.monotonic() + 60
        while not str(status().get("lastWriter")).startswith("operator/"):
            if time.monotonic() > deadline:
                return {"error": "the operator did not fold within 60 s"}
            time.sleep(0.2)
        os.kill(operator.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            time.sleep(FREEZE_SECONDS)
        finally:
            os.kill(operator.pid, signal.SIGCONT)
        frozen = time.monotonic() - frozen_at
        at_resume = status()
        lost = 0
        until = time.monotonic() + AFTER_SECONDS
        while time.monotonic() < until:
            now = status()
            if now.get("participantCount") != nodes or now.get("evictedNodes"):
                lost += 1
            time.sleep(1)
        with log_path.open("rb") as handle:
            handle.seek(logged_before)
            removed = b"removing nodes whose Lease was not renewed" in handle.read()
        return {
            "frozen_seconds": frozen,
            "formed_while_frozen": at_resume.get("phase") == "Complete",
            "last_writer_at_resume": at_resume.get("lastWriter"),
            "seconds_with_a_node_missing_after_resume": lost,
            "operator_removed_nodes": removed,
        }

    return during


def frozen_round(
    bench: Bench, nodes: int, limit: float, operator: subprocess.Popen[bytes], log_path: Path
) -> dict[str, Any]:
    """One round of ``nodes`` with the writer frozen mid-round (``freeze_writer``), held to see it keep every node."""
    hold = FREEZE_SECONDS + AFTER_SECONDS + 30
    run = bench.round("k8s", nodes, hold=hold, limit=limit, during=freeze_writer(bench, operator, log_path, nodes))
    run.pop("steady", None)
    return run


def chaos_rows(entries: list[dict[str, Any]], cells: Callable[[int, dict[str, Any]], list[Any]]) -> list[str]:
    """One table row per chaos repeat: N, the round's seconds, then ``cells(N, chaos)``; a failed repeat says why."""
    rows = []
    for entry in entries:
        for run in entry["runs"]:
            if "seconds" not in run:
                rows.append(f"| {entry['nodes']} | failed: {run.get('failed', '')[:120]} |")
                continue
            rest = " | ".join(str(cell) for cell in cells(entry["nodes"], run.get("chaos", {})))
            rows.append(f"| {entry['nodes']} | {run['seconds']:.2f} | {rest} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=[8, 32, 128, 512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--p10d-max", type=int, default=1024, help="largest N to try p10d at")
    parser.add_argument("--solo-sizes", type=int, nargs="*", default=[128, 1024], help="k8s with the operator stopped")
    parser.add_argument("--steady-sizes", type=int, nargs="*", default=[128, 1024])
    parser.add_argument("--steady-seconds", type=float, default=120.0)
    parser.add_argument("--recovery-repeats", type=int, default=3)
    parser.add_argument("--recovery-agents", type=int, default=32, help="agents of the recovery job (issue: N=32)")
    parser.add_argument("--chaos-sizes", type=int, nargs="*", default=[128], help="rounds with the writer frozen")
    parser.add_argument(
        "--kill-joiner-sizes", type=int, nargs="*", default=[128], help="rounds with one agent SIGKILLed mid-join"
    )
    parser.add_argument("--round-limit", type=float, default=240.0)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="add to benchmarks/results/scale.json instead of replacing it (e.g. --sizes with no value "
        "--solo-sizes with no value --recovery-repeats 0 to measure only the steady state)",
    )
    quick_mode(
        parser, None, sizes=[8], repeats=1, solo_sizes=[], steady_sizes=[], recovery_repeats=0, chaos_sizes=[],
        kill_joiner_sizes=[],
    )  # fmt: skip
    args = parser.parse_args()
    bench = started("scale")
    workdir = bench.workdir
    report = new_report(
        rounds=[],
        steady=[],
        recovery={},
    )
    if args.merge and (RESULTS / "scale.json").exists():
        earlier = json.loads((RESULTS / "scale.json").read_text())
        earlier["steady"] = [item for item in earlier.get("steady", []) if item["nodes"] not in args.steady_sizes]
        measured = {("p10d", n) for n in args.sizes if n <= args.p10d_max} | {("k8s", n) for n in args.sizes}
        measured |= {("k8s, operator stopped", n) for n in args.solo_sizes}
        earlier["rounds"] = [
            item for item in earlier.get("rounds", []) if (item["label"], item["nodes"]) not in measured
        ]
        report = {**earlier, "merged": [*earlier.get("merged", []), {"date": report["date"], "argv": sys.argv[1:]}]}
    operator = None
    try:
        operator = start_operator(bench, workdir / "operator")
        p10d_failed_at: int | None = None
        for nodes in args.sizes:
            if nodes <= args.p10d_max and p10d_failed_at is not None:
                skipped = f"not tried: p10d already failed at N={p10d_failed_at}"
                report["rounds"].append({"label": "p10d", "nodes": nodes, **summarize([{"failed": skipped}])})
            elif nodes <= args.p10d_max:
                entry = rounds(bench, "p10d", "p10d", nodes, args.repeats, args.round_limit)
                report["rounds"].append(entry)
                p10d_failed_at = nodes if entry["failed"] else None
            report["rounds"].append(rounds(bench, "k8s", "k8s", nodes, args.repeats, args.round_limit))
            save(report)
        for nodes in args.chaos_sizes:
            report["chaos"] = [entry for entry in report.get("chaos", []) if entry["nodes"] != nodes]
            frozen = partial(
                frozen_round, bench, nodes, args.round_limit, operator, workdir / "operator" / "operator.log"
            )
            runs = repeated(f"chaos N={nodes}", args.repeats, frozen)  # AssertionError: a duplicate rank
            report.setdefault("chaos", []).append({"nodes": nodes, **summarize(runs)})
            save(report)
        for nodes in args.kill_joiner_sizes:
            report["chaos_kill_joiner"] = [
                entry for entry in report.get("chaos_kill_joiner", []) if entry["nodes"] != nodes
            ]
            killed = partial(bench.round, "k8s", nodes, limit=args.round_limit, kill_joiner=True)
            runs = repeated(
                f"kill mid-join N={nodes}", args.repeats, killed
            )  # AssertionError: a lost join, a rank twice
            report["chaos_kill_joiner"].append({"nodes": nodes, **summarize(runs)})
            save(report)
        for nodes in args.steady_sizes:
            log(f"steady state: {nodes} agents holding for {args.steady_seconds:.0f} s")
            try:
                run = bench.round("k8s", nodes, hold=args.steady_seconds, limit=args.round_limit)
            except (RuntimeError, TimeoutError) as exc:
                log(f"steady N={nodes}: FAILED {exc}")
                failure = {"nodes": nodes, "date": time.strftime("%Y-%m-%d %H:%M"), "error": str(exc)[:200]}
                report.setdefault("steady_failed", []).append(failure)
                save(report)
                continue
            report["steady"].append({"nodes": nodes, "date": time.strftime("%Y-%m-%d %H:%M"), **run["steady"]})
            log(f"steady N={nodes}: {run['steady']}")
            save(report)
        operator.terminate()
        operator.wait(30)
        operator = None
        for nodes in args.solo_sizes:
            report["rounds"].append(
                rounds(bench, "k8s, operator stopped", "k8s", nodes, args.repeats, args.round_limit)
            )
            save(report)
        if args.recovery_repeats:
            report["recovery"], report["recovery_agents"] = {}, args.recovery_agents
            report["recovery_phases"] = {}
            report.pop("recovery_failed", None)
        for repeat in range(args.recovery_repeats):
            for mode in ("k8s-heartbeat-expiry", WRITER_VICTIM, "k8s-operator-eviction", "p10d"):
                if mode == "p10d" and repeat:
                    continue  # tensorplay 1.0.0's own recovery with p10d: once, for reference
                try:
                    details: dict[str, Any] = {}
                    for name, seconds in recovery(bench, (mode,), args.recovery_agents, details).items():
                        report["recovery"].setdefault(name, []).append(seconds)
                        report["recovery_phases"].setdefault(name, []).append(details[name])
                except (TimeoutError, RuntimeError) as exc:
                    log(f"recovery {mode}: FAILED {exc}")
                    report.setdefault("recovery_failed", {}).setdefault(mode, []).append(str(exc)[:200])
                save(report)
    finally:
        if operator is not None:
            operator.terminate()
        bench.stop()
    save(report)
    write_report(report)
    return 0


#: Save the report of ``python -m benchmarks.scale`` (after every step).
save = partial(save_report, RESULTS / "scale.json")


def _fmt(value: Any, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def write_report(report: dict[str, Any]) -> None:
    """docs/scale.md and docs/scale.png from ``report``."""
    by = {(entry["label"], entry["nodes"]): entry for entry in report["rounds"]}
    lines = [
        "## Scale: heartbeats on Leases, joins folded by one writer, reads from a watch",
        "",
        f"Measured {report['date']} on one {report['machine']} machine (control plane, operator and every "
        "agent on it). Command: `python -m benchmarks.scale`. Raw: "
        "[benchmarks/results/scale.json](../benchmarks/results/scale.json). Plot: ![scale](scale.png)",
        *[
            f"Re-measured {item['date']}, on a fresh control plane: `python -m benchmarks.scale "
            f"{' '.join(item['argv'])}` (its rows are added to the first run's, or replace them)."
            for item in report.get("merged", [])
        ],
        "",
        "One round, min = max = N, tensorplay handlers in 8 processes. Every repeat is listed; "
        "writes = MODIFIED events of the shared Rendezvous seen by a server-side watch during the round. "
        "A round ends when every handler's `next_rendezvous` returned, the bootstrap address included; the "
        "next column is when the last handler saw the round formed (before the bootstrap step), and the last "
        "splits rank 0's bootstrap step (where measured). Each round's "
        "Rendezvous is deleted, and its Leases collected, before the next round starts.",
        "",
        "| N | backend | every repeat (s) | p50 | p90 | max | / p10d p90 | shared writes | requests / agent "
        "| 409s / agent | last agent saw it formed (s) | rank 0's bootstrap: TCPStore + address (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["rounds"]:
        runs = entry["runs"]
        every = ", ".join(f"{run['seconds']:.2f}" if "seconds" in run else "failed" for run in runs)
        base = by.get(("p10d", entry["nodes"]), {}).get("p90")
        ratio = f"{entry['p90'] / base:.2f}x" if entry.get("p90") and base and entry["label"] != "p10d" else ""
        done = [run for run in runs if "seconds" in run]
        writes = ", ".join(str(run["shared_writes"]) for run in done if "shared_writes" in run)
        requests = [run["requests_per_agent"] for run in done if "requests_per_agent" in run]
        conflicts = [run["conflicts_per_agent"] for run in done if "conflicts_per_agent" in run]
        joined = ", ".join(f"{run['joined_seconds']:.2f}" for run in done if "joined_seconds" in run)
        bootstrap = ", ".join(
            f"{run['rank0_server_seconds']:.2f} + {run['rank0_address_seconds']:.2f}"
            for run in done
            if "rank0_server_seconds" in run
        )
        lines.append(
            f"| {entry['nodes']} | {entry['label']} | {every} | {_fmt(entry.get('p50'))} | {_fmt(entry.get('p90'))} "
            f"| {_fmt(entry.get('max'))} | {ratio} | {writes} "
            f"| {', '.join(f'{value:.1f}' for value in requests)} "
            f"| {', '.join(f'{value:.2f}' for value in conflicts)} | {joined} | {bootstrap} |"
        )
    for entry in report["rounds"]:
        for failure in entry.get("failed", []):
            lines.append(f"\n{entry['label']} N={entry['nodes']} failed: `{failure[:200]}`")
    if report["steady"]:
        lines += [
            "",
            "Steady state: the formed round held, the launcher's monitor loop calling `num_nodes_waiting` "
            "on every agent every 0.1 s, keep-alive 5 s; counted by server-side watches over the window "
            "after a 10 s settle.",
            "",
            "| N | measured | window (s) | writes/s to the Rendezvous | Lease writes/s (limit N/5) | agent requests/s "
            "| kube-apiserver CPU (cores) | etcd CPU (cores) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for item in report["steady"]:
            lines.append(
                f"| {item['nodes']} | {item.get('date', report['date'])} | {item.get('seconds', 0):.0f} "
                f"| {item['writes_per_second']:.2f} "
                f"| {_fmt(item.get('lease_writes_per_second'), 1)} / {item['nodes'] / 5:g} "
                f"| {_fmt(item.get('agent_requests_per_second'), 1)} "
                f"| {item['cpu_cores'].get('kube-apiserver', 0):.2f} | {item['cpu_cores'].get('etcd', 0):.2f} |"
            )
    for failure in report.get("steady_failed", []):
        lines.append(f"\nSteady state N={failure['nodes']} ({failure['date']}) not measured: `{failure['error']}`")
    if report.get("chaos"):
        lines += [
            "",
            f"Chaos: the operator (the writer) frozen with SIGSTOP for {FREEZE_SECONDS:.0f} s (the expiry is 15 s) "
            "once it folded the first joins of a round; the agents fold without it. Then, for "
            f"{AFTER_SECONDS:.0f} s after it resumed, the round checked every second (the agents hold it and "
            "keep renewing). Every repeat:",
            "",
            "| N | round (s) | ranks 0..N-1, each once | formed while frozen | seconds with a node missing after "
            "resume | operator removed a node |",
            "|---|---|---|---|---|---|",
        ]
        lines += chaos_rows(
            report["chaos"],
            lambda nodes, chaos: [
                "yes",
                chaos.get("formed_while_frozen"),
                chaos.get("seconds_with_a_node_missing_after_resume"),
                chaos.get("operator_removed_nodes"),
            ],
        )
    if report.get("chaos_kill_joiner"):
        lines += [
            "",
            "Chaos: one of the N agents runs alone in a process that is SIGKILLed the moment it logs its join "
            "request, so the request may or may not have reached the API server (minNodes N-1, a 1 s last call). "
            "Every live agent must get its own rank in one world: N-1 without the victim, N when its request was "
            "folded before it died (its rank then goes unused until its heartbeats expire). Every repeat:",
            "",
            "| N | round (s) | killed after (s) | world | live agents, each its own rank |",
            "|---|---|---|---|---|",
        ]
        lines += chaos_rows(
            report["chaos_kill_joiner"],
            lambda nodes, chaos: [_fmt(chaos.get("killed_after_seconds")), chaos.get("world"), f"yes ({nodes - 1})"],
        )
    if report["recovery"]:
        agents = report.get("recovery_agents", 3)
        workers = "2 workers" if agents <= 3 else "1 worker"
        lines += [
            "",
            f"Recovery: SIGKILL of one of {agents} agents ({workers} each) to the survivors training again, "
            "every repeat (the heartbeat expiry is 15 s: keep-alive 5 s x 3 attempts).",
            "",
            "| how | every repeat (s) | p50 | p90 |",
            "|---|---|---|---|",
        ]
        for mode, failures in report.get("recovery_failed", {}).items():
            lines.append(f"| {mode} | failed {len(failures)}x: {failures[0][:90]} | | |")
        for mode, values in report["recovery"].items():
            every = ", ".join(f"{value:.1f}" for value in values)
            lines.append(f"| {mode} | {every} | {statistics.median(values):.1f} | {percentile(values, 0.9):.1f} |")
        if report.get("recovery_phases"):
            lines += [
                "",
                "Where each recovery's time went, seconds after the kill, from the survivors' own logs: every survivor "
                "had started to re-rendezvous (*detected*), had its new round (*formed*), and all trained again "
                "(*training*); *workers* is *training* minus *formed*, the start of the new round's workers, which no "
                "rendezvous backend changes. *First start* is the same workers' start before the kill, for comparison.",
                "",
                "| how | detected | formed | workers | training | first start |",
                "|---|---|---|---|---|---|",
            ]
            for mode, phases in report["recovery_phases"].items():
                for run in phases:
                    cells = " | ".join(
                        _fmt(run.get(key), 1) for key in ("detected", "formed", "workers", "training", "first_start")
                    )
                    lines.append(f"| {mode} | {cells} |")
    (DOCS / "scale.md").write_text("\n".join(lines) + "\n")
    splice(DOCS / "benchmarks.md", (DOCS / "scale.md").read_text(), BEGIN, END)
    plot(report)


BEGIN, END = "<!-- scale:begin (python -m benchmarks.scale) -->", "<!-- scale:end -->"


def plot(report: dict[str, Any]) -> None:
    made, axis = figure(7, 4.2)
    labels = sorted({entry["label"] for entry in report["rounds"]})
    for index, label in enumerate(labels):
        xs, ys = [], []
        for entry in report["rounds"]:
            if entry["label"] == label:
                for run in entry["runs"]:
                    if "seconds" in run:
                        xs.append(entry["nodes"] * (1 + 0.04 * (index - 1)))
                        ys.append(run["seconds"])
        axis.plot(xs, ys, "os^"[index % 3], label=f"{label} (every repeat)", alpha=0.8)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("agents N (min = max = N)")
    axis.set_ylabel("seconds to complete one round")
    axis.set_title("One round: every repeat")
    axis.legend()
    save_figure(made, DOCS / "scale.png")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--report":
        write_report(json.loads((RESULTS / "scale.json").read_text()))
        sys.exit(0)
    sys.exit(main())
