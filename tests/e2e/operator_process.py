"""The operator as a local process (``python -m kube_rendezvous_operator``), as its pod would run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.testenv import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]


class OperatorProcess:
    """Start, probe, kill and stop the operator; read its metrics. Also a context manager."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log: Path,
        *,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        pod: Any = None,
    ) -> None:
        """With ``pod`` (a ``tests.testenv.podnet.Pod``) the operator runs in that pod's network namespace."""
        self.kubeconfig, self.namespace, self.log = kubeconfig, namespace, log
        self.args, self.env, self.pod = args, dict(env or {}), pod
        self.metrics_port, self.health_port = free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        host = "127.0.0.1" if self.pod is None else self.pod.address
        with self.log.open("ab") as handle:
            command = [
                sys.executable,
                "-m",
                "kube_rendezvous_operator",
                "--namespace",
                self.namespace,
                "--metrics-port",
                str(self.metrics_port),
                "--log-format",
                "plain",
                "--liveness",
                f"http://{host}:{self.health_port}/healthz",
                *self.args,
            ]
            self.process = subprocess.Popen(
                command if self.pod is None else self.pod.command(command),
                env=dict(os.environ, KUBECONFIG=str(self.kubeconfig), **self.env),
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
            )
        wait_until(self.healthy, 60, f"the operator's liveness endpoint (log: {self.log})")

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the operator exited:\n{self.log.read_text()[-3000:]}")
        host = "127.0.0.1" if self.pod is None else self.pod.address
        with urllib.request.urlopen(f"http://{host}:{self.health_port}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)

    def kill(self) -> None:
        """SIGKILL, as a node failure would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def metric(self, name: str) -> float:
        """Sum of every sample of metric ``name``."""
        host = "127.0.0.1" if self.pod is None else self.pod.address
        with urllib.request.urlopen(f"http://{host}:{self.metrics_port}/metrics", timeout=5) as answer:
            lines = answer.read().decode().splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith(name))

    def __enter__(self) -> OperatorProcess:
        self.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()


def create_training_pod(core: client.CoreV1Api, namespace: str, name: str, rendezvous: str, address: str) -> None:
    """A Pod labelled for ``rendezvous`` with ``address`` as its IP: no kubelet runs, so we play it."""
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"kube-rendezvous.io/rendezvous": rendezvous}),
            spec=client.V1PodSpec(
                service_account_name="trainer", containers=[client.V1Container(name="agent", image="trainer:latest")]
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
    )


def create_training_pods(
    core: client.CoreV1Api, namespace: str, addresses: list[str], rendezvous: str = "job"
) -> list[str]:
    """``create_training_pod`` at each of ``addresses``, named ``trainer-N`` as ``ElasticJob.start(addresses)``
    names their agents; return ``addresses``."""
    for index, address in enumerate(addresses):
        create_training_pod(core, namespace, f"trainer-{index}", rendezvous, address)
    return addresses
