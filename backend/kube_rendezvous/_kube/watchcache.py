"""A list-then-watch cache of some objects, kept by one thread (a minimal informer).

Agents read the Rendezvous from one of these instead of GETting it: a watch is served from the API
server's watch cache (``shared`` gives every handler of one process the same watch of each object).
The cache also shows the answers of this process's own writes (``install``) until the watch
delivers that version, so a reader never sees an older version than its own write returned.

Deadlines: every watch request asks the server to end it within ``WATCH_SECONDS`` (jittered) and
is then renewed from the last version seen; a connection that goes silent before that is dropped by
TCP keepalive within 11 s (``kubeapi``) and the objects are listed again on a new connection.
``refresh`` lists again at once for a reader that finds the watch too quiet (``heard_at``); ``stop``
ends a blocked read at once.

Given ``keep`` it stores what ``keep`` makes of each object, not the object; given ``refused_retry``
a refused list/watch empties it and is tried again later instead of given up.

Not guaranteed: freshness. A reader may see a version that another process has already
replaced (by the watch's delay, normally milliseconds); the compare-and-swap on the
resourceVersion is what keeps writes correct. When the watch cannot be kept (no list/watch
permission, repeated errors) ``healthy`` is False and callers read from the API server (or do without).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from .._rules.counters import Counters
from .._rules.retries import WATCH_RETRY
from .kubeapi import (
    RENDEZVOUS_PLURAL,
    ApiError,
    ForbiddenError,
    GoneError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    resource_path,
    retry_after_of,
)

logger = logging.getLogger(__name__)

#: Seconds a watch request lasts before the server ends it and it is renewed (jittered down by up to a quarter).
WATCH_SECONDS = 60
#: The longest a ``wait_for`` waits for a change before it looks again whether the cache stopped (which may notify
#: no waiter) and whether its deadline passed.
WAIT_LOOK_SECONDS = 1.0


class WatchCache:
    """Objects of one collection matching ``query``, by name, kept current by a watch thread."""

    def __init__(
        self,
        api: KubernetesApi,
        collection: str,
        query: dict[str, str],
        what: str,
        *,
        keep: Callable[[dict[str, Any], dict[str, Any] | None], dict[str, Any] | None] | None = None,
        refused_retry: float | None = None,
    ) -> None:
        """``keep(obj, kept_before)``: what to store of each object (None: nothing); listeners are called only when
        that changes; no ``install``. ``refused_retry``: seconds until a refused list/watch is tried again."""
        self._api = api
        self._keep = keep
        self._refused_retry = refused_retry
        self._collection = collection
        self._query = query
        self.what = what
        self._objects: dict[str, dict[str, Any]] = {}
        self._installed: dict[str, dict[str, Any]] = {}
        #: Counts installs, so a list can tell whether one arrived while it was on its way.
        self._installs = 0
        #: resourceVersions the watch has delivered lately, per name (an install of one is stale).
        self._delivered: dict[str, list[str]] = {}
        self._condition = threading.Condition()
        self._listeners: list[Callable[[dict[str, Any] | None], None]] = []
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: True once listed and while the watch runs.
        self.healthy = False
        #: False when the server refused list/watch: callers must read directly.
        self.supported = True
        #: The server's refusal (a 403 or 404) while ``supported`` is False.
        self.refused: ApiError | None = None
        #: Increments on every change seen (tests and benchmarks count wake-ups with it).
        self.changes = 0
        #: Increments on every list after an interruption (the start, a failure, a 410 Gone): events
        #: between two such lists may have been missed. A ``refresh`` does not count.
        self.epoch = 0
        #: This process's clock when the last list or event (bookmarks included) arrived, or None.
        self.heard_at: float | None = None
        self._response: Any = None
        self._refreshing = False
        #: Lists, watch (re)starts and events applied, for tests and benchmarks.
        self.stats = Counters("lists", "watches", "events")

    def start(self) -> WatchCache:
        with self._condition:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"watch {self.what}", daemon=True)
                self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; a read blocked on the server is ended at once."""
        self._stopped.set()
        self._interrupt()

    def refresh(self) -> None:
        """List again now, on a new connection (for a reader that finds the watch quiet for too long)."""
        self._refreshing = True
        self._interrupt()

    def _interrupt(self) -> None:
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception as exc:  # noqa: BLE001 - a response that is already closed
                logger.debug("interrupting the watch of %s: %s", self.what, exc)

    def quiet_for(self) -> float:
        """Seconds since anything arrived from the server (infinite before the first list)."""
        return float("inf") if self.heard_at is None else time.monotonic() - self.heard_at

    def add_listener(self, listener: Callable[[dict[str, Any] | None], None]) -> None:
        """Call ``listener(obj)`` (from the watch thread, quickly) after every change: the object that
        changed (as the watch brought it, not what ``keep`` made of it), or None after a list or a refusal."""
        with self._condition:
            self._listeners.append(listener)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the first list arrived; False when it did not in time or is not supported."""
        self.wait_for(lambda: self.healthy or not self.supported, timeout)
        return self.healthy

    def objects(self) -> dict[str, dict[str, Any]]:
        with self._condition:
            merged = dict(self._objects)
            merged.update(self._installed)
            return merged

    def get(self, name: str) -> dict[str, Any] | None:
        with self._condition:
            return self._installed.get(name) or self._objects.get(name)

    def install(self, obj: dict[str, Any]) -> None:
        """Show ``obj`` (the answer to this process's own write) until the watch delivers it."""
        name = obj["metadata"]["name"]
        with self._condition:
            if obj["metadata"].get("resourceVersion") in self._delivered.get(name, ()):
                return  # the watch was faster: what it shows is this version or newer
            self._installed[name] = obj
            self._installs += 1
            self._changed(obj)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` (called under the cache's lock after each change) holds."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped.is_set():
                    return False
                self._condition.wait(min(remaining, WAIT_LOOK_SECONDS))
            return True

    def _changed(self, obj: dict[str, Any] | None = None) -> None:
        self.changes += 1
        self._condition.notify_all()
        for listener in self._listeners:
            listener(obj)

    def apply_event(self, kind: str, obj: dict[str, Any]) -> None:
        """Take one watch event (``ADDED``, ``MODIFIED`` or ``DELETED`` of ``obj``) into account, as the watch
        thread does with each it receives; for a caller that learned of a change another way (and tests)."""
        name = obj.get("metadata", {}).get("name")
        if not name:
            return
        with self._condition:
            installed = self._installed.get(name)
            if installed is not None and installed["metadata"].get("resourceVersion") == obj["metadata"].get(
                "resourceVersion"
            ):
                del self._installed[name]
            if self._keep is None:
                delivered = self._delivered.setdefault(name, [])
                delivered.append(str(obj["metadata"].get("resourceVersion")))
                del delivered[:-64]
            before = self._objects.get(name)
            kept = None if kind == "DELETED" else obj if self._keep is None else self._keep(obj, before)
            if kept is None:
                self._objects.pop(name, None)
                self._installed.pop(name, None)
            else:
                self._objects[name] = kept
            if self._keep is None or kept != before:
                self._changed(obj)

    def _list(self, interrupted: bool) -> str:
        """List the objects and replace the cache's with them; return the list's resourceVersion.

        The installs: a list sent after an install shows that write or a later one, so it replaces
        the installed object. An install that arrived while the list was on its way may be newer
        than what the list shows (resourceVersions are never compared here to tell): it is kept
        unless the list shows that very version, and the objects are listed again at once (a
        ``refresh``), which then replaces it.
        """
        self.stats.add("lists")
        with self._condition:
            installs_before = self._installs
        listed = self._api.request("GET", self._collection, query=dict(self._query))
        with self._condition:
            before, self._objects = self._objects, {}
            for item in listed.get("items", []):
                name = item["metadata"]["name"]
                kept = item if self._keep is None else self._keep(item, before.get(name))
                if kept is not None:
                    self._objects[name] = kept
                if self._keep is None:
                    delivered = self._delivered.setdefault(name, [])
                    delivered.append(str(item["metadata"].get("resourceVersion")))
                    del delivered[:-64]
            if self._installs == installs_before:
                self._installed.clear()
            else:
                versions = {name: obj["metadata"].get("resourceVersion") for name, obj in self._objects.items()}
                self._installed = {
                    name: obj
                    for name, obj in self._installed.items()
                    if obj["metadata"].get("resourceVersion") != versions.get(name)
                }
                if self._installed:
                    self._refreshing = True  # list again: the next list is sent after the install
            self.healthy = self.supported = True
            self.refused = None
            self.epoch += 1 if interrupted else 0
            self.heard_at = time.monotonic()
            self._changed()
        return str(listed["metadata"]["resourceVersion"])

    def _hold(self, response: Any) -> None:
        self._response = response
        if self._stopped.is_set() or self._refreshing:
            self._interrupt()  # asked for while the request was on its way

    def _run(self) -> None:
        failures = 0
        at_least = 0.0  # the last failure's Retry-After (a 429 or 503 of the list or the watch)
        resource_version: str | None = None
        while not self._stopped.is_set():
            try:
                if resource_version is None or self._refreshing:
                    refreshing, self._refreshing = self._refreshing and resource_version is not None, False
                    resource_version = self._list(interrupted=not refreshing)
                self.stats.add("watches")
                for event in self._api.watch(
                    self._collection,
                    query=dict(self._query, resourceVersion=resource_version),
                    timeout_seconds=int(WATCH_SECONDS * random.uniform(0.75, 1.0)),
                    on_response=self._hold,
                ):
                    self.heard_at = time.monotonic()
                    obj = event.get("object") or {}
                    resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.stats.add("events")
                        self.apply_event(str(event["type"]), obj)
                    if self._stopped.is_set() or self._refreshing:
                        break
                failures = 0
            except GoneError:
                resource_version = None
            except (ForbiddenError, NotFoundError) as exc:
                if isinstance(exc, ForbiddenError) and exc.transient:
                    failures += 1
                    at_least = 0.0
                else:
                    with self._condition:
                        self.supported = self.healthy = False
                        self.refused, resource_version = exc, None
                        if self._refused_retry is None:
                            logger.warning("cannot watch %s (%s); reading it directly instead", self.what, exc.message)
                            self._condition.notify_all()
                            return
                        self._objects.clear()
                        self._changed()
                    self._stopped.wait(self._refused_retry)
                    continue
            except KubernetesApiError as exc:
                if self._stopped.is_set():
                    return
                if self._refreshing:
                    continue  # ended on purpose: list again at once
                failures += 1
                at_least = retry_after_of(exc)
                logger.info("watch of %s interrupted (%s); listing again", self.what, exc)
                resource_version = None
            finally:
                self._response = None
            if failures:
                with self._condition:
                    self.healthy = False  # events may be missing until the next list
                self._stopped.wait(WATCH_RETRY.wait(failures, at_least))


def object_watch(api: KubernetesApi, namespace: str, rendezvous_name: str) -> WatchCache:
    """A (not yet started) watch of one Rendezvous object."""
    return WatchCache(
        api,
        resource_path(RENDEZVOUS_PLURAL, namespace),
        {"fieldSelector": f"metadata.name={rendezvous_name}"},
        f"Rendezvous {namespace}/{rendezvous_name}",
    )
