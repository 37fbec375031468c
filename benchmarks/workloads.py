"""The examples on JobSet, Kubeflow Trainer and Kueue, every fault timed (``python -m benchmarks.workloads``).

One control plane with three real nodes, JobSet v0.12.0, Trainer v2.3.0 and Kueue v0.19.2 built from source and
running (``tests.testenv.workloads``), and the operator installed from the chart (``tests.e2e.workloads``). Each
repeat runs, in namespace ``team-a``, one case after the other (stock torchrun, 4 pods, except Kueue's 3):

- **Indexed Job, evicted** (the baseline): ``examples/torch/indexed-job.yaml`` with 4 pods, no controller above
  the Job; the pod of rank 0 evicted through the Eviction API;
- **JobSet, evicted**: ``examples/torch/jobset.yaml``, the same eviction;
- **JobSet, kubectl delete pod**: the same example, a pod deleted (the Job counts it as a failure);
- **TrainJob, evicted**: ``examples/torch/trainjob.yaml``, the same eviction;
- **Kueue, preempted**: ``examples/training-job.yaml`` queued by Kueue (tensorplay's launcher, 3 pods), preempted
  by a Job of higher priority, re-admitted once that Job is deleted.

Seconds from the fault: the survivors training again, and the replacement training with them (for Kueue: the Job
suspended, re-admitted, its new pods training, the Job complete). The ratio compares each eviction's medians with
the Indexed Job's of the same run. Writes ``benchmarks/results/workloads.json``, ``docs/workloads.png`` and the
table of ``docs/workloads.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from benchmarks.report import new_report, save_report, splice
from benchmarks.run import RESULTS, log
from tests.e2e.multi_node import three_node_cluster
from tests.e2e.real_pods import RENDEZVOUS, REPO
from tests.e2e.workloads import (
    JOB_NAME_LABEL,
    JOBSET_NAME_LABEL,
    NAMESPACE,
    clear_namespace,
    indexed_job_objects,
    install_operator_from_chart,
    jobset_objects,
    lose_a_pod_and_recover,
    preempt_and_readmit,
    queue_objects,
    queued_job_objects,
    rank_zero_pod,
    start_training,
    trainjob_objects,
)
from tests.testenv.cluster import Cluster
from tests.testenv.workloads import WorkloadControllers

DOCS = REPO / "docs"
BEGIN, END = "<!-- workloads:begin (python -m benchmarks.workloads) -->", "<!-- workloads:end -->"
BASELINE = "Indexed Job, evicted"
#: Each eviction or deletion case: its objects, the selector of its pods, how the pod goes.
POD_CASES: dict[str, tuple[Callable[[], list[dict[str, Any]]], str, str]] = {
    BASELINE: (indexed_job_objects, f"{JOB_NAME_LABEL}={RENDEZVOUS}", "evict"),
    "JobSet, evicted": (jobset_objects, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", "evict"),
    "JobSet, kubectl delete pod": (jobset_objects, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", "delete"),
    "TrainJob, evicted": (trainjob_objects, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", "evict"),
}
KUEUE = "Kueue, preempted"
CASES = [*POD_CASES, KUEUE]
POD_KEYS = ("survivors_training", "replacement_training")
KUEUE_KEYS = ("suspended", "readmitted", "training_again", "completed")


def apply(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    cluster.plane.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump_all(objects))


def run_case(cluster: Cluster, case: str) -> dict[str, Any]:
    objects = client.CustomObjectsApi(config.new_client_from_config(str(cluster.plane.admin_kubeconfig)))
    if case == KUEUE:
        cluster.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(queue_objects(NAMESPACE)))
        apply(cluster, queued_job_objects(STEPS="40", STEP_SECONDS="0.25"))
        started = start_training(cluster, NAMESPACE, f"{JOB_NAME_LABEL}={RENDEZVOUS}", 3)
        found = preempt_and_readmit(cluster, NAMESPACE, started)
        return {key: getattr(found, key) for key in KUEUE_KEYS}
    make, selector, how = POD_CASES[case]
    apply(cluster, make())
    started = start_training(cluster, NAMESPACE, selector, 4)
    pods = sorted(started.pods)
    rank0 = rank_zero_pod(objects, NAMESPACE, started.pods)
    victim = rank0 if how == "evict" else next(pod for pod in pods if pod != rank0)
    recovery = lose_a_pod_and_recover(cluster, NAMESPACE, selector, started, victim, how)
    return {key: getattr(recovery, key) for key in POD_KEYS}


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per case: every repeat's seconds for each key, and the median ratios to the baseline's."""
    found: dict[str, Any] = {}
    for case in CASES:
        runs = [run for run in report["runs"] if run["case"] == case]
        keys = KUEUE_KEYS if case == KUEUE else POD_KEYS
        found[case] = {key: [run.get(key) for run in runs] for key in keys}
    for case in POD_CASES:
        for key in POD_KEYS:
            mine = [value for value in found[case][key] if value is not None]
            base = [value for value in found[BASELINE][key] if value is not None]
            if mine and base:
                found[case][f"{key}_ratio"] = round(statistics.median(mine) / statistics.median(base), 2)
    return found


