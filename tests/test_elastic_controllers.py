"""Elasticity and restarts under the controllers users run (issue #47), on three real nodes with the operator
installed from the chart and the controllers built from source (``tests.testenv.workloads``):

- Kueue v0.19.2's elastic jobs (``ElasticJobsViaWorkloadSlices``, beta and on): the example Job opted in with
  ``kueue.x-k8s.io/elastic-job`` is scaled up (a new Workload slice admitted, the new pods join the next round),
  past the Rendezvous's maxNodes (the extra pod waits as a spare) and down (the removed pods leave as a drain);
- JobSet v0.12.0's in-place restart (``InPlaceRestart``, alpha, turned on) and its ``RestartJob`` action (alpha,
  turned on): the same pods restart in place and form the next round of the same Rendezvous. ``RestartJob``'s test
  (one Job recreated while the other trains on) is out of the suite: it failed under CI's load twice in four
  clean-clone rehearsals (docs/workloads.md, "`RestartJob`").

What each step does, with times: docs/workloads.md ("Kueue's elastic jobs", "JobSet's in-place restart and
RestartJob").
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.elastic import (
    SELECTOR,
    admitted_slice,
    condition,
    elastic_job_objects,
    elastic_queue_objects,
    job_workloads,
    scale_down,
    scale_past_max,
    scale_up,
)
from tests.e2e.real_pods import RENDEZVOUS, member_addresses, rendezvous_status, worker_rounds
from tests.e2e.restarts import SELECTOR as RESTART_SELECTOR
from tests.e2e.restarts import get_jobset, in_place_objects, restart_in_place
from tests.e2e.workloads import NAMESPACE, Started, admin_api, clear_namespace, rendezvous_events, start_training
from tests.test_workloads import apply, rendezvous_object
from tests.testenv.cluster import Cluster
from tests.testenv.commands import run_command

#: ``kubectl rdzv`` (the console script of this virtualenv).
PLUGIN = Path(sys.executable).with_name("kubectl-rdzv")


@pytest.fixture
def team_a(workload_cluster: Cluster) -> Iterator[Cluster]:
    """The cluster; namespace ``team-a`` emptied of the test's workloads, pods and Rendezvous afterwards."""
    yield workload_cluster
    clear_namespace(workload_cluster)


def rdzv_status(cluster: Cluster) -> dict[str, Any]:
    """``kubectl rdzv status llama-train -o json``."""
    kubeconfig = str(cluster.plane.admin_kubeconfig)
    done = run_command([str(PLUGIN), "--kubeconfig", kubeconfig, "-n", NAMESPACE, "status", RENDEZVOUS, "-o", "json"])
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_a_kueue_elastic_job_scales_up_in_a_new_slice_past_max_into_a_spare_and_down_as_a_drain(
    team_a: Cluster,
) -> None:
    """The example Job (3 pods, ``--nnodes=2:4``) queued by Kueue and opted in to workload slices, in a ClusterQueue
    with quota for 5 pods. It trains in a round of 3; then:

    - **up to 4**: Kueue admits a new Workload slice for 4 (annotated as the replacement of the admitted one, which
      finishes ``WorkloadSliceReplaced``); the new pod runs, joins the next round of the same Rendezvous, and all 4
      train with 4 (the 3 old agents restarted their workers once);
    - **up to 5, past maxNodes**: Kueue admits a slice for 5 (its quota knows nothing of maxNodes); the fifth pod runs
      and waits as a spare (``status.spareCount`` 1, ``kubectl rdzv status``'s ``redundantCount`` 1): the round of 4
      goes on, no restart, the spare trains nothing;
    - **down to 3**: Kueue shrinks the admitted slice to 3, the Job controller deletes the pods of indexes 3 and 4
      (the member and the spare), their agents leave, and the 3 survivors train in a later round of 3.

    The Job never fails (0 failed pods: out-of-range indexes are not counted), the Rendezvous is the same object
    throughout, and its Events tell each round."""
    api = admin_api(team_a)
    core, batch, objects = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    team_a.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(elastic_queue_objects(NAMESPACE, 5)))
    apply(team_a, elastic_job_objects(3))
    started = start_training(team_a, NAMESPACE, SELECTOR, 3)
    (first,) = job_workloads(objects, NAMESPACE)
    assert admitted_slice(objects, NAMESPACE, 3) is not None, first.get("status")
    uid = rendezvous_object(objects)["metadata"]["uid"]

    up, four = scale_up(team_a, NAMESPACE, started, 4)
    print(f"Kueue elastic, 3 -> 4: {up}")
    assert up.details["replaces"] and up.details["replaces"].endswith(first["metadata"]["name"]), up.details
    replaced = next(w for w in job_workloads(objects, NAMESPACE) if w["metadata"]["name"] == first["metadata"]["name"])
    finished = condition(replaced, "Finished")
    assert finished is not None and finished["reason"] == "WorkloadSliceReplaced", replaced.get("status")
    assert four.round > started.round and len(four.pods) == 4
    assert set(started.pods) < set(four.pods), "the old pods stay: a slice, not a re-admission"
    status = rendezvous_status(objects, NAMESPACE)
    assert member_addresses(status) == set(four.pods.values()), status

    past, five = scale_past_max(team_a, NAMESPACE, four, 5)
    print(f"Kueue elastic, 4 -> 5 (maxNodes 4): {past}")
    (spare,) = sorted(set(five) - set(four.pods))
    status = rendezvous_status(objects, NAMESPACE)
    assert int(status["round"]) == four.round, "a spare restarts nobody"
    assert member_addresses(status) == set(four.pods.values()) and five[spare] not in member_addresses(status)
    report = rdzv_status(team_a)
    assert (report["participantCount"], report["redundantCount"]) == (4, 1), report
    assert worker_rounds(team_a.node, NAMESPACE, spare) == 0, "the spare trains nothing"

    every = dict(four.pods)
    every[spare] = five[spare]
    down, three = scale_down(team_a, NAMESPACE, Started(every, four.trained, four.round), 3)
    print(f"Kueue elastic, 5 -> 3: {down}")
    assert spare in down.details["removed"] and len(down.details["removed"]) == 2, down.details
    assert set(three.pods) < set(started.pods) | set(four.pods) and three.round > four.round
    job_status = batch.read_namespaced_job(RENDEZVOUS, NAMESPACE).status
    assert job_status is not None and (job_status.failed or 0) == 0, job_status
    assert not {c.type for c in job_status.conditions or [] if c.status == "True"} & {"Failed", "FailureTarget"}
    assert rendezvous_object(objects)["metadata"]["uid"] == uid, "the same Rendezvous"

    story = rendezvous_events(core, NAMESPACE)
    print("\n".join(f"{reason}: {message}" for reason, message in story))
    completed = [message for reason, message in story if reason == "RoundCompleted"]
    for pods in (four.pods, three.pods):
        assert any(f"with {len(pods)} nodes" in m and all(a in m for a in pods.values()) for m in completed), story
    print(team_a.plane.kubectl("-n", NAMESPACE, "get", "rdzv,job,workloads,pods", "-o", "wide").stdout)


