"""A real node of the test cluster: its own containerd, runc, CNI bridge and kubelet (Linux, root).

``tests.testenv.cluster.Cluster`` starts one or more of them on this machine beside a
``ControlPlane(with_node=True)``, with the scheduler, kube-proxy and CoreDNS. The Node object each one
registers runs real pods: the scheduler binds them, the kubelet asks its containerd for their sandboxes and
containers, the bridge plugin gives each pod an address on the node's own pod subnet, and the kubelet
signals, restarts and kills their containers as it would anywhere.

What a second (and third) kubelet on the same machine needs, and why: a kubelet treats every sandbox and
container its CRI endpoint shows as its own (garbage collection included), and two kubelets under one
``<cgroupRoot>/kubepods`` kill each other's pods. So each node has its own:

- containerd instance: ``root``, ``state``, gRPC and ttrpc sockets under the node's folder;
- ``cgroupRoot`` (``/kube-rendezvous-<node>-<tag>``, created in every cgroup v1 hierarchy before the kubelet
  starts and removed after it stopped): the node's ``kubepods`` tree lives below it;
- kubelet ``--root-dir``, ``--cert-dir``, ``podLogsDir``, client certificate (``system:node:<name>``). The
  pod log folder above all: each kubelet's container garbage collection removes every folder of its
  ``podLogsDir`` whose pod its runtime does not know, so with the default ``/var/log/pods`` shared, each node
  deleted the other nodes' pods' logs within a minute (``kubectl logs`` then lost their first lines);
- ports: the kubelet's (``port``; ``readOnlyPort`` 0) and ``healthzPort``, each a free port;
- pod subnet (``ControlPlane.node_subnet``), bridge, CNI config and host-local IPAM data directory; the
  node's address (``--node-ip``) is the host's address on its bridge;
- topology labels (``--node-labels``): ``topology.kubernetes.io/region``/``zone`` and
  ``cloud.google.com/gce-topology-block`` (``TOPOLOGY``), which NodeRestriction lets a kubelet set.

What this environment needs of the kubelet, and why (``_kubelet_config``):

- ``failCgroupV1: false``: this kernel mounts cgroup v1 (the kubelet refuses v1 by default since 1.35);
- ``cgroupDriver: cgroupfs``, and ``SystemdCgroup = false`` for runc: no systemd runs here;
- ``failSwapOn: false``: harmless without swap, needed on a machine that has some;
- eviction thresholds of 1% disk and 100 MiB memory, and image GC off: the shared disk here is often
  more than 85% full, and the upstream thresholds would evict the test's pods or the pause image;
- ``restrict_oom_score_adj`` (containerd) and ``--oom-score-adj=0``: this sandbox withholds
  ``CAP_SYS_RESOURCE`` even from root, so no process may lower its OOM score (runc's
  ``failed to update /proc/self/oom_score_adj: Permission denied`` otherwise);
- ``clusterDNS`` (``cluster.DNS_SERVICE_IP``, the kube-dns Service that CoreDNS serves) and ``resolvConf: ""``:
  pods with ``dnsPolicy: ClusterFirst`` resolve cluster names only. The host's resolver is out of the
  pod network's reach, so a name outside the cluster is answered NXDOMAIN at once by CoreDNS instead of
  waiting out a timeout (torch's gloo looks up the pod's hostname: the kubelet's ``/etc/hosts`` has it);
- ``authorization: AlwaysAllow`` on a kubelet port bound to the bridge address only; the API server
  authenticates to it with the admin certificate (``kubectl logs``, ``exec``).

The network (``podnet.PodNetwork``): each node's bridge holds the host's ``.1`` of its subnet; the host
routes between the bridges (``ip_forward``), so pods reach pods on other nodes directly. The API server
listens on 127.0.0.1; a relay on the first node's bridge address forwards to it, and kube-proxy routes
the ``kubernetes`` Service (10.0.0.1:443) there (``cluster``).

Not guaranteed: one cluster of nodes per machine at a time (kube-proxy's iptables rules are the
machine's), and the images come from ``tests.testenv.images`` (no registry: pods must name an imported
image).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .controlplane import ControlPlane, _Server, free_port, wait_until
from .images import PAUSE_IMAGE, build_images, import_images
from .pki import create_client_certificate
from .podnet import PodNetwork, run

#: Seconds between the kubelet's node status reports (upstream: 10 s).
NODE_STATUS_UPDATE_SECONDS = 4
#: Where the bridge plugin allocates pods' addresses in the pod network (``PodNetwork.add_pod`` uses the low ones).
POD_RANGE = (100, 250)
#: The kube-dns Service's cluster IP, which every pod's resolv.conf names (``cluster`` serves it with CoreDNS).
DNS_SERVICE_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
#: Node label keys of the topology the nodes carry, and each node's values (node-1 and node-2 share a zone).
TOPOLOGY_KEYS = ("topology.kubernetes.io/region", "topology.kubernetes.io/zone", "cloud.google.com/gce-topology-block")
TOPOLOGY = (
    ("local", "zone-a", "block-1"),
    ("local", "zone-a", "block-2"),
    ("local", "zone-b", "block-3"),
    ("local", "zone-b", "block-4"),
)


def unavailable() -> str | None:
    """None when a real node can run here; else why not (not root, a Debian package missing)."""
    import shutil

    from .podnet import available

    missing = available()
    if missing is not None:
        return missing
    for tool, package in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"), ("gcc", "gcc")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh installs the Debian package {package})"
    if not Path("/usr/lib/cni/bridge").is_file():
        return "the CNI plugins are not installed (scripts/setup.sh installs containernetworking-plugins)"
    return None


def _pod_netns() -> list[str]:
    """The network namespaces containerd's CNI made for pod sandboxes (``cni-<uuid>``)."""
    folder = Path("/var/run/netns")
    return [entry.name for entry in folder.iterdir() if entry.name.startswith("cni-")] if folder.is_dir() else []


