"""What the handlers and stores of one process share for one Rendezvous: the library's one process-wide registry.

A process (a pod's agent; a benchmark's hundreds of handlers in threads) reaches each Rendezvous
through one ``SharedRendezvous`` (``shared``), made on first use:

- one watch of the object (``watch``): waiting agents and the launcher's monitor loop read it, so
  N handlers cost one watch, not N reads a second;
- one watch of its store keys per incarnation of the object (``keys``), with the index of the add
  requests it shows (``adder.AddIndex``) and of the keys its bundles hold (``BundledKeys``);
- the decoded state document of the latest texts (``decoded``), decoded once for every reader;
- the process's own folder (``folder``), a candidate writer for when no operator folds;
- one Lease renewer per keep-alive interval (``renewer``): the nodes' heartbeats.

``release`` stops them: at interpreter exit (so an agent that exits, done or SIGTERMed, hands the
writer role over at once) and when a test's namespace ends. Nothing else in the library is
process-global.

Not guaranteed: freshness (a watch shows a version another process has replaced, for the watch's
delay); the compare-and-swaps on resourceVersions are what keep writes correct.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from .._kube.kubeapi import KEY_PLURAL, RENDEZVOUS_UID_LABEL, KubernetesApi, resource_path
from .._kube.leases import LeaseRenewer
from .._kube.watchcache import WatchCache, object_watch
from .._rules.document import RendezvousDocument, decode_document
from .._store.adder import AddIndex
from .._store.bundles import BundledKeys
from .folder import Folder

#: Seconds ``release`` waits, in all, for the folders to stop and release the writer Lease.
RELEASE_SECONDS = 5.0


class DecodedStates:
    """The last decoded ``status.state`` per text, so N readers in one process decode it once.

    Decoding is single-flight: the first reader of a new text decodes it while the others wait
    for its result, instead of all of them decoding the same text at once.
    """

    def __init__(self, size: int = 4) -> None:
        self._cache: collections.OrderedDict[str, RendezvousDocument] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._decoding = threading.Lock()
        self._size = size

    def _cached(self, text: str) -> RendezvousDocument | None:
        with self._lock:
            found = self._cache.get(text)
            if found is not None:
                self._cache.move_to_end(text)
            return found

    def decode(self, text: str) -> RendezvousDocument:
        """The document of ``text`` (``document.decode_document``; raises its ``StateDocumentError``)."""
        found = self._cached(text)
        if found is not None:
            return found
        with self._decoding:
            found = self._cached(text)
            if found is not None:
                return found
            document = decode_document(text)
            with self._lock:
                self._cache[text] = document
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
            return document


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


class SharedRendezvous:
    """This process's watches, folder and renewers for one Rendezvous (see the module docstring)."""

    def __init__(self, api: KubernetesApi, namespace: str, rendezvous_name: str) -> None:
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.watch = object_watch(api, namespace, rendezvous_name).start()
        self.decoded = DecodedStates()
        self._lock = threading.Lock()
        self._keys: dict[str, KeyWatch] = {}
        self._folder: tuple[Folder, threading.Event, threading.Thread] | None = None
        self._renewers: dict[float, LeaseRenewer] = {}
        self._stopped = False

    def keys(self, rendezvous_uid: str) -> KeyWatch:
        """The watch of the store keys of the incarnation ``rendezvous_uid``, started on first use."""
        with self._lock:
            found = self._keys.get(rendezvous_uid)
            if found is None:
                found = self._keys[rendezvous_uid] = KeyWatch(
                    self._api, self.namespace, self.rendezvous_name, rendezvous_uid
                )
            return found

    def folder(self, identity: str, default_expiry: float) -> Folder:
        """The process's folder, a candidate writer (``preferred=False``), started on first use under ``identity``."""
        with self._lock:
            if self._folder is None:
                folder = Folder(
                    self._api,
                    self.namespace,
                    self.rendezvous_name,
                    identity=identity,
                    preferred=False,
                    default_expiry=default_expiry,
                    rendezvous=self.watch,
                    decode=self.decoded.decode,
                )
                stopped = threading.Event()
                thread = threading.Thread(
                    target=folder.run, args=(stopped,), name=f"folder {self.namespace}/{self.rendezvous_name}"
                )
                thread.daemon = True
                thread.start()
                self._folder = (folder, stopped, thread)
            return self._folder[0]

    def renewer(self, interval: float) -> LeaseRenewer:
        """The renewer of this process's node Leases renewed every ``interval`` seconds."""
        with self._lock:
            found = self._renewers.get(interval)
            if found is None:
                found = self._renewers[interval] = LeaseRenewer(interval)
            return found

    @property
    def stopped(self) -> bool:
        """Whether this process released the Rendezvous (``release``): nothing of it runs any more."""
        return self._stopped

    def stop(self, deadline: float) -> None:
        """Stop everything; a folder holding the writer Lease releases it (waits until ``deadline`` at most)."""
        with self._lock:
            self._stopped = True
            running, self._folder = self._folder, None
            watches = [self.watch, *(keys.cache for keys in self._keys.values())]
            renewers = list(self._renewers.values())
        if running is not None:
            folder, stopped, thread = running
            stopped.set()
            folder.wake()
            thread.join(max(0.0, deadline - time.monotonic()))
        for renewer in renewers:
            renewer.stop()
        for watch in watches:
            watch.stop()


_SHARED: dict[tuple[str, str, str], SharedRendezvous] = {}
_SHARED_LOCK = threading.Lock()


def shared(api: KubernetesApi, namespace: str, rendezvous_name: str) -> SharedRendezvous:
    """This process's ``SharedRendezvous`` for ``namespace/rendezvous_name`` on ``api``'s server."""
    key = (str(api.api_client.configuration.host), namespace, rendezvous_name)
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = SharedRendezvous(api, namespace, rendezvous_name)
        return found


def release(namespace: str | None = None, timeout: float = RELEASE_SECONDS) -> None:
    """Stop what this process shares for the Rendezvous objects of ``namespace`` (or all), within ``timeout``."""
    with _SHARED_LOCK:
        keys = [key for key in _SHARED if namespace is None or key[1] == namespace]
        stopping = [_SHARED.pop(key) for key in keys]
    deadline = time.monotonic() + timeout
    for each in stopping:
        each.stop(deadline)


# Registered at import, before any handler registers its leave (``native``): atexit runs the last
# registered first, so a handler leaves while its process's folder can still fold the leave.
atexit.register(release)
