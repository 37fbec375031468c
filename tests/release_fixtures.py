"""The release artifacts as a user gets them, for the tests that install them: ``built`` (``bash scripts/release.sh``
once per session, into a temporary folder) and ``fresh_venv`` (a new venv holding the built wheel). Registered
for every module by tests/conftest.py; tests/test_release.py says why the fresh venv borrows this venv's
site-packages for the wheel's dependencies.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_chart import Helm
from tests.testenv import ensure_binaries
from tests.testenv.commands import run_command


@dataclass(frozen=True)
class Built:
    dist: Path
    helm: Helm

    def one(self, pattern: str) -> Path:
        (found,) = self.dist.glob(pattern)
        return found


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``bash scripts/release.sh --dist <tmp>`` once: every artifact of this version (image from the build cache)."""
    dist = tmp_path_factory.mktemp("dist")
    helm = Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))
    env = {**os.environ, "PYTHON": sys.executable, "HELM": str(helm.binary)}
    env.pop("IMAGE_REPOSITORY", None)
    run_command(["bash", REPO / "scripts" / "release.sh", "--dist", dist], env=env, timeout=1500, cwd=REPO)
    return Built(dist, helm)


@pytest.fixture
def fresh_venv(tmp_path: Path, built: Built) -> Path:
    """A new venv with the built wheel (no deps) and this venv's site-packages after its own (why:
    tests/test_release.py)."""
    venv = tmp_path / "venv"
    run_command([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    wheel = built.one("kube_rendezvous-*.whl")
    run_command([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel])
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "zz-dev-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv
