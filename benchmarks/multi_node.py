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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.runner import Benchmark, figure, label_rows, main, ratio, shown, stamp, values
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
from tests.e2e.real_pods import example_objects
from tests.testenv.cluster import Cluster

#: Each case and its baseline (None: none in this run).
CASES: dict[str, str | None] = {
    "node failure, operator": "node failure, no operator",
    "node failure, no operator": None,
    "kubectl drain, operator": None,
    "rank-0 node, k8s (torchrun)": "rank-0 node, c10d (torchrun)",
    "rank-0 node, c10d (torchrun)": None,
}
WINDOW = 90.0
TITLE = "A node lost on three real nodes"
IMAGE, LABELS = TITLE.lower(), list(CASES)


def fields(args: argparse.Namespace) -> dict[str, Any]:
    return {"repeats": args.repeats, "window": WINDOW}


class Nodes:
    """Three real nodes, a fresh namespace per repeat, every node recovered after it."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster, self.workdir, self.count = cluster, workdir, 0
        self.core = client.CoreV1Api(config.new_client_from_config(str(cluster.plane.admin_kubeconfig)))

    @contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        self.count += 1
        name = f"{prefix}-{self.count}"
        self.core.create_namespace({"metadata": {"name": name}})
        try:
            yield name
        finally:
            for node in self.cluster.nodes:
                if not node.running:
                    node.recover()
            self.core.delete_namespace(name, grace_period_seconds=0)


@contextmanager
def three_nodes(workdir: Path, args: argparse.Namespace) -> Iterator[Nodes]:
    with three_node_cluster(workdir) as cluster:
        yield Nodes(cluster, workdir)


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


def measure(nodes: Nodes, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    with nodes.namespace("bench") as namespace:
        found = asdict(run_case(nodes.cluster, case["case"], namespace, nodes.workdir))
    found.pop("details", None)
    return found


NOTES = """
How to read it. *node failure, operator*: the heartbeats expire only after 90 s there, so the dead node leaves the
round through the operator: the Node turns NotReady after the node-lifecycle controller's grace (16 s here, 40-50 s
upstream), the pod's 5 s toleration ends, the pod is deleted and the operator evicts its node at once; its
training-pods rule then completes the survivors' round with no last call. *node failure, no operator*: the 15 s
heartbeat expiry, then the survivors' round waits out its 10 s last call. With upstream's grace the operator's path
would be slower than the expiry; its value is that it does not depend on heartbeats (a pod deleted, a NotReady node
with agents frozen). The replacement trains only once the Job controller replaced the deleted pod. *kubectl drain*:
the agent gets SIGTERM and leaves at once. *rank-0 node*: stock torchrun; with torch's c10d the survivors wait on
the dead store and never train again in the window, with k8s they re-form after the 15 s expiry.
"""


def section(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    lines = [
        f"{stamp(report)}, {report['repeats']} repeats "
        f"(`python -m benchmarks.multi_node`): three real nodes, the example Job's 3 pods one per node. Seconds "
        f'from the fault, every repeat; "none" means not within the {report["window"]:.0f} s window. The ratio '
        "compares medians with the baseline of the same run.",
        "",
        "| case | fault to the survivors training | fault to the replacement training | ratio (survivors) |",
        "|---|---|---|---|",
    ]
    for case, baseline in CASES.items():
        text = ""
        if baseline is not None:
            mine = [x for x in values(runs, "survivors_training", case=case) if x is not None]
            base = [x for x in values(runs, "survivors_training", case=baseline) if x is not None]
            found = ratio(mine, base)
            if found is not None:
                text = f"{found:.2f}x of {baseline}"
            elif mine:
                text = f"{baseline}: never within the window"
        lines.append(
            f"| {case} | {shown(values(runs, 'survivors_training', case=case))} "
            f"| {shown(values(runs, 'replacement_training', case=case))} | {text} |"
        )
    return lines


def plot(report: dict[str, Any]) -> Any:
    made, axis = figure(9, 3.6)
    window = report["window"]
    for index, case in enumerate(CASES):
        for key, marker in (("survivors_training", "o"), ("replacement_training", "x")):
            xs = values(report["runs"], key, case=case)
            axis.scatter([window if x is None else x for x in xs], [index] * len(xs), marker=marker, s=28,
                         color="tab:red" if None in xs and key == "survivors_training" else None)  # fmt: skip
    axis.axvline(window, color="grey", linestyle=":", linewidth=1)
    label_rows(
        axis,
        list(CASES),
        "seconds from the fault (o: survivors training, x: replacement training; at the line: never)",
        f"A node lost on three real nodes ({report['date']}, {report['machine']})",
        title_size=9,
    )
    return made


BENCHMARK = Benchmark.of(
    globals(),
    setup=three_nodes,
    quick={"cases": ["node failure, no operator"]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
