"""The combining ``add`` of a ``KubernetesStore``: the I/O around the pure fold of ``adder_rules``.

``KubernetesStore.add`` comes here when the process's watch of the keys is healthy. The call creates an
add request of its own (a RendezvousKey labelled with its counter, which never conflicts), then waits on
the watch until a fold has written its request into the counter, folding itself when its request is the
first pending one or its patience ran out (``FOLD_PATIENCE_SECONDS``: the folder died), and deletes the
request once it read its value. A fold is a compare-and-swap of the counter; a lost one backs off as the
store's writes do, and a watch that still shows the counter a fold lost on ``STALE_COUNTER_SECONDS`` later
lists the keys again.

Not guaranteed: an add request whose adder died stays (folded) until its counter, its round or the
Rendezvous goes; an add racing a ``delete_key`` of its counter while this process's watch is relisting
may apply to the re-created counter as well.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, Protocol

from .._kube.kubeapi import KubernetesApiError, NotFoundError
from .._kube.watchcache import WatchCache
from .._rules.adder_rules import (
    ADDS_ANNOTATION,
    ADDS_TO_LABEL,
    FOLD_PATIENCE_SECONDS,
    AddRequest,
    counter_digest,
    encode,
    fold,
    folded,
    request_name,
    request_of,
)
from .._rules.counters import Counters
from .._rules.retries import KEY_CONFLICT_RETRY

logger = logging.getLogger(__name__)

#: Seconds an adder that lost a fold waits for its watch to show a newer counter before it lists the
#: keys again (the watch lags: an API server whose watch cache fell behind etcd shows nothing new).
STALE_COUNTER_SECONDS = 5.0
#: Seconds an adder waits for its watch to change when its deadline or its patience is past already: the next look
#: raises or folds; with the watch unhealthy (no fold) it looks again this often instead of spinning.
PAST_DUE_WAIT_SECONDS = 0.5


class AddIndex:
    """What one process's watch of a Rendezvous's keys shows about adds, kept by its events.

    The pending add requests of each counter, and the results of the requests this process
    waits for, recorded from every version of the counter the watch delivers (a waiter woken
    late still learns a result that a later version dropped). ``changed`` is called from the
    watch thread for every object that changed (None after a list); the rest from adders.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Per counter digest: request id -> request, for every request object shown.
        self._requests: dict[str, dict[str, AddRequest]] = {}
        #: Per counter digest: the folded map of the counter as last shown (only counters waited on).
        self._done: dict[str, dict[str, int]] = {}
        #: Request ids this process waits for -> counter digest.
        self._waiting: dict[str, str] = {}
        #: Results of waited-for requests, as soon as any shown version of the counter had them.
        self._results: dict[str, int] = {}

    def expect(self, request_id: str, digest: str) -> None:
        with self._lock:
            self._waiting[request_id] = digest

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._waiting.pop(request_id, None)
            self._results.pop(request_id, None)

    def result(self, request_id: str) -> int | None:
        with self._lock:
            return self._results.get(request_id)

    def shown(self, digest: str, request_id: str) -> bool:
        """Whether the watch shows the request object (False once it was deleted)."""
        with self._lock:
            return request_id in self._requests.get(digest, {})

    def pending(self, digest: str, done: Mapping[str, int]) -> tuple[list[AddRequest], set[str]]:
        """The requests shown for ``digest`` that ``done`` lacks, and the ids of every request shown."""
        with self._lock:
            shown = dict(self._requests.get(digest, {}))
        pending = [request for request_id, request in sorted(shown.items()) if request_id not in done]
        return pending, set(shown)

    def first_pending(self, digest: str) -> str | None:
        """The smallest id of a request shown for ``digest`` and not yet folded (its adder folds)."""
        with self._lock:
            done = self._done.get(digest, {})
            ids = [request_id for request_id in self._requests.get(digest, {}) if request_id not in done]
        return min(ids) if ids else None

    def changed(self, obj: Mapping[str, Any] | None, present: bool, objects: Iterable[Mapping[str, Any]] = ()) -> None:
        """Record a change: ``obj`` now shown (``present``) or deleted; None: rebuild from ``objects``."""
        with self._lock:
            if obj is None:
                self._requests = {}
                self._done = {}
                for each in objects:
                    self._record(each, True)
                return
            self._record(obj, present)

    def _record(self, obj: Mapping[str, Any], present: bool) -> None:
        found = request_of(obj)
        if found is not None:
            digest, request = found
            if present:
                self._requests.setdefault(digest, {})[request.id] = request
            else:
                requests = self._requests.get(digest, {})
                requests.pop(request.id, None)
                if not requests:
                    self._requests.pop(digest, None)
            return
        name = str((obj.get("metadata") or {}).get("name") or "")
        if ".k-" not in name:
            return
        digest = counter_digest(name)
        if digest not in self._waiting.values():
            self._done.pop(digest, None)
            return
        done = folded(obj) if present else {}
        self._done[digest] = done
        for request_id, waited in self._waiting.items():
            if waited == digest and request_id in done:
                self._results.setdefault(request_id, done[request_id])


