"""Combining adds: many agents adding to one counter cost O(1) requests each, not O(N) retries.

An ``add`` on a contended key (the exit barrier: every agent adds 1 to one counter) does not
compare-and-swap the counter itself. It creates its own small add request (a RendezvousKey
labelled with the counter it adds to, holding the amount), which never conflicts. One adder at a
time folds every pending request into the counter in one write: the new value, plus each folded
request's resulting value under ``ADDS_ANNOTATION`` (``{request id: value after it}``), which is
what each adder's ``add`` returns. The adder whose pending request has the smallest id folds at
once; any other adder folds only after it waited ``FOLD_PATIENCE_SECONDS`` without its request
being folded (its folder died). N adders cost about 2N requests (create, then delete the request)
plus one write per fold, instead of O(N log N) lost compare-and-swaps.

This module is the pure part: parsing and the fold itself. ``adder`` does the I/O.

Exactly once: a fold skips a request already in the counter's map, and the compare-and-swap of
the counter on its resourceVersion lets only one fold of a given version commit. A folded
request's map entry stays until its request object is gone (its adder deletes it once it read
its value), so a folder that still sees the request also sees it folded.

Not guaranteed: order between adders in one fold (they are folded by request id, not by arrival).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Annotation on a counter key: JSON ``{request id: the counter's value right after that request}``.
ADDS_ANNOTATION = "kube-rendezvous.io/adds"
#: Label on an add request: the hash part of the counter key's object name (a label value fits 63).
ADDS_TO_LABEL = "kube-rendezvous.io/adds-to"
#: Seconds an adder waits for the adder with the smallest pending request id to fold its request,
#: before folding itself (randomly up to twice that, so crashed folders are replaced one at a time).
FOLD_PATIENCE_SECONDS = 1.0
#: Infix of an add request's object name: ``<counter name prefix>.a-<counter hash>-<request id>``.
REQUEST_INFIX = ".a-"


@dataclass(frozen=True)
class AddRequest:
    """One pending ``add``: its id (unique per call) and the amount to add."""

    id: str
    amount: int


class CounterValueError(ValueError):
    """Raised when an ``add`` finds a value at the key that is not an integer."""


def request_name(counter_name: str, request_id: str) -> str:
    """The object name of add request ``request_id`` on the counter key object ``counter_name``."""
    prefix, _, digest = counter_name.rpartition(".k-")
    return f"{prefix}{REQUEST_INFIX}{digest}-{request_id}"


def counter_digest(counter_name: str) -> str:
    """The hash part of a counter key's object name (what ``ADDS_TO_LABEL`` holds)."""
    return counter_name.rpartition(".k-")[2]


def request_of(obj: Mapping[str, Any]) -> tuple[str, AddRequest] | None:
    """``(counter digest, request)`` for an add request object, else None (not one, or malformed)."""
    metadata = obj.get("metadata") or {}
    digest = (metadata.get("labels") or {}).get(ADDS_TO_LABEL)
    name = str(metadata.get("name") or "")
    if not digest or REQUEST_INFIX not in name:
        return None
    request_id = name.rpartition("-")[2]
    try:
        amount = int(base64.b64decode((obj.get("spec") or {}).get("value") or ""))
    except ValueError:
        return None
    return str(digest), AddRequest(request_id, amount)


def annotation_map(obj: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """The JSON object in annotation ``name`` of ``obj`` (empty when absent or malformed)."""
    text = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(name, "")
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def folded(obj: Mapping[str, Any] | None) -> dict[str, int]:
    """The counter's map of folded request ids to their resulting values (empty when absent or malformed)."""
    return {str(key): value for key, value in annotation_map(obj, ADDS_ANNOTATION).items() if isinstance(value, int)}


def fold(
    key: str, value: bytes | None, done: Mapping[str, int], pending: Iterable[AddRequest], present: Iterable[str]
) -> tuple[int, dict[str, int]]:
    """Fold ``pending`` into a counter holding ``value`` (None: missing, counts as 0).

    ``done`` is the counter's map of folded requests; entries whose request is not ``present``
    any more are dropped (their adders read them and deleted the request). Requests already in
    ``done`` are skipped. Returns the new value and the new map.

    Raises:
        CounterValueError: ``value`` is not an integer.
    """
    try:
        total = int(value or b"0")
    except ValueError:
        raise CounterValueError(
            f"add({key!r}): the key holds {value[:40]!r}, not an integer; set it to an integer or add to another key"
            if value is not None
            else f"add({key!r}): the key holds no integer"
        ) from None
    alive = set(present)
    kept = {request_id: result for request_id, result in done.items() if request_id in alive}
    for request in sorted(pending, key=lambda each: each.id):
        if request.id in kept:
            continue
        total += request.amount
        kept[request.id] = total
    return total, kept


def encode(done: Mapping[str, int]) -> str:
    return json.dumps(dict(done), separators=(",", ":"))


__all__ = [
    "ADDS_ANNOTATION",
    "ADDS_TO_LABEL",
    "FOLD_PATIENCE_SECONDS",
    "AddRequest",
    "CounterValueError",
    "annotation_map",
    "counter_digest",
    "encode",
    "fold",
    "folded",
    "request_name",
    "request_of",
]
