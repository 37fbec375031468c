"""The README's demo runs from this checkout and tells the story it promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def run_demo(*args: str) -> str:
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    removed = re.search(r"removed its working directory (\S+)", run.stdout)
    assert removed is not None and not Path(removed.group(1)).exists(), "the demo left its working directory behind"
    return run.stdout


def test_the_demo_runs_the_example_job_on_real_pods_and_recovers_from_kubectl_delete_pod() -> None:
    """The default: a real node runs examples/training-job.yaml; one pod is deleted; the Job completes."""
    out = run_demo("--steps", "25")  # the replacement pod (~12 s after the delete) joins before the job ends
    assert "no real node on this machine" not in out
    assert "round formed and training" in out and "3 real pods" in out
    assert "survivors training again in a new round" in out
    assert "joined: 3 pods training" in out
    assert "Job complete: 3 pods succeeded" in out
    rdzv = rows(section(out, "== kubectl get rdzv"))
    assert [(row["NAME"], row["PHASE"], row["MEMBERS"]) for row in rdzv] == [("llama-train", "Closed", "3")]
    reasons = [row["REASON"] for row in rows(section(out, "== kubectl get events"))]
    for reason in ("RoundCompleted", "NodeEvicted", "NodeJoined", "Closed"):
        assert reason in reasons


def test_the_simulated_demo_recovers_from_a_killed_pod_and_shows_kubectl_get_rdzv_and_events() -> None:
    """``--simulated`` (and any machine without a real node): the demo plays the kubelet."""
    out = run_demo("--simulated", "--steps", "8")
    assert "round formed and training" in out
    assert "survivors training again in a new round" in out
    assert "agents exited with [0, 0]" in out
    # Under load the first round may form with two agents and the third join the next: the round the
    # three trained in is read from the table printed then, and the kill adds exactly one round.
    formed = rows(out.split("round formed and training", 1)[1].split("\x1b[1m==", 1)[0])
    rdzv = rows(section(out, "== kubectl get rdzv"))
    assert [row["NAME"] for row in rdzv] == ["llama-train"]
    assert (rdzv[0]["PHASE"], int(rdzv[0]["ROUND"])) == ("Closed", int(formed[0]["ROUND"]) + 1)
    reasons = [row["REASON"] for row in rows(section(out, "== kubectl get events"))]
    for reason in ("RoundCompleted", "NodeEvicted", "Closed"):
        assert reason in reasons


def section(out: str, title: str) -> str:
    """The lines the demo printed under ``title``, up to its next title."""
    return out.split(title, 1)[1].split("\x1b[1m==", 1)[0]


def rows(table: str) -> list[dict[str, str]]:
    """A kubectl table as one dict per row, keyed by column header (whitespace-separated, as kubectl aligns)."""
    lines = [line for line in table.splitlines() if line.strip() and not line.startswith("\x1b")]
    header = next(index for index, line in enumerate(lines) if line.split()[0] in ("NAME", "TYPE"))
    names = lines[header].split()
    return [dict(zip(names, line.split(None, len(names) - 1), strict=False)) for line in lines[header + 1 :]]
