"""JobSet's restarts met by a Rendezvous: the in-place restart (``examples/torch/jobset-in-place.yaml``), the
recreating restart (``examples/torch/jobset.yaml``) and the ``RestartJob`` action
(``examples/torch/jobset-restart-job.yaml``), each fitted like the other examples and timed from its fault.

- **In place**: a container of one pod is killed (SIGKILL through containerd, as an OOM kill or a crash): it
  restarts in place (its restart rule), its agent asks for the next restart attempt, JobSet marks the others'
  attempt outdated, their agents exit 42 and their containers restart in place too; once all 4 are at the new
  attempt the agents start torchrun, and the 4 pods (the same pods) form a new round.
- **Recreated**: every pod of the example deleted at once: the Job fails (``backoffLimit`` spent) and JobSet
  recreates it; 4 new pods form a new round.
- **RestartJob**: both pods of Job 1 of 2 deleted: that Job fails and JobSet recreates it alone; Job 0's 2 pods
  train on in a round of 2, then the recreated Job's pods join a round of 4.

Used by ``tests/test_elastic_controllers.py`` (asserted) and ``benchmarks/elastic_jobs.py`` (timed). Times
are seconds from the fault.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from tests.e2e.elastic import rounds_of, train_together, trained_more
from tests.e2e.real_pods import RENDEZVOUS, fit_pod, fitted_command, rendezvous_status
from tests.e2e.workloads import (
    JOBSET_NAME_LABEL,
    TORCH_SCRIPT,
    TORCHRUN,
    Started,
    admin_api,
    example,
    live_pods,
    running,
)
from tests.testenv import wait_until
from tests.testenv.cluster import Cluster
from tests.testenv.workloads import build_in_place_restart_agent

SELECTOR = f"{JOBSET_NAME_LABEL}={RENDEZVOUS}"
#: Where the fitted pods find JobSet's agent (its cache folder, mounted read-only).
AGENT_MOUNT = "/opt/jobset-in-place-restart-agent"
#: The label JobSet puts on each Job and its pods: the Job's index within its replicated Job.
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")


def in_place_objects(**environment: str) -> list[dict[str, Any]]:
    """``examples/torch/jobset-in-place.yaml`` (its Role, RoleBinding and JobSet), fitted: the pod as
    ``real_pods.fit_pod`` fits the others, the agent (built here) mounted and run as the container's command, and
    its ``WORKER_COMMAND`` the example's torchrun command line fitted as ``fitted_command`` fits the others."""
    objects = example("torch/jobset-in-place.yaml")
    jobset = next(item for item in objects if item["kind"] == "JobSet")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    shipped = {item["name"]: item for item in container["env"]}
    worker = shlex.split(shipped["WORKER_COMMAND"]["value"])
    assert worker[:2] == ["exec", "torchrun"], worker
    fit_pod(pod, TORCHRUN, TORCH_SCRIPT, **environment)
    agent = build_in_place_restart_agent()
    pod["volumes"].append({"name": "jobset-agent", "hostPath": {"path": str(agent.parent)}})
    container["volumeMounts"].append({"name": "jobset-agent", "mountPath": AGENT_MOUNT, "readOnly": True})
    container["command"], container["args"] = [f"{AGENT_MOUNT}/{agent.name}"], []
    shipped["WORKER_COMMAND"]["value"] = "exec " + shlex.join(fitted_command(worker[1:], TORCHRUN, TORCH_SCRIPT))
    container["env"].append({"name": "SHELL", "value": "/usr/bin/bash"})
    return objects


def restart_job_objects(**environment: str) -> list[dict[str, Any]]:
    """``examples/torch/jobset-restart-job.yaml``, fitted as ``workloads.jobset_objects`` fits jobset.yaml."""
    (jobset,) = example("torch/jobset-restart-job.yaml")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    fit_pod(pod, TORCHRUN, TORCH_SCRIPT, **environment)
    return [jobset]


