"""Start and stop a real etcd + kube-apiserver + kube-controller-manager on 127.0.0.1.

The API server runs with TLS, RBAC authorization and service-account token signing; clients
authenticate with an admin certificate (``O=system:masters``) or, like a pod, with a
ServiceAccount token minted by TokenRequest (:meth:`ControlPlane.serviceaccount_kubeconfig`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .binaries import Binaries, ensure_binaries
from .commands import run_command
from .pki import Pki, create_pki

CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
)
#: What a real node's pods need besides: Jobs and Deployments make pods, the node-lifecycle
#: controller marks a silent node NotReady (``NODE_MONITOR_GRACE_PERIOD``) and taints it, the
#: taint-eviction controller deletes the pods that do not tolerate that taint, the EndpointSlice
#: controller gives Services (kube-proxy, CoreDNS) their endpoints, and the disruption controller keeps
#: PodDisruptionBudgets' status, without which the eviction API (``kubectl drain``) refuses every pod.
NODE_CONTROLLERS = (
    "job-controller",
    "replicaset-controller",
    "deployment-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "endpointslice-controller",
    "disruption-controller",
)
#: Seconds without a kubelet's status before its node's Ready condition turns Unknown (upstream: 50 s).
#: Shorter here so a node failure test does not wait out the production value; the kubelet reports
#: every ``node.NODE_STATUS_UPDATE_SECONDS``.
NODE_MONITOR_GRACE_PERIOD = 16


#: Ports the test servers listen on: below the kernel's ephemeral range (``ip_local_port_range``, 32768-60999 by
#: default), from which every outgoing connection takes its local port. A port the kernel handed out as free
#: (bind to 0) is one of those, and with hundreds of client connections one of them took it between the pick
#: and the server's bind once (the operator's metrics server, binding all addresses: "Address already in use").
LISTEN_PORTS = range(20000, 30000)  # and below the NodePort range, 30000-32767
#: The ports this process handed out: never handed out twice (two picks before either server binds).
HANDED_OUT: set[int] = set()


def worker_ports(ports: range = LISTEN_PORTS) -> range:
    """The slice of ``ports`` this pytest worker picks from: parallel workers (pytest-xdist: ``PYTEST_XDIST_WORKER``
    ``gw<i>`` of ``PYTEST_XDIST_WORKER_COUNT``, inherited by the processes a test starts) never pick the same port,
    which each one's ``HANDED_OUT`` cannot see. The whole range outside a parallel run."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or int(count) < 2:
        return ports
    index, size = int(worker[2:]) % int(count), len(ports) // int(count)
    return ports[index * size : (index + 1) * size]


def free_port() -> int:
    """Return a TCP port below the ephemeral range that is free right now on every address (this worker's)."""
    ports = worker_ports()
    for _ in range(200):
        port = random.choice(ports)
        if port in HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))  # all addresses: what a server binding 0.0.0.0 needs
            except OSError:
                continue
        HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in {ports} after 200 tries")


class ServerExitedError(RuntimeError):
    """A control-plane server process exited while it was expected to run."""


