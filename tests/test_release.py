"""The release artifacts (scripts/release.sh, README "Install", CHANGELOG.md): one version everywhere, and what
a user outside this repository installs works.

Pure: pyproject.toml's version is the chart's ``version`` and ``appVersion``, the image tag defaults to the
appVersion, the CHANGELOG's newest entry, LICENSE and the README's install name it; the image re-tag is checked
on a small archive.

Cluster (``bash scripts/release.sh`` once per session, into a temporary folder):

- The wheel goes into a fresh venv (``python -m venv --without-pip``, then this interpreter's pip with
  ``--python``, ``--no-deps --no-index``) and ``kubectl-rdzv --help`` and ``import kube_rendezvous`` run from it.
  Its dependencies are NOT installed from PyPI: that took 23-26 s here even with a warm pip cache (resolution
  against the index), a third of this module's budget. Instead a ``.pth`` file appends this venv's
  site-packages after the fresh venv's own, so ``kubernetes`` imports while every ``kube_rendezvous`` module
  comes from the wheel (checked: its ``__file__``, its metadata's version, its entry points). Not proven
  here: that pip resolves the declared dependencies on a machine without them.
- The chart ``.tgz`` is installed with ``helm install`` into the suite's control plane with its defaults, and
  the operator Deployment's image is exactly the tag of the built image archive. That control plane has no
  kubelet, so the image is not run here; tests/test_real_node.py runs the same Dockerfile build from the chart.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tarfile
import uuid
from pathlib import Path

import yaml

from scripts.release import check_versions, project_version, retag_docker_archive
from tests.helpers import REPO
from tests.release_fixtures import Built
from tests.test_chart import CHART, INSTANCE, install, kubectl_json, uninstall
from tests.testenv import ControlPlane
from tests.testenv.commands import run_command

VERSION = project_version()


def chart_yaml() -> dict[str, object]:
    chart: dict[str, object] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return chart


# -- one version ------------------------------------------------------------------------------


class TestOneVersion:
    def test_the_chart_version_and_app_version_are_the_package_version(self) -> None:
        chart = chart_yaml()
        assert (str(chart["version"]), str(chart["appVersion"])) == (VERSION, VERSION)
        check_versions(VERSION)  # what release.sh refuses to build without

    def test_the_image_tag_defaults_to_the_app_version(self) -> None:
        assert yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"] == ""
        assert "(.Values.image.tag | default .Chart.AppVersion)" in (CHART / "templates" / "_helpers.tpl").read_text()

    def test_the_changelog_opens_with_this_version(self) -> None:
        releases = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
        if releases[0] == "Unreleased":  # what main has after the last release (Keep a Changelog's convention)
            releases = releases[1:]
        assert "Unreleased" not in releases
        assert releases[0] == VERSION
        assert releases == sorted(set(releases), key=lambda v: tuple(map(int, v.split("."))), reverse=True)

    def test_the_license_is_apache_2_as_pyproject_declares_and_ships_in_the_package(self) -> None:
        lines = (REPO / "pyproject.toml").read_text().splitlines()
        assert 'license = "Apache-2.0"' in lines
        assert 'license-files = ["LICENSE"]' in lines
        text = (REPO / "LICENSE").read_text()
        assert "Apache License" in text and "Version 2.0, January 2004" in text

    def test_the_readme_installs_this_version_s_artifacts(self) -> None:
        readme = (REPO / "README.md").read_text()
        install_section = readme.split("\n## Install", 1)[1].split("\n## ", 1)[0]
        for artifact in (
            f"kube-rendezvous-{VERSION}.tgz",
            f"kube_rendezvous-{VERSION}-py3-none-any.whl",
            f"kube-rendezvous-operator-{VERSION}.tar",
            f"image.tag={VERSION}",
        ):
            assert artifact in install_section, artifact


def docker_archive(path: Path, tag: str) -> None:
    """A minimal ``docker save`` archive: a config, one layer (and a symlink to it), manifest.json, repositories."""
    repository, _, version = tag.rpartition(":")
    members = {
        "config.json": b"{}",
        "abc.tar": b"layer bytes",
        "manifest.json": json.dumps([{"Config": "config.json", "RepoTags": [tag], "Layers": ["abc.tar"]}]).encode(),
        "repositories": json.dumps({repository: {version: "abc"}}).encode(),
    }
    with tarfile.open(path, "w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("abc/layer.tar")
        link.type, link.linkname = tarfile.SYMTYPE, "../abc.tar"
        archive.addfile(link)


def test_the_image_archive_is_retagged_with_its_layers_untouched(tmp_path: Path) -> None:
    docker_archive(tmp_path / "dev.tar", "localhost/kube-rendezvous/operator:dev")
    retag_docker_archive(tmp_path / "dev.tar", tmp_path / "release.tar", f"registry.example/rdzv/operator:{VERSION}")
    with tarfile.open(tmp_path / "release.tar") as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == [f"registry.example/rdzv/operator:{VERSION}"]
        assert json.load(archive.extractfile("repositories")) == {  # type: ignore[arg-type]
            "registry.example/rdzv/operator": {VERSION: "abc"}
        }
        assert archive.extractfile("abc.tar").read() == b"layer bytes"  # type: ignore[union-attr]
        assert archive.getmember("abc/layer.tar").linkname == "../abc.tar"
    assert not list(tmp_path.glob("*.partial"))


# -- the built artifacts ------------------------------------------------------------------------


def test_release_builds_every_artifact_of_one_version_with_their_checksums(built: Built) -> None:
    names = sorted(path.name for path in built.dist.iterdir())
    assert names == sorted(
        [
            f"kube_rendezvous-{VERSION}.tar.gz",
            f"kube_rendezvous-{VERSION}-py3-none-any.whl",
            f"kube-rendezvous-{VERSION}.tgz",
            f"kube-rendezvous-operator-{VERSION}.tar",
            f"kubectl-rdzv-{VERSION}.tar.gz",
            "rdzv.yaml",
            "SHA256SUMS",
        ]
    )
    sums = (built.dist / "SHA256SUMS").read_text().splitlines()
    assert sorted(line.split("  ")[1] for line in sums) == sorted(set(names) - {"SHA256SUMS"})


def test_the_krew_archive_runs_the_plugin_and_its_manifest_names_its_checksum(built: Built, tmp_path: Path) -> None:
    """plugins/rdzv.yaml's archive: ``kubectl-rdzv`` (a zipapp of the library) and LICENSE at its root; the manifest
    in dist/ carries the archive's sha256, which krew checks."""
    archive = built.one(f"kubectl-rdzv-{VERSION}.tar.gz")
    with tarfile.open(archive) as packed:
        assert sorted(packed.getnames()) == ["LICENSE", "kubectl-rdzv"]
        packed.extractall(tmp_path, filter="data")
    shown = run_command([sys.executable, tmp_path / "kubectl-rdzv", "--version"], env=clean_env(), cwd=tmp_path)
    assert shown.stdout.strip() == f"kubectl-rdzv {VERSION}"
    manifest = yaml.safe_load(built.one("rdzv.yaml").read_text())
    (platform,) = manifest["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert platform["uri"].endswith(f"/v{VERSION}/kubectl-rdzv-{VERSION}.tar.gz")


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH and the like, so nothing of the working tree leaks into the venv."""
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}


def test_the_wheel_installs_into_a_fresh_venv_and_its_commands_run(fresh_venv: Path, tmp_path: Path) -> None:
    help_text = run_command([fresh_venv / "bin" / "kubectl-rdzv", "--help"], env=clean_env(), cwd=tmp_path).stdout
    assert help_text.startswith("usage: kubectl rdzv")
    probe = (
        "import json, importlib.metadata as m, importlib.util as u, kube_rendezvous;"
        "print(json.dumps({'file': kube_rendezvous.__file__, 'version': m.version('kube-rendezvous'),"
        "'operator': u.find_spec('kube_rendezvous_operator').origin,"
        "'license': [str(f) for f in m.files('kube-rendezvous') if f.name == 'LICENSE'],"
        "'handlers': sorted(f'{e.group}:{e.name}' for g in ('torchrun.handlers', 'tp.elastic.handlers')"
        " for e in m.entry_points(group=g))}))"
    )
    found = json.loads(run_command([fresh_venv / "bin" / "python", "-c", probe], env=clean_env(), cwd=tmp_path).stdout)
    assert found["file"].startswith(str(fresh_venv)), found
    assert found["operator"].startswith(str(fresh_venv)), found
    assert found["version"] == VERSION
    assert found["license"], "LICENSE is not in the wheel"
    assert found["handlers"] == ["torchrun.handlers:k8s", "tp.elastic.handlers:k8s"]


def test_the_packaged_chart_installs_the_operator_with_the_built_image_tag(
    built: Built, control_plane: ControlPlane, namespace: str, crds: None
) -> None:
    chart = built.one(f"kube-rendezvous-{VERSION}.tgz")
    shown = yaml.safe_load(built.helm.run("show", "chart", chart).stdout)
    assert (shown["version"], shown["appVersion"]) == (VERSION, VERSION)
    with tarfile.open(built.one("kube-rendezvous-operator-*.tar")) as archive:
        (image,) = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
    (tag,) = image["RepoTags"]
    release = install(built.helm, control_plane, f"rdzv-{uuid.uuid4().hex[:8]}", namespace)
    try:
        selector = f"{INSTANCE}={release.name}"
        (deployment,) = kubectl_json(control_plane, "get", "deployments", "-n", namespace, "-l", selector)["items"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == tag == f"ghcr.io/kube-rendezvous/operator:{VERSION}"
    finally:
        uninstall(built.helm, control_plane, release)
