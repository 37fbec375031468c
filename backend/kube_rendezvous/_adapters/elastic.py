"""What both framework adapters know alike: the ``Framework`` of an elastic package, read from its modules.

tensorplay's elastic package is a clone of torch's, so the classes and errors the engine needs have the same
names in both (``<name>.distributed.elastic...``), private ones included (``_RendezvousState``, ``_NodeDesc``,
``_TERMINAL_STATE_SYNC_ID``): those names are read here, in the adapters, and the engine receives them as
values of its own ``Framework``. Each adapter adds what differs (its store's timeout error, its key prefixes,
its bootstrap store server): ``tensorplay.tensorplay_framework`` and ``torchrun.torch_framework``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .._engine.frameworks import Framework


def elastic_framework(
    name: str,
    *,
    store_timeout_error: type[Exception],
    round_prefix: str,
    written_once: tuple[str, ...],
    create_store_server: Callable[[str], Any],
) -> Framework:
    """The ``Framework`` of the elastic package of ``name`` (``tensorplay`` or ``torch``), which must be installed."""
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
