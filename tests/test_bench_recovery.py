"""The recovery benchmark's split of a recovery into phases, from the survivors' logs (pure)."""

from __future__ import annotations

from datetime import datetime

from benchmarks.run import FORMED, REJOINING, logged_times, recovery_phases


def at(clock: str) -> float:
    return datetime.strptime(f"2026-12-03 {clock}", "%Y-%m-%d %H:%M:%S.%f").timestamp()


def line(clock: str, text: str) -> str:
    return f"2026-12-03 {clock.replace('.', ',')} INFO tensorplay.distributed.elastic.agent.server.api: {text}"


SURVIVOR_A = "\n".join(
    [
        line("19:35:13.678", f"[default_role] {REJOINING}"),
        line("19:35:15.462", f"[default_role] {FORMED}: restart_count=0 group_rank=5"),
        "rank 5/32 group_rank 5 restart 0 step 0: sum 496.0",
        line("19:35:25.595", f"[default_role] {REJOINING}"),
        line("19:35:28.509", f"[default_role] {FORMED}: restart_count=0 group_rank=4"),
    ]
)
SURVIVOR_B = "\n".join(
    [
        line("19:35:25.900", f"[default_role] {REJOINING}"),
        line("19:35:28.044", f"[default_role] {FORMED}: restart_count=0 group_rank=3"),
    ]
)


def test_logged_times_reads_python_loggings_asctime_and_skips_lines_without_one() -> None:
    assert logged_times(SURVIVOR_A, FORMED) == [at("19:35:15.462"), at("19:35:28.509")]
    assert logged_times("rank 1/2 step 0 Rendezvous complete", FORMED) == []


def test_each_phase_is_the_last_survivor_to_reach_it_after_the_kill() -> None:
    killed = at("19:35:25.300")
    phases = recovery_phases([SURVIVOR_A, SURVIVOR_B], killed, at("19:35:37.000"))
    assert round(phases["detected"] or 0, 3) == 0.6  # B re-rendezvoused last, at 25.900
    assert round(phases["formed"] or 0, 3) == 3.209  # A's round formed last, at 28.509
    assert round(phases["training"], 3) == 11.7
    assert round(phases["workers"] or 0, 3) == 8.491


def test_a_survivor_that_never_logged_the_phase_makes_it_unknown() -> None:
    phases = recovery_phases([SURVIVOR_A, "no timestamps here"], at("19:35:25.300"), at("19:35:37.000"))
    assert phases["formed"] is None and phases["workers"] is None


def test_a_killed_joiner_leaves_one_world_with_every_live_agent_ranked_once() -> None:
    import pytest

    from benchmarks.run import world_without_a_killed_joiner

    live = [{"rank": rank, "world": 4} for rank in (0, 1, 3)]  # the victim's request folded: its rank 2 unused
    assert world_without_a_killed_joiner(live, 4) == 4
    assert world_without_a_killed_joiner([{"rank": r, "world": 3} for r in range(3)], 4) == 3
    with pytest.raises(AssertionError, match="twice"):
        world_without_a_killed_joiner([{"rank": r, "world": 4} for r in (0, 1, 1)], 4)
    with pytest.raises(AssertionError, match="worlds"):
        world_without_a_killed_joiner([{"rank": 0, "world": 3}, {"rank": 1, "world": 4}, {"rank": 2, "world": 4}], 4)
    with pytest.raises(AssertionError, match="live agents reported"):  # a live join lost
        world_without_a_killed_joiner([{"rank": 0, "world": 3}, {"rank": 1, "world": 3}], 4)
    with pytest.raises(AssertionError, match="outside"):
        world_without_a_killed_joiner([{"rank": r, "world": 3} for r in (0, 1, 3)], 4)
