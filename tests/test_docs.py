"""The README and docs/ hold together: the README stays a landing page, docs/README.md indexes every page, relative
links lead somewhere, bash blocks hold no Kubernetes ``$(VAR)`` references (a shell would run them), and every test
that docs/claims.md cites exists (read from the test modules with ``ast``; nothing is imported or collected).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO

DOCS = REPO / "docs"
TESTS = REPO / "tests"
#: The pages whose links and code blocks are checked: the README and every Markdown page of docs/.
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def test_the_readme_is_a_landing_page_under_200_lines() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 200
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:3] == ["## What it is, and why", "## Quickstart: stock torchrun on your cluster", "## Install"]
    # The two commands that set everything up on a fresh machine come first, exactly as they were.
    first = lines.index("```bash")
    assert first < 10
    assert lines[first : first + 4] == [
        "```bash",
        "bash scripts/demo.sh   # local control plane + 3 real nodes + operator; the example 3-pod Job loses a pod "
        "(kubectl delete pod) and recovers",
        "bash scripts/test.sh   # every test, against a real kube-apiserver + etcd with RBAC on (what CI runs)",
        "```",
    ]


def test_the_docs_index_lists_every_page_once() -> None:
    index = (DOCS / "README.md").read_text()
    listed = re.findall(r"^- \[[^\]]+\]\(([^)#]+)\)", index, re.MULTILINE)
    pages = sorted(path.name for path in DOCS.iterdir() if path.suffix in (".md", ".yaml") and path.name != "README.md")
    assert sorted(listed) == pages


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    targets = {target for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target}
    missing = sorted(t for t in targets if not t.startswith("#") and not (page.parent / t.split("#")[0]).exists())
    assert not missing


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_no_bash_block_holds_a_kubernetes_variable_reference(page: Path) -> None:
    blocks = re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(), flags=re.DOTALL)
    assert not [ref for block in blocks for ref in re.findall(r"\$\([A-Z_][A-Z0-9_]*\)", block)]


@dataclass
class ModuleNames:
    """The names a test module defines: top-level test functions, and each class's test methods and bases."""

    functions: set[str] = field(default_factory=set)
    classes: dict[str, tuple[set[str], list[str]]] = field(default_factory=dict)


@cache
def modules_of_tests() -> dict[str, ModuleNames]:
    modules = {}
    for path in sorted(TESTS.glob("test_*.py")):
        module = ModuleNames()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                module.functions.add(node.name)
            elif isinstance(node, ast.ClassDef):
                methods = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
                bases = [base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases]
                module.classes[node.name] = (methods, bases)
        modules[path.name] = module
    return modules


def class_methods(name: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
    """The methods of test class ``name``, its bases' (any test module's) included; None if no module defines it."""
    found = [module.classes[name] for module in modules_of_tests().values() if name in module.classes]
    if not found or name in seen:
        return None if not found else set()
    methods, bases = found[0]
    inherited = (class_methods(base, seen | {name}) or set() for base in bases)
    return methods.union(*inherited)


def defines(module: ModuleNames, cls: str | None, name: str) -> bool:
    """Whether ``module`` defines test ``name`` (a prefix when it ends with ``...``) in class ``cls``, or anywhere."""
    names = (
        (class_methods(cls) or set())
        if cls
        else module.functions.union(*(class_methods(c) or set() for c in module.classes))
    )
    prefix = name.removesuffix("...")
    return name in names or (prefix != name and any(known.startswith(prefix) for known in names))


def unknown_citations(text: str) -> list[str]:
    """Each citation of ``text`` (``file.py::Class::test[id]``, ``::test``, ``Class::test``, a bare ``test_x``) that
    names no test. A relative one resolves against the file and class cited before it in the same paragraph or table;
    a bare ``test_x`` may be in any test module."""
    modules, unknown = modules_of_tests(), []
    file: str | None = None
    cls: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            file = cls = None
        for span in re.findall(r"`([^`]+)`", line):
            if re.fullmatch(r"test_\w+(\.\.\.)?", span):  # a bare name: mentioned, may be anywhere
                if not any(defines(module, None, span) for module in modules.values()):
                    unknown.append(f"line {number}: {span} (in no test module)")
                continue
            parts = [re.sub(r"\[.*\]$", "", part) for part in span.removeprefix("tests/").split("::")]
            if re.fullmatch(r"test_\w+\.py", parts[0]):
                file, cls, parts = parts[0], None, parts[1:]
            elif parts[0] == "" and len(parts) > 1:
                parts = parts[1:]
            elif not re.fullmatch(r"(Test\w+|test_\w+)", parts[0]) or not all(
                re.fullmatch(r"\w+(\.\.\.)?|\.\.\.", part) for part in parts
            ):
                continue  # not a citation (a fixture of conftest.py, a command, a metric)
            if file is None or file not in modules:
                unknown.append(f"line {number}: {span} (no test module {file})")
                continue
            module = modules[file]
            if parts and parts[0].startswith("Test"):
                cls, parts = parts[0], parts[1:]
                if cls not in module.classes:
                    unknown.append(f"line {number}: {span} (no class {cls} in {file})")
                    continue
            for name in parts:
                if name != "..." and not defines(module, cls, name) and not defines(module, None, name):
                    unknown.append(f"line {number}: {span} (no {name} in {file}{'::' + cls if cls else ''})")
    return unknown


def test_every_test_that_the_claims_page_cites_exists() -> None:
    assert not unknown_citations((DOCS / "claims.md").read_text())


def test_the_citation_check_finds_a_test_that_is_gone() -> None:
    assert unknown_citations("| `test_demo.py::test_no_such_test` | `::test_neither` |") == [
        "line 1: test_demo.py::test_no_such_test (no test_no_such_test in test_demo.py)",
        "line 1: ::test_neither (no test_neither in test_demo.py)",
    ]
    assert unknown_citations("`test_claims.py::TestGone::test_x`, `test_claims.py::TestLayering::test_gone`") == [
        "line 1: test_claims.py::TestGone::test_x (no class TestGone in test_claims.py)",
        "line 1: test_claims.py::TestLayering::test_gone (no test_gone in test_claims.py::TestLayering)",
    ]
    assert not unknown_citations("`test_claims.py::TestLayering::test_the_in_pod_library_never_loads_kopf[x]`")
