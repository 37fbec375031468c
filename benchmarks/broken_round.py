"""A round that loses a member: from the fault to every survivor training again (``python -m benchmarks.broken_round``).

Three agents with 2 workers each (``--nnodes=2:3``, last call 15 s) form a round; then one of them goes:

- ``SIGTERM while starting``: the others' workers wait in ``init_process_group`` (the victim's workers
  are held before it, ``HOLD_BEFORE_INIT``), and the victim is SIGTERMed: it leaves;
- ``SIGTERM while training``: every worker trains; the victim is SIGTERMed;
- ``pod deleted while starting``: as the first, but the victim's process tree is SIGKILLed and its Pod
  deleted, so only the operator's eviction removes it (heartbeats expire after 300 s here).

Each case runs with tensorplay's launcher (``kube_rendezvous.run``) and stock ``torchrun``, on this
code and, as the baseline in the same run, on the previous release (checked out from git at
``--previous`` into a temporary directory and put first on the agents' and the operator's
``PYTHONPATH``). The clock starts at the fault and stops when every survivor's workers print a
training step in the new world of 4; a repeat that does not get there within ``--limit`` seconds
counts as not recovered (before the lost-member rule the survivors' workers waited for the process
group timeout, 30 min). Every repeat goes to ``benchmarks/results/broken_round.json``, the table to
``docs/benchmarks.md`` (between the markers) and a plot to ``docs/broken-round.png``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.run import Bench, checkout, control_plane, operator_kubeconfig, release_env
from benchmarks.runner import Benchmark, arguments, figure, label_rows, log, main, stamp, unique_legend

CASES = ("SIGTERM while starting", "SIGTERM while training", "pod deleted while starting")
LAUNCHERS = ("tensorplay", "torchrun")
CODES = ("this release", "previous release")
LAST_CALL = "15"
TITLE, IMAGE = "A round that loses a member (issue #29)", "broken round"


class Cases:
    """Runs one case once: a fresh Rendezvous, three agents, one fault, the survivors' recovery."""

    def __init__(self, bench: Bench, workdir: Path, previous: Path) -> None:
        from kubernetes import client

        self.bench, self.workdir = bench, workdir
        self.core = client.CoreV1Api(bench.objects.api_client)
        self.operator_kubeconfig = operator_kubeconfig(bench)
        self.envs = {"this release": {}, "previous release": release_env(previous)}
        self.count = 0

    def run(self, case: str, launcher: str, code: str, limit: float) -> dict[str, Any]:
        from tests.e2e.harness import ElasticJob, entering_init, training_in_world
        from tests.e2e.operator_process import OperatorProcess, create_training_pod
        from tests.testenv import wait_until

        self.count += 1
        name = f"broken-{self.count}"
        where = self.workdir / name
        env = self.envs[code]
        operator = None
        if case == "pod deleted while starting":
            operator = OperatorProcess(self.operator_kubeconfig, "bench", where / "operator.log", env=env)
            operator.start()
        conf = {"kubeconfig": str(self.bench.trainer), "last_call_timeout": LAST_CALL, "keep_alive_max_attempt": "60"}
        job = ElasticJob(
            where, "k8s", f"bench/{name}", "2:3", rdzv_conf=conf, launcher=launcher, steps=20, step_seconds=0.5
        )
        addresses = [f"127.0.1.{3 * (self.count % 80) + index}" for index in range(3)]
        try:
            if operator is not None:
                for index, address in enumerate(addresses):
                    create_training_pod(self.core, "bench", f"{name}-{index}", name, address)
            starting = case != "SIGTERM while training"
            agents = [
                job.start_agent(
                    f"{name}-{index}",
                    local_addr=addresses[index],
                    env={**env, **({"HOLD_BEFORE_INIT": "1"} if starting and index == 2 else {})},
                )
                for index in range(3)
            ]
            if starting:
                wait_until(lambda: all(entering_init(a, 6) == 2 for a in agents), 120, "3 agents entering init")
                victim = agents[2]
            else:
                victim = wait_until(lambda: training_in_world(agents, 6), 120, "3 agents training")[1]
            survivors = [agent for agent in agents if agent is not victim]
            began = time.monotonic()
            if case == "pod deleted while starting":
                victim.kill_pod()
                self.core.delete_namespaced_pod(victim.name, "bench", grace_period_seconds=0)
            else:
                victim.terminate()
            try:
                wait_until(lambda: training_in_world(survivors, 4, min_step=0), limit, "the survivors training")
            except TimeoutError:
                return {"recovered": False, "limit": limit}
            return {"recovered": True, "seconds": time.monotonic() - began}
        finally:
            job.stop()
            if operator is not None:
                operator.stop()


