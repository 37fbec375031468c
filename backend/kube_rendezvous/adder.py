"""The combining ``add`` of a ``KubernetesStore``: the I/O around the pure fold of ``adds``.

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
import time
import uuid
from collections.abc import Callable

from .adds import (
    ADDS_ANNOTATION,
    ADDS_TO_LABEL,
    FOLD_PATIENCE_SECONDS,
    counter_digest,
    encode,
    fold,
    folded,
    request_name,
)
from .kubeapi import ApiError, ApiUnavailableError, NotFoundError, backoff
from .store import CONFLICT_BACKOFF_BASE, CONFLICT_BACKOFF_MAX, KubernetesStore
from .watchcache import WatchCache

logger = logging.getLogger(__name__)

#: Seconds an adder that lost a fold waits for its watch to show a newer counter before it lists the
#: keys again (the watch lags: an API server whose watch cache fell behind etcd shows nothing new).
STALE_COUNTER_SECONDS = 5.0


def _changed_since(cache: WatchCache, changes: int) -> Callable[[], bool]:
    return lambda: cache.changes != changes


class CombinedAdd:
    """An ``add`` to ``key`` by an add request that one fold writes into the counter with all others pending."""

    def __init__(self, store: KubernetesStore, cache: WatchCache, key: str | bytes, round_number: int | None) -> None:
        assert store._keys is not None  # a combined add runs only on the key watch
        self.store, self.cache, self.index = store, cache, store._keys.adds
        self.key, self.round_number = key, round_number
        self.counter = store._name(key)
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
                body = self.store._new_object(self.key, self.round_number, str(step).encode())
                body["metadata"]["name"] = request_name(self.counter, request_id)
                body["metadata"]["labels"][ADDS_TO_LABEL] = self.digest
                self.store._post_once(body)
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
            self.store._call("DELETE", f"{self.store._collection}/{request_name(self.counter, request_id)}")
        except NotFoundError:
            pass
        except (ApiError, ApiUnavailableError) as exc:  # it goes with the counter, the round or the Rendezvous
            logger.info("could not delete the add request %s of %s: %s", request_id, self.store._key(self.counter), exc)

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
                raise store.timeout_error(f"KubernetesStore: add({store._key(self.key)!r}) was not folded in time")
            shown = cache.get(self.counter)
            shown_version = None if shown is None else str(shown["metadata"].get("resourceVersion"))
            if lost_on is not None and lost_on[0] == shown_version and now - lost_on[1] >= STALE_COUNTER_SECONDS:
                store.stats["stale_refreshes"] += 1  # folding on it again can only lose: list afresh
                logger.info(
                    "the watch of %s still shows the counter a fold lost on; listing again", store._key(self.key)
                )
                cache.refresh()
                lost_on = (shown_version, now)
            elif cache.healthy and (index.first_pending(self.digest) == request_id or now >= patience):
                outcome = self._fold()
                if outcome is False:  # another fold came first: wait for the watch to show it
                    lost += 1
                    store.stats["conflicts"] += 1
                    patience = now + backoff(lost + 1, CONFLICT_BACKOFF_BASE, CONFLICT_BACKOFF_MAX)
                    if lost_on is None or lost_on[0] != shown_version:
                        lost_on = (shown_version, now)
                elif outcome is None:
                    patience = now + FOLD_PATIENCE_SECONDS * random.uniform(1, 2)
            wait = min(deadline, patience) - time.monotonic()
            cache.wait_for(_changed_since(cache, cache.changes), wait if wait > 0 else 0.5)

    def _fold(self) -> bool | None:
        """Fold every pending add request on the counter into it: True when written, False when another
        write came first (or the outcome is unknown), None when nothing was pending."""
        shown = self.cache.get(self.counter)
        counter = copy.deepcopy(shown) if shown is not None else None
        done = folded(counter)
        pending, present = self.index.pending(self.digest, done)
        if not pending:
            return None
        current = None if counter is None else self.store._value_of(counter)
        value, done = fold(self.store._key(self.key), current, done, pending, present)
        self.store.stats["folds"] += 1
        attempt = uuid.uuid4().hex[:12]
        extra = {ADDS_ANNOTATION: encode(done)}
        written = self.store._write(self.key, counter, str(value).encode(), attempt, self.round_number, extra)
        return isinstance(written, dict)
