"""The ``k8s`` rendezvous handler for tensorplay: ``native.NativeHandler`` on tensorplay's ``RendezvousHandler``.

A thin adapter: the protocol lives in ``native``; tensorplay's C++ ``PrefixStore`` refuses Python
stores, so each round's store is handed to the agent as a ``KubernetesPrefixStore`` as it is.
"""

from __future__ import annotations

from tensorplay.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousParameters, get_registry

from .._engine.native import BACKEND_NAME, NativeHandler
from .tensorplay import tensorplay_framework


class KubernetesRendezvousHandler(NativeHandler, RendezvousHandler):
    """The ``k8s`` handler for tensorplay's elastic agent (``native.NativeHandler``)."""


def create_k8s_handler(params: RendezvousParameters) -> KubernetesRendezvousHandler:
    """Create the ``k8s`` handler from the launcher's parameters (the registry's creator)."""
    return KubernetesRendezvousHandler.from_parameters(params, tensorplay_framework())


def register() -> None:
    """Register rendezvous backend ``k8s`` with tensorplay's handler registry (idempotent).

    tensorplay 1.0.0 never loads the ``tp.elastic.handlers`` entry points, so launch code
    must call this before it builds its rendezvous handler; ``kube_rendezvous.run`` does.
    """
    get_registry().register(BACKEND_NAME, create_k8s_handler)
