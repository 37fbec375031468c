"""Nothing is slower (issue #26): this release beside the previous one, in one run
(``python -m benchmarks.nothing_slower``).

One control plane. Every case runs on this release and on the previous release (``--previous``,
extracted from git with ``git archive`` and put first on the agents' and the operator's
``PYTHONPATH``, so each release folds its own state with its own operator), side by side in every
repeat; which release goes first alternates from repeat to repeat.

- rounds: one round of N agents (min = max = N, threads in 8 processes) while the release's
  operator runs, at each of ``--sizes``;
- steady state: the formed round of ``--steady-sizes`` agents held for ``--steady-seconds`` (the
  launcher's monitor loop on every agent), with its operator running: writes/s to the Rendezvous and
  to the node Leases, the agents' requests/s, and the CPU of kube-apiserver, etcd and the agents
  (user + system time of the 8 agent processes over the window, in cores);
- recovery: SIGKILL of one of ``--recovery-agents`` agents to the survivors training again
  (``benchmarks.run.recovery``): the operator evicting the deleted pod's node, heartbeat expiry, and
  heartbeat expiry with the agent that holds the writer Lease killed.

Every repeat is kept; the ratio is this release's median over the previous release's. A case a
release cannot run (an API it lacks, a round that does not form) is recorded with why, its later
repeats skipped, and the run goes on. Writes ``benchmarks/results/nothing_slower.json``,
``docs/nothing-slower.png`` and a section of ``docs/benchmarks.md`` (between the markers); with
``--out DIR`` all three go under DIR instead. A smoke run of a few minutes: ``--quick --out /tmp/smoke``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.report import new_report, save_report, splice
from benchmarks.run import REPO, RESULTS, WRITER_VICTIM, Bench, checkout, log, recovery, release_env, start_operator
from benchmarks.runner import figure, invocation, page_under, quick_mode, save_figure, stamp

DOCS = REPO / "docs"
BEGIN, END = "<!-- nothing-slower:begin (python -m benchmarks.nothing_slower) -->", "<!-- nothing-slower:end -->"
CODES = ("this release", "previous release")
#: The recovery cases: (case, ``benchmarks.run.recovery``'s mode).
RECOVERIES = (
    ("recovery, operator eviction", "k8s-operator-eviction"),
    ("recovery, expiry", "k8s-heartbeat-expiry"),
    ("recovery, expiry, writer killed", WRITER_VICTIM),
)
#: The table's rows for each kind of case: (label, the run's value, digits).
METRICS: dict[str, tuple[tuple[str, Callable[[dict[str, Any]], Any], int], ...]] = {
    "round": (("round (s)", lambda run: run["seconds"], 2),),
    "steady": (
        ("steady: writes/s to the Rendezvous", lambda run: run["steady"]["writes_per_second"], 2),
        ("steady: Lease writes/s", lambda run: run["steady"]["lease_writes_per_second"], 1),
        ("steady: agent requests/s", lambda run: run["steady"].get("agent_requests_per_second"), 1),
        ("steady: kube-apiserver CPU (cores)", lambda run: run["steady"]["cpu_cores"].get("kube-apiserver"), 2),
        ("steady: etcd CPU (cores)", lambda run: run["steady"]["cpu_cores"].get("etcd"), 2),
        ("agents' CPU while holding (cores)", lambda run: run["steady"]["cpu_cores"].get("agents"), 2),
    ),
    "recovery": (("{case} (s)", lambda run: run["seconds"], 1),),
}
#: ``--quick``: the defaults of a smoke run (explicit options still win).
QUICK = {"sizes": [8], "steady_sizes": [8], "steady_seconds": 25.0, "repeats": 1, "recovery_agents": 3}


def order(repeat: int) -> tuple[str, ...]:
    """The releases of one repeat, in the order they run: this release first in even repeats."""
    return CODES if repeat % 2 == 0 else CODES[::-1]


def which_code(env: dict[str, str]) -> dict[str, str]:
    """Where the library and the operator that ``env`` runs come from (so a baseline is never this release)."""
    script = "import kube_rendezvous, kube_rendezvous_operator as o; print(kube_rendezvous.__file__); print(o.__file__)"
    shown = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, **env),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {"library": shown[0], "operator": shown[1]}


class Run:
    """One run's report, saved after every measurement; a failed case keeps why and is not repeated."""

    def __init__(self, report: dict[str, Any], out: Path) -> None:
        self.report, self.out = report, out
        self.failed: dict[tuple[str, int, str], str] = {}

    def measure(self, case: str, nodes: int, code: str, repeat: int, how: Callable[[], dict[str, Any]]) -> None:
        key = (case, nodes, code)
        if key in self.failed:
            log(f"{case} N={nodes} {code} repeat {repeat + 1}: skipped, it failed before")
            return
        began = time.monotonic()
        try:
            run: dict[str, Any] = how()
        except Exception as exc:  # noqa: BLE001 - a case a release cannot run is a result, not the end of the run
            run = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
            self.failed[key] = run["failed"]
        entry = {"case": case, "nodes": nodes, "code": code, "repeat": repeat, **run}
        self.report["runs"].append(entry)
        save_report(self.out, self.report)
        shown = run.get("failed") or ", ".join(
            f"{label.format(case=case)} {_fmt(value(run), digits)}" for label, value, digits in METRICS[kind(case)]
        )
        log(f"{case} N={nodes} {code} repeat {repeat + 1}: {shown} ({time.monotonic() - began:.0f} s)")