def get_jobset(objects: client.CustomObjectsApi, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = objects.get_namespaced_custom_object(*JOBSETS[:2], namespace, JOBSETS[2], RENDEZVOUS)
    return found


def restart_counts(core: client.CoreV1Api, namespace: str) -> dict[str, int]:
    """name -> its container's restart count, of the JobSet's live pods."""
    return {
        pod.metadata.name: sum(status.restart_count for status in pod.status.container_statuses or [])
        for pod in live_pods(core, namespace, SELECTOR)
    }


def pod_uids(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    return {pod.metadata.name: pod.metadata.uid for pod in live_pods(core, namespace, SELECTOR)}


def node_of(cluster: Cluster, core: client.CoreV1Api, namespace: str, pod: str) -> Any:
    """The test node that runs ``pod``."""
    name = core.read_namespaced_pod(pod, namespace).spec.node_name
    return next(node for node in cluster.nodes if node.name == name)


@dataclass
class Restart:
    """What a restart led to, in seconds from its fault (None: not within the window)."""

    how: str
    round_before: int
    #: Every pod again training with all of them (the same pods in place; new pods when recreated).
    training: float | None = None
    #: RestartJob: the other Job's pods training again (a round of fewer).
    others_training: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def restart_in_place(cluster: Cluster, namespace: str, started: Started, window: float = 180) -> Restart:
    """SIGKILL the container of one pod (not rank 0's: any would do) and wait until the same pods, every container
    restarted once, train in a later round of them all."""
    api = admin_api(cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    count = len(started.pods)
    victim = sorted(started.pods)[-1]
    uids = pod_uids(core, namespace)
    restarts = restart_counts(core, namespace)
    found = Restart("in place", started.round, details={"victim": victim})
    container = core.read_namespaced_pod(victim, namespace).status.container_statuses[0].container_id
    before = rounds_of(cluster, namespace, started.pods, count)
    node_of(cluster, core, namespace, victim).kill_container(container)
    killed = time.monotonic()
    wait_until(
        lambda: all(n > restarts[pod] for pod, n in restart_counts(core, namespace).items()),
        window,
        "every pod's container restarted in place",
    )
    found.details["restarted"] = time.monotonic() - killed
    now = wait_until(lambda: running(core, namespace, SELECTOR, count), window, f"{count} pods Running")
    found.details["same_pods"] = pod_uids(core, namespace) == uids
    together = train_together(cluster, namespace, now, started.round, before, window, f"the {count} pods")
    found.training = time.monotonic() - killed
    found.details["round"] = together.round
    found.details["restart_counts"] = restart_counts(core, namespace)
    found.details["trained"] = together.trained
    found.details["jobset_status"] = get_jobset(objects, namespace).get("status")
    return found


def restart_recreated(cluster: Cluster, namespace: str, started: Started, window: float = 180) -> Restart:
    """Delete every pod of ``examples/torch/jobset.yaml`` at once: the Job fails, JobSet restarts (recreates) it;
    wait until 4 new pods train in a later round."""
    api = admin_api(cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    count = len(started.pods)
    found = Restart("recreated", started.round)
    cluster.plane.kubectl("-n", namespace, "delete", "pods", "-l", SELECTOR, "--wait=false")
    deleted = time.monotonic()
    now = wait_until(
        lambda: (pods := running(core, namespace, SELECTOR, count)) and not set(pods) & set(started.pods) and pods,
        window,
        f"{count} new pods Running",
    )
    together = train_together(cluster, namespace, now, started.round, {}, window, f"the {count} new pods")
    found.training = time.monotonic() - deleted
    found.details["round"] = together.round
    found.details["jobset_status"] = get_jobset(objects, namespace).get("status")
    return found


def restart_one_job(cluster: Cluster, namespace: str, started: Started, window: float = 180) -> Restart:
    """Delete both pods of Job 1 (``kubectl delete pod``: counted failures): the Job fails, JobSet's RestartJob
    recreates it alone. Wait until Job 0's pods train in a round of their own, then until the recreated Job's new
    pods train with them in a round of all."""
    api = admin_api(cluster)
    core, batch, objects = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    count = len(started.pods)
    jobs = {job.metadata.name: job.metadata.uid for job in batch.list_namespaced_job(namespace).items}
    doomed = {pod.metadata.name for pod in live_pods(core, namespace, f"{SELECTOR},{JOB_INDEX_LABEL}=1")}
    others = {name: address for name, address in started.pods.items() if name not in doomed}
    found = Restart("RestartJob", started.round, details={"deleted": sorted(doomed), "jobs_before": jobs})
    alone, before = rounds_of(cluster, namespace, others, len(others)), rounds_of(cluster, namespace, others, count)
    cluster.plane.kubectl("-n", namespace, "delete", "pods", *sorted(doomed), "--wait=false")
    deleted = time.monotonic()
    wait_until(
        lambda: trained_more(cluster, namespace, others, len(others), alone),
        window,
        f"the other Job's {len(others)} pods training on",
    )
    found.others_training = time.monotonic() - deleted
    now = wait_until(
        lambda: (pods := running(core, namespace, SELECTOR, count)) and not set(pods) & doomed and pods,
        window,
        f"{count} pods Running, the recreated Job's among them",
    )
    together = train_together(cluster, namespace, now, started.round, before, window, f"the {count} pods")
    found.training = time.monotonic() - deleted
    found.details["round"] = together.round
    found.details["jobs_after"] = {
        job.metadata.name: job.metadata.uid for job in batch.list_namespaced_job(namespace).items
    }
    found.details["jobset_status"] = get_jobset(objects, namespace).get("status")
    found.details["rendezvous"] = rendezvous_status(objects, namespace)
    return found