def shown(values: list[float | None]) -> str:
    return ", ".join("none" if value is None else f"{value:.1f}" for value in values)


def write_report(report: dict[str, Any]) -> None:
    table = summary(report)
    lines = [
        f"Measured {report['date']} on {report['machine']}, {report['repeats']} repeats "
        "(`python -m benchmarks.workloads`): three real nodes, the controllers built from source, the operator from "
        "the chart. Seconds from the fault, every repeat; the ratios compare medians with the Indexed Job's of the "
        "same run.",
        "",
        "| case | the others training again | the replacement training with them | ratio (others, replacement) |",
        "|---|---|---|---|",
    ]
    for case in POD_CASES:
        row = table[case]
        ratio = (
            ""
            if case == BASELINE
            else f"{row.get('survivors_training_ratio', 'n/a')}x, {row.get('replacement_training_ratio', 'n/a')}x"
        )
        lines.append(
            f"| {case} | {shown(row['survivors_training'])} | {shown(row['replacement_training'])} | {ratio} |"
        )
    row = table[KUEUE]
    lines += [
        "",
        "| case | Job suspended | re-admitted | new pods training | Job complete |",
        "|---|---|---|---|---|",
        f"| {KUEUE} (from the preemptor's creation; the preemptor deleted once the pods are gone) | "
        f"{shown(row['suspended'])} | {shown(row['readmitted'])} | {shown(row['training_again'])} "
        f"| {shown(row['completed'])} |",
        "",
        "![the examples' faults on JobSet, Trainer and Kueue](workloads.png)",
    ]
    splice(DOCS / "workloads.md", "\n".join(lines), BEGIN, END)
    plot(report)


def plot(report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 3.2))
    markers = {
        "survivors_training": ("o", "tab:blue", "the others training again"),
        "replacement_training": ("s", "tab:orange", "the replacement training (Kueue: the new pods)"),
        "training_again": ("s", "tab:orange", None),
        "completed": ("x", "tab:grey", "Kueue: the Job complete"),
    }
    for index, case in enumerate(CASES):
        for key, (marker, color, label) in markers.items():
            xs = [run.get(key) for run in report["runs"] if run["case"] == case and run.get(key) is not None]
            axis.scatter(xs, [index] * len(xs), marker=marker, s=28, color=color, label=label if xs else None)
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    axis.legend(unique.values(), unique.keys(), fontsize=7, loc="center")  # the empty middle: 6 to 14 s
    axis.set_yticks(range(len(CASES)), CASES, fontsize=8)
    axis.set_xlabel("seconds from the fault")
    axis.set_title(f"The examples on JobSet, Trainer and Kueue ({report['date']})", fontsize=9)
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(DOCS / "workloads.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each case (default 3)")
    parser.add_argument("--cases", nargs="*", default=CASES, choices=CASES, help="which cases")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and plot from the JSON")
    args = parser.parse_args()
    out = RESULTS / "workloads.json"
    if args.report:
        write_report(json.loads(out.read_text()))
        return 0
    report = new_report(repeats=args.repeats, runs=[])
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-workloads-"))
    log(f"starting a control plane, three real nodes, JobSet, Trainer, Kueue and the operator in {workdir}")
    with three_node_cluster(workdir, crds=False) as cluster:  # the chart installs them
        controllers = WorkloadControllers(cluster)
        try:
            controllers.start()
            install_operator_from_chart(cluster, workdir / "helm-home")
            for repeat in range(args.repeats):
                for case in args.cases:  # interleaved: a slow minute of the machine hits every case alike
                    log(f"repeat {repeat + 1}/{args.repeats}: {case}")
                    started = time.monotonic()
                    try:
                        run: dict[str, Any] = {"case": case, **run_case(cluster, case)}
                    except TimeoutError as exc:
                        run = {"case": case, "error": str(exc)[:300]}
                    finally:
                        clear_namespace(cluster)
                    run["seconds"] = round(time.monotonic() - started, 1)
                    log(f"  {json.dumps(run)}")
                    report["runs"].append(run)
                    save_report(out, report)
        finally:
            controllers.stop()
    write_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
