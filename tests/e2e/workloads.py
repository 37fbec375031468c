"""The examples on the workload controllers users run (``tests.testenv.workloads``): ``examples/torch/jobset.yaml``,
``examples/torch/trainjob.yaml``, ``examples/torch/pytorchjob.yaml``, and ``examples/training-job.yaml`` queued by
Kueue; the faults each case injects where they happen (an eviction through the Eviction API, a ``kubectl delete
pod``, a Kueue preemption) and what to watch in them.

Used by ``tests/test_workloads.py`` (each case once, asserted) and ``benchmarks/workloads.py`` (repeated, timed).
The manifests are the examples as shipped, fitted by ``real_pods.fit_pod`` (the image, the host's interpreter
mounted, small requests, the training script). Times are seconds from the fault.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.e2e.real_pods import (
    RENDEZVOUS,
    REPO,
    example_objects,
    fit_pod,
    fitted_command,
    member_addresses,
    pod_log,
    rendezvous_status,
    round_with,
    start_training_pods,
    worker_rounds,
)
from tests.testenv import wait_until
from tests.testenv.cluster import Cluster
from tests.testenv.images import PAUSE_IMAGE, TRAINING_IMAGE, venv_python

#: The README's namespace: the chart's trainingRBAC is installed for it (``--set trainingRBAC.namespaces={team-a}``).
NAMESPACE = "team-a"
#: Stock torchrun of the virtualenv, and the torch training script.
TORCHRUN = [str(Path(venv_python()).parent / "torchrun")]
TORCH_SCRIPT = REPO / "tests" / "e2e" / "train_torch.py"
#: The LocalQueue, ClusterQueue and the WorkloadPriorityClass of the preempting Job.
LOCAL_QUEUE, CLUSTER_QUEUE, HIGH_PRIORITY = "user-queue", "cluster-queue", "high"
#: The preempting Job: one pod of the pause image, at high priority.
PREEMPTOR = "urgent"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
#: The training-operator's label of a PyTorchJob's pods.
PYTORCHJOB_NAME_LABEL = "training.kubeflow.org/job-name"


def example(name: str) -> list[dict[str, Any]]:
    """The objects of ``examples/<name>`` as shipped."""
    return [item for item in yaml.safe_load_all((REPO / "examples" / name).read_text()) if item]


def jobset_objects(**environment: str) -> list[dict[str, Any]]:
    """``examples/torch/jobset.yaml``, fitted."""
    (jobset,) = example("torch/jobset.yaml")
    job = jobset["spec"]["replicatedJobs"][0]["template"]
    fit_pod(job["spec"]["template"]["spec"], TORCHRUN, TORCH_SCRIPT, **environment)
    return [jobset]


def pytorchjob_objects(**environment: str) -> list[dict[str, Any]]:
    """``examples/torch/pytorchjob.yaml``, fitted (its Worker template; the container keeps its name, ``pytorch``,
    which the training-operator's webhook requires)."""
    (job,) = example("torch/pytorchjob.yaml")
    fit_pod(job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"], TORCHRUN, TORCH_SCRIPT, **environment)
    return [job]


def trainjob_objects(**environment: str) -> list[dict[str, Any]]:
    """``examples/torch/trainjob.yaml``, fitted (``fit_trainjob``)."""
    runtime, trainjob = example("torch/trainjob.yaml")
    return fit_trainjob(runtime, trainjob, **environment)


def chart_runtime_trainjob_objects(helm_home: Path, **environment: str) -> list[dict[str, Any]]:
    """The chart's ClusterTrainingRuntime (``helm template --set trainingRuntime.enabled=true``) and the TrainJob of
    ``examples/torch/trainjob.yaml`` naming it instead of the example's TrainingRuntime, fitted (``fit_trainjob``)."""
    from tests.test_chart import Helm, the
    from tests.testenv import ensure_binaries

    rendered = Helm(ensure_binaries().helm, helm_home).template(
        "trainingRuntime.enabled=true", release=RELEASE, namespace=RELEASE_NAMESPACE
    )
    runtime = the(rendered, "ClusterTrainingRuntime")
    _, trainjob = example("torch/trainjob.yaml")
    trainjob["spec"]["runtimeRef"] = {"kind": runtime["kind"], "name": runtime["metadata"]["name"]}
    return fit_trainjob(runtime, trainjob, **environment)


def fit_trainjob(runtime: dict[str, Any], trainjob: dict[str, Any], **environment: str) -> list[dict[str, Any]]:
    """A (Cluster)TrainingRuntime and a TrainJob naming it, fitted: the runtime's pod (image, mounts, requests) and
    the TrainJob's image and command (Trainer sets the command it gives on the runtime's container)."""
    job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    pod = fit_pod(job["spec"]["template"]["spec"], TORCHRUN, TORCH_SCRIPT, **environment)
    for key in ("command", "args"):
        pod["containers"][0].pop(key, None)
    trainer = trainjob["spec"]["trainer"]
    trainer["image"] = TRAINING_IMAGE
    trainer["command"] = fitted_command(trainer["command"], TORCHRUN, TORCH_SCRIPT)
    # Trainer's default, "auto", is one worker per GPU, else per CPU: one here, as --nproc-per-node=1 elsewhere.
    trainer["numProcPerNode"] = 1
    return [runtime, trainjob]


def queue_objects(namespace: str) -> list[dict[str, Any]]:
    """Kueue's single-ClusterQueue setup (its ``single-clusterqueue-setup.yaml``) sized for the fitted example Job
    (3 pods of 100m and 256Mi: the quota holds them and nothing more), preemption of lower priorities within it,
    and the WorkloadPriorityClass ``high``."""
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": "default-flavor",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "300m"},
                                    {"name": "memory", "nominalQuota": "768Mi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": HIGH_PRIORITY},
            "value": 1000,
            "description": "preempts the example Job",
        },
    ]


