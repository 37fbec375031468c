"""Container images for the test node, built here with no registry and no Docker: pause and training.

- ``PAUSE_IMAGE``: the pod sandbox. One static binary, ``/pause``, compiled from ``pause.c`` beside
  this file (``gcc -static -O2``): it blocks until SIGINT or SIGTERM, exits 0, and reaps orphans.
- ``TRAINING_IMAGE``: an almost empty root filesystem (``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as
  symlinks into ``/usr``; ``/tmp``; ``/etc/passwd``, ``/etc/group``, ``/etc/nsswitch.conf``; the host's
  ``ld.so.cache`` and ``ld.so.conf``). A training pod runs the HOST's interpreter and this repository's
  virtualenv in it, mounted read-only by the pod spec (hostPath volumes, ``training_mounts()``):
  ``/usr``, the interpreter's base prefix and the repository root. ``venv_python()`` is the command.

Why mounted rather than copied: the virtualenv with torch and tensorplay weighs ~6 GB. Copying it into
a layer would cost every cold CI run minutes of tar, hash and unpack, and twice that disk (the tarball
plus containerd's unpacked snapshot), and the copy would go stale after each ``pip install``. A mount
costs nothing and always runs the code under test. What it costs instead: the pod is not hermetic (it
sees the host's ``/usr``: glibc, libstdc++, every tool), its mounts are read-only so it cannot install
anything, and every training pod spec must carry the three hostPath volumes.

Not guaranteed: the training image runs only on this very host (or one with the same paths, the same
``/usr`` and the same interpreter). It holds no interpreter of its own, its ``PATH`` and ``ld.so.cache``
name host paths, and the cache key covers those paths, not the files behind them: never push it.

Both tarballs use the ``docker save`` layout (``manifest.json`` with ``RepoTags``, the config JSON, one
uncompressed layer tar) that ``ctr images import`` reads. Every tar entry is owned by root with mtime 0,
so a rebuild is byte-identical. They are cached under ``cache_root() / "images-<content hash>"``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .binaries import cache_root, log_progress
from .commands import run_command

PAUSE_IMAGE = "localhost/kube-rendezvous/pause:3.10"
TRAINING_IMAGE = "localhost/kube-rendezvous/training:1"
REPO_ROOT = Path(__file__).resolve().parents[2]
PAUSE_SOURCE = Path(__file__).resolve().with_name("pause.c")
_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = b"root:x:0:\nnobody:x:65534:\n"
_NSSWITCH = b"passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nservices: files\n"

Entry = tuple[tarfile.TarInfo, bytes | None]


def venv_python() -> str:
    """The virtualenv's interpreter: the same path on the host and in a training container."""
    return str(REPO_ROOT / ".venv" / "bin" / "python")


@functools.cache
def _base_prefix() -> str:
    command = [venv_python(), "-S", "-c", "import sys; print(sys.base_prefix)"]
    return run_command(command, timeout=60).stdout.strip()


def training_mounts() -> list[tuple[str, str]]:
    """(hostPath, mountPath) pairs, all read-only, that a training pod needs to run ``venv_python()``."""
    paths: list[str] = []
    for path in ("/usr", _base_prefix(), str(REPO_ROOT)):
        if not any(path == kept or path.startswith(kept.rstrip("/") + "/") for kept in paths):
            paths.append(path)
    return [(path, path) for path in paths]


def _ld_files() -> list[Path]:
    """The host's dynamic-linker configuration, which the training layer copies."""
    found = [Path("/etc/ld.so.cache"), Path("/etc/ld.so.conf")]
    conf_d = Path("/etc/ld.so.conf.d")
    found += sorted(conf_d.iterdir()) if conf_d.is_dir() else []
    return [path for path in found if path.is_file()]


def _entry(name: str, mode: int = 0o755, data: bytes | None = None, link: str | None = None) -> Entry:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uname, info.gname = mode, 0, "root", "root"
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif data is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = len(data)
    return info, data


