"""The operator's memory with P pods in its watched namespace (``python -m benchmarks.operator_memory``).

On the project's control plane (real kube-apiserver and etcd, no kubelet), each case is a namespace of its own
with ``P`` pods (``--pods``; default 0, 1,000 and 10,000), of which ``RENDEZVOUS`` x ``MEMBERS`` (3 x 4) are
the training pods of 3 Rendezvous objects (labelled with their names) and the rest are other workloads' pods
(P = 0: those 12 only).
Pods are objects only: each is created with the labels, a container (env, resources, ports) and the projected
token volume of a Deployment's pod, then its status is patched to Running with a pod IP and container
statuses, as a kubelet would. The namespace is filled once, on the case's first repeat (a progress line every
1,000 pods), and kept for its other repeats.

Each repeat starts the real operator (``python -m kube_rendezvous_operator --namespace <it>``, its RBAC as
the chart's, ``tests.e2e.operator_process.OperatorProcess``) and measures:

- ``reconciled``: seconds from its start until it has observed each Rendezvous (its series appear in the
  operator's metrics) and ``indexed`` until its pod index holds the 12 training pods;
- the *churn*: every pod of the namespace gets a status patch (its Ready condition's time), so the pod watch
  delivers a MODIFIED event of every pod as a cluster's kubelets make it do;
- ``settled_mib``: the operator's resident memory (``VmRSS``) once it is quiet (``QUIET_SECONDS`` with less
  than ``QUIET_CPU`` of a CPU, more than Kopf's 5 s idle timeout of its per-pod workers after the last
  event), and ``peak_mib``: its high-water mark (``VmHWM``) over the whole repeat, list and churn included.

The baseline in the same run is P = 0 (the ratio of each P's median to it). Every repeat goes to
``benchmarks/results/operator_memory.json``, the table to ``docs/benchmarks.md`` (between the markers) and a
plot to ``docs/operator-memory.png``.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.run import GROUP, VERSION, Bench, control_plane, operator_kubeconfig
from benchmarks.runner import Benchmark, figure, found, log, main, median, ratio, shown, table_head, values

PODS = (0, 1000, 10000)
RENDEZVOUS, MEMBERS = 3, 4
#: Threads that create and patch pods (the API server shares the machine: more only queue).
THREADS = 8
#: The operator is settled after this many seconds with less than ``QUIET_CPU`` CPU seconds per second.
QUIET_SECONDS, QUIET_CPU = 10.0, 0.03
MIB = 1024 * 1024
TITLE, IMAGE = "Operator memory with P pods in its watched namespace (issue #48)", "operator memory"


def pod_ip(index: int) -> str:
    return f"10.{64 + index // 65536}.{index // 256 % 256}.{index % 256}"


def pod_body(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Deployment's pod as the API server stores it, before a kubelet: labels, one container with env,
    resources and a port."""
    env = [{"name": f"SETTING_{index}", "value": f"value-of-setting-{index}"} for index in range(8)]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    container = {
        "name": "app",
        "image": "registry.example.com/team/app:1.2.3",
        "args": ["--port", "8080", "--log-format", "json"],
        "env": env,
        "ports": [{"name": "http", "containerPort": 8080}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container]},
    }


def running_status(index: int, now: str) -> dict[str, Any]:
    """What a kubelet writes once the pod runs: phase, IPs, conditions and the container's status."""
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    container = {
        "name": "app",
        "ready": True,
        "started": True,
        "restartCount": 0,
        "image": "registry.example.com/team/app:1.2.3",
        "imageID": "registry.example.com/team/app@sha256:" + "0" * 64,
        "containerID": f"containerd://{index:064x}",
        "state": {"running": {"startedAt": now}},
    }
    return {
        "phase": "Running",
        "hostIP": f"172.16.{index // 110 // 256 % 256}.{index // 110 % 256}",
        "podIP": pod_ip(index),
        "podIPs": [{"ip": pod_ip(index)}],
        "startTime": now,
        "conditions": conditions,
        "containerStatuses": [container],
    }


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_labels(index: int, training: int) -> dict[str, str]:
    """Pod ``index``'s labels: the first ``training`` are the Rendezvous' (``MEMBERS`` each), the rest other apps'."""
    from kube_rendezvous import RENDEZVOUS_LABEL

    if index < training:
        return {RENDEZVOUS_LABEL: f"job-{index // MEMBERS}", "app.kubernetes.io/name": "trainer"}
    app = f"app-{index % 50}"
    return {
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/part-of": "shop",
        "pod-template-hash": f"{index % 50:010x}",
    }


