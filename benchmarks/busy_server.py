"""A busy API server (issue #49, item 3): a round of N agents and a steady-state job beside another tenant's flood,
with and without the chart's FlowSchema (``python -m benchmarks.busy_server``).

One control plane with kube-apiserver's in-flight limits lowered (``--max-requests-inflight`` and
``--max-mutating-requests-inflight``: together the server's concurrency, which API Priority and Fairness shares
out among its priority levels), so that APF queues and throttles on 2 cores. Three cases, every repeat:

- ``idle``: no flood, the baseline. The training ServiceAccount's requests go to the built-in ``workload-low``.
- ``flood``: another tenant (ServiceAccount ``flood/tenant``, allowed its own ConfigMaps only) sends LISTs and
  merge patches of its ConfigMaps from several processes of many threads, as fast as the server answers
  (``benchmarks/flood_worker.py``; a 429 is waited out as its ``Retry-After`` says). Both tenants are in
  ``workload-low``, one flow each.
- ``flood + FlowSchema``: the same, with the chart's PriorityLevelConfiguration and FlowSchema applied
  (``helm template --show-only templates/flowcontrol.yaml --set apiPriority.enabled=true``, for ``bench/trainer``).
- ``flood + FlowSchema, sized``: the same with the level sized for this server and N (``--sized-set``, by default
  ``apiPriority.nominalConcurrencyShares=100``: as many seats as ``workload-low``).

Each case: the flood alone first (its own latency without the job), then a round of N agents (threads in 8
processes, ``benchmarks/round_worker.py``, at the agents' lower priority) that then holds, heartbeating, as a
steady-state job. Measured: the round's seconds (and its ratio to the same repeat's idle round), its 429s per
agent, the steady state's agent requests and 429s, the flood's latency p50/p99 of its answered requests and its
share of 429s while alone, beside the round and beside the steady state, the priority level the API server names
for a request of the training account (``X-Kubernetes-PF-PriorityLevel-UID``), and every agent log line with the
words of an outage (a 429 is throttling, retried after its ``Retry-After``, never an outage).

Writes ``benchmarks/results/busy_server.json``, a section of ``docs/benchmarks.md`` and ``docs/busy-server.png``.
Usage: ``python -m benchmarks.busy_server [--sizes 1024] [--repeats 3]`` (``--quick``: N=8, one repeat).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.flood_worker import LEVEL_HEADER, LONGEST_RETRY_AFTER, credentials
from benchmarks.run import REPO, Bench, agent_env, go
from benchmarks.runner import Benchmark, figure, found, log, main, median, table_head, unique_legend

IDLE, FLOOD, WITH_SCHEMA, SIZED = "idle", "flood", "flood + FlowSchema", "flood + FlowSchema, sized"
#: The chart's ``--set`` values of the ``SIZED`` case (besides ``--chart-set``): the priority level sized for the
#: round and the steady state of N agents on this server (docs/configuration.md, "Sizing the priority level").
SIZED_SETS = ("apiPriority.nominalConcurrencyShares=100",)
#: The flood tenant: its namespace and ServiceAccount.
TENANT_NAMESPACE, TENANT = "flood", "tenant"
#: The training account the chart's FlowSchema is rendered for (``Bench``'s agents authenticate as it).
TRAINING_NAMESPACE, TRAINING_ACCOUNT = "bench", "trainer"
CHART = REPO / "charts" / "kube-rendezvous"
#: Words that would report a throttled request as an outage (agent log lines, error messages).
OUTAGE_WORDS = re.compile(r"unreachable|outage|could not be reached|no clear answer|unavailable", re.IGNORECASE)
#: Seconds of the flood before its own latency is measured (its threads started, its queues filled).
FLOOD_WARMUP = 3.0
#: The steady state's window starts this long after the round formed (``StateWatcher``'s warm-up) and ends this
#: long before the hold does.
STEADY_AFTER, STEADY_BEFORE = 10.0, 5.0
#: The issue's targets with the chart's FlowSchema: the round within 2x its idle time, the flood's p99 within 2x
#: of its own without the job.
TARGET_RATIO = 2.0


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None of nothing."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def window(records: list[list[Any]], start: float, end: float) -> dict[str, Any]:
    """The flood's requests sent in ``[start, end)`` (wall-clock): how many, answered per second, the latency p50
    and p99 (ms) of those answered (a 429 is not: it is answered at once, or after its queue wait), 429s and
    their share, and requests with no answer."""
    sent = [record for record in records if start <= record[0] < end]
    served = [record[1] for record in sent if record[2] not in (0, 429)]
    throttled = sum(1 for record in sent if record[2] == 429)
    seconds = max(1e-9, end - start)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 1)

    return {
        "seconds": round(seconds, 1),
        "requests": len(sent),
        "served_per_second": round(len(served) / seconds, 1),
        "p50_ms": ms(percentile(served, 0.5)),
        "p99_ms": ms(percentile(served, 0.99)),
        "throttled": throttled,
        "throttled_share": round(throttled / len(sent), 3) if sent else None,
        "no_answer": sum(1 for record in sent if record[2] == 0),
        "errors": sum(1 for record in sent if record[2] >= 400 and record[2] != 429),
    }


#: How an agent logs a 429's ``Retry-After`` (``ThrottledError``'s text).
RETRY_AFTER = re.compile(r"\(429 [^;)]*; Retry-After (\d+(?:\.\d+)?) s\)")


def retry_afters(log_file: Path) -> dict[str, int]:
    """How many 429s of each ``Retry-After`` (seconds, as text) the agents logged."""
    if not log_file.exists():
        return {}
    counts: dict[str, int] = {}
    for value in RETRY_AFTER.findall(log_file.read_text(errors="replace")):
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: float(item[0])))


def agent_log_of(workdir: Path, case: str, nodes: int, repeat: int) -> Path:
    """The file the agents of one case, N and repeat log to."""
    return workdir / f"agents-{case.replace(' ', '').replace('+', '-')}-{nodes}-{repeat}.log"


def outage_lines(log_file: Path) -> list[str]:
    """The lines of an agent log that report an outage (``OUTAGE_WORDS``)."""
    if not log_file.exists():
        return []
    return [line for line in log_file.read_text(errors="replace").splitlines() if OUTAGE_WORDS.search(line)]


# -- the flood tenant --------------------------------------------------------------------------------------------


def create_tenant(bench: Bench, objects: int) -> Path:
    """The flood tenant: namespace ``flood``, ServiceAccount ``tenant`` allowed to read and write the namespace's
    ConfigMaps only, and ``objects`` ConfigMaps of 1 KiB each; returns its kubeconfig."""
    plane = bench.plane
    plane.kubectl("create", "namespace", TENANT_NAMESPACE)
    verbs = "--verb=get,list,watch,create,update,patch,delete"
    plane.kubectl("-n", TENANT_NAMESPACE, "create", "role", "configmaps", verbs, "--resource=configmaps")
    plane.kubectl(
        *("-n", TENANT_NAMESPACE, "create", "rolebinding", "configmaps", "--role=configmaps"),
        f"--serviceaccount={TENANT_NAMESPACE}:{TENANT}",
    )
    maps = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"flood-{i}"}, "data": {"n": "x" * 1024}}
        for i in range(objects)
    ]
    plane.kubectl("-n", TENANT_NAMESPACE, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                                 "items": maps}))  # fmt: skip
    kubeconfig: Path = plane.serviceaccount_kubeconfig(TENANT_NAMESPACE, TENANT, expiration_seconds=86400)
    return kubeconfig


@dataclass
class Flood:
    """The tenant's flood: ``processes`` ``flood_worker`` processes of ``threads`` threads each, started with
    ``start`` and ended with ``stop``, which returns every request they sent (``[start, seconds, status, verb]``)
    and the priority levels the API server named for them."""

    kubeconfig: Path
    workdir: Path
    objects: int
    processes: int
    threads: int
    workers: list[subprocess.Popen[str]] = field(default_factory=list)
    outs: list[Path] = field(default_factory=list)
    started: float = 0.0

    def start(self) -> None:
        stamp = time.time_ns()
        self.outs = [self.workdir / f"flood-{stamp}-{index}.json" for index in range(self.processes)]
        self.workers = [
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "benchmarks.flood_worker", "--kubeconfig", str(self.kubeconfig)),
                    *("--namespace", TENANT_NAMESPACE, "--objects", str(self.objects)),
                    *("--threads", str(self.threads), "--worker", str(index), "--out", str(out)),
                ],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=agent_env(),
            )
            for index, out in enumerate(self.outs)
        ]
        go(self.workers, ready=True)
        self.started = time.time()

    def stop(self) -> tuple[list[list[Any]], list[str]]:
        for worker in self.workers:
            if worker.poll() is None:
                assert worker.stdin is not None
                worker.stdin.write("stop\n")
                worker.stdin.flush()
        for worker in self.workers:
            try:
                worker.wait(90)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        reports = [json.loads(out.read_text()) for out in self.outs if out.exists()]
        if len(reports) < len(self.outs):
            raise RuntimeError(f"{len(self.outs) - len(reports)} flood processes reported nothing")
        records = [record for report in reports for record in report["requests"]]
        levels = sorted({level for report in reports for level in report["levels"]})
        self.workers, self.outs = [], []
        return records, levels

    def kill(self) -> None:
        for worker in self.workers:
            worker.kill()


# -- the chart's FlowSchema --------------------------------------------------------------------------------------


def render_flow_control(workdir: Path, sets: list[str]) -> str:
    """The chart's PriorityLevelConfiguration and FlowSchema for ``bench/trainer``, as ``helm template`` renders
    them (``sets``: more ``--set`` values, e.g. another ``apiPriority.nominalConcurrencyShares``)."""
    from tests.testenv import ensure_binaries

    homes = {f"HELM_{kind}_HOME": str(workdir / "helm" / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
    values = ["apiPriority.enabled=true", f"trainingRBAC.serviceAccountName={TRAINING_ACCOUNT}", *sets]
    command = [
        *(str(ensure_binaries().helm), "template", "rdzv", str(CHART), "--namespace", TRAINING_NAMESPACE),
        *("--show-only", "templates/flowcontrol.yaml"),
        *(arg for value in values for arg in ("--set", value)),
    ]
    env = {**os.environ, **homes}
    rendered = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120, env=env)
    return rendered.stdout


@dataclass
class BusyServer:
    """The benchmark's environment: the control plane (``Bench``), the flood tenant's kubeconfig, the chart's
    rendered FlowSchema and whether it is applied."""

    bench: Bench
    tenant: Path
    #: The chart's rendered objects per case that applies them (``WITH_SCHEMA``, ``SIZED``).
    renders: dict[str, str]
    applied: str | None = None
    level_names: dict[str, str] = field(default_factory=dict)

    @property
    def flow_control(self) -> str:
        return self.renders[WITH_SCHEMA]

    def flow_schema(self, case: str | None) -> None:
        """Apply the chart's FlowSchema as rendered for ``case`` (None: delete it); return once a request of the
        training account is classified accordingly."""
        if case != self.applied:
            if case is None:
                self.bench.plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=self.flow_control)
            else:
                self.bench.plane.kubectl("apply", "-f", "-", input=self.renders[case])
            self.applied = case
        applied = case is not None
        from tests.testenv import wait_until

        wanted = self.chart_level()

        def classified() -> bool:
            level = self.level_of(self.bench.trainer)
            return (level == wanted) if applied else (level is not None and level != wanted)

        wait_until(classified, 60, f"the training account's requests {'in' if applied else 'out of'} {wanted}")

    def chart_level(self) -> str:
        """The name of the chart's priority level (the rendered PriorityLevelConfiguration's)."""
        found_name = re.search(r"kind: PriorityLevelConfiguration\nmetadata:\n  name: (\S+)", self.flow_control)
        assert found_name is not None, self.flow_control
        return found_name.group(1)

    def level_name(self, uid: str) -> str:
        """The name of the priority level of ``uid`` (the API server's ``X-Kubernetes-PF-PriorityLevel-UID``)."""
        if uid not in self.level_names:
            listed = json.loads(self.bench.plane.kubectl("get", "prioritylevelconfigurations", "-o", "json").stdout)
            self.level_names.update({item["metadata"]["uid"]: item["metadata"]["name"] for item in listed["items"]})
        return self.level_names.get(uid, uid)

    def level_of(self, kubeconfig: Path) -> str | None:
        """The priority level the API server names for one request made with ``kubeconfig`` (a list of Leases)."""
        import urllib3

        server, ca_file, token = credentials(str(kubeconfig))
        namespace = json.loads(kubeconfig.read_text())["contexts"][0]["context"]["namespace"]
        path = (
            "/api/v1/namespaces/{}/configmaps"
            if namespace == TENANT_NAMESPACE
            else "/apis/coordination.k8s.io/v1/namespaces/{}/leases"
        )
        response = urllib3.PoolManager(ca_certs=ca_file).request(
            "GET", server + path.format(namespace) + "?limit=1", headers={"Authorization": f"Bearer {token}"}
        )
        uid = response.headers.get(LEVEL_HEADER)
        return None if uid is None else self.level_name(uid)


def inflight_flags(args: argparse.Namespace) -> tuple[str, ...]:
    return (
        f"--max-requests-inflight={args.max_requests_inflight}",
        f"--max-mutating-requests-inflight={args.max_mutating_requests_inflight}",
    )


@contextmanager
def busy_server(workdir: Path, args: argparse.Namespace) -> Iterator[BusyServer]:
    """The control plane with the lowered in-flight limits, the flood tenant and the chart's rendered FlowSchema."""
    bench = Bench(workdir, apiserver_flags=inflight_flags(args))
    try:
        tenant = create_tenant(bench, args.flood_objects)
        renders = {
            WITH_SCHEMA: render_flow_control(workdir, args.chart_set),
            SIZED: render_flow_control(workdir, [*args.chart_set, *args.sized_set]),
        }
        yield BusyServer(bench, tenant, renders)
    finally:
        bench.stop()


setup = busy_server


# -- one case, once ----------------------------------------------------------------------------------------------


def measure(context: BusyServer, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    """One case once: the flood alone (unless idle), then a round of N that holds beside it."""
    label, nodes = case["case"], case["nodes"]
    bench = context.bench
    context.flow_schema(label if label in (WITH_SCHEMA, SIZED) else None)
    run: dict[str, Any] = {"trainer_level": context.level_of(bench.trainer)}
    flood = None
    if label != IDLE:
        flood = Flood(context.tenant, bench.workdir, args.flood_objects, args.flood_processes, args.flood_threads)
        log(f"  flood: {args.flood_processes} x {args.flood_threads} threads, alone for {args.flood_alone:.0f} s")
        flood.start()
        time.sleep(FLOOD_WARMUP + args.flood_alone)
    agent_log = agent_log_of(bench.workdir, label, nodes, repeat)
    try:
        log(f"  a round of {nodes} agents, then holding {args.hold:.0f} s")
        round_run = bench.round("k8s", nodes, hold=args.hold, limit=args.limit, agent_log=agent_log)
        ended = time.time()
    except RuntimeError as exc:  # what the agents logged says why: kept in the failure
        text = agent_log.read_text(errors="replace") if agent_log.exists() else ""
        expired = text.count("removing nodes whose Lease was not renewed")
        raise RuntimeError(
            f"{exc}; agent log: {len(outage_lines(agent_log))} outage lines, {text.count('(429 ')} 429s logged, "
            f"{expired} removals of nodes whose Lease expired, {text.count('round 0 formed')} agents saw round 0 "
            f"formed, Retry-After (s) x 429s logged: {retry_afters(agent_log)}"
        ) from exc
    finally:
        records, levels = flood.stop() if flood is not None else ([], [])
    formed = round_run["started"] + round_run["seconds"]
    run.update(
        seconds=round(round_run["seconds"], 2),
        requests_per_agent=round(round_run.get("requests_per_agent", 0.0), 2),
        throttled_per_agent=round(round_run.get("throttled_per_agent", 0.0), 3),
    )
    steady = round_run.get("steady")
    if steady:
        run["steady"] = {
            "agent_requests_per_second": steady.get("agent_requests_per_second"),
            "agent_throttled": steady.get("agent_throttled"),
            "lease_writes_per_second": steady.get("lease_writes_per_second"),
            "cpu_cores": steady.get("cpu_cores"),
        }
    if flood is not None:
        alone_start = flood.started + FLOOD_WARMUP
        run["flood_levels"] = [context.level_name(uid) for uid in levels]
        run["flood"] = {
            "alone": window(records, alone_start, alone_start + args.flood_alone),
            "round": window(records, round_run["started"], formed),
        }
        if args.hold > STEADY_AFTER + STEADY_BEFORE:
            run["flood"]["steady"] = window(
                records, formed + STEADY_AFTER, min(ended, formed + args.hold) - STEADY_BEFORE
            )
    outages = outage_lines(agent_log)
    run["agent_retry_after"] = retry_afters(agent_log)
    run["outage_lines"] = len(outages)
    if outages:
        run["outage_example"] = outages[0][:300]
    run["agent_log_lines"] = len(agent_log.read_text(errors="replace").splitlines()) if agent_log.exists() else 0
    return run


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [{"case": label, "nodes": nodes} for nodes in args.sizes for label in LABELS if label in args.cases]


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hold", type=float, default=40.0, help="seconds the formed round holds (steady state)")
    parser.add_argument("--max-requests-inflight", type=int, default=20, help="kube-apiserver's (default 400)")
    parser.add_argument("--max-mutating-requests-inflight", type=int, default=10, help="kube-apiserver's (default 200)")
    parser.add_argument("--flood-processes", type=int, default=2)
    parser.add_argument("--flood-threads", type=int, default=200, help="threads per flood process")
    parser.add_argument("--flood-objects", type=int, default=200, help="the tenant's ConfigMaps (1 KiB each)")
    parser.add_argument("--flood-alone", type=float, default=15.0, help="seconds of the flood alone, measured")
    parser.add_argument(
        "--chart-set", nargs="*", default=[], help="more --set values for the chart's FlowSchema (apiPriority.*)"
    )
    parser.add_argument("--sized-set", nargs="*", default=list(SIZED_SETS), help=f"the {SIZED!r} case's --set values")


# -- the report ---------------------------------------------------------------------------------------------------

TITLE = "A busy API server: another tenant's flood, with and without the chart's FlowSchema (issue #49)"
IMAGE = "busy server"
NOTES = """
How to read it, and how to size the FlowSchema. APF gives a priority level `ceil(C x S / T)` seats (C: the two
in-flight limits added, S: its `nominalConcurrencyShares`, T: every level's shares, 245 built in plus the chart's).
Here C = 30: `workload-low` has 13 seats without the FlowSchema, shared fairly by its flows (the flood is one, the
job another); with the chart's default S = 30 the job's level has 4 (T = 275; `workload-low` 11), half of them
lendable; the *sized* case's S = 100 gives it 9 (T = 345; `workload-low` 9 too). A level needs its steady state's
requests per second (the *steady* column) times the time one request holds a seat on that server, plus room for a
round's burst, in which each agent sends about 2-3 requests at once; and its queues must hold the burst: `handSize
x queueLengthLimit` of at least N (the chart's 8 x 128 = 1024), or the excess is answered 429. The *429s / agent*
column of the idle round is that limit: `workload-low` deals one flow 6 queues of 50, 300 requests, so 1024 agents
arriving at once are throttled even on an idle server; the server's `Retry-After` grows while it keeps rejecting (1
s, 2 s, then up to 32 s: the *Retry-After* column), every agent waits it out, and such an idle round takes over 60
s. The *idle* baseline of the ratios is that round (the case the issue names: no flood, no FlowSchema), so a ratio
below 1 says the FlowSchema's 1024-deep queues spared the round the 429s, not that the flood made it faster.
Requests here hold a seat far longer than on a server of its own (2 shared cores run the API server, etcd, 1024
agents and 400 flood threads), so the seats this table needs are an upper bound: size by the level's
`apiserver_flowcontrol_request_execution_seconds` and `apiserver_flowcontrol_current_inqueue_requests` on your
server (docs/configuration.md, "Sizing the priority level for N agents").
"""
LABELS = (IDLE, FLOOD, WITH_SCHEMA, SIZED)


def fields(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "sizes": args.sizes,
        "repeats": args.repeats,
        "argv": sys.argv[1:],
        "apiserver_flags": list(inflight_flags(args)),
        "flood": {
            "processes": args.flood_processes,
            "threads": args.flood_threads,
            "objects": args.flood_objects,
            "alone_seconds": args.flood_alone,
        },
        "hold": args.hold,
        "limit": args.limit,
        "chart_set": args.chart_set,
        "sized_set": args.sized_set,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def flood_ratio(run: dict[str, Any], during: str) -> float | None:
    """The flood's p99 beside the job (``during``: ``round`` or ``steady``) over its p99 alone, same repeat."""
    flood = run.get("flood", {})
    mine, alone = flood.get(during, {}).get("p99_ms"), flood.get("alone", {}).get("p99_ms")
    return mine / alone if mine and alone else None


def idle_ratio(report: dict[str, Any], run: dict[str, Any]) -> float | None:
    """The round's seconds over the same repeat's idle round (same N)."""
    idle = found(report["runs"], "seconds", case=IDLE, repeat=run.get("repeat"), nodes=run["nodes"])
    return run["seconds"] / idle[0] if idle and "seconds" in run else None


def section(report: dict[str, Any]) -> list[str]:
    flood = report["flood"]
    lines = [
        f"Measured {report['date']} on {report['machine']}, a **shared machine** (other work ran on its 2 CPUs: "
        "every figure is noisier and slower than on a machine of its own). Command: "
        f"`python -m benchmarks.busy_server {' '.join(report['argv'])}`. Raw: "
        "[benchmarks/results/busy_server.json](../benchmarks/results/busy_server.json).",
        "",
        f"One control plane with kube-apiserver `{' '.join(report['apiserver_flags'])}` (the defaults are 400 and "
        "200: together the concurrency API Priority and Fairness shares out among its priority levels). The flood: "
        f"ServiceAccount `flood/tenant`, {flood['processes']} processes x {flood['threads']} threads, each a loop of "
        f"a LIST of its {flood['objects']} ConfigMaps (1 KiB each) and a merge patch of one, a 429 waited out as its "
        f"`Retry-After` says (at most {LONGEST_RETRY_AFTER:.0f} s). Per case: the flood alone for "
        f"{flood['alone_seconds']:.0f} s, then a round of N agents "
        f"(threads in 8 processes, niceness 10) that holds {report['hold']:.0f} s (the steady state: the window "
        f"from {STEADY_AFTER:.0f} s after it formed to {STEADY_BEFORE:.0f} s before the hold ends). *level*: the "
        "priority level the API server names for a request of the training account. *flood p50/p99*: latency of "
        "its answered requests (ms), alone / beside the round / beside the steady state; *x alone*: p99 beside the "
        "job over p99 alone, same repeat. *outage lines*: agent log lines with the words of an outage.",
        "",
        *table_head(
            "N",
            "repeat",
            "case",
            "level",
            "round (s)",
            "/ idle",
            "429s / agent",
            "steady: agent req/s, 429s",
            "flood p50 (ms)",
            "flood p99 (ms)",
            "p99 x alone (round, steady)",
            "flood 429 share",
            "agents' 429s by Retry-After",
            "outage lines",
        ),
    ]
    for run in report["runs"]:
        head = f"| {run['nodes']} | {run.get('repeat', 0) + 1} | {run['case']} | {run.get('trainer_level', '-')}"
        if "failed" in run:
            lines.append(f"{head} | failed: {run['failed'][:400]} |" + " |" * 9)
            continue
        windows = [run.get("flood", {}).get(name, {}) for name in ("alone", "round", "steady")]
        steady = run.get("steady", {})
        rps = steady.get("agent_requests_per_second")
        steady_cell = "-" if rps is None else f"{rps:.0f}, {steady.get('agent_throttled', 0)}"
        share = " / ".join("-" if w.get("throttled_share") is None else f"{w['throttled_share']:.0%}" for w in windows)
        cells = [
            f"{run['seconds']:.2f}",
            _x(idle_ratio(report, run)) if run["case"] != IDLE else "1",
            f"{run['throttled_per_agent']:.2f}",
            steady_cell,
            " / ".join(_ms(w.get("p50_ms")) for w in windows) if run["case"] != IDLE else "-",
            " / ".join(_ms(w.get("p99_ms")) for w in windows) if run["case"] != IDLE else "-",
            f"{_x(flood_ratio(run, 'round'))}, {_x(flood_ratio(run, 'steady'))}" if run["case"] != IDLE else "-",
            share if run["case"] != IDLE else "-",
            ", ".join(f"{n} x {after} s" for after, n in run.get("agent_retry_after", {}).items()) or "none",
            str(run["outage_lines"]),
        ]
        lines.append(f"{head} | " + " | ".join(cells) + " |")
    lines += ["", *verdict(report)]
    return lines


def medians(report: dict[str, Any], runs: list[dict[str, Any]], label: str) -> tuple[Any, Any, Any, int]:
    """Of ``label``'s ``runs``: the median round over idle, flood p99 beside the round and beside the steady state
    over alone (None where nothing was measured), and how many repeats failed."""
    done = [run for run in runs if run["case"] == label and "failed" not in run]
    failed = sum(1 for run in runs if run["case"] == label and "failed" in run)
    rounds = median([r for r in (idle_ratio(report, run) for run in done) if r is not None])
    round_p99, steady_p99 = (
        median([r for r in (flood_ratio(run, during) for run in done) if r is not None])
        for during in ("round", "steady")
    )
    return rounds, round_p99, steady_p99, failed


def verdict(report: dict[str, Any]) -> list[str]:
    """The issue's targets, per case with a FlowSchema, from the medians over the repeats (a failed repeat: not met)."""
    lines = []
    for nodes in report["sizes"]:
        runs = [run for run in report["runs"] if run["nodes"] == nodes]
        said, met = [], []
        for label in (FLOOD, WITH_SCHEMA, SIZED):
            rounds, round_p99, steady_p99, failed = medians(report, runs, label)
            failures = f" ({failed} repeats failed)" if failed else ""
            said.append(
                f"*{label}*{failures}: the round took {_x(rounds)} its idle time, the flood's p99 was "
                f"{_x(round_p99)} its own alone beside the round and {_x(steady_p99)} beside the steady state"
            )
            within = all(value is not None and value <= TARGET_RATIO for value in (rounds, round_p99, steady_p99))
            if label != FLOOD:
                met.append(f"{'met' if within and not failed else '**not met**'} by *{label}*")
        outages = sum(run.get("outage_lines", 0) for run in runs)
        lines += [
            f"N={nodes}, medians over the repeats. {'; '.join(said)}. The targets (with the chart's FlowSchema, both "
            f"within 2x): {', '.join(met)}. Agent log lines reporting an outage: {outages} in {len(runs)} runs.",
            "",
        ]
    return lines


def plot(report: dict[str, Any]) -> Any:
    made, (left, right) = figure(11, 3.6, columns=2)
    for index, label in enumerate(LABELS):
        xs = found(report["runs"], "seconds", case=label)
        failed = [run for run in report["runs"] if run["case"] == label and "failed" in run]
        left.scatter(xs, [index] * len(xs), color="tab:blue", s=24, label="formed")
        left.scatter([report.get("limit", 240.0)] * len(failed), [index] * len(failed), color="black", marker="x", s=30,
                     label="did not form within the limit")  # fmt: skip
    unique_legend(left, fontsize=7)
    left.set_yticks(range(len(LABELS)), list(LABELS), fontsize=8)
    left.set_xscale("log")
    left.set_xlabel("seconds to form the round (every repeat)")
    left.set_title(f"A round of {', '.join(map(str, report['sizes']))} agents", fontsize=9)
    colors = {"alone": "tab:green", "round": "tab:red", "steady": "tab:orange"}
    flooded = LABELS[1:]
    for index, label in enumerate(flooded):
        for offset, (during, color) in enumerate(colors.items()):
            xs = [run["flood"][during]["p99_ms"] for run in report["runs"] if run["case"] == label
                  and run.get("flood", {}).get(during, {}).get("p99_ms") is not None]  # fmt: skip
            right.scatter(xs, [index + 0.15 * (offset - 1)] * len(xs), color=color, s=24, label=f"flood {during}")
    unique_legend(right, fontsize=7)
    right.set_yticks(range(len(flooded)), list(flooded), fontsize=8)
    right.set_xlabel("the flood's p99 latency (ms), every repeat")
    right.set_title(f"The other tenant ({report['date']})", fontsize=9)
    return made


BENCHMARK = Benchmark.of(
    globals(),
    labels=LABELS,
    sizes=[1024],
    limit=240.0,
    numbered=True,
    errors=(RuntimeError, AssertionError, TimeoutError),
    error_key="failed",
    timed=False,
    quick={"sizes": [8], "hold": 20.0, "flood_alone": 5.0},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
