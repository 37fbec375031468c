"""The operator finds the training pods of each workload users run, with nothing added to the pods.

Real control plane, real operator, real tensorplay agents. The Rendezvous is owned by a Job, a
JobSet, a PyTorchJob or a TrainJob (the latter three from minimal CRDs with the real group,
version and kind: no controller runs them here), or names its pods in ``spec.podSelector``. The
pods carry only the labels that workload's controller puts on them, never
``kube-rendezvous.io/rendezvous``. A killed agent's pod ends (phase Failed, as the kubelet
reports it) and its node must be evicted: heartbeats expire only after 300 s, so only the
operator's eviction lets the survivor re-form within the deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.e2e.harness import ElasticJob
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import pod_failed
from tests.test_missing_paths import create_job_pod, operator  # noqa: F401 - a fixture
from tests.test_operator import read
from tests.testenv import ControlPlane, wait_until

MakeJob = Callable[..., ElasticJob]

#: (apiVersion, kind, plural) of the workloads whose CRDs are not built in.
WORKLOAD_CRDS = {
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}


def ensure_workload_crd(control_plane: ControlPlane, kind: str) -> None:
    """A minimal namespaced CRD with the workload's real group, version and kind (idempotent)."""
    group, version, plural = WORKLOAD_CRDS[kind]
    manifest = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: {plural}, singular: {kind.lower()}, kind: {kind}}}
  versions:
    - name: {version}
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""
    control_plane.kubectl("apply", "-f", "-", input=manifest)
    control_plane.wait_established(f"crd/{plural}.{group}")


def create_owner(control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, kind: str) -> dict[str, Any]:
    """A workload object named ``train`` of ``kind``; returns its owner reference (controller)."""
    if kind == "Job":
        job = client.BatchV1Api(admin_api).create_namespaced_job(
            namespace,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "train"},
                # Suspended: the Job controller creates no pods of its own; the test plays them.
                "spec": {
                    "suspend": True,
                    "template": {
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "agent", "image": "trainer"}]}
                    },
                },
            },
        )
        return {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": job.metadata.uid, "controller": True}
    ensure_workload_crd(control_plane, kind)
    group, version, plural = WORKLOAD_CRDS[kind]
    objects = client.CustomObjectsApi(admin_api)
    made = wait_until(
        lambda: _create_custom(objects, group, version, namespace, plural, kind), 30, f"a {kind} to be created"
    )
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "name": "train",
        "uid": made["metadata"]["uid"],
        "controller": True,
    }


def _create_custom(
    objects: client.CustomObjectsApi, group: str, version: str, namespace: str, plural: str, kind: str
) -> dict[str, Any] | None:
    body = {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": "train"}, "spec": {}}
    try:
        made: dict[str, Any] = objects.create_namespaced_custom_object(group, version, namespace, plural, body)
    except ApiException as exc:
        if exc.status == 404:  # the new CRD's endpoint is not served yet
            return None
        raise
    return made


#: Per case: the labels of the pods (what that workload's controller sets), from the owner reference.
POD_LABELS: dict[str, Callable[[dict[str, Any]], dict[str, str]]] = {
    "Job": lambda owner: {"batch.kubernetes.io/controller-uid": owner["uid"], "job-name": "train"},
    "JobSet": lambda owner: {"jobset.sigs.k8s.io/jobset-uid": owner["uid"], "jobset.sigs.k8s.io/jobset-name": "train"},
    "PyTorchJob": lambda _: {
        "training.kubeflow.org/job-name": "train",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": "worker",
    },
    "TrainJob": lambda _: {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/replicatedjob-name": "node"},
    "spec.podSelector": lambda _: {"app": "trainer", "team": "vision"},
}


#: Per workload: the labels the operator selects by (the others are there as its controller sets them).
SELECTED_KEYS = {
    "Job": {"batch.kubernetes.io/controller-uid"},
    "JobSet": {"jobset.sigs.k8s.io/jobset-uid"},
    "PyTorchJob": {"training.kubeflow.org/job-name", "training.kubeflow.org/operator-name"},
    "TrainJob": {"jobset.sigs.k8s.io/jobset-name"},
}


@pytest.mark.parametrize("workload", list(POD_LABELS))
def test_the_node_of_a_failed_pod_is_evicted_with_the_workloads_own_pod_labels(
    workload: str,
    operator: OperatorProcess,  # noqa: F811 - the fixture
    control_plane: ControlPlane,
    admin_api: client.ApiClient,
    objects: client.CustomObjectsApi,
    namespace: str,
    make_job: MakeJob,
) -> None:
    core = client.CoreV1Api(admin_api)
    metadata: dict[str, Any] = {"name": "job"}
    spec: dict[str, Any] = {"minNodes": 1, "maxNodes": 2}
    if workload == "spec.podSelector":
        spec["podSelector"] = {"matchLabels": {"app": "trainer", "team": "vision"}}
        labels = POD_LABELS[workload]({})
        selected = dict(spec["podSelector"]["matchLabels"])
    else:
        owner = create_owner(control_plane, admin_api, namespace, workload)
        metadata["ownerReferences"] = [owner]
        labels = POD_LABELS[workload](owner)
        selected = {key: value for key, value in labels.items() if key in SELECTED_KEYS[workload]}
    objects.create_namespaced_custom_object(
        "kube-rendezvous.io",
        "v1alpha1",
        namespace,
        "rendezvouses",
        {"apiVersion": "kube-rendezvous.io/v1alpha1", "kind": "Rendezvous", "metadata": metadata, "spec": spec},
    )
    addresses = ["127.0.0.41", "127.0.0.42"]
    for index, address in enumerate(addresses):
        create_job_pod(core, namespace, f"trainer-{index}", address, labels=labels)
    job = make_job(
        nnodes="1:2",
        steps=40,
        step_seconds=1.0,
        rdzv_conf={"last_call_timeout": "3", "keep_alive_max_attempt": "60"},
    )
    survivor, victim = job.start_training(addresses)
    victim.kill_pod()
    pod_failed(core, namespace, victim.name)
    job.wait_training([survivor], min_step=0, what="the survivor training alone")
    status = read(objects, namespace)["status"]
    assert status["evictedNodes"] == [victim.node_name]
    described = ",".join(f"{key}={value}" for key, value in sorted(selected.items()))
    said = f"the training pods of {namespace}/job are those with {described}"
    assert said in operator.log.read_text()