def proc_status(pid: int, field: str) -> float:
    """``field`` (``VmRSS``, ``VmHWM``) of process ``pid``, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Namespaces:
    """The control plane, a namespace of P pods per case (filled once) and the operator's repeats on it."""

    def __init__(self, bench: Bench, workdir: Path) -> None:
        from kubernetes import client, config

        self.bench, self.workdir = bench, workdir
        configuration = client.Configuration()
        config.load_kube_config(str(bench.plane.admin_kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = THREADS
        self.core = client.CoreV1Api(client.ApiClient(configuration))
        self.kubeconfig = operator_kubeconfig(bench)
        self.filled: dict[int, str] = {}

    def namespace(self, pods: int) -> tuple[str, float | None]:
        """The namespace of ``pods`` pods, and the seconds it took to fill (None when it was filled before)."""
        if pods in self.filled:
            return self.filled[pods], None
        from tests.testenv import wait_until

        name = f"pods-{pods}"
        started = time.monotonic()
        self.bench.plane.kubectl("create", "namespace", name)
        wait_until(lambda: self.has_default_account(name), 60, f"the default ServiceAccount of {name}")
        for index in range(RENDEZVOUS):
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Rendezvous",
                "metadata": {"name": f"job-{index}"},
                "spec": {"minNodes": MEMBERS, "maxNodes": MEMBERS},
            }
            self.bench.objects.create_namespaced_custom_object(GROUP, VERSION, name, "rendezvouses", body)
        total = max(pods, RENDEZVOUS * MEMBERS)
        self.each_pod(name, total, lambda index: self.create_pod(name, index, RENDEZVOUS * MEMBERS), "created")
        self.filled[pods] = name
        return name, round(time.monotonic() - started, 1)

    def has_default_account(self, namespace: str) -> bool:
        return bool(self.core.list_namespaced_service_account(namespace, field_selector="metadata.name=default").items)

    def each_pod(self, namespace: str, total: int, action: Any, done: str) -> None:
        """``action(index)`` for every pod index below ``total``, in ``THREADS`` threads; a line every 1,000."""
        with ThreadPoolExecutor(THREADS) as pool:
            for count, _ in enumerate(pool.map(action, range(total)), start=1):
                if count % 1000 == 0 or count == total:
                    log(f"  {namespace}: {count}/{total} pods {done}")

    def create_pod(self, namespace: str, index: int, training: int) -> None:
        name = f"pod-{index:05}"
        self.core.create_namespaced_pod(namespace, pod_body(name, pod_labels(index, training)))
        self.core.patch_namespaced_pod_status(name, namespace, {"status": running_status(index, now_text())})

    def touch_pod(self, namespace: str, index: int, when: str) -> None:
        """A kubelet's status update: the Ready condition's time."""
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": when}
        self.core.patch_namespaced_pod_status(f"pod-{index:05}", namespace, {"status": {"conditions": [ready]}})

    def measure(self, pods: int, repeat: int, limit: float) -> dict[str, Any]:
        from tests.e2e.operator_process import OperatorProcess

        namespace, filled = self.namespace(pods)
        log_file = self.workdir / f"operator-{namespace}-{repeat}.log"
        started = time.monotonic()
        with OperatorProcess(self.kubeconfig, namespace, log_file) as operator:
            assert operator.process is not None
            pid = operator.process.pid
            seen = watch_reconciles(operator, namespace, started, limit)
            ready_mib = proc_status(pid, "VmRSS")
            churned = time.monotonic()
            self.each_pod(
                namespace,
                max(pods, RENDEZVOUS * MEMBERS),
                lambda i: self.touch_pod(namespace, i, now_text()),
                "patched",
            )
            churn = time.monotonic() - churned
            quiet = settle(pid, limit)
            run = {
                "peak_mib": round(proc_status(pid, "VmHWM"), 1),
                "settled_mib": round(proc_status(pid, "VmRSS"), 1),
                "ready_mib": round(ready_mib, 1),
                **seen,
                "churn_seconds": round(churn, 1),
                "settle_seconds": round(quiet, 1),
            }
        return {**run, **({"filled_seconds": filled} if filled is not None else {})}


def metrics_text(operator: Any) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def watch_reconciles(operator: Any, namespace: str, started: float, limit: float) -> dict[str, Any]:
    """Seconds from ``started`` until the operator observed each Rendezvous (``reconciled``, in order of
    name) and until its pod index held every training pod (``indexed``); polled every 0.1 s."""
    names = [f"job-{index}" for index in range(RENDEZVOUS)]
    reconciled: dict[str, float] = {}
    indexed = None
    deadline = started + limit
    while time.monotonic() < deadline and (indexed is None or len(reconciled) < len(names)):
        text = metrics_text(operator)
        now = round(time.monotonic() - started, 2)
        for name in names:
            pattern = rf'^kube_rendezvous_participants\{{[^}}]*name="{name}",namespace="{namespace}"'
            if name not in reconciled and re.search(pattern, text, re.MULTILINE):
                reconciled[name] = now
        count = re.search(r"^kube_rendezvous_operator_training_pods (\S+)", text, re.MULTILINE)
        if indexed is None and count is not None and float(count.group(1)) >= RENDEZVOUS * MEMBERS:
            indexed = now
        time.sleep(0.1)
    if indexed is None or len(reconciled) < len(names):
        raise TimeoutError(f"within {limit:.0f} s the operator observed {sorted(reconciled)}, indexed: {indexed}")
    return {"reconciled": [reconciled[name] for name in names], "indexed": indexed}


def settle(pid: int, limit: float) -> float:
    """Wait until process ``pid`` has used less than ``QUIET_CPU`` CPU seconds per second for ``QUIET_SECONDS``
    in a row (its per-pod workers idled out); the seconds it took."""
    started = time.monotonic()
    quiet_since, last = started, cpu_seconds(pid)
    while time.monotonic() - quiet_since < QUIET_SECONDS:
        if time.monotonic() - started > limit:
            raise TimeoutError(f"the operator was not quiet for {QUIET_SECONDS:.0f} s within {limit:.0f} s")
        time.sleep(1.0)
        now = cpu_seconds(pid)
        used, last = now - last, now
        if used > QUIET_CPU:
            quiet_since = time.monotonic()
    return time.monotonic() - started


@contextmanager
def namespaces(workdir: Path, args: argparse.Namespace) -> Iterator[Namespaces]:
    with control_plane(workdir) as bench:
        yield Namespaces(bench, workdir)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, nargs="+", default=list(PODS), help="pods P in the watched namespace")


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [{"pods": pods} for pods in args.pods]


