"""What the framework-neutral core needs from an elastic framework (``Framework``), in the core's own terms.

The native handler (``native``), the CAS backend (``backend``) and the store are one core. A
framework's adapter (``_adapters.tensorplay`` for tensorplay, ``_adapters.torchrun`` for torch) builds a
``Framework`` from what it knows of its framework and hands it to the core: the framework's own classes
(the CAS backend builds its state classes from validated values; the handler returns its
``RendezvousInfo``) and its own error classes (its agent catches those, not ours), as opaque values.

The engine imports no framework: only the adapters do (``tests/test_seams.py`` checks it), and a process
loads one of them at most, because tensorplay and torch cannot share a process (their extensions register
the same pybind types; the second aborts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._kube.kubeapi import ApiError, KubernetesApiError, describe_api_error


@dataclass(frozen=True)
class Framework:
    """An elastic framework, as the core sees it.

    ``name`` is ``tensorplay`` or ``torch``; the classes and errors are the framework's own (its adapter takes
    them from its modules: ``_adapters.elastic.elastic_framework``).

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
