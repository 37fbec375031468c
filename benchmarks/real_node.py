"""Recovery on real pods (``python -m benchmarks.real_node``): a real node runs the README's example Jobs.

One control plane with a real node (``tests.testenv.node``: containerd, kubelet, scheduler) and the
operator (a local process under its documented RBAC) serve every case:

- ``pod deleted``: the example Job (3 pods, ``--nnodes=2:4``, tensorplay's launcher, or stock torchrun
  with ``examples/torch/indexed-job.yaml``) trains; ``kubectl delete pod`` one pod. Measured from the
  delete to the two survivors' workers training in a new round, and to the Job controller's
  replacement pod training with them in a world of 3. Baseline in the same run: the same without
  the operator (the agents alone: the victim's SIGTERM leave, the 30 s last call);
- ``node failure``: the kubelet and every container SIGKILLed (``Node.fail``). Measured from the failure to
  the Node's Ready condition leaving True (the node-lifecycle controller), and to the 3 nodes of its
  pods being out of the round: evicted by the operator (``--node-not-ready-seconds``), or, in the
  baseline (the operator with that rule off), expired: heartbeats expire after 90 s here (keep-alive
  10 s x 9);
- ``demo``: ``scripts/demo.py`` on the real node and ``--simulated`` (the kubelet played): the time its
  round forms and its survivors train again after the kill/delete, from its own lines.

Every repeat goes to ``benchmarks/results/real_node.json``, the table to ``docs/benchmarks.md`` (between
the markers) and a plot to ``docs/real-node.png``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.runner import REPO, Benchmark, figure, label_rows, log, main, stamp
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.real_pods import apply, example_objects, rendezvous_status, round_with, running_pods, worker_rounds
from tests.testenv import ControlPlane, wait_until
from tests.testenv.cluster import Cluster

JOBS = {"tensorplay": "training-job.yaml", "torchrun": "torch/indexed-job.yaml"}


class RealNode:
    """The control plane, its node and a fresh namespace (with the operator, or not) per repeat."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.plane = ControlPlane(workdir / "control-plane", with_node=True)
        self.plane.start()
        self.cluster = Cluster(self.plane, nodes=1)
        self.cluster.start()
        self.node = self.cluster.node
        self.plane.kubectl("apply", "-f", str(REPO / "crds"))
        self.plane.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd", "--all")
        self.plane.kubectl("create", "namespace", "kube-rendezvous-system")
        self.plane.kubectl("apply", "-f", str(REPO / "docs" / "operator-rbac.yaml"))
        self.operator_kubeconfig = self.plane.serviceaccount_kubeconfig(
            "kube-rendezvous-system", "kube-rendezvous-operator"
        )
        api = config.new_client_from_config(str(self.plane.admin_kubeconfig))
        self.core, self.objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.count = 0

    def namespace(self) -> str:
        self.count += 1
        name = f"bench-{self.count}"
        self.core.create_namespace({"metadata": {"name": name}})
        return name

    def operator(self, namespace: str, *args: str) -> OperatorProcess:
        return OperatorProcess(
            self.operator_kubeconfig, namespace, self.workdir / f"operator-{namespace}.log", args=args
        )

    def training(self, namespace: str, manifests: list[dict[str, Any]]) -> dict[str, str]:
        """Apply ``manifests``; return the 3 pods once their round formed and every one trained a step."""
        apply(self.node, namespace, manifests)
        pods = wait_until(lambda: running_pods(self.core, namespace), 240, "3 training pods Running")
        wait_until(
            lambda: (
                round_with(self.objects, namespace, pods)
                and all(worker_rounds(self.node, namespace, pod, 3) for pod in pods)
            ),
            240,
            "the 3 pods training together",
        )
        return dict(pods)

    def finish(self, namespace: str) -> None:
        self.plane.kubectl("delete", "namespace", namespace, "--wait=false")

    def stop(self) -> None:
        self.cluster.stop()
        self.plane.stop()


