"""The demo: a local control plane, the operator, and a 3-agent elastic tensorplay job that
rendezvouses through a Rendezvous object, loses a pod, recovers and finishes.

Run it with ``bash scripts/demo.sh`` (which installs what it needs first).
"""

from __future__ import annotations

import argparse
import os
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
from tests.testenv import ControlPlane, free_port, wait_until  # noqa: E402

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20, help="training steps of one second each (default 20)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kube-rendezvous-demo-"))
    say(f"starting a local control plane (etcd, kube-apiserver with RBAC, controller-manager) in {workdir}")
    plane = ControlPlane(workdir / "control-plane")
    plane.start()
    operator: subprocess.Popen[bytes] | None = None
    job: ElasticJob | None = None
    try:
        print(f"kubeconfig: {plane.admin_kubeconfig}")
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
            steps=args.steps,
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