class KeyObjects(Protocol):
    """What a combined add needs of its store (``store.KubernetesStore`` is one): the store's public
    interface to its key objects, one RendezvousKey object per key."""

    @property
    def timeout(self) -> timedelta: ...

    timeout_error: type[Exception]
    stats: Counters

    @property
    def adds(self) -> AddIndex:
        """The process's index of add requests and fold results of this store's keys (from its key watch)."""
        ...

    def object_name(self, key: str | bytes) -> str:
        """The name of the object that holds ``key``."""
        ...

    def key_text(self, key: str | bytes) -> str:
        """``key`` as text (bytes are UTF-8)."""
        ...

    def value_of(self, obj: dict[str, Any]) -> bytes:
        """The value a key object holds."""
        ...

    def new_key_object(self, key: str | bytes, round_number: int | None, value: bytes = b"") -> dict[str, Any]:
        """The body of a new object that holds ``value`` at ``key`` (not created)."""
        ...

    def create_once(self, body: dict[str, Any]) -> None:
        """Create ``body`` (an object named for one write), retried while the API server is unreachable, and
        show it on the key watch at once (also when an earlier attempt, whose answer was lost, created it)."""
        ...

    def delete_object(self, name: str) -> None:
        """Delete the key object ``name``, retried while the API server is unreachable.

        Raises:
            NotFoundError: it does not exist.
        """
        ...

    def write_key(
        self,
        key: str | bytes,
        obj: dict[str, Any] | None,
        value: bytes,
        attempt: str,
        round_number: int | None,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any] | bool:
        """One compare-and-swap write of ``key`` over ``obj`` as read (None: create it): the written object,
        False when another write came first, True when the outcome is unknown."""
        ...


def _changed_since(cache: WatchCache, changes: int) -> Callable[[], bool]:
    return lambda: cache.changes != changes


