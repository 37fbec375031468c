"""The README's demo runs from this checkout and tells the story it promises."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_the_demo_recovers_from_a_killed_pod_and_shows_kubectl_get_rdzv_and_events() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--steps", "8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    assert "round formed and training" in out
    assert "survivors training again in a new round" in out
    assert "agents exited with [0, 0]" in out
    final_table = out.split("== kubectl get rdzv")[1]
    assert "llama-train   Closed   1" in final_table
    for reason in ("RoundCompleted", "NodeEvicted", "Closed"):
        assert reason in out.split("== kubectl get events")[1]
