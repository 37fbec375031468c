"""``torchrun --rdzv-backend=k8s``: the ``k8s`` rendezvous handler for torch (the torch adapter).

Stock ``torchrun`` loads it through the ``torchrun.handlers`` entry point (``pip install
'kube-rendezvous[torch]'``); flags or the ``PET_RDZV_*`` environment variables select it::

    torchrun --nnodes=2:4 --nproc-per-node=8 --rdzv-backend=k8s \\
        --rdzv-endpoint=team-a/llama-train --rdzv-id=$JOB_UID train.py

The protocol is ``native``'s; each round's store is wrapped here in a ``torch.distributed.Store``, so
that torch's C++ ``PrefixStore`` and barriers can use it.

Not guaranteed: torch's ``Store`` API beyond what its agent, rank assignment and barriers call
(``queue_*`` and ``list_keys`` are not implemented), and ``num_keys`` under a prefix: it counts every
key of the Rendezvous, as it does in torch's own ``PrefixStore`` over a shared store. The Python store
must stay referenced while C++ uses it (the agent holds ``RendezvousInfo.store``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any


def handler_creator() -> Callable[[Any], Any]:
    """The ``torchrun.handlers`` entry point: torch calls it with no arguments and registers what it returns.

    Defined before torch is imported: importing torch's rendezvous package loads the entry points, so
    when this module is imported first, torch looks this function up on the half-imported module.
    """
    return lambda params: create_torch_handler(params)


import torch.distributed as dist  # noqa: E402 - after handler_creator (its docstring)
from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousParameters  # noqa: E402

from .._engine.frameworks import Framework  # noqa: E402
from .._engine.native import NativeHandler  # noqa: E402
from .._store.prefixstore import KubernetesPrefixStore  # noqa: E402
from .._store.store import KubernetesStore  # noqa: E402
from .elastic import elastic_framework  # noqa: E402

logger = logging.getLogger(__name__)


@functools.cache
def torch_framework() -> Framework:
    """torch's elastic package (``kube-rendezvous[torch]``), as the engine sees it."""

    def server(addr: str) -> Any:
        return dist.TCPStore(  # type: ignore[attr-defined]
            host_name=addr, port=0, is_master=True, multi_tenant=True
        )

    return elastic_framework(
        "torch",
        store_timeout_error=dist.DistStoreError,
        round_prefix="torch.rendezvous/{run_id}/{round}",
        written_once=("MASTER_ADDR", "MASTER_PORT", "torchelastic/role_info/", "torchelastic/assigned_ranks/"),
        create_store_server=server,
    )


class TorchKubernetesStore(dist.Store):  # type: ignore[misc,name-defined]
    """A ``torch.distributed.Store`` backed by a ``KubernetesStore`` (or a round's prefix view of it).

    It behaves as torch's own TCPStore and HashStore do: blocking ``get`` and ``wait`` use the timeout
    torch set on this store (``set_timeout``) unless given one and raise ``DistStoreError`` when it runs
    out. torch's C++ trampoline calls a Python store's methods by their C++ names where those differ
    (``getNumKeys``, ``deleteKey``), so those names are here too.
    """

    def __init__(self, store: KubernetesStore | KubernetesPrefixStore) -> None:
        super().__init__()
        self._kv = store
        self._clones: list[TorchKubernetesStore] = []

    def _timeout(self, timeout: Any = None) -> Any:  # seconds or a timedelta, as the store takes them
        return timeout if timeout is not None else getattr(self, "timeout", None)

    def set(self, key: str, value: str | bytes) -> None:
        self._kv.set(key, value)

    def get(self, key: str) -> bytes:
        return self._kv.get(key, self._timeout())  # raises torch's DistStoreError (create_backend sets it)

    def add(self, key: str, value: int) -> int:
        return self._kv.add(key, value)

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        expected = expected_value.encode() if isinstance(expected_value, str) else bytes(expected_value)
        swapped, current = self._kv.compare_and_swap(key, expected, desired_value)
        if swapped:
            return desired_value.encode() if isinstance(desired_value, str) else bytes(desired_value)
        # A missing key and a non-empty ``expected``: torch's stores answer ``expected``, not b"".
        return expected if current == b"" and not self._kv.has(key) else current

    def clone(self) -> TorchKubernetesStore:
        """A new handle on the same store (torch's stores clone for another thread; ours is thread-safe).

        The clone stays referenced by this store: C++ holds only the C++ half of a Python store, and
        its Python methods are found through the Python object, which must outlive C++'s use of it.
        """
        copy = TorchKubernetesStore(self._kv)
        copy.set_timeout(self.timeout)
        self._clones.append(copy)
        return copy

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

    # The C++ names torch's trampoline calls (see the class docstring).
    deleteKey = delete_key
    getNumKeys = num_keys

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, as ``KubernetesPrefixStore.multi_get`` reads them (written-once ones: the watch)."""
        return self._kv.multi_get(keys, self._timeout())

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        """Set ``keys``, as ``KubernetesPrefixStore.multi_set`` writes them (written-once keys in one bundle)."""
        self._kv.multi_set(keys, values)

    def append(self, key: str, value: str | bytes) -> None:
        self._kv.append(key, value)


class RendezvousClosedExit(SystemExit):
    """Raised by ``next_rendezvous`` when this run ended (a person closed it, or it finished): exit status 0.

    torch 2.15's agent catches ``RendezvousGracefulExitError`` and returns None from ``run()``, and
    ``launch_agent`` then fails on ``None.is_failed()``, so stock torchrun exits 1 on a close (pytorch#194710,
    fix #194711 open). A ``SystemExit`` passes the agent's ``except`` clauses, still runs its ``finally``
    (workers stopped, the handler shut down), and torchrun's ``@record`` turns ``SystemExit(0)`` into a
    return: torchrun exits 0, as tensorplay's launcher does, without a patch of torch.
    """

    def __init__(self, message: str) -> None:
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


class TorchKubernetesRendezvousHandler(NativeHandler, RendezvousHandler):
    """The ``k8s`` handler for torch's elastic agent (``native.NativeHandler``); each round's store is a torch Store."""

    def next_rendezvous(self) -> Any:
        """``NativeHandler.next_rendezvous``; a closed run raises ``RendezvousClosedExit`` (exit 0) instead.

        Raises:
            RendezvousClosedExit: this run ended (closed by a person, deleted, or finished).
        """
        try:
            return super().next_rendezvous()
        except self.framework.graceful_exit_error as exc:
            raise RendezvousClosedExit(str(exc)) from exc

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
    return TorchKubernetesRendezvousHandler.from_parameters(params, torch_framework())
