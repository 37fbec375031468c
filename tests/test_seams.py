"""The seams between the library's modules, read from their source with ``ast`` (pure; nothing is imported).

(a) No module reads another module's underscore names: no ``x._name`` (``x`` not ``self``/``cls``) of a
    name that another module of the packages defines and this one does not, no ``from m import _name``
    of a package module ``m``, no ``m._name`` of an imported package module. Dunder names are public.
(b) No import cycle among the packages' modules; imports inside functions count as much as those at the
    top (a lazy import hides a cycle, it does not remove it).
(c) The layer rule: the pure modules (decisions on values: no request, no thread, no lock) import no I/O
    module: not ``kubernetes``, ``kopf``, ``urllib3``, ``socket``, ``threading``, ``subprocess``, and of the
    packages' own modules only other pure ones.

(a) is read from names, not types: ``x._name`` counts when ``_name`` is defined in another module of the
packages and not in this one (a name both define is not caught). The allow-lists below are empty: every
finding of issue #40 was fixed (``adder`` uses the store's public ``KeyObjects`` interface, ``nodes`` the
cache's ``apply_event``, the operator's shared memory is ``memory``, ``AddIndex`` left ``adder_rules`` for ``adder``).
An entry added there must say why it cannot be fixed. The layer rule has no allow-list at all: the store's key
watch lives in the store's layer (``_store.keywatch``), and importing the store loads no higher layer.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "kube_rendezvous": REPO / "backend" / "kube_rendezvous",
    "kube_rendezvous_operator": REPO / "operator" / "kube_rendezvous_operator",
}

#: The pure modules: values in, values out.
PURE = {
    "kube_rendezvous._rules.document",
    "kube_rendezvous._rules.folder_rules",
    "kube_rendezvous._rules.intents",
    "kube_rendezvous._rules.summary",
    "kube_rendezvous._rules.settings",
    "kube_rendezvous._rules.adder_rules",
    "kube_rendezvous._rules.statecheck",
    "kube_rendezvous._rules.leases_rules",
    "kube_rendezvous._rules.election_rules",
    "kube_rendezvous._rules.retries",
    "kube_rendezvous._rules.counters",
    "kube_rendezvous._rules.kubectl_rdzv_rules",
    "kube_rendezvous._rules.placement",
    "kube_rendezvous_operator.conditions_rules",
    "kube_rendezvous_operator.events_rules",
    "kube_rendezvous_operator.pods_rules",
    "kube_rendezvous_operator.gone_pods_rules",
    "kube_rendezvous_operator.restarts_rules",
    "kube_rendezvous_operator.resync_rules",
    "kube_rendezvous_operator.writer_rules",
    "kube_rendezvous_operator.ttl_rules",
    "kube_rendezvous_operator.not_ready_rules",
    "kube_rendezvous_operator.lost_nodes_rules",
}
#: Modules outside the packages that do I/O (or run threads): no pure module imports them.
IO_MODULES = {"kubernetes", "kopf", "urllib3", "socket", "threading", "subprocess", "requests", "http", "asyncio"}

#: Findings of (a) left in place, (module, name), each with a comment saying why. Keep it short.
PRIVATE_READS_ALLOWED: set[tuple[str, str]] = set()
#: Import edges of (b) left in place (importer, imported), each with its reason.
CYCLE_EDGES_ALLOWED: set[tuple[str, str]] = set()
#: Imports of (c) left in place (pure module, imported), each with its reason.
LAYER_ALLOWED: set[tuple[str, str]] = set()


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    #: Underscore names this module defines (functions, classes, attributes, assignments, parameters).
    defines: set[str] = field(default_factory=set)
    #: Package modules it imports, at the top or in a function: name -> line.
    imports: dict[str, int] = field(default_factory=dict)
    #: Every module it imports (outside the packages too), by its top-level name.
    top_levels: set[str] = field(default_factory=set)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def load_modules() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):  # the layers are folders: subpackages count
            parts = (package, *path.relative_to(folder).with_suffix("").parts)
            name = ".".join(parts[:-1] if path.stem == "__init__" else parts)
            modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    for module in modules.values():
        package = module.name if module.path.stem == "__init__" else module.name.rsplit(".", 1)[0]
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                module.defines.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                module.defines.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                module.defines.add(node.id)
            elif isinstance(node, ast.arg):
                module.defines.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                module.defines.add(node.arg)  # dataclass fields passed by name
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                module.defines.add(node.target.id)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    module.top_levels.add(alias.name.split(".")[0])
                    if alias.name in modules:
                        module.imports.setdefault(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                module.top_levels.add(source.split(".")[0])
                if source in modules:
                    module.imports.setdefault(source, node.lineno)
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:  # ``from . import handlers``
                        module.imports.setdefault(f"{source}.{alias.name}", node.lineno)
    return modules


MODULES = load_modules()


def private_reads(module: Module) -> Iterator[tuple[str, int, str]]:
    """(name read, line, how) for each read of another module's underscore name."""
    defined_elsewhere = set().union(*(other.defines for other in MODULES.values() if other is not module))
    module_aliases: dict[str, str] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                source = node.module or ""
                if is_private(alias.name) and (
                    any(source == name or name.endswith("." + source) for name in MODULES) or node.level
                ):
                    yield alias.name, node.lineno, f"from {'.' * node.level}{source} import {alias.name}"
                base = module.name.rsplit(".", node.level)[0] if node.level else ""
                target = f"{base}.{source}.{alias.name}".replace("..", ".") if node.level else f"{source}.{alias.name}"
                if target in MODULES:
                    module_aliases[alias.asname or alias.name] = target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    module_aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Name) and owner.id in module_aliases:
            yield node.attr, node.lineno, f"{owner.id}.{node.attr} of module {module_aliases[owner.id]}"
        elif node.attr in defined_elsewhere and node.attr not in module.defines:
            yield node.attr, node.lineno, f"{ast.unparse(owner)}.{node.attr}"


