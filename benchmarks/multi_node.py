"""A node lost on three real nodes, every repeat (``python -m benchmarks.multi_node``; issue #37).

One control plane with three real nodes (``tests.testenv.cluster``). The README's example Job (3 pods, one per
node, ``tests.e2e.multi_node.spread``) trains; then, each case in a fresh namespace:

- **node failure, operator**: the node of rank 0's pod dies (network silent, kubelet, containerd and containers
  killed); heartbeats expire only after 90 s, so the operator's NotReady and pod rules remove it;
- **node failure, no operator** (baseline of the one above): the same, the agents alone, 15 s heartbeat expiry;
- **kubectl drain**: the node of one training pod drained (eviction API; the agent gets SIGTERM and leaves),
  with the operator as a local process;
- **rank-0 node, k8s** and **rank-0 node, c10d** (its baseline): stock torchrun, the node of the Indexed Job's
  pod 0 dies; torch's c10d finds rank 0's store by a headless Service's DNS name (``c10d_objects``).

Seconds from the fault to the survivors training in a new round, and to the Job's replacement pod training.
Every repeat is kept; a repeat that did not recover within the window is recorded as such. Writes
``benchmarks/results/multi_node.json``, ``docs/multi-node.png`` and a section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.report import new_report, save_report, splice
from benchmarks.run import RESULTS, log
from tests.e2e.multi_node import (
    LAST_CALL_SECONDS,
    Recovery,
    drain_and_recover,
    local_operator,
    node_failure,
    rank0_node_killed,
    spread,
    start_spread_job,
    three_node_cluster,
)
from tests.e2e.real_pods import REPO, example_objects
from tests.testenv.cluster import Cluster

DOCS = REPO / "docs"
BEGIN, END = "<!-- multi-node:begin (python -m benchmarks.multi_node) -->", "<!-- multi-node:end -->"
#: Each case and its baseline (None: none in this run).
CASES: dict[str, str | None] = {
    "node failure, operator": "node failure, no operator",
    "node failure, no operator": None,
    "kubectl drain, operator": None,
    "rank-0 node, k8s (torchrun)": "rank-0 node, c10d (torchrun)",
    "rank-0 node, c10d (torchrun)": None,
}


def drain(cluster: Cluster, namespace: str, workdir: Path) -> Recovery:
    operator = local_operator(cluster, namespace, workdir / f"operator-{namespace}.log")
    with operator:
        first, trained = start_spread_job(
            cluster, namespace, spread(example_objects(last_call_seconds=LAST_CALL_SECONDS))
        )
        victim = sorted(first.pods)[1]
        return drain_and_recover(cluster, namespace, first, trained, first.pods[victim][1])


def run_case(cluster: Cluster, case: str, namespace: str, workdir: Path) -> Recovery:
    if case == "node failure, operator":
        return node_failure(cluster, namespace, local_operator(cluster, namespace, workdir / f"op-{namespace}.log"))
    if case == "node failure, no operator":
        return node_failure(cluster, namespace, None)
    if case == "kubectl drain, operator":
        return drain(cluster, namespace, workdir)
    return rank0_node_killed(cluster, namespace, "k8s" if "k8s" in case else "c10d")


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def write_report(report: dict[str, Any]) -> None:
    runs = report["runs"]

    def values(case: str, key: str) -> list[float]:
        return [run[key] for run in runs if run["case"] == case and run.get(key) is not None]

    def shown(case: str, key: str) -> str:
        found = [run.get(key) for run in runs if run["case"] == case]
        return ", ".join("none" if value is None else f"{value:.1f}" for value in found)

    lines = [
        "## A node lost on three real nodes",
        "",
        f"Measured {report['date']} on {report['machine']}, {report['repeats']} repeats "
        f"(`python -m benchmarks.multi_node`): three real nodes, the example Job's 3 pods one per node. Seconds "
        f'from the fault, every repeat; "none" means not within the {report["window"]:.0f} s window. The ratio '
        "compares medians with the baseline of the same run.",
        "",
        "| case | fault to the survivors training | fault to the replacement training | ratio (survivors) |",
        "|---|---|---|---|",
    ]
    for case, baseline in CASES.items():
        ratio = ""
        if baseline is not None:
            mine, base = median(values(case, "survivors_training")), median(values(baseline, "survivors_training"))
            if mine is not None and base is not None:
                ratio = f"{mine / base:.2f}x of {baseline}"
            elif mine is not None:
                ratio = f"{baseline}: never within the window"
        lines.append(
            f"| {case} | {shown(case, 'survivors_training')} | {shown(case, 'replacement_training')} | {ratio} |"
        )
    lines += [
        "",
        "How to read it. *node failure, operator*: the heartbeats expire only after 90 s there, so the dead node "
        "leaves the round through the operator: the Node turns NotReady after the node-lifecycle controller's "
        "grace (16 s here, 40-50 s upstream), the pod's 5 s toleration ends, the pod is deleted and the operator "
        "evicts its node at once; its training-pods rule then completes the survivors' round with no last call. "
        "*node failure, no operator*: the 15 s heartbeat expiry, then the survivors' round waits out its 10 s last "
        "call. With upstream's grace the operator's path would be slower than the expiry; its value is that it "
        "does not depend on heartbeats (a pod deleted, a NotReady node with agents frozen). The replacement "
        "trains only once the Job controller replaced the deleted pod. *kubectl drain*: the agent gets SIGTERM "
        "and leaves at once. *rank-0 node*: stock torchrun; with torch's c10d the survivors wait on the dead "
        "store and never train again in the window, with k8s they re-form after the 15 s expiry.",
        "",
        "![a node lost on three real nodes](multi-node.png)",
    ]
    splice(DOCS / "benchmarks.md", "\n".join(lines), BEGIN, END, at_end=True)
    plot(report)


def plot(report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 3.6))
    window = report["window"]
    for index, case in enumerate(CASES):
        for key, marker in (("survivors_training", "o"), ("replacement_training", "x")):
            xs = [run.get(key) for run in report["runs"] if run["case"] == case]
            axis.scatter([window if x is None else x for x in xs], [index] * len(xs), marker=marker, s=28,
                         color="tab:red" if None in xs and key == "survivors_training" else None)  # fmt: skip
    axis.axvline(window, color="grey", linestyle=":", linewidth=1)
    axis.set_yticks(range(len(CASES)), list(CASES), fontsize=8)
    axis.set_xlabel("seconds from the fault (o: survivors training, x: replacement training; at the line: never)")
    axis.set_title(f"A node lost on three real nodes ({report['date']}, {report['machine']})", fontsize=9)
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(DOCS / "multi-node.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each case (default 3)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES), help="which cases")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and plot from the JSON")
    parser.add_argument("--add", action="store_true", help="add these repeats to the JSON's (same cases, new run)")
    args = parser.parse_args()
    out = RESULTS / "multi_node.json"
    if args.report:
        write_report(json.loads(out.read_text()))
        return 0
    window = 90.0
    report = new_report(
        repeats=args.repeats,
        window=window,
        runs=[],
    )
    if args.add and out.exists():
        earlier = json.loads(out.read_text())
        report["runs"] = earlier["runs"]
        report["repeats"] += earlier["repeats"]
        report["date"] = f"{earlier['date']} and {report['date']}"
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-multi-node-"))
    log(f"starting a control plane and three real nodes in {workdir}")
    with three_node_cluster(workdir) as cluster:
        plane = cluster.plane
        core = client.CoreV1Api(config.new_client_from_config(str(plane.admin_kubeconfig)))
        count = 0
        for repeat in range(args.repeats):
            for case in args.cases:
                count += 1
                namespace = f"bench-{count}"
                core.create_namespace({"metadata": {"name": namespace}})
                log(f"repeat {repeat + 1}/{args.repeats}: {case}")
                started = time.monotonic()
                try:
                    recovery = run_case(cluster, case, namespace, workdir)
                    run: dict[str, Any] = {"case": case, **asdict(recovery)}
                except TimeoutError as exc:
                    run = {"case": case, "error": str(exc)[:300]}
                finally:
                    for node in cluster.nodes:
                        if not node.running:
                            node.recover()
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
