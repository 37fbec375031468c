"""The examples on the controllers users run, built from source (``tests.testenv.workloads``): JobSet v0.12.0,
Kubeflow Trainer v2.3.0, Kueue v0.19.2 and Kubeflow's training-operator v1.8.1 (PyTorchJob), on three real nodes,
with the operator installed from the chart.

Each case runs an example as shipped (``tests.e2e.workloads``: only the image, the launcher's path and the training
script fitted) and injects its fault where it happens: a pod evicted through the Eviction API (as ``kubectl drain``,
a preemption or an autoscaler does), a pod deleted with ``kubectl delete pod``, a Kueue preemption. The rows of the
pod-selection table (docs/training-jobs.md) for a Job, a JobSet, a PyTorchJob and a TrainJob are checked against the
labels these controllers put on their pods. What each failure does, with times: docs/workloads.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_rendezvous import create_backend
from kube_rendezvous_operator.pods_rules import pod_selector
from kubernetes import client

from tests.e2e.real_pods import RENDEZVOUS, host_pod, rendezvous_status
from tests.e2e.workloads import (
    JOB_NAME_LABEL,
    JOBSET_NAME_LABEL,
    NAMESPACE,
    PYTORCHJOB_NAME_LABEL,
    Started,
    admin_api,
    chart_runtime_trainjob_objects,
    clear_namespace,
    jobset_objects,
    live_pods,
    lose_a_pod_and_recover,
    member_addresses,
    preempt_and_readmit,
    pytorchjob_objects,
    queue_objects,
    queued_job_objects,
    rank_zero_pod,
    rendezvous_events,
    start_training,
    trainjob_objects,
)
from tests.helpers import REPO, create_rendezvous, rendezvous_parameters
from tests.testenv import wait_until
from tests.testenv.cluster import Cluster
from tests.testenv.images import venv_python

#: The label the operator always honours (docs/training-jobs.md, "Use it from a training job").
RENDEZVOUS_LABEL = "kube-rendezvous.io/rendezvous"


@pytest.fixture
def team_a(workload_cluster: Cluster) -> Iterator[Cluster]:
    """The cluster; namespace ``team-a`` emptied of the test's workloads, pods and Rendezvous afterwards."""
    yield workload_cluster
    clear_namespace(workload_cluster)


