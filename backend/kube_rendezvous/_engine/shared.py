"""What the handlers and stores of one process share for one Rendezvous: the library's one process-wide registry.

A process (a pod's agent; a benchmark's hundreds of handlers in threads) reaches each Rendezvous
through one ``SharedRendezvous`` (``shared``), made on first use:

- one watch of the object (``watch``): waiting agents and the launcher's monitor loop read it, so
  N handlers cost one watch, not N reads a second;
- the decoded state document of the latest texts (``decoded``), decoded once for every reader;
- the process's own folder (``folder``), a candidate writer for when no operator folds;
- one Lease renewer per keep-alive interval (``renewer``): the nodes' heartbeats.

``release`` stops them, and the store's watches of the keys (``_store.keywatch``, one per incarnation
of the object): at interpreter exit (so an agent that exits, done or SIGTERMed, hands the writer role
over at once) and when a test's namespace ends. Nothing else in the library is process-global.

Not guaranteed: freshness (a watch shows a version another process has replaced, for the watch's
delay); the compare-and-swaps on resourceVersions are what keep writes correct.
"""

from __future__ import annotations

import atexit
import collections
import threading
import time

from .._kube.kubeapi import KubernetesApi
from .._kube.leases import LeaseRenewer
from .._kube.watchcache import object_watch
from .._rules.document import RendezvousDocument, decode_document
from .._store import keywatch
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


class SharedRendezvous:
    """This process's watches, folder and renewers for one Rendezvous (see the module docstring)."""

    def __init__(self, api: KubernetesApi, namespace: str, rendezvous_name: str) -> None:
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.watch = object_watch(api, namespace, rendezvous_name).start()
        self.decoded = DecodedStates()
        self._lock = threading.Lock()
        self._folder: tuple[Folder, threading.Event, threading.Thread] | None = None
        self._renewers: dict[float, LeaseRenewer] = {}
        self._stopped = False

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
            renewers = list(self._renewers.values())
        if running is not None:
            folder, stopped, thread = running
            stopped.set()
            folder.wake()
            thread.join(max(0.0, deadline - time.monotonic()))
        for renewer in renewers:
            renewer.stop()
        self.watch.stop()


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
    """Stop what this process shares for the Rendezvous objects of ``namespace`` (or all), within ``timeout``:
    the folders, renewers and watches, then the store's watches of the keys (``keywatch.release``)."""
    with _SHARED_LOCK:
        keys = [key for key in _SHARED if namespace is None or key[1] == namespace]
        stopping = [_SHARED.pop(key) for key in keys]
    deadline = time.monotonic() + timeout
    for each in stopping:
        each.stop(deadline)
    keywatch.release(namespace)


# Registered at import, before any handler registers its leave (``native``): atexit runs the last
# registered first, so a handler leaves while its process's folder can still fold the leave.
atexit.register(release)