def test_no_module_reads_another_modules_underscore_names() -> None:
    found = sorted(
        f"{module.name}:{line}: {how}"
        for module in MODULES.values()
        for name, line, how in private_reads(module)
        if (module.name, name) not in PRIVATE_READS_ALLOWED
    )
    assert found == []


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), edges allowed left out."""
    graph = {
        name: sorted(target for target in module.imports if (name, target) not in CYCLE_EDGES_ALLOWED)
        for name, module in MODULES.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_there_is_no_import_cycle_among_the_modules() -> None:
    described = [
        " <-> ".join(component)
        + ": "
        + "; ".join(
            f"{name} imports {target} (line {MODULES[name].imports[target]})"
            for name in component
            for target in MODULES[name].imports
            if target in component and (name, target) not in CYCLE_EDGES_ALLOWED
        )
        for component in cycles()
    ]
    assert described == []


def test_the_pure_modules_import_no_io_module() -> None:
    assert PURE <= set(MODULES), PURE - set(MODULES)
    found = sorted(
        f"{name} imports {target}"
        for name in PURE
        for target in {*MODULES[name].imports, *(MODULES[name].top_levels & IO_MODULES)}
        if target not in PURE and target not in PACKAGES and (name, target) not in LAYER_ALLOWED
    )
    assert found == []


def test_the_checks_see_what_they_look_for() -> None:
    """The checks themselves: each finds its kind of finding in a made-up module."""
    source = "import threading\nfrom .store import _hidden\n\ndef f(store):\n    return store._KeyObject\n"
    made = Module("kube_rendezvous.made_up", PACKAGES["kube_rendezvous"] / "made_up.py", ast.parse(source))
    MODULES["kube_rendezvous.made_up"] = made
    MODULES["kube_rendezvous._store.store"].defines.add("_KeyObject")
    try:
        reads = {how for _, _, how in private_reads(made)}
        assert reads == {"from .store import _hidden", "store._KeyObject"}
    finally:
        del MODULES["kube_rendezvous.made_up"]


def imported_transitively(name: str) -> set[str]:
    """The package modules ``name`` imports, directly or through others (by ``ast``, as (b) reads them)."""
    seen: set[str] = set()
    pending = [name]
    while pending:
        for target in MODULES[pending.pop()].imports:
            if target not in seen:
                seen.add(target)
                pending.append(target)
    return seen


@pytest.mark.parametrize(
    "name",
    [
        "kube_rendezvous._engine.connection",
        "kube_rendezvous._engine.native",
        "kube_rendezvous._adapters.handler",
        "kube_rendezvous._adapters.tensorplay",
        "kube_rendezvous._adapters.torchrun",
    ],
)
def test_the_k8s_handler_never_reaches_the_compare_and_swap_backend(name: str) -> None:
    """``native`` and its adapters start from ``connection``; only ``backend`` (with its ``create_backend``,
    for the stock handler) builds the compare-and-swap backend, so none of them imports it."""
    assert "kube_rendezvous._engine.backend" not in imported_transitively(name)


def test_the_connection_module_imports_neither_creator() -> None:
    assert not {"kube_rendezvous._engine.native", "kube_rendezvous._engine.backend"} & imported_transitively(
        "kube_rendezvous._engine.connection"
    )
    assert (
        "kube_rendezvous._engine.connection" in MODULES["kube_rendezvous._engine.backend"].imports
    )  # create_backend's connect
    assert "kube_rendezvous._engine.connection" in MODULES["kube_rendezvous._engine.native"].imports


#: The library's layers, lowest first: a module imports its own layer's modules and lower ones only.
LAYER_ORDER = ("_rules", "_kube", "_store", "_engine", "_adapters", "_cli")


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    return LAYER_ORDER.index(parts[1]) if len(parts) > 2 and parts[1] in LAYER_ORDER else None


def test_the_package_tree_shows_the_layers() -> None:
    """Every library module but the package's ``__init__`` and the public launcher ``run`` sits in a layer folder."""
    outside = {name for name in MODULES if name.startswith("kube_rendezvous.") and layer_of(name) is None}
    assert outside - {f"kube_rendezvous.{layer}" for layer in LAYER_ORDER} == {"kube_rendezvous.run"}


