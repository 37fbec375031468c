"""``KubernetesPrefixStore``: a view of a ``KubernetesStore`` under a key prefix (a round's store).

Not guaranteed: a pipelined set whose process dies before a flush may be lost, and another client may
not see a pipelined set yet when the caller's ``set`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

from .store import SETS_IN_FLIGHT, KubernetesStore

#: Seconds a pipelined view gathers sets of written-once keys before it writes them as one bundle
#: (any other call through the view writes them at once).
BATCH_LINGER_SECONDS = 0.05
_name = KubernetesStore.key_text  # a key as str (bytes are UTF-8)


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

    ``written_once``: prefixes (under the view's) of keys written once and never again; their reads are
    answered by the process's watch (``KubernetesStore.get_written_once``), and their pipelined sets are
    gathered for ``BATCH_LINGER_SECONDS`` and written together, as bundles (``KubernetesStore.write_once``):
    rank 0 publishing N agents' ranks costs one request, not N.
    """

    def __init__(
        self,
        prefix: str,
        store: KubernetesStore,
        round_number: int | None = None,
        on_write: Callable[[str], None] | None = None,
        pipelined: bool = False,
        written_once: tuple[str, ...] = (),
    ) -> None:
        self.prefix = prefix
        self.underlying_store = store
        self.round_number = round_number
        #: Called with the key (without the prefix) of every write, before it is sent.
        self.on_write = on_write
        self.written_once = written_once
        self._pool = ThreadPoolExecutor(SETS_IN_FLIGHT, thread_name_prefix="store set") if pipelined else None
        self._lock = threading.Lock()
        self._pending: dict[str, Future[None]] = {}
        self._batch: dict[str, bytes | str] = {}  # written-once sets not sent yet, by full key
        self._linger: threading.Timer | None = None

    def _once(self, *keys: str | bytes) -> bool:
        """Whether there are ``keys`` and all are written once."""
        return bool(keys and self.written_once) and all(_name(key).startswith(self.written_once) for key in keys)

    def _k(self, key: str | bytes, written: bool = False) -> str:
        name = _name(key)
        if written and self.on_write is not None:
            self.on_write(name)
        self.flush()
        return f"{self.prefix}/{name}"

    def _send_batch(self) -> None:
        """Send the gathered written-once sets, as bundles, in the background."""
        with self._lock:
            batch, self._batch = self._batch, {}
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
            if not batch or self._pool is None:
                return
            future = self._pool.submit(
                self.underlying_store.write_once, list(batch), list(batch.values()), round_number=self.round_number
            )
            self._pending.update(dict.fromkeys(batch, future))

    def flush(self) -> None:
        """Wait for every pending set; raise the first failure."""
        self._send_batch()
        with self._lock:
            pending, self._pending = self._pending, {}
        failures = [future.exception() for future in set(pending.values())]
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
        name = _name(key)
        full = f"{self.prefix}/{name}"
        if self._pool is None or full in self._pending:
            self.underlying_store.set(self._k(key, True), value, round_number=self.round_number)
            return
        if self.on_write is not None:
            self.on_write(name)
        with self._lock:
            if self._once(name):
                self._batch[full] = value
                if self._linger is None:
                    self._linger = threading.Timer(BATCH_LINGER_SECONDS, self._send_batch)
                    self._linger.daemon = True
                    self._linger.start()
                return
            set_one = self.underlying_store.set
            self._pending[full] = self._pool.submit(set_one, full, value, round_number=self.round_number)

    def get(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        if self._once(key):
            return self.underlying_store.get_written_once(self._k(key), timeout)
        return self.underlying_store.get(self._k(key), timeout)

    def get_written_once(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        return self.underlying_store.get_written_once(self._k(key), timeout)

    def multi_get(self, keys: Iterable[str | bytes], timeout: float | timedelta | None = None) -> list[bytes]:
        keys = list(keys)
        once = self._once(*keys)
        names = [self._k(key) for key in keys]
        return self.underlying_store.multi_get(names, timeout, round_number=self.round_number, written_once=once)

    def multi_set(self, keys: Iterable[str | bytes], values: Iterable[str | bytes]) -> None:
        keys = list(keys)
        names = [self._k(key, True) for key in keys]
        if self._once(*keys):
            self.underlying_store.write_once(names, values, round_number=self.round_number)
        else:
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
