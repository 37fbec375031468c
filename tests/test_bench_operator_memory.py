"""The operator-memory benchmark's table, ratios and per-1,000-pods slope from a fixed report (pure)."""

from __future__ import annotations

from typing import Any

from benchmarks.operator_memory import per_thousand, section


def run(pods: int, peak: float, settled: float, slowest: float) -> dict[str, Any]:
    return {
        "pods": pods,
        "peak_mib": peak,
        "settled_mib": settled,
        "reconciled": [slowest - 0.2, slowest, slowest - 0.1],
        "indexed": slowest + 1.0,
        "churn_seconds": pods / 40,
    }


REPORT: dict[str, Any] = {
    "date": "2026-12-07 18:00",
    "machine": "2 cores",
    "repeats": 2,
    "runs": [
        run(0, 70.0, 69.0, 2.5),
        run(1000, 80.0, 75.0, 3.0),
        run(10000, 170.0, 120.0, 9.0),
        run(0, 72.0, 71.0, 2.7),
        run(1000, 82.0, 77.0, 3.2),
        {"pods": 10000, "error": "the operator was not quiet for 10 s within 600 s"},
    ],
}


def test_every_repeat_is_a_cell_and_the_ratios_compare_medians_with_no_pods() -> None:
    lines = section(REPORT)
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ") and line[2].isdigit()}
    assert rows["| 0"] == "| 0 | 70.0, 72.0 | 69.0, 71.0 | 1.00x | 1.00x | 2.5, 2.7 | 3.5, 3.7 | 0.0, 0.0 |"
    assert rows["| 1,000"].startswith("| 1,000 | 80.0, 82.0 | 75.0, 77.0 | 1.14x | 1.09x | 3.0, 3.2 |")
    assert rows["| 10,000"].startswith("| 10,000 | 170.0, none | 120.0, none | 2.39x | 1.71x | 9.0 |")
    assert "P = 10,000, repeat failed: the operator was not quiet for 10 s within 600 s" in lines


def test_the_sizing_rule_is_the_slope_of_the_medians_from_no_pods_to_the_most() -> None:
    assert per_thousand(REPORT, "peak_mib") == (170.0 - 71.0) / 10
    assert per_thousand(REPORT, "settled_mib") == (120.0 - 70.0) / 10
    assert any(
        line.startswith("Per 1,000 pods watched (medians, P = 0 to 10,000): peak +9.9 MiB") for line in section(REPORT)
    )
    assert per_thousand({"runs": [run(1000, 80.0, 75.0, 3.0)]}, "peak_mib") is None
