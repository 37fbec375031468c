"""The busy-server benchmark (``benchmarks/busy_server.py``, issue #49 item 3): its building blocks, cheaply.

On a real control plane of its own, with kube-apiserver's in-flight limits lowered as the benchmark lowers them
(``ControlPlane.apiserver_flags``): the flood tenant alone is throttled (429s) in ``workload-low``; without the
chart's FlowSchema the training account's requests are in ``workload-low`` too, with it in the chart's priority
level (the API server names it in ``X-Kubernetes-PF-PriorityLevel-UID``); a round of 8 agents forms beside the
flood and no agent logs an outage. Pure: the report's windows, ratios and verdict from a fixed report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.busy_server import (
    BENCHMARK,
    FLOOD,
    IDLE,
    OUTAGE_WORDS,
    SIZED,
    WITH_SCHEMA,
    busy_server,
    measure,
    outage_lines,
    section,
    window,
)
from benchmarks.runner import parse


@pytest.mark.cluster
def test_the_flood_is_throttled_the_flow_schema_classifies_the_training_account_and_a_round_forms_beside_it(
    tmp_path: Path,
) -> None:
    args = parse(
        BENCHMARK,
        ["--quick", "--hold", "0", "--flood-alone", "4", "--flood-processes", "1", "--flood-threads", "400"],
    )
    with busy_server(tmp_path, args) as context:
        context.flow_schema(None)
        assert context.level_of(context.bench.trainer) == "workload-low"
        run = measure(context, {"case": WITH_SCHEMA, "nodes": 8}, 0, args)
        chart_level = context.chart_level()
    assert run["trainer_level"] == chart_level  # the chart's FlowSchema took the training account's requests
    assert run["flood_levels"] == ["workload-low"]  # the other tenant's stay in the built-in level
    alone = run["flood"]["alone"]
    assert alone["throttled"] > 0, alone  # the lowered in-flight limit bites: the flood's queues overflow
    assert alone["served_per_second"] > 0 and alone["errors"] == 0, alone
    assert run["seconds"] < args.limit  # the round formed (Bench.round raises otherwise)
    assert run["outage_lines"] == 0, run.get("outage_example")
    assert run["agent_log_lines"] > 0  # the agents' logs were read


# -- pure ---------------------------------------------------------------------------------------------------------


def test_a_window_counts_the_flood_requests_sent_in_it_and_leaves_429s_out_of_the_latency() -> None:
    records = [[10.0 + i * 0.01, 0.1 + i * 0.001, 200, "list"] for i in range(100)]
    records += [[10.5, 0.001, 429, "write"], [10.6, 5.0, 0, "write"], [11.5, 9.0, 200, "list"]]
    got = window(records, 10.0, 11.0)
    assert got["requests"] == 102 and got["throttled"] == 1 and got["no_answer"] == 1
    assert got["p50_ms"] == 149.0 and got["p99_ms"] == 198.0  # of the 100 answered, the 429 and no answer left out
    assert got["throttled_share"] == round(1 / 102, 3)


def test_outage_lines_are_the_agent_log_lines_with_the_words_of_an_outage(tmp_path: Path) -> None:
    log = tmp_path / "agents.log"
    throttled = "watch interrupted (GET /x: throttled by the API server (429 Too Many Requests; Retry-After 1 s))"
    log.write_text(f"{throttled}\nThe Kubernetes API server could not be reached for 60 s.\n")
    assert outage_lines(log) == ["The Kubernetes API server could not be reached for 60 s."]
    assert not OUTAGE_WORDS.search(throttled)
    assert outage_lines(tmp_path / "none.log") == []


def run_of(case: str, repeat: int, seconds: float, alone: float, beside: float) -> dict[str, Any]:
    flood = {name: {"p50_ms": p99 / 2, "p99_ms": p99, "throttled_share": 0.05} for name, p99 in
             (("alone", alone), ("round", beside), ("steady", beside))}  # fmt: skip
    run: dict[str, Any] = {"case": case, "nodes": 8, "repeat": repeat, "trainer_level": "workload-low"}
    run.update(seconds=seconds, throttled_per_agent=0.0, outage_lines=0)
    return run if case == IDLE else {**run, "flood": flood}


def test_the_section_gives_every_repeat_its_ratio_to_the_same_repeats_idle_round_and_says_which_target_is_met() -> None:
    report = {
        "date": "2026-12-08 00:00",
        "machine": "2 cores",
        "argv": ["--repeats", "2"],
        "apiserver_flags": ["--max-requests-inflight=20", "--max-mutating-requests-inflight=10"],
        "flood": {"processes": 2, "threads": 200, "objects": 200, "alone_seconds": 15.0},
        "hold": 40.0,
        "sizes": [8],
        "runs": [
            run_of(IDLE, 0, 2.0, 0, 0),
            run_of(FLOOD, 0, 10.0, 100.0, 400.0),
            run_of(WITH_SCHEMA, 0, 3.0, 100.0, 150.0),
            run_of(IDLE, 1, 4.0, 0, 0),
            run_of(FLOOD, 1, 12.0, 100.0, 300.0),
            run_of(WITH_SCHEMA, 1, 6.0, 100.0, 150.0),
            {"case": SIZED, "nodes": 8, "repeat": 1, "failed": "did not complete within 180 s"},
        ],
    }
    text = "\n".join(section(report))
    assert "| 8 | 1 | flood | workload-low | 10.00 | 5.00x |" in text  # 10 s over repeat 1's idle 2 s
    assert "| 8 | 2 | flood + FlowSchema | workload-low | 6.00 | 1.50x |" in text  # over repeat 2's idle 4 s
    assert "*flood*: the round took 4.00x its idle time, the flood's p99 was 3.50x" in text  # medians: 5x, 3x; 4x, 3x
    assert "*flood + FlowSchema*: the round took 1.50x its idle time, the flood's p99 was 1.50x" in text
    assert "*flood + FlowSchema, sized* (1 repeats failed)" in text
    assert "met by *flood + FlowSchema*, **not met** by *flood + FlowSchema, sized*" in text
