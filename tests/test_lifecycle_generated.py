"""The generated lifecycle test (``tests.e2e.lifecycle``) on the real control plane, with real tensorplay agents.

CI plays a fixed budget: the sequences of ``LIFECYCLE_SEEDS`` (default one seed), ``LIFECYCLE_STEPS`` steps each.
A longer run sets both, e.g. ``LIFECYCLE_SEEDS=$(seq -s, 1 100) LIFECYCLE_STEPS=10``; docs/reliability.md has
its figures. A failure prints its seed, its sequence and the shortest failing sequence found by shrinking.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.e2e.lifecycle import Lifecycle, run_sequence
from tests.test_operator import operator_account
from tests.testenv import ControlPlane

SEEDS = [int(seed) for seed in os.environ.get("LIFECYCLE_SEEDS", "7").split(",") if seed.strip()]
STEPS = int(os.environ.get("LIFECYCLE_STEPS", "8"))


@pytest.fixture
def operator_kubeconfig(control_plane: ControlPlane, namespace: str) -> Iterator[Path]:
    with operator_account(control_plane, namespace) as kubeconfig:
        yield kubeconfig


@pytest.mark.parametrize("seed", SEEDS)
def test_a_generated_sequence_of_user_and_cluster_actions_never_ends_a_job_wrongly_or_hangs(
    seed: int,
    control_plane: ControlPlane,
    namespace: str,
    agent_kubeconfig: Path,
    operator_kubeconfig: Path,
    objects: client.CustomObjectsApi,
    tmp_path: Path,
) -> None:
    def make(attempt: int) -> Lifecycle:
        return Lifecycle(
            control_plane,
            objects,
            namespace,
            f"job-{attempt}",
            agent_kubeconfig,
            operator_kubeconfig,
            tmp_path / f"attempt-{attempt}",
        )

    sequence, seconds = run_sequence(make, seed, STEPS)
    print(f"\nseed {seed}: {' '.join(sequence)} in {seconds:.0f} s")
