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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.run import Bench, checkout, control_plane
from benchmarks.runner import AT_SCALE, Benchmark, arguments, figure, log, main, stamp

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


@contextmanager
def both_releases(workdir: Path, args: argparse.Namespace) -> Iterator[tuple[Bench, Path]]:
    previous = checkout(args.previous, workdir)
    log(f"previous release {args.previous} in {previous}")
    with control_plane(workdir) as bench:
        yield bench, previous


def measure(context: tuple[Bench, Path], case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    """One round of the variant and its rank assignment; ``ratio``: train over round."""
    bench, previous = context
    _, backend, assign, code = next(variant for variant in VARIANTS if variant[0] == case["label"])
    env = {"PYTHONPATH": f"{previous / 'backend'}"} if code == "previous release" else None
    run = bench.round(backend, case["nodes"], limit=args.limit, assign_ranks=assign, env=env)
    run["ratio"] = run["train_seconds"] / run["seconds"]
    return run


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    variants = [v for v in VARIANTS if not args.only or any(part in v[0] for part in args.only)]
    return [{"label": v[0], "nodes": nodes} for nodes in args.sizes for v in variants]


def merge(kept: dict[str, Any] | None, report: dict[str, Any], args: argparse.Namespace) -> None:
    """``--keep``: the JSON's runs of the sizes and variants not run this time."""
    if not args.keep or kept is None:
        return
    rerun = {(case["nodes"], case["label"]) for case in cases(args)}
    report["runs"] = [r for r in kept["runs"] if (r["nodes"], r["label"]) not in rerun]
    report["sizes"] = sorted(set(kept["sizes"]) | set(args.sizes))
    report["repeats"] = "per run"


TITLE, IMAGE = "Time to train (issue #28)", "time to train"


def section(report: dict[str, Any]) -> list[str]:
    rows = [
        f"{stamp(report)} with `python -m benchmarks.time_to_train "
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

    return rows


def plot(report: dict[str, Any]) -> Any:
    sizes = report["sizes"]
    made, axes = figure(4.2 * len(sizes), 4.2, columns=len(sizes))
    for axis, nodes in zip(axes, sizes, strict=True):
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
        axis.set_yticks(range(len(labels)), labels if axis is axes[0] else [""] * len(labels), fontsize=7)
        axis.set_title(f"N={nodes}")
        axis.set_xlabel("seconds (|: round, o: ranks held; x: failed)")
    made.suptitle("Time to train: every repeat")
    return made


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="*", help="run only the variants whose label contains one of these")


BENCHMARK = Benchmark.of(
    globals(),
    setup=both_releases,
    sizes=[8, 128, 1024],
    previous="dc5d934",
    limit=180.0,
    fields=arguments("sizes", "repeats", "previous"),
    **{**AT_SCALE, "errors": (RuntimeError, AssertionError)},
    case_major=True,
    quick={"sizes": [8], "only": ["tensorplay, store"]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
