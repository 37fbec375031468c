"""Every public path resolves: the package's lazy names, the entry points and the console scripts.

The modules behind them are internal and may move (``factory`` became ``connection``, and ``create_backend``
moved to the adapters, which know tensorplay's classes); these names may not. tensorplay and torch cannot share
a process (each registers the same C++ types), and the pure suite loads tensorplay, so the torch entry point is
checked here by reading its module, and loaded for real in a process of its own.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from importlib.metadata import EntryPoint, distribution
from pathlib import Path

import kube_rendezvous
import pytest

from tests.helpers import REPO

DISTRIBUTION = "kube-rendezvous"
#: Entry point groups whose targets need torch (never imported next to tensorplay).
TORCH_GROUPS = {"torchrun.handlers"}
PUBLIC_NAMES = [
    "create_backend",
    "register",
    "KubernetesStore",
    "KubernetesRendezvousBackend",
    "KubernetesRendezvousHandler",
    "create_k8s_handler",
]


#: The entry points and console scripts pyproject.toml declares: (group, name, value).
DECLARED = {
    ("tp.elastic.handlers", "k8s", "kube_rendezvous._adapters.handler:create_k8s_handler"),
    ("torchrun.handlers", "k8s", "kube_rendezvous._adapters.torchrun:handler_creator"),
    ("console_scripts", "kube-rendezvous-run", "kube_rendezvous.run:main"),
    ("console_scripts", "kubectl-rdzv", "kube_rendezvous._cli.kubectl_rdzv:main"),
}


def declared_entry_points() -> list[EntryPoint]:
    return [EntryPoint(name, value, group) for group, name, value in sorted(DECLARED)]


def installed_entry_points() -> list[EntryPoint]:
    """The entry points the installed distribution registers (what torchrun and tensorplay find)."""
    return list(distribution(DISTRIBUTION).entry_points)


def defined_at_top(module: str, name: str) -> bool:
    """Whether ``module``'s source defines ``name`` at its top level (read, not imported)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text(), spec.origin)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def key(point: EntryPoint) -> tuple[str, str, str]:
    return point.group, point.name, point.value


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_each_public_name_resolves(name: str) -> None:
    assert name in kube_rendezvous.__all__
    assert callable(getattr(kube_rendezvous, name))


def test_create_backend_is_the_adapters() -> None:
    """The engine's ``create_backend`` takes a ``Framework``; the public one defaults to tensorplay's."""
    from kube_rendezvous._adapters import backend

    assert kube_rendezvous.create_backend is backend.create_backend


def test_the_internal_factory_module_is_gone() -> None:
    """Read from the tree: an editable install of another checkout may still map the old name."""
    assert not list((REPO / "backend" / "kube_rendezvous").rglob("factory.py"))
    assert (REPO / "backend" / "kube_rendezvous" / "_engine" / "connection.py").exists()


def test_pyproject_declares_them() -> None:
    """This tree's pyproject.toml (read as text: tomllib is 3.11+), one ``name = "value"`` line each."""
    lines = {line.strip() for line in (REPO / "pyproject.toml").read_text().splitlines()}
    groups = {'[project.entry-points."tp.elastic.handlers"]', '[project.entry-points."torchrun.handlers"]'}
    assert groups | {"[project.scripts]"} <= lines
    assert {f'{name} = "{value}"' for _, name, value in DECLARED} <= lines


def test_the_installed_entry_points_are_the_declared_ones() -> None:
    assert {key(point) for point in installed_entry_points()} == DECLARED


@pytest.mark.parametrize(
    "point", [point for point in declared_entry_points() if point.group not in TORCH_GROUPS], ids=key
)
def test_each_entry_point_loads(point: EntryPoint) -> None:
    assert callable(point.load())


@pytest.mark.parametrize("point", [point for point in declared_entry_points() if point.group in TORCH_GROUPS], ids=key)
def test_each_torch_entry_point_names_a_top_level_callable(point: EntryPoint) -> None:
    assert importlib.util.find_spec(point.module) is not None
    assert defined_at_top(point.module, point.attr)


def test_the_torch_entry_points_load_in_a_process_of_their_own() -> None:
    """What torch's registry does: load each ``torchrun.handlers`` entry point (torch imported, tensorplay not)."""
    script = (
        "from importlib.metadata import distribution\n"
        f"points = [p for p in distribution({DISTRIBUTION!r}).entry_points if p.group in {sorted(TORCH_GROUPS)!r}]\n"
        "assert points, 'no torch entry point installed'\n"
        "for point in points:\n"
        "    assert callable(point.load()), point\n"
        "print(len(points))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) >= 1
