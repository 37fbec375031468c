"""Real pods on a real node (``tests.testenv.node``): the README's example Jobs, run by the kubelet."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from scripts.release import retag_docker_archive
from tests.e2e.fencing import OWN_RELEASE_LABEL, own_release_fencing
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.real_pods import (
    FORMED_PHASES,
    POD_RUNNING_SECONDS,
    POD_TRAINING_SECONDS,
    REPO,
    apply,
    example_job_training,
    example_objects,
    mount_host_paths,
    namespace_with_crds,
    pod_log,
    rendezvous_status,
    round_with,
    running_pods,
    worker_rounds,
)
from tests.release_fixtures import Built
from tests.test_chart import Helm, install, operator_objects, the, upgrade
from tests.test_quickstart import VERSION, quickstart_commands
from tests.testenv import ensure_binaries, wait_until
from tests.testenv.images import TRAINING_IMAGE, build_images, import_images, training_mounts
from tests.testenv.node import Node
from tests.testenv.operator_image import OPERATOR_IMAGE, build_operator_image

#: The example's 3 pods (2 to 4 nodes) form a round only when the last call ends, unless the operator's pod
#: census sees that every pod joined: 10 s instead of the agents' 30 s, still time for all three to join.
LAST_CALL_SECONDS = 10


@pytest.fixture
def node_api(real_node: Node) -> client.ApiClient:
    return config.new_client_from_config(str(real_node.plane.admin_kubeconfig))


@pytest.fixture
def node_namespace(real_node: Node, node_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace on the real node's cluster, with the CRDs applied; deleted afterwards."""
    name = f"real-{request.node.name.lower().replace('_', '-')[:30].strip('-')}-{int(time.time()) % 100000}"
    with namespace_with_crds(real_node.plane, node_api, name):
        yield name


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))


def pod_names(api: client.ApiClient, namespace: str) -> list[str]:
    return [pod.metadata.name for pod in client.CoreV1Api(api).list_namespaced_pod(namespace).items]


def node_evicted(core: client.CoreV1Api, namespace: str, text: str, what: str) -> str:
    """The message of the NodeEvicted Event containing ``text``, waited for: Kopf posts Events from a
    background queue after the status patch, so reading once right after the status races it."""
    return wait_until(
        lambda: next(
            (
                event.message
                for event in core.list_namespaced_event(namespace, field_selector="reason=NodeEvicted").items
                if text in (event.message or "")
            ),
            None,
        ),
        30,
        what,
    )


