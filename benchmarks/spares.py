"""Hot spares: from a member's loss to a spare promoted and every agent holding its new ranks
(``python -m benchmarks.spares``).

An elastic job (``--nnodes=N-8:N``, the default 30 s last call, 2 workers per agent,
``TORCH_ELASTIC_WORKER_IDENTICAL=1``) runs with the operator, which knows the job's pods (played: no
kubelet), as ``recovery_at_scale``'s ``pod deleted`` mode. Its round of N forms; then one member, the
victim (alone in its own process), is SIGKILLed and its pod deleted. The survivors run the launcher's
monitor loop and re-rendezvous when their round lost a member (``round_worker --recover``). Modes, in
turn within every repeat:

- ``one spare``: N+1 agents. The N members are threads in 8 processes plus the victim; the spare,
  alone in a tenth process, starts once the round of N has formed, so it lands on the state's
  redundancy list (``status.spareCount`` 1). On the victim's eviction the operator's fold opens the
  next round with the survivors (the carry rule) and takes the spare in the same fold: the round is
  full (N) at once.
- ``no spare`` (the baseline): N agents, the same failure; the round re-forms with N-1 (the
  operator's pods rule, or the last call).

Seconds after the failure, from a watch of the Rendezvous in the driver (the server's side):
*eviction* (the victim's eviction landed: named in ``status.evictedNodes``, or out of the state),
*folded* (the first state without the victim: the fold that applied the eviction), *re-formed* (a
later round is complete; its size), *promoted* (the spare is a participant of that complete round;
*promoted* equal to *folded* means the spare was taken in the eviction fold itself). From the agents
(each phase the slowest's): *detected* (a survivor's ``num_nodes_waiting`` turned positive),
*formed* (its ``next_rendezvous`` returned), *spare formed* (the spare's ``next_rendezvous``
returned), *ranks* (the slowest rank assignment), *held* (every survivor and the promoted spare held
its new ranks). *ratio*: *held* of ``one spare`` over ``no spare``'s, repeat by repeat, and their
median. The issue's target: a spare promoted within 3 s of the loss at N=1024.

Writes ``benchmarks/results/spares.json``, a table in ``docs/benchmarks.md`` (between the markers)
and ``docs/spares.png``. Not measured: starting the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.recovery_at_scale import PROCESSES, RECOVER_SECONDS, create_pods, start_job, start_worker, wait_for
from benchmarks.round_worker import agent_address
from benchmarks.run import GROUP, VERSION, Bench, control_plane, count_modified, go, start_operator
from benchmarks.runner import AT_SCALE, Benchmark, arguments, figure, log, main, marker_handles

SPARE, BASELINE = "one spare", "no spare"
MODES = (SPARE, BASELINE)
#: The issue's target: a spare promoted within this many seconds of the loss (at N=1024).
TARGET_SECONDS = 3.0
#: Phases from the agents and from the watch, as the table and the log show them.
PHASES = ("evicted", "removed", "reformed", "promoted", "detected", "formed", "spare_formed", "ranks", "held")


def _named(nodes: Any, addr: str) -> bool:
    """Whether ``nodes`` (node names ``addr_pid_localid``) name a node of address ``addr``."""
    return any(str(node).startswith(f"{addr}_") for node in nodes or [])


class Milestones:
    """When the Rendezvous's status first showed each step of a recovery (pure: fed objects and times).

    ``observe`` takes every version of the object after the failure, in order; ``times`` holds, for each
    step, the first time it was seen: ``evicted`` (the victim named in ``status.evictedNodes`` or out of
    the participants: the eviction landed), ``removed`` (the victim out of the state's round: the fold
    that applied the eviction), ``reformed`` (a round after ``first_round`` complete; ``size`` its participants,
    ``completed_by`` its rule) and, with a spare, ``promoted`` (that round has the spare in it).
    """

    def __init__(self, first_round: int, victim: str, spare: str | None) -> None:
        self.first_round, self.victim, self.spare = first_round, victim, spare
        self.times: dict[str, float] = {}
        self.size: int | None = None
        self.round: int | None = None
        self.completed_by: str | None = None

    def observe(self, status: dict[str, Any], at: float) -> None:
        from kube_rendezvous import decode_document

        document = decode_document(status["state"]) if status.get("state") else None
        members = [] if document is None else [node.addr for node in document.participants]
        gone = document is not None and (document.round > self.first_round or self.victim not in members)
        if gone or _named(status.get("evictedNodes"), self.victim):
            self.times.setdefault("evicted", at)
        if gone:
            self.times.setdefault("removed", at)
        if document is None or not document.complete or document.closed or document.round <= self.first_round:
            return
        if "reformed" not in self.times:
            self.times["reformed"] = at
            self.size, self.round = len(document.participants), document.round
            rounds = [item for item in status.get("recentRounds") or [] if isinstance(item, dict)]
            self.completed_by = next(
                (str(item.get("completedBy")) for item in reversed(rounds) if item.get("round") == document.round),
                None,
            )
        if self.spare is not None and self.spare in members:
            self.times.setdefault("promoted", at)


class StatusWatch:
    """``Milestones`` of one Rendezvous, fed by a watch in a thread from the version current when it starts."""

    def __init__(self, bench: Bench, name: str, milestones: Milestones) -> None:
        self.milestones = milestones
        self._lock = threading.Lock()
        self._stop = threading.Event()
        listed: Any = bench.objects.list_namespaced_custom_object(
            GROUP, VERSION, "bench", "rendezvouses", field_selector=f"metadata.name={name}"
        )

        def seen(obj: dict[str, Any]) -> None:
            at = time.time()
            with self._lock:
                self.milestones.observe(obj.get("status") or {}, at)

        self._thread = threading.Thread(
            target=count_modified,
            args=(bench.objects.list_namespaced_custom_object, GROUP, VERSION, "bench", "rendezvouses"),
            kwargs={
                "seconds": float("inf"),
                "on_modified": seen,
                "stop": self._stop,
                "version": listed["metadata"]["resourceVersion"],
                "field_selector": f"metadata.name={name}",
            },
            daemon=True,  # ends at its next event or watch timeout after ``stop``
        )
        self._thread.start()

    def stop(self) -> Milestones:
        if not self._stop.is_set():
            time.sleep(1.0)  # the last write's event
            self._stop.set()
        with self._lock:
            return self.milestones


def summarize(runs: list[dict[str, Any]], nodes: int, framework: str) -> dict[str, Any]:
    """The spare's effect at ``nodes`` (pure): ``held`` of ``one spare`` over ``no spare``, repeat by repeat
    (``per_repeat``, None where either failed) and the median of those (``median``); the medians of both;
    the spare's ``promoted`` times, how many were within ``TARGET_SECONDS``, and how many were promoted in the
    fold that applied the eviction (``in_eviction_fold``: promoted seen in the same version as removed)."""

    def of(mode: str) -> dict[int, dict[str, Any]]:
        return {
            int(r["repeat"]): r
            for r in runs
            if r["nodes"] == nodes and r["framework"] == framework and r["mode"] == mode and "failed" not in r
        }

    spare, base = of(SPARE), of(BASELINE)
    repeats = sorted({int(r["repeat"]) for r in runs if r["nodes"] == nodes and r["framework"] == framework})
    per_repeat = [
        spare[i]["held"] / base[i]["held"] if i in spare and i in base and base[i]["held"] > 0 else None
        for i in repeats
    ]
    ratios = [ratio for ratio in per_repeat if ratio is not None]
    promoted = [spare[i].get("promoted") for i in repeats if i in spare]
    return {
        "per_repeat": per_repeat,
        "median": statistics.median(ratios) if ratios else None,
        "held_spare": statistics.median(r["held"] for r in spare.values()) if spare else None,
        "held_no_spare": statistics.median(r["held"] for r in base.values()) if base else None,
        "promoted": promoted,
        "within_target": sum(1 for seconds in promoted if seconds is not None and seconds <= TARGET_SECONDS),
        "in_eviction_fold": sum(
            1 for r in spare.values() if r.get("promoted") is not None and r.get("promoted") == r.get("removed")
        ),
    }


def _status(bench: Bench, name: str) -> dict[str, Any]:
    found: Any = bench.objects.get_namespaced_custom_object(GROUP, VERSION, "bench", "rendezvouses", name)
    return dict(found.get("status") or {})


def _seen(milestones: Milestones, failed_at: float) -> str:
    """What the Rendezvous showed after the failure, for an error message."""
    seen = ", ".join(f"{key} {at - failed_at:.2f} s" for key, at in milestones.times.items()) or "no step"
    return f"state: {seen}; next round {milestones.round} of {milestones.size}, completed by {milestones.completed_by}"


def one_run(bench: Bench, backend: str, nodes: int, spares: int) -> dict[str, Any]:
    """One failure with ``spares`` (0 or 1) spare agents; the phases in seconds after the failure."""
    from kube_rendezvous import decode_document
    from kubernetes import client, config

    from tests.testenv import wait_until

    label = SPARE if spares else BASELINE
    core = client.CoreV1Api(config.new_client_from_config(str(bench.plane.admin_kubeconfig)))
    name = bench.new_rendezvous(nodes)
    bench.objects.patch_namespaced_custom_object(
        GROUP, VERSION, "bench", "rendezvouses", name, {"spec": {"minNodes": nodes - 8}}
    )
    log(f"  {label}: {nodes + spares} pods for {name}")
    create_pods(bench, name, nodes + spares)
    # A fresh operator per run: another run's cleanup (1024 pods gone) must not queue ahead of this one.
    operator = start_operator(bench, bench.workdir / f"operator-{name}")
    survivors = nodes - 1
    victim_addr, spare_addr = agent_address(survivors), agent_address(nodes) if spares else None
    workers, victim, outs = start_job(bench, backend, name, nodes, "spares", PROCESSES + 2)
    everyone = [*workers, victim]
    spare: subprocess.Popen[str] | None = None
    watch: StatusWatch | None = None
    try:
        log(f"  {label}: {nodes} agents form their round")
        began = time.monotonic()
        go(everyone, ready=True)
        wait_for(outs[: PROCESSES + 1], 300, f"the first round of {nodes}", everyone)
        first = [item for out in outs[: PROCESSES + 1] for item in json.loads(out.read_text())["results"]]
        errors = [item["error"] for item in first if "error" in item]
        if errors or sorted(item["rank"] for item in first) != list(range(nodes)):
            raise RuntimeError(f"the first round of {nodes} was not whole: {errors[:1]}")
        log(f"  {label}: the round of {nodes} formed in {time.monotonic() - began:.1f} s")
        if spares:
            spare = start_worker(bench, backend, name, nodes, PROCESSES + 1, 1, nodes, outs[-1])
            everyone.append(spare)
            go([spare], ready=True)

            def spare_waits() -> bool:
                state = _status(bench, name).get("state")
                document = decode_document(state) if state else None
                return document is not None and any(node.addr == spare_addr for node in document.redundancy_list)

            wait_until(spare_waits, 120, "the spare on the redundancy list")
            log(f"  {label}: the spare {spare_addr} is on the redundancy list (status.spareCount 1)")
            if outs[-1].exists():
                raise RuntimeError("the spare's next_rendezvous returned before any member was lost")
        wait_until(
            lambda: str(_status(bench, name).get("lastWriter")).startswith("operator/"),
            60,
            "the operator writing the Rendezvous",
        )
        time.sleep(2)  # the job trains: the first round's writes and bootstrap are over
        state = _status(bench, name)["state"]
        first_round = decode_document(state).round
        watch = StatusWatch(bench, name, Milestones(first_round, victim_addr, spare_addr))
        log(f"  {label}: SIGKILL of member {victim_addr} and deletion of its pod")
        failed_at = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        core.delete_namespaced_pod(f"pod-{survivors}", "bench", grace_period_seconds=0)
        recovered = [Path(f"{out}.recovered") for out in outs[:PROCESSES]]
        waited = [*recovered, *([outs[-1]] if spares else [])]
        watched = [*workers, *([spare] if spare is not None else [])]
        try:
            wait_for(waited, RECOVER_SECONDS + 30, f"{label}: agents holding new ranks", watched)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc} ({_seen(watch.stop(), failed_at)})") from exc
        milestones = watch.stop()
        reports = [json.loads(path.read_text()) for path in recovered]
        results = [item for report in reports for item in report["results"]]
        errors = [item.get("error", "no restart") for item in results if "trained" not in item]
        if errors:
            raise RuntimeError(f"{label}: {len(errors)} survivors did not hold new ranks, e.g. {errors[0]}")
        early = [item["detected"] for item in results if item["detected"] < failed_at]
        if early:
            raise RuntimeError(f"{label}: {len(early)} survivors restarted before the failure")
        held = [item["trained"] for item in results]
        given = [rank for item in results for rank in item["ranks"]]
        worlds = {item["world"] for item in results}
        run: dict[str, Any] = {}
        if spares:
            report = json.loads(outs[-1].read_text())
            item = report["results"][0]
            if "trained" not in item:
                raise RuntimeError(f"{label}: the spare did not hold ranks: {item.get('error')}")
            run["spare_formed"] = report["started"] + item["seconds"] - failed_at
            run["spare_held"] = report["started"] + item["trained"] - failed_at
            held.append(report["started"] + item["trained"])
            given += item["ranks"]
            worlds.add(item["world"])
        world = nodes if spares else survivors
        seen = _seen(milestones, failed_at)
        if milestones.size != world:
            raise RuntimeError(f"{label}: the state's new round has {milestones.size} members, not {world} ({seen})")
        if spares and "promoted" not in milestones.times:
            raise RuntimeError(f"{label}: the state never showed the spare in a complete round ({seen})")
        if worlds != {world} or sorted(given) != list(range(2 * world)):
            raise RuntimeError(
                f"{label}: worlds {sorted(worlds)}, ranks {sorted(given)[:6]}...: not one world of {world} ({seen})"
            )
        ranks = [item["trained"] - item["formed"] for item in results]
        if spares:
            ranks.append(run["spare_held"] - run["spare_formed"])
        run.update(
            {
                "size": milestones.size,
                "completed_by": milestones.completed_by,
                **{key: at - failed_at for key, at in milestones.times.items()},
                "detected": max(item["detected"] for item in results) - failed_at,
                "formed": max(item["formed"] for item in results) - failed_at,
                "ranks": max(ranks),
                "held": max(held) - failed_at,
                "survivors_held": max(item["trained"] for item in results) - failed_at,
                # API requests of the survivors' handlers from their first round to holding new ranks: Lease renewals
                # included, and (one spare) the longer wait before the failure while the spare joins
                "requests_per_survivor": sum(report["requests"] for report in reports) / survivors,
            }
        )
        return run
    finally:
        if watch is not None:
            watch.stop()
        for worker in everyone:
            worker.kill()
            worker.wait(30)
        operator.terminate()
        operator.wait(30)
        # The next run starts alone: its Leases are left to the garbage collector after 30 s.
        bench.retire(name, timeout=30)
        core.delete_collection_namespaced_pod("bench", grace_period_seconds=0, _request_timeout=120)


def _cells(runs: list[dict[str, Any]], key: str) -> str:
    return ", ".join("-" if r.get(key) is None else f"{r[key]:.2f}" for r in runs) or "-"


TITLE, IMAGE = "Hot spares: a member lost, a spare promoted", "hot spares"


INTRO = f"""
{{stamp}} with {{command}}: one control plane, the operator running and knowing the job's pods (played: no kubelet),
an elastic job of N agents (`--nnodes=N-8:N`, the default 30 s last call) as threads in 8 processes, the victim
alone in a ninth, 2 workers per agent with `TORCH_ELASTIC_WORKER_IDENTICAL=1`. The victim, a member of the round of
N, is SIGKILLed and its pod deleted. *one spare*: one more agent (a tenth process) started once the round formed, so
it waits on the redundancy list; *no spare*: the job as it was, in the same run, repeats in turn. Seconds after the
failure. From a watch of the Rendezvous: *eviction* (the eviction landed), *folded* (the first state without the
victim: the fold that applied the eviction), *re-formed* (the next round complete; *size*: its members), *promoted*
(the spare a member of it). From the agents, each the slowest: *detected* (a survivor's `num_nodes_waiting` turned
positive), *formed* (its `next_rendezvous` returned), *spare formed* (the spare's did), *ranks* (rank assignment),
*held* (every survivor and the promoted spare held new ranks). *ratio*: *held* with a spare over *held* without,
repeat by repeat; *median* of those. The issue's target: a spare promoted within {TARGET_SECONDS:.0f} s of the loss
at N=1024. Every repeat, in order. Starting the workers is not included.
"""


def section(report: dict[str, Any]) -> list[str]:
    rows = [
        "| N | framework | mode | eviction | folded | re-formed | size | promoted | detected | formed "
        "| spare formed | ranks | held | ratio | median | completed by |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    targets = []
    for nodes in report["sizes"]:
        for framework in report["frameworks"]:
            summary = summarize(report["runs"], nodes, framework)
            for mode in MODES:
                chosen = [
                    r for r in report["runs"] if (r["nodes"], r["framework"], r["mode"]) == (nodes, framework, mode)
                ]
                if not chosen:
                    continue
                done = [r for r in chosen if "failed" not in r]
                cells = [
                    _cells(done, "evicted"),
                    _cells(done, "removed"),
                    _cells(done, "reformed"),
                    ", ".join(str(r.get("size")) for r in done) or "-",
                    _cells(done, "promoted") if mode == SPARE else "-",
                    *(_cells(done, key) for key in ("detected", "formed")),
                    _cells(done, "spare_formed") if mode == SPARE else "-",
                    _cells(done, "ranks"),
                    _cells(done, "held"),
                ]
                failed = [r for r in chosen if "failed" in r]
                if failed:
                    cells[-1] = (cells[-1] + "; " if done else "") + f"failed: {failed[0]['failed'][:80]}"
                ratio, median = "-", "-"
                if mode == SPARE:
                    ratio = ", ".join("-" if x is None else f"{x:.2f}" for x in summary["per_repeat"]) or "-"
                    median = "-" if summary["median"] is None else f"{summary['median']:.2f}"
                completed = ", ".join(sorted({str(r.get("completed_by")) for r in done})) or "-"
                rows.append(
                    f"| {nodes} | {framework} | {mode} | {' | '.join(cells)} | {ratio} | {median} | {completed} |"
                )
            promoted = [seconds for seconds in summary["promoted"] if seconds is not None]
            if promoted:
                targets.append(
                    f"- N={nodes} ({framework}): spare promoted {', '.join(f'{s:.2f}' for s in promoted)} s after "
                    f"the loss; within {TARGET_SECONDS:.0f} s in {summary['within_target']} of {len(promoted)}; "
                    f"in the fold that applied the eviction in {summary['in_eviction_fold']} of {len(promoted)}."
                )
    rows += ["", *targets]
    return rows


def plot(report: dict[str, Any]) -> Any:
    from matplotlib.lines import Line2D

    sizes = report["sizes"]
    made, axes = figure(4.5 * len(sizes) + 1.5, 3.2, columns=len(sizes))
    repeats = max(1, int(report["repeats"]))
    markers = {
        "evicted": ("tab:red", "|"),
        "reformed": ("tab:blue", "|"),
        "promoted": ("tab:purple", "^"),
        "held": ("tab:green", "o"),
    }
    for axis, nodes in zip(axes, sizes, strict=True):
        labels: list[str] = []
        for framework in report["frameworks"]:
            for mode in MODES:
                index = len(labels)
                labels.append(f"{framework}: {mode}" if len(report["frameworks"]) > 1 else mode)
                for r in report["runs"]:
                    if (r["nodes"], r["framework"], r["mode"]) != (nodes, framework, mode):
                        continue
                    row = index + (int(r.get("repeat", 0)) - (repeats - 1) / 2) * 0.5 / repeats  # repeats apart
                    if "failed" in r:
                        axis.scatter(0, row, color="black", marker="x")
                        continue
                    for key, (color, marker) in markers.items():
                        if r.get(key) is not None:
                            axis.scatter(r[key], row, color=color, marker=marker, s=60 if marker == "|" else 20)
        axis.axvline(TARGET_SECONDS, color="grey", linestyle=":", linewidth=1)
        axis.set_yticks(range(len(labels)), labels if axis is axes[0] else [""] * len(labels), fontsize=8)
        axis.set_ylim(-0.6, len(labels) - 0.4)
        axis.set_title(f"N={nodes}")
        axis.set_xlabel("seconds after the failure")
    handles = marker_handles(markers)
    handles.append(Line2D([], [], color="grey", linestyle=":", label=f"target {TARGET_SECONDS:.0f} s"))
    axes[-1].legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    made.suptitle("Hot spares: a member lost, every repeat (x: failed)")
    return made


def measure(context: tuple[Bench, set[str]], case: dict[str, Any], repeat: int, args: Any) -> dict[str, Any]:
    """``one_run`` of the case's mode, logged (the spare's promotion against the target on a line of its own)."""
    bench, failed = context
    backend = "k8s" if case["framework"] == "tensorplay" else "torch-k8s"
    mode = case["mode"]
    try:
        run = one_run(bench, backend, case["nodes"], 1 if mode == SPARE else 0)
    except (RuntimeError, AssertionError, TimeoutError):
        failed.add(mode)
        raise
    phases = ", ".join(f"{key} {run[key]:.2f}" for key in PHASES if run.get(key) is not None)
    log(f"  {phases}, new round of {run['size']}, completed by {run['completed_by']}")
    if mode == SPARE:
        promoted = float(run["promoted"])
        verdict = "within" if promoted <= TARGET_SECONDS else "NOT within"
        fold = "in the eviction fold" if run.get("removed") == promoted else "NOT in the eviction fold"
        log(f"  SPARE PROMOTED {promoted:.2f} s after the loss ({verdict} the {TARGET_SECONDS:.0f} s target; {fold})")
    return run


@contextmanager
def plane(workdir: Path, args: argparse.Namespace) -> Iterator[tuple[Bench, set[str]]]:
    """The control plane; its and the agents' logs kept where asked or where a run failed."""
    if min(args.sizes) < 9:
        raise SystemExit("--sizes: at least 9 (the job is --nnodes=N-8:N)")
    failed: set[str] = set()
    with control_plane(workdir) as bench:
        yield bench, failed
    if args.keep_workdir or failed:
        log(f"logs kept in {workdir} (agents.log, operator-*/operator.log); delete it when done")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def schedule(args: argparse.Namespace) -> list[tuple[int, dict[str, Any]]]:
    """Per size and framework, every repeat runs both modes in turn (the machine's load weighs on both alike)."""
    return [
        (repeat, {"nodes": nodes, "framework": framework, "mode": mode})
        for nodes in args.sizes
        for framework in args.frameworks
        for repeat in range(args.repeats)
        for mode in MODES
    ]