def measure(context: Namespaces, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    return context.measure(case["pods"], repeat, args.limit)


def per_thousand(report: dict[str, Any], key: str) -> float | None:
    """MiB of ``key`` per 1,000 pods: the medians' slope from P = 0 to the largest P measured."""
    sizes = sorted({run["pods"] for run in report["runs"] if found(report["runs"], key, pods=run["pods"])})
    if len(sizes) < 2 or sizes[0] != 0:
        return None
    top, base = median(found(report["runs"], key, pods=sizes[-1])), median(found(report["runs"], key, pods=0))
    return None if top is None or base is None else (top - base) / (sizes[-1] / 1000)


INTRO = """
{stamp}, {repeats} repeats (`python -m benchmarks.operator_memory`): the control plane, the operator and this
script on one machine. A namespace of P pods (objects only, no kubelet: a Deployment pod's labels, container, env
and resources, status patched to Running), 12 of them the training pods of 3 Rendezvous (P = 0: those 12
only); the operator watches that namespace. *Peak*: its `VmHWM` over the repeat (its initial list, then a status
patch of every pod, which its watch gets as MODIFIED events); *settled*: its `VmRSS` after it had been quiet for
10 s. *Reconciled*: seconds from its start until it had observed all 3 Rendezvous (the slowest); *indexed*: until
its pod index held the 12 training pods. MiB, every repeat; the ratios compare medians with P = 0 of the same run.
"""


NOTES = """
How to read it. Kopf turns each pod of its initial list into an event for a worker of its own, which keeps the
pod's body until it ends, 5 s after the pod's last event: at the start every pod's body is in memory at once, so
the peak grows with P. After it, the operator holds Kopf's record of every pod it has seen (about 1 KB each, kept
until the pod is deleted), whole objects of the training pods only, and what the Python allocator did not hand
back to the system. Time to first reconcile does not grow with P: the Rendezvous have a watch of their own, and
the training pods are indexed from a LIST by their label. *Churn* is the wall time of the status patches (this
script's threads, through the shared API server), not the operator's.
"""


def section(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    sizes = sorted({run["pods"] for run in runs})
    lines = table_head(
        "pods P", "peak MiB", "settled MiB", "peak / P=0", "settled / P=0", "reconciled s", "indexed s", "churn s"
    )
    for pods in sizes:
        peak, settled = values(runs, "peak_mib", pods=pods), values(runs, "settled_mib", pods=pods)
        ratios = [ratio(found(runs, key, pods=pods), found(runs, key, pods=0)) for key in ("peak_mib", "settled_mib")]
        slowest = [max(seconds) for seconds in found(runs, "reconciled", pods=pods)]
        cells = [
            f"{pods:,}",
            shown(peak),
            shown(settled),
            *("-" if value is None else f"{value:.2f}x" for value in ratios),
            shown(slowest),
            shown(values(runs, "indexed", pods=pods)),
            shown(values(runs, "churn_seconds", pods=pods)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    filled = [f"{run['pods']:,} in {run['filled_seconds']:.0f} s" for run in runs if "filled_seconds" in run]
    lines += ["", f"Filling the namespaces (pods created and patched to Running, once per P): {', '.join(filled)}."]
    failed = [run for run in runs if "error" in run]
    lines += ["", *(f"P = {run['pods']:,}, repeat failed: {run['error']}" for run in failed)]
    slopes = {key: per_thousand(report, key) for key in ("peak_mib", "settled_mib")}
    base = median(found(runs, "peak_mib", pods=0))
    if base is not None and slopes["peak_mib"] is not None and slopes["settled_mib"] is not None:
        lines.append(
            f"Per 1,000 pods watched (medians, P = 0 to {sizes[-1]:,}): peak +{slopes['peak_mib']:.1f} MiB, "
            f"settled +{slopes['settled_mib']:.1f} MiB, on a peak of {base:.0f} MiB at P = 0."
        )
    return lines


def plot(report: dict[str, Any]) -> Any:
    made, (memory, seconds) = figure(10, 3.6, columns=2)
    styles = (("peak_mib", "o", "tab:red", "peak (VmHWM)"), ("settled_mib", "x", "tab:blue", "settled (VmRSS)"))
    for key, marker, color, label in styles:
        points = [(run["pods"], run[key]) for run in report["runs"] if key in run]
        memory.scatter([p for p, _ in points], [v for _, v in points], marker=marker, color=color, label=label)
    memory.set_xlabel("pods in the watched namespace")
    memory.set_ylabel("operator RSS (MiB)")
    memory.set_ylim(bottom=0)
    memory.legend(fontsize=8)
    memory.set_title(f"Operator memory, every repeat ({report['date']})", fontsize=9)
    points = [(run["pods"], max(run["reconciled"])) for run in report["runs"] if "reconciled" in run]
    seconds.scatter([p for p, _ in points], [v for _, v in points], color="tab:green", label="all 3 observed")
    points = [(run["pods"], run["indexed"]) for run in report["runs"] if "indexed" in run]
    seconds.scatter([p for p, _ in points], [v for _, v in points], marker="x", color="tab:grey", label="pods indexed")
    seconds.set_xlabel("pods in the watched namespace")
    seconds.set_ylabel("seconds after the operator started")
    seconds.set_ylim(bottom=0)
    seconds.legend(fontsize=8)
    seconds.set_title("Time to first reconcile, every repeat", fontsize=9)
    return made


BENCHMARK = Benchmark.of(
    globals(),
    setup=namespaces,
    limit=600.0,
    timed=True,
    quick={"pods": [0, 200]},
    fields=lambda args: {"pods": args.pods, "rendezvous": RENDEZVOUS, "members": MEMBERS},
    errors=(TimeoutError, AssertionError, RuntimeError),
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
