"""State size on the real API server: the typed document beside the first release's pickle, in one run.

    .venv/bin/python -m benchmarks.state_size [--sizes 8 128 1024 8192] [--repeats 5]

For each N it writes a realistic complete round through the backend, as a pod's
ServiceAccount, and measures what the API server holds and what the write sent:

- realistic nodes: ``trainer-0123.trainer-headless.team-a.svc.cluster.local``, heartbeats with
  microseconds spread over one keep-alive (5 s); PIDs either 1 (the agent is a pod's PID 1)
  or random in 1..4194304 (bare metal, the worst case for compression);
- ``status.state`` and the whole ``status`` as stored (JSON bytes), and the request body of the
  compare-and-swap write (bytes sent);
- the baseline in the same run: the first release's ``z1:`` text (base64 of zlib of the pickle)
  of the same state, computed in-process; the ratio is document / baseline;
- decode time of the document (what the operator and every agent pay per read), every repeat.

Writes benchmarks/results/state_size.json, docs/state-size.png and the "State size" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import random
import sys
import tempfile
import time
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from benchmarks.runner import backend_api, figure, log, quick_mode, save_figure

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs"
SECTION_BEGIN, SECTION_END = "<!-- state-size:begin -->", "<!-- state-size:end -->"
TARGETS = {"whole_status_1024": 16 * 1024, "whole_status_8192": 128 * 1024, "write_128": 4000}


def realistic_state(nodes: int, pids: str, seed: int = 0) -> Any:
    from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    rng = random.Random(seed)
    now = datetime.now(timezone.utc)
    state = _RendezvousState()
    members = [
        _NodeDesc(
            f"trainer-{index:04d}.trainer-headless.team-a.svc.cluster.local",
            1 if pids == "pid-1" else rng.randrange(1, 4194304),
            0,
        )
        for index in range(nodes)
    ]
    for rank, node in enumerate(sorted(members)):
        state.participants[node] = rank
        state.last_heartbeats[node] = now - timedelta(microseconds=rng.randrange(0, 5_000_000))
    state.complete = True
    state.round = 3
    return state


def measure(sizes: list[int], repeats: int) -> dict[str, Any]:
    from kube_rendezvous import create_backend, decode_document
    from kubernetes import client, config

    from tests.helpers import rendezvous_parameters
    from tests.testenv import ControlPlane

    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-state-size-"))
    log(f"starting the control plane in {workdir}")
    plane = ControlPlane(workdir / "control-plane")
    plane.start()
    rows = []
    try:
        plane.kubectl("apply", "-f", str(REPO / "crds"))
        plane.kubectl("wait", "--for=condition=established", "crd", "--all", "--timeout=60s")
        plane.kubectl("create", "namespace", "bench")
        plane.kubectl("-n", "bench", "apply", "-f", str(REPO / "docs" / "rbac.yaml"))
        trainer = plane.serviceaccount_kubeconfig("bench", "trainer")
        objects = client.CustomObjectsApi(config.new_client_from_config(str(plane.admin_kubeconfig)))
        for nodes in sizes:
            for pids in ("pid-1", "random-pids"):
                name = f"size-{nodes}-{pids}"
                backend, _ = create_backend(
                    rendezvous_parameters(f"bench/{name}", trainer, min_nodes=nodes, max_nodes=nodes)
                )
                state = realistic_state(nodes, pids)
                raw = pickle.dumps(state)
                api = backend_api(backend)
                sent_before = api.stats["bytes_sent"]
                written = backend.set_state(raw)
                assert written is not None and written[2]
                sent = api.stats["bytes_sent"] - sent_before
                stored = objects.get_namespaced_custom_object(
                    "kube-rendezvous.io", "v1alpha1", "bench", "rendezvouses", name
                )
                status = stored["status"]
                decode_seconds = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    decode_document(status["state"])
                    decode_seconds.append(time.perf_counter() - started)
                baseline = "z1:" + base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
                row = {
                    "nodes": nodes,
                    "pids": pids,
                    "state_bytes": len(status["state"]),
                    "whole_status_bytes": len(json.dumps(status, separators=(",", ":"))),
                    "write_request_bytes": sent,
                    "baseline_z1_pickle_bytes": len(baseline),
                    "ratio_to_baseline": len(status["state"]) / len(baseline),
                    "decode_seconds": decode_seconds,
                }
                rows.append(row)
                log(json.dumps(row))
    finally:
        plane.stop()
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": repeats, "rows": rows, "targets": TARGETS}


def section(report: dict[str, Any]) -> str:
    lines = [
        SECTION_BEGIN,
        "## State size (typed document) beside the first release's pickle",
        "",
        f"Measured {report['date']} with `python -m benchmarks.state_size` on the real API server: one complete",
        "round per row written by the backend as the pods' ServiceAccount; node names like",
        "`trainer-0123.trainer-headless.team-a.svc.cluster.local`, heartbeats with microseconds over 5 s.",
        "Baseline (same run, same state): the first release's `z1:` text, base64 of zlib of the pickle.",
        "Targets: whole status ≤ 16 KiB at 1024 nodes and ≤ 128 KiB at 8192; a state write at 128 nodes ≤ 4 KB.",
        "Raw numbers: [benchmarks/results/state_size.json](../benchmarks/results/state_size.json).",
        "![state size](state-size.png)",
        "",
        "| N | PIDs | status.state B | whole status B | write request B | baseline z1 pickle B | document / baseline "
        f"| decode ms ({report['repeats']} repeats) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        decodes = ", ".join(f"{seconds * 1000:.1f}" for seconds in row["decode_seconds"])
        lines.append(
            f"| {row['nodes']} | {row['pids']} | {row['state_bytes']} | {row['whole_status_bytes']} "
            f"| {row['write_request_bytes']} | {row['baseline_z1_pickle_bytes']} | {row['ratio_to_baseline']:.2f} "
            f"| {decodes} |"
        )
    verdicts = []
    for row in report["rows"]:
        if row["nodes"] in (1024, 8192):
            limit = TARGETS[f"whole_status_{row['nodes']}"]
            size = row["whole_status_bytes"]
        elif row["nodes"] == 128:
            limit, size = TARGETS["write_128"], row["write_request_bytes"]
        else:
            continue
        verdict = "met" if size <= limit else f"missed by {size - limit} B ({100 * (size - limit) / limit:.1f} %)"
        verdicts.append(f"N={row['nodes']} {row['pids']}: {size} B of {limit} B, {verdict}")
    lines += ["", "Targets: " + "; ".join(verdicts) + "."]
    lines += [
        "",
        "Random PIDs cost about 4 bytes per node that compression cannot remove; in a pod the agent is",
        "PID 1. The summary beside the document lists counts and the first 16 nodes only. Each write also",
        "carries up to 8 write ids (about 90 B once the list is full; the table's single write carries one).",
        SECTION_END,
    ]
    return "\n".join(lines)


def plot(report: dict[str, Any]) -> None:
    made, axis = figure(7, 4.5)
    for pids, color in (("pid-1", "tab:blue"), ("random-pids", "tab:orange")):
        rows = [row for row in report["rows"] if row["pids"] == pids]
        nodes = [row["nodes"] for row in rows]
        for key, style, label in (
            ("state_bytes", "-o", "status.state, document"),
            ("baseline_z1_pickle_bytes", ":o", "status.state, first release's pickle"),
            ("whole_status_bytes", "--s", "whole status, document"),
        ):
            axis.plot(nodes, [row[key] / 1024 for row in rows], style, color=color, label=f"{label} ({pids})")
    axis.scatter([1024, 8192], [16, 128], marker="x", color="red", zorder=5, label="targets")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("nodes")
    axis.set_ylabel("KiB")
    axis.set_title("Rendezvous status size: typed document vs first release's pickle")
    axis.legend(fontsize=8)
    save_figure(made, DOCS / "state-size.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[8, 128, 1024, 8192])
    parser.add_argument("--repeats", type=int, default=5, help="decode-time repeats per row")
    quick_mode(parser, None, sizes=[8, 128], repeats=1)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from benchmarks.report import splice

    report = measure(args.sizes, args.repeats)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "state_size.json").write_text(json.dumps(report, indent=2) + "\n")
    text = section(report)
    (DOCS / "state-size.md").write_text(text + "\n")
    inner = text.removeprefix(SECTION_BEGIN).removesuffix(SECTION_END)  # splice writes the markers itself
    splice(DOCS / "benchmarks.md", inner, SECTION_BEGIN, SECTION_END, at_end=True)
    plot(report)
    log("wrote benchmarks/results/state_size.json, docs/state-size.png and docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