def pod_deleted(bench: RealNode, launcher: str, operator: bool, limit: float) -> dict[str, Any]:
    namespace = bench.namespace()
    run: dict[str, Any] = {"case": "pod deleted", "launcher": launcher, "operator": operator}
    process = bench.operator(namespace) if operator else None
    try:
        if process is not None:
            process.start()
        first = bench.training(namespace, example_objects(JOBS[launcher]))
        victim = sorted(first)[1]
        survivors = sorted(set(first) - {victim})
        rounds = {pod: worker_rounds(bench.node, namespace, pod) for pod in first}
        started = time.monotonic()
        bench.plane.kubectl("-n", namespace, "delete", "pod", victim, "--wait=false")
        wait_until(
            lambda: all(worker_rounds(bench.node, namespace, pod) > rounds[pod] for pod in survivors),
            limit,
            "the survivors training in a new round",
            interval=0.1,
        )
        run["survivors_training"] = round(time.monotonic() - started, 2)
        second = wait_until(lambda: running_pods(bench.core, namespace, victim), limit, "the replacement Running")
        replacement = next(pod for pod in second if pod not in first)
        wait_until(
            lambda: (
                worker_rounds(bench.node, namespace, replacement, 3) > 0
                and all(worker_rounds(bench.node, namespace, pod, 3) > rounds[pod] for pod in survivors)
            ),
            limit,
            "the replacement training with the survivors",
            interval=0.1,
        )
        run["replacement_training"] = round(time.monotonic() - started, 2)
    except TimeoutError as exc:
        run["error"] = str(exc)[:300]
    finally:
        if process is not None:
            process.stop()
        bench.finish(namespace)
    return run


def node_failure(bench: RealNode, rule: bool, limit: float) -> dict[str, Any]:
    namespace = bench.namespace()
    run: dict[str, Any] = {"case": "node failure", "launcher": "tensorplay", "operator": True, "notready_rule": rule}
    process = bench.operator(namespace, *([] if rule else ["--node-not-ready-seconds", "100000"]))
    try:
        process.start()
        manifests = example_objects()
        rendezvous = next(item for item in manifests if item["kind"] == "Rendezvous")
        rendezvous["spec"].update(keepAliveIntervalSeconds=10, keepAliveMaxAttempts=9)
        first = bench.training(namespace, manifests)
        started = time.monotonic()
        bench.node.fail()

        def not_ready() -> bool:
            conditions = bench.core.read_node(bench.node.name).status.conditions or []
            return any(c.type == "Ready" and c.status != "True" for c in conditions)

        wait_until(not_ready, limit, "the Node NotReady", interval=0.1)
        run["not_ready"] = round(time.monotonic() - started, 2)

        def evicted() -> bool:
            """The 3 nodes are out of the round: evicted (the NotReady rule), or expired (the baseline)."""
            status = rendezvous_status(bench.objects, namespace)
            members = {item["node"].rsplit("_", 2)[0] for item in status.get("participants") or []}
            return "participants" in status and not members & set(first.values())

        wait_until(evicted, limit, "the 3 nodes out of the round", interval=0.1)
        run["evicted"] = round(time.monotonic() - started, 2)
    except TimeoutError as exc:
        run["error"] = str(exc)[:300]
    finally:
        process.stop()
        bench.node.recover()
        bench.finish(namespace)
    return run


def demo(path: str) -> dict[str, Any]:
    """``scripts/demo.py`` on the real node, or ``--simulated``: its own timings, from its output."""
    args = ["--steps", "25"] + (["--simulated"] if path == "simulated" else [])
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), *args], capture_output=True, text=True, timeout=900
    )
    run: dict[str, Any] = {"case": "demo", "launcher": "tensorplay", "path": path}
    formed = re.search(r"round formed and training in ([\d.]+) s", done.stdout)
    again = re.search(r"survivors training again in a new round ([\d.]+) s", done.stdout)
    if done.returncode != 0 or formed is None or again is None:
        run["error"] = (done.stdout + done.stderr)[-300:]
    else:
        run["round"], run["survivors_training"] = float(formed.group(1)), float(again.group(1))
    return run


def label(run: dict[str, Any]) -> str:
    if run["case"] == "pod deleted":
        return f"pod deleted, {run['launcher']}, {'operator' if run['operator'] else 'no operator (baseline)'}"
    if run["case"] == "node failure":
        return f"node failure, {'NotReady rule' if run['notready_rule'] else 'heartbeat expiry only (baseline)'}"
    return f"demo, {run['path']}"