def queued_job_objects(**environment: str) -> list[dict[str, Any]]:
    """``examples/rendezvous.yaml`` and the Job of ``examples/training-job.yaml``, fitted, with the label its
    comment tells a Kueue user to add (the chart's trainingRBAC provides the ServiceAccount and Role)."""
    objects = [item for item in example_objects(**environment) if item["kind"] in ("Rendezvous", "Job")]
    job = next(item for item in objects if item["kind"] == "Job")
    job["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = LOCAL_QUEUE
    return objects


def preemptor_objects() -> list[dict[str, Any]]:
    """A Job of one pause pod at priority ``high`` in the same LocalQueue: admitting it needs the quota the
    example Job holds."""
    return [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": PREEMPTOR,
                "labels": {
                    "kueue.x-k8s.io/queue-name": LOCAL_QUEUE,
                    "kueue.x-k8s.io/priority-class": HIGH_PRIORITY,
                },
            },
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "pause",
                                "image": PAUSE_IMAGE,
                                "imagePullPolicy": "Never",
                                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                            }
                        ],
                    }
                },
            },
        }
    ]


# -- watching -----------------------------------------------------------------------------------


def live_pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[client.V1Pod]:
    """The pods of ``selector`` that are not being deleted and have not ended."""
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")]


def running(core: client.CoreV1Api, namespace: str, selector: str, count: int, gone: str = "") -> dict[str, str] | None:
    """name -> address of the pods of ``selector`` once exactly ``count`` exist and all run with an address, and none
    is the pod of uid ``gone`` (its replacement may have its name, as a PyTorchJob's has)."""
    pods = live_pods(core, namespace, selector)
    if any(p.metadata.uid == gone for p in pods):
        return None
    ready = {p.metadata.name: p.status.pod_ip for p in pods if p.status.phase == "Running" and p.status.pod_ip}
    return ready if len(ready) == count == len(pods) else None


