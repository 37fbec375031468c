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
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.report import new_report, save_report, splice
from benchmarks.run import RESULTS, log
from tests.e2e.multi_node import local_operator, three_node_cluster
from tests.e2e.placement import SpareRecovery, racks, spare_recovery
from tests.e2e.real_pods import REPO
from tests.testenv.cluster import Cluster

DOCS = REPO / "docs"
BEGIN, END = "<!-- spare-pods:begin (python -m benchmarks.spare_pods) -->", "<!-- spare-pods:end -->"
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


def run_case(cluster: Cluster, case: str, namespace: str, workdir: Path) -> SpareRecovery:
    spares, launcher, operator = CASES[case]
    with racks(cluster), ExitStack() as stack:
        if operator:
            stack.enter_context(local_operator(cluster, namespace, workdir / f"operator-{namespace}.log"))
        return spare_recovery(cluster, namespace, spares, launcher)


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per case: every repeat's seconds for each of ``KEYS``, and the median ratio of ``training`` to the baseline's."""
    found: dict[str, Any] = {}
    for case in CASES:
        runs = [run for run in report["runs"] if run["case"] == case]
        found[case] = {key: [run.get(key) for run in runs] for key in KEYS}
    for case, baseline in BASELINES.items():
        mine = [value for value in found[case]["training"] if value is not None]
        base = [value for value in found[baseline]["training"] if value is not None]
        if mine and base:
            found[case]["ratio"] = round(statistics.median(mine) / statistics.median(base), 2)
    return found


def write_report(report: dict[str, Any]) -> None:
    table = summary(report)

    def shown(values: list[float | None]) -> str:
        return ", ".join("none" if value is None else f"{value:.1f}" for value in values)

    lines = [
        "## A member pod deleted, with and without a hot spare (three real nodes)",
        "",
        f"Measured {report['date']} on {report['machine']}, {report['repeats']} repeats "
        "(`python -m benchmarks.spare_pods`): the example Job's 3 pods one per node, the member of rank 0 deleted "
        "(`kubectl delete pod`). *One spare*: `--nnodes=1:2`, full size 2, the third pod a spare. *No spare*: "
        "`--nnodes=1:3`, full size 3. Seconds from the deletion, every repeat; the ratio compares the medians of "
        "*members training at full size* with the no-spare case of the same run.",
        "",
        "| case | round at full size | members training at full size | replacement pod started | ratio |",
        "|---|---|---|---|---|",
    ]
    for case in CASES:
        row = table[case]
        ratio = f"{row['ratio']:.2f}x of {BASELINES[case]}" if "ratio" in row else ""
        lines.append(
            f"| {case} | {shown(row['formed'])} | {shown(row['training'])} | {shown(row['replacement_running'])} "
            f"| {ratio} |"
        )
    lines += [
        "",
        "How to read it. With a spare the round is whole again before the replacement pod has even started: the "
        "operator's fold that removes the deleted member takes the spare in the same write (torchrun, operator); "
        "without the operator the survivors restart on the lost member and the spare, moved to the wait list, "
        "joins their next round, which completes at once at max nodes (tensorplay). Without a spare the round is "
        "whole only when the Job controller's replacement pod has started and its agent joined.",
        "",
        "![a member pod deleted, with and without a spare](spare-pods.png)",
    ]
    splice(DOCS / "benchmarks.md", "\n".join(lines), BEGIN, END, at_end=True)
    plot(report)


def plot(report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 3.2))
    markers = {
        "formed": ("o", "tab:blue", "round at full size"),
        "training": ("s", "tab:orange", "members training at full size"),
        "replacement_running": ("x", "tab:grey", "replacement pod started"),
    }
    for index, case in enumerate(CASES):
        for key, (marker, color, label) in markers.items():
            xs = [run.get(key) for run in report["runs"] if run["case"] == case and run.get(key) is not None]
            axis.scatter(xs, [index] * len(xs), marker=marker, s=28, color=color, label=label if index == 0 else None)
    axis.set_yticks(range(len(CASES)), list(CASES), fontsize=8)
    axis.set_xlabel("seconds from the deletion")
    axis.legend(fontsize=7, loc="lower right")
    axis.set_title(f"A member pod deleted, with and without a spare ({report['date']})", fontsize=9)
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(DOCS / "spare-pods.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each case (default 5)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES), help="which cases")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and plot from the JSON")
    args = parser.parse_args()
    out = RESULTS / "spare_pods.json"
    if args.report:
        write_report(json.loads(out.read_text()))
        return 0
    report = new_report(repeats=args.repeats, runs=[])
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-spare-pods-"))
    log(f"starting a control plane and three real nodes in {workdir}")
    with three_node_cluster(workdir) as cluster:
        plane = cluster.plane
        core = client.CoreV1Api(config.new_client_from_config(str(plane.admin_kubeconfig)))
        count = 0
        for repeat in range(args.repeats):
            for case in args.cases:  # interleaved: a slow minute of the machine hits every case alike
                count += 1
                namespace = f"spare-{count}"
                core.create_namespace({"metadata": {"name": namespace}})
                log(f"repeat {repeat + 1}/{args.repeats}: {case}")
                started = time.monotonic()
                try:
                    run: dict[str, Any] = {"case": case, **asdict(run_case(cluster, case, namespace, workdir))}
                except TimeoutError as exc:
                    run = {"case": case, "error": str(exc)[:300]}
                finally:
                    core.delete_namespace(namespace, grace_period_seconds=0)
                run["seconds"] = round(time.monotonic() - started, 1)
                run.pop("details", None)
                log(f"  {json.dumps(run)}")
                report["runs"].append(run)
                save_report(out, report)
    write_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