def kind(case: str) -> str:
    """The key of ``METRICS`` for ``case``."""
    return case.split(",")[0]


def _fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


@contextmanager
def operator_of(bench: Bench, run: Run, code: str, env: dict[str, str], workdir: Path) -> Iterator[bool]:
    """The operator of release ``code`` running (True), or False (recorded) where it would not start."""
    try:
        operator = start_operator(bench, workdir, env)
    except Exception as exc:  # noqa: BLE001 - recorded; that release's cases of this repeat fail with it
        run.report.setdefault("operator_failed", []).append({"code": code, "error": f"{type(exc).__name__}: {exc}"})
        log(f"the operator of the {code} did not start: {exc}")
        yield False
        return
    try:
        yield True
    finally:
        operator.terminate()
        operator.wait(30)


def a_round(bench: Bench, running: bool, nodes: int, hold: float, limit: float, env: dict[str, str]) -> dict[str, Any]:
    """One round of ``nodes`` agents of the release ``env`` runs, held ``hold`` seconds, while its operator runs."""
    if not running:
        raise RuntimeError("the release's operator did not start (see operator_failed)")
    return bench.round("k8s", nodes, hold=hold, limit=limit, env=env)


def a_recovery(bench: Bench, mode: str, agents: int, env: dict[str, str]) -> dict[str, Any]:
    """One recovery (``benchmarks.run.recovery``'s ``mode``) of ``agents`` agents of the release ``env`` runs."""
    details: dict[str, Any] = {}
    seconds = recovery(bench, (mode,), agents, details, env=env)[mode]
    return {"seconds": seconds, "phases": details[mode]}


def measure_all(bench: Bench, args: argparse.Namespace, envs: dict[str, dict[str, str]], run: Run) -> None:
    """Every case, every repeat, both releases side by side."""
    held = [(nodes, 0.0) for nodes in args.sizes] + [(nodes, args.steady_seconds) for nodes in args.steady_sizes]
    for repeat in range(args.repeats):
        for code in order(repeat):
            log(f"repeat {repeat + 1}/{args.repeats}: rounds and steady state on the {code}")
            where = bench.workdir / f"operator-{code.split()[0]}-{repeat}"
            with operator_of(bench, run, code, envs[code], where) as running:
                for nodes, hold in held:
                    if hold:
                        log(f"steady state: {nodes} agents of the {code} holding for {hold:.0f} s")
                    how = partial(a_round, bench, running, nodes, hold, args.round_limit, envs[code])
                    run.measure("steady" if hold else "round", nodes, code, repeat, how)
    for repeat in range(args.recovery_repeats):
        for code in order(repeat):
            for case, mode in RECOVERIES:
                log(f"recovery {repeat + 1}/{args.recovery_repeats}: {case}, {args.recovery_agents} agents, {code}")
                how = partial(a_recovery, bench, mode, args.recovery_agents, envs[code])
                run.measure(case, args.recovery_agents, code, repeat, how)


