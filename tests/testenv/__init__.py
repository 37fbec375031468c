"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) for tests."""

from .binaries import KUBERNETES_VERSION, Binaries, ensure_binaries
from .controlplane import ControlPlane, free_port, wait_until

__all__ = ["KUBERNETES_VERSION", "Binaries", "ControlPlane", "ensure_binaries", "free_port", "wait_until"]
