"""A running training Job resized: Kueue's elastic jobs (workload slices) and the bare Job the same.

``examples/training-job.yaml`` opts in to Kueue's workload slices with the annotation its comment names
(``kueue.x-k8s.io/elastic-job: "true"``) beside the queue label. A resize is one patch of ``completions`` and
``parallelism`` together (the example is an Indexed Job: Kubernetes lets both change only together, while they are
equal). Up: the Job controller creates the new indexes' pods at once, Kueue's webhook has put its scheduling gate
``kueue.x-k8s.io/elastic-job`` on them, and Kueue admits a new Workload (the slice replacing the admitted one, the
old one Finished ``WorkloadSliceReplaced``) before it lifts the gate. Down: Kueue shrinks the admitted Workload's
count in place; the Job controller deletes the pods of the indexes now out of range, without counting them as
failed or succeeded, and each agent leaves on SIGTERM.

Used by ``tests/test_elastic_controllers.py`` (asserted) and ``benchmarks/elastic_jobs.py`` (timed, beside
the same resize of the bare Job). Times are seconds from the patch.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from tests.e2e.real_pods import RENDEZVOUS, rendezvous_status, worker_rounds
from tests.e2e.workloads import (
    JOB_NAME_LABEL,
    Started,
    admin_api,
    formed,
    live_pods,
    queue_objects,
    queued_job_objects,
    running,
)
from tests.testenv import wait_until
from tests.testenv.cluster import Cluster

#: Kueue's opt-in of a Job to workload slices, and the scheduling gate its webhook puts on such a Job's pods.
ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"
#: Which Workload a scaled-up slice replaces (Kueue's ``WorkloadSliceReplacementFor`` annotation).
SLICE_REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"
#: The Job controller's annotation of each pod's index.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: The example's pods' requests as ``real_pods.fit_pod`` fits them (what Kueue counts against the quota).
POD_CPU_MILLI, POD_MEMORY_MI = 100, 256
SELECTOR = f"{JOB_NAME_LABEL}={RENDEZVOUS}"


def elastic_queue_objects(namespace: str, pods: int) -> list[dict[str, Any]]:
    """``workloads.queue_objects`` with a quota of exactly ``pods`` of the example's pods."""
    objects = copy.deepcopy(queue_objects(namespace))
    queue = next(item for item in objects if item["kind"] == "ClusterQueue")
    resources = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    quota = {"cpu": f"{pods * POD_CPU_MILLI}m", "memory": f"{pods * POD_MEMORY_MI}Mi"}
    for resource in resources:
        resource["nominalQuota"] = quota[resource["name"]]
    return objects


def elastic_job_objects(pods: int, *, kueue: bool = True, **environment: str) -> list[dict[str, Any]]:
    """The Rendezvous and the example Job of ``pods`` pods, queued by Kueue (its queue label) and opted in to
    workload slices (the annotation) as the example's comment says; ``kueue=False``: the bare Job, neither."""
    objects = queued_job_objects(**environment)
    job = next(item for item in objects if item["kind"] == "Job")
    job["spec"]["completions"] = job["spec"]["parallelism"] = pods
    if kueue:
        job["metadata"].setdefault("annotations", {})[ELASTIC_JOB] = "true"
    else:
        del job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    return objects


def resize(cluster: Cluster, namespace: str, pods: int) -> None:
    """``kubectl patch`` the Job's ``completions`` and ``parallelism`` to ``pods`` (one request)."""
    body = json.dumps({"spec": {"completions": pods, "parallelism": pods}})
    cluster.plane.kubectl("-n", namespace, "patch", "job", RENDEZVOUS, "--type=merge", "-p", body)


