"""The README's example Jobs as real pods on the test node (``tests.testenv.node``), and what to watch in them.

``example_objects`` takes ``examples/`` as shipped and changes only what this cluster needs: the image
(built here, no registry), the host's interpreter mounted into it, smaller requests, and this
repository's training script. Its agents use in-cluster credentials (the projected ServiceAccount
token, ``KUBERNETES_SERVICE_HOST``) and ``POD_IP`` from the downward API, as in any cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from kubernetes import client

from tests.testenv import ControlPlane, wait_until
from tests.testenv.images import TRAINING_IMAGE, training_mounts, venv_python
from tests.testenv.node import Node

REPO = Path(__file__).resolve().parents[2]
RENDEZVOUS = "llama-train"
#: Seconds the tests give a Job's pods to run (the scheduler, the kubelet, the image's mounts).
POD_RUNNING_SECONDS = 180
#: Seconds the tests give running pods to form a round, and each pod's agent to train a step in it.
POD_TRAINING_SECONDS = 120
#: Phases of a Rendezvous whose current round formed: ``Complete``, or ``Closed`` since.
FORMED_PHASES = ("Complete", "Closed")


#: Each example Job's launcher (a console script of the virtualenv, or the module) and training script.
LAUNCHERS = {
    "training-job.yaml": ([venv_python(), "-m", "kube_rendezvous.run"], REPO / "tests" / "e2e" / "train.py"),
    "torch/indexed-job.yaml": (
        [str(Path(venv_python()).parent / "torchrun")],
        REPO / "tests" / "e2e" / "train_torch.py",
    ),
}


def example_objects(
    job_file: str = "training-job.yaml", *, last_call_seconds: int | None = None, **environment: str
) -> list[dict[str, Any]]:
    """``examples/``: the Rendezvous, ServiceAccount, Role, RoleBinding and the Job of ``job_file``, fitted here.

    ``last_call_seconds`` sets the Rendezvous's ``lastCallTimeoutSeconds`` (None: the agents' 30 s). Without
    the operator, a round of the example's 3 pods (2 to 4 nodes) forms only when the last call ends."""
    objects = [
        item
        for name in ("rendezvous.yaml", "training-job.yaml")
        for item in yaml.safe_load_all((REPO / "examples" / name).read_text())
        if item and item["kind"] != "Job"
    ]
    job = next(
        item
        for item in yaml.safe_load_all((REPO / "examples" / job_file).read_text())
        if item and item["kind"] == "Job"
    )
    objects.append(job)
    if last_call_seconds is not None:
        for item in objects:
            if item["kind"] == "Rendezvous":
                item["spec"]["lastCallTimeoutSeconds"] = last_call_seconds
    launcher, script = LAUNCHERS[job_file]
    fit_pod(job["spec"]["template"]["spec"], launcher, script, **environment)
    return objects


