"""Wake-up latency of KubernetesStore's blocking get: a process blocks in get(key), another sets it.

Latency = when the waiting process's get returned - when the setter's set() returned (one
machine, one clock). Prints median and p99 and writes benchmarks/results/store_wakeup.json.
Usage: python -m benchmarks.store_wakeup [--samples 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.runner import quick_mode

REPO = Path(__file__).resolve().parents[1]

WAITER = """
import json, sys, time
from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters
from kube_rendezvous import create_backend
_, store = create_backend(RendezvousParameters(backend="k8s", endpoint=sys.argv[1], run_id="wake", min_nodes=1,
                                               max_nodes=1, config={"kubeconfig": sys.argv[2]}))
for line in sys.stdin:
    key = line.strip()
    print("waiting", flush=True)
    store.get(key, timeout=60)
    print(json.dumps({"returned": time.time()}), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=100)
    quick_mode(parser, None, samples=5)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from kube_rendezvous import create_backend
    from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters

    from tests.testenv import ControlPlane

    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="kube-rendezvous-wakeup-")))
    plane.start()
    try:
        plane.kubectl("apply", "-f", str(REPO / "crds"))
        plane.kubectl("wait", "--for=condition=established", "crd", "--all", "--timeout=60s")
        plane.kubectl("create", "namespace", "wake")
        plane.kubectl("-n", "wake", "apply", "-f", str(REPO / "docs" / "rbac.yaml"))
        kubeconfig = str(plane.serviceaccount_kubeconfig("wake", "trainer"))
        _, store = create_backend(
            RendezvousParameters(
                backend="k8s",
                endpoint="wake/rdzv",
                run_id="wake",
                min_nodes=1,
                max_nodes=1,
                config={"kubeconfig": kubeconfig},
            )
        )
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, "wake/rdzv", kubeconfig],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert waiter.stdin is not None and waiter.stdout is not None
        latencies = []
        for sample in range(args.samples):
            key = f"key-{sample}"
            waiter.stdin.write(key + "\n")
            waiter.stdin.flush()
            assert waiter.stdout.readline().strip() == "waiting"
            time.sleep(0.2)  # let the waiter reach its watch
            store.set(key, "x")
            set_done = time.time()
            returned = json.loads(waiter.stdout.readline())["returned"]
            latencies.append(returned - set_done)
            if sample % 20 == 0:
                print(f"[wakeup] {sample}/{args.samples}: {latencies[-1] * 1000:.1f} ms", flush=True)
        waiter.stdin.close()
        waiter.wait(30)
    finally:
        plane.stop()
    latencies.sort()
    result = {
        "samples": len(latencies),
        "median_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000,
        "max_ms": latencies[-1] * 1000,
    }
    print(json.dumps(result))
    out = REPO / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "store_wakeup.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
