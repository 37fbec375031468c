"""Time to train (issue #28): from every agent calling ``next_rendezvous`` to every agent holding its
workers' ranks (``python -m benchmarks.time_to_train``).

One round of N agents (min = max = N, threads in 8 processes, no operator: an agent folds), then
each agent runs its framework's own ``SimpleElasticAgent._assign_worker_ranks`` on the store the
round returned, 2 workers per agent, as the launcher does before it starts workers
(``round_worker.assign_ranks``). Every worker must get its own global rank of one world.

Variants, each at every N, every repeat reported:

- ``tensorplay``/``torch`` x ``store``/``identical``: this release, the store path (tensorplay's agent
  sets every agent's ranks one by one; torch's calls ``multi_get``/``multi_set``) and the
  frameworks' fast path for identical pods (``TORCH_ELASTIC_WORKER_IDENTICAL=1``, no store);
- ``... previous release``: the store path on the previous release (``--previous``, checked out
  from git and put first on the agents' ``PYTHONPATH``), the baseline in the same run;
- ``p10d``/``c10d``: the frameworks' own TCPStore rendezvous, store path.

Columns: the round alone (``next_rendezvous``, bootstrap address included), the slowest rank
assignment, and time to train, plus its ratio to the round of the same repeat. Writes
``benchmarks/results/time_to_train.json``, a table in ``docs/benchmarks.md`` (between the markers)
and ``docs/time-to-train.png``.

Recovery (a pod deleted, an agent frozen) at N=128 and N=1024: ``benchmarks.recovery_at_scale``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.report import new_report, save_report, splice
from benchmarks.run import RESULTS, Bench, checkout, log

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
BEGIN, END = "<!-- time-to-train:begin (python -m benchmarks.time_to_train) -->", "<!-- time-to-train:end -->"
#: (label, backend, rank assignment, code)
VARIANTS = (
    ("tensorplay, store", "k8s", "store", "this release"),
    ("tensorplay, identical", "k8s", "identical", "this release"),
    ("torch, store", "torch-k8s", "store", "this release"),
    ("torch, identical", "torch-k8s", "identical", "this release"),
    ("tensorplay, store, previous release", "k8s", "store", "previous release"),
    ("torch, store, previous release", "torch-k8s", "store", "previous release"),
    ("tensorplay p10d, store", "p10d", "store", "this release"),
    ("torch c10d, store", "torch-c10d", "store", "this release"),
)


def run_variant(
    bench: Bench, variant: tuple[str, str, str, str], nodes: int, repeats: int, limit: float, previous: Path
) -> list[dict[str, Any]]:
    label, backend, assign, code = variant
    env = {"PYTHONPATH": f"{previous / 'backend'}"} if code == "previous release" else None
    runs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        try:
            run = bench.round(backend, nodes, limit=limit, assign_ranks=assign, env=env)
            run["ratio"] = run["train_seconds"] / run["seconds"]
            log(
                f"{label} N={nodes} repeat {repeat + 1}/{repeats}: round {run['seconds']:.2f} s, "
                f"ranks {run['assign_seconds']:.2f} s, train {run['train_seconds']:.2f} s"
            )
        except (RuntimeError, AssertionError) as exc:
            log(f"{label} N={nodes} repeat {repeat + 1}/{repeats}: FAILED {exc}")
            run = {"failed": str(exc)[:300]}
        runs.append({"label": label, "nodes": nodes, **run})
        if "failed" in run:
            break  # a round that did not form within the limit is the result; repeating only costs time
    return runs


def write_report(report: dict[str, Any]) -> None:
    rows = [
        "## Time to train (issue #28)",
        "",
        f"Measured {report['date']} on {report['machine']} with `python -m benchmarks.time_to_train "
        + (
            f"--sizes {' '.join(map(str, report['sizes']))} --repeats {report['repeats']}`"
            if report["repeats"] != "per run"
            else "` several times, merged with `--keep` (each invocation its own control plane)"
        )
        + ": one control plane per invocation, no "
        "operator, N agents as threads in 8 processes, 2 workers per agent. *round*: `next_rendezvous` in "
        "every agent (the bootstrap address included); *ranks*: the slowest agent's "
        "`_assign_worker_ranks` on the round's store; *train*: until every agent held its ranks; "
        "*ratio*: train / round of the same repeat. Every repeat, in order.",
        "",
        "| N | variant | round (s) | ranks (s) | train (s) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for nodes in report["sizes"]:
        for label, *_ in VARIANTS:
            runs = [r for r in report["runs"] if r["nodes"] == nodes and r["label"] == label]
            if not runs:
                continue
            done = [r for r in runs if "failed" not in r]
            failed = [r for r in runs if "failed" in r]
            cells = [
                ", ".join(f"{r[key]:.2f}" for r in done) or "-"
                for key in ("seconds", "assign_seconds", "train_seconds", "ratio")
            ]
            if failed:
                cells[2] = (cells[2] + ", " if done else "") + f"failed: {failed[0]['failed'][:80]}"
            rows.append(f"| {nodes} | {label} | " + " | ".join(cells) + " |")
    rows += ["", "![time to train](time-to-train.png)"]
    page = DOCS / "benchmarks.md"
    splice(page, "\n".join(rows), BEGIN, END, at_end=True)
    plot(report)


def plot(report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    figure, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 4.2), squeeze=False)
    for axis, nodes in zip(axes[0], sizes, strict=True):
        labels = []
        for index, (label, *_) in enumerate(VARIANTS):
            runs = [r for r in report["runs"] if r["nodes"] == nodes and r["label"] == label]
            labels.append(label)
            for r in runs:
                if "failed" in r:
                    axis.scatter(0, index, color="black", marker="x")
                    continue
                axis.scatter(r["seconds"], index, color="tab:blue", marker="|", s=120)
                axis.scatter(r["train_seconds"], index, color="tab:green", marker="o", s=18)
        axis.set_yticks(range(len(labels)), labels if axis is axes[0][0] else [""] * len(labels), fontsize=7)
        axis.set_title(f"N={nodes}")
        axis.set_xlabel("seconds (|: round, o: ranks held; x: failed)")
    figure.suptitle("Time to train: every repeat")
    figure.tight_layout()
    figure.savefig(DOCS / "time-to-train.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 128, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--previous", default="dc5d934", help="the git commit of the previous release")
    parser.add_argument("--limit", type=float, default=180.0, help="seconds before a round counts as failed")
    parser.add_argument("--only", nargs="*", help="run only the variants whose label contains one of these")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and plot from the JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the JSON's runs of the sizes and variants not run this time"
    )
    args = parser.parse_args()
    out = RESULTS / "time_to_train.json"
    if args.report:
        write_report(json.loads(out.read_text()))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-time-to-train-"))
    previous = checkout(args.previous, workdir)
    log(f"previous release {args.previous} in {previous}; starting the control plane in {workdir}")
    bench = Bench(workdir)
    report = new_report(
        sizes=args.sizes,
        repeats=args.repeats,
        previous=args.previous,
        runs=[],
    )
    variants = [v for v in VARIANTS if not args.only or any(part in v[0] for part in args.only)]
    if args.keep and out.exists():
        rerun = {(nodes, v[0]) for nodes in args.sizes for v in variants}
        kept = json.loads(out.read_text())
        report["runs"] = [r for r in kept["runs"] if (r["nodes"], r["label"]) not in rerun]
        report["sizes"] = sorted(set(kept["sizes"]) | set(args.sizes))
        report["repeats"] = "per run"
    try:
        for nodes in args.sizes:
            for variant in variants:
                report["runs"] += run_variant(bench, variant, nodes, args.repeats, args.limit, previous)
                save_report(out, report)
    finally:
        bench.stop()
    write_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