@contextmanager
def both_releases(workdir: Path, args: argparse.Namespace) -> Iterator[Cases]:
    previous = checkout(args.previous, workdir)
    log(f"previous release {args.previous} in {previous}")
    with control_plane(workdir) as bench:
        yield Cases(bench, workdir, previous)


def schedule(args: argparse.Namespace) -> list[tuple[int, dict[str, Any]]]:
    """Every case and launcher on this release ``--repeats`` times, then on the previous ``--baseline-repeats``."""
    counts = {CODES[0]: args.repeats, CODES[1]: args.baseline_repeats}
    return [
        (repeat, {"case": case, "launcher": launcher, "code": code})
        for code, count in counts.items()
        for repeat in range(count)
        for case in CASES
        for launcher in LAUNCHERS
    ]


def ratio(report: dict[str, Any], case: str, launcher: str) -> str:
    """This release's median over the previous release's; an upper bound where the previous never recovered."""
    medians = []
    for code in CODES:
        runs = [r for r in report["runs"] if (r["case"], r["launcher"], r["code"]) == (case, launcher, code)]
        if not runs:
            return "-"
        seconds = sorted(r["seconds"] if r["recovered"] else float("inf") for r in runs)
        medians.append((seconds[len(seconds) // 2], min(r.get("limit", 0.0) for r in runs)))
    (this, _), (before, limit) = medians
    if before == float("inf"):
        return f"< {this / limit:.2f}x" if this != float("inf") else "-"
    return f"{this / before:.2f}x"


NOTES = f"""
In the SIGTERM cases (no operator), {LAST_CALL} s of each recovery is the job's last call: the two survivors are
fewer than `--nnodes` max, so the round waits for more nodes until the last call ends. In the pod-deleted case the
operator runs: it evicts the deleted pod's node and, seeing every running training pod joined, completes the round
at once (`completedBy: TrainingPodsJoined`, issue #28), so no last call is waited out. The rest is the monitor
interval, the re-rendezvous and the workers' restart.
"""


def section(report: dict[str, Any]) -> list[str]:
    rows = [
        f"{stamp(report)} with `python -m benchmarks.broken_round --repeats "
        f"{report['repeats']} --previous {report['previous']}`: one control plane, 3 agents x 2 workers, "
        f"`--nnodes=2:3`, last call {LAST_CALL} s, monitor interval 0.5 s. Seconds from the fault to every "
        "survivor training in the new round, every repeat; *not within N s*: the survivors had not trained "
        f"again after `--limit` seconds (their workers wait for the process group timeout, 30 min).",
        "",
        "| case | launcher | this release (s), every repeat | previous release, every repeat | ratio of medians |",
        "|---|---|---|---|---|",
    ]
    for case in CASES:
        for launcher in LAUNCHERS:
            cells = []
            for code in CODES:
                runs = [r for r in report["runs"] if (r["case"], r["launcher"], r["code"]) == (case, launcher, code)]
                cells.append(
                    ", ".join(
                        f"{r['seconds']:.1f}" if r["recovered"] else f"not within {r['limit']:.0f} s" for r in runs
                    )
                    or "-"
                )
            rows.append(f"| {case} | {launcher} | {cells[0]} | {cells[1]} | {ratio(report, case, launcher)} |")
    return rows


def plot(report: dict[str, Any]) -> Any:
    labels = [f"{case}\n{launcher}" for case in CASES for launcher in LAUNCHERS]
    made, axis = figure(9, 4.2)
    for offset, code, color in ((-0.15, CODES[0], "tab:green"), (0.15, CODES[1], "tab:red")):
        for index, (case, launcher) in enumerate((case, launcher) for case in CASES for launcher in LAUNCHERS):
            runs = [r for r in report["runs"] if (r["case"], r["launcher"], r["code"]) == (case, launcher, code)]
            xs = [r["seconds"] if r["recovered"] else r["limit"] for r in runs]
            markers = ["o" if r["recovered"] else "x" for r in runs]
            for x, marker in zip(xs, markers, strict=True):
                axis.scatter(x, index + offset, color=color, marker=marker, label=code if index == 0 else None)
    unique_legend(axis, fontsize=8, loc="center right")
    xlabel = "seconds from the fault to every survivor training (x: not recovered by the limit)"
    label_rows(axis, labels, xlabel, "A round that loses a member: every repeat", size=7)
    return made


BENCHMARK = Benchmark.of(
    globals(),
    measure=lambda cases, case, repeat, args: cases.run(case["case"], case["launcher"], case["code"], args.limit),
    setup=both_releases,
    baseline_repeats=1,
    previous="dc5d934",
    limit=120.0,
    fields=arguments("repeats", "previous"),
    timed=False,
    quick={"baseline_repeats": 0},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