def runs_of(report: dict[str, Any], case: str, nodes: int, code: str) -> list[dict[str, Any]]:
    return [r for r in report["runs"] if (r["case"], r["nodes"], r["code"]) == (case, nodes, code)]


def values(runs: list[dict[str, Any]], value: Callable[[dict[str, Any]], Any]) -> dict[int, float]:
    """Each repeat's value, by repeat (a failed repeat, or one without the value, has none)."""
    return {r["repeat"]: float(value(r)) for r in runs if "failed" not in r and value(r) is not None}


def ratio(this: dict[int, float], previous: dict[int, float]) -> float | None:
    """This release's median over the previous release's; None where either has none or the previous is 0."""
    if not this or not previous or statistics.median(previous.values()) == 0:
        return None
    return statistics.median(this.values()) / statistics.median(previous.values())


def rows(
    report: dict[str, Any], codes: tuple[str, ...] = CODES
) -> Iterator[tuple[str, int, int, list[dict[int, float]], list[str]]]:
    """The table's rows in the order the cases first ran: (label, N, the digits of a value, both sides' (``codes``:
    the releases, or the etcds) values by repeat, both sides' first failure or "")."""
    seen: list[tuple[str, int]] = []
    for r in report["runs"]:
        if (r["case"], r["nodes"]) not in seen:
            seen.append((r["case"], r["nodes"]))
    for case, nodes in seen:
        for label, value, digits in METRICS[kind(case)]:
            runs = [runs_of(report, case, nodes, code) for code in codes]
            failures = [next((r["failed"] for r in each if "failed" in r), "") for each in runs]
            yield label.format(case=case), nodes, digits, [values(each, value) for each in runs], failures


def write_report(report: dict[str, Any], out: Path | None = None) -> None:
    """The section of ``benchmarks.md`` and ``nothing-slower.png``, in docs/ or under ``out``."""
    where = out or DOCS
    page = page_under(where)
    lines = [
        "## Nothing is slower: this release beside the previous one (issue #26)",
        "",
        f"{stamp(report)} with `{invocation('nothing_slower', report)}`: one control plane, every case on this "
        f"release and on the previous release ({report['previous']}, its library and its operator), side by side "
        "in every repeat (which goes first alternates). Rounds and the steady state run with the release's "
        f"operator; recovery is SIGKILL of one of {report['recovery_agents']} agents to the survivors training "
        "again. Agents' CPU: user + system time of the 8 agent processes over the steady window, in cores.",
        "",
        "How to read it: *ratio* is this release's median over the previous release's, in the same run. Below "
        "1.00x this release is faster or cheaper; above 1.00x it is slower or costs more. Lease writes/s follow "
        "the keep-alive (N/5 a second), so there a ratio near 1 is the expected result.",
        "",
        "| case | N | this release, every repeat | previous release, every repeat | ratio of medians |",
        "|---|---|---|---|---|",
    ]
    for label, nodes, digits, (this, previous), failures in rows(report):
        cells = [
            ", ".join([*(f"{v:.{digits}f}" for v in each.values()), *([f"failed: {failed[:100]}"] if failed else [])])
            or "not reported"  # the release's runs do not give this value (its handler keeps no counters)
            for each, failed in zip((this, previous), failures, strict=True)
        ]
        found = ratio(this, previous)
        shown = "-" if found is None else f"{found:.2f}x"
        if found is None and this and previous:  # the previous release's median is 0
            shown = "= (both 0)" if statistics.median(this.values()) == 0 else "n/a (previous 0)"
        lines.append(f"| {label} | {nodes} | {cells[0]} | {cells[1]} | {shown} |")
    for failure in report.get("operator_failed", []):
        lines.append(f"\nThe operator of the {failure['code']} did not start: `{failure['error'][:200]}`")
    lines += ["", "![nothing slower](nothing-slower.png)"]
    splice(page, "\n".join(lines), BEGIN, END, at_end=True)
    plot(report, where / "nothing-slower.png")


