"""The process's watch of one Rendezvous incarnation's store keys (``KeyWatch``), one per incarnation.

Every ``KubernetesStore`` of one process on one Rendezvous incarnation (a pod's agent; a benchmark's
hundreds of stores in threads) waits on the same watch of the keys (``key_watch``), made on first use:
N stores cost one watch, not N reads a second. The watch keeps the index of the add requests it shows
(``adder.AddIndex``) and of the keys its bundles hold (``bundles.BundledKeys``).

``release`` stops the watches: at interpreter exit, and when the process releases the Rendezvous
objects of a namespace (``_engine.shared.release``, which also stops the folders and renewers).

Not guaranteed: freshness (the watch shows a version another process has replaced, for the watch's
delay); the compare-and-swaps on resourceVersions are what keep writes correct.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .._kube.kubeapi import KEY_PLURAL, RENDEZVOUS_UID_LABEL, KubernetesApi, resource_path
from .._kube.watchcache import WatchCache
from .adder import AddIndex
from .bundles import BundledKeys


class KeyWatch:
    """The watch of one Rendezvous incarnation's store keys, the add requests and the bundled keys it shows."""

    def __init__(self, api: KubernetesApi, namespace: str, rendezvous_name: str, rendezvous_uid: str) -> None:
        self.cache = WatchCache(
            api,
            resource_path(KEY_PLURAL, namespace),
            {"labelSelector": f"{RENDEZVOUS_UID_LABEL}={rendezvous_uid}"},
            f"{KEY_PLURAL} of {namespace}/{rendezvous_name}",
        )
        self.adds = AddIndex()
        self.bundled = BundledKeys()
        self._waiters: dict[str, list[threading.Event]] = {}
        self._waiters_lock = threading.Lock()
        self.cache.add_listener(self._changed)
        self.cache.start()

    @contextlib.contextmanager
    def waiting(self, keys: list[str]) -> Iterator[threading.Event]:
        """An Event set whenever the watch shows a change of one of ``keys`` (their own objects or a bundle
        holding them) or lists again: N threads waiting for N keys are each woken by their own key, not
        all of them by every key's event."""
        event = threading.Event()
        with self._waiters_lock:
            for key in keys:
                self._waiters.setdefault(key, []).append(event)
        try:
            yield event
        finally:
            with self._waiters_lock:
                for key in keys:
                    events = self._waiters[key]
                    events.remove(event)
                    if not events:
                        del self._waiters[key]

    def _changed(self, obj: dict[str, Any] | None) -> None:  # from the watch thread, under the cache's lock
        if obj is None:
            objects = self.cache.objects().values()
            self.adds.changed(None, False, objects)
            self.bundled.changed(None, False, objects)
        else:
            present = self.cache.get(obj["metadata"]["name"]) is not None
            self.adds.changed(obj, present)
            self.bundled.changed(obj, present)
        with self._waiters_lock:
            if obj is None:
                woken = [event for events in self._waiters.values() for event in events]
            else:
                spec = obj.get("spec") or {}
                keys = [spec.get("key"), *(spec.get("entries") or ())]
                woken = [event for key in keys if isinstance(key, str) for event in self._waiters.get(key, ())]
        for event in woken:
            event.set()


#: The process's key watches by (API server, namespace, Rendezvous name, Rendezvous UID).
_WATCHES: dict[tuple[str, str, str, str], KeyWatch] = {}
_WATCHES_LOCK = threading.Lock()


def key_watch(api: KubernetesApi, namespace: str, rendezvous_name: str, rendezvous_uid: str) -> KeyWatch:
    """This process's watch of the store keys of the incarnation ``rendezvous_uid``, started on first use."""
    key = (str(api.api_client.configuration.host), namespace, rendezvous_name, rendezvous_uid)
    with _WATCHES_LOCK:
        found = _WATCHES.get(key)
        if found is None:
            found = _WATCHES[key] = KeyWatch(api, namespace, rendezvous_name, rendezvous_uid)
        return found


def release(namespace: str | None = None) -> None:
    """Stop this process's key watches of the Rendezvous objects of ``namespace`` (or all); the next use starts
    new ones."""
    with _WATCHES_LOCK:
        keys = [key for key in _WATCHES if namespace is None or key[1] == namespace]
        stopping = [_WATCHES.pop(key) for key in keys]
    for watch in stopping:
        watch.cache.stop()


# At interpreter exit, after ``_engine.shared.release`` (registered later, so run first) when that is loaded.
atexit.register(release)

__all__ = ["KeyWatch", "key_watch", "release"]
