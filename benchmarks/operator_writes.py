"""The operator's writes per minute to a busy Rendezvous (N agents heartbeating, operator running).

Counts every change of the object over the window (a watch), the agents' own state writes
(``status.lastWriter`` set by each write), and the operator's writes (its metric); prints and
writes benchmarks/results/operator_writes.json.
Usage: python -m benchmarks.operator_writes [--nodes 16] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.runner import quick_mode

REPO = Path(__file__).resolve().parents[1]


def operator_writes(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("kube_rendezvous_operator_writes_total{"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    quick_mode(parser, None, nodes=4, seconds=10.0)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import threading

    from kubernetes import watch

    from benchmarks.run import GROUP, VERSION, Bench, log, start_operator

    bench = Bench(Path(tempfile.mkdtemp(prefix="kube-rendezvous-opwrites-")))
    try:
        operator = start_operator(bench, bench.workdir / "operator")
        metrics_port = int(operator.args[operator.args.index("--metrics-port") + 1])  # type: ignore[union-attr]
        name = f"bench-{args.nodes}-{bench.counter + 1}"
        counts = {"changes": 0, "state_writes": 0}
        stop = threading.Event()

        def count() -> None:
            last_state = None
            for event in watch.Watch().stream(
                bench.objects.list_namespaced_custom_object,
                GROUP,
                VERSION,
                "bench",
                "rendezvouses",
                timeout_seconds=int(args.seconds) + 200,
            ):
                if stop.is_set():
                    return
                if event["object"]["metadata"]["name"] != name or event["type"] != "MODIFIED":
                    continue
                if window_open.is_set():
                    counts["changes"] += 1
                    state = event["object"].get("status", {}).get("state")
                    if state != last_state:
                        counts["state_writes"] += 1
                last_state = event["object"].get("status", {}).get("state")

        window_open = threading.Event()
        watcher = threading.Thread(target=count, daemon=True)
        watcher.start()
        result_box: dict[str, object] = {}
        runner = threading.Thread(
            target=lambda: result_box.update(bench.round("k8s", args.nodes, hold=args.seconds + 20))
        )
        runner.start()
        time.sleep(15)  # the round forms; heartbeats start
        before = operator_writes(metrics_port)
        window_open.set()
        time.sleep(args.seconds)
        window_open.clear()
        after = operator_writes(metrics_port)
        stop.set()
        runner.join()
        minutes = args.seconds / 60
        result = {
            "nodes": args.nodes,
            "seconds": args.seconds,
            "object_changes_per_minute": counts["changes"] / minutes,
            "agent_state_writes_per_minute": counts["state_writes"] / minutes,
            "operator_writes_per_minute": (after - before) / minutes,
            "other_writes_per_minute": (counts["changes"] - counts["state_writes"]) / minutes,
        }
        log(json.dumps(result))
        (REPO / "benchmarks" / "results" / "operator_writes.json").write_text(json.dumps(result, indent=2))
        operator.terminate()
    finally:
        bench.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
