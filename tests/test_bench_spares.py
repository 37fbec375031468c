"""The hot-spares benchmark's reading of the Rendezvous status and its spare/no-spare ratios (pure)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document

from benchmarks.spares import BASELINE, SPARE, TARGET_SECONDS, Milestones, summarize

VICTIM, SPARE_ADDR = "127.1.0.4", "127.1.0.5"
MEMBERS = [NodeId(f"127.1.0.{i}", 100 + i, 0) for i in range(1, 5)]  # the victim is the last
SPARE_NODE = NodeId(SPARE_ADDR, 105, 0)
NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)


def status(
    round_number: int,
    members: list[NodeId],
    *,
    complete: bool = True,
    spares: frozenset[NodeId] = frozenset(),
    **more: Any,
) -> dict[str, Any]:
    document = RendezvousDocument(
        round=round_number,
        complete=complete,
        participants={node: rank if complete else 0 for rank, node in enumerate(members)},
        redundancy_list=spares,
        last_heartbeats=dict.fromkeys([*members, *spares], NOW),
    )
    return {"state": encode_document(document), **more}


def test_a_spare_promoted_in_the_eviction_fold_is_evicted_reformed_and_promoted_at_once() -> None:
    seen = Milestones(3, VICTIM, SPARE_ADDR)
    seen.observe(status(3, MEMBERS, spares=frozenset({SPARE_NODE}), evictedNodes=[f"{VICTIM}_104_0"]), 10.0)
    assert seen.times == {"evicted": 10.0}  # the operator's eviction intent, before its fold
    after = [*MEMBERS[:3], SPARE_NODE]
    seen.observe(status(4, after, recentRounds=[{"round": 4, "completedBy": "MaxNodes"}]), 10.5)
    seen.observe(status(4, after), 11.0)  # later versions change nothing
    assert seen.times == {"evicted": 10.0, "removed": 10.5, "reformed": 10.5, "promoted": 10.5}
    assert (seen.size, seen.round, seen.completed_by) == (4, 4, "MaxNodes")


def test_without_a_spare_the_round_reforms_smaller_and_nothing_is_promoted() -> None:
    seen = Milestones(3, VICTIM, None)
    seen.observe(status(4, MEMBERS[:3], complete=False), 2.0)  # carried: the next round opens, not yet complete
    assert seen.times == {"evicted": 2.0, "removed": 2.0}
    seen.observe(status(4, MEMBERS[:3], recentRounds=[{"round": 4, "completedBy": "TrainingPodsJoined"}]), 2.5)
    assert seen.times == {"evicted": 2.0, "removed": 2.0, "reformed": 2.5}
    assert (seen.size, seen.completed_by) == (3, "TrainingPodsJoined")


def test_a_round_that_reforms_without_the_spare_is_not_a_promotion() -> None:
    seen = Milestones(3, VICTIM, SPARE_ADDR)
    seen.observe(status(4, MEMBERS[:3], spares=frozenset({SPARE_NODE})), 1.0)
    assert "promoted" not in seen.times and seen.size == 3
    seen.observe(status(5, [*MEMBERS[:3], SPARE_NODE]), 4.0)  # promoted a round later: its size stays the first's
    assert seen.times["promoted"] == 4.0 and seen.size == 3


def test_a_member_with_a_longer_address_is_not_the_victim() -> None:
    seen = Milestones(3, "127.1.0.1", None)
    seen.observe(status(3, MEMBERS[1:], evictedNodes=["127.1.0.12_7_0"]), 1.0)  # 127.1.0.1 gone from the state
    assert seen.times == {"evicted": 1.0, "removed": 1.0}
    seen = Milestones(3, "127.1.0.1", None)
    seen.observe(status(3, MEMBERS, evictedNodes=["127.1.0.12_7_0"]), 1.0)
    assert seen.times == {}


def run(
    mode: str, repeat: int, held: float | None, promoted: float | None = None, removed: float | None = None
) -> dict[str, Any]:
    found: dict[str, Any] = {"nodes": 1024, "framework": "tensorplay", "mode": mode, "repeat": repeat}
    if held is None:
        return {**found, "failed": "no round"}
    if promoted is not None:
        found.update(promoted=promoted, removed=promoted if removed is None else removed)
    return {**found, "held": held}


def test_the_ratio_pairs_repeats_and_its_median_skips_failed_ones() -> None:
    runs = [
        run(SPARE, 0, 2.0, 1.8),
        run(BASELINE, 0, 4.0),
        run(SPARE, 1, 3.0, TARGET_SECONDS + 0.5),
        run(BASELINE, 1, 3.0),
        run(SPARE, 2, 1.0, 0.9, removed=0.4),  # promoted a write after the eviction fold
        run(BASELINE, 2, None),
        run(SPARE, 0, 100.0, 99.0) | {"nodes": 128},  # another size: not counted
    ]
    summary = summarize(runs, 1024, "tensorplay")
    assert summary["per_repeat"] == [0.5, 1.0, None]
    assert summary["median"] == 0.75
    assert (summary["held_spare"], summary["held_no_spare"]) == (2.0, 3.5)
    assert summary["promoted"] == [1.8, TARGET_SECONDS + 0.5, 0.9]
    assert summary["within_target"] == 2
    assert summary["in_eviction_fold"] == 2


def test_no_runs_give_no_ratio() -> None:
    summary = summarize([run(BASELINE, 0, 4.0)], 1024, "tensorplay")
    assert summary["per_repeat"] == [None] and summary["median"] is None and summary["promoted"] == []
