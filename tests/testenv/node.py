"""A real node for the test cluster: containerd, runc, the CNI bridge, kubelet and kube-scheduler (Linux, root).

``Node(plane).start()`` runs them on this machine beside a ``ControlPlane(with_node=True)``. The Node
object it registers runs real pods: the scheduler binds them, the kubelet asks containerd for their
sandboxes and containers, the bridge plugin gives each pod an address on the control plane's pod
network, and the kubelet signals, restarts and kills their containers as it would anywhere.

What this environment needs of the kubelet, and why (``_kubelet_config``):

- ``failCgroupV1: false``: this kernel mounts cgroup v1 (the kubelet refuses v1 by default since 1.35);
- ``cgroupDriver: cgroupfs``, and ``SystemdCgroup = false`` for runc: no systemd runs here;
- ``failSwapOn: false``: harmless without swap, needed on a machine that has some;
- eviction thresholds of 1% disk and 100 MiB memory, and image GC off: the shared disk here is often
  more than 85% full, and the upstream thresholds would evict the test's pods or the pause image;
- ``restrict_oom_score_adj`` (containerd) and ``--oom-score-adj=0``: this sandbox withholds
  ``CAP_SYS_RESOURCE`` even from root, so no process may lower its OOM score (runc's
  ``failed to update /proc/self/oom_score_adj: Permission denied`` otherwise);
- ``resolvConf: ""``: pods get no nameserver. No DNS runs in this cluster and the host's resolver is
  out of the pod network's reach, so every lookup would wait out its timeout: torch's gloo looks up
  the pod's hostname (its IPv6 address too), and each ``init_process_group`` took 10 s longer;
- ``authorization: AlwaysAllow`` on a kubelet port bound to the bridge address only; the API server
  authenticates to it with the admin certificate (``kubectl logs``, ``exec``).

The network (``podnet.PodNetwork``): the bridge holds the host's ``.1``, where a relay forwards to
the API server on 127.0.0.1. No kube-proxy runs: one iptables DNAT rule plays it for the one Service
pods use, ``kubernetes`` (10.0.0.1:443), so in-cluster clients work unchanged. Other Services do
not route; nothing here uses them.

Not guaranteed: one node per machine at a time (the kubelet's cgroups are machine-wide), and the
images come from ``tests.testenv.images`` (no registry: pods must name an imported image).
"""

from __future__ import annotations

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
#: The ``kubernetes`` Service's address (the first of ``--service-cluster-ip-range``).
KUBERNETES_SERVICE = ("10.0.0.1", 443)
#: Where the bridge plugin allocates pods' addresses in the pod network (``PodNetwork.add_pod`` uses the low ones).
POD_RANGE = (100, 250)


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


class Node:
    """containerd + kubelet + kube-scheduler, registered as Node ``name``; ``stop`` removes it all."""

    def __init__(self, plane: ControlPlane, name: str = "node-1") -> None:
        if not plane.with_node:
            raise ValueError("the control plane must be created with with_node=True (the Job and node controllers)")
        self.plane = plane
        self.name = name
        self.workdir = plane.workdir / "node"
        for folder in ("containerd", "cni", "kubelet", "pod-logs", "ipam"):
            (self.workdir / folder).mkdir(parents=True, exist_ok=True)
        self.containerd_socket = self.workdir / "containerd" / "containerd.sock"
        self.network = PodNetwork(plane.pod_network, plane.apiserver_port)
        self.address = self.network.host
        self._dnat = [
            "PREROUTING", "-i", self.network.bridge, "-p", "tcp",
            "-d", KUBERNETES_SERVICE[0], "--dport", str(KUBERNETES_SERVICE[1]),
            "-j", "DNAT", "--to-destination", "{}:{}".format(*self.network.relay.address),
        ]  # fmt: skip
        self.kubelet_port, self.kubelet_healthz_port = free_port(), free_port()
        self._netns_before: set[str] = set()
        logs = plane.logdir
        self._servers = {
            "containerd": _Server("containerd", self._containerd_command(), logs / "containerd.log"),
            "kubelet": _Server("kubelet", self._kubelet_command(), logs / "kubelet.log"),
            "kube-scheduler": _Server("kube-scheduler", self._scheduler_command(), logs / "kube-scheduler.log"),
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
            "podLogsDirectory": str(self.workdir / "pod-logs"),
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
            "--oom-score-adj=0",
            "--v=1",
        ]

    def _scheduler_command(self) -> list[str]:
        admin = self.plane.admin_kubeconfig
        return [
            str(self.plane.binaries.kube_scheduler),
            f"--kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--v=1",
        ]

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        """Start containerd (importing the images), the kubelet and the scheduler; wait until the node is Ready."""
        run("iptables", "-t", "nat", "-A", *self._dnat)
        self._netns_before = set(_pod_netns())
        self._servers["containerd"].start()
        wait_until(self._containerd_ready, timeout, "containerd to serve")
        import_images(self.containerd_socket, build_images().values())
        self.start_kubelet()
        self._servers["kube-scheduler"].start()
        wait_until(self.ready, timeout, f"node {self.name} to be Ready")

    def start_kubelet(self) -> None:
        """Start the kubelet."""
        self._servers["kubelet"].start()

    def recover(self, timeout: float = 180.0) -> None:
        """After ``fail``: containerd and the kubelet start again; return once the Node is Ready.

        The kubelet finds its pods' containers gone and reports them (restartPolicy Never: Failed).
        """
        self._servers["containerd"].start()
        wait_until(self._containerd_ready, timeout, "containerd to serve again")
        self.start_kubelet()
        wait_until(self.ready, timeout, f"node {self.name} to be Ready again")

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
        """A node failure: the kubelet and containerd die (SIGKILL) and so do every pod's processes.

        The Node object still says Ready, and its pods Running, until the node-lifecycle controller
        notices the silence (``NODE_MONITOR_GRACE_PERIOD``).
        """
        for name in ("kubelet", "containerd"):
            server = self._servers[name]
            if server.process is not None and server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait(30)
            server.process = None
        self._kill_shims()

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
        """Stop the scheduler, the kubelet and containerd, kill every pod, and remove the network and mounts."""
        self._servers["kube-scheduler"].stop()
        self.fail()
        self._unmount()
        for name in set(_pod_netns()) - self._netns_before:  # containerd's, of the sandboxes it had no time to remove
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        subprocess.run(["iptables", "-t", "nat", "-D", *self._dnat], capture_output=True, timeout=30)
        self.network.close()

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