def job_workloads(objects: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    """The Job's Workloads (every slice, Finished ones too), oldest first."""
    uid = client.BatchV1Api(objects.api_client).read_namespaced_job(RENDEZVOUS, namespace).metadata.uid
    found = objects.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
    mine = [w for w in found if any(o.get("uid") == uid for o in w["metadata"].get("ownerReferences") or [])]
    return sorted(mine, key=lambda w: w["metadata"]["creationTimestamp"])


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The Workload's condition ``kind`` when it is True."""
    conditions: list[dict[str, Any]] = (workload.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind and c["status"] == "True"), None)


def trained_more(
    cluster: Cluster, namespace: str, pods: Iterable[str], world: int, before: Mapping[str, int]
) -> dict[str, int] | None:
    """Each of ``pods``' rounds of ``world`` workers that trained a step, once every one has more than ``before``
    says (0 for a pod it does not name)."""
    rounds = {pod: worker_rounds(cluster.node, namespace, pod, world) for pod in pods}
    return rounds if all(count > before.get(pod, 0) for pod, count in rounds.items()) else None


def rounds_of(cluster: Cluster, namespace: str, pods: Iterable[str], world: int) -> dict[str, int]:
    """Each of ``pods``' rounds of ``world`` workers that trained a step so far."""
    return {pod: worker_rounds(cluster.node, namespace, pod, world) for pod in pods}


def train_together(
    cluster: Cluster,
    namespace: str,
    pods: dict[str, str],
    after: int,
    before: Mapping[str, int],
    window: float,
    what: str,
) -> Started:
    """Wait for a round later than ``after`` of exactly ``pods`` (name -> address) and for each to train in it with
    ``len(pods)`` workers (more rounds than ``before``); return them."""
    objects = client.CustomObjectsApi(admin_api(cluster))
    world = len(pods)
    status = wait_until(lambda: formed(objects, namespace, pods, after), window, f"a round of {what}")
    trained = wait_until(
        lambda: trained_more(cluster, namespace, pods, world, before), window, f"{what} training with {world}"
    )
    return Started(pods, trained, int(status["round"]))


def admitted_slice(objects: client.CustomObjectsApi, namespace: str, pods: int) -> dict[str, Any] | None:
    """The Job's Workload that is admitted for ``pods`` pods and not finished (the active slice), if any."""
    for workload in job_workloads(objects, namespace):
        counts = [podset["count"] for podset in workload["spec"]["podSets"]]
        if counts == [pods] and condition(workload, "Admitted") and not condition(workload, "Finished"):
            return workload
    return None


def pod_indexes(core: client.CoreV1Api, namespace: str, pods: dict[str, str]) -> dict[str, int]:
    """name -> completion index of ``pods``."""
    return {
        name: int(core.read_namespaced_pod(name, namespace).metadata.annotations[COMPLETION_INDEX]) for name in pods
    }


def gated(core: client.CoreV1Api, namespace: str) -> list[str]:
    """The Job's live pods that still carry Kueue's elastic-job scheduling gate."""
    return sorted(
        pod.metadata.name
        for pod in live_pods(core, namespace, SELECTOR)
        if any(gate.name == ELASTIC_JOB for gate in pod.spec.scheduling_gates or [])
    )


