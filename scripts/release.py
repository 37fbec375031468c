"""Build the release artifacts of one version into a folder (``dist/`` by default); run by scripts/release.sh.

One version, defined once: ``[project].version`` in pyproject.toml. The chart's ``version`` and ``appVersion``
must equal it (checked here, and by tests/test_release.py), and the chart's image tag defaults to its
``appVersion``, so the package, the chart and the image carry the same number.

What lands in the folder (anything there before is removed first):

- ``kube_rendezvous-<v>.tar.gz`` and ``kube_rendezvous-<v>-py3-none-any.whl``: the sdist, built from a fresh copy
  of the tracked files (never the working tree's ``build/`` or caches), and the wheel built from that sdist,
  as ``python -m build`` does. Both through setuptools' own PEP 517 backend in this interpreter: no isolated
  build environment, so nothing is downloaded (this venv's setuptools must satisfy ``[build-system]``).
- ``kube-rendezvous-<v>.tgz``: ``helm package`` of ``charts/kube-rendezvous`` (after ``helm lint``).
- ``kube-rendezvous-operator-<v>.tar``: the operator image from the ``Dockerfile``, a ``docker save`` archive
  tagged ``<image.repository>:<v>`` (the chart's default repository, or ``$IMAGE_REPOSITORY``). Built by
  tests/testenv/operator_image.py (buildah, no Docker engine, root; its local Debian base stands in for the
  official python image: see that module's "NOT guaranteed") and re-tagged here. ``docker load``,
  ``crane push``, ``skopeo copy docker-archive:`` and ``ctr images import`` read it.
- ``SHA256SUMS``.

Then it prints how to publish them. ``--no-image`` skips the image (no root, no buildah).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipapp
from pathlib import Path
from typing import IO

import yaml

from tests.testenv import ensure_binaries
from tests.testenv.operator_image import build_operator_image

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "kube-rendezvous"
#: Tracked paths the sdist (and so the wheel) is made of: the project metadata and the two package trees.
SDIST_PATHS = ("pyproject.toml", "README.md", "LICENSE", "backend", "operator")


def step(message: str) -> None:
    print(f"== {message}", flush=True)


def project_version() -> str:
    """The release's version: pyproject.toml's ``[project].version``, its one definition.

    Read as the file's one ``version = "..."`` line (``tomllib`` is Python 3.11+; the project supports 3.10).
    """
    found = re.findall(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    if len(found) != 1:
        raise SystemExit(f"pyproject.toml: expected one version line, found {found}")
    version: str = found[0]
    return version


def chart_metadata() -> dict[str, str]:
    chart: dict[str, str] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return chart


def default_image_repository() -> str:
    repository: str = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    return repository


def check_versions(version: str) -> None:
    """Fail unless the chart's version and appVersion are ``version`` and its image tag defaults to appVersion."""
    chart = chart_metadata()
    found = {"version": str(chart["version"]), "appVersion": str(chart["appVersion"])}
    wrong = {key: value for key, value in found.items() if value != version}
    if wrong:
        raise SystemExit(f"charts/kube-rendezvous/Chart.yaml {wrong} differs from pyproject.toml's version {version}")
    tag = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"]
    if tag:
        raise SystemExit(f"charts/kube-rendezvous/values.yaml image.tag is {tag!r}: leave it empty (appVersion)")


def tracked_files(paths: tuple[str, ...]) -> list[Path]:
    """Tracked files under ``paths`` as they are in the working tree (deleted ones left out)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=REPO, check=True, capture_output=True)
    names = sorted({name for name in listed.stdout.decode().split("\0") if name})
    return [Path(name) for name in names if (REPO / name).is_file()]


def build_python(dist: Path) -> list[Path]:
    """The sdist from a fresh copy of the tracked sources, then the wheel from the sdist; return both."""
    with tempfile.TemporaryDirectory(prefix="rdzv-release-") as scratch:
        source = Path(scratch) / "source"
        for name in tracked_files(SDIST_PATHS):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
        sdist = dist / _backend(source, "build_sdist", dist)
        with tarfile.open(sdist) as archive:
            archive.extractall(Path(scratch) / "unpacked", filter="data")
        (unpacked,) = (Path(scratch) / "unpacked").iterdir()
        wheel = dist / _backend(unpacked, "build_wheel", dist)
    return [sdist, wheel]


def _backend(source: Path, hook: str, dist: Path) -> str:
    """Call setuptools' PEP 517 ``hook`` in a child interpreter with ``source`` as its working directory."""
    code = f"import sys; from setuptools import build_meta; print(build_meta.{hook}(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(dist)], cwd=source, check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"setuptools {hook} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def package_chart(dist: Path, helm: str, version: str) -> Path:
    """``helm lint`` then ``helm package`` of the chart; return the .tgz."""
    for command in ([helm, "lint", str(CHART)], [helm, "package", str(CHART), "--destination", str(dist)]):
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return dist / f"{CHART.name}-{version}.tgz"