def formed(
    objects: client.CustomObjectsApi, namespace: str, pods: dict[str, str], after: int = -1
) -> dict[str, Any] | None:
    """The Rendezvous status, once a round later than ``after`` formed (Complete) with exactly ``pods``' addresses;
    None while there is no Rendezvous (the agents create it)."""
    try:
        return round_with(objects, namespace, pods, after, phases=("Complete",))
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def rank_zero_pod(objects: client.CustomObjectsApi, namespace: str, pods: dict[str, str]) -> str:
    status = rendezvous_status(objects, namespace)
    address = next(p["node"].rsplit("_", 2)[0] for p in status["participants"] if p["rank"] == 0)
    return next(name for name, found in pods.items() if found == address)


def evict(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    """``pod`` evicted through the Eviction API, as ``kubectl drain``, a preemption or an autoscaler does: the API
    server sets its ``DisruptionTarget`` condition, then deletes it."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    core.create_namespaced_pod_eviction(pod, namespace, body)


def log_tail(cluster: Cluster, namespace: str, pod: str, lines: int = 30) -> str:
    return "\n".join(pod_log(cluster.node, namespace, pod)[-lines:])


@dataclass
class Started:
    """A workload's pods once they trained together: name -> address, their workers' trained rounds, the round."""

    pods: dict[str, str]
    trained: dict[str, int]
    round: int


def start_training(
    cluster: Cluster, namespace: str, selector: str, count: int, window: float = 180, after: int = -1
) -> Started:
    """Wait for ``count`` pods of ``selector`` to run, form a round (later than ``after``) and train together."""
    api = admin_api(cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    started = start_training_pods(
        cluster.node,
        namespace,
        lambda: running(core, namespace, selector, count),
        count,
        formed=lambda pods: formed(objects, namespace, pods, after),
        what=f"the {count} pods of {selector}",
        running_timeout=window,
        timeout=window,
    )
    trained = {pod: worker_rounds(cluster.node, namespace, pod) for pod in started.pods}
    return Started(started.pods, trained, int(started.status["round"]))


@dataclass
class Recovery:
    """What a fault led to, in seconds from it (None: not within the window)."""

    victim: str
    survivors_training: float | None = None
    replacement_training: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def lose_a_pod_and_recover(
    cluster: Cluster,
    namespace: str,
    selector: str,
    started: Started,
    victim: str,
    how: str = "evict",
    window: float = 120,
    replacement: bool = True,
) -> Recovery:
    """Take ``victim`` away (``how``: ``evict`` through the Eviction API, or ``delete`` as ``kubectl delete pod``);
    time the survivors' next trained round (with one fewer) and, with ``replacement``, the replacement's (a round of
    them all again)."""
    api = admin_api(cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    count = len(started.pods)
    survivors = sorted(set(started.pods) - {victim})
    gone = core.read_namespaced_pod(victim, namespace).metadata.uid
    if how == "evict":
        evict(core, namespace, victim)
    else:
        core.delete_namespaced_pod(victim, namespace)
    lost = time.monotonic()
    recovery = Recovery(victim)
    # The pod stays while its agent handles SIGTERM: the conditions the eviction (or deletion) left on it.
    with contextlib.suppress(client.ApiException):
        conditions = core.read_namespaced_pod(victim, namespace).status.conditions or []
        recovery.details["conditions"] = {c.type: c.reason for c in conditions if c.status == "True"}
    try:
        wait_until(
            lambda: all(worker_rounds(cluster.node, namespace, pod) > started.trained[pod] for pod in survivors),
            window,
            f"the other pods ({', '.join(survivors)}) training again",
        )
    except TimeoutError:
        recovery.details["logs"] = {pod: log_tail(cluster, namespace, pod) for pod in survivors}
        return recovery
    recovery.survivors_training = time.monotonic() - lost
    if not replacement:
        return recovery
    after = wait_until(lambda: running(core, namespace, selector, count, gone), window, "the replacement Running")
    new = sorted(set(after) - set(survivors))
    uids = {pod: core.read_namespaced_pod(pod, namespace).metadata.uid for pod in new}
    recovery.details["replacements"] = new
    status = wait_until(
        lambda: formed(objects, namespace, after, started.round), window, "a round with the replacement"
    )
    recovery.details["round"] = int(status["round"])
    wait_until(
        lambda: all(worker_rounds(cluster.node, namespace, pod, count, uids[pod]) > 0 for pod in new),
        window,
        f"the replacement {', '.join(new)} training with {count}",
    )
    recovery.replacement_training = time.monotonic() - lost
    return recovery


def admin_api(cluster: Cluster) -> client.ApiClient:
    """An API client of ``cluster`` as its admin."""
    from kubernetes import config

    return config.new_client_from_config(str(cluster.plane.admin_kubeconfig))


def rendezvous_events(core: client.CoreV1Api, namespace: str) -> list[tuple[str, str]]:
    """(reason, message) of the Events about the Rendezvous (this object, not an earlier one of its name), oldest
    first."""
    uid = client.CustomObjectsApi(core.api_client).get_namespaced_custom_object(
        "kube-rendezvous.io", "v1alpha1", namespace, "rendezvouses", RENDEZVOUS
    )["metadata"]["uid"]
    selector = f"involvedObject.kind=Rendezvous,involvedObject.name={RENDEZVOUS},involvedObject.uid={uid}"
    found = core.list_namespaced_event(namespace, field_selector=selector).items
    found.sort(key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    return [(e.reason, e.message) for e in found]


@dataclass
class Preemption:
    """What a Kueue preemption of the example Job led to, in seconds from the preempting Job's creation."""

    round_before: int
    suspended: float | None = None
    pods_gone: float | None = None
    readmitted: float | None = None
    training_again: float | None = None
    completed: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def job_condition(batch: client.BatchV1Api, namespace: str, name: str, kind: str) -> bool:
    job = batch.read_namespaced_job(name, namespace)
    return any(c.type == kind and c.status == "True" for c in job.status.conditions or [])


def preempt_and_readmit(cluster: Cluster, namespace: str, started: Started, window: float = 180) -> Preemption:
    """Create the high-priority Job: Kueue preempts the example Job (suspends it: every pod deleted); delete the
    preemptor once the example's pods are gone: Kueue re-admits the example, whose new pods form a new round of the
    same Rendezvous and train to the end (the Job completes)."""
    api = admin_api(cluster)
    core, batch, objects = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    selector = f"{JOB_NAME_LABEL}={RENDEZVOUS}"
    count = len(started.pods)
    found = Preemption(started.round)
    cluster.plane.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(preemptor_objects()))
    preempted = time.monotonic()
    wait_until(lambda: batch.read_namespaced_job(RENDEZVOUS, namespace).spec.suspend, window, "the Job suspended")
    found.suspended = time.monotonic() - preempted
    wait_until(lambda: not live_pods(core, namespace, selector), window, "the example Job's pods gone")
    found.pods_gone = time.monotonic() - preempted
    old = set(started.pods.values())
    found.details["status_while_suspended"] = wait_until(
        lambda: (status := rendezvous_status(objects, namespace)) and not member_addresses(status) & old and status,
        60,
        "no preempted pod's node a member of the Rendezvous",
    )
    wait_until(lambda: running(core, namespace, f"{JOB_NAME_LABEL}={PREEMPTOR}", 1), window, "the preemptor Running")
    cluster.plane.kubectl("-n", namespace, "delete", "job", PREEMPTOR, "--wait=false")
    wait_until(lambda: not batch.read_namespaced_job(RENDEZVOUS, namespace).spec.suspend, window, "re-admitted")
    found.readmitted = time.monotonic() - preempted
    again = start_training(cluster, namespace, selector, count, window, after=started.round)
    found.training_again = time.monotonic() - preempted
    found.details["again"] = again
    wait_until(lambda: job_condition(batch, namespace, RENDEZVOUS, "Complete"), window, "the Job Complete")
    found.completed = time.monotonic() - preempted
    return found


