"""Turn benchmarks/results/results.json into docs/benchmarks.md and docs/benchmarks.png.

And what every benchmark's report shares: ``new_report`` (when and where it was measured),
``save_report`` (its JSON, after each run) and ``splice`` (its section of a page in docs/).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BACKEND_ORDER = {"p10d": 0, "k8s": 1, "torch-c10d": 2, "torch-k8s": 3}
DOCS = REPO / "docs"


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def new_report(**fields: Any) -> dict[str, Any]:
    """A benchmark's JSON report: its date and machine, then ``fields`` in the order given."""
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores", **fields}


def save_report(out: Path, report: dict[str, Any]) -> None:
    """Write ``report`` to ``out`` (after every run, so a benchmark stopped midway keeps what it measured)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


def splice(page: Path, text: str, begin: str, end: str, *, at_end: bool = False) -> None:
    """Put ``text`` between the ``begin`` and ``end`` markers of ``page``; where it has none, after its first
    heading (or at its end with ``at_end``). Every benchmark writes its section of a page with this."""
    content = page.read_text() if page.exists() else "# Benchmarks\n"
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in content and end in content:
        head, rest = content.split(begin, 1)
        content = head + block + rest.split(end, 1)[1]
    elif at_end:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    else:
        first, _, rest = content.partition("\n")
        content = f"{first}\n\n{block}\n{rest}"
    page.write_text(content)


def write_report(report: dict[str, Any]) -> None:
    """Write the Markdown table and the plot for ``report``."""
    DOCS.mkdir(exist_ok=True)
    rounds = report["rounds"]
    by = {(entry["backend"], entry["nodes"]): entry for entry in rounds}
    sizes = sorted({entry["nodes"] for entry in rounds})
    lines = [
        "# Benchmarks",
        "",
        f"Measured {report['date']} on one {report['machine']} machine, control plane and all agents on it.",
        "Command: `bash scripts/benchmark.sh` (`python -m benchmarks.run`). Raw numbers:",
        "[benchmarks/results/results.json](../benchmarks/results/results.json). Plot: ![plot](benchmarks.png)",
        "",
        "## One round (min = max = N), median of repeats",
        "",
        "| N | p10d s | k8s s | k8s / p10d | floor N x CAS s | k8s requests / agent | 409s / agent "
        "| bytes sent / agent |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for nodes in sizes:
        p10d, k8s = by.get(("p10d", nodes), {}), by.get(("k8s", nodes), {})
        ratio = (
            k8s["median_seconds"] / p10d["median_seconds"]
            if "median_seconds" in k8s and "median_seconds" in p10d
            else None
        )
        lines.append(
            f"| {nodes} | {_fmt(p10d.get('median_seconds')) if 'failed' not in p10d else 'failed'} "
            f"| {_fmt(k8s.get('median_seconds')) if 'failed' not in k8s else 'failed'} | {_fmt(ratio, 'x')} "
            f"| {_fmt(k8s.get('floor_seconds'))} | {_fmt(k8s.get('requests_per_agent'), digits=1)} "
            f"| {_fmt(k8s.get('conflicts_per_agent'), digits=1)} | {_fmt(k8s.get('bytes_sent_per_agent'), digits=0)} |"
        )
    backends = sorted({entry["backend"] for entry in rounds}, key=lambda name: BACKEND_ORDER.get(name, 9))
    if any(name.startswith("torch-") for name in backends):
        lines += [
            "",
            "## Every repeat, every backend (tensorplay's p10d and k8s; torch's c10d and k8s, stock torchrun handlers)",
            "",
            "| N | backend | every repeat (s) | median s | / tensorplay p10d | / torch c10d |",
            "|---|---|---|---|---|---|",
        ]
        for nodes in sizes:
            for name in backends:
                entry = by.get((name, nodes))
                if entry is None:
                    continue
                runs = ", ".join(f"{seconds:.2f}" for seconds in entry.get("runs_seconds", []))
                median = entry.get("median_seconds")
                ratios = []
                for baseline in ("p10d", "torch-c10d"):
                    base = by.get((baseline, nodes), {}).get("median_seconds")
                    ratios.append(_fmt(median / base, "x") if median and base else "n/a")
                failed = f" (failed: {entry['failed'][:80]})" if "failed" in entry else ""
                lines.append(f"| {nodes} | {name} | {runs}{failed} | {_fmt(median)} | {ratios[0]} | {ratios[1]} |")
    failures = [entry for entry in rounds if "failed" in entry]
    for entry in failures:
        lines.append(f"\n{entry['backend']} N={entry['nodes']} failed: `{entry['failed']}`")
    state_size = DOCS / "state-size.md"  # written by python -m benchmarks.state_size
    if state_size.exists():
        lines += ["", state_size.read_text().strip()]
    if report.get("steady"):
        lines += [
            "",
            "## Steady state: N agents heartbeating (keep-alive 5 s)",
            "",
            "| N | writes/s to the Rendezvous | status bytes/s | kube-apiserver CPU (cores) | etcd CPU (cores) |",
            "|---|---|---|---|---|",
        ]
        for item in report["steady"]:
            lines.append(
                f"| {item['nodes']} | {item['writes_per_second']:.1f} | {item['status_bytes_per_second']:.0f} "
                f"| {item['cpu_cores'].get('kube-apiserver', 0):.2f} | {item['cpu_cores'].get('etcd', 0):.2f} |"
            )
    if report.get("recovery"):
        lines += [
            "",
            "## Recovery after one of 3 agents is SIGKILLed (to survivors training again)",
            "",
            "| how | seconds |",
            "|---|---|",
        ]
        for mode, seconds in report["recovery"].items():
            lines.append(f"| {mode} | {seconds:.1f} |")
    notes = DOCS / "benchmarks-notes.md"
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    (DOCS / "benchmarks.md").write_text("\n".join(lines) + "\n")
    scale = DOCS / "scale.md"  # written by python -m benchmarks.scale
    if scale.exists():
        from benchmarks.scale import BEGIN, END

        splice(DOCS / "benchmarks.md", scale.read_text(), BEGIN, END)
    plot(report, sizes, by)


def plot(report: dict[str, Any], sizes: list[int], by: dict[tuple[str, int], dict[str, Any]]) -> None:
    from benchmarks.runner import figure, save_figure

    made, (left, right) = figure(11, 4.2, columns=2)
    for backend, style in (("p10d", "o-"), ("k8s", "s-"), ("torch-c10d", "^--"), ("torch-k8s", "v--")):
        points = [
            (n, by[(backend, n)]["median_seconds"]) for n in sizes if "median_seconds" in by.get((backend, n), {})
        ]
        if points:
            left.plot(*zip(*points, strict=True), style, label=f"{backend} round time")
    floor = [(n, by[("k8s", n)]["floor_seconds"]) for n in sizes if "floor_seconds" in by.get(("k8s", n), {})]
    if floor:
        left.plot(*zip(*floor, strict=True), "k--", label="floor: N x CAS latency")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("agents N (min = max = N)")
    left.set_ylabel("seconds to complete one round")
    left.legend()
    left.set_title("Round time")
    requests = [
        (n, by[("k8s", n)]["requests_per_agent"]) for n in sizes if "requests_per_agent" in by.get(("k8s", n), {})
    ]
    conflicts = [
        (n, by[("k8s", n)]["conflicts_per_agent"]) for n in sizes if "conflicts_per_agent" in by.get(("k8s", n), {})
    ]
    if requests:
        right.plot(*zip(*requests, strict=True), "s-", label="API requests / agent")
        right.plot(*zip(*conflicts, strict=True), "x-", label="409 conflicts / agent")
    right.set_xscale("log", base=2)
    right.set_xlabel("agents N")
    right.set_title("k8s: API cost per agent per round")
    right.legend()
    save_figure(made, DOCS / "benchmarks.png")


if __name__ == "__main__":
    write_report(json.loads((REPO / "benchmarks" / "results" / "results.json").read_text()))
    sys.exit(0)