def fit_pod(pod: dict[str, Any], launcher: list[str], script: Path, **environment: str) -> dict[str, Any]:
    """Fit a pod template's ``spec`` (its first container) to this cluster, in place, and return it: the image, the
    command line (``fitted_command``), the host's interpreter mounted, small requests, a 30 s grace period and the
    training script's environment (``environment`` over the defaults)."""
    pod["terminationGracePeriodSeconds"] = 30
    container = pod["containers"][0]
    container["image"] = TRAINING_IMAGE
    container["imagePullPolicy"] = "Never"
    fitted = fitted_command([*container.get("command", []), *container.get("args", [])], launcher, script)
    container["command"], container["args"] = fitted[: len(launcher)], fitted[len(launcher) :]
    container["env"] = [*container.get("env", []), *training_environment(**environment)]
    container["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    mount_host_paths(pod, training_mounts())
    return pod


def mount_host_paths(pod: dict[str, Any], mounts: list[tuple[str, str]]) -> None:
    """Give ``pod`` (a spec) exactly ``mounts``, (hostPath, mountPath) pairs, read-only in its first container."""
    pod["volumes"] = [{"name": f"host-{i}", "hostPath": {"path": host}} for i, (host, _) in enumerate(mounts)]
    pod["containers"][0]["volumeMounts"] = [
        {"name": f"host-{i}", "mountPath": inside, "readOnly": True} for i, (_, inside) in enumerate(mounts)
    ]


def fitted_command(given: list[str], launcher: list[str], script: Path) -> list[str]:
    """``launcher``, the flags of the command line ``given`` (``--nproc-per-node=1``), ``--monitor-interval=0.5``
    and ``script``: the example's launcher and training script are replaced, its flags kept."""
    flags = [arg.replace("--nproc-per-node=8", "--nproc-per-node=1") for arg in given if arg.startswith("--")]
    return [*launcher, *flags, "--monitor-interval=0.5", str(script)]


def training_environment(**environment: str) -> list[dict[str, str]]:
    """The training script's variables (``environment`` over the defaults: 100000 steps of 0.5 s)."""
    values = {
        "OMP_NUM_THREADS": "1",
        "LOGLEVEL": "INFO",
        "RESULT_DIR": "/tmp",
        "STEPS": "100000",
        "STEP_SECONDS": "0.5",
        **environment,
    }
    return [{"name": name, "value": value} for name, value in values.items()]


@contextmanager
def namespace_with_crds(plane: ControlPlane, api: client.ApiClient, name: str) -> Iterator[str]:
    """Namespace ``name`` on ``plane``'s cluster, with the CRDs applied, while the block runs; deleted after."""
    plane.kubectl("apply", "-f", str(REPO / "crds"))
    plane.wait_established("crd/rendezvouses.kube-rendezvous.io")
    core = client.CoreV1Api(api)
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


def running_pods(core: client.CoreV1Api, namespace: str, exclude: str = "") -> dict[str, str] | None:
    """The 3 training pods' names and addresses once exactly 3 exist, all Running with an address, none ``exclude``."""
    pods = training_pods(core, namespace)
    ready = {p.metadata.name: p.status.pod_ip for p in pods if p.status.phase == "Running" and p.status.pod_ip}
    return ready if len(ready) == 3 and len(pods) == 3 and exclude not in ready else None


def rendezvous_status(objects: client.CustomObjectsApi, namespace: str) -> dict[str, Any]:
    found = objects.get_namespaced_custom_object(
        "kube-rendezvous.io", "v1alpha1", namespace, "rendezvouses", RENDEZVOUS
    )
    return dict(found.get("status") or {})


def member_addresses(status: dict[str, Any]) -> set[str]:
    """The addresses of the current round's participants (a node is ``address_pid_localid``)."""
    return {item["node"].rsplit("_", 2)[0] for item in status.get("participants") or []}


def formed_with(
    status: dict[str, Any], addresses: set[str], after_round: int = -1, phases: tuple[str, ...] = FORMED_PHASES
) -> bool:
    """Whether the current round formed (its phase one of ``phases``) with exactly the nodes at ``addresses``,
    later than ``after_round``."""
    return (
        status.get("phase") in phases
        and int(status.get("round", -1)) > after_round
        and member_addresses(status) == addresses
    )


def round_with(
    objects: client.CustomObjectsApi,
    namespace: str,
    pods: Mapping[str, str],
    after_round: int = -1,
    phases: tuple[str, ...] = FORMED_PHASES,
) -> dict[str, Any] | None:
    """The Rendezvous status once a round later than ``after_round`` formed with exactly ``pods``' addresses (its
    phase one of ``phases``)."""
    status = rendezvous_status(objects, namespace)
    return status if formed_with(status, set(pods.values()), after_round, phases) else None


def pod_log(node: Node, namespace: str, pod: str, uid: str = "*") -> list[str]:
    """The lines ``pod``'s containers wrote, read from the kubelet's log files of whichever node of the cluster
    runs it (every node's folder is on this machine), in the order written; [] when it has none yet. ``uid``: only
    the pod of that uid (a pod replaced under the same name, as a PyTorchJob's, leaves its folder beside).

    Read from disk (each node's ``podLogsDir``), as fast as a file read, with no API server and kubelet round
    trip per poll."""
    lines: list[str] = []
    for path in sorted(node.plane.workdir.glob(f"*/pod-logs/{namespace}_{pod}_{uid}/*/*.log")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        # CRI format: "<time> <stream> <P|F> <text>"; P marks a partial line continued by the next entry.
        pending = ""
        for entry in text.splitlines():
            parts = entry.split(" ", 3)
            if len(parts) < 3:
                continue
            pending += parts[3] if len(parts) == 4 else ""
            if parts[2] != "P":
                lines.append(pending)
                pending = ""
    return lines


def worker_rounds(node: Node, namespace: str, pod: str, world: int | None = None, uid: str = "*") -> int:
    """How many rounds ``pod``'s agent started (of ``world`` workers, or any) whose workers then trained a step
    (``uid``: as ``pod_log``)."""
    lines = pod_log(node, namespace, pod, uid)
    size = "" if world is None else f" {world}"
    starts = [i for i, line in enumerate(lines) if f"init_process_group world{size}" in line]
    ends = [*starts[1:], len(lines)]  # one longer than ``starts`` when it is empty: zip stops at the shorter
    step = f"/{world} group_rank" if world is not None else " group_rank "
    return sum(
        1
        for start, end in zip(starts, ends, strict=False)
        if any(step in line and " step " in line and line.startswith("rank ") for line in lines[start + 1 : end])
    )


def pods_report(node: Node, namespace: str, pods: Iterable[str] = (), lines: int = 30) -> str:
    """What a failed wait on ``namespace``'s pods shows: ``kubectl get pods -o wide`` and the last ``lines`` each of
    ``pods`` logged."""
    shown = node.plane.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False)
    tails = [f"{pod}'s log tail:\n" + "\n".join(pod_log(node, namespace, pod)[-lines:]) for pod in pods]
    return "\n".join([shown.stdout + shown.stderr, *tails])


#: The pods ``start_training_pods`` waits for, as its ``running`` gives them: name -> address (or more).
Pods = TypeVar("Pods", bound=Mapping[str, Any])


@dataclass
class TrainingPods(Generic[Pods]):
    """A test's training pods once they trained together."""

    #: As ``running`` gave them once they ran.
    pods: Pods
    #: The Rendezvous status of their round as ``formed`` gave it ({} when no round was waited for).
    status: dict[str, Any]
    #: Each pod's rounds of ``world`` workers that trained a step.
    trained: dict[str, int]


def start_training_pods(
    node: Node,
    namespace: str,
    running: Callable[[], Pods | None],
    world: int,
    *,
    objects: list[dict[str, Any]] | None = None,
    formed: Callable[[Pods], dict[str, Any] | None] | None = None,
    what: str = "the training pods",
    running_timeout: float = POD_RUNNING_SECONDS,
    timeout: float = POD_TRAINING_SECONDS,
) -> TrainingPods[Pods]:
    """Apply ``objects`` (None: applied already), then wait until ``running`` gives the pods (name -> address, or
    more), until ``formed`` gives the Rendezvous status of their round (None: no round to wait for, as with c10d),
    and until each pod's agent trained a step in a world of ``world`` workers.

    Raises TimeoutError naming what was waited for, with the pods and what they logged last
    (``pods_report``), after ``running_timeout`` seconds for the pods to run and ``timeout`` for each later wait."""
    if objects is not None:
        apply(node, namespace, objects)
    pods: Pods = wait_until(running, running_timeout, f"{what} Running", explain=lambda: pods_report(node, namespace))

    def report() -> str:
        return pods_report(node, namespace, sorted(pods))

    status: dict[str, Any] = {}
    if formed is not None:
        status = wait_until(lambda: formed(pods), timeout, f"a round of {what}", explain=report)
    trained = {
        pod: wait_until(
            lambda pod=pod: worker_rounds(node, namespace, pod, world),
            timeout,
            f"{pod} training with {world}",
            explain=report,
        )
        for pod in pods
    }
    return TrainingPods(pods, status, trained)


def example_job_training(
    node: Node, api: client.ApiClient, namespace: str, manifests: list[dict[str, Any]]
) -> TrainingPods[dict[str, str]]:
    """Apply an example Job's ``manifests`` (``example_objects``); return its 3 pods (name -> address) once they
    formed a round and each pod's agent trained a step in a world of 3."""
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    return start_training_pods(
        node,
        namespace,
        lambda: running_pods(core, namespace),
        3,
        objects=manifests,
        formed=lambda pods: round_with(objects, namespace, pods),
        what="3 training pods",
    )


def host_pod(name: str, node: str | None, command: list[str], **spec: Any) -> dict[str, Any]:
    """A pod of the training image running ``command`` with the host's interpreter mounted, on ``node`` (None: where
    the scheduler puts it); ``spec`` is added to its spec."""
    mounts = training_mounts()
    container = {
        "name": "main",
        "image": TRAINING_IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
        "volumeMounts": [
            {"name": f"host-{i}", "mountPath": inside, "readOnly": True} for i, (_, inside) in enumerate(mounts)
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            **({} if node is None else {"nodeName": node}),
            "containers": [container],
            "volumes": [{"name": f"host-{i}", "hostPath": {"path": host}} for i, (host, _) in enumerate(mounts)],
            **spec,
        },
    }
