"""An in-memory stand-in for ``kube_rendezvous._kube.kubeapi.KubernetesApi``: what the backend, the store,
the folder, the Leases, the status writer and the watch cache call, answered as kube-apiserver
v1.37 answers it (checked against the project's control plane, ``tests/test_contract.py``).

Modelled: one global resourceVersion (a string of digits) that every write bumps and a write that
changes nothing does not; objects keyed by (collection, namespace, name) with ``metadata.uid``,
``creationTimestamp``, ``namespace`` and, for custom resources, ``generation`` (bumped when
anything but metadata and status changes); POST (409 AlreadyExists), GET of an object or a list
(``labelSelector``: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (..)``, ``k notin (..)``,
comma-joined; ``fieldSelector`` on ``metadata.name``/``metadata.namespace``; any
``resourceVersion`` is served fresh), PUT (``metadata.resourceVersion`` required: 422 without,
409 when stale, 500 when not digits, as the real server answers), PATCH with
``application/merge-patch+json`` only (RFC 7386; a ``metadata.resourceVersion`` in the body is a
precondition as for PUT), the ``status`` subresource of ``rendezvouses`` (a status write changes
only ``.status``; a main write and a create never change it), DELETE of an object or of a
collection by selector; watches from a resourceVersion with ADDED/MODIFIED/DELETED in order
(an object entering or leaving a selector is ADDED or DELETED), blocking until
``timeout_seconds``, and 410 Gone for a version older than the kept history.

Not modelled: authentication and RBAC, admission (the CRDs' CEL rules, defaults such as
``spec.closed: false``), schema validation and pruning, field managers (``managedFields``,
server-side apply), other patch types (415), ``deletionTimestamp``, finalizers and graceful
deletion, ownerReferences garbage collection, namespaces as objects, ``generateName``,
pagination, BOOKMARK events, watches without a resourceVersion (this project's server refuses
them too), the watch cache's staleness (``resourceVersion=0`` reads are as fresh as quorum
reads), throttling, timeouts and outages (``last_outage`` stays None), the ``kind`` of lists
(always ``List``).
"""

from __future__ import annotations

import collections
import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

from kube_rendezvous._kube.kubeapi import GROUP, MERGE_PATCH, ApiUnavailableError, GoneError, api_error

#: Collections with a status subresource (the Rendezvous CRD's ``subresources: {status: {}}``).
STATUS_SUBRESOURCE = frozenset({"rendezvouses"})
#: Watch events kept; a watch from a version older than the oldest kept gets 410 Gone.
HISTORY = 1000

Key = tuple[str, str, str]  # (collection path without the namespace, namespace, name)
Obj = dict[str, Any]


@dataclass(frozen=True)
class _Event:
    version: int
    collection: str
    namespace: str
    before: Obj | None  # None: the object was created
    after: Obj | None  # None: the object was deleted


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_REQUIREMENT = re.compile(
    r"^\s*(?:(?P<key>[\w./-]+)\s*(?P<op>==|=|!=)\s*(?P<value>[\w./-]*)"
    r"|(?P<set_key>[\w./-]+)\s+(?P<set_op>in|notin)\s+\((?P<values>[^()]*)\)"
    r"|(?P<not>!?)\s*(?P<exists>[\w./-]+))\s*$"
)


Requirement = tuple[str, str, frozenset[str]]  # (key, operator, values)


def _holds(mapping: dict[str, Any], requirement: Requirement) -> bool:
    key, op, values = requirement
    if op in ("=", "==", "in"):
        return mapping.get(key) in values
    if op in ("!=", "notin"):
        return mapping.get(key) not in values  # a missing key matches, as in Kubernetes
    return (key in mapping) == (op == "exists")


def label_matcher(selector: str) -> Callable[[dict[str, Any]], bool]:
    """A predicate on labels for a label selector; raises InvalidError (400) when it does not parse."""
    requirements: list[Requirement] = []
    for part in re.split(r",(?![^()]*\))", selector) if selector.strip() else []:
        found = _REQUIREMENT.match(part)
        if found is None:
            raise api_error(400, "Bad Request", f"unable to parse requirement: {part!r}", "GET", "labelSelector")
        if found["key"] is not None:
            requirements.append((found["key"], found["op"], frozenset({found["value"]})))
        elif found["set_key"] is not None:
            values = frozenset(item.strip() for item in found["values"].split(","))
            requirements.append((found["set_key"], found["set_op"], values))
        else:
            requirements.append((found["exists"], "absent" if found["not"] else "exists", frozenset()))
    return lambda labels: all(_holds(labels, requirement) for requirement in requirements)