def section(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    lines = [
        f"{stamp(report)}, {report['repeats']} repeats "
        "(`python -m benchmarks.real_node`); seconds, every repeat; the ratio compares medians with the "
        "baseline of the same run.",
        "",
        "| case | measured | every repeat (s) | ratio to baseline |",
        "|---|---|---|---|",
    ]

    def values(name: str, key: str) -> list[float]:
        return [run[key] for run in runs if label(run) == name and key in run]

    def median(xs: list[float]) -> float:
        ordered = sorted(xs)
        return ordered[len(ordered) // 2] if ordered else float("nan")

    operator, alone = "pod deleted, {l}, operator", "pod deleted, {l}, no operator (baseline)"
    survivors, replacement = "delete to survivors training", "delete to the replacement training"
    rows = [
        (operator, "survivors_training", survivors, alone),
        (operator, "replacement_training", replacement, alone),
        (alone, "survivors_training", survivors, None),
        (alone, "replacement_training", replacement, None),
    ]
    for launcher in JOBS:
        for name, key, what, baseline in rows:
            name = name.format(l=launcher)
            found = values(name, key)
            failed = sum(1 for run in runs if label(run) == name and "error" in run)
            ratio = ""
            if baseline is not None:
                base = values(baseline.format(l=launcher), key)
                ratio = f"{median(found) / median(base):.2f}x" if found and base else ""
            shown = ", ".join(f"{x:.1f}" for x in found) + (f" ({failed} failed)" if failed else "")
            lines.append(f"| {name} | {what} | {shown} | {ratio} |")
    for name in ("node failure, NotReady rule", "node failure, heartbeat expiry only (baseline)"):
        out_of_round = "failure to its pods' nodes out of the round"
        for key, what in (("not_ready", "failure to Node NotReady"), ("evicted", out_of_round)):
            found = values(name, key)
            ratio = ""
            if key == "evicted" and "baseline" not in name:
                base = values("node failure, heartbeat expiry only (baseline)", key)
                ratio = f"{median(found) / median(base):.2f}x" if found and base else ""
            lines.append(f"| {name} | {what} | {', '.join(f'{x:.1f}' for x in found)} | {ratio} |")
    for key, what in (
        ("round", "round formed and training"),
        ("survivors_training", "kill/delete to survivors training"),
    ):
        real, simulated = values("demo, real node", key), values("demo, simulated", key)
        ratio = f"{median(real) / median(simulated):.2f}x" if real and simulated else ""
        failed = sum(1 for run in runs if label(run) == "demo, real node" and "error" in run)
        shown = ", ".join(f"{x:.1f}" for x in real) + (f" ({failed} failed)" if failed else "")
        lines.append(f"| demo, real node | {what} | {shown} | {ratio} (to simulated) |")
        lines.append(f"| demo, simulated | {what} | {', '.join(f'{x:.1f}' for x in simulated)} | |")
    return lines


def plot(report: dict[str, Any]) -> Any:
    keys = ("survivors_training", "replacement_training", "not_ready", "evicted", "round")
    series = sorted({(label(run), key) for run in report["runs"] for key in keys if key in run})
    made, axis = figure(9, 0.42 * len(series) + 1.2)
    for index, (name, key) in enumerate(series):
        xs = [run[key] for run in report["runs"] if label(run) == name and key in run]
        axis.scatter(xs, [index] * len(xs), s=22)
    labels = [f"{name}: {key.replace('_', ' ')}" for name, key in series]
    title = f"Recovery on a real node ({report['date']}, {report['machine']})"
    label_rows(axis, labels, "seconds (every repeat)", title, size=7, title_size=9)
    return made


class Planes:
    """The real node's control plane, started at its first case and stopped before the demo's (it starts its own)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: RealNode | None = None

    def bench(self) -> RealNode:
        if self.started is None:
            log(f"starting a control plane and a real node in {self.workdir}")
            self.started = RealNode(self.workdir)
        return self.started

    def close(self) -> None:
        if self.started is not None:
            self.started.stop()
            self.started = None


@contextmanager
def planes(workdir: Path, args: argparse.Namespace) -> Iterator[Planes]:
    made = Planes(workdir)
    try:
        yield made
    finally:
        made.close()


def schedule(args: argparse.Namespace) -> list[tuple[int, dict[str, Any]]]:
    """Pods deleted, then node failures (the baseline ``--baseline-repeats`` times), then the demo."""
    deleted = [
        {"case": "pod deleted", "launcher": launcher, "operator": op} for launcher in JOBS for op in (True, False)
    ]
    plan = [(repeat, case) for repeat in range(args.repeats) for case in deleted]
    for repeat in range(args.repeats):
        for rule in (True, False)[: 1 + (repeat < args.baseline_repeats)]:
            plan.append(
                (repeat, {"case": "node failure", "launcher": "tensorplay", "operator": True, "notready_rule": rule})
            )
    demo_cases = [{"case": "demo", "launcher": "tensorplay", "path": path} for path in ("real node", "simulated")]
    return plan + [(repeat, case) for repeat in range(args.repeats) for case in demo_cases]


def measure(context: Planes, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    if case["case"] == "pod deleted":
        return pod_deleted(context.bench(), case["launcher"], case["operator"], args.limit)
    if case["case"] == "node failure":
        return node_failure(context.bench(), case["notready_rule"], args.limit)
    context.close()
    return demo(case["path"])


BENCHMARK = Benchmark.of(
    globals(), setup=planes, baseline_repeats=1, limit=240.0, timed=False, quick={"baseline_repeats": 0}
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
