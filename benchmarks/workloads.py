"""The examples on JobSet, Kubeflow Trainer, Kueue and the training-operator, every fault timed
(``python -m benchmarks.workloads``).

One control plane with three real nodes, JobSet v0.12.0, Trainer v2.3.0, Kueue v0.19.2 and the training-operator
v1.8.1 built from source and
running (``tests.testenv.workloads``), and the operator installed from the chart (``tests.e2e.workloads``). Each
repeat runs, in namespace ``team-a``, one case after the other (stock torchrun, 4 pods, except Kueue's 3):

- **Indexed Job, evicted** (the baseline): ``examples/torch/indexed-job.yaml`` with 4 pods, no controller above
  the Job; the pod of rank 0 evicted through the Eviction API;
- **JobSet, evicted**: ``examples/torch/jobset.yaml``, the same eviction;
- **JobSet, kubectl delete pod**: the same example, a pod deleted (the Job counts it as a failure);
- **TrainJob, evicted**: ``examples/torch/trainjob.yaml``, the same eviction;
- **PyTorchJob, evicted**: ``examples/torch/pytorchjob.yaml`` on the Kubeflow training-operator v1.8.1, the same
  eviction (the operator recreates the pod under its name);
- **Kueue, preempted**: ``examples/training-job.yaml`` queued by Kueue (tensorplay's launcher, 3 pods), preempted
  by a Job of higher priority, re-admitted once that Job is deleted.

Seconds from the fault: the survivors training again, and the replacement training with them (for Kueue: the Job
suspended, re-admitted, its new pods training, the Job complete). The ratio compares each eviction's medians with
the Indexed Job's of the same run. Writes ``benchmarks/results/workloads.json``, ``docs/workloads.png`` and the
table of ``docs/workloads.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from benchmarks.runner import Benchmark, case_plot, main, ratios_to, shown, table_head, values
from tests.e2e.multi_node import three_node_cluster
from tests.e2e.real_pods import RENDEZVOUS
from tests.e2e.workloads import (
    JOB_NAME_LABEL,
    JOBSET_NAME_LABEL,
    NAMESPACE,
    PYTORCHJOB_NAME_LABEL,
    clear_namespace,
    indexed_job_objects,
    install_operator_from_chart,
    jobset_objects,
    lose_a_pod_and_recover,
    preempt_and_readmit,
    pytorchjob_objects,
    queue_objects,
    queued_job_objects,
    rank_zero_pod,
    start_training,
    trainjob_objects,
)
from tests.testenv.cluster import Cluster
from tests.testenv.workloads import WorkloadControllers

BASELINE = "Indexed Job, evicted"
#: Each eviction or deletion case: its objects, the selector of its pods, how the pod goes.
POD_CASES: dict[str, tuple[Callable[[], list[dict[str, Any]]], str, str]] = {
    BASELINE: (indexed_job_objects, f"{JOB_NAME_LABEL}={RENDEZVOUS}", "evict"),
    "JobSet, evicted": (jobset_objects, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", "evict"),
    "JobSet, kubectl delete pod": (jobset_objects, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", "delete"),
    "TrainJob, evicted": (trainjob_objects, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", "evict"),
    "PyTorchJob, evicted": (pytorchjob_objects, f"{PYTORCHJOB_NAME_LABEL}={RENDEZVOUS}", "evict"),
}
KUEUE = "Kueue, preempted"
CASES = [*POD_CASES, KUEUE]
POD_KEYS = ("survivors_training", "replacement_training")
KUEUE_KEYS = ("suspended", "readmitted", "training_again", "completed")
IMAGE, LABELS = "the examples' faults on JobSet, Trainer, Kueue and the training-operator", CASES


@contextmanager
def controllers(workdir: Path, args: argparse.Namespace) -> Iterator[Cluster]:
    """Three real nodes, JobSet, Trainer, Kueue and the operator from the chart (which installs the CRDs)."""
    with three_node_cluster(workdir, crds=False) as cluster:
        running = WorkloadControllers(cluster)
        try:
            running.start()
            install_operator_from_chart(cluster, workdir / "helm-home")
            yield cluster
        finally:
            running.stop()


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


def measure(cluster: Cluster, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    try:
        return run_case(cluster, case["case"])
    finally:
        clear_namespace(cluster)


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per case: every repeat's seconds for each key, and the median ratios to the baseline's."""
    runs = report["runs"]
    table: dict[str, Any] = {
        case: {key: values(runs, key, case=case) for key in (KUEUE_KEYS if case == KUEUE else POD_KEYS)}
        for case in CASES
    }
    for key in POD_KEYS:
        for case, measured in ratios_to(runs, key, dict.fromkeys(POD_CASES, BASELINE)).items():
            table[case][f"{key}_ratio"] = measured
    return table


INTRO = """
{stamp}, {repeats} repeats (`python -m benchmarks.workloads`): three real nodes, the controllers built from source,
the operator from the chart. Seconds from the fault, every repeat; the ratios compare medians with the Indexed Job's
of the same run.
"""


def section(report: dict[str, Any]) -> list[str]:
    table = summary(report)
    others, replacement = "the others training again", "the replacement training with them"
    lines = table_head("case", others, replacement, "ratio (others, replacement)")
    for case in POD_CASES:
        row = table[case]
        text = (
            ""
            if case == BASELINE
            else f"{row.get('survivors_training_ratio', 'n/a')}x, {row.get('replacement_training_ratio', 'n/a')}x"
        )
        lines.append(f"| {case} | " + " | ".join(shown(row[key]) for key in POD_KEYS) + f" | {text} |")
    row = table[KUEUE]
    lines += [
        "",
        "| case | Job suspended | re-admitted | new pods training | Job complete |",
        "|---|---|---|---|---|",
        f"| {KUEUE} (from the preemptor's creation; the preemptor deleted once the pods are gone) | "
        + " | ".join(shown(row[key]) for key in KUEUE_KEYS)
        + " |",
    ]
    return lines


def plot(report: dict[str, Any]) -> Any:
    markers = {
        "survivors_training": ("o", "tab:blue", "the others training again"),
        "replacement_training": ("s", "tab:orange", "the replacement training (Kueue: the new pods)"),
        "training_again": ("s", "tab:orange", None),
        "completed": ("x", "tab:grey", "Kueue: the Job complete"),
    }
    title = "The examples on JobSet, Trainer and Kueue"
    return case_plot(report, CASES, markers, "seconds from the fault", title, "center")  # center: 6 to 14 s is empty


BENCHMARK = Benchmark.of(
    globals(),
    setup=controllers,
    page="workloads.md",
    at_end=False,
    quick={"cases": [BASELINE]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
