"""The benchmarks' agent processes run at a lower priority than the control plane (docs/testing.md, Benchmarks)."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.run import AGENT_NICE, agent_env
from tests.helpers import REPO


def test_an_agent_process_started_with_agent_env_runs_at_the_agent_niceness() -> None:
    # What round_worker and store_worker call first; every thread they start inherits it.
    script = "import os; from benchmarks.run import lower_priority; lower_priority(); print(os.nice(0))"
    before = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True, text=True, check=True
        ).stdout
    )
    shown = subprocess.run(
        [sys.executable, "-c", script], env=agent_env(), cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert AGENT_NICE == 10
    assert int(shown) == min(19, before + AGENT_NICE)


def test_both_agent_workers_lower_their_priority_before_anything_else() -> None:
    for worker in ("round_worker", "store_worker"):
        text = (REPO / "benchmarks" / f"{worker}.py").read_text()
        main = text[text.index("def main()") :]
        assert main.index("lower_priority()") < main.index('print("ready"')
