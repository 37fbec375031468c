"""Read the framework's own state pickle with a type check (pure, no I/O).

tensorplay's and torch's state holders hand ``set_state`` the bytes of
``pickle.dumps(_RendezvousState)``: a pickle made by this very process, never read from the
API (the API holds the JSON state document only). ``load_own_state`` unpickles it with
``find_class`` limited to the framework's two state classes and ``datetime``, so bytes that are
not a rendezvous state (``b"x"``, another object) get a clear error instead of being stored.

Not guaranteed: this is a type check, not a security boundary. Nothing read from Kubernetes
is ever given to it.
"""

from __future__ import annotations

import datetime
import io
import pickle
from collections.abc import Mapping
from typing import Any

_DATETIME_GLOBALS = frozenset({"datetime", "timezone", "timedelta"})


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, classes: Mapping[tuple[str, str], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._classes = classes

    def find_class(self, module: str, name: str) -> Any:
        if module == "datetime" and name in _DATETIME_GLOBALS:
            return getattr(datetime, name)
        if (module, name) in self._classes:
            return self._classes[(module, name)]
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a rendezvous state never does")


def load_own_state(data: bytes, state_class: type, node_class: type) -> Any:
    """Return the ``state_class`` instance pickled in ``data`` by this process.

    Raises:
        ValueError: ``data`` is not a pickled ``state_class`` (the message says what it is).
    """
    classes = {(cls.__module__, cls.__qualname__): cls for cls in (state_class, node_class)}
    try:
        value = _StateUnpickler(bytes(data), classes).load()
    except Exception as exc:
        raise ValueError(
            f"set_state takes the bytes of a pickled {state_class.__name__} ({len(data)} bytes given are not one: "
            f"{type(exc).__name__}: {exc}); the Kubernetes backend stores rendezvous states only, as a typed document"
        ) from exc
    if not isinstance(value, state_class):
        raise ValueError(f"set_state takes a pickled {state_class.__name__}, got a pickled {type(value).__name__}")
    return value