def apply(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    cluster.plane.kubectl("-n", NAMESPACE, "apply", "--validate=strict", "-f", "-", input=yaml.safe_dump_all(objects))


def rendezvous_object(objects: client.CustomObjectsApi) -> dict[str, Any]:
    found: dict[str, Any] = objects.get_namespaced_custom_object(
        "kube-rendezvous.io", "v1alpha1", NAMESPACE, "rendezvouses", RENDEZVOUS
    )
    return found


def selected_pods(core: client.CoreV1Api, owner: dict[str, Any]) -> set[str]:
    """The live pods that the operator's rule for a Rendezvous owned by ``owner`` selects (the docs' table)."""
    selector = pod_selector(RENDEZVOUS, {}, {"ownerReferences": [{**owner, "controller": True}]}, RENDEZVOUS_LABEL)
    assert selector.source == f"owner {owner['kind']} {owner['name']}", selector
    return {pod.metadata.name for pod in live_pods(core, NAMESPACE, selector.describe())}


def reference(item: dict[str, Any]) -> dict[str, Any]:
    return {key: item[key] if key in item else item["metadata"][key] for key in ("apiVersion", "kind", "name", "uid")}


def get(objects: client.CustomObjectsApi, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = objects.get_namespaced_custom_object(group, version, NAMESPACE, plural, name)
    return found


def true_conditions(item: dict[str, Any]) -> set[str]:
    return {c["type"] for c in (item.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def test_the_jobset_example_trains_on_through_an_eviction_and_a_deleted_pod_and_re_forms_after_a_jobset_restart(
    team_a: Cluster,
) -> None:
    """examples/torch/jobset.yaml (4 pods, ``--nnodes=2:4``): the agents create the Rendezvous owned by the JobSet and
    the operator takes the JobSet's pods by its uid. Rank 0's pod is evicted: the other 3 train on, the Job replaces
    it without counting a failure (``podFailurePolicy``: ``DisruptionTarget`` is ignored) and the newcomer joins a
    round of 4. Then a pod is deleted with ``kubectl delete pod``: the same recovery, but the Job counts 1 failure
    (no ``DisruptionTarget``; its replacement joins as after the eviction, which is not waited for again). The
    JobSet never restarts for them (``status.restarts`` 0) and never fails. Last, every pod is deleted at once: the
    Job fails (backoffLimit 3 spent) and the JobSet restarts (``maxRestarts: 3``); its new pods form a later round of
    the same Rendezvous and train."""
    api = admin_api(team_a)
    core, batch, objects = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    apply(team_a, jobset_objects())
    selector = f"{JOBSET_NAME_LABEL}={RENDEZVOUS}"
    started = start_training(team_a, NAMESPACE, selector, 4)
    jobset = get(objects, "jobset.x-k8s.io", "v1alpha2", "jobsets", RENDEZVOUS)
    assert rendezvous_object(objects)["metadata"]["ownerReferences"] == [reference(jobset)]
    assert selected_pods(core, reference(jobset)) == set(started.pods), "the JobSet row of the pod-selection table"

    evicted = lose_a_pod_and_recover(
        team_a, NAMESPACE, selector, started, rank_zero_pod(objects, NAMESPACE, started.pods)
    )
    print(f"JobSet, rank 0's pod evicted: {evicted}")
    assert evicted.survivors_training is not None, f"the other 3 did not train again: {evicted}"
    assert evicted.replacement_training is not None
    assert evicted.details["conditions"].get("DisruptionTarget") == "EvictionByEvictionAPI", evicted.details
    (job_name,) = [job.metadata.name for job in batch.list_namespaced_job(NAMESPACE).items]
    assert (batch.read_namespaced_job(job_name, NAMESPACE).status.failed or 0) == 0, "an eviction is not a failure"

    again = start_training(team_a, NAMESPACE, selector, 4, after=evicted.details["round"] - 1)
    victim = next(pod for pod in sorted(again.pods) if pod != rank_zero_pod(objects, NAMESPACE, again.pods))
    deleted = lose_a_pod_and_recover(team_a, NAMESPACE, selector, again, victim, how="delete", replacement=False)
    print(f"JobSet, a pod deleted: {deleted}")
    assert deleted.survivors_training is not None, deleted
    assert "DisruptionTarget" not in deleted.details["conditions"], deleted.details
    wait_until(
        lambda: batch.read_namespaced_job(job_name, NAMESPACE).status.failed == 1,
        30,
        "the Job to count the deleted pod as its one failure",
    )
    jobset = get(objects, "jobset.x-k8s.io", "v1alpha2", "jobsets", RENDEZVOUS)
    assert (jobset["status"].get("restarts") or 0) == 0, jobset["status"]
    assert not true_conditions(jobset) & {"Failed", "Completed"}, jobset["status"]
    assert "terminalState" not in jobset["status"], jobset["status"]

    # Every pod deleted at once: the failures spend backoffLimit, the Job fails, and JobSet's decision is a restart
    # (every Job recreated). The Rendezvous is the JobSet's and so is the run id: the new pods re-form in it.
    uid, before = rendezvous_object(objects)["metadata"]["uid"], rendezvous_status(objects, NAMESPACE)["round"]
    team_a.plane.kubectl("-n", NAMESPACE, "delete", "pods", "-l", selector, "--wait=false")
    wait_until(
        lambda: get(objects, "jobset.x-k8s.io", "v1alpha2", "jobsets", RENDEZVOUS)["status"].get("restarts") == 1,
        60,
        "the JobSet to restart its failed Job",
    )
    restarted = start_training(team_a, NAMESPACE, selector, 4, after=before)
    print(f"JobSet restarted: round {before} -> {restarted.round}")
    assert not set(restarted.pods) & (set(again.pods) | set(started.pods))
    assert rendezvous_object(objects)["metadata"]["uid"] == uid, "the same Rendezvous"
    jobset = get(objects, "jobset.x-k8s.io", "v1alpha2", "jobsets", RENDEZVOUS)
    assert jobset["status"].get("restartsCountTowardsMax") == 1 and "terminalState" not in jobset["status"]

    close_and_complete(team_a, objects, "jobsets", restarts=1)


def close_and_complete(cluster: Cluster, objects: client.CustomObjectsApi, plural: str, restarts: int) -> None:
    """A person closes the run: every stock torchrun exits 0 (before: 1, pytorch#194710), so the Job completes and
    the JobSet with it, spending no restart (docs/training-jobs.md, "Stock torchrun and a close"); a PyTorchJob
    succeeds once every Worker did. ``plural``: what to watch."""
    cluster.plane.kubectl(
        "-n", NAMESPACE, "patch", "rdzv", RENDEZVOUS, "--type=merge", "-p", '{"spec":{"closed":true}}'
    )
    group, version, done = {
        "jobsets": ("jobset.x-k8s.io", "v1alpha2", "Completed"),
        "trainjobs": ("trainer.kubeflow.org", "v1alpha1", "Complete"),
        "pytorchjobs": ("kubeflow.org", "v1", "Succeeded"),
    }[plural]
    # What runs the pods: the JobSet (a TrainJob's too), or the PyTorchJob itself.
    runner = ("kubeflow.org", "v1", plural) if plural == "pytorchjobs" else ("jobset.x-k8s.io", "v1alpha2", "jobsets")
    wait_until(
        lambda: done in true_conditions(get(objects, group, version, plural, RENDEZVOUS)),
        120,
        f"the {plural[:-1]} to be {done} after the close",
        explain=lambda: str(get(objects, *runner, RENDEZVOUS).get("status")),
    )
    status = get(objects, *runner, RENDEZVOUS)["status"]
    assert (status.get("restarts") or 0) == restarts, status
    assert "Failed" not in true_conditions({"status": status}), status


def test_the_pytorchjob_example_trains_under_the_training_operator_and_on_through_an_eviction_and_then_succeeds(
    team_a: Cluster,
) -> None:
    """examples/torch/pytorchjob.yaml (4 Workers, ``--nnodes=2:4``) on Kubeflow's training-operator v1.8.1: it creates
    pods ``llama-train-worker-0..3`` (``restartPolicy: OnFailure``) with the example's label; their agents create the
    Rendezvous (no owner: the operator takes the pods labelled ``kube-rendezvous.io/rendezvous``) and train in a
    round of 4, although the training-operator injects ``PET_NNODES=4`` (the flag wins). The PyTorchJob row of the
    pod-selection table selects exactly its pods. Rank 0's pod is evicted: the other 3 re-form and train again (in a
    round of 3, or of 4 when the replacement joins before their workers started), the training-operator recreates the
    pod under the same name once the old one is gone, and the newcomer trains in a round of 4; the PyTorchJob neither
    fails nor succeeds. Closed, every torchrun exits 0 and the PyTorchJob Succeeded."""
    api = admin_api(team_a)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    applied = time.monotonic()
    apply(team_a, pytorchjob_objects())
    selector = f"{PYTORCHJOB_NAME_LABEL}={RENDEZVOUS}"
    started = start_training(team_a, NAMESPACE, selector, 4)
    print(f"PyTorchJob applied -> 4 pods training in a round of 4: {time.monotonic() - applied:.1f} s")
    assert sorted(started.pods) == [f"{RENDEZVOUS}-worker-{index}" for index in range(4)]
    rendezvous = rendezvous_object(objects)
    assert (rendezvous["spec"]["minNodes"], rendezvous["spec"]["maxNodes"]) == (2, 4)
    assert not rendezvous["metadata"].get("ownerReferences"), "the example gives no owner: the label selects"
    labelled = live_pods(core, NAMESPACE, f"{RENDEZVOUS_LABEL}={RENDEZVOUS}")
    assert {pod.metadata.name for pod in labelled} == set(started.pods)
    pytorchjob = get(objects, "kubeflow.org", "v1", "pytorchjobs", RENDEZVOUS)
    assert selected_pods(core, reference(pytorchjob)) == set(started.pods), "the PyTorchJob row of the table"
    pod = core.read_namespaced_pod(sorted(started.pods)[0], NAMESPACE)
    assert pod.spec.restart_policy == "OnFailure"
    injected = {item.name: item.value for item in pod.spec.containers[0].env}
    assert injected["PET_NNODES"] == "4", "the training-operator injects the replicas; --nnodes=2:4 overrides it"
    assert "Running" in true_conditions(pytorchjob), pytorchjob.get("status")

    victim = rank_zero_pod(objects, NAMESPACE, started.pods)
    evicted = lose_a_pod_and_recover(team_a, NAMESPACE, selector, started, victim)
    print(f"PyTorchJob, rank 0's pod evicted: {evicted}")
    assert evicted.survivors_training is not None, f"the other 3 did not train again: {evicted}"
    assert evicted.replacement_training is not None
    assert evicted.details["replacements"] == [victim], "recreated under its name"
    pytorchjob = get(objects, "kubeflow.org", "v1", "pytorchjobs", RENDEZVOUS)
    print(f"PyTorchJob conditions after the eviction: {pytorchjob['status'].get('conditions')}")
    assert not true_conditions(pytorchjob) & {"Failed", "Succeeded"}, pytorchjob["status"]
    events = core.list_namespaced_event(NAMESPACE, field_selector="involvedObject.kind=PyTorchJob").items
    print("\n".join(f"PyTorchJob event {event.reason}: {event.message}" for event in events))

    close_and_complete(team_a, objects, "pytorchjobs", restarts=0)


def test_the_trainjob_example_is_elastic_and_trains_on_through_an_eviction_without_a_jobset_restart(
    team_a: Cluster,
) -> None:
    """examples/torch/trainjob.yaml: its TrainingRuntime (with the failure policy) and its TrainJob of 4 nodes whose
    command says ``--nnodes=2:4``. Trainer runs it as a JobSet: the round forms with 2 to 4 nodes although Trainer
    injects ``PET_NNODES=4`` (the flag wins); rank 0's pod is evicted, the other 3 train on, the replacement joins a
    round of 4, and neither the JobSet nor the TrainJob restarts or fails. The TrainJob row of the pod-selection table
    selects exactly its pods."""
    api = admin_api(team_a)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    apply(team_a, trainjob_objects())
    selector = f"{JOBSET_NAME_LABEL}={RENDEZVOUS}"
    started = start_training(team_a, NAMESPACE, selector, 4)
    rendezvous = rendezvous_object(objects)
    assert (rendezvous["spec"]["minNodes"], rendezvous["spec"]["maxNodes"]) == (2, 4)
    pod = core.read_namespaced_pod(sorted(started.pods)[0], NAMESPACE)
    injected = {item.name: item.value for item in pod.spec.containers[0].env}
    assert injected["PET_NNODES"] == "4", "Trainer injects the TrainJob's numNodes; --nnodes=2:4 overrides it"
    trainjob = get(objects, "trainer.kubeflow.org", "v1alpha1", "trainjobs", RENDEZVOUS)
    jobset = get(objects, "jobset.x-k8s.io", "v1alpha2", "jobsets", RENDEZVOUS)
    assert [owner["uid"] for owner in jobset["metadata"]["ownerReferences"]] == [trainjob["metadata"]["uid"]]
    assert rendezvous["metadata"]["ownerReferences"] == [reference(jobset)]
    assert selected_pods(core, reference(trainjob)) == set(started.pods), "the TrainJob row of the pod-selection table"

    trainjob_survives_an_eviction(team_a, started, "TrainJob")
    close_and_complete(team_a, objects, "trainjobs", restarts=0)


def trainjob_survives_an_eviction(cluster: Cluster, started: Started, what: str) -> None:
    """Rank 0's pod of the TrainJob evicted: the other 3 train on, the replacement joins a round of 4, its Job counts
    no failure, and neither the JobSet nor the TrainJob restarts or fails."""
    api = admin_api(cluster)
    batch, objects = client.BatchV1Api(api), client.CustomObjectsApi(api)
    victim = rank_zero_pod(objects, NAMESPACE, started.pods)
    evicted = lose_a_pod_and_recover(cluster, NAMESPACE, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", started, victim)
    print(f"{what}, rank 0's pod evicted: {evicted}")
    assert evicted.survivors_training is not None, f"the other 3 did not train again: {evicted}"
    assert evicted.replacement_training is not None
    (job,) = batch.list_namespaced_job(NAMESPACE).items
    assert (job.status.failed or 0) == 0
    jobset = get(objects, "jobset.x-k8s.io", "v1alpha2", "jobsets", RENDEZVOUS)
    assert (jobset["status"].get("restarts") or 0) == 0, jobset["status"]
    trainjob = get(objects, "trainer.kubeflow.org", "v1alpha1", "trainjobs", RENDEZVOUS)
    assert not true_conditions(trainjob) & {"Failed", "Complete"}, trainjob.get("status")


def test_a_trainjob_naming_the_charts_cluster_training_runtime_trains_on_through_an_eviction(
    team_a: Cluster, tmp_path: Path
) -> None:
    """The chart's ClusterTrainingRuntime (``trainingRuntime.enabled``, rendered and applied) and the example's
    TrainJob naming it (``runtimeRef: {kind: ClusterTrainingRuntime}``): its 4 pods run as the chart's training
    ServiceAccount and train; rank 0's pod is evicted and the TrainJob trains on without a JobSet restart. No close:
    the namespace is cleared after the test."""
    runtime, trainjob = chart_runtime_trainjob_objects(tmp_path)
    name = runtime["metadata"]["name"]
    team_a.plane.kubectl("apply", "--validate=strict", "-f", "-", input=yaml.safe_dump(runtime))
    try:
        apply(team_a, [trainjob])
        started = start_training(team_a, NAMESPACE, f"{JOBSET_NAME_LABEL}={RENDEZVOUS}", 4)
        pod = client.CoreV1Api(admin_api(team_a)).read_namespaced_pod(sorted(started.pods)[0], NAMESPACE)
        assert pod.spec and pod.spec.service_account_name == "trainer", "the chart's trainingRBAC.serviceAccountName"
        trainjob_survives_an_eviction(team_a, started, "TrainJob of the ClusterTrainingRuntime")
    finally:  # Trainer holds a runtime in use (a finalizer) until its TrainJobs are gone: cleared after the test
        team_a.plane.kubectl("delete", "clustertrainingruntimes", name, "--wait=false", "--ignore-not-found")


def test_the_example_job_queued_by_kueue_survives_a_preemption_and_trains_to_the_end_in_a_new_round(
    team_a: Cluster,
) -> None:
    """examples/training-job.yaml with Kueue's queue label, in a ClusterQueue whose quota holds it and nothing more.
    A Job of higher priority arrives: Kueue preempts the example (suspends it: every pod deleted, none counted as
    failed). Once the preemptor is gone Kueue re-admits it; the new pods (same Job, same run id) form a later round
    of the same Rendezvous and train to the end. The Rendezvous's Events tell it: each preempted pod's node evicted,
    then a round of the new pods. The Job row of the pod-selection table selects exactly the Job's pods."""
    api = admin_api(team_a)
    core, batch, objects = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    team_a.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(queue_objects(NAMESPACE)))
    apply(team_a, queued_job_objects(STEPS="40", STEP_SECONDS="0.25"))
    selector = f"{JOB_NAME_LABEL}={RENDEZVOUS}"
    started = start_training(team_a, NAMESPACE, selector, 3)
    job = batch.read_namespaced_job(RENDEZVOUS, NAMESPACE)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": RENDEZVOUS, "uid": job.metadata.uid}
    assert selected_pods(core, owner) == set(started.pods), "the Job row of the pod-selection table"
    uid = rendezvous_object(objects)["metadata"]["uid"]

    preemption = preempt_and_readmit(team_a, NAMESPACE, started)
    print(f"Kueue preemption: {preemption}")
    again = preemption.details["again"]
    assert not set(again.pods) & set(started.pods), "new pods after re-admission"
    assert again.round > started.round
    assert rendezvous_object(objects)["metadata"]["uid"] == uid, "the same Rendezvous"
    job = batch.read_namespaced_job(RENDEZVOUS, NAMESPACE)
    assert (job.status.succeeded, job.status.failed or 0) == (3, 0), job.status
    workload_events = [
        event.reason
        for event in core.list_namespaced_event(NAMESPACE, field_selector="involvedObject.kind=Workload").items
    ]
    assert "Preempted" in workload_events, workload_events
    story = rendezvous_events(core, NAMESPACE)
    print("\n".join(f"{reason}: {message}" for reason, message in story))
    evictions = [message for reason, message in story if reason == "NodeEvicted"]
    for pod in started.pods:
        assert any(f"pod {pod} is gone" in message for message in evictions), (pod, story)
    new_addresses = set(again.pods.values())
    completed = [message for reason, message in story if reason == "RoundCompleted"]
    assert any(all(address in message for address in new_addresses) for message in completed), story
    final = rendezvous_status(objects, NAMESPACE)
    assert member_addresses(final) == new_addresses and final["phase"] == "Closed", final
    with contextlib.suppress(Exception):
        print(team_a.plane.kubectl("-n", NAMESPACE, "get", "rdzv,job,workloads").stdout)


#: Run in a pod of job llama-train: its agent's writes, with the token the kubelet mounted (bound to the pod), to
#: its own Lease and to job other-job's Lease, writer Lease and key; prints each answer's status and message.
PER_JOB_PROBE = """
import json, os, ssl, sys, urllib.error, urllib.request
secrets = "/var/run/secrets/kubernetes.io/serviceaccount/"
namespace, token = open(secrets + "namespace").read(), open(secrets + "token").read()
context = ssl.create_default_context(cafile=secrets + "ca.crt")
uid, key = os.environ["POD_UID"], sys.argv[1]

def call(method, path, body=None):
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    if method == "PATCH":
        headers["Content-Type"] = "application/merge-patch+json"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request("https://kubernetes.default.svc" + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return [answer.status, ""]
    except urllib.error.HTTPError as refused:
        return [refused.code, json.loads(refused.read()).get("message", "")]

def lease(name, rendezvous, kind="node", **annotations):
    labels = {"kube-rendezvous.io/lease": kind, "kube-rendezvous.io/rendezvous": rendezvous}
    metadata = {"name": name, "labels": labels, "annotations": {"kube-rendezvous.io/pod-uid": uid, **annotations}}
    holder = "agent/" + name if kind == "writer" else name
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}}

leases = "/apis/coordination.k8s.io/v1/namespaces/" + namespace + "/leases"
keys = "/apis/kube-rendezvous.io/v1alpha1/namespaces/" + namespace + "/rendezvouskeys/"
writer = lease("other-job-writer", "other-job", "writer", **{"kube-rendezvous.io/writer-priority": "agent"})
print(json.dumps({
    "own lease": call("POST", leases, lease("mine", "llama-train")),
    "own lease deleted": call("DELETE", leases + "/mine"),
    "their lease": call("POST", leases, lease("theirs", "other-job")),
    "their writer lease": call("POST", leases, writer),
    "their key": call("DELETE", keys + key),
}))
"""


def test_with_the_charts_fencing_a_pod_of_one_job_writes_its_own_lease_and_none_of_another_jobs(
    workload_cluster: Cluster,
) -> None:
    """Issue #46 on three real nodes, with the chart installed with ``fencing.enabled`` and ``fencing.perJob`` (as
    for every case of this module): in a namespace labelled for the per-job policy, a real pod of job llama-train
    (examples/rbac-per-job.yaml, its own ServiceAccount) writes with the token its kubelet mounted: its own node
    Lease is created and deleted; job other-job's node Lease, writer Lease and key are refused, naming the rule."""
    plane = workload_cluster.plane
    api = admin_api(workload_cluster)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = "per-job"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"kube-rendezvous.io/fencing": "per-job"}}})
    try:
        for name in ("llama-train", "other-job"):
            create_rendezvous(objects, namespace, name)
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "llama-train"}})
        plane.kubectl("-n", namespace, "apply", "-f", str(REPO / "examples" / "rbac-per-job.yaml"))
        _, their_store = create_backend(
            rendezvous_parameters(f"{namespace}/other-job", plane.admin_kubeconfig, create="false")
        )
        their_store.set("theirs", b"1")
        (key,) = objects.list_namespaced_custom_object(
            "kube-rendezvous.io", "v1alpha1", namespace, "rendezvouskeys",
            label_selector="kube-rendezvous.io/rendezvous=other-job",
        )["items"]  # fmt: skip
        uid_env = {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
        pod = host_pod("llama-train-0", None, [venv_python(), "-c", "import time; time.sleep(600)"])
        pod["spec"].update(serviceAccountName="llama-train", terminationGracePeriodSeconds=0)
        pod["spec"]["containers"][0]["env"] = [uid_env]
        core.create_namespaced_pod(namespace, pod)
        wait_until(
            lambda: core.read_namespaced_pod("llama-train-0", namespace).status.phase == "Running", 120, "the pod"
        )

        def probed() -> dict[str, list[Any]] | None:
            done = plane.kubectl(
                "-n", namespace, "exec", "llama-train-0", "--", venv_python(), "-c", PER_JOB_PROBE,
                key["metadata"]["name"], check=False,
            )  # fmt: skip
            return json.loads(done.stdout) if done.returncode == 0 else None

        found = wait_until(probed, 60, "the probe's answers")
        assert found["own lease"][0] == 201 and found["own lease deleted"][0] == 200, found
        rule = "ServiceAccount llama-train writes only the Leases and keys of Rendezvous llama-train"
        for what in ("their lease", "their writer lease", "their key"):
            status, message = found[what]
            assert status == 403 and "kube-rendezvous fencing" in message and rule in message, (what, message)
        assert "is labelled kube-rendezvous.io/rendezvous=other-job" in found["their key"][1]
        assert their_store.get("theirs") == b"1"
    finally:
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
