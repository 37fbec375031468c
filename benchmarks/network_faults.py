"""Faults at the packet level, every repeat (``python -m benchmarks.network_faults``): docs/reliability.md's table.

Runs ``tests/test_network.py`` ``--repeats`` times (each run starts its own control plane; each agent
"pod" has a network namespace of its own, faults are iptables DROPs inside it), plus the long
partition once more with ``NETWORK_PARTITION_SECONDS=300`` (``--long``, 5 min). Each test prints its
measurements (``measured: <what>: <seconds> s``); every one of every run goes to
``benchmarks/results/network_faults.json``, the table to docs/reliability.md (between the markers) and a
plot to ``docs/network-faults.png``. Needs root, iproute2 and iptables, as the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.report import new_report, save_report, splice

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs"
BEGIN, END = "<!-- network-faults:begin (python -m benchmarks.network_faults) -->", "<!-- network-faults:end -->"
MEASURED = re.compile(r"^measured: (.+): ([0-9.]+) s$", re.MULTILINE)
#: pytest -rA's summary lines (with -s a test's own output sits between its name and its outcome).
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR) (tests/test_network\.py::\S+)", re.MULTILINE)

#: What each test injects and what it checks was lost (the tests assert it).
FAULTS = {
    "test_survivors_train_again_when_a_survivor_was_silenced": (
        "half-open: a survivor's established connections to the API server DROPped (new ones work), "
        "before / during / after another pod's SIGKILL",
        "nothing: every survivor trains again (target: within expiry + 15 s, measured)",
    ),
    "test_a_partition_of_60_s_removes_the_node_after_one_expiry_and_it_rejoins_after_the_heal": (
        "partition: every packet between one pod and the API server DROPped, both ways, for 60 s (and 300 s)",
        "nothing: the node is removed after one expiry, rejoins after the heal; every rank once",
    ),
    "test_a_partition_shorter_than_the_expiry_restarts_nothing": (
        "partition for 10 s (less than the 15 s expiry)",
        "nothing: no restart, the round kept",
    ),
    "test_a_peer_partition_restarts_the_workers_and_training_goes_on": (
        "peer partition: one pod reaches the API server but no other pod, 20 s+ (process group timeout 20 s)",
        "the steps of the interrupted round (restarted); every all_reduce right",
    ),
    "test_every_pod_cut_off_from_the_api_server_for_30_s_trains_through_it": (
        "every pod cut off from the API server for 30 s (the server up)",
        "nothing: no restart, the round kept",
    ),
    "test_an_operator_whose_connections_go_silent_notices_keeps_evicting_and_removes_no_live_node": (
        "the operator (in a pod of its own) with its established connections DROPped",
        "nothing: no live node removed; the deleted pod's node evicted",
    ),
}


def run_once(extra_env: dict[str, str], selection: str | None) -> dict[str, Any]:
    """One pytest run of tests/test_network.py: every measurement and every test's outcome."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-v", "-rA", "tests/test_network.py"]
    if selection:
        command += ["-k", selection]
    began = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **extra_env}, capture_output=True, text=True)
    return {
        "seconds": round(time.monotonic() - began, 1),
        "env": extra_env,
        "measured": [{"what": what, "seconds": float(value)} for what, value in MEASURED.findall(done.stdout)],
        "returncode": done.returncode,
        "outcomes": {name.split("::")[1]: outcome for outcome, name in OUTCOME.findall(done.stdout)},
    }


def write_report(report: dict[str, Any]) -> None:
    values: dict[str, list[str]] = {}
    for run in report["runs"]:
        suffix = " (300 s partition)" if run["env"].get("NETWORK_PARTITION_SECONDS") == "300" else ""
        for item in run["measured"]:
            values.setdefault(item["what"] + suffix, []).append(f"{item['seconds']:.1f}")
    outcomes: dict[str, list[str]] = {}
    for run in report["runs"]:
        for name, outcome in run["outcomes"].items():
            outcomes.setdefault(name.split("[")[0], []).append(outcome)
    rows = [
        "## Faults at the packet level (issue #25)",
        "",
        f"Measured {report['date']} on {report['machine']} with `python -m benchmarks.network_faults --repeats "
        f"{report['repeats']}`: each agent pod in a network namespace of its own, three pods x 2 workers, "
        "`--nnodes=2:3`, last call 5 s, heartbeat expiry 15 s, no operator unless the fault is the operator's; "
        "faults are iptables DROP rules inside one pod's namespace (no RST, no ICMP).",
        "",
        "| fault | how it was injected | what was lost | test, every run |",
        "|---|---|---|---|",
    ]
    for name, (injected, lost) in FAULTS.items():
        rows.append(f"| `{name}` | {injected} | {lost} | {', '.join(outcomes.get(name, [])) or 'not recorded'} |")
    if any(name not in outcomes for name in FAULTS):
        rows += [
            "",
            "*not recorded*: the runs' parser read only the outcomes of tests that print nothing (with `-s`, a "
            "test's output sits between its name and its outcome); it reads pytest's `-rA` summary since. Each "
            "measurement is printed before the test's last assertions, so it alone does not prove a pass.",
        ]
    rows += ["", "| measurement | seconds, every repeat |", "|---|---|"]
    rows += [f"| {what} | {', '.join(found)} |" for what, found in values.items()]
    rows += ["", "![network faults](network-faults.png)"]
    page = DOCS / "reliability.md"
    splice(page, "\n".join(rows), BEGIN, END, at_end=True)
    plot(values)


def plot(values: dict[str, list[str]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 0.5 * len(values) + 1.2))
    for index, found in enumerate(values.values()):
        axis.scatter([float(value) for value in found], [index] * len(found), color="tab:blue", alpha=0.8)
    axis.set_yticks(range(len(values)), [what[:70] for what in values], fontsize=7)
    axis.set_xlabel("seconds, every repeat")
    axis.set_title("Faults at the packet level")
    figure.tight_layout()
    figure.savefig(DOCS / "network-faults.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long", action="store_true", help="also the 300 s partition, once")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and plot from the JSON")
    args = parser.parse_args()
    out = RESULTS / "network_faults.json"
    if args.report:
        write_report(json.loads(out.read_text()))
        return 0
    report = new_report(
        repeats=args.repeats,
        runs=[],
    )
    plan: list[tuple[dict[str, str], str | None]] = [({}, None)] * args.repeats
    if args.long:
        plan.append(({"NETWORK_PARTITION_SECONDS": "300"}, "partition_of_60_s"))
    for index, (env, selection) in enumerate(plan):
        print(f"[network-faults {time.strftime('%H:%M:%S')}] run {index + 1} of {len(plan)} {env}", flush=True)
        run = run_once(env, selection)
        print(f"   {run['outcomes']}\n   {run['measured']}", flush=True)
        report["runs"].append(run)
        save_report(out, report)
    write_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
