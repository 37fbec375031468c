"""What the framework-neutral core needs from an elastic framework: tensorplay's or torch's.

The native handler (``native``), the CAS backend (``backend``) and the store are one core. A
framework's adapter (``handler`` for tensorplay, ``torchrun`` for torch) hands the core a
``Framework``: the framework's own classes (the CAS backend builds its state classes from validated
values; the handler returns its ``RendezvousInfo``) and its own error classes (its agent catches
those, not ours). tensorplay and torch name them alike, because tensorplay's elastic package is a
clone of torch's.

Nothing here imports a framework until a ``Framework`` is asked for, and never both: tensorplay and
torch cannot share a process (their extensions register the same pybind types; the second aborts).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._kube.kubeapi import ApiError, KubernetesApiError, describe_api_error


@dataclass(frozen=True)
class Framework:
    """An elastic framework, as the core sees it.

    ``name`` is ``tensorplay`` or ``torch``; the classes and errors are the framework's own (``_framework``
    takes them from its modules).

    Attributes:
        store_timeout_error: what its stores raise when a blocking get times out (its code catches it).
        exit_barrier_prefix: the key prefix its agent's exit barrier writes on the rendezvous store
            (``_TERMINAL_STATE_SYNC_ID``). Both agents enter that barrier only after their workers
            succeeded: it is the launcher's own signal of success.
        round_prefix: the key prefix of one round's store (``{run_id}`` and ``{round}`` filled in).
        written_once: prefixes of the keys it writes once per round on the round's store and never again:
            the bootstrap address (``RendezvousStoreInfo.build``, rank 0) and ``_assign_worker_ranks``'s role
            descriptors (one per agent) and assigned ranks (rank 0). The round's store serves their reads
            from the process's watch and writes their sets together, in bundles.
        create_store_server: starts a bootstrap TCPStore server on an address (a free port).
        record_failure: records a failed handler creation in its event log (message, run id).
    """

    name: str
    state_class: type
    node_class: type
    state_error: type[Exception]
    connection_error: type[Exception]
    closed_error: type[Exception]
    graceful_exit_error: type[Exception]
    timeout_error: type[Exception]
    rendezvous_error: type[Exception]
    store_timeout_error: type[Exception]
    info_class: Any
    store_info_class: Any
    exit_barrier_prefix: str
    round_prefix: str
    written_once: tuple[str, ...]
    create_store_server: Callable[[str], Any]
    record_failure: Callable[[str, str], None]

    def api_failure(
        self, exc: KubernetesApiError, verb: str, resource: str, namespace: str, unreachable: str
    ) -> Exception:
        """Its ``RendezvousConnectionError`` for a failed request: a refusal described, else ``unreachable``."""
        if isinstance(exc, ApiError):
            return self.connection_error(describe_api_error(exc, verb, resource, namespace))
        return self.connection_error(unreachable)


def _framework(
    name: str,
    *,
    store_timeout_error: type[Exception],
    round_prefix: str,
    written_once: tuple[str, ...],
    create_store_server: Callable[[str], Any],
) -> Framework:
    import importlib

    api: Any = importlib.import_module(f"{name}.distributed.elastic.rendezvous.api")
    dynamic: Any = importlib.import_module(f"{name}.distributed.elastic.rendezvous.dynamic_rendezvous")
    events: Any = importlib.import_module(f"{name}.distributed.elastic.events")
    agent: Any = importlib.import_module(f"{name}.distributed.elastic.agent.server.api")

    def record_failure(message: str, run_id: str) -> None:
        events.construct_and_record_rdzv_event(message=message, run_id=run_id, node_state=events.NodeState.FAILED)

    return Framework(
        name=name,
        state_class=dynamic._RendezvousState,
        node_class=dynamic._NodeDesc,
        state_error=api.RendezvousStateError,
        connection_error=api.RendezvousConnectionError,
        closed_error=api.RendezvousClosedError,
        graceful_exit_error=api.RendezvousGracefulExitError,
        timeout_error=api.RendezvousTimeoutError,
        rendezvous_error=api.RendezvousError,
        store_timeout_error=store_timeout_error,
        info_class=api.RendezvousInfo,
        store_info_class=api.RendezvousStoreInfo,
        exit_barrier_prefix=str(agent._TERMINAL_STATE_SYNC_ID),
        round_prefix=round_prefix,
        written_once=written_once,
        create_store_server=create_store_server,
        record_failure=record_failure,
    )


@functools.cache
def tensorplay() -> Framework:
    """tensorplay 1.0.0's elastic package (``kube-rendezvous[tensorplay]``)."""
    from tensorplay.distributed import TCPStore  # type: ignore[attr-defined]
    from tensorplay.distributed._store import StoreTimeoutError

    def server(addr: str) -> Any:
        return TCPStore(addr, 0, world_size=1, is_master=True, wait_for_workers=False)

    return _framework(
        "tensorplay",
        store_timeout_error=StoreTimeoutError,
        round_prefix="tp_elastic/rendezvous/{run_id}/{round}",
        written_once=("tp_elastic/rdzv/master_", "tp_elastic/role_info/", "tp_elastic/assigned_ranks/"),
        create_store_server=server,
    )


@functools.cache
def torch() -> Framework:
    """torch's elastic package (``kube-rendezvous[torch]``)."""
    import torch.distributed as dist

    def server(addr: str) -> Any:
        return dist.TCPStore(  # type: ignore[attr-defined]
            host_name=addr, port=0, is_master=True, multi_tenant=True
        )

    return _framework(
        "torch",
        store_timeout_error=dist.DistStoreError,
        round_prefix="torch.rendezvous/{run_id}/{round}",
        written_once=("MASTER_ADDR", "MASTER_PORT", "torchelastic/role_info/", "torchelastic/assigned_ranks/"),
        create_store_server=server,
    )
