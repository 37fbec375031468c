"""Session-scoped real control plane, a namespace per test, server logs shown on failure; the markers."""

from __future__ import annotations

import inspect
import re
import types
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_rendezvous._engine.shared import release
from kubernetes import client, config

from tests.e2e.harness import ElasticJob
from tests.helpers import create_rendezvous
from tests.release_fixtures import built, fresh_venv  # noqa: F401 - fixtures for every module
from tests.testenv import ControlPlane, free_port, wait_until
from tests.testenv.cluster import Cluster
from tests.testenv.node import Node

_CONTROL_PLANE: ControlPlane | None = None
#: Log files of the servers that run now besides the control plane's (the real node's), shown on failure.
_MORE_LOGS: dict[str, Path] = {}

#: Names whose use in code means it starts another process (a Python one, or an external binary).
PROCESS_NAMES = frozenset({"subprocess", "multiprocessing"})


def _in_tests_package(obj: object) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "tests" or module.startswith("tests.")


def _functions(obj: object) -> list[types.FunctionType]:
    """The functions whose code ``obj`` runs: itself, or a class's methods (properties included)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return [function for part in (obj.fget, obj.fset, obj.fdel) for function in _functions(part)]
    if isinstance(obj, type):
        return [function for value in vars(obj).values() for function in _functions(value)]
    if callable(obj):
        obj = inspect.unwrap(obj)
    return [obj] if isinstance(obj, types.FunctionType) else []


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)  # nested functions, lambdas, comprehensions


def _starts_processes(roots: Iterable[object]) -> bool:
    """Whether the code of ``roots``, or of a function or class of the tests package it names
    (followed transitively through each function's globals), names ``PROCESS_NAMES``."""
    pending = [function for root in roots for function in _functions(root)]
    seen: set[types.FunctionType] = set()
    while pending:
        function = pending.pop()
        if function in seen:
            continue
        seen.add(function)
        for code in _code_objects(function.__code__):
            if PROCESS_NAMES & set(code.co_names):
                return True
            for name in code.co_names:
                target = function.__globals__.get(name)
                if target is not None and _in_tests_package(target):
                    pending.extend(_functions(target))
    return False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test ``cluster`` or ``pure`` (registered in pyproject.toml), so ``-m pure`` misses none.

    The rule, in order:

    1. An explicit ``cluster`` or ``pure`` mark (on the test, its class, module or parameter) is
       kept: a fixture may ask for the control plane at run time (``request.getfixturevalue``),
       which no rule can see, so such a parameter says ``cluster`` itself. An explicit ``pure``
       that rules 2-3 call ``cluster`` is an error.
    2. ``cluster`` when ``control_plane`` is in the test's fixture closure (``item.fixturenames``),
       directly or through another fixture (``admin_api``, ``namespace``, ``agent_kubeconfig``,
       ``objects``, ``crds``, ``make_job``, ...).
    3. ``cluster`` when the test starts other processes: its function, or a fixture of its closure
       defined in the tests package, names ``subprocess`` or ``multiprocessing`` in its code
       (nested functions and lambdas included), directly or through the functions and classes of
       the tests package that it names, followed transitively (e.g. fixture ``helm`` -> class
       ``Helm`` -> ``Helm.run``, and ``testenv.ensure_binaries``, which fetches the binaries;
       ``modules_loaded_by``; ``helpers.run_workers``). External binaries (helm, kubectl, etcd,
       the demo's control plane) are only ever reached that way.
    4. ``pure`` otherwise.
    """
    for item in items:
        explicit = {mark.name for mark in item.iter_markers() if mark.name in ("cluster", "pure")}
        fixturedefs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        fixtures = [
            definition.func
            for definitions in fixturedefs.values()
            for definition in definitions
            if _in_tests_package(definition.func)
        ]
        automatic = (
            "cluster"
            if "control_plane" in getattr(item, "fixturenames", ())
            or _starts_processes([getattr(item, "function", None), *fixtures])
            else "pure"
        )
        if explicit == {"pure"} and automatic == "cluster":
            raise pytest.UsageError(f"{item.nodeid} is marked pure but needs the control plane or starts processes")
        if len(explicit) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked both pure and cluster")
        if not explicit:
            item.add_marker(automatic)
    _schedule_for_workers(items)


#: Fixtures that hold what a machine has one of: real nodes (kube-proxy's and the CNI bridge's rules are the host's)
#: and pod networks (network namespaces, iptables). The tests that use them run one at a time, in one worker.
MACHINE_FIXTURES = frozenset({"three_nodes", "real_node", "workload_cluster", "pod_network"})
#: Modules that start such a cluster themselves (the demo's script starts its own nodes).
MACHINE_MODULES = frozenset({"tests.test_demo"})
#: The modules whose tests use ``MACHINE_FIXTURES`` (checked at collection: the parallel scheduler, which runs before
#: any collection, reads this list).
MACHINE_FIXTURE_MODULES = frozenset(
    {
        "tests.test_elastic_controllers",
        "tests.test_multi_node",
        "tests.test_network",
        "tests.test_real_node",
        "tests.test_workloads",
    }
)
#: The scope of the tests that need the machine's nodes or networks (``pytest_xdist_make_scheduler``).
MACHINE_GROUP = "machine"
#: Each module's seconds in the last profile (``scripts/profile_tests.py``): parallel workers take the longest
#: first, so the run ends with short modules instead of one long one on a single worker.
PROFILE = Path(__file__).resolve().parent / "data" / "durations.json"


def _schedule_for_workers(items: list[pytest.Item]) -> None:
    """Order the run as the parallel scheduler (``pytest_xdist_make_scheduler``) groups it: the machine's tests
    first (one group: the longest chain), then every other module (a group of its own: its module-scoped fixtures
    start once), the longest first (``PROFILE``). Check that every module that uses the machine is listed."""
    import json

    seconds: dict[str, float] = json.loads(PROFILE.read_text()) if PROFILE.exists() else {}

    def group(item: pytest.Item) -> str:
        module = _module_of(item)
        return MACHINE_GROUP if module in MACHINE_MODULES | MACHINE_FIXTURE_MODULES else module

    users = {_module_of(item) for item in items if MACHINE_FIXTURES & set(getattr(item, "fixturenames", ()))}
    if not users <= MACHINE_FIXTURE_MODULES:
        missing = sorted(users - MACHINE_FIXTURE_MODULES)
        raise pytest.UsageError(f"{missing} use the machine's nodes or networks: add them to MACHINE_FIXTURE_MODULES")
    groups = {id(item): group(item) for item in items}
    total: dict[str, float] = {}
    for module, share in seconds.items():  # a module's seconds go to the groups of its tests, shared by count
        members = [groups[id(item)] for item in items if _module_of(item) == module]
        for name in members:
            total[name] = total.get(name, 0.0) + share / len(members)
    first = {name: index for index, name in enumerate(dict.fromkeys(groups.values()))}
    items.sort(
        key=lambda item: (groups[id(item)] != MACHINE_GROUP, -total.get(groups[id(item)], 0.0), first[groups[id(item)]])
    )


def _module_of(item: pytest.Item) -> str:
    return getattr(getattr(item, "module", None), "__name__", "")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler by module (``--dist loadscope``), with every module of the machine's tests in one
    scope (``MACHINE_GROUP``): one worker runs them one after the other. Not ``--dist loadgroup`` with
    ``xdist_group`` marks: xdist 3.8 writes the group into ``item._nodeid``, which pytest 9 no longer reads (the
    machine's tests ran in two workers at once, and their clusters broke each other)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ModuleScheduling(config, log)


def scope_of(nodeid: str) -> str:
    """The parallel scheduler's scope of the test ``nodeid``: ``MACHINE_GROUP`` for the machine's modules, else its
    module's file."""
    module = nodeid.split("::", 1)[0]
    machine = {f"{name.replace('.', '/')}.py" for name in MACHINE_MODULES | MACHINE_FIXTURE_MODULES}
    return MACHINE_GROUP if module in machine else module


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real etcd + kube-apiserver + kube-controller-manager, started once per run."""
    global _CONTROL_PLANE
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    _CONTROL_PLANE = plane
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
        _CONTROL_PLANE = None


def _start_cluster(tmp_path_factory: pytest.TempPathFactory, nodes: int) -> Iterator[Cluster]:
    from tests.e2e.fencing import fence_every_namespace
    from tests.testenv.node import unavailable

    missing = unavailable()
    if missing is not None:
        pytest.fail(f"a real node is not possible here: {missing}")
    plane = ControlPlane(tmp_path_factory.mktemp("node-plane"), with_node=True)
    cluster: Cluster | None = None
    try:
        plane.start()
        cluster = Cluster(plane, nodes=nodes)
        _MORE_LOGS.update({f"node plane {name}": path for name, path in {**plane.logs(), **cluster.logs()}.items()})
        cluster.start()
        # Every real-pod test runs under the chart's fencing policy (issue #46; tests/e2e/fencing.py).
        fence_every_namespace(plane)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        plane.stop()
        _MORE_LOGS.clear()


@pytest.fixture(scope="module")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A control plane of its own with a one-node cluster: containerd, runc, the CNI bridge, kubelet, scheduler,
    kube-proxy and CoreDNS.

    Per module, so that it is gone before any other test (the demo's, another module's) starts a cluster:
    one per machine (kube-proxy's rules are the machine's).

    Its pods are real (``tests.testenv.node``). Needs root and scripts/setup.sh's Debian packages; where
    they are missing the test fails and says why.
    """
    for cluster in _start_cluster(tmp_path_factory, 1):
        yield cluster.node


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane of its own with three real nodes (``tests.testenv.cluster``), per module like ``real_node``."""
    yield from _start_cluster(tmp_path_factory, 3)


@pytest.fixture(scope="module")
def workload_cluster(three_nodes: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The module's three nodes with JobSet, Kubeflow Trainer, Kueue and the Kubeflow training-operator (PyTorchJob)
    built from source and running
    (``tests.testenv.workloads``), and the operator installed from the chart as the README installs it (namespace
    ``kube-rendezvous-system``, its CRDs, cluster scope, the training RBAC in ``team-a``, its fencing policies in
    place of the module's); their logs shown on failure."""
    from tests.e2e.fencing import unfence_every_namespace
    from tests.e2e.workloads import install_operator_from_chart
    from tests.testenv.workloads import WorkloadControllers

    # The chart's release fences every namespace with a policy that spares its operator; the module's own goes.
    unfence_every_namespace(three_nodes.plane)
    controllers = WorkloadControllers(three_nodes)
    _MORE_LOGS.update({f"workload controller {name}": path for name, path in controllers.logs().items()})
    try:
        with ThreadPoolExecutor(2) as pool:  # independent: the controllers, and the operator from the chart
            started = pool.submit(controllers.start)
            installed = pool.submit(install_operator_from_chart, three_nodes, tmp_path_factory.mktemp("helm-home"))
            started.result()
            for path in installed.result():
                _MORE_LOGS[f"operator pod {path.parent.parent.name}"] = path
        yield three_nodes
    finally:
        controllers.stop()


@pytest.fixture(scope="session")
def admin_api(control_plane: ControlPlane) -> client.ApiClient:
    """An API client authenticated as cluster admin (system:masters)."""
    return config.new_client_from_config(str(control_plane.admin_kubeconfig))


@pytest.fixture
def namespace(request: pytest.FixtureRequest, admin_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace for this test, deleted afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": name, "labels": {"kube-rendezvous.io/test": "true"}}})
    yield name
    release(name)  # the watches and folders this process started for the test stop (and release) with it
    try:
        core.delete_namespace(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


#: Log lines that every run prints and that say nothing about a failure; left out of a failing report's
#: log tails, which they would fill: the test control plane has no front proxy, so that CA bundle is empty.
LOG_NOISE = ("missing content for CA bundle",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the tail of every control-plane server log and of the test's operators' logs to a failing report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        logs = {**(_CONTROL_PLANE.logs() if _CONTROL_PLANE is not None else {}), **_MORE_LOGS}
        funcargs = getattr(item, "funcargs", {})
        logs.update({f"operator ({name})": value.log for name, value in funcargs.items() if _is_operator(value)})
        for name, path in logs.items():
            if Path(path).exists():
                lines = Path(path).read_text(errors="replace").splitlines()
                kept = [line for line in lines if not any(noise in line for noise in LOG_NOISE)]
                dropped = len(lines) - len(kept)
                where = f"tail of {path}" + (f", without {dropped} lines of known noise" if dropped else "")
                report.sections.append((f"{name} log ({where})", "\n".join(kept[-60:])))
        for title, tail in _workload_logs(funcargs):
            report.sections.append((title, tail))


#: Lines of each agent's or training pod's log a failing report shows.
WORKLOAD_LOG_LINES = 40


def _workload_logs(funcargs: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The tails of the test's agents' logs (its ``tmp_path``) and of its pods' container logs (its ``namespace``,
    read from every node's ``podLogsDir``): what the agents did is what a failing wait needs to be read."""
    from tests.e2e.harness import quiet

    tmp_path, namespace = funcargs.get("tmp_path"), funcargs.get("namespace")
    paths = sorted(Path(tmp_path).glob("*/*.log")) if isinstance(tmp_path, Path) else []
    if isinstance(namespace, str) and _CONTROL_PLANE is not None:
        paths += sorted(_CONTROL_PLANE.workdir.glob(f"*/pod-logs/{namespace}_*/*/*.log"))
    for path in paths:
        lines = quiet(path.read_text(errors="replace")).splitlines()
        yield f"{path.parent.name}/{path.name} (tail of {path})", "\n".join(lines[-WORKLOAD_LOG_LINES:])


def _is_operator(value: object) -> bool:
    """Whether a fixture's value is an operator process started by the tests (its log is worth reading)."""
    from tests.e2e.operator_process import OperatorProcess

    return isinstance(value, OperatorProcess)


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> None:
    """The Rendezvous and RendezvousKey CRDs from crds/, applied and established."""
    control_plane.kubectl("apply", "-f", str(REPO / "crds"))
    control_plane.wait_established("crd/rendezvouses.kube-rendezvous.io", "crd/rendezvouskeys.kube-rendezvous.io")


@pytest.fixture
def agent_kubeconfig(control_plane: ControlPlane, namespace: str, crds: None) -> Path:
    """Kubeconfig of ServiceAccount ``trainer`` bound to docs/rbac.yaml: a training pod's credentials."""
    path = control_plane.serviceaccount_kubeconfig(namespace, "trainer")
    control_plane.kubectl("-n", namespace, "apply", "-f", str(REPO / "docs" / "rbac.yaml"))
    wait_until(
        lambda: (
            control_plane.kubectl(
                "auth",
                "can-i",
                "patch",
                "rendezvouses.kube-rendezvous.io",
                "--subresource=status",
                "-n",
                namespace,
                kubeconfig=path,
                check=False,
            ).stdout.strip()
            == "yes"
        ),
        30,
        "the agent RoleBinding to apply",
    )
    return path


def _state_rule_enforced(objects: client.CustomObjectsApi, namespace: str) -> bool:
    """Whether the API server refuses a status.state that is not a document (a dry run on a scratch object)."""
    try:
        objects.patch_namespaced_custom_object_status(
            "kube-rendezvous.io",
            "v1alpha1",
            namespace,
            "rendezvouses",
            "probe",
            {"status": {"state": "z1:probe"}},
            dry_run="All",
            _content_type="application/merge-patch+json",
        )
    except client.ApiException as exc:
        if exc.status == 422:
            return True
        raise
    return False


@pytest.fixture
def first_release_crd(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, crds: None
) -> Iterator[None]:
    """This release's Rendezvous CRD without its rule on status.state, as the first release shipped it.

    Objects written meanwhile keep their state after a CRD upgrade (CRD validation ratchets
    unchanged values), so what stops a hostile state then is the agents' and the operator's own
    validator. The CRD is restored afterwards.
    """
    objects = client.CustomObjectsApi(admin_api)
    current = yaml.safe_load((REPO / "crds" / "rendezvous.yaml").read_text())
    current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"].pop("x-kubernetes-validations")
    create_rendezvous(objects, namespace, "probe", maxNodes=1)
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(current))
    wait_until(lambda: not _state_rule_enforced(objects, namespace), 60, "the CRD without the state rule to apply")
    try:
        yield
    finally:
        control_plane.kubectl("apply", "-f", str(REPO / "crds" / "rendezvous.yaml"))
        wait_until(lambda: _state_rule_enforced(objects, namespace), 60, "this release's CRD to apply again")


@pytest.fixture
def objects(admin_api: client.ApiClient) -> client.CustomObjectsApi:
    """Custom objects as cluster admin."""
    return client.CustomObjectsApi(admin_api)


@pytest.fixture
def make_job(tmp_path: Path, namespace: str, agent_kubeconfig: Path) -> Iterator[Callable[..., ElasticJob]]:
    """Make elastic jobs (``ElasticJob``'s options) on Rendezvous ``<namespace>/job`` (k8s backend), or with
    ``backend="p10d"`` on a free local port; stopped afterwards."""
    jobs: list[ElasticJob] = []

    def make(backend: str = "k8s", **options: Any) -> ElasticJob:
        conf = {"kubeconfig": str(agent_kubeconfig)} if backend == "k8s" else {}
        conf.update(options.pop("rdzv_conf", {}))
        endpoint = f"{namespace}/job" if backend == "k8s" else f"127.0.0.1:{free_port()}"
        job = ElasticJob(tmp_path / f"job-{len(jobs)}", backend, endpoint, rdzv_conf=conf, **options)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.stop()


@pytest.fixture
def pod_network(control_plane: ControlPlane, agent_kubeconfig: Path) -> Iterator[Any]:
    """A bridge for pods with networks of their own (``tests.testenv.podnet``); ``kubeconfig``: the agents', relayed.

    Needs root, iproute2 and iptables (scripts/setup.sh installs them; CI runs as root). Where they
    are missing the test fails and says why: a skip would prove nothing.
    """
    from tests.testenv import podnet

    missing = podnet.available()
    if missing is not None:
        pytest.fail(f"pods with networks of their own are not possible here: {missing}")
    network = podnet.PodNetwork(control_plane.pod_network, control_plane.apiserver_port)
    network.kubeconfig = network.relayed(agent_kubeconfig)
    try:
        yield network
    finally:
        network.close()