def _tar(entries: Iterable[Entry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return buffer.getvalue()


def _training_layer() -> bytes:
    entries = [_entry(name, link=f"usr/{name}") for name in ("bin", "lib", "lib64", "sbin")]
    entries += [_entry(name) for name in ("usr", "proc", "sys", "dev", "etc", "run", "var")]
    # /root is 0755, not 0700: a non-root pod must reach the interpreter mounted under /root/.pyenv,
    # or the loader silently falls back to the host's /usr libpython and stdlib (a different Python).
    entries += [_entry("tmp", 0o1777), _entry("var/tmp", 0o1777), _entry("root")]
    entries += [_entry("etc/passwd", 0o644, _PASSWD), _entry("etc/group", 0o644, _GROUP)]
    entries += [_entry("etc/nsswitch.conf", 0o644, _NSSWITCH)]
    if Path("/etc/ld.so.conf.d").is_dir():
        entries.append(_entry("etc/ld.so.conf.d"))
    entries += [_entry(str(path).lstrip("/"), 0o644, path.read_bytes()) for path in _ld_files()]
    return _tar(sorted(entries, key=lambda entry: entry[0].name))


def _write_archive(target: Path, tag: str, layer: bytes, config: dict[str, Any]) -> None:
    """Write ``target`` as ``docker save`` would: manifest.json, <config digest>.json, <diff id>/layer.tar."""
    diff_id = hashlib.sha256(layer).hexdigest()
    image = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/testenv/images.py"}],
    }
    config_bytes = json.dumps(image, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]
    entries = [_entry(diff_id), _entry(f"{diff_id}/layer.tar", 0o644, layer), _entry(config_name, 0o644, config_bytes)]
    target.write_bytes(_tar([*entries, _entry("manifest.json", 0o644, json.dumps(manifest).encode())]))


def _content_hash() -> str:
    """Hash of every build input: this recipe, pause.c, the host's ld.so files and the venv's path."""
    digest = hashlib.sha256(venv_python().encode())
    for path in (Path(__file__).resolve(), PAUSE_SOURCE, *_ld_files()):
        digest.update(b"\0" + str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build_images() -> dict[str, Path]:
    """Build both image tarballs once (cached by content hash); return tag -> tarball."""
    target = cache_root() / f"images-{_content_hash()}"
    tarballs = {PAUSE_IMAGE: target / "pause.tar", TRAINING_IMAGE: target / "training.tar"}
    if all(path.is_file() for path in tarballs.values()):
        return tarballs
    if shutil.which("gcc") is None:
        raise RuntimeError("gcc is required to build the pause image: apt-get install gcc libc6-dev")
    started = time.monotonic()
    cache_root().mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="images-", dir=cache_root()))
    try:
        compile_pause = ["gcc", "-static", "-O2", "-o", str(partial / "pause"), str(PAUSE_SOURCE)]
        done = subprocess.run(compile_pause, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(compile_pause)} failed ({done.returncode}):\n{done.stderr}{done.stdout}")
        pause_layer = _tar([_entry("pause", 0o755, (partial / "pause").read_bytes())])
        _write_archive(partial / "pause.tar", PAUSE_IMAGE, pause_layer, {"Entrypoint": ["/pause"]})
        env = [
            f"PATH={Path(venv_python()).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONUNBUFFERED=1",
            "HOME=/root",
        ]
        config = {"Env": env, "Cmd": [venv_python()], "WorkingDir": "/root"}
        _write_archive(partial / "training.tar", TRAINING_IMAGE, _training_layer(), config)
        try:
            partial.rename(target)
        except OSError:  # another process finished the same build first: keep its copy
            if not all(path.is_file() for path in tarballs.values()):
                raise
            shutil.rmtree(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log_progress(f"built the pause and training images in {time.monotonic() - started:.1f} s into {target}")
    return tarballs


def import_images(address: Path, tarballs: Iterable[Path], *, snapshotter: str = "", timeout: float = 300) -> None:
    """Import each tarball into containerd's ``k8s.io`` namespace at ``address`` (a socket) and unpack it.

    ``snapshotter`` must be the one the CRI plugin uses when that is not containerd's default.
    """
    if shutil.which("ctr") is None:
        raise RuntimeError("ctr is required to import images: apt-get install containerd")
    for tarball in tarballs:
        command = ["ctr", "--address", str(address), "-n", "k8s.io", "images", "import", "--platform", "linux/amd64"]
        command += [f"--snapshotter={snapshotter}"] if snapshotter else []
        try:
            done = subprocess.run([*command, str(tarball)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{' '.join(command)} {tarball} timed out after {timeout} s: {exc.output!r}") from exc
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} {tarball} failed ({done.returncode}):\n{done.stderr}{done.stdout}")


if __name__ == "__main__":
    for tag, path in build_images().items():
        print(f"{tag}\t{path}\t{path.stat().st_size} bytes")