def test_a_jobset_in_place_restart_restarts_every_container_in_its_pod_and_they_form_the_next_round(
    team_a: Cluster,
) -> None:
    """examples/torch/jobset-in-place.yaml (4 pods, ``--nnodes=2:4``, ``restartStrategy: InPlaceRestart``, JobSet's
    agent as each container's main process). One pod's container is SIGKILLed: it restarts in place (its restart
    rule), its agent asks for attempt 1, JobSet outdates attempt 0 (``previousInPlaceRestartAttempt`` 0), the other
    agents exit 42 and their containers restart in place too; at attempt 1 everywhere (``currentInPlaceRestartAttempt``
    1) the agents start torchrun. The same 4 pods (same uids, every container restarted once, none recreated) form a
    later round of the same Rendezvous and all train with 4 again: every member of that round is a new agent (4
    slots, 4 restarted agents training in it). The JobSet neither fails nor counts a recreating restart."""
    api = admin_api(team_a)
    objects = client.CustomObjectsApi(api)
    apply(team_a, in_place_objects())
    started = start_training(team_a, NAMESPACE, RESTART_SELECTOR, 4)
    uid = rendezvous_object(objects)["metadata"]["uid"]
    jobset = get_jobset(objects, NAMESPACE)
    assert jobset["status"].get("currentInPlaceRestartAttempt") == 0, jobset["status"]

    restart = restart_in_place(team_a, NAMESPACE, started)
    print(f"JobSet in-place restart: {restart}")
    assert restart.training is not None and restart.details["same_pods"], restart.details
    assert set(restart.details["restart_counts"]) == set(started.pods), restart.details
    assert all(count >= 1 for count in restart.details["restart_counts"].values()), restart.details
    status = restart.details["jobset_status"]
    assert (status.get("previousInPlaceRestartAttempt"), status.get("currentInPlaceRestartAttempt")) == (0, 1), status
    assert (status.get("restarts") or 0) == 0 and not status.get("terminalState"), status
    assert restart.details["round"] > started.round
    assert rendezvous_object(objects)["metadata"]["uid"] == uid, "the same Rendezvous"
    final = rendezvous_status(objects, NAMESPACE)
    assert member_addresses(final) == set(started.pods.values()) and len(final["participants"]) == 4, final
    story = rendezvous_events(client.CoreV1Api(api), NAMESPACE)
    print("\n".join(f"{r}: {m}" for r, m in story))
    # The operator evicts a restarted container's old agent; its pod stays, and the Event says so.
    evicted = [message for reason, message in story if reason == "NodeEvicted"]
    assert any("has no running container" in m for m in evicted) and not any("is gone" in m for m in evicted), story