#: The chart's release and namespace, as the README installs it.
RELEASE, RELEASE_NAMESPACE = "kube-rendezvous", "kube-rendezvous-system"


def install_operator_from_chart(cluster: Cluster, helm_home: Path) -> list[Path]:
    """The operator image (built from the Dockerfile) imported on every node and the chart installed as the README
    says (its CRDs, cluster scope, the training RBAC in ``team-a``), with fencing at the API on (``fencing.enabled``
    and ``fencing.perJob``: every case runs under the policies); return the operator pod's log files once its
    Deployment rolled out."""
    from tests.test_chart import Helm, install
    from tests.testenv import ensure_binaries
    from tests.testenv.images import import_images
    from tests.testenv.operator_image import OPERATOR_IMAGE, build_operator_image

    plane = cluster.plane
    image = build_operator_image()
    with ThreadPoolExecutor(len(cluster.nodes)) as pool:  # each node its own containerd: in parallel
        list(pool.map(lambda node: import_images(node.containerd_socket, [image]), cluster.nodes))
    for namespace in (NAMESPACE, RELEASE_NAMESPACE):
        plane.kubectl("create", "namespace", namespace)
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    install(
        Helm(ensure_binaries().helm, helm_home), plane, RELEASE, RELEASE_NAMESPACE,
        "crds.install=true", f"trainingRBAC.namespaces={{{NAMESPACE}}}",
        f"image.repository={repository}", f"image.tag={tag}", "image.pullPolicy=Never",
        "fencing.enabled=true", "fencing.perJob=true",
    )  # fmt: skip
    plane.kubectl("-n", RELEASE_NAMESPACE, "rollout", "status", "deployment", "--timeout=180s")
    return sorted(plane.workdir.glob(f"*/pod-logs/{RELEASE_NAMESPACE}_*/*/*.log"))


