"""Real pods on a real node (``tests.testenv.node``): the README's example Job, run by the kubelet.

The Job is ``examples/training-job.yaml`` as shipped, with only what this cluster needs changed: the
image (built here, no registry), the host's interpreter mounted into it, smaller requests, and the
test's training script. Its agents use in-cluster credentials (the projected ServiceAccount token,
``KUBERNETES_SERVICE_HOST``) and ``POD_IP`` from the downward API.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests.testenv import wait_until
from tests.testenv.images import TRAINING_IMAGE, training_mounts, venv_python
from tests.testenv.node import Node

REPO = Path(__file__).resolve().parents[1]
RENDEZVOUS = "llama-train"


def example_objects(**environment: str) -> list[dict[str, Any]]:
    """``examples/`` (ServiceAccount, Role, RoleBinding, Job, Rendezvous), fitted to this node."""
    objects = [
        item
        for name in ("rendezvous.yaml", "training-job.yaml")
        for item in yaml.safe_load_all((REPO / "examples" / name).read_text())
        if item
    ]
    job = next(item for item in objects if item["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 30
    container = pod["containers"][0]
    container["image"] = TRAINING_IMAGE
    container["imagePullPolicy"] = "Never"
    container["command"] = [venv_python(), "-m", "kube_rendezvous.run"]
    container["args"] = [
        *(arg for arg in container["args"] if arg != "train.py"),
        "--monitor-interval=0.5",
        str(REPO / "tests" / "e2e" / "train.py"),
    ]
    container["env"] += [
        {"name": name, "value": value}
        for name, value in {
            "OMP_NUM_THREADS": "1",
            "LOGLEVEL": "INFO",
            "RESULT_DIR": "/tmp",
            "STEPS": "100000",
            "STEP_SECONDS": "0.5",
            **environment,
        }.items()
    ]
    container["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    mounts = training_mounts()
    pod["volumes"] = [{"name": f"host-{i}", "hostPath": {"path": host}} for i, (host, _) in enumerate(mounts)]
    container["volumeMounts"] = [
        {"name": f"host-{i}", "mountPath": inside, "readOnly": True} for i, (_, inside) in enumerate(mounts)
    ]
    return objects


@pytest.fixture
def node_api(real_node: Node) -> client.ApiClient:
    return config.new_client_from_config(str(real_node.plane.admin_kubeconfig))


@pytest.fixture
def node_namespace(real_node: Node, node_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace on the real node's cluster, with the CRDs applied; deleted afterwards."""
    plane = real_node.plane
    plane.kubectl("apply", "-f", str(REPO / "crds"))
    plane.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd/rendezvouses.kube-rendezvous.io")
    name = f"real-{request.node.name.lower().replace('_', '-')[:30].strip('-')}-{int(time.time()) % 100000}"
    core = client.CoreV1Api(node_api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, grace_period_seconds=0)


def apply(node: Node, namespace: str, objects: list[dict[str, Any]]) -> None:
    node.plane.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(objects))


def training_pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"kube-rendezvous.io/rendezvous={RENDEZVOUS}").items
    return [
        pod for pod in pods if pod.metadata.deletion_timestamp is None and pod.status.phase in ("Pending", "Running")
    ]


def rendezvous_status(objects: client.CustomObjectsApi, namespace: str) -> dict[str, Any]:
    found = objects.get_namespaced_custom_object(
        "kube-rendezvous.io", "v1alpha1", namespace, "rendezvouses", RENDEZVOUS
    )
    return dict(found.get("status") or {})


def formed_with(status: dict[str, Any], addresses: set[str], after_round: int = -1) -> bool:
    """Whether the current round is complete with exactly the nodes at ``addresses``, later than ``after_round``."""
    nodes = {item["node"].rsplit("_", 2)[0] for item in status.get("participants") or []}
    return status.get("phase") == "Complete" and status.get("round", -1) > after_round and nodes == addresses


def worker_rounds(node: Node, namespace: str, pod: str, world: int) -> int:
    """How many rounds of ``world`` workers ``pod``'s agent started whose workers then trained a step."""
    lines = node.plane.kubectl("-n", namespace, "logs", pod, check=False).stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if f"init_process_group world {world}" in line]
    trained = [i for i, line in enumerate(lines) if f"/{world} group_rank" in line and " step " in line]
    return sum(
        1 for n, start in enumerate(starts) if any(start < i < (starts[n + 1 :] or [len(lines)])[0] for i in trained)
    )


def test_example_job_survives_a_deleted_pod(real_node: Node, node_api: client.ApiClient, node_namespace: str) -> None:
    """3 real pods form a round; ``kubectl delete pod`` makes the kubelet SIGTERM one agent, which leaves;
    the Job controller's replacement (a new name and address) joins, and the job trains again with 3."""
    core, objects = client.CoreV1Api(node_api), client.CustomObjectsApi(node_api)
    apply(real_node, node_namespace, example_objects())

    def running() -> dict[str, str] | None:
        pods = training_pods(core, node_namespace)
        ready = {
            pod.metadata.name: pod.status.pod_ip for pod in pods if pod.status.phase == "Running" and pod.status.pod_ip
        }
        return ready if len(ready) == 3 and len(pods) == 3 else None

    first = wait_until(running, 180, "3 training pods Running with addresses")
    wait_until(lambda: formed_with(rendezvous_status(objects, node_namespace), set(first.values())), 120, "round of 3")
    trained = {
        pod: wait_until(lambda pod=pod: worker_rounds(real_node, node_namespace, pod, 3), 120, f"{pod} training")
        for pod in first
    }
    before = rendezvous_status(objects, node_namespace)

    victim = sorted(first)[0]
    real_node.plane.kubectl("-n", node_namespace, "delete", "pod", victim, "--wait=false")

    def replaced() -> dict[str, str] | None:
        pods = running()
        return pods if pods is not None and victim not in pods else None

    second = wait_until(replaced, 180, "the Job controller's replacement pod Running")
    assert set(second.values()) != set(first.values())
    status = wait_until(
        lambda: (
            (found := rendezvous_status(objects, node_namespace))
            and formed_with(found, set(second.values()), before["round"])
            and found
        ),
        180,
        "a round with the replacement pod",
    )
    departure = status["lastDeparture"]
    assert [item["reason"] for item in departure["nodes"] if item["node"].startswith(first[victim] + "_")] == ["Left"]
    assert status["participantCount"] == 3
    for pod in second:
        wait_until(
            lambda pod=pod: worker_rounds(real_node, node_namespace, pod, 3) > trained.get(pod, 0),
            120,
            f"{pod} training in the new round",
        )
