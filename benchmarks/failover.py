"""Operator failover: how long after the leader stops until a standby replica acts (``python -m benchmarks.failover``).

On the project's control plane (real kube-apiserver and etcd, RBAC on), two operator replicas run
with ``--leader-election`` as the chart runs them. Per repeat and mode, the leader is stopped; the
clock starts at the signal and stops when

- ``lease``: the standby holds the Lease ``kube-rendezvous-operator``;
- ``acting``: a Rendezvous created right after the signal has its Ready condition (the new
  leader's handlers run).

Modes: ``standby, leader SIGKILLed`` (a crash: the standby waits for the Lease to go stale on its
own clock), ``standby, leader SIGTERMed`` (a rollout or drain: the leader releases the Lease), and
the baseline in the same run, ``one replica, restarted at once`` (no election, no standby: a new
operator process started the moment the old one is SIGKILLed, the best a single-replica
Deployment can do; a kubelet restart adds its own delay on top).

Every repeat is written to ``benchmarks/results/failover.json``, the table to
``docs/benchmarks.md`` (between the failover markers) and a plot to ``docs/failover.png``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.run import GROUP, VERSION, Bench, control_plane, operator_kubeconfig
from benchmarks.runner import Benchmark, figure, found, label_rows, main, ratio, stamp
from benchmarks.scale import percentile

TITLE, IMAGE = "Operator failover (leader election)", "operator failover"
MODES = ("standby, leader SIGKILLed", "standby, leader SIGTERMed", "one replica, restarted at once (baseline)")


class Failover:
    """Operator replicas of the bench namespace and the measurements around them."""

    def __init__(self, bench: Bench, workdir: Path) -> None:
        from kubernetes import client

        self.bench, self.workdir = bench, workdir
        self.kubeconfig = operator_kubeconfig(bench)
        self.leases = client.CoordinationV1Api(bench.objects.api_client)
        self.count = 0

    def replica(self, name: str, election: bool = True) -> Any:
        from tests.e2e.operator_process import OperatorProcess

        self.count += 1
        process = OperatorProcess(
            self.kubeconfig,
            "bench",
            self.workdir / f"{self.count:03}-{name}.log",
            args=("--leader-election",) if election else (),
            env={"POD_NAME": f"{name}-{self.count}", "POD_NAMESPACE": "bench"},
        )
        process.start()
        return process

    def holder(self) -> str | None:
        from kubernetes import client

        try:
            lease = self.leases.read_namespaced_lease("kube-rendezvous-operator", "bench")
        except client.ApiException:
            return None
        return lease.spec.holder_identity if lease.spec is not None else None

    def ready(self, name: str) -> bool:
        obj: Any = self.bench.objects.get_namespaced_custom_object(GROUP, VERSION, "bench", "rendezvouses", name)
        conditions = (obj.get("status") or {}).get("conditions") or []
        # Judged: Ready past its first Unknown (Ready=True means a round formed; without agents it stays False).
        return any(item["type"] == "Ready" and item["status"] != "Unknown" for item in conditions)

    def create(self, name: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Rendezvous",
            "metadata": {"name": name},
            "spec": {"minNodes": 1, "maxNodes": 2},
        }
        self.bench.objects.create_namespaced_custom_object(GROUP, VERSION, "bench", "rendezvouses", body)

    def measure(self, mode: str, repeat: int, limit: float) -> dict[str, Any]:
        """One failover of ``mode``: the seconds from the signal to ``lease`` and ``acting``."""
        from tests.testenv import wait_until

        election = not mode.startswith("one replica")
        leader = self.replica("leader", election)
        if election:
            wait_until(lambda: self.holder() == leader.env["POD_NAME"], 60, "the first replica to lead")
        warm = f"warm-{repeat}-{MODES.index(mode)}"
        self.create(warm)
        wait_until(lambda: self.ready(warm), 60, "the leader to act")
        standby = self.replica("standby", election) if election else None
        probe = f"after-{repeat}-{MODES.index(mode)}"
        started = time.monotonic()
        if mode == "standby, leader SIGTERMed":
            leader.stop()
        else:
            leader.kill()
        if standby is None:
            standby = self.replica("restarted", election=False)  # started the moment the old one died
        self.create(probe)
        found: dict[str, Any] = {"repeat": repeat}
        try:
            if election:
                wait_until(
                    lambda: self.holder() == standby.env["POD_NAME"],
                    limit,
                    "the standby to take the Lease",
                    interval=0.05,
                )
                found["lease"] = round(time.monotonic() - started, 3)
            wait_until(lambda: self.ready(probe), limit, "the new leader to act", interval=0.05)
            found["acting"] = round(time.monotonic() - started, 3)
        except TimeoutError as exc:
            found["error"] = str(exc)[:200]
        finally:
            standby.stop()
            leader.stop()
        return found


@contextmanager
def replicas(workdir: Path, args: argparse.Namespace) -> Iterator[Failover]:
    with control_plane(workdir) as bench:
        yield Failover(bench, workdir)


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3),
        "p90": round(percentile(values, 0.9), 3),
        "max": round(max(values), 3),
    }


NOTES = """
A SIGKILLed leader cannot release its Lease: the standby takes it once it has not changed for `lease_duration` (10
s) on the standby's own clock, trying every `retry_period` (2 s), so the *lease* column is bounded by 12 s after the
leader's last renewal, which was up to 2 s before the kill. A SIGTERMed leader releases the Lease on its way out.
The baseline has no standby and no Lease: it is a new process started the instant the old one died, which a
Deployment never achieves (the kubelet's restart and the image's start come on top).
"""


def section(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    base = found(runs, "acting", mode=MODES[2])
    lines = [
        f"{stamp(report)} with `python -m benchmarks.failover "
        f"--repeats {report['repeats']}`: the control plane, both replicas and this script on one machine. "
        "The clock starts at the signal to the leader. *lease*: the standby holds the Lease; *acting*: a "
        "Rendezvous created after the signal is Ready (the new leader's handlers run). Every repeat:",
        "",
        "| mode | lease (s), every repeat | acting (s), every repeat | acting p50 / p90 / max | p50 vs baseline |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        leases, acting = found(runs, "lease", mode=mode), found(runs, "acting", mode=mode)
        failed = sum(1 for run in runs if run["mode"] == mode and "error" in run)
        stats = summarize(acting) if acting else None
        measured = ratio(acting, base)
        ratio_text = f"{measured:.2f}x" if measured else "-"
        lease_text = ", ".join(f"{value:.2f}" for value in leases) or "-"
        acting_text = (", ".join(f"{value:.2f}" for value in acting) or "-") + (f" ({failed} failed)" if failed else "")
        stats_text = f"{stats['p50']:.2f} / {stats['p90']:.2f} / {stats['max']:.2f}" if stats else "-"
        lines.append(f"| {mode} | {lease_text} | {acting_text} | {stats_text} | {ratio_text} |")
    return lines


def plot(report: dict[str, Any]) -> Any:
    made, axis = figure(8, 3.6)
    for index, mode in enumerate(MODES):
        for key, marker, color in (("lease", "o", "tab:blue"), ("acting", "s", "tab:orange")):
            xs = found(report["runs"], key, mode=mode)
            axis.scatter(
                xs,
                [index + (0.12 if key == "acting" else -0.12)] * len(xs),
                marker=marker,
                color=color,
                label=key if index == 0 else None,
                alpha=0.8,
            )
    axis.axvline(15, linestyle="--", color="grey", linewidth=1)
    axis.text(14.9, len(MODES) - 0.7, "15 s target", fontsize=8, color="grey", ha="right")
    axis.legend(loc="lower right", fontsize=8)
    label_rows(axis, MODES, "seconds after the signal to the leader", "Operator failover, every repeat")
    return made


BENCHMARK = Benchmark.of(
    globals(),
    cases=lambda args: [{"mode": mode} for mode in MODES],
    measure=lambda failover, case, repeat, args: failover.measure(case["mode"], repeat, args.limit),
    setup=replicas,
    repeats=5,
    timed=False,
    limit=60.0,
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
