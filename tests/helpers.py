"""Shared helpers of the tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters

from tests.faultproxy import FaultProxy

if TYPE_CHECKING:
    from tests.testenv import ControlPlane

REPO = Path(__file__).resolve().parents[1]


def rendezvous_parameters(
    endpoint: str,
    kubeconfig: Path | str,
    *,
    run_id: str = "job-1",
    min_nodes: int = 1,
    max_nodes: int = 4,
    **conf: Any,
) -> RendezvousParameters:
    """Launcher-style parameters for backend ``k8s`` using ``kubeconfig``."""
    config = {"kubeconfig": str(kubeconfig), **{key: str(value) for key, value in conf.items()}}
    return RendezvousParameters(
        backend="k8s", endpoint=endpoint, run_id=run_id, min_nodes=min_nodes, max_nodes=max_nodes, config=config
    )


def run_workers(command: str, count: int, *args: str, timeout: float = 300) -> list[dict[str, Any]]:
    """Run ``count`` processes of ``python -m tests.workers <command> <args>`` at once; return their JSON outputs."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.workers", command, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        if process.returncode != 0:
            raise AssertionError(f"worker {command} failed ({process.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def create_rendezvous(objects: Any, namespace: str, name: str = "job", **spec: Any) -> None:
    """Create Rendezvous ``namespace/name`` as an admin (``objects``: a CustomObjectsApi); spec defaults 1..4 nodes."""
    objects.create_namespaced_custom_object(
        "kube-rendezvous.io",
        "v1alpha1",
        namespace,
        "rendezvouses",
        {
            "apiVersion": "kube-rendezvous.io/v1alpha1",
            "kind": "Rendezvous",
            "metadata": {"name": name},
            "spec": {"minNodes": 1, "maxNodes": 4, **spec},
        },
    )


def holds_for(predicate: Callable[[], object], seconds: float, what: str, interval: float = 0.5) -> None:
    """Check ``predicate`` every ``interval`` for ``seconds``; fail the moment it is false.

    The opposite of ``wait_until``: for claims that something does NOT happen (a hang). An
    exception in ``predicate`` propagates as itself, so a broken check can never pass for the
    expected outcome.
    """
    started = time.monotonic()
    while True:
        if not predicate():
            raise AssertionError(f"{what} stopped holding after {time.monotonic() - started:.1f} s")
        if time.monotonic() - started >= seconds:
            return
        time.sleep(interval)


def pod_failed(
    core: Any, namespace: str, name: str, *, finished: datetime | None = None, reason: str | None = "Error"
) -> None:
    """What the kubelet reports for a ``restartPolicy: Never`` pod whose container was killed: phase Failed,
    exit code 137, finished at ``finished`` (now by default). ``core``: a CoreV1Api."""
    terminated: dict[str, Any] = {"exitCode": 137}
    if reason is not None:
        terminated["reason"] = reason
    terminated["finishedAt"] = (finished or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "agent",
                        "image": "trainer:latest",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        },
    )


@contextmanager
def running_fault_proxy(control_plane: ControlPlane, directory: Path, seed: int) -> Iterator[FaultProxy]:
    """A fault proxy in front of ``control_plane``'s API server, stopped (joined) afterwards; it must not
    have failed itself."""
    proxy = FaultProxy(control_plane.server, control_plane.pki.ca_cert, control_plane.pki.ca_key, directory, seed=seed)
    proxy.start()
    yield proxy
    proxy.stop()
    assert proxy.errors == [], f"the fault proxy itself failed: {proxy.errors}"