class CombinedAdd:
    """An ``add`` to ``key`` by an add request that one fold writes into the counter with all others pending."""

    def __init__(self, store: KeyObjects, cache: WatchCache, key: str | bytes, round_number: int | None) -> None:
        self.store, self.cache, self.index = store, cache, store.adds
        self.key, self.round_number = key, round_number
        self.counter = store.object_name(key)
        self.digest = counter_digest(self.counter)

    def add(self, step: int) -> int:
        """Add ``step`` to the counter; return its value right after this add."""
        deadline = time.monotonic() + self.store.timeout.total_seconds()
        while True:
            request_id = uuid.uuid4().hex[:12]
            self.index.expect(request_id, self.digest)
            shown = self.cache.get(self.counter)
            self.index.changed(shown if shown is not None else {"metadata": {"name": self.counter}}, shown is not None)
            try:
                body = self.store.new_key_object(self.key, self.round_number, str(step).encode())
                body["metadata"]["name"] = request_name(self.counter, request_id)
                body["metadata"]["labels"][ADDS_TO_LABEL] = self.digest
                self.store.create_once(body)
                result = self._await_fold(request_id, deadline)
            except BaseException:  # not a value at the key, or timed out: the request must not fold later
                self._delete_request(request_id)
                raise
            finally:
                self.index.forget(request_id)
            if result is not None:
                self._delete_request(request_id)
                return result
            # The request was deleted unfolded (``delete_key`` of the counter): add to the key as it is now.

    def _delete_request(self, request_id: str) -> None:
        try:
            self.store.delete_object(request_name(self.counter, request_id))
        except NotFoundError:
            pass
        except KubernetesApiError as exc:  # it goes with the counter, the round or the Rendezvous
            logger.info(
                "could not delete the add request %s of %s: %s", request_id, self.store.key_text(self.counter), exc
            )

    def _await_fold(self, request_id: str, deadline: float) -> int | None:
        """The counter's value after request ``request_id``, once folded (by this adder or another);
        None if the request was deleted unfolded."""
        store, cache, index = self.store, self.cache, self.index
        patience = time.monotonic() + FOLD_PATIENCE_SECONDS * random.uniform(1, 2)
        lost = 0
        #: The counter's resourceVersion a fold lost on, and when: a watch still showing it later lags.
        lost_on: tuple[str | None, float] | None = None
        while True:
            gone = not index.shown(self.digest, request_id)
            result = index.result(request_id)  # after ``gone``: a fold is recorded before the deletion
            if result is not None:
                return result
            if gone and cache.healthy:
                return None
            now = time.monotonic()
            if now > deadline:
                raise store.timeout_error(f"KubernetesStore: add({store.key_text(self.key)!r}) was not folded in time")
            shown = cache.get(self.counter)
            shown_version = None if shown is None else str(shown["metadata"].get("resourceVersion"))
            if lost_on is not None and lost_on[0] == shown_version and now - lost_on[1] >= STALE_COUNTER_SECONDS:
                store.stats.add("stale_refreshes")  # folding on it again can only lose: list afresh
                logger.info(
                    "the watch of %s still shows the counter a fold lost on; listing again", store.key_text(self.key)
                )
                cache.refresh()
                lost_on = (shown_version, now)
            elif cache.healthy and (index.first_pending(self.digest) == request_id or now >= patience):
                outcome = self._fold()
                if outcome is False:  # another fold came first: wait for the watch to show it
                    lost += 1
                    store.stats.add("conflicts")
                    patience = now + KEY_CONFLICT_RETRY.delay(lost)
                    if lost_on is None or lost_on[0] != shown_version:
                        lost_on = (shown_version, now)
                elif outcome is None:
                    patience = now + FOLD_PATIENCE_SECONDS * random.uniform(1, 2)
            wait = min(deadline, patience) - time.monotonic()
            cache.wait_for(_changed_since(cache, cache.changes), wait if wait > 0 else PAST_DUE_WAIT_SECONDS)

    def _fold(self) -> bool | None:
        """Fold every pending add request on the counter into it: True when written, False when another
        write came first (or the outcome is unknown), None when nothing was pending."""
        shown = self.cache.get(self.counter)
        counter = copy.deepcopy(shown) if shown is not None else None
        done = folded(counter)
        pending, present = self.index.pending(self.digest, done)
        if not pending:
            return None
        current = None if counter is None else self.store.value_of(counter)
        value, done = fold(self.store.key_text(self.key), current, done, pending, present)
        self.store.stats.add("folds")
        attempt = uuid.uuid4().hex[:12]
        extra = {ADDS_ANNOTATION: encode(done)}
        written = self.store.write_key(self.key, counter, str(value).encode(), attempt, self.round_number, extra)
        return isinstance(written, dict)