def clear_namespace(cluster: Cluster, namespace: str = NAMESPACE) -> None:
    """Delete the namespace's Rendezvous, TrainJobs, JobSets, PyTorchJobs, Jobs and their pods (forced); return once
    none is left.

    The Rendezvous go first, their finalizer removed: the operator would hold each until its killed agents'
    heartbeats expire (it waits for live agents to close it; what it does on a delete is tested in
    ``test_operator.py``), and the next case's agents must not find it."""
    plane = cluster.plane
    plane.kubectl("-n", namespace, "delete", "rendezvouses", "--all", "--wait=false", check=False)
    for name in plane.kubectl("-n", namespace, "get", "rendezvouses", "-o", "name", check=False).stdout.split():
        unheld = '{"metadata":{"finalizers":null}}'
        plane.kubectl("-n", namespace, "patch", name, "--type=merge", "-p", unheld, check=False)
    for kind in ("trainjobs.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io", "pytorchjobs.kubeflow.org", "jobs"):
        plane.kubectl("-n", namespace, "delete", kind, "--all", "--wait=false", check=False)
    core = client.CoreV1Api(admin_api(cluster))

    def gone() -> bool:  # until the garbage collector has removed the Jobs, they replace what is force-deleted
        if not core.list_namespaced_pod(namespace).items:
            return True
        plane.kubectl("-n", namespace, "delete", "pods", "--all", "--grace-period=0", "--force", check=False)
        return False

    wait_until(gone, 120, f"{namespace}'s pods gone")
    plane.kubectl("-n", namespace, "delete", "rendezvouses", "--all", "--wait=true", "--timeout=60s", check=False)


def indexed_job_objects(pods: int = 4, **environment: str) -> list[dict[str, Any]]:
    """``examples/rendezvous.yaml`` and the Job of ``examples/torch/indexed-job.yaml`` (stock torchrun), fitted, with
    ``pods`` pods (the JobSet example's 4 by default): the same launcher and pods without a workload controller
    above the Job."""
    fitted = example_objects("torch/indexed-job.yaml", **environment)
    objects = [item for item in fitted if item["kind"] in ("Rendezvous", "Job")]
    job = next(item for item in objects if item["kind"] == "Job")
    job["spec"]["completions"] = job["spec"]["parallelism"] = pods
    return objects
