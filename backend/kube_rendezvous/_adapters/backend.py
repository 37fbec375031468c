"""The public ``create_backend``: the engine's compare-and-swap backend (``_engine.backend``) with tensorplay's
classes and errors by default, for users of the framework's stock ``DynamicRendezvousHandler``.

tensorplay is imported only when no ``Framework`` is given: a torch process passes torch's
(``torchrun.torch_framework()``). The ``k8s`` handlers never import this module (``tests/test_seams.py``).
"""

from __future__ import annotations

from typing import Any

from .._engine import backend
from .._engine.frameworks import Framework
from .._store.store import KubernetesStore
from .tensorplay import tensorplay_framework


def create_backend(
    params: Any, framework: Framework | None = None
) -> tuple[backend.KubernetesRendezvousBackend, KubernetesStore]:
    """The seed's compare-and-swap backend and its store, for the framework's stock ``DynamicRendezvousHandler``
    (``backend.create_backend``), with tensorplay's classes and errors unless ``framework`` names another's.

    Args:
        params: the launcher's ``RendezvousParameters`` (tensorplay's or torch's).
        framework: whose state classes and errors to use; tensorplay's by default (``torchrun.torch_framework()``
            for torch).

    Raises:
        ValueError: bad parameters (endpoint, rdzv-conf values, missing object with create=false).
        RendezvousConnectionError: the API server is unreachable or refuses (403, naming the permission).
    """
    return backend.create_backend(params, framework or tensorplay_framework())


__all__ = ["create_backend"]