def test_no_module_imports_from_a_higher_layer() -> None:
    found = sorted(
        (name, target)
        for name, module in MODULES.items()
        for target in module.imports
        if (mine := layer_of(name)) is not None and (theirs := layer_of(target)) is not None and theirs > mine
    )
    assert found == []  # no allow-list: the store's key watch lives in the store's layer (``_store.keywatch``)


@pytest.mark.parametrize("name", ["kube_rendezvous._store.store", "kube_rendezvous._store.prefixstore"])
def test_importing_the_store_loads_no_higher_layer(name: str) -> None:
    """At run time too: importing the store loads neither the engine (the folder, the election) nor an adapter.
    The package is imported afresh (its modules set aside and put back after), as a new process would."""
    kept = {key: module for key, module in sys.modules.items() if key.split(".")[0] == "kube_rendezvous"}
    for key in kept:
        del sys.modules[key]
    try:
        importlib.import_module(name)
        loaded = sorted(key for key in sys.modules if key.split(".")[0] == "kube_rendezvous")
    finally:
        for key in [key for key in sys.modules if key.split(".")[0] == "kube_rendezvous"]:
            del sys.modules[key]
        sys.modules.update(kept)
    higher = ("kube_rendezvous._engine", "kube_rendezvous._adapters", "kube_rendezvous._cli")
    assert name in loaded
    assert [key for key in loaded if key.startswith(higher)] == []


#: The elastic frameworks: each adapter owns what the library knows of its own; the engine speaks ``Framework``.
FRAMEWORKS = {"tensorplay", "torch"}


def test_only_the_adapters_import_a_framework() -> None:
    """No module outside ``_adapters/`` imports tensorplay or torch (an import inside a function counts), nor
    names one of their modules to ``importlib`` (a string that starts with ``tensorplay.`` or ``torch.``)."""
    adapters = LAYER_ORDER.index("_adapters")
    found = sorted(
        f"{name}: {framework}"
        for name, module in MODULES.items()
        if layer_of(name) != adapters
        for framework in module.top_levels & FRAMEWORKS
    )
    named = sorted(
        f"{name}:{node.lineno}: {ast.unparse(node)}"
        for name, module in MODULES.items()
        if layer_of(name) != adapters
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("import_module")
        and node.args
        and any(
            isinstance(part, ast.Constant) and str(part.value).startswith(("tensorplay", "torch"))
            for part in ast.walk(node.args[0])
        )
    )
    assert found == [] and named == []
    assert any(MODULES[name].top_levels & FRAMEWORKS for name in MODULES if layer_of(name) == adapters)


#: The module of the retry policies, the one retry loop and the named pauses.
RETRIES = "kube_rendezvous._rules.retries"
#: The calls that pause a thread or a task.
SLEEPS = {"time.sleep", "asyncio.sleep", "sleep"}


