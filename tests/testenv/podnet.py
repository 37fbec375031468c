"""Pods with a network of their own, and faults at the packet level (Linux, as root: what CI is).

``PodNetwork`` puts each agent "pod" in its own network namespace (iproute2), with a veth pair to a
bridge and an address of its own on the control plane's pod network (a private /24); the host holds
``.1`` on the bridge. The API server listens on 127.0.0.1 only, so a ``Relay`` on the host's bridge
address forwards to it; the pods' kubeconfig names that address, which the serving certificate holds.
A pod's processes run under ``ip netns exec``; its address is its ``POD_IP``. One ``PodNetwork`` per
control plane at a time.

Faults are iptables rules inside one pod's namespace, so they hit that pod's packets only, and
silently (DROP: no RST, no ICMP), as a partition, a NAT or a load balancer that dropped its state does:

- ``cut_api``: the pod cannot reach the API server (both ways) until ``heal``;
- ``silence_connections``: the pod's connections to the API server that are established now go
  silent (matched by their source ports), while new connections work: a half-open connection;
- ``cut_peers``: the pod reaches the API server but no other pod (its workers' collectives fail).

Not modelled: latency and loss (``tc netem`` is not in this kernel; a userspace proxy would add them),
and faults of the host side (the relay always forwards).
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Seconds data the relay sends may stay unacknowledged before it drops that connection (a silenced pod).
RELAY_USER_TIMEOUT_MS = 30_000


def run(*command: str) -> str:
    """Run ``command`` (iproute2, iptables, ss); raise with its output when it fails."""
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    return done.stdout


def available() -> str | None:
    """None when pods can have networks here; else why not (not root, no ip or iptables)."""
    import os
    import shutil

    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables", "ss"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh installs iproute2 and iptables)"
    return None


class Relay:
    """A TCP forwarder on ``listen`` to ``target``: a thread per direction of each connection.

    A silenced pod then blocks only its own connections' threads (until ``RELAY_USER_TIMEOUT_MS``).
    """

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server(listen)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._sockets: list[socket.socket] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if hasattr(socket, "TCP_USER_TIMEOUT"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, RELAY_USER_TIMEOUT_MS)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), name="relay pipe", daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._stopped.set()
        self._server.close()
        for sock in self._sockets:
            sock.close()


@dataclass
class Pod:
    """One pod's network namespace and address on the bridge."""

    network: PodNetwork
    name: str
    namespace: str
    address: str
    #: Its interface on the bridge. The namespaces share the host's name, which resolves to 127.0.0.1,
    #: so gloo is told the interface (``GLOO_SOCKET_IFNAME``); a real pod's name resolves to its IP.
    interface: str
    #: The iptables rules this pod's faults added (``heal`` removes them all).
    faults: list[list[str]] = field(default_factory=list)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this pod's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def environment(self) -> dict[str, str]:
        """What a pod's processes see of its network: ``POD_IP``, and gloo's interface."""
        return {"POD_IP": self.address, "GLOO_SOCKET_IFNAME": self.interface}

    def _rule(self, *rule: str) -> None:
        run("ip", "netns", "exec", self.namespace, "iptables", "-A", *rule)
        self.faults.append(list(rule))

    def cut_api(self) -> None:
        """Drop every packet between this pod and the API server (silently, both ways)."""
        host, port = self.network.relay.address
        self._rule("OUTPUT", "-p", "tcp", "-d", host, "--dport", str(port), "-j", "DROP")
        self._rule("INPUT", "-p", "tcp", "-s", host, "--sport", str(port), "-j", "DROP")

    def api_connections(self) -> list[int]:
        """Local ports of this pod's TCP connections to the API server that are established now."""
        host, port = self.network.relay.address
        listed = run(*self.command(["ss", "-Htn", "state", "established", "dst", f"{host}:{port}"]))
        return sorted({int(line.split()[2].rsplit(":", 1)[1]) for line in listed.splitlines() if line.strip()})

    def silence_connections(self) -> list[int]:
        """Drop the packets of every connection to the API server established now; new ones still work.

        Returns their local ports. What a NAT or a load balancer does when it loses a connection's state.
        """
        ports = self.api_connections()
        for local in ports:
            self._rule("OUTPUT", "-p", "tcp", "--sport", str(local), "-j", "DROP")
            self._rule("INPUT", "-p", "tcp", "--dport", str(local), "-j", "DROP")
        return ports

    def cut_peers(self) -> None:
        """Drop every packet between this pod and the other pods; the API server is still reachable."""
        subnet, host = str(self.network.subnet), self.network.host
        self._rule("OUTPUT", "-d", host, "-j", "ACCEPT")  # the host (the API server's relay) first
        self._rule("INPUT", "-s", host, "-j", "ACCEPT")
        self._rule("OUTPUT", "-d", subnet, "-j", "DROP")
        self._rule("INPUT", "-s", subnet, "-j", "DROP")

    def heal(self) -> None:
        """Remove every fault of this pod."""
        for rule in reversed(self.faults):
            run("ip", "netns", "exec", self.namespace, "iptables", "-D", *rule)
        self.faults.clear()


class PodNetwork:
    """A bridge with pods on it and a relay to the API server (``close`` removes it all)."""

    def __init__(self, subnet: ipaddress.IPv4Network | ipaddress.IPv6Network, apiserver_port: int) -> None:
        self._tag = uuid.uuid4().hex[:6]
        self.bridge = f"krb{self._tag}"
        self.subnet = subnet
        self.host = str(self.subnet[1])
        self.pods: list[Pod] = []
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.host}/{self.subnet.prefixlen}", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        self.relay = Relay((self.host, 0), ("127.0.0.1", apiserver_port))
        #: The agents' kubeconfig through the relay (``relayed``), once made.
        self.kubeconfig: Path | None = None

    def relayed(self, kubeconfig: Path) -> Path:
        """A copy of ``kubeconfig`` (beside it) whose server is the relay: what the pods use."""
        config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        host, port = self.relay.address
        for cluster in config.get("clusters") or []:
            cluster["cluster"]["server"] = f"https://{host}:{port}"
        path = kubeconfig.with_name(f"{kubeconfig.stem}.pods-{self._tag}.kubeconfig")
        path.write_text(yaml.safe_dump(config))
        return path

    def add_pod(self, name: str) -> Pod:
        """A new pod: its own namespace, a veth to the bridge, the next address of the subnet."""
        index = len(self.pods) + 2
        outside, inside = f"kro{self._tag}{index}", f"kri{self._tag}{index}"
        pod = Pod(self, name, f"krp{self._tag}-{index}", str(self.subnet[index]), inside)
        run("ip", "netns", "add", pod.namespace)
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        run("ip", "link", "set", inside, "netns", pod.namespace)
        run("ip", "link", "set", outside, "master", self.bridge)
        run("ip", "link", "set", outside, "up")
        run("ip", "-n", pod.namespace, "addr", "add", f"{pod.address}/{self.subnet.prefixlen}", "dev", inside)
        run("ip", "-n", pod.namespace, "link", "set", inside, "up")
        run("ip", "-n", pod.namespace, "link", "set", "lo", "up")
        self.pods.append(pod)
        return pod

    def close(self) -> None:
        self.relay.stop()
        for pod in self.pods:
            subprocess.run(["ip", "netns", "delete", pod.namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=30)
