"""The demo: a local control plane, the operator, and a 3-pod elastic tensorplay job that
rendezvouses through a Rendezvous object, loses a pod, recovers and finishes.

By default the pods are real: three nodes (each its own containerd and kubelet; the scheduler, kube-proxy and
CoreDNS) run the README's example
Indexed Job, and ``kubectl delete pod`` makes the kubelet SIGTERM one agent. Where a real node is not
possible (not root, or scripts/setup.sh's Debian packages missing) it says why and, as with
``--simulated``, plays the kubelet: agents run as local processes beside Pod objects it writes.

Run it with ``bash scripts/demo.sh`` (which installs what it needs first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import ElasticJob, training_in_world  # noqa: E402
from tests.e2e.operator_process import create_training_pod  # noqa: E402
from tests.e2e.real_pods import (  # noqa: E402
    RENDEZVOUS as EXAMPLE_RENDEZVOUS,
)
from tests.e2e.real_pods import (  # noqa: E402
    apply,
    example_objects,
    rendezvous_status,
    round_with,
    running_pods,
    worker_rounds,
)
from tests.testenv import ControlPlane, free_port, wait_until  # noqa: E402
from tests.testenv.cluster import Cluster  # noqa: E402
from tests.testenv.images import import_images  # noqa: E402
from tests.testenv.node import unavailable  # noqa: E402
from tests.testenv.operator_image import OPERATOR_IMAGE, build_operator_image  # noqa: E402

NAMESPACE = "demo"
RENDEZVOUS = """
apiVersion: kube-rendezvous.io/v1alpha1
kind: Rendezvous
metadata:
  name: llama-train
spec:
  minNodes: 2
  maxNodes: 3
  lastCallTimeoutSeconds: 3