def plot(report: dict[str, Any], path: Path) -> None:
    """Per row, every repeat's ratio (this over previous, the same repeat) and the ratio of medians."""
    from matplotlib import ticker

    table = [row for row in rows(report) if ratio(row[3][0], row[3][1]) is not None]
    made, axis = figure(9, 0.45 * len(table) + 1.6)
    for index, (_, _, _, (this, previous), _) in enumerate(table):
        paired = [this[repeat] / previous[repeat] for repeat in this if previous.get(repeat)]
        axis.scatter(paired, [index] * len(paired), color="tab:gray", s=14)
        median = ratio(this, previous) or 0.0
        axis.scatter([median], [index], color="tab:green" if median <= 1 else "tab:red", marker="D", s=36)
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_xscale("log", base=2)
    axis.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}x"))
    axis.xaxis.set_minor_formatter(ticker.NullFormatter())
    axis.set_yticks(range(len(table)), [f"{label}, N={nodes}" for label, nodes, *_ in table], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("this release / previous release (dot: a repeat; diamond: ratio of medians)")
    axis.set_title(f"Nothing is slower: this release / {report['previous']} (left of 1x: faster or cheaper)")
    save_figure(made, path)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[8, 128, 1024], help="rounds of N agents")
    parser.add_argument("--steady-sizes", type=int, nargs="*", default=[1024], help="steady state of N agents")
    parser.add_argument("--steady-seconds", type=float, default=60.0, help="holding (10 s settle and 5 s not counted)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every case, on each release")
    parser.add_argument("--recovery-repeats", type=int, help="repeats of every recovery case (default: --repeats)")
    parser.add_argument("--recovery-agents", type=int, default=32, help="agents of the recovery job")
    parser.add_argument("--previous", default="f3c6c78", help="the previous release: the last that landed")
    parser.add_argument("--round-limit", type=float, default=300.0, help="seconds before a round counts as failed")
    parser.add_argument("--out", type=Path, help="write the JSON, the page and the plot under this folder")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and plot from the JSON")
    quick_mode(parser, argv, **QUICK)
    args = parser.parse_args(argv)
    if args.recovery_repeats is None:
        args.recovery_repeats = args.repeats
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    out = (args.out or RESULTS) / "nothing_slower.json"
    if args.report:
        write_report(json.loads(out.read_text()), args.out)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-nothing-slower-"))
    previous = checkout(args.previous, workdir)
    envs = {"this release": {}, "previous release": release_env(previous)}
    releases = {code: which_code(env) for code, env in envs.items()}
    if any(not path.startswith(str(previous)) for path in releases["previous release"].values()):
        raise SystemExit(f"the previous release does not run from {previous}: {releases['previous release']}")
    log(f"previous release {args.previous} in {previous}; starting the control plane in {workdir}")
    report = new_report(
        argv=argv,
        previous=args.previous,
        releases=releases,
        repeats=args.repeats,
        recovery_agents=args.recovery_agents,
        runs=[],
    )
    began = time.monotonic()
    bench = Bench(workdir)
    try:
        measure_all(bench, args, envs, Run(report, out))
    finally:
        bench.stop()
    report["minutes"] = (time.monotonic() - began) / 60
    save_report(out, report)
    write_report(report, args.out)
    log(f"done in {report['minutes']:.1f} min: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
