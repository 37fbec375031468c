"""Run the local control plane by hand: ``python -m tests.testenv {build,up,down,status}``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from .binaries import ensure_binaries
from .controlplane import ControlPlane
from .workloads import build_in_place_restart_agent, build_workload_controllers

DEFAULT_WORKDIR = Path(os.environ.get("KUBE_RENDEZVOUS_CONTROL_PLANE_DIR", "/tmp/kube-rendezvous-control-plane"))


def _state_file(workdir: Path) -> Path:
    return workdir / "state.json"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def up(workdir: Path) -> int:
    state = _state_file(workdir)
    if state.exists() and any(_running(pid) for pid in json.loads(state.read_text())["pids"].values()):
        print(f"already running; kubeconfig: {json.loads(state.read_text())['kubeconfig']}")
        return 0
    shutil.rmtree(workdir, ignore_errors=True)
    plane = ControlPlane(workdir)
    plane.start()
    state.write_text(
        json.dumps(
            {
                "pids": plane.pids(),
                "kubeconfig": str(plane.admin_kubeconfig),
                "server": plane.server,
                "logs": {k: str(v) for k, v in plane.logs().items()},
            }
        )
    )
    print(f"control plane up at {plane.server} (logs in {plane.logdir})")
    print(f"  export KUBECONFIG={plane.admin_kubeconfig}")
    print(f"  alias kubectl={plane.binaries.kubectl}")
    print(f"  helm: {plane.binaries.helm}")
    print("  stop it with: python -m tests.testenv down")
    return 0


def down(workdir: Path) -> int:
    state = _state_file(workdir)
    if not state.exists():
        print("not running")
        return 0
    pids = json.loads(state.read_text())["pids"]
    for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
        pid = pids.get(name)
        if pid and _running(pid):
            os.killpg(pid, signal.SIGTERM)
            print(f"stopped {name} (pid {pid})")
    state.unlink()
    return 0


def status(workdir: Path) -> int:
    state = _state_file(workdir)
    if not state.exists():
        print("not running")
        return 1
    data = json.loads(state.read_text())
    for name, pid in data["pids"].items():
        print(f"{name}: pid {pid} {'running' if _running(pid) else 'DEAD'}")
    print(f"export KUBECONFIG={data['kubeconfig']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testenv", description=__doc__)
    parser.add_argument("command", choices=["build", "up", "down", "status"])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"default {DEFAULT_WORKDIR}")
    parser.add_argument(
        "--workloads",
        action="store_true",
        help="build: also JobSet (and its in-place restart agent), Trainer, Kueue and the training-operator"
        " (tests/test_workloads.py)",
    )
    args = parser.parse_args(argv)
    if args.command == "build":
        print(ensure_binaries())
        if args.workloads:
            print(build_workload_controllers())
            print(build_in_place_restart_agent())
        return 0
    return {"up": up, "down": down, "status": status}[args.command](args.workdir.resolve())


if __name__ == "__main__":
    sys.exit(main())