def own_nodes(nodes: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of ``nodes``, not entering a function, lambda or class defined among them (run another time)."""
    pending: list[ast.AST] = list(nodes)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))


def is_sleep(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) in SLEEPS


def paused_seconds(node: ast.AST) -> list[ast.expr]:
    """The seconds of the pause ``node`` makes, if it is one: a sleep's; the timeout of a wait for a flag or a
    change (``stopped.wait(s)``, ``cache.wait_for(changed, s)``, ``asyncio.wait_for(task, s)``, ``timeout=s``);
    a retry delay handed to a framework (``kopf.TemporaryError(..., delay=s)``)."""
    if not isinstance(node, ast.Call):
        return []
    if is_sleep(node):
        return node.args[:1]
    keywords = [keyword.value for keyword in node.keywords if keyword.arg == "delay"]
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("wait", "wait_for"):
        position = 0 if node.func.attr == "wait" else 1
        keywords += [keyword.value for keyword in node.keywords if keyword.arg == "timeout"]
        return node.args[position : position + 1] + keywords
    return keywords


def seconds_written_in_place(expr: ast.AST) -> bool:
    """Whether ``expr``, a pause's seconds, holds a number other than 0 written in place: in it, or in a ``min`` or
    ``max`` of it (a call's other arguments, such as a policy's attempt number in ``delay(1)``, are not seconds, nor
    is a factor: ``interval / 4`` is a fraction of named seconds)."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool) and expr.value != 0
    if isinstance(expr, ast.Call):
        return ast.unparse(expr.func) in ("min", "max") and any(seconds_written_in_place(arg) for arg in expr.args)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div)):
        return any(
            seconds_written_in_place(side) for side in (expr.left, expr.right) if not isinstance(side, ast.Constant)
        )
    return any(seconds_written_in_place(child) for child in ast.iter_child_nodes(expr))


def hand_written_retries(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) for each pause by a number written in place (``time.sleep(0.5)``, ``stopped.wait(0.5)``; 0 and
    named constants are fine), each loop that sleeps in an ``except`` clause and goes round again (a retry loop of
    its own), and each ``for ... in range(...)`` around a ``try`` (attempts counted by hand)."""
    for node in ast.walk(tree):
        if any(seconds_written_in_place(seconds) for seconds in paused_seconds(node)):
            assert isinstance(node, ast.Call)
            yield node.lineno, f"{ast.unparse(node)}: a pause by a number written in place"
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            tries = [inner for inner in own_nodes(node.body) if isinstance(inner, ast.Try)]
            for attempt in tries:
                for handler in attempt.handlers:
                    if any(is_sleep(inner) for inner in own_nodes(handler.body)):
                        yield handler.lineno, "a loop that sleeps after a failure and tries again"
            if isinstance(node, ast.For) and ast.unparse(node.iter).startswith("range(") and tries:
                yield node.lineno, f"for ... in {ast.unparse(node.iter)} around a try: attempts counted by hand"


def test_every_retry_goes_through_the_named_policies() -> None:
    """Outside ``_rules/retries.py`` the library and the operator retry through the library's ``retry`` and policies
    (or Kopf's), and pause by named constants, each with its reason (``*_PAUSE``, ``*_SECONDS``, the policies'
    delays), never by a number written in place."""
    found = sorted(
        f"{name}:{line}: {what}"
        for name, module in MODULES.items()
        if name.startswith(("kube_rendezvous.", "kube_rendezvous_operator.")) and name != RETRIES
        for line, what in hand_written_retries(module.tree)
    )
    assert found == []


def test_the_retry_check_sees_what_it_looks_for() -> None:
    source = (
        "import time\n"
        "def f(call):\n"
        "    time.sleep(0.5)\n"
        "    time.sleep(PAUSE)\n"
        "    time.sleep(min(POLICY.delay(1), max(0.0, LEFT)))\n"
        "    stopped.wait(0.5)\n"
        "    stopped.wait(min(PAUSE, interval / 4) + 0.5 * LEFT)\n"
        "    stopped.wait(min(PAUSE, interval / 4) + 0.1)\n"
        "    cache.wait_for(changed, wait if wait > 0 else 0.5)\n"
        "    asyncio.wait(tasks, timeout=LEFT)\n"
        "    raise kopf.TemporaryError('later', delay=2)\n"
        "    while True:\n"
        "        try:\n"
        "            return call()\n"
        "        except OSError:\n"
        "            time.sleep(DELAY)\n"
        "    for attempt in range(3):\n"
        "        try:\n"
        "            return call()\n"
        "        except OSError:\n"
        "            pass\n"
    )
    assert sorted(line for line, _ in hand_written_retries(ast.parse(source))) == [3, 6, 8, 9, 11, 15, 17]


def test_the_pure_modules_are_the_rules_layer() -> None:
    """The pure layer holds the pure modules, and a pure twin is named for its I/O twin: ``<twin>_rules``."""
    library_pure = {name for name in PURE if name.startswith("kube_rendezvous.")}
    assert library_pure == {name for name in MODULES if layer_of(name) == 0}
    for name in PURE:
        stem = name.rsplit(".", 1)[1]
        if stem.endswith("_rules"):
            twin = stem.removesuffix("_rules")
            assert any(other.split(".")[-1] == twin for other in MODULES), f"{name} has no I/O twin {twin}"


def test_the_operator_imports_the_librarys_public_names_only() -> None:
    """``from kube_rendezvous import X``, never a layer's module: the layers may move, the public names stay."""
    found = sorted(
        f"{name}: {target}"
        for name, module in MODULES.items()
        if name.startswith("kube_rendezvous_operator")
        for target in module.imports
        if target.startswith("kube_rendezvous.")
    )
    assert found == []