def _cgroup_hierarchies() -> list[Path]:
    """The mount points of this machine's cgroup hierarchies (v1 controllers, and the v2 one where mounted)."""
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, kind, *_ = line.split()
        if kind in ("cgroup", "cgroup2"):
            found.append(Path(mount))
    return found


#: The taint of Kubernetes' non-graceful node shutdown (``Node.mark_out_of_service``).
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


class Node:
    """containerd + kubelet, registered as Node ``name`` (the ``index``-th of its cluster); ``stop`` removes it all."""

    def __init__(self, plane: ControlPlane, name: str = "node-1", index: int = 1) -> None:
        if not plane.with_node:
            raise ValueError("the control plane must be created with with_node=True (the Job and node controllers)")
        self.plane = plane
        self.name = name
        self.index = index
        self.labels = dict(zip(TOPOLOGY_KEYS, TOPOLOGY[index - 1], strict=True))
        self.workdir = plane.workdir / name
        for folder in ("containerd", "cni", "kubelet", "pod-logs", "ipam"):
            (self.workdir / folder).mkdir(parents=True, exist_ok=True)
        self.containerd_socket = self.workdir / "containerd" / "containerd.sock"
        self.network = PodNetwork(plane.node_subnet(index), plane.apiserver_port)
        self.address = self.network.host
        self.cgroup_root = f"/kube-rendezvous-{name}-{self.network.bridge}"
        self.kubelet_port, self.kubelet_healthz_port = free_port(), free_port()
        self._netns_before: set[str] = set()
        self._isolated = False
        logs = plane.logdir
        self._servers = {
            "containerd": _Server("containerd", self._containerd_command(), logs / f"{name}-containerd.log"),
            "kubelet": _Server("kubelet", self._kubelet_command(), logs / f"{name}-kubelet.log"),
        }

    # -- configuration --------------------------------------------------------------------

    def _containerd_command(self) -> list[str]:
        folder = self.workdir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{folder / "root"}"