"""


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def show(plane: ControlPlane, *args: str) -> None:
    print(plane.kubectl(*args).stdout.rstrip(), flush=True)


def start_operator(plane: ControlPlane, workdir: Path) -> subprocess.Popen[bytes]:
    """The CRDs, the operator's documented RBAC, and the operator as a local process under its ServiceAccount."""
    say("installing the CRDs and the operator (with its documented RBAC)")
    show(plane, "apply", "-f", str(REPO / "crds"))
    plane.kubectl("wait", "--for=condition=established", "crd", "--all", "--timeout=60s")
    plane.kubectl("create", "namespace", NAMESPACE)
    plane.kubectl("create", "namespace", "kube-rendezvous-system")
    show(plane, "apply", "-f", str(REPO / "docs" / "operator-rbac.yaml"))
    operator_kubeconfig = plane.serviceaccount_kubeconfig("kube-rendezvous-system", "kube-rendezvous-operator")
    operator_log = workdir / "operator.log"
    with operator_log.open("wb") as log:
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kube_rendezvous_operator",
                "--log-format",
                "plain",
                "--metrics-port",
                str(free_port()),
                "--liveness",
                f"http://127.0.0.1:{free_port()}/healthz",
            ],
            env=dict(os.environ, KUBECONFIG=str(operator_kubeconfig)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    print(f"operator log: {operator_log}")
    return operator


def install_operator_chart(plane: ControlPlane, cluster: Cluster, workdir: Path) -> subprocess.Popen[bytes] | None:
    """The chart, with the operator image built here from the Dockerfile, as on a real cluster.

    Where the image cannot be built (no buildah or debootstrap, no network to Debian or PyPI) it says
    why and runs the operator as a local process instead (returned, to be stopped).
    """
    say("building the operator image from the Dockerfile (buildah on a local Debian base; ~2 min the first time)")
    try:
        image = build_operator_image()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        say(f"could not build the operator image ({str(exc)[-300:]}): running the operator as a local process")
        return start_operator(plane, workdir)
    for node in cluster.nodes:  # the Deployment's pod may land on any node
        import_images(node.containerd_socket, [image])
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    say("helm install kube-rendezvous charts/kube-rendezvous (CRDs, operator Deployment, RBAC, fencing policy)")
    done = subprocess.run(
        [
            str(plane.binaries.helm),
            "install",
            "kube-rendezvous",
            str(REPO / "charts" / "kube-rendezvous"),
            "--namespace",
            "kube-rendezvous-system",
            "--create-namespace",
            "--kubeconfig",
            str(plane.admin_kubeconfig),
            "--set",
            f"image.repository={repository}",
            "--set",
            f"image.tag={tag}",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "fencing.enabled=true",  # a pod's agent writes only its own node Lease (docs/security.md)
            "--wait",
            "--timeout=180s",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, HELM_CACHE_HOME=str(workdir / "helm"), HELM_CONFIG_HOME=str(workdir / "helm")),
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm install failed: {done.stderr[-2000:]}")
    plane.kubectl("wait", "--for=condition=established", "crd", "--all", "--timeout=60s")
    show(plane, "-n", "kube-rendezvous-system", "get", "deployments,pods", "-o", "wide")
    plane.kubectl("create", "namespace", NAMESPACE)
    return None


def show_events(plane: ControlPlane) -> None:
    say("kubectl get events (the Rendezvous)")
    show(
        plane,
        "-n",
        NAMESPACE,
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=llama-train",
        "--sort-by=.metadata.creationTimestamp",
        "-o",
        "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20, help="training steps of one second each (default 20)")
    parser.add_argument("--simulated", action="store_true", help="play the kubelet instead of running a real node")
    parser.add_argument("--keep", action="store_true", help="keep the working directory after a success")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-demo-"))
    missing = None if args.simulated else unavailable()
    if missing is not None:
        say(f"no real node on this machine ({missing}): the demo plays the kubelet instead")
    try:
        play = simulated if args.simulated or missing is not None else real_node
        result = play(args.steps, workdir)
    except BaseException:
        say(f"the demo failed: its logs and the cluster's data are kept in {workdir}")
        raise
    if result != 0 or args.keep:
        say(f"its logs and the cluster's data are kept in {workdir}")
        return result
    remove_workdir(workdir)
    return result


def mounts_under(directory: Path) -> list[str]:
    """The mount points at or below ``directory`` (``/proc/self/mounts``; its paths escape spaces as octal)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[1].encode().decode("unicode_escape") for line in lines if len(line.split()) > 1]
    return [point for point in points if point == str(directory) or point.startswith(f"{directory}/")]


def remove_workdir(workdir: Path) -> None:
    """Remove the demo's working directory (about 750 MB with a real node), unless something is still mounted
    below it: removing then could reach through a pod's bind mount into the host's files."""
    mounted = mounts_under(workdir)
    if mounted:
        say(f"{workdir} is kept: {len(mounted)} mount(s) remain below it (first: {mounted[0]}); unmount, remove it")
        return
    shutil.rmtree(workdir, ignore_errors=True)
    say(f"removed its working directory {workdir} (--keep keeps it)")


def real_node(steps: int, workdir: Path) -> int:
    """The README's example Job as 3 real pods on 3 real nodes; ``kubectl delete pod`` one; the Job finishes."""
    say(
        "starting a local control plane and 3 real nodes (each its own containerd and kubelet; kube-scheduler, "
        f"kube-proxy, CoreDNS) in {workdir}"
    )
    plane = ControlPlane(workdir / "control-plane", with_node=True)
    plane.start()
    cluster: Cluster | None = None
    operator: subprocess.Popen[bytes] | None = None
    try:
        cluster = Cluster(plane, nodes=3)
        cluster.start()
        node = cluster.node
        print(f"kubeconfig: {plane.admin_kubeconfig}")
        show(plane, "get", "nodes", "-o", "wide")
        operator = install_operator_chart(plane, cluster, workdir)
        api = config.new_client_from_config(str(plane.admin_kubeconfig))
        core, objects, batch = client.CoreV1Api(api), client.CustomObjectsApi(api), client.BatchV1Api(api)

        say("examples/rendezvous.yaml and examples/training-job.yaml: an Indexed Job of 3 pods, 1 worker each")
        print("(fitted here: the image is built locally and mounts this machine's Python; smaller requests)")
        apply(node, NAMESPACE, example_objects(STEPS=str(steps), STEP_SECONDS="1"))
        started = time.monotonic()

        first = wait_until(lambda: running_pods(core, NAMESPACE), 240, "3 training pods Running")
        wait_until(
            lambda: (
                round_with(objects, NAMESPACE, first) and all(worker_rounds(node, NAMESPACE, pod, 3) for pod in first)
            ),
            180,
            "the 3 pods' workers training together",
        )
        print(f"round formed and training in {time.monotonic() - started:.1f} s: 3 real pods, world size 3")
        show(plane, "-n", NAMESPACE, "get", "pods", "-o", "wide")
        show(plane, "-n", NAMESPACE, "get", "rdzv", "-o", "wide")

        victim = sorted(first)[1]
        survivors = sorted(set(first) - {victim})
        rounds = {pod: worker_rounds(node, NAMESPACE, pod) for pod in first}
        say(
            f"kubectl delete pod {victim}: the operator evicts its node, the kubelet SIGTERMs its agent (it leaves), "
            "and the Job controller creates a replacement pod"
        )
        deleted = time.monotonic()
        show(plane, "-n", NAMESPACE, "delete", "pod", victim, "--wait=false")
        wait_until(
            lambda: all(worker_rounds(node, NAMESPACE, pod) > rounds[pod] for pod in survivors),
            180,
            "the survivors training in a new round",
        )
        print(f"survivors training again in a new round {time.monotonic() - deleted:.1f} s after the delete")
        show(plane, "-n", NAMESPACE, "get", "rdzv", "-o", "wide")
        second = wait_until(
            lambda: running_pods(core, NAMESPACE, victim), 180, "the Job controller's replacement pod Running"
        )
        replacement = next(pod for pod in second if pod not in first)

        def closed() -> bool:
            return bool(rendezvous_status(objects, NAMESPACE).get("phase") == "Closed")

        wait_until(
            lambda: worker_rounds(node, NAMESPACE, replacement, 3) > 0 or closed(), 180, f"{replacement} training"
        )
        if worker_rounds(node, NAMESPACE, replacement, 3) > 0:
            took = time.monotonic() - deleted
            print(f"replacement pod {replacement} joined: 3 pods training {took:.1f} s after the delete")
        else:
            print(f"the survivors finished all {steps} steps before replacement pod {replacement} could join")
        show(plane, "-n", NAMESPACE, "get", "pods", "-o", "wide")
        show(plane, "-n", NAMESPACE, "get", "rdzv", "-o", "wide")

        say("waiting for the Job to finish")
        job = wait_until(
            lambda: (found := batch.read_namespaced_job(EXAMPLE_RENDEZVOUS, NAMESPACE)).status.succeeded == 3 and found,
            120 + 3 * steps,
            "the Job to complete",
        )
        print(f"Job complete: {job.status.succeeded} pods succeeded, {job.status.failed or 0} failed")
        say("kubectl get rdzv")
        show(plane, "-n", NAMESPACE, "get", "rdzv", "-o", "wide")
        show_events(plane)
        return 0
    finally:
        if operator is not None and operator.poll() is None:
            operator.terminate()
            operator.wait(20)
        if cluster is not None:
            cluster.stop()
        plane.stop()


def simulated(steps: int, workdir: Path) -> int:
    """The kubelet played: Pod objects written here, each agent a local process with its own address."""
    say(f"starting a local control plane (etcd, kube-apiserver with RBAC, controller-manager) in {workdir}")
    plane = ControlPlane(workdir / "control-plane")
    plane.start()
    operator: subprocess.Popen[bytes] | None = None
    job: ElasticJob | None = None
    try:
        print(f"kubeconfig: {plane.admin_kubeconfig}")
        operator = start_operator(plane, workdir)

        say("the training pods' ServiceAccount 'trainer' with the agent Role, and the Rendezvous")
        show(plane, "-n", NAMESPACE, "apply", "-f", str(REPO / "docs" / "rbac.yaml"))
        plane.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=RENDEZVOUS)
        trainer = plane.serviceaccount_kubeconfig(NAMESPACE, "trainer")
        wait_until(
            lambda: (
                "Ready"
                in plane.kubectl(
                    "-n", NAMESPACE, "get", "rdzv", "llama-train", "-o", "jsonpath={.status.conditions[*].type}"
                ).stdout
            ),
            60,
            "the operator to mark the Rendezvous Ready",
        )
        show(plane, "-n", NAMESPACE, "get", "rdzv")

        say("3 pods (no kubelet here: the demo plays it) each running an agent with 2 workers")
        core = client.CoreV1Api(config.new_client_from_config(str(plane.admin_kubeconfig)))
        addresses = [f"127.0.0.{21 + index}" for index in range(3)]
        for index, address in enumerate(addresses):
            create_training_pod(core, NAMESPACE, f"trainer-{index}", "llama-train", address)
        job = ElasticJob(
            workdir / "job",
            "k8s",
            f"{NAMESPACE}/llama-train",
            "2:3",
            rdzv_conf={"kubeconfig": str(trainer)},
            steps=steps,
            step_seconds=1.0,
        )
        command = " ".join(job.command("<pod IP>")[1:])
        print(f"each agent: python {command}")
        agents = [job.start_agent(f"trainer-{i}", local_addr=address) for i, address in enumerate(addresses)]
        started = time.monotonic()
        by_group = wait_until(lambda: training_in_world(agents, 6), 180, "3 agents training together")
        print(f"round formed and training in {time.monotonic() - started:.1f} s: world size 6")
        show(plane, "-n", NAMESPACE, "get", "rdzv", "-o", "wide")

        victim = by_group[1]
        say(f"killing pod {victim.name} (its agent and workers, SIGKILL) and deleting the Pod")
        killed = time.monotonic()
        victim.kill_pod()
        core.delete_namespaced_pod(victim.name, NAMESPACE, grace_period_seconds=0)
        survivors = [agent for agent in agents if agent is not victim]
        wait_until(lambda: training_in_world(survivors, 4, min_step=0), 180, "the survivors to form a new round")
        print(f"survivors training again in a new round {time.monotonic() - killed:.1f} s after the kill: world size 4")
        show(plane, "-n", NAMESPACE, "get", "rdzv", "-o", "wide")

        say("waiting for the job to finish")
        codes = job.wait(survivors, 300)
        results = job.last_results()
        print(
            f"agents exited with {codes}; last round: world size {results[0]['world_size'] if results else '?'}, "
            f"all_reduce sums {sorted({s for r in results for s in r['sums']})}"
        )
        say("kubectl get rdzv")
        show(plane, "-n", NAMESPACE, "get", "rdzv", "-o", "wide")
        show_events(plane)
        return 0 if codes == [0, 0] else 1
    finally:
        if job is not None:
            job.stop()
        if operator is not None and operator.poll() is None:
            operator.terminate()
            operator.wait(20)
        plane.stop()


if __name__ == "__main__":
    sys.exit(main())
