"""Long waits in the launcher say, every 10 s, who joined and who is missing (real agents, real API server)."""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.e2e.harness import ElasticJob
from tests.testenv import wait_until

MakeJob = Callable[..., ElasticJob]
FORMING = re.compile(r"round (\d+) still forming after (\d+) s: (\d+) of minNodes (\d+) joined \(([^)]*)\)(.*)")


def forming_lines(output: str) -> list[re.Match[str]]:
    return list(FORMING.finditer(output))


def test_survivors_waiting_for_min_nodes_log_who_is_missing_every_10_s_until_a_replacement_joins(
    make_job: MakeJob,
) -> None:
    # minNodes 3: after a pod dies the two survivors cannot form a round until a replacement comes.
    job = make_job(nnodes="3:3", steps=200, step_seconds=0.5, rdzv_conf={"last_call_timeout": "1"})
    agents = job.start_training(3)
    victim, survivors = agents[2], agents[:2]
    missing = victim.node_name
    victim.kill_pod()

    def each_survivor_naming_the_victim() -> list[re.Match[str]] | None:
        per_agent = [
            [line for line in forming_lines(agent.output()) if missing in line.group(6)] for agent in survivors
        ]
        return [line for lines in per_agent for line in lines] if all(per_agent) else None

    found = wait_until(each_survivor_naming_the_victim, 120, f"the survivors logging that {missing} is missing")
    for line in found:
        round_number, waited, joined, minimum = (int(line.group(index)) for index in range(1, 5))
        assert round_number >= 1 and minimum == 3 and joined <= 2
        assert waited >= 10, line.group(0)  # the first line comes after 10 s of waiting, not at once
        assert "waiting for" in line.group(6) and f"missing from the last round: {missing}" in line.group(6)
    replacement = job.start_agent("replacement")
    job.wait_training([*survivors, replacement], timeout=180, what="the replacement joining the survivors")
