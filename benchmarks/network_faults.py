"""Faults at the packet level, every repeat (``python -m benchmarks.network_faults``): docs/reliability.md's table.

Runs ``tests/test_network.py`` ``--repeats`` times (each run starts its own control plane; each agent
"pod" has a network namespace of its own, faults are iptables DROPs inside it), plus the long
partition once more with ``NETWORK_PARTITION_SECONDS=300`` (``--long``, 5 min). Each test prints its
measurements (``measured: <what>: <seconds> s``); every one of every run goes to
``benchmarks/results/network_faults.json``, the table to docs/reliability.md (between the markers) and a
plot to ``docs/network-faults.png``. Needs root, iproute2 and iptables, as the tests do.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

from benchmarks.runner import REPO, Benchmark, figure, label_rows, main, stamp

TITLE, IMAGE = "Faults at the packet level (issue #25)", "network faults"
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


#: The long partition, run once more with ``--long``: its environment and its test.
LONG = {"NETWORK_PARTITION_SECONDS": "300"}
LONG_TEST = "partition_of_60_s"


def run_once(extra_env: dict[str, str]) -> dict[str, Any]:
    """One pytest run of tests/test_network.py (only the long partition's test with ``LONG``): every measurement
    and every test's outcome."""
    selection = LONG_TEST if extra_env == LONG else None
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-v", "-rA", "tests/test_network.py"]
    if selection:
        command += ["-k", selection]
    began = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **extra_env}, capture_output=True, text=True)
    return {
        "seconds": round(time.monotonic() - began, 1),
        "measured": [{"what": what, "seconds": float(value)} for what, value in MEASURED.findall(done.stdout)],
        "returncode": done.returncode,
        "outcomes": {name.split("::")[1]: outcome for outcome, name in OUTCOME.findall(done.stdout)},
    }


def measured(report: dict[str, Any]) -> dict[str, list[str]]:
    """Every measurement of every run, by what it measured (the long partition's apart)."""
    values: dict[str, list[str]] = {}
    for run in report["runs"]:
        suffix = " (300 s partition)" if run["env"].get("NETWORK_PARTITION_SECONDS") == "300" else ""
        for item in run["measured"]:
            values.setdefault(item["what"] + suffix, []).append(f"{item['seconds']:.1f}")
    return values


def section(report: dict[str, Any]) -> list[str]:
    values = measured(report)
    outcomes: dict[str, list[str]] = {}
    for run in report["runs"]:
        for name, outcome in run["outcomes"].items():
            outcomes.setdefault(name.split("[")[0], []).append(outcome)
    rows = [
        f"{stamp(report)} with `python -m benchmarks.network_faults --repeats "
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

    return rows


def plot(report: dict[str, Any]) -> Any:
    values = measured(report)
    made, axis = figure(9, 0.5 * len(values) + 1.2)
    for index, found in enumerate(values.values()):
        axis.scatter([float(value) for value in found], [index] * len(found), color="tab:blue", alpha=0.8)
    label_rows(axis, [what[:70] for what in values], "seconds, every repeat", "Faults at the packet level", size=7)
    return made


BENCHMARK = Benchmark.of(
    globals(),
    schedule=lambda args: (
        [(repeat, {"env": {}}) for repeat in range(args.repeats)] + ([(0, {"env": LONG})] if args.long else [])
    ),
    measure=lambda context, case, repeat, args: run_once(case["env"]),
    page="reliability.md",
    options=lambda parser: parser.add_argument("--long", action="store_true", help="also the 300 s partition, once"),
    timed=False,
    errors=(),
    quick={"long": False},
)

if __name__ == "__main__":
    raise SystemExit(main(BENCHMARK))