state = "{folder / "state"}"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{self.workdir / "cni"}"
"""
        (folder / "config.toml").write_text(config)
        network = self.network.subnet
        bridge = {
            "cniVersion": "0.4.0",
            "name": "kube-rendezvous",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.network.bridge,
                    "isGateway": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.workdir / "ipam"),
                        "ranges": [
                            [
                                {
                                    "subnet": str(network),
                                    "rangeStart": str(network[POD_RANGE[0]]),
                                    "rangeEnd": str(network[POD_RANGE[1]]),
                                    "gateway": self.address,
                                }
                            ]
                        ],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        }
        (self.workdir / "cni" / "10-kube-rendezvous.conflist").write_text(json.dumps(bridge, indent=2))
        return ["containerd", f"--config={folder / 'config.toml'}", "--log-level=warn"]

    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.address,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.kubelet_healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.plane.pki.ca_cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": f"{NODE_STATUS_UPDATE_SECONDS}s",
            "nodeStatusReportFrequency": f"{NODE_STATUS_UPDATE_SECONDS}s",
            "podLogsDir": str(self.workdir / "pod-logs"),
            "cgroupRoot": self.cgroup_root,
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "",
            "serializeImagePulls": False,
            "registerNode": True,
        }

    def _kubelet_command(self) -> list[str]:
        folder = self.workdir / "kubelet"
        cert, key = create_client_certificate(
            self.plane.pki, folder / "pki", f"system:node:{self.name}", "system:nodes"
        )
        kubeconfig = folder / "kubelet.kubeconfig"
        self.plane._write_kubeconfig(kubeconfig, f"system:node:{self.name}", {
            "client-certificate": str(cert), "client-key": str(key),
        })  # fmt: skip
        (folder / "config.json").write_text(json.dumps(self._kubelet_config(), indent=2))
        return [
            str(self.plane.binaries.kubelet),
            f"--config={folder / 'config.json'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={folder / 'root'}",
            f"--cert-dir={folder / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.address}",
            "--node-labels=" + ",".join(f"{key}={value}" for key, value in self.labels.items()),
            "--oom-score-adj=0",
            "--v=1",
        ]

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 180.0, wait: bool = True) -> None:
        """Start containerd (importing the images) and the kubelet; with ``wait``, return once the node is Ready."""
        self._netns_before = set(_pod_netns())
        for hierarchy in _cgroup_hierarchies():
            (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        self._servers["containerd"].start()
        wait_until(self._containerd_ready, timeout, f"{self.name}'s containerd to serve")
        import_images(self.containerd_socket, build_images().values())
        self.start_kubelet()
        if wait:
            wait_until(self.ready, timeout, f"node {self.name} to be Ready")

    def start_kubelet(self) -> None:
        """Start the kubelet."""
        self._servers["kubelet"].start()

    def mark_out_of_service(self) -> None:
        """What an administrator does once a NotReady node's machine is known to be gone (Kubernetes' non-graceful
        node shutdown): taint it ``node.kubernetes.io/out-of-service``. The pod garbage collector then marks its
        terminating pods Failed and deletes them, so that their controllers replace them. (A Job with a
        ``podFailurePolicy`` replaces only Failed pods: without this, or the Node's deletion as a cloud's node
        lifecycle does, its pods of a dead node are never replaced.) ``recover`` removes the taint."""
        self.plane.kubectl("taint", "node", self.name, f"{OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute", "--overwrite")

    def recover(self, timeout: float = 180.0) -> None:
        """After ``fail``: containerd and the kubelet start again; return once the Node is Ready (and in service).

        The kubelet finds its pods' containers gone and reports them (restartPolicy Never: Failed).
        """
        self.plane.kubectl("taint", "node", self.name, f"{OUT_OF_SERVICE_TAINT}-", check=False)
        self.reconnect()
        if not self._running("containerd"):
            self._servers["containerd"].start()
            wait_until(self._containerd_ready, timeout, "containerd to serve again")
        if not self._running("kubelet"):
            self.start_kubelet()
        wait_until(self.ready, timeout, f"node {self.name} to be Ready again")

    def stop_kubelet(self) -> None:
        """Only the kubelet dies (SIGKILL): its pods' containers run on and reach the network, the Node's status
        goes stale and the node-lifecycle controller marks it NotReady. ``recover`` starts it again."""
        server = self._servers["kubelet"]
        if server.process is not None and server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(30)
        server.process = None

    def _running(self, name: str) -> bool:
        process = self._servers[name].process
        return process is not None and process.poll() is None

    @property
    def running(self) -> bool:
        """Whether the node's kubelet and containerd run (false after ``fail``)."""
        return all(self._running(name) for name in self._servers)

    def _containerd_ready(self) -> bool:
        self._servers["containerd"].check_running()
        done = subprocess.run(
            ["ctr", f"--address={self.containerd_socket}", "version"], capture_output=True, timeout=10
        )
        return done.returncode == 0

    def ready(self) -> bool:
        """Whether the Node object's Ready condition is True."""
        self._servers["kubelet"].check_running()
        try:
            node = self.plane.get_json(f"/api/v1/nodes/{self.name}")
        except OSError:
            return False
        conditions = node.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def kill_container(self, container_id: str, signal_name: str = "SIGKILL") -> None:
        """Signal a container's main process through containerd (its id, or a pod status' ``containerd://<id>``)."""
        run("ctr", f"--address={self.containerd_socket}", "-n", "k8s.io", "task", "kill", "-s", signal_name,
            container_id.rsplit("/", 1)[-1])  # fmt: skip

    def fail(self) -> None:
        """A node failure: the node's network goes silent, then the kubelet and containerd die (SIGKILL) and so do
        every pod's processes.

        The network goes first so that the death is silent, as a machine's is: the pods' peers and the API
        server's relay get no FIN or RST from the killed processes (one kernel serves every node here) and
        learn of it only by timeouts, heartbeats or the Node's condition. The Node object still says Ready,
        and its pods Running, until the node-lifecycle controller notices the silence
        (``NODE_MONITOR_GRACE_PERIOD``). ``recover`` undoes it all.
        """
        self.isolate()
        for name in ("kubelet", "containerd"):
            server = self._servers[name]
            if server.process is not None and server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait(30)
            server.process = None
        self._kill_shims()

    def _isolation_rules(self) -> list[list[str]]:
        bridge = self.network.bridge
        return [["INPUT", "-i", bridge, "-j", "DROP"], ["OUTPUT", "-o", bridge, "-j", "DROP"],
                ["FORWARD", "-i", bridge, "-j", "DROP"], ["FORWARD", "-o", bridge, "-j", "DROP"]]  # fmt: skip

    def isolate(self) -> None:
        """Drop every packet to and from this node's pods (its bridge), silently: a machine cut off."""
        if not self._isolated:
            for rule in self._isolation_rules():
                run("iptables", "-I", *rule)
            self._isolated = True

    def reconnect(self) -> None:
        """Undo ``isolate``."""
        if self._isolated:
            for rule in self._isolation_rules():
                subprocess.run(["iptables", "-D", *rule], capture_output=True, timeout=30)
            self._isolated = False

    def _kill_shims(self) -> None:
        """SIGKILL every container of this node's containerd (each one's init, so its PID namespace), then the shims."""
        socket = str(self.containerd_socket).encode()
        processes: dict[int, tuple[int, list[bytes]]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            processes[int(entry.name)] = (parent, argv)
        shims = {
            pid
            for pid, (_, argv) in processes.items()
            if argv[0].endswith(b"containerd-shim-runc-v2") and socket in argv
        }
        victims = [pid for pid, (parent, _) in processes.items() if parent in shims]
        for pid in [*victims, *shims]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop the kubelet and containerd, kill every pod, and remove the network, mounts and cgroups."""
        self.fail()
        self.reconnect()
        self._unmount()
        for name in set(_pod_netns()) - self._netns_before:  # containerd's, of the sandboxes it had no time to remove
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        self.network.close()
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        """Remove the node's cgroup tree, deepest first (its processes are dead; a busy one is left)."""
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if top.is_dir():
                for folder in sorted(
                    (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
                ):
                    with contextlib.suppress(OSError):
                        folder.rmdir()
                with contextlib.suppress(OSError):
                    top.rmdir()

    def _unmount(self) -> None:
        """Unmount what the kubelet and containerd mounted under the node's folder (deepest first)."""
        prefix = str(self.workdir) + "/"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
            ours = sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True)
            if not ours:
                return
            for mount in ours:
                subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)

    def logs(self) -> dict[str, Path]:
        """Each node server's log file."""
        return {name: server.log for name, server in self._servers.items()}
