"""A member pod deleted, with and without a hot spare, on three real nodes (``python -m benchmarks.spare_pods``).

One control plane with three real nodes (``tests.testenv.cluster``). Each case, in a fresh namespace, runs the
example Job's 3 pods one per node (``tests.e2e.placement.spare_objects``) and deletes the member pod of rank 0
once the round trains (``kubectl delete pod``: the agent gets SIGTERM and leaves):

- **one spare**: ``--nnodes=1:2``, so a round takes 2 pods and the third waits as a spare; the round is back to
  its full size (2) when the spare is promoted;
- **no spare** (the baseline): ``--nnodes=1:3``; the round is back to its full size (3) only when the Job's
  replacement pod has started and joined.

Each with stock torchrun and the operator, and with tensorplay's launcher without the operator. Seconds from the
deletion to the round at full size, to its members training in it, and to the replacement pod's container start.
Writes ``benchmarks/results/spare_pods.json``, ``docs/spare-pods.png`` and a section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.multi_node import Nodes, three_nodes
from benchmarks.runner import Benchmark, case_plot, main, ratios_to, shown, table_head, values
from tests.e2e.multi_node import local_operator
from tests.e2e.placement import SpareRecovery, racks, spare_recovery
from tests.testenv.cluster import Cluster

#: Each case: (spares, launcher, operator), and its baseline.
CASES: dict[str, tuple[int, str, bool]] = {
    "one spare, torchrun, operator": (1, "torch/indexed-job.yaml", True),
    "no spare, torchrun, operator": (0, "torch/indexed-job.yaml", True),
    "one spare, tensorplay, no operator": (1, "training-job.yaml", False),
    "no spare, tensorplay, no operator": (0, "training-job.yaml", False),
}
BASELINES = {
    "one spare, torchrun, operator": "no spare, torchrun, operator",
    "one spare, tensorplay, no operator": "no spare, tensorplay, no operator",
}
KEYS = ("formed", "training", "replacement_running")
TITLE = "A member pod deleted, with and without a hot spare (three real nodes)"
IMAGE, LABELS = "a member pod deleted, with and without a spare", list(CASES)


def run_case(cluster: Cluster, case: str, namespace: str, workdir: Path) -> SpareRecovery:
    spares, launcher, operator = CASES[case]
    with racks(cluster), ExitStack() as stack:
        if operator:
            stack.enter_context(local_operator(cluster, namespace, workdir / f"operator-{namespace}.log"))
        return spare_recovery(cluster, namespace, spares, launcher)


def measure(nodes: Nodes, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    with nodes.namespace("spare") as namespace:
        recovery = asdict(run_case(nodes.cluster, case["case"], namespace, nodes.workdir))
    recovery.pop("details", None)
    return recovery


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per case: every repeat's seconds for each of ``KEYS``, and the median ratio of ``training`` to the baseline's."""
    table: dict[str, Any] = {case: {key: values(report["runs"], key, case=case) for key in KEYS} for case in CASES}
    for case, measured in ratios_to(report["runs"], "training", BASELINES).items():
        table[case]["ratio"] = measured
    return table


NOTES = """
How to read it. With a spare the round is whole again before the replacement pod has even started: the operator's
fold that removes the deleted member takes the spare in the same write (torchrun, operator); without the operator
the survivors restart on the lost member and the spare, moved to the wait list, joins their next round, which
completes at once at max nodes (tensorplay). Without a spare the round is whole only when the Job controller's
replacement pod has started and its agent joined.
"""


INTRO = """
{stamp}, {repeats} repeats (`python -m benchmarks.spare_pods`): the example Job's 3 pods one per node, the member of
rank 0 deleted (`kubectl delete pod`). *One spare*: `--nnodes=1:2`, full size 2, the third pod a spare. *No spare*:
`--nnodes=1:3`, full size 3. Seconds from the deletion, every repeat; the ratio compares the medians of *members
training at full size* with the no-spare case of the same run.
"""


def section(report: dict[str, Any]) -> list[str]:
    table = summary(report)
    lines = table_head(
        "case", "round at full size", "members training at full size", "replacement pod started", "ratio"
    )
    for case in CASES:
        row = table[case]
        text = f"{row['ratio']:.2f}x of {BASELINES[case]}" if "ratio" in row else ""
        cells = " | ".join(shown(row[key]) for key in KEYS)
        lines.append(f"| {case} | {cells} | {text} |")
    return lines


def plot(report: dict[str, Any]) -> Any:
    markers = {
        "formed": ("o", "tab:blue", "round at full size"),
        "training": ("s", "tab:orange", "members training at full size"),
        "replacement_running": ("x", "tab:grey", "replacement pod started"),
    }
    title = "A member pod deleted, with and without a spare"
    return case_plot(report, list(CASES), markers, "seconds from the deletion", title, "lower right")


BENCHMARK = Benchmark.of(
    globals(),
    setup=three_nodes,
    repeats=5,
    quick={"cases": ["one spare, tensorplay, no operator"]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
