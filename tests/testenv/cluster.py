"""A test cluster of 1 to 4 real nodes on one machine, with the scheduler, kube-proxy and CoreDNS (Linux, root).

``Cluster(ControlPlane(dir, with_node=True), nodes=3).start()`` starts, beside the control plane:

- ``nodes`` real nodes (``tests.testenv.node.Node``): each its own containerd, kubelet, cgroup root, ports,
  pod subnet and topology labels;
- kube-scheduler;
- kube-proxy in iptables mode, which routes every Service, as in any cluster. One kube-proxy serves every
  node: the nodes share this machine's network namespace, so its rules are theirs (a real cluster runs one
  per node, each writing the same rules into its own machine). It authenticates as ``system:kube-proxy``
  (the built-in ``system:node-proxier`` binding);
- CoreDNS (``kube-dns`` Service, ``node.DNS_SERVICE_IP``): ``<service>.<namespace>.svc.cluster.local``, a
  headless Service's pods by hostname, and NXDOMAIN at once for anything outside the cluster (no upstream is
  reachable here). It runs on the host, not in a pod (no registry: a CoreDNS image would have to be built
  here too), as ``system:coredns`` with upstream's ClusterRole, behind a Service without selector whose
  EndpointSlice names it.

The API server listens on 127.0.0.1 only; a relay on the first node's bridge address forwards to it. Its
``--endpoint-reconciler-type=none`` leaves the ``kubernetes`` Service's endpoints to us: one EndpointSlice
that names the relay, which kube-proxy then routes like any other.

Not guaranteed: one cluster per machine at a time (kube-proxy's rules are the machine's; ``stop`` removes
them with ``kube-proxy --cleanup``); the nodes share one kernel, so a "node failure" is its kubelet,
containerd and containers killed, not a machine's power cut.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml

from .controlplane import ControlPlane, _Server, free_port, wait_until
from .node import CLUSTER_DOMAIN, DNS_SERVICE_IP, Node
from .pki import create_client_certificate
from .podnet import run

#: Seconds kube-proxy waits at least between two syncs of its rules (upstream: 1 s).
PROXY_MIN_SYNC_SECONDS = 0

#: CoreDNS's permissions, as upstream's ``system:coredns`` ClusterRole (the kubernetes plugin's lists and watches).
COREDNS_RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
    },
]


def _sysctl(name: str, value: str) -> None:
    Path("/proc/sys", *name.split(".")).write_text(value)


class Cluster:
    """The nodes, scheduler, kube-proxy and CoreDNS of a ``ControlPlane(with_node=True)``; ``stop`` removes them."""

    def __init__(self, plane: ControlPlane, nodes: int = 1) -> None:
        self.plane = plane
        self.nodes = [Node(plane, f"node-{index}", index) for index in range(1, nodes + 1)]
        self.workdir = plane.workdir / "cluster"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.relay = self.nodes[0].network.relay
        self.dns_port = free_port()
        self._proxy_config = self.workdir / "kube-proxy.json"
        logs = plane.logdir
        self._servers = {
            "kube-scheduler": _Server("kube-scheduler", self._scheduler_command(), logs / "kube-scheduler.log"),
            "kube-proxy": _Server("kube-proxy", self._proxy_command(), logs / "kube-proxy.log"),
            "coredns": _Server("coredns", self._coredns_command(), logs / "coredns.log"),
        }

    @property
    def node(self) -> Node:
        """The first node (a one-node cluster's only one)."""
        return self.nodes[0]

    # -- configuration --------------------------------------------------------------------

    def _client_kubeconfig(self, user: str, organization: str) -> Path:
        cert, key = create_client_certificate(self.plane.pki, self.workdir / "pki", user, organization)
        path = self.workdir / f"{user.replace(':', '-')}.kubeconfig"
        self.plane._write_kubeconfig(path, user, {"client-certificate": str(cert), "client-key": str(key)})
        return path

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

    def _proxy_command(self) -> list[str]:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {
                "kubeconfig": str(self._client_kubeconfig("system:kube-proxy", "system:node-proxier"))
            },
            "mode": "iptables",
            "hostnameOverride": self.nodes[0].name,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "clusterCIDR": str(self.plane.cluster_network),
            "iptables": {"minSyncPeriod": f"{PROXY_MIN_SYNC_SECONDS}s", "syncPeriod": "30s"},
            # This sandbox withholds CAP_SYS_RESOURCE and owns no conntrack table size: leave both alone.
            "oomScoreAdj": 0,
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        self._proxy_config.write_text(json.dumps(config, indent=2))
        return [str(self.plane.binaries.kube_proxy), f"--config={self._proxy_config}", "--v=1"]

    def _coredns_command(self) -> list[str]:
        kubeconfig = self._client_kubeconfig("system:coredns", "kube-rendezvous-testenv")
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            f"""{CLUSTER_DOMAIN}:{self.dns_port} in-addr.arpa:{self.dns_port} ip6.arpa:{self.dns_port} {{
    bind {self.relay.address[0]}
    errors
    health 127.0.0.1:{free_port()}
    ready 127.0.0.1:{free_port()}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} testenv
        pods insecure
        ttl 5
    }}
    cache 5
    loadbalance
}}
.:{self.dns_port} {{
    bind {self.relay.address[0]}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""
        )
        return [str(self.plane.binaries.coredns), "-conf", str(corefile)]

    def _service_objects(self) -> list[dict[str, Any]]:
        """The ``kubernetes`` Service's EndpointSlice (the relay), and the kube-dns Service with its EndpointSlice."""
        relay_host, relay_port = self.relay.address
        managed = {"endpointslice.kubernetes.io/managed-by": "testenv.kube-rendezvous.io"}

        def endpoint_slice(namespace: str, service: str, host: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": service,
                    "namespace": namespace,
                    "labels": {"kubernetes.io/service-name": service, **managed},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
                "ports": ports,
            }

        dns_ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
        return [
            endpoint_slice(
                "default", "kubernetes", relay_host, [{"name": "https", "port": relay_port, "protocol": "TCP"}]
            ),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "ports": [{**port, "targetPort": self.dns_port} for port in dns_ports],
                },
            },
            endpoint_slice(
                "kube-system", "kube-dns", relay_host, [{**port, "port": self.dns_port} for port in dns_ports]
            ),
            *COREDNS_RBAC,
        ]

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        """Start the Service plumbing, every node (in parallel) and the scheduler; return once every node is Ready."""
        # Pods reach pods of other nodes and the relay through the host (routing between the bridges), and
        # replies between pods of one bridge pass the host's iptables (kube-proxy's de-NAT of a Service hop).
        _sysctl("net.ipv4.ip_forward", "1")
        _sysctl("net.bridge.bridge-nf-call-iptables", "1")
        self.plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(self._service_objects()))
        self._servers["kube-proxy"].start()
        self._servers["coredns"].start()
        for node in self.nodes:
            node.start(timeout, wait=False)
        self._servers["kube-scheduler"].start()
        for node in self.nodes:
            wait_until(node.ready, timeout, f"node {node.name} to be Ready")
        wait_until(self._proxy_synced, timeout, "kube-proxy to program the kubernetes Service")

    def _proxy_synced(self) -> bool:
        self._servers["kube-proxy"].check_running()
        self._servers["coredns"].check_running()
        rules = run("iptables-save", "-t", "nat")
        return "default/kubernetes:https" in rules and "kube-system/kube-dns:dns" in rules

    def stop(self) -> None:
        """Stop the scheduler, kube-proxy (removing its rules) and CoreDNS, then every node."""
        for name in ("kube-scheduler", "kube-proxy", "coredns"):
            self._servers[name].stop()
        with contextlib.suppress(Exception):
            run(str(self.plane.binaries.kube_proxy), "--cleanup", f"--config={self._proxy_config}")
        for node in self.nodes:
            node.stop()

    def logs(self) -> dict[str, Path]:
        """Each server's log file, the nodes' included."""
        found = {name: server.log for name, server in self._servers.items()}
        for node in self.nodes:
            found.update({f"{node.name} {name}": path for name, path in node.logs().items()})
        return found
