"""Refuse rendezvous states that would run code when unpickled (pure, no I/O, no tensorplay).

tensorplay stores its rendezvous state as a pickle, and unpickling runs whatever callables the
pickle names. Anyone who can write ``Rendezvous.status`` could otherwise run code in every
pod. ``check_state_pickle`` unpickles with ``find_class`` restricted to the few globals a
genuine state uses, so a hostile pickle fails on its first forbidden global, before any of it
runs. The operator calls it with stand-in classes and so never imports tensorplay.
"""

from __future__ import annotations

import datetime
import io
import pickle
from collections.abc import Mapping
from typing import Any

RENDEZVOUS_MODULE = "tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous"
#: The globals a genuine tensorplay rendezvous state refers to.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (RENDEZVOUS_MODULE, "_RendezvousState"),
        (RENDEZVOUS_MODULE, "_NodeDesc"),
        ("datetime", "datetime"),
        ("datetime", "timezone"),
        ("datetime", "timedelta"),
    }
)


class ForbiddenGlobalError(pickle.UnpicklingError):
    """The pickle names a callable outside the allow-list: it is not a genuine rendezvous state."""


class _StandIn:
    """Takes the place of a tensorplay class when checking without tensorplay."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, classes: Mapping[tuple[str, str], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._classes = classes

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise ForbiddenGlobalError(
                f"the rendezvous state refers to {module}.{name}, which a tensorplay rendezvous state never does; "
                "it was written by something else and is refused unread"
            )
        if module == "datetime":
            return getattr(datetime, name)
        return self._classes.get((module, name), _StandIn)


def check_state_pickle(data: bytes, classes: Mapping[tuple[str, str], Any] | None = None) -> Any:
    """Unpickle ``data`` allowing only ``ALLOWED_GLOBALS``; return the object.

    Args:
        data: the state bytes.
        classes: the real classes to build for the tensorplay globals; stand-ins when None.

    Raises:
        ForbiddenGlobalError: the pickle names any other global (nothing of it has run).
        pickle.UnpicklingError, EOFError, ValueError, ...: ``data`` is not a valid pickle.
    """
    return _RestrictedUnpickler(data, classes or {}).load()
