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
from collections.abc import Callable, Mapping
from typing import Any

from .adds import (
    ADDS_ANNOTATION,
    ADDS_TO_LABEL,
    FOLD_PATIENCE_SECONDS,
    AddIndex,
    counter_digest,
    encode,
    fold,
    folded,
    request_name,
)
from .kubeapi import ApiError, ApiUnavailableError, ConflictError, NotFoundError, backoff
from .store import CONFLICT_BACKOFF_BASE, CONFLICT_BACKOFF_MAX, KubernetesStore
from .watchcache import WatchCache

logger = logging.getLogger(__name__)

#: Seconds an adder that lost a fold waits for its watch to show a newer counter before it lists the
#: keys again (the watch lags: an API server whose watch cache fell behind etcd shows nothing new).
STALE_COUNTER_SECONDS = 5.0


def _changed_since(cache: WatchCache, changes: int) -> Callable[[], bool]:
    return lambda: cache.changes != changes


def _version(obj: Mapping[str, Any] | None) -> str | None:
    return None if obj is None else str(obj["metadata"].get("resourceVersion"))


def combined_add(
    store: KubernetesStore, cache: WatchCache, key: str | bytes, step: int, round_number: int | None
) -> int:
    """``add`` by an add request that one fold writes into the counter with all others pending."""
    assert store._keys is not None  # a combined add runs only on the key watch
    index = store._keys.adds
    counter_name = store._name(key)
    digest = counter_digest(counter_name)
    deadline = time.monotonic() + store.timeout.total_seconds()
    while True:
        request_id = uuid.uuid4().hex[:12]
        index.expect(request_id, digest)
        shown = cache.get(counter_name)
        index.changed(shown if shown is not None else {"metadata": {"name": counter_name}}, shown is not None)
        try:
            _create_add_request(store, key, counter_name, request_id, step, round_number)
            result = _await_fold(store, cache, index, key, request_id, deadline, round_number)
        except BaseException:  # not a value at the key, or timed out: the request must not fold later
            _delete_add_request(store, counter_name, request_id)
            raise
        finally:
            index.forget(request_id)
        if result is not None:
            _delete_add_request(store, counter_name, request_id)
            return result
        # The request was deleted unfolded (``delete_key`` of the counter): add to the key as it is now.


def _create_add_request(
    store: KubernetesStore, key: str | bytes, counter_name: str, request_id: str, step: int, round_number: int | None
) -> None:
    body = store._new_object(key, str(step).encode(), "", round_number)
    body["metadata"]["name"] = request_name(counter_name, request_id)
    body["metadata"]["labels"][ADDS_TO_LABEL] = counter_digest(counter_name)
    del body["metadata"]["annotations"]
    try:
        created = store._call("POST", store._collection, body=body)
    except ConflictError:  # ours: an earlier attempt whose answer was lost
        return
    except ApiError as exc:
        raise store._failure(exc, "create") from exc
    store._installed(created)


def _delete_add_request(store: KubernetesStore, counter_name: str, request_id: str) -> None:
    try:
        store._call("DELETE", f"{store._collection}/{request_name(counter_name, request_id)}")
    except NotFoundError:
        pass
    except (ApiError, ApiUnavailableError) as exc:  # it goes with the counter, the round or the Rendezvous
        logger.info("could not delete the add request %s of %s: %s", request_id, store._key(counter_name), exc)


def _await_fold(
    store: KubernetesStore,
    cache: WatchCache,
    index: AddIndex,
    key: str | bytes,
    request_id: str,
    deadline: float,
    round_number: int | None,
) -> int | None:
    """The counter's value after request ``request_id``, once folded (by this adder or another);
    None if the request was deleted unfolded."""
    counter_name = store._name(key)
    digest = counter_digest(counter_name)
    patience = time.monotonic() + FOLD_PATIENCE_SECONDS * random.uniform(1, 2)
    lost = 0
    #: The counter's resourceVersion a fold lost on, and when: a watch still showing it later lags.
    lost_on: tuple[str | None, float] | None = None
    while True:
        gone = not index.shown(digest, request_id)
        result = index.result(request_id)  # after ``gone``: a fold is recorded before the deletion
        if result is not None:
            return result
        if gone and cache.healthy:
            return None
        now = time.monotonic()
        if now > deadline:
            raise store.timeout_error(f"KubernetesStore: add({store._key(key)!r}) was not folded in time")
        shown_version = _version(cache.get(counter_name))
        if lost_on is not None and lost_on[0] == shown_version and now - lost_on[1] >= STALE_COUNTER_SECONDS:
            store.stats["stale_refreshes"] += 1  # folding on it again can only lose: list afresh
            logger.info("the watch of %s still shows the counter a fold lost on; listing again", store._key(key))
            cache.refresh()
            lost_on = (shown_version, now)
        elif cache.healthy and (index.first_pending(digest) == request_id or now >= patience):
            outcome = _fold_adds(store, cache, index, key, round_number)
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


def _fold_adds(
    store: KubernetesStore, cache: WatchCache, index: AddIndex, key: str | bytes, round_number: int | None
) -> bool | None:
    """Fold every pending add request on ``key`` into it: True when written, False when another
    write came first (or the outcome is unknown), None when nothing was pending."""
    counter_name = store._name(key)
    shown = cache.get(counter_name)
    counter = copy.deepcopy(shown) if shown is not None else None
    done = folded(counter)
    pending, present = index.pending(counter_digest(counter_name), done)
    if not pending:
        return None
    value, done = fold(store._key(key), None if counter is None else store._value_of(counter), done, pending, present)
    store.stats["folds"] += 1
    attempt = uuid.uuid4().hex[:12]
    if counter is None:
        body = store._new_object(key, str(value).encode(), attempt, round_number)
        body["metadata"]["annotations"][ADDS_ANNOTATION] = encode(done)
        written: dict[str, Any] | bool | None = store._create(key, str(value).encode(), attempt, round_number, body)
    else:
        counter["metadata"].setdefault("annotations", {})[ADDS_ANNOTATION] = encode(done)
        written = store._replace(counter, str(value).encode(), attempt)
    return isinstance(written, dict)
