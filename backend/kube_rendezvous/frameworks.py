"""What the framework-neutral core needs from an elastic framework: tensorplay's or torch's.

The state document, the backend, the store, the intents and the operator are one core. A
framework's adapter (``handler`` for tensorplay, ``torchrun`` for torch) hands the core a
``Framework``: the framework's own state classes (the backend builds them from validated values)
and its own error classes (its handler catches those, not ours). tensorplay and torch name them
alike, because tensorplay's elastic package is a clone of torch's.

Nothing here imports a framework until a ``Framework`` is asked for, and never both: tensorplay and
torch cannot share a process (their extensions register the same pybind types; the second aborts).

**The join loop's poll.** Both frameworks' op executors sleep 1 s (``_delay(1)``) every time the
state holds nothing for them to do (``SYNC``), then read the state again. Our backend can wait on
the process's watch instead, until something the loop decides on changes, so that sleep only adds
up to 1 s to every round (an agent sees its round formed up to 1 s late). ``Framework`` wraps the
executor module's ``_delay``: in a thread whose backend said its reads can wait on a watch
(``next_read_waits``) the 1 s sleep is skipped and the next read waits for a change instead
(``poll_skipped``); everywhere else (another backend, a watch that is down) the sleep is kept.
A read that no poll precedes (the first of an operation, one after a lost compare-and-swap) never
waits. Not guaranteed: it relies on the executor module's name ``_delay``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Framework:
    """An elastic framework, as the core sees it.

    Attributes:
        name: ``tensorplay`` or ``torch``.
        state_class: its ``_RendezvousState``; ``node_class``: its ``_NodeDesc``.
        state_error, connection_error, closed_error, graceful_exit_error: its
            ``RendezvousStateError``, ``RendezvousConnectionError``, ``RendezvousClosedError`` and
            ``RendezvousGracefulExitError``.
        store_timeout_error: what its stores raise when a blocking get times out (its code catches it).
        rendezvous_error: its ``RendezvousError`` base.
        exit_op_class, join_op_class: its ``_RendezvousExitOp`` and ``_RendezvousJoinOp``.
        info_class, store_info_class: its ``RendezvousInfo`` and ``RendezvousStoreInfo``.
        delay: its ``rendezvous.utils._delay``.
        record_failure: records a failed backend creation in its event log (message, run id).
    """

    name: str
    state_class: type
    node_class: type
    state_error: type[Exception]
    connection_error: type[Exception]
    closed_error: type[Exception]
    graceful_exit_error: type[Exception]
    store_timeout_error: type[Exception]
    rendezvous_error: type[Exception]
    exit_op_class: Any
    join_op_class: Any
    info_class: Any
    store_info_class: Any
    delay: Callable[..., None]
    record_failure: Callable[[str, str], None]


#: Per thread: ``waits``, whether the backend's reads can wait on a watch; ``polled``, whether the
#: join loop has just skipped its poll, so that the next read waits for a change.
_THREAD = threading.local()
#: The seconds of the framework's join-loop poll (``_delay(1)`` after a ``SYNC``).
POLL_SECONDS = 1
#: The join-loop polls of this process: ``slept`` (the framework's 1 s sleep) and ``skipped``.
POLLS = {"slept": 0, "skipped": 0}


def next_read_waits(waits: bool) -> None:
    """Record whether this thread's backend can wait on a watch at its next read (the loop's poll is then skipped)."""
    _THREAD.waits = waits


def poll_skipped() -> bool:
    """Whether this thread's join loop has just skipped its poll, so its read must wait for a change (cleared)."""
    skipped = bool(getattr(_THREAD, "polled", False))
    _THREAD.polled = False
    return skipped


def watch_aware_delay(delay: Callable[..., None]) -> Callable[..., None]:
    """``delay`` without the join loop's 1 s poll in a thread whose backend's next read waits on a watch."""
    if getattr(delay, "watch_aware", False):
        return delay

    def wrapped(seconds: Any) -> None:
        waits = bool(getattr(_THREAD, "waits", False))
        _THREAD.waits = False
        if seconds == POLL_SECONDS:
            POLLS["skipped" if waits else "slept"] += 1
            if waits:
                _THREAD.polled = True
                return
        delay(seconds)

    wrapped.watch_aware = True  # type: ignore[attr-defined]
    return wrapped


def _framework(name: str, package: str, store_timeout_error: type[Exception]) -> Framework:
    import importlib

    api: Any = importlib.import_module(f"{package}.distributed.elastic.rendezvous.api")
    dynamic: Any = importlib.import_module(f"{package}.distributed.elastic.rendezvous.dynamic_rendezvous")
    events: Any = importlib.import_module(f"{package}.distributed.elastic.events")
    utils: Any = importlib.import_module(f"{package}.distributed.elastic.rendezvous.utils")
    dynamic._delay = watch_aware_delay(dynamic._delay)  # see the module docstring: the join loop's poll

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
        store_timeout_error=store_timeout_error,
        rendezvous_error=api.RendezvousError,
        exit_op_class=dynamic._RendezvousExitOp,
        join_op_class=dynamic._RendezvousJoinOp,
        info_class=api.RendezvousInfo,
        store_info_class=api.RendezvousStoreInfo,
        delay=utils._delay,
        record_failure=record_failure,
    )


@functools.cache
def tensorplay() -> Framework:
    """tensorplay 1.0.0's elastic package (``kube-rendezvous[tensorplay]``)."""
    from tensorplay.distributed._store import StoreTimeoutError

    return _framework("tensorplay", "tensorplay", StoreTimeoutError)


@functools.cache
def torch() -> Framework:
    """torch's elastic package (``kube-rendezvous[torch]``)."""
    import torch.distributed

    return _framework("torch", "torch", torch.distributed.DistStoreError)
