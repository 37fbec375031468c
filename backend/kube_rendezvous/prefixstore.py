"""``KubernetesPrefixStore``: a view of a ``KubernetesStore`` under a key prefix (a round's store).

Every call goes to the underlying store with ``prefix/key``, and a write made through a view for a round
carries that round's label. Optionally pipelined: sets are sent ``SETS_IN_FLIGHT`` at a time and the next
other call waits for them.

Not guaranteed: a pipelined set whose process dies before a flush may be lost, and another client may
not see a pipelined set yet when the caller's ``set`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

from .store import SETS_IN_FLIGHT, KubernetesStore


class KubernetesPrefixStore:
    """A view of a ``KubernetesStore`` whose keys are ``prefix + "/" + key``.

    tensorplay's C++ ``PrefixStore`` refuses Python stores, so the handler uses this one. Keys written
    through a view made for a round carry that round's label, which lets the store delete the keys of
    finished rounds, and lets ``multi_get`` read the round's keys in one LIST.

    ``pipelined``: a ``set`` returns once it is sent (``SETS_IN_FLIGHT`` at a time), not once it is
    stored; any other call through the view, and ``flush``, first waits for every pending set and
    raises the first failure, and a second set of a key waits for the first. So what the caller does
    next through the view sees its writes, while N sets in a row (rank 0 publishing every agent's
    ranks, one by one, in tensorplay's agent) cost about one round trip per ``SETS_IN_FLIGHT``.
    Not guaranteed: a set whose process dies before a flush may be lost (as a set whose answer never
    came); another client may not see it yet when the caller's ``set`` returns.
    """

    def __init__(
        self,
        prefix: str,
        store: KubernetesStore,
        round_number: int | None = None,
        on_write: Callable[[str], None] | None = None,
        pipelined: bool = False,
    ) -> None:
        self.prefix = prefix
        self.underlying_store = store
        self.round_number = round_number
        #: Called with the key (without the prefix) of every write, before it is sent.
        self.on_write = on_write
        self._pool = ThreadPoolExecutor(SETS_IN_FLIGHT, thread_name_prefix="store set") if pipelined else None
        self._pending: dict[str, Future[None]] = {}

    def _k(self, key: str | bytes, written: bool = False) -> str:
        name = key if isinstance(key, str) else key.decode("utf-8")
        if written and self.on_write is not None:
            self.on_write(name)
        self.flush()
        return f"{self.prefix}/{name}"

    def flush(self) -> None:
        """Wait for every pending set; raise the first failure."""
        pending, self._pending = self._pending, {}
        failures = [future.exception() for future in pending.values()]
        failure = next((exc for exc in failures if exc is not None), None)
        if failure is not None:
            raise failure

    @property
    def timeout(self) -> timedelta:
        return self.underlying_store.timeout

    @timeout.setter
    def timeout(self, value: float | timedelta) -> None:
        self.underlying_store.timeout = value

    def set(self, key: str | bytes, value: str | bytes) -> None:
        name = key if isinstance(key, str) else key.decode("utf-8")
        if self._pool is None or name in self._pending:
            self.underlying_store.set(self._k(key, True), value, round_number=self.round_number)
            return
        if self.on_write is not None:
            self.on_write(name)
        full = f"{self.prefix}/{name}"
        self._pending[name] = self._pool.submit(self.underlying_store.set, full, value, round_number=self.round_number)

    def get(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        return self.underlying_store.get(self._k(key), timeout)

    def get_written_once(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        return self.underlying_store.get_written_once(self._k(key), timeout)

    def multi_get(self, keys: Iterable[str | bytes], timeout: float | timedelta | None = None) -> list[bytes]:
        names = [self._k(key) for key in keys]
        return self.underlying_store.multi_get(names, timeout, round_number=self.round_number)

    def multi_set(self, keys: Iterable[str | bytes], values: Iterable[str | bytes]) -> None:
        names = [self._k(key, True) for key in keys]
        self.underlying_store.multi_set(names, values, round_number=self.round_number)

    def add(self, key: str | bytes, amount: int) -> int:
        return self.underlying_store.add(self._k(key, True), amount, round_number=self.round_number)

    def compare_and_swap(self, key: str | bytes, expected: str | bytes, desired: str | bytes) -> tuple[bool, bytes]:
        return self.underlying_store.compare_and_swap(
            self._k(key, True), expected, desired, round_number=self.round_number
        )

    def compare_set(self, key: str | bytes, expected: str | bytes, desired: str | bytes) -> bytes:
        return self.underlying_store.compare_set(self._k(key, True), expected, desired, round_number=self.round_number)

    def has(self, key: str | bytes) -> bool:
        return self.underlying_store.has(self._k(key))

    def check(self, keys: Iterable[str | bytes]) -> bool:
        return self.underlying_store.check([self._k(key) for key in keys])

    def append(self, key: str | bytes, value: str | bytes) -> None:
        self.underlying_store.append(self._k(key, True), value, round_number=self.round_number)

    def delete_key(self, key: str | bytes) -> None:
        self.underlying_store.delete_key(self._k(key))

    def num_keys(self) -> int:
        self.flush()
        return self.underlying_store.num_keys()

    def wait(self, keys: Iterable[str | bytes], timeout: float | timedelta | None = None) -> bool:
        return self.underlying_store.wait([self._k(key) for key in keys], timeout)


class WrittenOnceReads:
    """The read side of a round's store for ``RendezvousStoreInfo.build`` on ranks above 0.

    Rank 0 writes the bootstrap address once per round under the round's prefix, and nobody
    changes it, so the other ranks read it from their store's watch (``get_written_once``): no
    request each, where a GET each would be N reads at the same instant.
    """

    def __init__(self, store: KubernetesPrefixStore) -> None:
        self._store = store

    def get(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        return self._store.get_written_once(key, timeout)