def finish(report: dict[str, Any]) -> None:
    """The spare's effect per size and framework, in the JSON and in the log."""
    report["summaries"] = []
    for nodes in report["sizes"]:
        for framework in report["frameworks"]:
            summary = summarize(report["runs"], nodes, framework)
            report["summaries"].append({"nodes": nodes, "framework": framework, **summary})
            ratios = ", ".join("-" if x is None else f"{x:.2f}" for x in summary["per_repeat"])
            median = "-" if summary["median"] is None else f"{summary['median']:.2f}"
            log(f"{framework} N={nodes}: held with a spare / without, per repeat: {ratios}; median {median}")
            log(
                f"{framework} N={nodes}: spare promoted "
                + ", ".join("-" if s is None else f"{s:.2f}" for s in summary["promoted"])
                + f" s after the loss; within {TARGET_SECONDS:.0f} s in {summary['within_target']} "
                f"of {len(summary['promoted'])}; in the eviction fold in {summary['in_eviction_fold']}"
            )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-workdir", action="store_true", help="keep the control plane's and agents' logs")


BENCHMARK = Benchmark.of(
    globals(),
    setup=plane,
    sizes=[1024],
    frameworks=["tensorplay"],
    fields=arguments("sizes", "repeats", "frameworks"),
    **AT_SCALE,
    numbered=True,
    dated=True,
    quick={"sizes": [16]},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
