"""A node lost for good on three real nodes, with upstream's grace and ours, beside the last release (issue #46
item 4; ``python -m benchmarks.lost_node``).

One control plane with three real nodes (``tests.testenv.cluster``). Each repeat, each case in a fresh namespace:
the README's example Job (3 pods, one per node, the default 300 s toleration) trains with the operator running;
then the node of one pod dies silently (``Node.fail``: its pods' packets dropped, then its kubelet, containerd and
containers killed). Cases:

- **previous release, a human**: the previous release's operator (``--previous``, on ``PYTHONPATH``); an
  administrator taints the Node ``node.kubernetes.io/out-of-service`` the moment it is NotReady (the fastest a
  human can be; Kubernetes' pod garbage collector then marks the pod Failed and deletes it);
- **this release, no human**: ``spec.lostNodes.failPodsAfterSeconds: 10``; nobody touches the Node;

each with the test cluster's node-monitor grace (16 s) and upstream's default (50 s): kube-controller-manager is
restarted with that ``--node-monitor-grace-period`` before the case.

Seconds from the fault to: the Node NotReady, the operator's ``NodeLost`` Event (this release), the survivors
training in a new round, the lost pod Failed or being deleted, its replacement Running, and training with 3.
Writes ``benchmarks/results/lost_node.json``, ``docs/lost-node.png`` and a section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.multi_node import Nodes
from benchmarks.run import checkout, release_env
from benchmarks.runner import Benchmark, figure, label_rows, main, ratio, shown, stamp, values
from tests.e2e.multi_node import local_operator, lost_node, three_node_cluster

#: The cases: (code, grace seconds); the baseline of each is the previous release's at the same grace.
GRACES = (16, 50)
CODES = ("previous release, a human", "this release, no human")
CASES = [f"{code}, grace {grace} s" for grace in GRACES for code in CODES]
#: The Rendezvous's spec.lostNodes.failPodsAfterSeconds in this release's cases.
FAIL_AFTER = 10
PREVIOUS = "399fa07"
WINDOW = 300.0
TITLE = "A node lost for good: replacement with no human, test and upstream grace"
IMAGE, LABELS = TITLE.lower(), CASES
#: The measured moments, in seconds from the fault, in the order they happen.
MOMENTS = {
    "not_ready": "Node NotReady",
    "node_lost": "NodeLost Event",
    "survivors_training": "survivors training",
    "pod_failed": "lost pod Failed or deleted",
    "replacement_running": "replacement Running",
    "replacement_training": "replacement training",
}


def fields(args: argparse.Namespace) -> dict[str, Any]:
    return {"repeats": args.repeats, "window": WINDOW, "previous": args.previous, "fail_after": FAIL_AFTER}


@dataclass
class Setup:
    nodes: Nodes
    previous: dict[str, str]


@contextmanager
def three_nodes(workdir: Path, args: argparse.Namespace) -> Iterator[Setup]:
    tree = checkout(args.previous, workdir)
    with three_node_cluster(workdir) as cluster:
        yield Setup(Nodes(cluster, workdir), release_env(tree))


def parse(case: str) -> tuple[bool, int]:
    """Whether ``case`` is this release's, and its grace in seconds."""
    code, grace = case.rsplit(", grace ", 1)
    return code == CODES[1], int(grace.removesuffix(" s"))


def measure(setup: Setup, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    this_release, grace = parse(case["case"])
    cluster = setup.nodes.cluster
    cluster.plane.set_node_monitor_grace(grace)
    with setup.nodes.namespace("lost") as namespace:
        log = setup.nodes.workdir / f"operator-{namespace}.log"
        operator = local_operator(
            cluster, namespace, log, lost_nodes=this_release, env=None if this_release else setup.previous
        )
        with operator:
            story = lost_node(cluster, namespace, FAIL_AFTER if this_release else None, human=not this_release)
    found = asdict(story)
    found.pop("details", None)
    return found


NOTES = """
How to read it. The Node turns NotReady after kube-controller-manager's `--node-monitor-grace-period` (16 s in
the test cluster, 50 s upstream). *previous release, a human*: the fastest an administrator can be (the taint the
moment the Node is NotReady); in practice a person reads an alert first, so add their reaction time. The
replacement then waits for Kubernetes' pod garbage collector, which looks for pods on out-of-service Nodes every
20 s. *this
release, no human*: the operator posts `NodeLost` (the fix named) when it judges the NotReady Node, marks the
silent pod Failed with `DisruptionTarget` 10 s after the NotReady transition (`failPodsAfterSeconds`) and
deletes it; the Job replaces it. The survivors do not wait for any of this: the dead agent's heartbeats expire
(15 s), or the operator evicts it, whichever first. Without the option and without a human, the replacement never
comes (the Job has no Failed pod): `tests/test_lost_nodes.py`.
"""


def section(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    head = " | ".join(MOMENTS.values())
    lines = [
        f"{stamp(report)}, {report['repeats']} repeats (`python -m benchmarks.lost_node --previous "
        f"{report['previous']}`): three real nodes, the example Job's 3 pods one per node, the node of one "
        f'dies silently. Seconds from the fault, every repeat; "none": not within the {report["window"]:.0f} s '
        "window (or not posted by that release). The ratio compares the medians of the replacement training with "
        "the previous release's at the same grace, in the same run.",
        "",
        f"| case | {head} | ratio (replacement training) |",
        "|---|" + "---|" * (len(MOMENTS) + 1),
    ]
    for case in CASES:
        this_release, grace = parse(case)
        text = ""
        if this_release:
            baseline = f"{CODES[0]}, grace {grace} s"
            mine = [x for x in values(runs, "replacement_training", case=case) if x is not None]
            base = [x for x in values(runs, "replacement_training", case=baseline) if x is not None]
            found = ratio(mine, base)
            text = "" if found is None else f"{found:.2f}x"
        cells = " | ".join(shown(values(runs, key, case=case)) for key in MOMENTS)
        lines.append(f"| {case} | {cells} | {text} |")
    return lines


def plot(report: dict[str, Any]) -> Any:
    made, axis = figure(9, 3.8)
    window = report["window"]
    markers = dict(zip(MOMENTS, ("|", "*", "o", "s", "^", "x"), strict=True))
    for index, case in enumerate(CASES):
        for key, marker in markers.items():
            xs = [x for x in values(report["runs"], key, case=case) if x is not None]
            axis.scatter(xs, [index] * len(xs), marker=marker, s=30, label=MOMENTS[key] if index == 0 else None)
    axis.axvline(window, color="grey", linestyle=":", linewidth=1)
    axis.legend(fontsize=7, loc="lower right")
    label_rows(
        axis,
        CASES,
        "seconds from the fault (every repeat)",
        f"A node lost for good, three real nodes ({report['date']}, {report['machine']})",
        title_size=9,
    )
    return made


BENCHMARK = Benchmark.of(
    globals(),
    setup=three_nodes,
    previous=PREVIOUS,
    quick={"cases": [CASES[1]]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
