"""``Counters``: the one public stats object of the agent side (pure: a value, no I/O, no lock).

Each agent-side object counts what it did in its own ``stats``, a ``Counters`` with its names fixed when the
object is made: the API client (``KubernetesApi``: requests, conflicts, bytes, dropped pooled connections), a
watch (``WatchCache``: lists, watch restarts, events), the store (``KubernetesStore``: requests, conflicts,
wake-ups, folds), the ``k8s`` handler (``NativeHandler``: requests, self folds, ...) and the folder (folds,
writes, conflicts). Tests and benchmarks read them as a mapping (``stats["requests"]``, ``dict(stats)``: a
snapshot) through public names only (``handler.api.stats``, ``handler.rendezvous_store.stats``, ``backend.api.stats``,
``store.key_watch.cache.stats``).

Not guaranteed: exact counts under threads (a count is ``+=`` on a dict entry, not atomic; they are for
measurement, not decisions). The agent serves no metrics endpoint; a process that does (the operator's
``metrics``) may export them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class Counters(Mapping[str, int]):
    """Named counts, each 0 at first; read as a read-only mapping, counted with ``add``.

    Raises (``add``, ``[]``):
        KeyError: a name this object does not count (its names are fixed: a typo is an error, not a new count).
    """

    def __init__(self, *names: str) -> None:
        self._counts = dict.fromkeys(names, 0)

    def add(self, name: str, amount: int = 1) -> None:
        """Count ``amount`` more of ``name``."""
        self._counts[name] += amount

    def snapshot(self) -> dict[str, int]:
        """The counts now, as a new dict (``dict(counters)`` is the same)."""
        return dict(self._counts)

    def __getitem__(self, name: str) -> int:
        return self._counts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def __repr__(self) -> str:
        return f"Counters({self._counts!r})"


__all__ = ["Counters"]