@pytest.fixture
def node_operator(real_node: Node, node_namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator, as a local process with its documented RBAC, watching the real node's cluster
    (its image as the chart's Deployment is the helm test's)."""
    plane = real_node.plane
    plane.kubectl("create", "namespace", "kube-rendezvous-system", check=False)
    plane.kubectl("apply", "-f", str(REPO / "docs" / "operator-rbac.yaml"))
    kubeconfig = plane.serviceaccount_kubeconfig("kube-rendezvous-system", "kube-rendezvous-operator")
    with OperatorProcess(kubeconfig, node_namespace, tmp_path / "operator.log") as operator:
        yield operator


def test_a_sigkilled_container_fails_its_pod_and_the_operator_evicts_its_node(
    real_node: Node, node_api: client.ApiClient, node_namespace: str, node_operator: OperatorProcess
) -> None:
    """restartPolicy Never: the kubelet marks the pod Failed, the operator evicts its node at once (no expiry
    wait), the survivors are carried into the next round and the Job controller's replacement joins it."""
    core, objects = client.CoreV1Api(node_api), client.CustomObjectsApi(node_api)
    started = example_job_training(
        real_node, node_api, node_namespace, example_objects(last_call_seconds=LAST_CALL_SECONDS)
    )
    first, trained = started.pods, started.trained
    before = rendezvous_status(objects, node_namespace)

    victim = sorted(first)[1]
    container = core.read_namespaced_pod(victim, node_namespace).status.container_statuses[0].container_id
    real_node.kill_container(container)
    wait_until(
        lambda: core.read_namespaced_pod(victim, node_namespace).status.phase == "Failed", 60, f"{victim} Failed"
    )
    second = wait_until(lambda: running_pods(core, node_namespace, victim), 180, "the replacement pod Running")
    status = wait_until(
        lambda: round_with(objects, node_namespace, second, before["round"]), 180, "a round with the replacement pod"
    )
    assert status["participantCount"] == 3
    node_evicted(core, node_namespace, f"evicted {first[victim]}_", "a NodeEvicted Event for the killed pod's node")
    for pod in second:
        wait_until(
            lambda pod=pod: worker_rounds(real_node, node_namespace, pod, 3) > trained.get(pod, 0),
            120,
            f"{pod} training in the new round",
        )


def test_a_sigkilled_container_restarted_by_the_kubelet_rejoins_from_the_same_pod(
    real_node: Node, node_api: client.ApiClient, node_namespace: str, node_operator: OperatorProcess
) -> None:
    """restartPolicy OnFailure: the kubelet restarts the container in the same pod (same name and address);
    its new agent, a new node, joins; the old node leaves the round and the job trains with 3 again."""
    core, objects = client.CoreV1Api(node_api), client.CustomObjectsApi(node_api)
    manifests = example_objects(last_call_seconds=LAST_CALL_SECONDS)
    job = next(item for item in manifests if item["kind"] == "Job")
    job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    del job["spec"]["podFailurePolicy"]  # the API allows it with restartPolicy Never only
    started = example_job_training(real_node, node_api, node_namespace, manifests)
    first, trained, before = started.pods, started.trained, started.status
    old_nodes = {item["node"] for item in before["participants"]}

    victim = sorted(first)[2]
    container = core.read_namespaced_pod(victim, node_namespace).status.container_statuses[0].container_id
    killed = time.monotonic()
    real_node.kill_container(container)
    wait_until(
        lambda: core.read_namespaced_pod(victim, node_namespace).status.container_statuses[0].restart_count == 1,
        60,
        f"the kubelet to restart {victim}'s container",
    )
    status = wait_until(
        lambda: (
            (found := round_with(objects, node_namespace, first, before["round"]))
            and {item["node"] for item in found["participants"]} - old_nodes
            and found
        ),
        120,
        "a round of 3 with the restarted container's new node",
    )
    assert running_pods(core, node_namespace) == first  # the same pods, names and addresses
    (old,) = {node for node in old_nodes if node.startswith(first[victim] + "_")}
    # The operator sees the container terminated ("pod ... is gone") or, if the kubelet restarted it first,
    # the restart ("a container of pod ... ended at ..."); either way at once, not at heartbeat expiry.
    node_evicted(core, node_namespace, f"evicted {old}", "the old agent's node evicted (not expired)")
    (new,) = {item["node"] for item in status["participants"]} - old_nodes
    assert new.startswith(first[victim] + "_")
    for pod in first:
        wait_until(
            lambda pod=pod: worker_rounds(real_node, node_namespace, pod, 3) > (0 if pod == victim else trained[pod]),
            120,
            f"{pod} training in the new round",
        )
    print(f"container restarted and the job training with 3 again {time.monotonic() - killed:.1f} s after the kill")


def test_a_stock_torchrun_job_trains_and_completes_on_real_pods(
    real_node: Node, node_api: client.ApiClient, node_namespace: str
) -> None:
    """examples/torch/indexed-job.yaml with stock torchrun: 3 pods train together, succeed, and close the Rendezvous."""
    batch, objects = client.BatchV1Api(node_api), client.CustomObjectsApi(node_api)
    apply(
        real_node,
        node_namespace,
        example_objects("torch/indexed-job.yaml", last_call_seconds=LAST_CALL_SECONDS, STEPS="20", STEP_SECONDS="0.2"),
    )
    job = wait_until(
        lambda: (found := batch.read_namespaced_job("llama-train", node_namespace)).status.succeeded == 3 and found,
        240,
        "the torchrun Job to succeed with 3 pods",
    )
    assert not job.status.failed
    status = rendezvous_status(objects, node_namespace)
    assert status["phase"] == "Closed" and status["participantCount"] == 3, status
    pods = client.CoreV1Api(node_api).list_namespaced_pod(node_namespace).items
    for pod in pods:
        logs = real_node.plane.kubectl("-n", node_namespace, "logs", pod.metadata.name).stdout
        assert "/3 group_rank" in logs and " step 19:" in logs, logs[-2000:]


def test_helm_runs_the_operator_image_as_a_deployment_that_upgrades_and_passes_helm_test(
    real_node: Node, node_api: client.ApiClient, node_namespace: str, helm: Helm
) -> None:
    """The operator image built from the Dockerfile (``testenv.operator_image``) runs as the chart's Deployment:
    Ready with in-cluster credentials, rolled to 2 replicas by ``helm upgrade``, and ``helm test`` passes: its
    pod resolves the metrics Service's name (CoreDNS) and gets ``/metrics`` through it (kube-proxy)."""
    plane = real_node.plane
    import_images(real_node.containerd_socket, [build_operator_image()])
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    # kube-proxy and CoreDNS run (``testenv.cluster``): helm test reaches the operator through its metrics
    # Service by name, as in any cluster.
    values = (
        f"image.repository={repository}",
        f"image.tag={tag}",
        "image.pullPolicy=Never",
        "rbac.scope=namespace",
        *own_release_fencing(plane, node_namespace),
    )
    release = install(helm, plane, "rdzv", node_namespace, *values)
    deployment = the(operator_objects(release.manifests, "Deployment"), "Deployment")["metadata"]["name"]
    apps = client.AppsV1Api(node_api)

    def ready(replicas: int) -> bool:
        found = apps.read_namespaced_deployment(deployment, node_namespace)
        status = found.status
        return bool(status.ready_replicas == replicas and status.updated_replicas == replicas)

    wait_until(lambda: ready(1), 180, "the operator Deployment Ready")
    upgrade(helm, plane, "rdzv", node_namespace, *values, "operator.replicas=2", "crds.install=false")
    wait_until(lambda: ready(2), 180, "2 operator replicas Ready after helm upgrade")
    try:
        tested = helm.run("test", "rdzv", "--namespace", node_namespace, "--kubeconfig", str(plane.admin_kubeconfig))
    except AssertionError as failed:
        test_pod = next(p for p in pod_names(node_api, node_namespace) if p.endswith("-test"))
        raise AssertionError(
            f"{failed}\nits pod's log:\n" + "\n".join(pod_log(real_node, node_namespace, test_pod))
        ) from None
    assert "Phase:          Succeeded" in tested.stdout, tested.stdout
    # The operator pods reconcile for real: a Rendezvous of this namespace gets its Ready condition.
    apply(
        real_node,
        node_namespace,
        [item for item in example_objects(last_call_seconds=LAST_CALL_SECONDS) if item["kind"] == "Rendezvous"],
    )
    objects = client.CustomObjectsApi(node_api)
    wait_until(
        lambda: any(c["type"] == "Ready" for c in rendezvous_status(objects, node_namespace).get("conditions") or []),
        60,
        "the operator pod to mark the Rendezvous Ready",
    )


def quickstart_status(objects: client.CustomObjectsApi) -> dict[str, Any]:
    """The status of the quickstart's Rendezvous (``quickstart`` in ``team-a``)."""
    found = objects.get_namespaced_custom_object(
        "kube-rendezvous.io", "v1alpha1", "team-a", "rendezvouses", "quickstart"
    )
    return dict(found.get("status") or {})


def test_the_readme_quickstart_installs_the_packaged_chart_and_its_job_trains_examples_train_py_with_torchrun(
    real_node: Node, node_api: client.ApiClient, built: Built, fresh_venv: Path, tmp_path: Path
) -> None:
    """The README's quickstart on the real node, its cluster commands as written: the packaged chart (dist/) installed
    by the README's ``helm install`` line with the built operator image under the README's tag, then
    examples/quickstart-job.yaml with the README's ``sed`` of its image, applied in ``team-a``: 2 pods of stock
    ``torchrun`` as the chart's ``trainer`` account form a round of 2 (Complete, then Closed when they end), train
    examples/train.py's 100 steps, and the Job succeeds with no failed pod.

    What differs, because this node pulls no image and download.pytorch.org (where examples/Dockerfile.training gets
    torch for CPU) cannot be reached here: ``docker load``/``tag`` is ``retag_docker_archive`` and ``ctr images
    import`` of the built archive; the training image under the README's tag is the test image, into which the pod
    mounts a fresh venv holding the built wheel (torch from this venv's site-packages after it; its ``torchrun``
    the script pip writes for torch's entry point) and examples/ as ``/workspace`` (the Dockerfile's WORKDIR); the
    pods request 100m CPU instead of 1 (a node of 2 CPUs). ``team-a`` is left out of the module's fencing policy
    (the README's install sets none)."""
    plane, commands = real_node.plane, quickstart_commands()
    registry = re.search(r"^REGISTRY=(\S+)", commands, re.MULTILINE)
    assert registry is not None, commands
    shell = {"$REGISTRY": registry.group(1), "dist/": f"{built.dist}/"}

    def as_written(line: str) -> str:
        for variable, value in shell.items():
            line = line.replace(variable, value)
        return line

    operator_tag = as_written(f"$REGISTRY/kube-rendezvous-operator:{VERSION}")
    assert f"docker tag ghcr.io/kube-rendezvous/operator:{VERSION} $REGISTRY/kube-rendezvous-operator:{VERSION}" in (
        commands
    )
    training_tag = as_written(f"$REGISTRY/kube-rendezvous-train:{VERSION}")
    retag_docker_archive(built.one("kube-rendezvous-operator-*.tar"), tmp_path / "operator.tar", operator_tag)
    retag_docker_archive(build_images()[TRAINING_IMAGE], tmp_path / "training.tar", training_tag)
    import_images(real_node.containerd_socket, [tmp_path / "operator.tar", tmp_path / "training.tar"])

    # A fresh cluster as the user's: the CRDs are the release's, and so are the operator's account and RBAC (the
    # module's earlier tests applied the CRDs and docs/operator-rbac.yaml by hand, and created the account).
    plane.kubectl("delete", "-f", str(REPO / "crds"), "--ignore-not-found", "--wait=true")
    plane.kubectl("delete", "-f", str(REPO / "docs" / "operator-rbac.yaml"), "--ignore-not-found")
    account = ("serviceaccount", "kube-rendezvous-operator", "--ignore-not-found")
    plane.kubectl("-n", "kube-rendezvous-system", "delete", *account)
    lines = commands.replace("\\\n", " ").splitlines()
    create_namespace = next(line for line in lines if line.startswith("kubectl create namespace"))
    plane.kubectl(*shlex.split(create_namespace, comments=True)[1:])
    plane.kubectl("label", "namespace", "team-a", f"{OWN_RELEASE_LABEL}=true")
    helm_install = next(line for line in lines if line.startswith("helm install"))
    arguments = shlex.split(as_written(helm_install), comments=True)[1:]
    done = built.helm.run(*arguments, "--kubeconfig", plane.admin_kubeconfig)
    print(done.stdout[-1500:])
    plane.kubectl("-n", "kube-rendezvous-system", "rollout", "status", "deployment", "--timeout=180s")

    sed = next(line for line in lines if line.startswith("sed "))
    expression = shlex.split(as_written(sed))[1]  # s|image: .*|image: <tag>|
    _, pattern, replacement, _ = expression.split("|")
    job = yaml.safe_load(re.sub(pattern, replacement, (REPO / "examples" / "quickstart-job.yaml").read_text()))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == training_tag and container["command"] == ["torchrun"]
    torchrun = fresh_venv / "bin" / "torchrun"
    torchrun.write_text(
        f"#!{fresh_venv}/bin/python\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"
    )
    torchrun.chmod(0o755)
    mounts = [*training_mounts(), (str(fresh_venv), str(fresh_venv)), (str(REPO / "examples"), "/workspace")]
    mount_host_paths(pod, mounts)
    container["workingDir"] = "/workspace"
    container["env"].append({"name": "PATH", "value": f"{fresh_venv}/bin:/usr/local/bin:/usr/bin:/bin"})
    container["resources"]["requests"]["cpu"] = "100m"
    plane.kubectl("-n", "team-a", "apply", "-f", "-", input=json.dumps(job))

    objects, batch = client.CustomObjectsApi(node_api), client.BatchV1Api(node_api)
    formed = wait_until(
        lambda: (status := quickstart_status(objects)).get("phase") in FORMED_PHASES and status,
        POD_RUNNING_SECONDS + POD_TRAINING_SECONDS,
        "the quickstart's 2 pods to form their round",
    )
    assert formed["participantCount"] == 2, formed
    finished = wait_until(
        lambda: (found := batch.read_namespaced_job("quickstart", "team-a")).status.succeeded == 2 and found,
        300,
        "the quickstart Job to succeed (100 steps of about 1 s)",
    )
    assert not finished.status.failed, finished.status
    logs = plane.kubectl("-n", "team-a", "logs", "job/quickstart").stdout
    assert "step 1/100: loss" in logs and "step 100/100: loss" in logs, logs[-2000:]
    final = quickstart_status(objects)
    assert (final["phase"], final["participantCount"]) == ("Closed", 2), final
    accounts = {p.spec.service_account_name for p in client.CoreV1Api(node_api).list_namespaced_pod("team-a").items}
    assert accounts == {"trainer"}