def field_matcher(selector: str) -> Callable[[Obj], bool]:
    """A predicate on objects for a field selector on ``metadata.name``/``metadata.namespace``."""
    requirements: list[Requirement] = []
    for part in selector.split(",") if selector.strip() else []:
        found = re.match(r"^\s*metadata\.(name|namespace)\s*(==|=|!=)\s*(\S*)\s*$", part)
        if found is None:
            raise api_error(400, "Bad Request", f"field label not supported: {part.strip()}", "GET", "fieldSelector")
        requirements.append((found[1], found[2], frozenset({found[3]})))
    return lambda obj: all(_holds(obj["metadata"], requirement) for requirement in requirements)


def _parse(path: str) -> tuple[str, str, str | None, str | None]:
    """(collection, namespace, name, subresource) of ``/api(s)/.../namespaces/<ns>/<plural>[/<name>[/<sub>]]``."""
    parts = path.split("?")[0].strip("/").split("/")
    at = parts.index("namespaces")
    tail = [unquote(part) for part in parts[at + 3 :]]
    collection = "/" + "/".join([*parts[:at], parts[at + 2]])
    return collection, unquote(parts[at + 1]), tail[0] if tail else None, tail[1] if len(tail) > 1 else None


class FakeKubernetesApi:
    """Answers ``request`` and ``watch`` from memory, as kube-apiserver would (module docstring)."""

    def __init__(self, history: int = HISTORY, request_timeout: float = 30.0) -> None:
        #: A host of its own, so that the process-wide caches keyed by host (``shared_watch``) never mix fakes.
        self.api_client = SimpleNamespace(configuration=SimpleNamespace(host=f"fake://{uuid.uuid4().hex[:12]}"))
        self.request_timeout = request_timeout
        counted = ("requests", "conflicts", "throttled", "bytes_sent", "bytes_received")
        self.stats: dict[str, int] = dict.fromkeys(counted, 0)
        self.last_outage: tuple[datetime, datetime] | None = None
        self._objects: dict[Key, Obj] = {}
        self._version = 1
        self._events: collections.deque[_Event] = collections.deque(maxlen=history)
        self._oldest = self._version  # a watch may resume from this version or later
        self._condition = threading.Condition()
        self._closed = False

    def close(self) -> None:
        """End every watch; later requests raise ApiUnavailableError (the server is gone)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    # -- requests --------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """Answer one request with a copy of what the server would return, or raise its ApiError."""
        self.stats["requests"] += 1
        sent = None if body is None else json.dumps(body, separators=(",", ":"))
        self.stats["bytes_sent"] += len(sent or "")
        try:
            with self._condition:
                if self._closed:
                    raise ApiUnavailableError(f"{method} {path}: the fake API server was closed")
                answer = self._answer(
                    method, path, query or {}, None if sent is None else json.loads(sent), content_type
                )
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                self.stats["conflicts"] += 1
            raise
        data = json.dumps(answer)
        self.stats["bytes_received"] += len(data)
        return json.loads(data)

    def _answer(self, method: str, path: str, query: dict[str, Any], body: Any, content_type: str) -> Any:
        collection, namespace, name, sub = _parse(path)
        plural = collection.rsplit("/", 1)[1]
        key = (collection, namespace, name or "")

        def error(status: int, reason: str, message: str) -> Exception:
            return api_error(status, reason, message, method, path)

        if sub is not None and not (sub == "status" and plural in STATUS_SUBRESOURCE):
            raise error(404, "Not Found", "the server could not find the requested resource")
        if name is None:
            if method == "POST":
                return self._create(collection, namespace, plural, body, error)
            if method not in ("GET", "DELETE"):
                raise error(405, "Method Not Allowed", f"{method} on a collection")
            matches = self._selected(query)
            items = [
                obj
                for (c, n, _), obj in sorted(self._objects.items())
                if (c, n) == (collection, namespace) and matches(obj)
            ]
            for obj in items if method == "DELETE" else []:
                self._write((*key[:2], obj["metadata"]["name"]), obj, None)
            return {"kind": "List", "items": items, "metadata": {"resourceVersion": str(self._version)}}
        current = self._objects.get(key)
        if current is None:
            raise error(404, "Not Found", f'{plural} "{name}" not found')
        if method == "GET":
            return current
        if method == "DELETE":
            self._write(key, current, None)
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name}}
        if method == "PATCH" and content_type != MERGE_PATCH:
            raise error(415, "Unsupported Media Type", f"the fake models merge patches only, not {content_type}")
        if method not in ("PUT", "PATCH"):
            raise error(405, "Method Not Allowed", method)
        given = (body.get("metadata") or {}).get("resourceVersion", None if method == "PATCH" else "")
        if given == "":
            raise error(
                422,
                "Unprocessable Entity",
                f'{plural} "{name}" is invalid: metadata.resourceVersion: must be specified for an update',
            )
        if given is not None and not str(given).isdigit():
            raise error(500, "Internal Server Error", f'strconv.ParseUint: parsing "{given}": invalid syntax')
        if given is not None and str(given) != current["metadata"]["resourceVersion"]:
            raise error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        if method == "PUT" and (body.get("metadata") or {}).get("name") != name:
            raise error(400, "Bad Request", f"the name of the object does not match the name on the URL ({name})")
        proposed = body if method == "PUT" else merge_patch(copy.deepcopy(current), body)
        if plural in STATUS_SUBRESOURCE:  # a status write changes only .status, any other write never does
            changed, kept = (
                (proposed, copy.deepcopy(current)) if sub == "status" else (copy.deepcopy(current), proposed)
            )
            kept.pop("status", None)
            if "status" in changed:
                kept["status"] = changed["status"]
            proposed = kept
        metadata = proposed.setdefault("metadata", {})
        for field in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if field in current["metadata"]:
                metadata[field] = current["metadata"][field]
            else:
                metadata.pop(field, None)
        if "generation" in metadata and _spec_of(proposed) != _spec_of(current):
            metadata["generation"] += 1
        metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        if proposed == current:
            return current  # nothing changed: nothing written, the version stays
        return self._write(key, current, proposed)

    def _create(self, collection: str, namespace: str, plural: str, body: Obj, error: Callable[..., Exception]) -> Obj:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise error(422, "Unprocessable Entity", "metadata.name: Required value (generateName is not modelled)")
        if (collection, namespace, name) in self._objects:
            raise error(409, "AlreadyExists", f'{plural} "{name}" already exists')
        obj = copy.deepcopy(body)
        if plural in STATUS_SUBRESOURCE:
            obj.pop("status", None)
        moment = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        obj["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=moment)
        if collection.startswith(f"/apis/{GROUP}/"):
            obj["metadata"]["generation"] = 1
        return self._write((collection, namespace, name), None, obj)

    def _write(self, key: Key, before: Obj | None, after: Obj | None) -> Obj:
        """Commit one change under a new resourceVersion and record its event; return what is stored."""
        self._version += 1
        stored = copy.deepcopy(after if after is not None else before)
        assert stored is not None
        stored["metadata"]["resourceVersion"] = str(self._version)
        if after is None:
            del self._objects[key]
        else:
            self._objects[key] = stored
        if len(self._events) == self._events.maxlen:
            self._oldest = self._events[0].version
        self._events.append(_Event(self._version, key[0], key[1], before, stored if after is not None else None))
        self._condition.notify_all()
        return stored

    @staticmethod
    def _selected(query: dict[str, Any]) -> Callable[[Obj], bool]:
        labels = label_matcher(str(query.get("labelSelector") or ""))
        fields = field_matcher(str(query.get("fieldSelector") or ""))
        return lambda obj: fields(obj) and labels(obj["metadata"].get("labels") or {})

    # -- watches ---------------------------------------------------------------------------

    def watch(
        self,
        path: str,
        *,
        query: dict[str, Any],
        timeout_seconds: int,
        on_response: Callable[[Any], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield the events after ``query["resourceVersion"]`` until ``timeout_seconds`` pass, ``close``, or the
        ``shutdown()`` of the response handed to ``on_response`` (as ``KubernetesApi.watch`` does).

        Raises (at the first ``next``, as the real generator does):
            GoneError: that version is older than the kept history (list again).
            ApiError: a selector that does not parse (400), or no resourceVersion (500, as our server).
        """
        self.stats["requests"] += 1
        collection, namespace, _, _ = _parse(path)
        matches = self._selected(query)
        since = str(query.get("resourceVersion") or "0")
        if since == "0" or not since.isdigit():
            raise api_error(500, "InternalError", "watch without a resourceVersion is not modelled", "WATCH", path)
        position, deadline = int(since), time.monotonic() + timeout_seconds
        ended = threading.Event()

        def shutdown() -> None:
            with self._condition:
                ended.set()
                self._condition.notify_all()

        if on_response is not None:
            on_response(SimpleNamespace(shutdown=shutdown))
        while True:
            with self._condition:
                while not self._closed and not ended.is_set() and self._version <= position:
                    if not self._condition.wait(max(0.0, deadline - time.monotonic())):
                        break
                if self._closed or ended.is_set() or self._version <= position:
                    return
                if position < self._oldest:
                    message = f"too old resource version: {position} ({self._oldest})"
                    raise GoneError(410, "Expired", message, "WATCH", path)
                events = [event for event in self._events if event.version > position]
            for event in events:
                position = event.version
                if (event.collection, event.namespace) != (collection, namespace):
                    continue
                was = event.before is not None and matches(event.before)
                if event.after is not None and matches(event.after):
                    shown, kind = copy.deepcopy(event.after), "MODIFIED" if was else "ADDED"
                elif was and event.before is not None:  # deleted, or no longer selected: the last object
                    shown, kind = copy.deepcopy(event.before), "DELETED"
                    shown["metadata"]["resourceVersion"] = str(event.version)  # at this version
                else:
                    continue
                self.stats["bytes_received"] += len(json.dumps(shown))
                yield {"type": kind, "object": shown}


def _spec_of(obj: Obj) -> Obj:
    """Everything but metadata and status: what ``generation`` counts changes of."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}
