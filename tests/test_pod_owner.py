"""rdzv-conf ``owner=pod``: the agents derive the Rendezvous's owner and the run id from their own pod.

Real API server and RBAC: the pods are created as a PyTorchJob's and a JobSet's pods would be (no kubelet
runs them), the agent is ``create_backend`` with the trainer account, as a launcher calls it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kubernetes import client
from tensorplay.distributed.elastic.rendezvous.api import RendezvousConnectionError

from tests.helpers import create_rendezvous, rendezvous_parameters
from tests.test_pod_selection import create_owner
from tests.testenv import ControlPlane, wait_until

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


def create_pod(core: client.CoreV1Api, namespace: str, name: str, metadata: dict[str, Any]) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, **metadata},
            "spec": {"serviceAccountName": "trainer", "containers": [{"name": "agent", "image": "trainer:latest"}]},
        },
    )


def allow_reading_pods(control_plane: ControlPlane, namespace: str, kubeconfig: Path) -> None:
    """The optional rule owner=pod needs (docs/rbac.yaml): get on pods; wait until it is in effect."""
    control_plane.kubectl("-n", namespace, "create", "role", "read-pods", "--verb=get", "--resource=pods")
    account = f"--serviceaccount={namespace}:trainer"
    control_plane.kubectl("-n", namespace, "create", "rolebinding", "read-pods", "--role=read-pods", account)

    def allowed() -> bool:
        answer = control_plane.kubectl(
            "-n", namespace, "auth", "can-i", "get", "pods", kubeconfig=kubeconfig, check=False
        )
        return answer.stdout.strip() == "yes"

    wait_until(allowed, 30, "the trainer's new RoleBinding to take effect")


@pytest.mark.parametrize("workload", ["PyTorchJob", "JobSet"])
def test_the_rendezvous_is_owned_by_the_pods_workload_and_the_run_id_is_its_uid(
    workload: str,
    control_plane: ControlPlane,
    admin_api: client.ApiClient,
    objects: client.CustomObjectsApi,
    namespace: str,
    agent_kubeconfig: Path,
    crds: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = client.CoreV1Api(admin_api)
    owner = create_owner(control_plane, admin_api, namespace, workload)
    # (A suspended Job's controller would delete a pod that names it as controller; no controller runs a
    # PyTorchJob here, and its pods name it as their controller, as the training operator makes them.)
    if workload == "PyTorchJob":  # a PyTorchJob's pod: its controller is the PyTorchJob
        create_pod(core, namespace, "train-0-abcde", {"ownerReferences": [owner]})
    else:  # a JobSet's pod: the JobSet is in its labels (its controller, one of the JobSet's Jobs, is left
        # out here: a reference to a Job that does not exist would have the garbage collector delete the pod)
        labels = {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/jobset-uid": owner["uid"]}
        create_pod(core, namespace, "train-0-abcde", {"labels": labels})
    monkeypatch.setenv("POD_NAME", "train-0-abcde")
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    params = rendezvous_parameters(f"{namespace}/job", agent_kubeconfig, run_id="none", owner="pod", retry_timeout=5)

    # Without `get pods` the error names the missing permission.
    with pytest.raises(RendezvousConnectionError, match=r"(?s)403.*get.*pods"):
        create_backend(params)

    allow_reading_pods(control_plane, namespace, agent_kubeconfig)
    backend, _ = create_backend(params)
    assert backend.run_id == owner["uid"]
    made = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job")
    references = made["metadata"]["ownerReferences"]
    assert [(ref["kind"], ref["name"], ref["uid"]) for ref in references] == [(workload, "train", owner["uid"])]


def test_a_bare_pod_is_refused_with_the_fix(
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
    namespace: str,
    agent_kubeconfig: Path,
    crds: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    create_pod(client.CoreV1Api(admin_api), namespace, "lonely", {})
    allow_reading_pods(control_plane, namespace, agent_kubeconfig)
    monkeypatch.setenv("POD_NAME", "lonely")
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    params = rendezvous_parameters(f"{namespace}/job", agent_kubeconfig, owner="pod", retry_timeout=5)
    with pytest.raises(ValueError, match=r"owner=pod: pod .*/lonely has no controller .* owner=<apiVersion>"):
        create_backend(params)


def test_a_rendezvous_applied_first_keeps_no_owner_and_the_agent_says_the_pods_workload_is_ignored(
    control_plane: ControlPlane,
    admin_api: client.ApiClient,
    objects: client.CustomObjectsApi,
    namespace: str,
    agent_kubeconfig: Path,
    crds: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue #48: with the Rendezvous applied before the job (as a user may), ``owner=pod`` cannot take effect: the
    object stays ownerless, and the agent says so at WARNING, naming the owner, the consequence and the fix."""
    owner = create_owner(control_plane, admin_api, namespace, "PyTorchJob")
    create_pod(client.CoreV1Api(admin_api), namespace, "train-0-abcde", {"ownerReferences": [owner]})
    create_rendezvous(objects, namespace)
    allow_reading_pods(control_plane, namespace, agent_kubeconfig)
    monkeypatch.setenv("POD_NAME", "train-0-abcde")
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    params = rendezvous_parameters(f"{namespace}/job", agent_kubeconfig, owner="pod", retry_timeout=5)
    with caplog.at_level(logging.WARNING):
        create_backend(params)
    said = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    ignored = [line for line in said if "is ignored" in line]
    assert len(ignored) == 1, said
    assert ignored[0].startswith(
        f"rdzv-conf owner: Rendezvous {namespace}/job already exists with no owner, so its owner PyTorchJob train "
        f"(uid {owner['uid']}) is ignored"
    )
    made = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job")
    assert not made["metadata"].get("ownerReferences")
