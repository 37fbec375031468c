"""Benchmarks on the real control plane, beside tensorplay's p10d/TCPStore backend in the same run.

Writes benchmarks/results/results.json, docs/benchmarks.md and docs/benchmarks.png.
Usage: python -m benchmarks.run [--sizes 8 32 128 512] [--repeats 3] [--steady-seconds 60]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import re
import select
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from benchmarks.report import new_report, save_report
from benchmarks.runner import log, quick_mode, repeated, writer_lease

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
GROUP, VERSION = "kube-rendezvous.io", "v1alpha1"


#: Niceness of the benchmark's agent processes (p10d's and ours alike). In a cluster the API
#: server, etcd, the operator and p10d's store host run on machines of their own; here they share
#: 2 cores with up to 1024 agents, which would otherwise starve them (measured: the operator's
#: one-Lease writes took 10-25 s at N=1024). 0 measures everything at one priority.
AGENT_NICE = int(os.environ.get("BENCH_AGENT_NICE", "10"))


def checkout(ref: str, into: Path) -> Path:
    """The library and operator of commit ``ref`` under ``into`` (``git archive``; no work tree of ours touched)."""
    archive = into / "previous.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", f"--output={archive}", ref, "backend", "operator"],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "previous", filter="data")
    return into / "previous"


def release_env(tree: Path) -> dict[str, str]:
    """The environment that runs the release ``checkout`` put in ``tree``: its library and operator first on
    ``PYTHONPATH``, for the agents and the operator alike."""
    return {"PYTHONPATH": f"{tree / 'backend'}{os.pathsep}{tree / 'operator'}"}


def agent_env() -> dict[str, str]:
    """The environment of a benchmark agent process: one BLAS thread, and ``AGENT_NICE`` (applied by the worker)."""
    return dict(os.environ, OMP_NUM_THREADS="1", BENCH_AGENT_NICE=str(AGENT_NICE))


def lower_priority() -> None:
    """Called first by a benchmark agent process: run at the niceness ``agent_env`` asked for."""
    os.nice(int(os.environ.get("BENCH_AGENT_NICE", "0")))


def round_worker(
    backend: str,
    endpoint: str,
    run_id: str,
    nodes: int,
    least: int,
    threads: int,
    out: Path,
    kubeconfig: Path,
    index: int,
    assign_ranks: str,
    extra: list[str],
    **popen: Any,
) -> subprocess.Popen[str]:
    """A ``benchmarks.round_worker`` process of ``threads`` handlers (its pipes: ``ready``, then ``go``)."""
    command = [
        *(sys.executable, "-m", "benchmarks.round_worker", "--backend", backend, "--endpoint", endpoint),
        *("--run-id", run_id, "--nodes", str(nodes), "--min-nodes", str(least), "--threads", str(threads)),
        *("--out", str(out), "--kubeconfig", str(kubeconfig), "--worker", str(index)),
        *("--assign-ranks", assign_ranks, *extra),
    ]
    return subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **popen)


def go(workers: list[subprocess.Popen[str]], ready: bool = False) -> None:
    """Tell every round worker to join (``ready``: first read each one's ``ready`` line)."""
    if ready:
        for worker in workers:
            assert worker.stdout is not None
            if worker.stdout.readline().strip() != "ready":
                raise RuntimeError("an agent process could not create its handlers")
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()


class Bench:
    """A control plane with the CRDs, namespace ``bench`` and its ``trainer`` ServiceAccount (docs/rbac.yaml), and
    rounds of agents on it. ``apiserver_flags``: extra kube-apiserver flags (``ControlPlane.apiserver_flags``)."""

    def __init__(self, workdir: Path, apiserver_flags: tuple[str, ...] = ()) -> None:
        from kubernetes import client, config

        from tests.testenv import ControlPlane

        self.plane = ControlPlane(workdir / "control-plane", apiserver_flags=apiserver_flags)
        self.plane.start()
        self.plane.kubectl("apply", "-f", str(REPO / "crds"))
        self.plane.kubectl("wait", "--for=condition=established", "crd", "--all", "--timeout=60s")
        self.plane.kubectl("create", "namespace", "bench")
        self.plane.kubectl("-n", "bench", "apply", "-f", str(REPO / "docs" / "rbac.yaml"))
        self.trainer = self.plane.serviceaccount_kubeconfig("bench", "trainer", expiration_seconds=86400)
        self.objects = client.CustomObjectsApi(config.new_client_from_config(str(self.plane.admin_kubeconfig)))
        self.workdir = workdir
        self.counter = 0
        #: The Rendezvous of the round being run (``round`` retires it afterwards).
        self.current: str | None = None
        self.hosts: list[subprocess.Popen[str]] = []

    def new_rendezvous(self, nodes: int) -> str:
        self.counter += 1
        name = self.current = f"bench-{nodes}-{self.counter}"
        self.objects.create_namespaced_custom_object(
            GROUP,
            VERSION,
            "bench",
            "rendezvouses",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Rendezvous",
                "metadata": {"name": name},
                "spec": {"minNodes": nodes, "maxNodes": nodes},
            },
        )
        return name

    def retire(self, name: str, timeout: float = 120.0) -> None:
        """Delete the Rendezvous ``name`` and wait until its Leases and keys are gone, so that the next
        round does not share the server with the operator expiring this round's exited agents."""
        from kubernetes import client

        try:
            self.objects.delete_namespaced_custom_object(GROUP, VERSION, "bench", "rendezvouses", name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        leases = client.CoordinationV1Api(self.objects.api_client)
        deadline = time.monotonic() + timeout
        selector = f"kube-rendezvous.io/rendezvous={name}"
        # One request each instead of waiting for the garbage collector to delete 1024 objects one by one
        # (it took over 120 s at N=1024 while the next round had started).
        leases.delete_collection_namespaced_lease("bench", label_selector=selector)
        self.objects.delete_collection_namespaced_custom_object(
            GROUP, VERSION, "bench", "rendezvouskeys", label_selector=selector
        )
        while time.monotonic() < deadline:
            left = len(leases.list_namespaced_lease("bench", label_selector=selector, limit=1).items)
            if not left:
                return
            time.sleep(1)
        log(f"the Leases of {name} were not all collected within {timeout:.0f} s; going on")

    def round(
        self,
        backend: str,
        nodes: int,
        hold: float = 0.0,
        limit: float = 900.0,
        during: Callable[[str], dict[str, Any]] | None = None,
        kill_joiner: bool = False,
        assign_ranks: str = "none",
        env: dict[str, str] | None = None,
        agent_log: Path | None = None,
    ) -> dict[str, Any]:
        """Run one round of ``nodes`` handlers over several processes; return timings and API stats.

        A k8s round's Rendezvous is retired afterwards (``retire``), so every round starts alone.
        ``kill_joiner``: chaos, one of the ``nodes`` agents runs alone in a process that is SIGKILLed
        the moment it logs its join request, so its request may or may not reach the API server.
        The round then admits ``nodes - 1`` to ``nodes`` (a 1 s last call), and every live agent
        must get a distinct rank of one world: no live join lost, no rank given twice.
        ``assign_ranks`` (``store`` or ``identical``): every agent then runs its framework's rank
        assignment (``round_worker.assign_ranks``); every worker must get its own global rank.
        ``env``: added to the agents' environment (a previous release on ``PYTHONPATH``).
        ``agent_log``: the handlers' own log lines (``BENCH_LOG``), every agent process', appended to this file.
        The summary's ``started`` is the wall-clock time (``time.time()``) the agents were told to join.
        """
        self.current = None
        try:
            return self._round(backend, nodes, hold, limit, during, kill_joiner, assign_ranks, env or {}, agent_log)
        finally:
            if self.current is not None:
                self.retire(self.current)

    def _round(
        self,
        backend: str,
        nodes: int,
        hold: float,
        limit: float,
        during: Callable[[str], dict[str, Any]] | None,
        kill_joiner: bool = False,
        assign_ranks: str = "none",
        extra_env: dict[str, str] | None = None,
        agent_log: Path | None = None,
    ) -> dict[str, Any]:
        from tests.testenv import free_port

        live = nodes - 1 if kill_joiner else nodes
        processes = min(live, 8)
        per_process = [live // processes + (1 if i < live % processes else 0) for i in range(processes)]
        least = nodes - 1 if kill_joiner else nodes
        env = {**agent_env(), **(extra_env or {})}
        if kill_joiner:
            env["BENCH_RDZV_CONF"] = json.dumps({"last_call_timeout": 1})
        if agent_log is not None:
            env["BENCH_LOG"] = "1"
        host: Any = None
        if backend in ("p10d", "torch-c10d"):
            # The TCPStore host lives in the driver, so that every handler is a client (BRIEF fact 11).
            port = free_port()
            host = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.store_host",
                    "--framework",
                    "tensorplay" if backend == "p10d" else "torch",
                    "--port",
                    str(port),
                ],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.hosts.append(host)  # killed by stop() if the round fails before it ends
            assert host.stdout is not None and host.stdout.readline().strip() == "ready"
            endpoint, run_id, name = f"127.0.0.1:{port}", f"bench-{self.counter}-{time.time_ns()}", None
        else:
            name = self.new_rendezvous(nodes)
            endpoint, run_id = f"bench/{name}", "none"
            if kill_joiner:
                self.objects.patch_namespaced_custom_object(
                    GROUP, VERSION, "bench", "rendezvouses", name, {"spec": {"minNodes": least}}
                )
        if backend == "torch-c10d":
            run_id = f"bench-{self.counter}-{time.time_ns()}"
        outs = [self.workdir / f"{backend}-{nodes}-{time.time_ns()}-{i}.json" for i in range(processes)]

        def start_worker(index: int, count: int, out: Path, **options: Any) -> subprocess.Popen[str]:
            return round_worker(
                backend, endpoint, run_id, nodes, least, count, out, self.trainer, index, assign_ranks,
                ["--hold", str(hold)], **options,
            )  # fmt: skip

        with agent_log.open("a") if agent_log is not None else contextlib.nullcontext() as log_file:
            workers = [
                start_worker(i, count, out, env=env, stderr=log_file)  # None: the driver's own stderr
                for i, (count, out) in enumerate(zip(per_process, outs, strict=True))
            ]
        victim = None
        if kill_joiner:  # logs on stderr (BENCH_LOG), read below to kill it at its join request
            victim_out = self.workdir / f"{backend}-{nodes}-{time.time_ns()}-victim.json"
            victim = start_worker(processes, 1, victim_out, env={**env, "BENCH_LOG": "1"}, stderr=subprocess.PIPE)
            workers.append(victim)
        ready_by = time.monotonic() + limit
        for worker in workers:
            assert worker.stdout is not None
            readable, _, _ = select.select([worker.stdout], [], [], max(0.0, ready_by - time.monotonic()))
            if not readable or worker.stdout.readline().strip() != "ready":
                for each in workers:
                    each.kill()
                raise RuntimeError(f"{backend}: {nodes} handlers could not even be created within {limit:.0f} s")
        watcher = StateWatcher(self, name, hold, [worker.pid for worker in workers]) if (name and hold) else None
        counter = WriteCounter(self, name) if name else None
        go(workers)
        chaos: dict[str, Any] = {}
        chaos_thread = None
        if during is not None and name is not None:  # chaos alongside the round (``scale.freeze_writer``)
            chaos_thread = threading.Thread(target=lambda: chaos.update(during(name)), daemon=True)
            chaos_thread.start()
        if victim is not None:
            chaos_thread = threading.Thread(target=lambda: chaos.update(kill_at_join_request(victim)), daemon=True)
            chaos_thread.start()
        deadline = time.monotonic() + limit + hold
        while any(not out.exists() for out in outs):
            if time.monotonic() > deadline or any(w.poll() not in (None, 0) for w in workers if w is not victim):
                for worker in workers:
                    worker.kill()
                raise RuntimeError(f"{backend} round of {nodes} did not complete within {limit:.0f} s")
            time.sleep(0.2)
        shared_writes = counter.stop() if counter else None
        steady = watcher.measure() if watcher else None
        for worker in workers:
            worker.wait(hold + 120)
        if chaos_thread is not None and victim is not None:
            chaos_thread.join(limit)
        reports = [json.loads(out.read_text()) for out in outs]
        if host is not None:
            host.communicate(timeout=30)  # closes its stdin: the store host exits
        results = [item for report in reports for item in report["results"]]
        errors = [item["error"] for item in results if "error" in item]
        if errors:
            raise RuntimeError(f"{backend} N={nodes}: {len(errors)} handlers failed, e.g. {errors[0]}")
        start = min(report["started"] for report in reports)
        seconds = max(report["started"] - start + item["seconds"] for report in reports for item in report["results"])
        ranks = sorted(item["rank"] for item in results)
        if victim is None:
            assert ranks == list(range(nodes)), f"ranks {ranks[:10]}..."
            worlds = sorted({item["world"] for item in results})
            assert worlds == [nodes], f"world sizes {worlds}: every agent must be told the one world of {nodes}"
        else:
            chaos["world"] = world_without_a_killed_joiner(results, nodes)
            chaos["victim_in_round"] = chaos["world"] == nodes
        api = [stats for report in reports for stats in report["api"]]
        summary: dict[str, Any] = {"backend": backend, "nodes": nodes, "seconds": seconds, "started": start}
        if api:
            for key in ("requests", "conflicts", "bytes_sent"):
                summary[f"{key}_per_agent"] = sum(item[key] for item in api) / nodes
            summary["throttled_per_agent"] = sum(item.get("throttled", 0) for item in api) / nodes  # 429s
        if shared_writes is not None:
            summary["shared_writes"] = shared_writes
        if chaos_thread is not None:
            chaos_thread.join(limit)
            summary["chaos"] = chaos
        backend_stats = [stats for report in reports for stats in report.get("backend", [])]
        for key in ("requests", "self_folds", "store_requests"):
            if backend_stats and key in backend_stats[0]:
                summary[f"{key}_total"] = sum(item.get(key, 0) for item in backend_stats)
        joined = [
            report["started"] - start + item["joined"]
            for report in reports
            for item in report["results"]
            if "joined" in item
        ]
        if assign_ranks != "none":  # when the last agent held its workers' ranks; the slowest assignment
            summary["train_seconds"] = max(
                report["started"] - start + item["trained"] for report in reports for item in report["results"]
            )
            summary["assign_seconds"] = max(item["assign"] for item in results)
            given = sorted(rank for item in results for rank in item["ranks"])
            assert given == list(range(len(given))) and len(given) == nodes * len(results[0]["ranks"]), given[:10]
        if joined:  # when the last agent saw the round formed; the rest of ``seconds`` is the store's step
            summary["joined_seconds"] = max(joined)
        rank0 = [item for item in results if item.get("rank") == 0 and "bootstrap" in item]
        if rank0:  # rank 0's bootstrap step: starting its TCPStore, then publishing the address
            summary["rank0_server_seconds"] = rank0[0]["bootstrap"]["server"]
            summary["rank0_address_seconds"] = rank0[0]["bootstrap"]["address"]
            for key in ("requests", "retries"):
                if key in rank0[0]["bootstrap"]:
                    summary[f"rank0_address_{key}"] = rank0[0]["bootstrap"][key]
        if steady:
            holds = [
                json.loads(Path(str(out) + ".hold").read_text()) for out in outs if Path(str(out) + ".hold").exists()
            ]
            if holds and api:
                after = sum(item["requests"] for hold_report in holds for item in hold_report["api"])
                steady["agent_requests_per_second"] = (after - sum(item["requests"] for item in api)) / hold
                throttled = sum(item.get("throttled", 0) for hold_report in holds for item in hold_report["api"])
                steady["agent_throttled"] = throttled - sum(item.get("throttled", 0) for item in api)
            summary["steady"] = steady
        return summary

    def cas_latency(self, nodes: int, samples: int = 40) -> float:
        """Median seconds of one successful compare-and-swap of an N-node state."""
        from kube_rendezvous import create_backend
        from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters

        name = self.new_rendezvous(nodes)
        backend, _ = create_backend(
            RendezvousParameters(
                backend="k8s",
                endpoint=f"bench/{name}",
                run_id="cas",
                min_nodes=nodes,
                max_nodes=nodes,
                config={"kubeconfig": str(self.trainer)},
            )
        )
        state = synthetic_state(nodes)
        result = backend.set_state(pickle.dumps(state))
        assert result is not None
        token = result[1]
        timings = []
        for _ in range(samples):
            state.last_heartbeats[next(iter(state.last_heartbeats))] = datetime.now(timezone.utc)
            began = time.perf_counter()
            written = backend.set_state(pickle.dumps(state), token)
            timings.append(time.perf_counter() - began)
            assert written is not None and written[2]
            token = written[1]
        return statistics.median(timings)

    def stop(self) -> None:
        for host in self.hosts:
            if host.poll() is None:
                host.kill()
        self.plane.stop()


def world_without_a_killed_joiner(results: list[dict[str, Any]], nodes: int) -> int:
    """The world size of a round of ``nodes`` agents whose one killed joiner reported nothing.

    Raises AssertionError unless the ``nodes - 1`` live agents share one world of ``nodes - 1`` (the
    victim's request never folded) or ``nodes`` (folded before it died), each with its own rank in it.
    """
    worlds = {item.get("world") for item in results}
    assert len(results) == nodes - 1, f"{len(results)} live agents reported, not {nodes - 1}"
    assert len(worlds) == 1 and worlds <= {nodes - 1, nodes}, f"live agents in worlds {sorted(map(str, worlds))}"
    world = int(next(iter(worlds)))  # type: ignore[arg-type]
    ranks = [item["rank"] for item in results]
    assert len(set(ranks)) == len(ranks), f"a rank given twice: {sorted(ranks)[:10]}..."
    assert set(ranks) <= set(range(world)), f"a rank outside 0..{world - 1}: {sorted(ranks)[-3:]}"
    return world


def kill_at_join_request(victim: subprocess.Popen[str], timeout: float = 120.0) -> dict[str, Any]:
    """SIGKILL ``victim`` (a round worker with ``BENCH_LOG``) the moment it logs its join request."""
    assert victim.stderr is not None
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        line = victim.stderr.readline()
        if not line:
            return {"error": "the victim exited before asking to join"}
        if "asks to join" in line:
            victim.kill()
            return {"killed_mid_join": True, "killed_after_seconds": time.monotonic() - began}
    victim.kill()
    return {"error": f"the victim did not ask to join within {timeout:.0f} s"}


def count_modified(
    list_call: Any,
    *args: Any,
    seconds: float,
    on_modified: Any,
    stop: Any = None,
    version: str | None = None,
    **kwargs: Any,
) -> float:
    """Watch ``list_call(*args, **kwargs)`` for ``seconds`` (or until ``stop`` is set); call
    ``on_modified(object)`` for every MODIFIED event; return the seconds watched.

    A watch is restarted from the last version seen when the server ends it, when it answers an
    ERROR event (such as "Too large resource version": the watch cache is behind the version a
    quorum list returned) or when the client raises; so a watch never silently stops counting.
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    began = time.monotonic()
    while True:
        left = seconds - (time.monotonic() - began)
        if left <= 0 or (stop is not None and stop.is_set()):
            return time.monotonic() - began
        options = dict(kwargs, timeout_seconds=int(max(1.0, min(left + 1, 30.0))))
        if version:
            options["resource_version"] = version
        try:
            for event in watch.Watch().stream(list_call, *args, **options):
                if event["type"] == "ERROR":
                    time.sleep(0.5)
                    break
                found = event["object"]
                # Custom objects come as dicts, built-in kinds (Leases) as models.
                version = (
                    found["metadata"]["resourceVersion"] if isinstance(found, dict) else found.metadata.resource_version
                )
                if event["type"] == "MODIFIED" and time.monotonic() - began <= seconds:
                    on_modified(event["object"])
                if time.monotonic() - began > seconds or (stop is not None and stop.is_set()):
                    break
        except ApiException as exc:
            if exc.status == 410:
                version = None  # compacted: start again from now
            time.sleep(0.5)


class WriteCounter:
    """Counts the writes to one Rendezvous object with a server-side watch, until ``stop``."""

    def __init__(self, bench: Bench, name: str) -> None:
        import threading

        self.writes = 0
        self._done = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bench, name), daemon=True)
        self._thread.start()
        self._ready.wait(30)

    def _run(self, bench: Bench, name: str) -> None:
        listed = bench.objects.list_namespaced_custom_object(
            GROUP, VERSION, "bench", "rendezvouses", field_selector=f"metadata.name={name}"
        )
        self._ready.set()

        def count(_: Any) -> None:
            self.writes += 1

        count_modified(
            bench.objects.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "bench",
            "rendezvouses",
            seconds=float("inf"),
            on_modified=count,
            stop=self._done,
            version=listed["metadata"]["resourceVersion"],
            field_selector=f"metadata.name={name}",
        )

    def stop(self) -> int:
        time.sleep(1.0)  # the last write's event
        self._done.set()
        self._thread.join(10)
        return self.writes


class StateWatcher:
    """Counts writes and bytes to one Rendezvous object, and CPU, over ``seconds``: the control plane's and, as
    ``agents``, the user + system time of the agent processes ``agents`` (pids; every thread of each)."""

    def __init__(self, bench: Bench, name: str, seconds: float, agents: list[int] | None = None) -> None:
        self.bench, self.name, self.seconds, self.agents = bench, name, seconds, agents or []

    def lease_writes(self, window: float) -> float:
        return _lease_writes(self.bench, self.name, window)

    def measure(self) -> dict[str, Any]:

        warmup = 10.0
        time.sleep(warmup)  # let the round's last writes and the first heartbeats settle
        pids = self.bench.plane.pids()
        processes = {name: [psutil.Process(pid)] for name, pid in pids.items() if name in ("kube-apiserver", "etcd")}
        if self.agents:
            processes["agents"] = [psutil.Process(pid) for pid in self.agents]
        cpu_before = {name: cpu_seconds(group) for name, group in processes.items()}
        window = self.seconds - warmup - 5
        import threading

        lease_rate: list[float] = []
        lease_thread = threading.Thread(target=lambda: lease_rate.append(self.lease_writes(window)), daemon=True)
        lease_thread.start()
        listed = self.bench.objects.list_namespaced_custom_object(
            GROUP, VERSION, "bench", "rendezvouses", field_selector=f"metadata.name={self.name}"
        )
        seen = {"writes": 0, "bytes": 0}

        def count(obj: dict[str, Any]) -> None:
            seen["writes"] += 1
            seen["bytes"] += len(json.dumps(obj.get("status", {})))

        elapsed = count_modified(
            self.bench.objects.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "bench",
            "rendezvouses",
            seconds=window,
            on_modified=count,
            version=listed["metadata"]["resourceVersion"],
            field_selector=f"metadata.name={self.name}",
        )
        writes, state_bytes = seen["writes"], seen["bytes"]
        cpu: dict[str, float | None] = {}
        for name, group in processes.items():
            try:
                cpu[name] = (cpu_seconds(group) - cpu_before[name]) / elapsed
            except psutil.NoSuchProcess:  # an agent process stopped holding before the window ended
                cpu[name] = None
        lease_thread.join(window + 30)
        leases = lease_rate[0] if lease_rate else None
        return {
            "seconds": elapsed,
            "lease_writes_per_second": leases,
            "writes_per_second": writes / elapsed,
            "status_bytes_per_second": state_bytes / elapsed,
            "cpu_cores": cpu,
        }


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU seconds of ``processes`` so far (all their threads)."""
    return sum(sum(process.cpu_times()[:2]) for process in processes)


def _lease_writes(bench: Bench, name: str, window: float) -> float:
    """Lease writes per second of one Rendezvous's node Leases, by a watch over ``window`` seconds."""
    from kubernetes import client, config

    coordination = client.CoordinationV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
    selector = f"kube-rendezvous.io/rendezvous={name},kube-rendezvous.io/lease=node"
    version = coordination.list_namespaced_lease("bench", label_selector=selector).metadata.resource_version
    writes = [0]

    def count(_: Any) -> None:
        writes[0] += 1

    elapsed = count_modified(
        coordination.list_namespaced_lease,
        "bench",
        seconds=window,
        on_modified=count,
        version=version,
        label_selector=selector,
    )
    return writes[0] / max(1e-9, elapsed)


def synthetic_state(nodes: int, name_length: int = 60) -> Any:
    from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    now = datetime.now(timezone.utc)
    for index in range(nodes):
        node = _NodeDesc(f"trainer-{index:05d}".ljust(name_length - 12, "x") + ".svc.local", 1000 + index, 0)
        state.participants[node] = index
        state.last_heartbeats[node] = now - timedelta(seconds=index % 5)
    state.complete = True
    state.round = 7
    return state


#: Python logging's default ``asctime`` at the start of a line, as tensorplay's agent and ours log.
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", re.MULTILINE)
#: tensorplay's agent logs these when it starts to re-rendezvous, when its round formed, and when it starts workers.
REJOINING, FORMED, STARTING = "Rendezvous'ing worker group", "Rendezvous complete", "Starting worker group"


def started(name: str) -> Bench:
    """A control plane in a new work folder (``kube-rendezvous-<name>-``), for a benchmark of several tables."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"kube-rendezvous-{name}-"))
    log(f"starting the control plane in {workdir}")
    return Bench(workdir)


@contextmanager
def control_plane(workdir: Path, args: object = None) -> Iterator[Bench]:
    """A benchmark's control plane (``Bench``), stopped on the way out: the ``setup`` of most benchmarks."""
    bench = Bench(workdir)
    try:
        yield bench
    finally:
        bench.stop()


def logged_times(text: str, marker: str) -> list[float]:
    """Wall-clock times (``time.time()``'s scale) of the lines of ``text`` that contain ``marker``."""
    times = []
    for line in text.splitlines():
        found = LOG_TIME.match(line)
        if found is not None and marker in line:
            stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")
            times.append(stamp.timestamp() + int(found.group(2)) / 1000)
    return times


def recovery_phases(outputs: list[str], killed_at: float, training_at: float) -> dict[str, float | None]:
    """Where a recovery's time went, in seconds after the kill, from the survivors' logs (``outputs``).

    ``detected``: every survivor had started to re-rendezvous; ``formed``: every survivor had its new
    round; ``training``: all trained again (``training_at``, polled). ``workers`` is ``training`` minus
    ``formed``: starting the workers of the new round, which no rendezvous backend changes. None when a
    survivor did not log the line.
    """

    def every(marker: str) -> float | None:
        firsts = [min((t for t in logged_times(text, marker) if t >= killed_at), default=None) for text in outputs]
        if not firsts or any(first is None for first in firsts):
            return None
        return max(first for first in firsts if first is not None) - killed_at

    detected, formed = every(REJOINING), every(FORMED)
    training = training_at - killed_at
    return {
        "detected": detected,
        "formed": formed,
        "training": training,
        "workers": None if formed is None else training - formed,
    }


#: Recovery through heartbeat expiry with the agent that folds (holds the writer Lease) as the victim.
WRITER_VICTIM = "k8s-heartbeat-expiry, writer killed"


def writer_holder(bench: Bench, rendezvous_name: str) -> str:
    """The identity holding the writer Lease of ``rendezvous_name``."""
    from kubernetes import client, config

    leases = client.CoordinationV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
    holder: str = leases.read_namespaced_lease(writer_lease(rendezvous_name), "bench").spec.holder_identity
    return holder


def recovery(
    bench: Bench,
    modes: tuple[str, ...] = ("p10d", "k8s-heartbeat-expiry", "k8s-operator-eviction"),
    agents: int = 3,
    details: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Seconds from SIGKILL of one of ``agents`` agents to the survivors training again.

    3 agents run 2 workers each; more agents run 1 each (so 32 agents are 64 processes, not 96).
    ``details``, when given, gets each mode's ``recovery_phases`` plus ``first_start``: seconds from
    the last agent starting its workers to all training, the first time (before the kill).
    ``env``: added to the agents' and the operator's environment (a previous release on ``PYTHONPATH``).
    """
    nproc = 2 if agents <= 3 else 1
    from tests.e2e.harness import ElasticJob, training_in_world
    from tests.testenv import free_port, wait_until

    out: dict[str, Any] = {}
    for mode in modes:
        workdir = bench.workdir / f"recovery-{mode}"
        conf = {"last_call_timeout": "1"}
        operator = None
        if mode == "p10d":
            job = ElasticJob(
                workdir,
                "p10d",
                f"127.0.0.1:{free_port()}",
                f"{agents - 1}:{agents}",
                rdzv_conf=conf,
                nproc_per_node=nproc,
                steps=40,
                step_seconds=0.5,
            )
        else:
            name = bench.new_rendezvous(agents)
            bench.objects.patch_namespaced_custom_object(
                GROUP, VERSION, "bench", "rendezvouses", name, {"spec": {"minNodes": agents - 1}}
            )
            job = ElasticJob(
                workdir,
                "k8s",
                f"bench/{name}",
                f"{agents - 1}:{agents}",
                rdzv_conf={**conf, "kubeconfig": str(bench.trainer)},
                nproc_per_node=nproc,
                steps=40,
                step_seconds=0.5,
            )
            if mode == "k8s-operator-eviction":
                operator = start_operator(bench, workdir, env)
                create_pods(bench, name, agents)
        addresses = [f"127.0.0.{31 + i}" for i in range(agents)]
        started = [job.start_agent(f"pod-{i}", local_addr=addresses[i], env=env) for i in range(agents)]
        try:
            by_group = wait_until(
                lambda started=started: training_in_world(started, agents * nproc),
                120 + 5 * agents,
                f"{agents} agents training",
            )
            # Never the p10d store host: that case does not recover at all (see the tests).
            victim = next(
                a for g, a in sorted(by_group.items()) if g != 0 and "hosts the rendezvous TCP store" not in a.output()
            )
            if mode == WRITER_VICTIM:  # the agent that holds the writer Lease: failover, then its expiry
                holder = writer_holder(bench, name)
                victim = next(
                    a for a, address in zip(started, addresses, strict=True) if holder.startswith(f"agent/{address}_")
                )
            # The workers' first start, for comparison with their restart: the last agent's
            # "Starting worker group" to all of them training.
            first_started = max(max(logged_times(agent.output(), STARTING), default=0.0) for agent in started)
            first_start = time.time() - first_started
            killed, killed_at = time.monotonic(), time.time()
            victim.kill_pod()
            if operator is not None:
                from kubernetes import client, config

                core = client.CoreV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
                core.delete_namespaced_pod(victim.name, "bench", grace_period_seconds=0)
            survivors = [a for a in started if a is not victim]
            wait_until(
                lambda survivors=survivors: training_in_world(survivors, (agents - 1) * nproc, min_step=0),
                120,
                "survivors training",
            )
            out[mode] = time.monotonic() - killed
            phases = recovery_phases([agent.output() for agent in survivors], killed_at, time.time())
            phases["first_start"] = first_start
            if details is not None:
                details[mode] = phases
            log(f"recovery {mode}: {out[mode]:.1f} s; {phases}")
        finally:
            job.stop()
            if operator is not None:
                operator.terminate()
                operator.wait(20)
            if mode == "k8s-operator-eviction":
                bench.plane.kubectl("-n", "bench", "delete", "pods", "--all", "--grace-period=0", check=False)
    return out


def operator_kubeconfig(bench: Bench) -> Path:
    """A kubeconfig of the operator's ServiceAccount in ``bench``, bound to docs/operator-rbac.yaml."""
    bench.plane.kubectl("apply", "-f", str(REPO / "docs" / "operator-rbac.yaml"), check=False)
    kubeconfig: Path = bench.plane.serviceaccount_kubeconfig("bench", "kube-rendezvous-operator")
    bench.plane.kubectl(
        "create",
        "clusterrolebinding",
        "bench-operator",
        "--clusterrole=kube-rendezvous-operator",
        "--serviceaccount=bench:kube-rendezvous-operator",
        check=False,
    )
    return kubeconfig


def start_operator(bench: Bench, workdir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The operator, healthy; ``env`` is added to its environment (a previous release on ``PYTHONPATH``)."""
    from tests.testenv import free_port, wait_until

    kubeconfig = operator_kubeconfig(bench)
    health = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kube_rendezvous_operator",
            "--namespace",
            "bench",
            "--log-format",
            "plain",
            "--metrics-port",
            str(free_port()),
            "--liveness",
            f"http://127.0.0.1:{health}/healthz",
        ],
        env={**os.environ, "KUBECONFIG": str(kubeconfig), **(env or {})},
        stdout=(workdir / "operator.log").open("wb"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    import urllib.request

    wait_until(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2).status == 200, 60, "operator"
    )
    return process


def create_pods(bench: Bench, name: str, count: int = 3) -> None:
    from kubernetes import client, config

    from tests.e2e.operator_process import create_training_pod

    core = client.CoreV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
    for index in range(count):
        create_training_pod(core, "bench", f"pod-{index}", name, f"127.0.0.{31 + index}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=[8, 32, 128, 512])
    parser.add_argument(
        "--backends",
        nargs="*",
        default=["p10d", "k8s", "torch-c10d", "torch-k8s"],
        help="tensorplay's p10d and k8s, torch's c10d and k8s (stock torchrun handlers)",
    )
    parser.add_argument("--keep-rounds", action="store_true", help="keep the rounds of the last results.json")
    parser.add_argument("--repeats", type=int, default=3, help="repeats for N <= 128 (N = 512 runs once)")
    parser.add_argument("--steady-sizes", type=int, nargs="*", default=[32])
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--skip-recovery", action="store_true")
    parser.add_argument("--round-limit", type=float, default=300.0, help="give up on one round after this (s)")
    quick_mode(parser, None, sizes=[8], backends=["p10d", "k8s"], repeats=1, steady_sizes=[], skip_recovery=True)
    args = parser.parse_args()
    bench, report = started("bench"), new_report(rounds=[])
    if args.keep_rounds and (RESULTS / "results.json").exists():
        report["rounds"] = json.loads((RESULTS / "results.json").read_text())["rounds"]
    try:
        for nodes in args.sizes:
            repeats = args.repeats if nodes <= 128 else 1
            cas = bench.cas_latency(nodes)
            log(f"N={nodes}: median CAS latency {cas * 1000:.1f} ms -> floor {nodes * cas:.2f} s")
            for backend in args.backends:
                one = partial(bench.round, backend, nodes, limit=args.round_limit)
                runs = repeated(f"N={nodes} {backend}", repeats, one, (RuntimeError,))
                done = [run for run in runs if "seconds" in run]
                entry: dict[str, Any] = {
                    "backend": backend,
                    "nodes": nodes,
                    "repeats": len(runs),
                    "cas_seconds": cas,
                    "floor_seconds": nodes * cas,
                }
                entry["runs_seconds"] = [run["seconds"] for run in done]
                if done:
                    entry["median_seconds"] = statistics.median(run["seconds"] for run in done)
                    for key in ("requests_per_agent", "conflicts_per_agent", "bytes_sent_per_agent"):
                        if key in done[0]:
                            entry[key] = statistics.median(run[key] for run in done)
                if len(done) < len(runs):
                    entry["failed"] = runs[-1]["failed"]
                report["rounds"].append(entry)
                save(report)
        report["steady"] = []
        for nodes in args.steady_sizes:
            log(f"steady state: {nodes} agents heartbeating for {args.steady_seconds:.0f} s")
            run = bench.round("k8s", nodes, hold=args.steady_seconds)
            report["steady"].append({"nodes": nodes, **run["steady"]})
            log(f"steady N={nodes}: {run['steady']}")
            save(report)
        if not args.skip_recovery:
            report["recovery"] = recovery(bench)
            save(report)
    finally:
        bench.stop()
        save(report)
    from benchmarks.report import write_report

    write_report(report)
    return 0


#: Save the report of ``python -m benchmarks.run`` (after every step).
save = partial(save_report, RESULTS / "results.json")


if __name__ == "__main__":
    sys.exit(main())
