"""kube-rendezvous: a Kubernetes-native rendezvous for elastic training (tensorplay and torchrun).

One framework-neutral core: the ``k8s`` handler on its own protocol (``native``: ask on the node's
Lease, wait on the watch, confirm), the join rules (``folding``) and their one writer (``folder``),
the state document (``document``), the store (``store``; its combining adds ``adds`` and ``adder``,
its round view ``prefixstore``) and the seed's compare-and-swap backend
(``backend``, for the stock ``DynamicRendezvousHandler``). Thin adapters per framework: ``handler``
for tensorplay (``kube-rendezvous[tensorplay]``) and ``torchrun`` for torch (``kube-rendezvous[torch]``).
The pure modules (``document``, ``folding``, ``summary``, ``settings``, ``intents``, ``adds``,
``kubectl_rdzv_report``) import no framework and do no I/O.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "KubernetesRendezvousBackend": "backend",
    "KubernetesStore": "store",
    "create_backend": "backend",
    "KubernetesRendezvousHandler": "handler",
    "create_k8s_handler": "handler",
    "register": "handler",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the tensorplay-dependent parts on first use, so the pure helpers stay light."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