#: The generic elector and its pure twin: client-go's ``leaderelection`` and ``resourcelock``, nothing of a rendezvous.
ELECTOR = ("kube_rendezvous._kube.election", "kube_rendezvous._rules.election_rules")
#: What the elector may import of the packages (issue #50): the API client (its requests and errors), its pure twin,
#: and the retry policies (which the client itself uses). No other ``_rules`` module (the rendezvous' Lease formats
#: are in ``leases_rules``), no ``leases``, no ``writer_lease``: the rendezvous' writer rules use the elector, above it.
ELECTOR_IMPORTS = {
    "kube_rendezvous._kube.kubeapi",
    "kube_rendezvous._rules.election_rules",
    "kube_rendezvous._rules.retries",
    "kube_rendezvous._rules.counters",  # the client's request counters: generic, nothing of the rendezvous
}
#: The names the elector may take from ``kubeapi``: the client, its errors and ``resource_path``, not its constants
#: (the Rendezvous' group, plural and labels).
ELECTOR_KUBEAPI_NAMES = {"KubernetesApi", "KubernetesApiError", "ConflictError", "NotFoundError", "resource_path"}


def test_the_elector_imports_nothing_of_the_rendezvous() -> None:
    """The generic elector (``election``, ``election_rules``): its imports, direct and through the modules it imports,
    are ``ELECTOR_IMPORTS`` and the standard library; of ``kubeapi`` only the client, its errors and
    ``resource_path``; and no string of ours (``kube-rendezvous``: a label, an annotation) appears in its source."""
    import sys

    for name in ELECTOR:
        module = MODULES[name]
        assert set(module.imports) <= ELECTOR_IMPORTS, f"{name} imports {set(module.imports) - ELECTOR_IMPORTS}"
        assert imported_transitively(name) <= ELECTOR_IMPORTS, f"{name} reaches {imported_transitively(name)}"
        outside = module.top_levels - set(PACKAGES) - set(sys.stdlib_module_names)
        assert outside == set(), f"{name} imports {outside}, not of the standard library"
        taken = {
            alias.name
            for node in ast.walk(module.tree)
            if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.endswith("kubeapi")
            for alias in node.names
        }
        assert taken <= ELECTOR_KUBEAPI_NAMES, f"{name} takes {taken - ELECTOR_KUBEAPI_NAMES} from kubeapi"
        ours = [
            (node.lineno, node.value)
            for node in ast.walk(module.tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "kube-rendezvous" in node.value
        ]
        assert ours == [], f"{name} writes our formats: {ours}"
    # The rendezvous' writer rules sit above it and use it, not the other way round.
    assert "kube_rendezvous._kube.election" in MODULES["kube_rendezvous._kube.writer_lease"].imports


def test_every_pure_twin_of_the_operator_is_checked_as_pure() -> None:
    """A new rule's ``<name>_rules`` module is pure as the others are: listed in ``PURE``, so the checks above hold."""
    operator_rules = {
        name for name in MODULES if name.startswith("kube_rendezvous_operator.") and name.endswith("_rules")
    }
    assert operator_rules <= PURE, sorted(operator_rules - PURE)