@dataclass
class Resize:
    """What a resize of the running Job led to, in seconds from the patch (None: not waited for)."""

    before: int
    after: int
    #: Kueue admitted the slice of the new size (up: a new Workload; down: the admitted one's count shrunk).
    admitted: float | None = None
    #: Up: every pod Running. Down: the removed pods gone.
    pods: float | None = None
    #: Every pod of the round (all, or the survivors) training in a round of the new size.
    training: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def scale_up(
    cluster: Cluster, namespace: str, started: Started, pods: int, *, kueue: bool = True, window: float = 120
) -> tuple[Resize, Started]:
    """Patch the Job from ``len(started.pods)`` to ``pods`` pods (at most the Rendezvous's maxNodes); wait for Kueue
    to admit a slice of ``pods`` (``kueue``), for the new pods to run, and for every pod to train in a later round
    of them all. Returns the times and the pods that train."""
    api = admin_api(cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    found = Resize(len(started.pods), pods)
    before = rounds_of(cluster, namespace, started.pods, pods)
    resize(cluster, namespace, pods)
    patched = time.monotonic()
    if kueue:
        found.details["gated"] = gated(core, namespace)  # for as long as Kueue has not admitted the new slice
        admitted = wait_until(lambda: admitted_slice(objects, namespace, pods), window, f"a slice of {pods} admitted")
        found.admitted = time.monotonic() - patched
        found.details["slice"] = admitted["metadata"]["name"]
        found.details["replaces"] = (admitted["metadata"].get("annotations") or {}).get(SLICE_REPLACES)
    now = wait_until(lambda: running(core, namespace, SELECTOR, pods), window, f"{pods} pods Running")
    found.pods = time.monotonic() - patched
    found.details["new"] = sorted(set(now) - set(started.pods))
    together = train_together(cluster, namespace, now, started.round, before, window, f"all {pods} pods")
    found.training = time.monotonic() - patched
    found.details["round"] = together.round
    return found, together


def scale_down(
    cluster: Cluster, namespace: str, started: Started, pods: int, *, kueue: bool = True, window: float = 120
) -> tuple[Resize, Started]:
    """Patch the Job from ``len(started.pods)`` to ``pods`` pods; wait for Kueue's admitted slice to shrink to
    ``pods`` (``kueue``), for the pods of the indexes out of range to go, and for the survivors to train in a later
    round of just them. ``started.pods`` may include spares (not in the round): the round waited for is the
    survivors'."""
    api = admin_api(cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    indexes = pod_indexes(core, namespace, started.pods)
    removed = sorted(name for name, index in indexes.items() if index >= pods)
    survivors = {name: address for name, address in started.pods.items() if name not in removed}
    found = Resize(len(started.pods), pods, details={"removed": removed})
    before = rounds_of(cluster, namespace, survivors, pods)
    resize(cluster, namespace, pods)
    patched = time.monotonic()
    if kueue:
        wait_until(lambda: admitted_slice(objects, namespace, pods), window, f"the admitted slice shrunk to {pods}")
        found.admitted = time.monotonic() - patched
    wait_until(
        lambda: not {p.metadata and p.metadata.name for p in live_pods(core, namespace, SELECTOR)} & set(removed),
        window,
        f"the removed pods ({', '.join(removed)}) gone",
    )
    found.pods = time.monotonic() - patched
    together = train_together(cluster, namespace, survivors, started.round, before, window, f"the {pods} survivors")
    found.training = time.monotonic() - patched
    found.details["round"] = together.round
    return found, together


def scale_past_max(
    cluster: Cluster, namespace: str, started: Started, pods: int, window: float = 120
) -> tuple[Resize, dict[str, str]]:
    """Patch the Job (Kueue's elastic one) from ``len(started.pods)`` = the Rendezvous's maxNodes to ``pods``: Kueue
    admits the slice, the pods beyond maxNodes run and wait as spares (``status.spareCount``). Returns the times
    (``training``: the spares counted) and every live pod."""
    api = admin_api(cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    extra = pods - len(started.pods)
    found = Resize(len(started.pods), pods)
    resize(cluster, namespace, pods)
    patched = time.monotonic()
    wait_until(lambda: admitted_slice(objects, namespace, pods), window, f"a slice of {pods} admitted")
    found.admitted = time.monotonic() - patched
    now = wait_until(lambda: running(core, namespace, SELECTOR, pods), window, f"{pods} pods Running")
    found.pods = time.monotonic() - patched
    status = wait_until(
        lambda: (status := rendezvous_status(objects, namespace)).get("spareCount") == extra and status,
        window,
        f"{extra} spare(s) on the Rendezvous",
    )
    found.training = time.monotonic() - patched
    found.details["status"] = status
    return found, now
