"""``torchrun --rdzv-backend=k8s``: torch's DynamicRendezvousHandler over the Kubernetes API (the torch adapter).

Stock ``torchrun`` loads it through the ``torchrun.handlers`` entry point (``pip install
'kube-rendezvous[torch]'``): torch's registry calls ``handler_creator()`` with no arguments and
registers the creator it returns under ``k8s``. Flags or the ``PET_RDZV_*`` environment
variables select it::

    torchrun --nnodes=2:4 --nproc-per-node=8 --rdzv-backend=k8s \\
        --rdzv-endpoint=team-a/llama-train --rdzv-id=$JOB_UID train.py

A thin adapter over the framework-neutral handler (``native``: a fresh bootstrap store every round,
SIGTERM means leave, closed means a clean exit, a broken round restarts): each round's store is
wrapped here in a ``torch.distributed.Store``, so that torch's C++ ``PrefixStore`` and barriers can
use it. torchrun passes ``--rdzv-timeout`` as ``timeout``.

Not guaranteed: torch's ``Store`` API beyond what its agent, rank assignment and barriers call
(``queue_*``, ``list_keys`` and ``clone`` are not implemented), and ``delete_key``/``num_keys``
through a C++ ``PrefixStore`` (torch's trampoline does not forward them; from Python they work).
The Python store must stay referenced while C++ uses it (the agent holds ``RendezvousInfo.store``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousParameters

from . import frameworks
from .native import NativeHandler
from .store import KubernetesPrefixStore, KubernetesStore

logger = logging.getLogger(__name__)


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


class TorchKubernetesStore(dist.Store):  # type: ignore[misc,name-defined]
    """A ``torch.distributed.Store`` backed by a ``KubernetesStore`` (or a round's prefix view of it).

    Blocking ``get`` and ``wait`` use the timeout torch set on this store (``set_timeout``) unless
    given one, and raise torch's ``DistStoreError`` when it runs out, as torch's own stores do.
    """

    def __init__(self, store: KubernetesStore | KubernetesPrefixStore) -> None:
        super().__init__()
        self._kv = store

    def _timeout(self, timeout: Any = None) -> float | None:
        return _seconds(timeout if timeout is not None else getattr(self, "timeout", None))

    def set(self, key: str, value: str | bytes) -> None:
        self._kv.set(key, value)

    def get(self, key: str) -> bytes:
        return self._kv.get(key, self._timeout())  # raises torch's DistStoreError (create_backend sets it)

    def add(self, key: str, value: int) -> int:
        return self._kv.add(key, value)

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        return self._kv.compare_set(key, expected_value, desired_value)

    def check(self, keys: list[str]) -> bool:
        return self._kv.check(keys)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if not self._kv.wait(keys, self._timeout(timeout)):
            raise dist.DistStoreError(f"KubernetesStore: timed out waiting for keys {keys!r}")

    def delete_key(self, key: str) -> bool:
        existed = self._kv.has(key)
        self._kv.delete_key(key)
        return existed

    def num_keys(self) -> int:
        return self._kv.num_keys()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        for key, value in zip(keys, values, strict=True):
            self._kv.set(key, value)

    def append(self, key: str, value: str | bytes) -> None:
        self._kv.append(key, value)


class TorchKubernetesRendezvousHandler(NativeHandler, RendezvousHandler):
    """The ``k8s`` handler for torch's elastic agent (``native.NativeHandler``); each round's store is a torch Store."""

    def wrap_store(self, store: KubernetesPrefixStore) -> TorchKubernetesStore:
        return TorchKubernetesStore(store)


def _log_like_torchrun() -> None:
    """Show this package's logs at ``$LOGLEVEL`` (torchrun's own knob), unless logging is configured already."""
    package = logging.getLogger("kube_rendezvous")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(os.environ.get("LOGLEVEL", "WARNING").upper())


def create_torch_handler(params: RendezvousParameters) -> TorchKubernetesRendezvousHandler:
    """Create the ``k8s`` handler for torchrun from its parameters (the creator torch's registry calls)."""
    _log_like_torchrun()
    return TorchKubernetesRendezvousHandler.from_parameters(params, frameworks.torch())


def handler_creator() -> Callable[[RendezvousParameters], TorchKubernetesRendezvousHandler]:
    """The ``torchrun.handlers`` entry point: torch calls it with no arguments and registers what it returns."""
    return create_torch_handler