def wait_until(
    predicate: Any, timeout: float, what: str, interval: float = 0.2, explain: Callable[[], str] | None = None
) -> Any:
    """Call ``predicate`` until it returns a truthy value; raise TimeoutError naming ``what``.

    ``explain`` adds what it returns at the timeout to the error's message (a report's sections may be
    cut from CI's output; the message is not).
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except ServerExitedError:
            raise
        except Exception as exc:  # noqa: BLE001 - remembered for the timeout message
            last_error = exc
        time.sleep(interval)
    message = f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_error!r})"
    if explain is not None:
        try:
            message += "\n" + explain()
        except Exception as exc:  # noqa: BLE001 - the timeout is the error to raise
            message += f"\n(explain failed: {exc!r})"
    raise TimeoutError(message)


@dataclass
class _Server:
    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            log.write(f"\n=== starting {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise ServerExitedError(f"{self.name} exited with {self.process.returncode}; log tail:\n{tail}")

    def stop(self, grace: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(grace)


@dataclass
class ControlPlane:
    """A local Kubernetes control plane whose state lives in ``workdir``."""

    workdir: Path
    binaries: Binaries = field(default_factory=ensure_binaries)
    #: Whether a real node (``tests.testenv.node``) will join: the controllers its pods need run too.
    with_node: bool = False
    #: Seconds without a kubelet's status before its Node turns NotReady (``set_node_monitor_grace``).
    node_monitor_grace: int = NODE_MONITOR_GRACE_PERIOD
    #: Extra kube-apiserver flags, appended after the defaults (of a flag given twice, the last wins), e.g. a
    #: lowered ``("--max-requests-inflight=20", "--max-mutating-requests-inflight=10")`` that makes API Priority
    #: and Fairness queue and throttle on 2 cores (``benchmarks/busy_server.py``). Empty: the defaults only.
    apiserver_flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.logdir = self.workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        #: The host's address on the bridge of pods with networks of their own (``podnet``): the serving
        #: certificate holds it, so clients in those pods (Kopf's too) verify the server as anywhere else.
        #: Node ``i``'s pods live in ``node_subnet(i)``, the i-th /24 of the /22 that starts here.
        self.pod_network = ipaddress.IPv4Network(f"10.{random.randint(200, 250)}.{4 * random.randint(0, 63)}.0/24")
        self.cluster_network = ipaddress.IPv4Network(f"{self.pod_network.network_address}/22")
        self.pki: Pki = create_pki(self.workdir / "pki", (str(self.pod_network[1]),))
        self.etcd_port, self.etcd_peer_port, self.apiserver_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.admin_kubeconfig = self.workdir / "admin.kubeconfig"
        self._write_kubeconfig(
            self.admin_kubeconfig,
            "admin",
            {"client-certificate": str(self.pki.admin_cert), "client-key": str(self.pki.admin_key)},
        )
        self._servers = {
            "etcd": _Server("etcd", self._etcd_command(), self.logdir / "etcd.log"),
            "kube-apiserver": _Server("kube-apiserver", self._apiserver_command(), self.logdir / "kube-apiserver.log"),
            "kube-controller-manager": _Server(
                "kube-controller-manager",
                self._controller_manager_command(),
                self.logdir / "kube-controller-manager.log",
            ),
        }

    def node_subnet(self, index: int) -> ipaddress.IPv4Network:
        """The pod subnet of the ``index``-th node (1 to 4): the first is ``pod_network``."""
        if not 1 <= index <= 4:
            raise ValueError(f"node index {index}: a test cluster has 1 to 4 nodes")
        return list(self.cluster_network.subnets(new_prefix=24))[index - 1]

    # -- commands -------------------------------------------------------------------------

    def _etcd_command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(self.binaries.etcd),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_command(self) -> list[str]:
        pki = self.pki
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--secure-port={self.apiserver_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki.admin_cert}",
            f"--kubelet-client-key={pki.admin_key}",
            "--kubelet-preferred-address-types=InternalIP",
            "--endpoint-reconciler-type=none",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.service_account_public_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--allow-privileged=true",
            "--v=1",
            *self.apiserver_flags,
        ]

    def _controller_manager_command(self) -> list[str]:
        controllers = CONTROLLERS + NODE_CONTROLLERS if self.with_node else CONTROLLERS
        return [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--controllers={','.join(controllers)}",
            f"--node-monitor-grace-period={self.node_monitor_grace}s",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}",
            f"--root-ca-file={self.pki.ca_cert}",
            "--concurrent-gc-syncs=5",
            "--v=1",
        ]

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start etcd, kube-apiserver and kube-controller-manager; return once all are healthy."""
        self._servers["etcd"].start()
        wait_until(self._etcd_healthy, timeout, "etcd /health")
        self.start_apiserver(timeout)
        self._servers["kube-controller-manager"].start()
        wait_until(self._default_serviceaccount_exists, timeout, "the default ServiceAccount (controller-manager up)")

    def start_apiserver(self, timeout: float = 120.0) -> None:
        """Start kube-apiserver and wait for /readyz."""
        self._servers["kube-apiserver"].start()
        wait_until(self._apiserver_ready, timeout, "kube-apiserver /readyz")

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (etcd keeps the data)."""
        self._servers["kube-apiserver"].stop()

    def restart_apiserver(self, downtime: float = 0.0, timeout: float = 120.0) -> None:
        """Stop kube-apiserver, stay down ``downtime`` seconds, start it, wait until ready."""
        self.stop_apiserver()
        time.sleep(downtime)
        self.start_apiserver(timeout)

    def set_node_monitor_grace(self, seconds: int, timeout: float = 60.0) -> None:
        """Restart kube-controller-manager with ``--node-monitor-grace-period`` ``seconds`` (upstream's default: 50),
        if it differs; return once it serves again."""
        if seconds == self.node_monitor_grace:
            return
        self.node_monitor_grace = seconds
        server = self._servers["kube-controller-manager"]
        server.stop()
        server.command = self._controller_manager_command()
        server.start()
        wait_until(self._controller_manager_healthy, timeout, "kube-controller-manager serving again")

    def stop(self) -> None:
        """Stop every server, the controller manager first and etcd last."""
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            self._servers[name].stop()

    def pids(self) -> dict[str, int]:
        """Return the process id of every running server."""
        return {
            name: server.process.pid
            for name, server in self._servers.items()
            if server.process is not None and server.process.poll() is None
        }

    def logs(self) -> dict[str, Path]:
        """Return each server's log file."""
        return {name: server.log for name, server in self._servers.items()}

    # -- health ---------------------------------------------------------------------------

    def _etcd_healthy(self) -> bool:
        self._servers["etcd"].check_running()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as response:
            return bool(json.load(response).get("health") == "true")

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get_json(self, path: str) -> Any:
        """GET ``path`` from kube-apiserver as the admin and decode the JSON answer."""
        with urllib.request.urlopen(self.server + path, timeout=5, context=self._ssl_context()) as response:
            return json.load(response)

    def _apiserver_ready(self) -> bool:
        self._servers["kube-apiserver"].check_running()
        try:
            with urllib.request.urlopen(self.server + "/readyz", timeout=2, context=self._ssl_context()) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError:
            return False

    def _controller_manager_healthy(self) -> bool:
        server = self._servers["kube-controller-manager"]
        server.check_running()
        port = next(arg.split("=", 1)[1] for arg in server.command if arg.startswith("--secure-port="))
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # its serving certificate is self-signed
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=context) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _default_serviceaccount_exists(self) -> bool:
        self._servers["kube-controller-manager"].check_running()
        try:
            self.get_json("/api/v1/namespaces/default/serviceaccounts/default")
        except urllib.error.HTTPError:
            return False
        return True

    # -- clients --------------------------------------------------------------------------

    def _write_kubeconfig(self, path: Path, user: str, credentials: dict[str, str], namespace: str = "default") -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "testenv", "cluster": {"server": self.server, "certificate-authority": str(self.pki.ca_cert)}}
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": user, "namespace": namespace}}],
            "current-context": "testenv",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def serviceaccount_kubeconfig(
        self,
        namespace: str,
        name: str,
        expiration_seconds: int = 3600,
        create: bool = True,
        pod: tuple[str, str] | None = None,
    ) -> Path:
        """Mint a token for ServiceAccount ``namespace/name`` (TokenRequest) and write a kubeconfig.

        A process that uses it authenticates exactly as a pod running under that account would.
        The ServiceAccount is created first when ``create`` is true and it does not exist.
        ``pod`` (name, uid): bind the token to that pod of the account, as the kubelet does for the token it mounts:
        the API server then puts the pod in the request's user info (``authentication.kubernetes.io/pod-name`` and
        ``pod-uid``) and refuses the token once the pod is gone.
        """
        from kubernetes import client, config

        api = client.CoreV1Api(config.new_client_from_config(str(self.admin_kubeconfig)))
        if create:
            try:
                api.create_namespaced_service_account(
                    namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
                )
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        bound = (
            None
            if pod is None
            else client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod[0], uid=pod[1])
        )
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds, bound_object_ref=bound)
        )
        answer = api.create_namespaced_service_account_token(name, namespace, request)
        token = answer.status.token if answer.status is not None else None
        if not token:
            raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token: {answer}")
        path = self.workdir / "kubeconfigs" / f"{namespace}.{name}{'' if pod is None else '.' + pod[0]}.kubeconfig"
        path.parent.mkdir(exist_ok=True)
        self._write_kubeconfig(path, f"system:serviceaccount:{namespace}:{name}", {"token": token}, namespace)
        return path

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane and return the completed process (``CommandFailed``, which
        carries what kubectl printed, when it fails and ``check``)."""
        command = [str(self.binaries.kubectl), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        return run_command(command, check=check, input=input, timeout=120)

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Wait until every CustomResourceDefinition named in ``crds`` (``crd/<name>`` or ``<name>``) is Established.

        Not ``kubectl wait --for=condition=established``: right after a CRD is created its status has no
        ``conditions`` yet, and kubectl 1.37 then exits 1 at once (``.status.conditions accessor error: <nil> is of
        the type <nil>``) instead of waiting: the fresh-machine failure of issue 50, reproduced by
        tests/test_control_plane.py. A missing status, or a CRD not yet visible, is waited out here.
        """
        names = [crd.removeprefix("crd/").removeprefix("customresourcedefinition/") for crd in crds]
        last: dict[str, str] = {}

        def established() -> bool:
            listed = self.kubectl("get", "crd", *names, "-o", "json", "--ignore-not-found", check=False)
            if listed.returncode != 0 or not listed.stdout.strip():
                last["kubectl"] = listed.stderr.strip() or "no output"
                return False
            items = json.loads(listed.stdout).get("items") or [json.loads(listed.stdout)]
            status = {
                item["metadata"]["name"]: any(
                    condition.get("type") == "Established" and condition.get("status") == "True"
                    for condition in (item.get("status") or {}).get("conditions") or []
                )
                for item in items
            }
            last["not yet established"] = ", ".join(name for name in names if not status.get(name)) or "none"
            return all(status.get(name) for name in names)

        wait_until(established, timeout, f"CRDs {', '.join(names)} to be Established", explain=lambda: str(last))
