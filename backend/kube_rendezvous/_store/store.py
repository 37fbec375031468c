"""``KubernetesStore``: tensorplay's key/value Store on the Kubernetes API.

Each key is one ``RendezvousKey`` object owned by the Rendezvous (garbage-collected with it),
named by a hash of the Rendezvous UID and the key. So independent keys never conflict, and
store traffic never writes the Rendezvous object (its resourceVersion, the state's
compare-and-swap token, stays untouched).

Blocking reads wait on one watch of the Rendezvous's keys per process (``keywatch.KeyWatch``), listed
when the store is made: ``wait`` costs no request, ``get`` a GET, and a second one once the watch
shows a key that was missing (so its value is current). Keys written once and never changed (a
round's bootstrap address and rank assignment) are read from the watch alone and may be written
together, N keys in one object (``bundles``). Where the server refuses to let the process watch the
keys, a blocking call reads again every ``POLL_SECONDS``.

``add`` combines (``adder``, on the pure fold of ``adder_rules``): one adder at a time folds every pending
add request into the counter in one write; N agents adding to one counter, as the exit barrier does,
cost about 2N requests plus a few folds. Without the watch it is a read-modify-write like the
others. The view of a round's keys under a prefix is ``prefixstore.KubernetesPrefixStore``.

``set``, ``compare_and_swap`` (and ``add`` without the watch) are read-modify-write under the key
object's resourceVersion, retried on conflict after a random back-off that doubles with each lost
attempt, and exactly once: each attempt records its id on the key, and after an unclear
answer (none, a 5xx, a 409) the next read shows whether one of the call's attempts committed
before anything is re-sent. ``has``, ``check``, ``num_keys`` and the read inside every write go
to the API server. Empty values are stored as "".

Not guaranteed (for ``add``, see ``adder``; for bundles, ``bundles``): ``wait`` may answer True for a
key deleted a moment ago (for as long as the watch takes to show the deletion, normally milliseconds).
Values are visible to anyone who may read RendezvousKey objects in the namespace (use RBAC), and a
value is limited to about 1 MiB.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from .._kube.kubeapi import (
    API_VERSION,
    KEY_PLURAL,
    RENDEZVOUS_LABEL,
    RENDEZVOUS_UID_LABEL,
    ApiError,
    ApiUnavailableError,
    ConflictError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    call_with_retries,
    describe_api_error,
    resource_path,
    retry_after_of,
)
from .._kube.watchcache import WatchCache
from .._rules.adder_rules import (
    ADDS_TO_LABEL,
    annotation_map,
    counter_digest,
    fold,
)
from .._rules.counters import Counters
from .._rules.retries import KEY_CONFLICT_RETRY, OUTAGE_RETRY_SECONDS, UNCLEAR_WRITE_PAUSE, WATCH_CATCH_UP_PAUSE
from .adder import AddIndex, CombinedAdd
from .bundles import split
from .keywatch import KeyWatch, key_watch

logger = logging.getLogger(__name__)


class StoreTimeoutError(TimeoutError):
    """Raised when a blocking ``get`` runs past its timeout (unless the framework adapter names its own error)."""


ROUND_LABEL = "kube-rendezvous.io/round"
OPS_ANNOTATION = "kube-rendezvous.io/ops"
#: How many writers' last write ids a key remembers (JSON ``{writer: attempt}``, the most recent writers).
WRITERS_KEPT = 2048
DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)
#: Seconds between two reads of a blocking call when the server refuses to let this process watch the keys.
POLL_SECONDS = 0.5
#: The longest a blocking call waits on the process's watch of the keys before it looks again whether that watch
#: was refused meanwhile (then it reads instead) and whether its deadline passed.
SHARED_WAIT_LOOK_SECONDS = 1.0
#: Sets one ``multi_set`` (or one pipelined view) keeps in flight at once.
SETS_IN_FLIGHT = 16


def _as_bytes(value: str | bytes | bytearray) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _as_seconds(timeout: float | timedelta | None, default: timedelta) -> float:
    timeout = default if timeout is None else timeout
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def key_object_name(rendezvous_name: str, rendezvous_uid: str, key: str) -> str:
    """Return the RendezvousKey object name for ``key``: a DNS subdomain, at most 253 characters."""
    digest = hashlib.sha256(f"{rendezvous_uid}\0{key}".encode()).hexdigest()[:32]
    prefix = rendezvous_name[:200].rstrip(".-")
    return f"{prefix}.k-{digest}"


class KubernetesStore:
    """A key/value store scoped to one Rendezvous object.

    Args:
        api: the API client.
        namespace: the Rendezvous object's namespace.
        rendezvous_name: the Rendezvous object's name.
        rendezvous_uid: its UID; keys are owned by it and keyed by it, so a re-created
            Rendezvous of the same name never sees an old job's keys.
        timeout: default for blocking ``get`` and ``wait`` (seconds or timedelta, 300 s).
        retry_timeout: seconds to keep retrying while the API server is unreachable.
    """

    def __init__(
        self,
        api: KubernetesApi,
        namespace: str,
        rendezvous_name: str,
        rendezvous_uid: str,
        *,
        timeout: float | timedelta = DEFAULT_STORE_TIMEOUT,
        retry_timeout: float = OUTAGE_RETRY_SECONDS,
    ) -> None:
        if not rendezvous_uid:
            raise ValueError("rendezvous_uid must be the Rendezvous object's metadata.uid, got ''")
        self._api = api
        self.namespace = namespace
        self.rendezvous_name = rendezvous_name
        self.rendezvous_uid = rendezvous_uid
        self.timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
        self._retry_timeout = retry_timeout
        self._collection = resource_path(KEY_PLURAL, namespace)
        self._selector = f"{RENDEZVOUS_UID_LABEL}={rendezvous_uid}"
        #: What a blocking ``get`` raises at its timeout: the framework's own error (``create_backend``
        #: sets tensorplay's ``StoreTimeoutError`` or torch's ``DistStoreError``, which their code catches).
        self.timeout_error: type[Exception] = StoreTimeoutError
        #: This store's slot in a key's ops annotation: unique per store (per agent incarnation).
        self.writer_id = uuid.uuid4().hex[:12]
        #: The process's watch of this Rendezvous's keys (``keywatch.KeyWatch``), made on first use.
        self._keys: KeyWatch | None = None
        #: What this store did, for tests and benchmarks (``shared_waits``: blocking calls that waited on the
        #: shared watch).
        self.stats = Counters("requests", "conflicts", "watch_wakeups", "shared_waits", "folds", "stale_refreshes")

    @property
    def timeout(self) -> timedelta:
        """Default timeout of blocking ``get`` and ``wait``; assignable (seconds or timedelta)."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | timedelta) -> None:
        seconds = _as_seconds(value, DEFAULT_STORE_TIMEOUT)
        if seconds <= 0:
            raise ValueError(f"store timeout must be positive, got {value!r}")
        self._timeout = timedelta(seconds=seconds)

    # -- plumbing, and the key objects (public: ``adder.KeyObjects``, what a combined add uses) ----

    def object_name(self, key: str | bytes) -> str:
        return key_object_name(self.rendezvous_name, self.rendezvous_uid, self.key_text(key))

    @staticmethod
    def key_text(key: str | bytes) -> str:
        return key if isinstance(key, str) else key.decode("utf-8")

    def _call(self, method: str, path: str, *, retry: bool = True, **kwargs: Any) -> Any:
        self.stats.add("requests")
        if not retry:
            return self._api.request(method, path, **kwargs)
        return call_with_retries(
            lambda: self._api.request(method, path, **kwargs),
            deadline=time.monotonic() + self._retry_timeout,
            what=f"{method} {path}",
        )

    def _read(self, key: str | bytes) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self._call("GET", f"{self._collection}/{self.object_name(key)}")
        except NotFoundError:
            return None
        except ApiError as exc:
            raise self._failure(exc, "get") from exc
        return obj

    def _failure(self, exc: ApiError, verb: str) -> RuntimeError:
        return RuntimeError(describe_api_error(exc, verb, KEY_PLURAL, self.namespace))

    @staticmethod
    def value_of(obj: dict[str, Any]) -> bytes:
        return base64.b64decode(obj["spec"]["value"])

    def new_key_object(self, key: str | bytes, round_number: int | None, value: bytes = b"") -> dict[str, Any]:
        labels = {RENDEZVOUS_LABEL: self.rendezvous_name[:63].rstrip(".-_"), RENDEZVOUS_UID_LABEL: self.rendezvous_uid}
        if round_number is not None:
            labels[ROUND_LABEL] = str(round_number)
        owner = {
            "apiVersion": API_VERSION,
            "kind": "Rendezvous",
            "name": self.rendezvous_name,
            "uid": self.rendezvous_uid,
        }
        return {
            "apiVersion": API_VERSION,
            "kind": "RendezvousKey",
            "metadata": {"name": self.object_name(key), "labels": labels, "ownerReferences": [owner]},
            "spec": {"key": self.key_text(key), "value": base64.b64encode(value).decode("ascii")},
        }

    def _slot(self) -> str:
        """This store's slot for the calling thread: one call per slot is in flight at a time."""
        return f"{self.writer_id}.{threading.get_ident() % 1000003}"

    def write_key(
        self,
        key: str | bytes,
        obj: dict[str, Any] | None,
        value: bytes,
        attempt: str,
        round_number: int | None,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any] | bool:
        """Write attempt ``attempt`` of ``value`` (and ``annotations``): create the key when ``obj``, the object
        read, is None, else replace ``obj`` if it is still current. Returns the written object, False when
        somebody wrote first (a lost compare-and-swap), or True when the outcome is unknown (read to learn it)."""
        body = self.new_key_object(key, round_number) if obj is None else obj
        writes = annotation_map(body, OPS_ANNOTATION)
        slot = self._slot()
        writes.pop(slot, None)
        writes[slot] = attempt  # the most recent writer last; the oldest are dropped
        kept = dict(list(writes.items())[-WRITERS_KEPT:])
        stamps = body["metadata"].setdefault("annotations", {})
        stamps[OPS_ANNOTATION] = json.dumps(kept, separators=(",", ":"))
        stamps.update(annotations or {})
        body["spec"]["value"] = base64.b64encode(value).decode("ascii")
        try:
            if obj is None:
                written: dict[str, Any] = self._call("POST", self._collection, body=body, retry=False)
            else:
                written = self._call("PUT", f"{self._collection}/{body['metadata']['name']}", body=body, retry=False)
            return self._installed(written)
        except ApiError as exc:
            if isinstance(exc, ConflictError) or (obj is not None and isinstance(exc, NotFoundError)):
                return False
            if not exc.transient:
                raise self._failure(exc, "create" if obj is None else "update") from exc
            time.sleep(max(UNCLEAR_WRITE_PAUSE, retry_after_of(exc)))  # a 429's Retry-After, honoured
            return True
        except ApiUnavailableError:
            pass
        time.sleep(UNCLEAR_WRITE_PAUSE)
        return True

    def delete_object(self, name: str) -> None:
        """Delete the key object ``name``, retried while the API server is unreachable (``NotFoundError``: gone)."""
        self._call("DELETE", f"{self._collection}/{name}")

    @property
    def key_watch(self) -> KeyWatch | None:
        """The process's watch of this Rendezvous's keys (``key_watch.cache.stats``: its lists, restarts and events),
        None until the first blocking call (or ``start_watch``) made it. Reading it starts nothing."""
        return self._keys

    @property
    def adds(self) -> AddIndex:
        """The process's index of the add requests and fold results of these keys, kept by its key watch."""
        self._key_cache()  # makes the key watch on first use
        assert self._keys is not None
        return self._keys.adds

    def create_once(self, body: dict[str, Any]) -> None:
        """Create ``body``, an object named for this one write, retried while the API server is unreachable;
        the key watch shows it at once, also when an earlier attempt whose answer was lost created it."""
        name = body["metadata"]["name"]
        try:
            self._installed(self._call("POST", self._collection, body=body))
        except ConflictError:
            # It exists: an earlier attempt, whose answer was lost, created it. Show it as the answer would
            # have: a caller that waits on the watch for it (a combining add) must not take it for deleted.
            try:
                self._installed(self._call("GET", f"{self._collection}/{name}"))
            except NotFoundError:
                pass  # created and deleted since (its counter was deleted): the watch shows it gone
            except ApiError as exc:
                raise self._failure(exc, "get") from exc
        except ApiError as exc:
            raise self._failure(exc, "create") from exc

    def _read_modify_write(
        self, key: str | bytes, update: Any, round_number: int | None = None, *, create_first: bool = False
    ) -> tuple[bytes | None, bytes | None]:
        """Apply ``update(current_or_None) -> new_or_None`` exactly once; return (previous, written).

        Every write attempt records its id in this store's own slot of the key's ops annotation
        (``{slot: attempt}``, a slot per store and thread; only that thread of this store
        writes it, one call at a time). An attempt whose outcome is unclear (no answer, a 5xx, a 409 after
        an earlier unclear attempt) is never repeated blindly: the next read shows whether one
        of this call's attempts committed, and if so that attempt's result is returned. An
        attempt can only commit on the resourceVersion it read, so at most one ever commits.
        Exact unless more than ``WRITERS_KEPT`` other writers wrote the key in between.
        ``create_first`` tries to create the key before reading it (one request for a new key).
        """
        attempts: dict[str, tuple[bytes | None, bytes]] = {}
        obj: dict[str, Any] | None = None
        read = not create_first
        conflicts = 0
        lost_on: str | None = None  # the resourceVersion the last compare-and-swap lost on
        while True:
            if conflicts:
                # Many writers on one key (the exit barrier: every agent adds to one counter) take
                # turns instead of all re-reading at once: O(N log N) requests in all, not O(N^2).
                time.sleep(KEY_CONFLICT_RETRY.delay(conflicts))
            if read:
                # After a lost compare-and-swap the watch usually shows the winner's version already:
                # no GET then. After an unclear answer, the API server decides.
                obj = self._newer_than(key, lost_on) if lost_on is not None else None
                obj = obj if obj is not None else self._read(key)
                lost_on = None
                if obj is not None and (last := annotation_map(obj, OPS_ANNOTATION).get(self._slot())) in attempts:
                    return attempts[last]
            read = True
            previous = None if obj is None else self.value_of(obj)
            desired = update(previous)
            if desired is None:
                return previous, None
            attempt = uuid.uuid4().hex[:12]
            attempts[attempt] = (previous, desired)
            version = None if obj is None else obj["metadata"]["resourceVersion"]
            result = self.write_key(key, obj, desired, attempt, round_number)
            if isinstance(result, dict):
                return previous, desired
            self.stats.add("conflicts")
            conflicts += 1 if obj is not None else 0  # a create that lost to another create reads at once
            lost_on = version if result is False else None

    def _newer_than(self, key: str | bytes, version: str) -> dict[str, Any] | None:
        """A copy of ``key``'s object as the watch shows it, if that is not ``version``; else None."""
        cache = self._key_cache()
        shown = cache.get(self.object_name(key)) if cache is not None and cache.healthy else None
        if shown is None or shown["metadata"].get("resourceVersion") == version:
            return None
        return copy.deepcopy(shown)

    # -- the Store interface -----------------------------------------------------------------

    def set(self, key: str | bytes, value: str | bytes, *, round_number: int | None = None) -> None:
        """Store ``value`` (``str`` is stored as UTF-8) under ``key``."""
        data = _as_bytes(value)
        self._read_modify_write(key, lambda _current: data, round_number, create_first=True)

    def get(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` (default ``self.timeout``) for it.

        A GET, so the value is current (linearizable) and a refusal is reported at once. A key not
        there yet is waited for on the process's watch of the keys and read again once shown: two
        requests (without that watch: a GET every ``POLL_SECONDS``).

        Raises:
            StoreTimeoutError: the key did not appear in time.
        """
        deadline = time.monotonic() + _as_seconds(timeout, self.timeout)
        shown = False
        while True:
            obj = self._read(key)
            if obj is not None:
                return self.value_of(obj)
            if shown:  # the watch showed a key deleted since: let it catch up instead of spinning
                time.sleep(WATCH_CATCH_UP_PAUSE)
            if self._key_cache() is not None:
                bundled = self._bundled(key)
                if bundled is not None:  # written once (``write_once``): its only value
                    return bundled
                shown = True
                if self._await([key], deadline) == []:  # the deadline came (None: the watch was refused)
                    raise self._timed_out(key)
                continue  # shown now (or the watch was refused meanwhile): read it
            if time.monotonic() >= deadline:  # no watch allowed: read again every POLL_SECONDS
                raise self._timed_out(key)
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    def get_written_once(self, key: str | bytes, timeout: float | timedelta | None = None) -> bytes:
        """``get`` for a key that is written once and never changed (a round's bootstrap address, a bundled
        key): answered from the process's watch alone, with no request (``multi_get``'s ``written_once``)."""
        return self.multi_get([key], timeout, written_once=True)[0]

    def _key_cache(self) -> WatchCache | None:
        """The process's watch of this Rendezvous's keys, started on first use; None when the server refused it."""
        if self._keys is None:
            self._keys = key_watch(self._api, self.namespace, self.rendezvous_name, self.rendezvous_uid)
        return self._keys.cache if self._keys.cache.supported else None

    def start_watch(self) -> None:
        """Start the process's watch of this Rendezvous's keys now, before the first blocking call needs it."""
        self._key_cache()

    def _installed(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Show this store's own write on the shared watch at once, so a ``get`` that follows reads it."""
        if self._keys is not None:
            self._keys.cache.install(obj)
        return obj

    def _timed_out(self, key: str | bytes) -> Exception:
        return self.timeout_error(f"KubernetesStore: timed out waiting for key {self.key_text(key)!r}")

    def _bundled(self, key: str | bytes) -> bytes | None:
        """The value of ``key`` if the watch shows it in a bundle (``write_once``)."""
        return None if self._keys is None else self._keys.bundled.get(self.key_text(key))

    def _shown(self, cache: WatchCache, key: str | bytes) -> bytes | None:
        """The value of ``key`` as the watch shows it (its own object or a bundle), once listed."""
        if not cache.healthy:
            return None
        obj = cache.get(self.object_name(key))
        return self.value_of(obj) if obj is not None else self._bundled(key)

    def _await(self, keys: list[str | bytes], deadline: float) -> list[bytes] | None:
        """The values of ``keys`` once the watch has listed and shows them all, or at the deadline those of the
        first keys shown; None when the server refuses the watch. The caller is woken by changes of its own
        keys only (``KeyWatch.waiting``)."""
        cache = self._key_cache()
        if cache is None:
            return None
        got: list[bytes] = []

        def advance() -> bool:  # a cursor: look again from the first key not shown yet
            while len(got) < len(keys) and (value := self._shown(cache, keys[len(got)])) is not None:
                got.append(value)
            return len(got) == len(keys)

        if advance():
            return got
        assert self._keys is not None
        self.stats.add("shared_waits")
        with self._keys.waiting([self.key_text(key) for key in keys]) as event:
            while True:
                event.clear()
                if advance():
                    self.stats.add("watch_wakeups")
                    return got
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not cache.supported:
                    return got if cache.supported else None
                event.wait(min(remaining, SHARED_WAIT_LOOK_SECONDS))

    def add(self, key: str | bytes, amount: int, *, round_number: int | None = None) -> int:
        """Add ``amount`` to the integer at ``key`` (missing counts as 0); return the new value.

        With the process's watch of the keys: a combining add (``adder_rules``), whose request never
        conflicts and which one fold writes together with every other pending add. Without it:
        a compare-and-swap of the key, retried after a back-off.

        Raises:
            CounterValueError: the key holds something other than an integer.
        """
        step = int(amount)
        cache = self._key_cache()
        if cache is not None and cache.healthy:
            return CombinedAdd(self, cache, key, round_number).add(step)

        def added(current: bytes | None) -> bytes:
            return str(fold(self.key_text(key), current, {}, [], ())[0] + step).encode()

        _, written = self._read_modify_write(key, added, round_number)
        assert written is not None
        return int(written)

    def compare_and_swap(
        self, key: str | bytes, expected: str | bytes, desired: str | bytes, *, round_number: int | None = None
    ) -> tuple[bool, bytes]:
        """Set ``desired`` if the value is ``expected`` (a missing key matches ``b""``).

        Returns ``(True, previous)`` when it swapped, ``(False, current)`` when not.
        """
        want, new = _as_bytes(expected), _as_bytes(desired)
        previous, written = self._read_modify_write(
            key, lambda current: new if (current if current is not None else b"") == want else None, round_number
        )
        return (written is not None), (previous if previous is not None else b"")

    def compare_set(
        self, key: str | bytes, expected: str | bytes, desired: str | bytes, *, round_number: int | None = None
    ) -> bytes:
        """Like ``compare_and_swap`` but return the value now stored (``b""`` for a missing key)."""
        swapped, current = self.compare_and_swap(key, expected, desired, round_number=round_number)
        return _as_bytes(desired) if swapped else current

    def has(self, key: str | bytes) -> bool:
        """Return whether ``key`` exists."""
        return self._read(key) is not None or (self._key_cache() is not None and self._bundled(key) is not None)

    def multi_get(
        self,
        keys: Iterable[str | bytes],
        timeout: float | timedelta | None = None,
        *,
        round_number: int | None = None,
        written_once: bool = False,
    ) -> list[bytes]:
        """The values of ``keys``: one LIST for those that exist (a quorum read, so linearizable, as a GET is),
        then a blocking ``get`` for each one missing. ``round_number``: the round the keys were written in
        (its label narrows the LIST); keys written in another round are read one by one.

        ``written_once``: every key is written once and never changed, so any value it shows (its own object
        or a bundle's entry) is its only value: answered from the process's watch alone, with no request, as
        a GET would. Without the watch: ``get`` each.

        Raises:
            the store's ``timeout_error``: a key did not appear in time.
        """
        keys = list(keys)
        if written_once:
            deadline = time.monotonic() + _as_seconds(timeout, self.timeout)
            got = self._await(keys, deadline)
            if got is None:
                return [self.get(key, max(0.0, deadline - time.monotonic())) for key in keys]
            if len(got) < len(keys):
                raise self._timed_out(keys[len(got)])
            return got
        selector = f"{self._selector},!{ADDS_TO_LABEL}"
        if round_number is not None:
            selector += f",{ROUND_LABEL}={round_number}"
        try:
            listed = self._call("GET", self._collection, query={"labelSelector": selector})
        except ApiError as exc:
            raise self._failure(exc, "list") from exc
        found = {item["metadata"]["name"]: item for item in listed.get("items", [])}
        return [
            self.value_of(found[name]) if (name := self.object_name(key)) in found else self.get(key, timeout)
            for key in keys
        ]

    def multi_set(
        self, keys: Iterable[str | bytes], values: Iterable[str | bytes], *, round_number: int | None = None
    ) -> None:
        """``set`` each key to its value, ``SETS_IN_FLIGHT`` at a time (each exactly once); raise the first failure."""
        pairs = list(zip(keys, values, strict=True))
        if len(pairs) <= 1:  # no pool for one
            return self.set(*pairs[0], round_number=round_number) if pairs else None
        with ThreadPoolExecutor(max_workers=min(SETS_IN_FLIGHT, len(pairs)), thread_name_prefix="store set") as pool:
            for future in [pool.submit(self.set, key, value, round_number=round_number) for key, value in pairs]:
                future.result()

    def write_once(
        self, keys: Iterable[str | bytes], values: Iterable[str | bytes], *, round_number: int | None = None
    ) -> None:
        """``set`` keys that are written once and never again (a round's rank assignment) together, in
        bundles (``bundles``): N keys cost one request, not N (a key that fits no bundle is ``set`` alone).
        Readers find them through their watch."""
        made, alone = split((self.key_text(key), _as_bytes(value)) for key, value in zip(keys, values, strict=True))
        for entries in made:  # a bundle's name is a hash of its keys: a create sent again finds it
            body = self.new_key_object("\0".join(["bundle", *entries]), round_number)
            described = f"{len(entries)} keys written once, from {next(iter(entries))}"[:4096]
            body["spec"] = {"key": described, "value": "", "entries": entries}
            self.create_once(body)
        if alone:
            self.multi_set([key for key, _ in alone], [value for _, value in alone], round_number=round_number)

    def check(self, keys: Iterable[str | bytes]) -> bool:
        """Return whether every key exists."""
        return all(self.has(key) for key in keys)

    def append(self, key: str | bytes, value: str | bytes, *, round_number: int | None = None) -> None:
        """Append ``value`` to the bytes at ``key`` (a missing key counts as empty), exactly once."""
        data = _as_bytes(value)
        self._read_modify_write(key, lambda current: (current or b"") + data, round_number)

    def delete_key(self, key: str | bytes) -> None:
        """Delete ``key``; deleting a missing key does nothing. Adds still pending on it go first."""
        try:
            selector = f"{self._selector},{ADDS_TO_LABEL}={counter_digest(self.object_name(key))}"
            self._call("DELETE", self._collection, query={"labelSelector": selector})
            self._call("DELETE", f"{self._collection}/{self.object_name(key)}")
        except NotFoundError:
            pass
        except ApiError as exc:
            raise self._failure(exc, "delete") from exc

    def num_keys(self) -> int:
        """Return how many keys this Rendezvous's store holds (add requests are not keys; a bundle's keys are)."""
        listed = self._call("GET", self._collection, query={"labelSelector": f"{self._selector},!{ADDS_TO_LABEL}"})
        return sum(len((item.get("spec") or {}).get("entries") or {}) or 1 for item in listed.get("items", []))

    def wait(self, keys: Iterable[str | bytes], timeout: float | timedelta | None = None) -> bool:
        """Wait until every key exists; return False at the timeout (default ``self.timeout``).

        Answered from the process's watch of this Rendezvous's keys: no request of its own.
        """
        deadline = time.monotonic() + _as_seconds(timeout, self.timeout)
        keys = list(keys)
        got = self._await(keys, deadline)
        if got is not None:
            return len(got) == len(keys)
        while not self.check(keys):  # no watch allowed: read again every POLL_SECONDS
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        return True

    def delete_rounds_except(self, keep: Iterable[int]) -> None:
        """Delete the keys written for rounds other than ``keep`` (keys without a round stay)."""
        kept = ",".join(str(number) for number in sorted(set(keep)))
        selector = f"{self._selector},{ROUND_LABEL},{ROUND_LABEL} notin ({kept})"
        try:
            self._call("DELETE", self._collection, query={"labelSelector": selector})
        except KubernetesApiError as exc:
            logger.warning(
                "could not delete the store keys of old rounds (%s); they stay until the Rendezvous goes", exc
            )
