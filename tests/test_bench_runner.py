"""The one benchmark runner (benchmarks/runner.py): a benchmark is its cases and its measurement; the runner
repeats every case, keeps every repeat in the JSON, records a failed repeat, and writes the docs section
(heading, intro, table, notes, the PNG's line) and the PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.runner import Benchmark, figure, main, ratio, ratios_to, shown, table_head

#: A benchmark module's globals, as ``Benchmark.of`` reads them.
TITLE, IMAGE, LABELS = "A toy", "a toy", ["fast", "slow", "broken"]
INTRO = """{stamp}, {repeats} repeats
({command})."""
NOTES = """How to read
it."""


def measure(context: Any, case: dict[str, Any], repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    if case["case"] == "broken":
        raise TimeoutError("not within the limit")
    return {"took": {"fast": 1.0, "slow": 2.0}[case["case"]] + repeat}


def section(report: dict[str, Any]) -> list[str]:
    runs = report["runs"]
    lines = table_head("case", "every repeat", "ratio")
    for case in LABELS:
        measured = ratio([r["took"] for r in runs if r["case"] == case and "took" in r],
                         [r["took"] for r in runs if r["case"] == "fast" and "took" in r])  # fmt: skip
        lines.append(f"| {case} | {shown(r.get('took') for r in runs if r['case'] == case)} | {measured} |")
    return lines


def plot(report: dict[str, Any]) -> Any:
    made, axis = figure(4, 2)
    axis.scatter([run.get("took", 0) for run in report["runs"]], range(len(report["runs"])))
    return made


def toy(**settings: Any) -> Benchmark[Any]:
    return Benchmark.of({**globals(), "__spec__": None, "__name__": "benchmarks.toy"}, **settings)


def test_every_repeat_of_every_case_is_kept_a_failed_repeat_says_why_and_the_page_has_every_part(
    tmp_path: Path,
) -> None:
    out, docs = tmp_path / "toy.json", tmp_path / "docs"
    assert main(toy(timed=False), ["--repeats", "2", "--out", str(out), "--docs", str(docs)]) == 0
    report = json.loads(out.read_text())
    assert list(report)[:3] == ["date", "machine", "repeats"] and report["repeats"] == 2
    assert [(run["case"], run.get("took")) for run in report["runs"]] == [
        ("fast", 1.0), ("slow", 2.0), ("broken", None), ("fast", 2.0), ("slow", 3.0), ("broken", None),
    ]  # fmt: skip
    assert report["runs"][2]["error"] == "not within the limit"
    page = (docs / "benchmarks.md").read_text()
    assert "<!-- toy:begin (python -m benchmarks.toy) -->\n## A toy\n\n" in page
    assert ", 2 repeats (`python -m benchmarks.toy --repeats 2`)." in page
    assert "| slow | 2.0, 3.0 | 1.6666666666666667 |" in page and "| broken | none, none | None |" in page
    assert page.rstrip().endswith("How to read it.\n\n![a toy](toy.png)\n<!-- toy:end -->")
    assert (docs / "toy.png").stat().st_size > 0


def test_quick_runs_one_repeat_of_its_cases_and_a_failed_case_stops_where_asked(tmp_path: Path) -> None:
    out = tmp_path / "toy.json"
    benchmark = toy(quick={"cases": ["fast", "broken"]}, stop_on_failure=True, error_key="failed")
    main(benchmark, ["--quick", "--out", str(out), "--docs", str(tmp_path)])
    assert [run["case"] for run in json.loads(out.read_text())["runs"]] == ["fast", "broken"]
    main(benchmark, ["--repeats", "3", "--cases", "broken", "--out", str(out), "--docs", str(tmp_path)])
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 1 and runs[0]["failed"] == "not within the limit"  # not repeated: the failure is the result


def test_grouped_runs_are_one_entry_per_case_with_every_repeat(tmp_path: Path) -> None:
    out = tmp_path / "toy.json"
    benchmark = toy(table="rows", grouped=True, case_major=True, summary=lambda entry: {"n": len(entry["runs"])})
    benchmark.section, benchmark.plot = lambda report: [], lambda report: figure(1, 1)[0]
    main(benchmark, ["--repeats", "2", "--cases", "fast", "--out", str(out), "--docs", str(tmp_path)])
    rows = json.loads(out.read_text())["rows"]
    assert [(row["case"], row["n"], [run["took"] for run in row["runs"]]) for row in rows] == [("fast", 2, [1.0, 2.0])]


def test_ratios_to_the_same_runs_baseline_are_medians_over_medians() -> None:
    runs = [{"case": "a", "x": 2.0}, {"case": "a", "x": 4.0}, {"case": "b", "x": 1.0}, {"case": "c", "x": None}]
    assert ratios_to(runs, "x", {"a": "b", "c": "b"}) == {"a": 3.0}  # c measured nothing: no ratio


#: Private names of the frameworks (not ours) that the benchmarks call as their launchers do.
FRAMEWORK_PRIVATE = {"_assign_worker_ranks"}
#: The standard library's documented underscore names (``os._exit``: a worker that must not run exit handlers).
STANDARD_PRIVATE = {("os", "_exit")}


def test_no_benchmark_reads_a_private_name_of_the_library() -> None:
    """Issue #50: the benchmarks read the library through its public names only: no import of a ``kube_rendezvous._``
    module, no ``getattr(x, "_name")``, no ``x._name`` on anything but the benchmark's own ``self``/``cls``."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kube_rendezvous._"):
                found.append(f"{path.name}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import):
                found += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names if "._" in a.name]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in FRAMEWORK_PRIVATE
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and not (isinstance(node.value, ast.Name) and (node.value.id, node.attr) in STANDARD_PRIVATE)
            ):
                found.append(f"{path.name}:{node.lineno} reads .{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
            ):
                found.append(f"{path.name}:{node.lineno} getattr {node.args[1].value}")
    assert found == []