def retag_docker_archive(source: Path, target: Path, tag: str) -> None:
    """Copy the ``docker save`` archive ``source`` to ``target`` with ``tag`` as its only name (streamed)."""
    repository, _, version = tag.rpartition(":")
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(source) as old, tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as new:
        manifest = json.load(_member(old, "manifest.json"))
        (image,) = manifest
        image["RepoTags"] = [tag]
        layer_ids = json.load(_member(old, "repositories")) if "repositories" in old.getnames() else {}
        top = next((layer for names in layer_ids.values() for layer in names.values()), None)
        rewritten = {"manifest.json": json.dumps(manifest).encode()}
        if top is not None:
            rewritten["repositories"] = json.dumps({repository: {version: top}}).encode()
        for info in old:
            if info.name in rewritten:
                data = rewritten[info.name]
                info.size = len(data)
                new.addfile(info, io.BytesIO(data))
            else:
                new.addfile(info, old.extractfile(info) if info.isfile() else None)
    partial.rename(target)


def _member(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    stream = archive.extractfile(name)
    if stream is None:
        raise SystemExit(f"the image archive's {name} is not a file")
    return stream


def build_image(dist: Path, tag: str, version: str) -> Path:
    """The operator image from the Dockerfile (tests/testenv's buildah build, cached), tagged ``tag``."""
    built = build_operator_image()
    target = dist / f"kube-rendezvous-operator-{version}.tar"
    step(f"tagging the image {tag} ({built.stat().st_size >> 20} MiB)")
    retag_docker_archive(built, target, tag)
    return target


#: The krew manifest of ``kubectl rdzv``; the release writes a copy with the archive's sha256 into ``dist/``.
KREW_MANIFEST = REPO / "plugins" / "rdzv.yaml"


def build_plugin(dist: Path, version: str) -> tuple[Path, Path]:
    """``kubectl-rdzv-<version>.tar.gz`` (krew's archive: the ``kubectl-rdzv`` zipapp of the library, which needs
    python3 and the ``kubernetes`` client, and LICENSE) and ``rdzv.yaml``, the krew manifest with its sha256."""
    with tempfile.TemporaryDirectory() as scratch:
        staged = Path(scratch) / "app"
        for path in tracked_files(("backend/kube_rendezvous",)):
            target = staged / path.relative_to("backend")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, target)
        (staged / "__main__.py").write_text(
            "from kube_rendezvous._cli.kubectl_rdzv import main\n\nraise SystemExit(main())\n"
        )
        launcher = Path(scratch) / "kubectl-rdzv"
        zipapp.create_archive(staged, launcher, interpreter="/usr/bin/env python3")
        archive = dist / f"kubectl-rdzv-{version}.tar.gz"
        with tarfile.open(archive, "w:gz") as packed:
            packed.add(launcher, "kubectl-rdzv")
            packed.add(REPO / "LICENSE", "LICENSE")
    manifest = dist / KREW_MANIFEST.name
    text = KREW_MANIFEST.read_text()
    manifest.write_text(re.sub(r'sha256: "0+"', f'sha256: "{sha256(archive)}"', text))
    return archive, manifest


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def publishing(version: str, tag: str, chart: Path, python: list[Path], image: Path | None) -> str:
    """What to run to publish the artifacts, and to install them (printed at the end)."""
    repository = tag.rpartition(":")[0]
    wheel = next(path for path in python if path.suffix == ".whl")
    lines = ["", "Publish them:"]
    if image is not None:
        lines += [
            f"  docker load -i {image} && docker push {tag}",
            f"    (without Docker: crane push {image} {tag}",
            f"     or: skopeo copy docker-archive:{image} docker://{tag})",
        ]
    lines += [
        f"  helm push {chart} oci://<registry>/<path>    (then install from oci://<registry>/<path>/{CHART.name})",
        f"  twine upload {' '.join(map(str, python))}",
        "",
        "Install them (README, Install):",
        f"  helm install kube-rendezvous {chart} -n kube-rendezvous-system --create-namespace \\",
        f"    --set image.repository={repository} --set image.tag={version}",
        f"  pip install '{wheel}[torch]'    # in the training image; or [tensorplay]",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="output folder (emptied first)")
    parser.add_argument("--helm", default=os.environ.get("HELM") or shutil.which("helm"), help="the helm binary")
    parser.add_argument("--no-image", action="store_true", help="skip the operator image (needs root and buildah)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    version = project_version()
    check_versions(version)
    tag = f"{os.environ.get('IMAGE_REPOSITORY') or default_image_repository()}:{version}"
    dist: Path = args.dist.resolve()
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    step(f"kube-rendezvous {version}: the sdist and the wheel")
    python = build_python(dist)
    helm = args.helm
    if not helm:
        step("no helm on PATH or in $HELM: the test environment's (tests/testenv/binaries.py; cold: builds them all)")
        helm = str(ensure_binaries().helm)
    step(f"helm lint and helm package ({helm})")
    chart = package_chart(dist, helm, version)
    step("the kubectl-rdzv krew archive and manifest")
    plugin, manifest = build_plugin(dist, version)
    image = None
    if not args.no_image:
        step(f"the operator image {tag} from the Dockerfile (buildah; cold: a few minutes, with progress)")
        image = build_image(dist, tag, version)
    artifacts = [*python, chart, plugin, manifest, *([image] if image else [])]
    sums = "".join(f"{sha256(path)}  {path.name}\n" for path in artifacts)
    (dist / "SHA256SUMS").write_text(sums)
    step(f"kube-rendezvous {version} built in {time.monotonic() - started:.0f} s into {dist}:")
    print("\n".join(f"  {path.name}" for path in [*artifacts, dist / "SHA256SUMS"]))
    print(publishing(version, tag, chart, python, image))
    return 0


if __name__ == "__main__":
    sys.exit(main())
