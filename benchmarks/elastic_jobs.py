"""A running job resized under Kueue and restarted under JobSet, every step timed
(``python -m benchmarks.elastic_jobs``).

One control plane with three real nodes, JobSet v0.12.0 (``InPlaceRestart`` and ``RestartJob`` on), Trainer
v2.3.0 and Kueue v0.19.2 (workload slices on) built from source and running (``tests.testenv.workloads``), and the
operator installed from the chart. Each repeat runs, in namespace ``team-a``, one case after the other:

- **Job resized (no Kueue)** (the baseline): ``examples/training-job.yaml`` (tensorplay's launcher) with no
  queue, 3 pods training, patched to 4 (``completions`` and ``parallelism``), then back to 3;
- **Kueue elastic Job resized**: the same Job queued by Kueue and opted in to workload slices
  (``kueue.x-k8s.io/elastic-job``), in a ClusterQueue with quota for 4: the same two patches;
- **JobSet restart (recreated)**: ``examples/torch/jobset.yaml`` (stock torchrun, 4 pods), every pod deleted: the Job
  fails and JobSet recreates it;
- **JobSet restart (in place)**: ``examples/torch/jobset-in-place.yaml``, one pod's container SIGKILLed: every
  container restarts in place;
- **JobSet RestartJob**: ``examples/torch/jobset-restart-job.yaml`` (2 Jobs of 2), both pods of Job 1 deleted: that
  Job alone is recreated.

Seconds from the patch or the fault (``tests.e2e.elastic``, ``tests.e2e.restarts``). Writes
``benchmarks/results/elastic_jobs.json``, ``docs/elastic-jobs.png`` and the table of
``docs/workloads.md``.
"""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from benchmarks.runner import Benchmark, case_plot, main, shown, table_head, values
from benchmarks.workloads import apply, controllers
from tests.e2e.elastic import SELECTOR as JOB_SELECTOR
from tests.e2e.elastic import elastic_job_objects, elastic_queue_objects, scale_down, scale_up
from tests.e2e.restarts import SELECTOR as JOBSET_SELECTOR
from tests.e2e.restarts import (
    in_place_objects,
    restart_in_place,
    restart_job_objects,
    restart_one_job,
    restart_recreated,
)
from tests.e2e.workloads import NAMESPACE, clear_namespace, jobset_objects, start_training
from tests.testenv.cluster import Cluster

BARE, KUEUE = "Job resized (no Kueue)", "Kueue elastic Job resized"
RECREATED, IN_PLACE, RESTART_JOB = "JobSet restart (recreated)", "JobSet restart (in place)", "JobSet RestartJob"
RESIZES = (BARE, KUEUE)
RESTARTS = (RECREATED, IN_PLACE, RESTART_JOB)
CASES = [*RESIZES, *RESTARTS]
RESIZE_KEYS = ("up_admitted", "up_pods", "up_training", "down_admitted", "down_pods", "down_training")
RESTART_KEYS = ("others_training", "training")
IMAGE, LABELS = "a job resized under Kueue and restarted under JobSet", CASES


def resize_case(cluster: Cluster, kueue: bool) -> dict[str, Any]:
    """3 pods training, resized to 4, then to 3."""
    if kueue:
        cluster.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(elastic_queue_objects(NAMESPACE, 4)))
    apply(cluster, elastic_job_objects(3, kueue=kueue))
    started = start_training(cluster, NAMESPACE, JOB_SELECTOR, 3)
    up, four = scale_up(cluster, NAMESPACE, started, 4, kueue=kueue)
    down, _ = scale_down(cluster, NAMESPACE, four, 3, kueue=kueue)
    return {
        **{f"up_{key}": getattr(up, key) for key in ("admitted", "pods", "training")},
        **{f"down_{key}": getattr(down, key) for key in ("admitted", "pods", "training")},
    }


def restart_case(cluster: Cluster, case: str) -> dict[str, Any]:
    make = {RECREATED: jobset_objects, IN_PLACE: in_place_objects, RESTART_JOB: restart_job_objects}[case]
    apply(cluster, make())
    started = start_training(cluster, NAMESPACE, JOBSET_SELECTOR, 4)
    restart = {RECREATED: restart_recreated, IN_PLACE: restart_in_place, RESTART_JOB: restart_one_job}[case]
    found = restart(cluster, NAMESPACE, started)
    return {key: getattr(found, key) for key in RESTART_KEYS}


def measure(cluster: Cluster, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    try:
        if case["case"] in RESIZES:
            return resize_case(cluster, case["case"] == KUEUE)
        return restart_case(cluster, case["case"])
    finally:
        clear_namespace(cluster)


INTRO = """
{stamp}, {repeats} repeats (`python -m benchmarks.elastic_jobs`): three real nodes, the controllers built from
source, the operator from the chart. Seconds from the patch or the fault, every repeat, in order.
"""

NOTES = """
How to read it. Kueue adds nothing measurable to a resize of a running Job: it admits the new slice (up) or shrinks
the admitted one (down) within 0.3 s of the patch, and the elastic Job trains at its new size as soon as the bare Job
does (up: the new pod's agent joins and the running agents restart their workers once, about 3 s; down: the removed
pod's agent leaves on SIGTERM and the others re-form, 1-2 s). Here, with 4 pods whose image is already on every node,
JobSet's in-place restart is not faster than its recreating restart (about 10-13 s against 10-17 s): creating 4 pods
costs little on this cluster, while an in-place restart syncs twice through JobSet's status (the failed pod's agent
asks for the next attempt, JobSet outdates the others, their agents exit, every agent reports the new attempt, then
JobSet lifts the barrier). The two faults differ too: one container killed (in place) against every pod deleted
(recreated, which is how the JobSet's Job fails). Upstream's gain (a restart of 5,000 nodes from 2 min 10 s to 10 s)
comes from the scheduling, image pulls and pod starts at scale that this cluster does not have. `RestartJob` keeps
the other Job training: its pods train in a round of 2 within 3-5 s of the fault, and the recreated Job's pods join
them 8-10 s after it.
"""


def section(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    lines = table_head(
        "case", "up: admitted", "up: 4 pods Running", "up: 4 training", "down: admitted", "down: pod gone",
        "down: 3 training",
    )  # fmt: skip
    for case in RESIZES:
        lines.append(
            f"| {case} | " + " | ".join(shown(values(runs, key, case=case), none="-") for key in RESIZE_KEYS) + " |"
        )
    lines += ["", *table_head("case", "the others training on", "every pod training again")]
    for case in RESTARTS:
        lines.append(
            f"| {case} | " + " | ".join(shown(values(runs, key, case=case), none="-") for key in RESTART_KEYS) + " |"
        )
    return lines


def plot(report: dict[str, Any]) -> Any:
    markers = {
        "up_training": ("^", "tab:blue", "resized up: every pod training with 4"),
        "down_training": ("v", "tab:green", "resized down: the 3 training with 3"),
        "others_training": ("o", "tab:grey", "RestartJob: the other Job training on"),
        "training": ("s", "tab:orange", "restarted: every pod training again"),
    }
    title = "A job resized under Kueue and restarted under JobSet"
    return case_plot(report, CASES, markers, "seconds from the patch or the fault", title, "best")


BENCHMARK = Benchmark.of(
    globals(),
    setup=controllers,
    page="workloads.md",
    at_end=False,
    quick={"cases": [BARE]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
