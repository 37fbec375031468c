"""Bundles: keys written once, together, in one RendezvousKey object (``KubernetesStore.write_once``).

A round's rank assignment writes N keys that nobody writes again (rank 0's ``multi_set`` of every agent's
ranks). As N objects that is N creates through one API server; as a bundle it is one. A bundle is a
RendezvousKey whose ``spec.entries`` maps each key, as written, to its base64 value (its own ``spec.key``
only describes it). ``BundledKeys`` indexes the bundles one process's watch shows, by key, and the store's
reads look there after the key's own object.

Exactly once: a bundle's name is a hash of its keys, so a create sent again after a lost answer finds it
(409) and is done. A read served from a bundle answers as a GET would, because a key written once has
one value.

Not guaranteed: a bundled key written again (by ``set``, by anyone) breaks that promise: reads may keep
answering the bundled value. ``delete_key`` does not reach a bundled key; its round's cleanup does.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterable
from typing import Any

#: A bundle holds at most this many keys (the CRD's ``maxProperties``), of values of up to
#: ``BUNDLED_VALUE_BYTES`` each (larger ones get an object of their own), and about ``BUNDLE_BYTES`` in all.
BUNDLE_KEYS = 4096
BUNDLED_VALUE_BYTES = 3072
BUNDLE_BYTES = 512 * 1024


class BundledKeys:
    """The keys that bundles shown by one process's watch hold (``spec.entries``: keys written once,
    together, in one object), by key. ``changed`` is called from the watch thread for every object
    that changed (None after a list)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, bytes] = {}
        self._keys_of: dict[str, list[str]] = {}  # bundle object name -> its keys

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._values.get(key)

    def changed(self, obj: dict[str, Any] | None, present: bool, objects: Iterable[dict[str, Any]] = ()) -> None:
        with self._lock:
            if obj is None:
                self._values.clear()
                self._keys_of.clear()
                for item in objects:
                    self._add(item)
                return
            for key in self._keys_of.pop(obj["metadata"]["name"], ()):
                self._values.pop(key, None)
            if present:
                self._add(obj)

    def _add(self, obj: dict[str, Any]) -> None:
        entries = (obj.get("spec") or {}).get("entries")
        if not isinstance(entries, dict) or not entries:
            return
        try:
            values = {str(key): base64.b64decode(value) for key, value in entries.items()}
        except (TypeError, ValueError):
            return  # the CRD's schema admits only base64 strings; an object that is not is no bundle
        self._values.update(values)
        self._keys_of[obj["metadata"]["name"]] = list(values)


def split(pairs: Iterable[tuple[str, bytes]]) -> tuple[list[dict[str, str]], list[tuple[str, bytes]]]:
    """The bundles (key -> base64 value, each of two keys or more) and the keys to write alone."""
    alone: list[tuple[str, bytes]] = []
    groups: list[dict[str, bytes]] = [{}]
    size = 0
    for key, value in pairs:
        if len(value) > BUNDLED_VALUE_BYTES:
            alone.append((key, value))
            continue
        entry = len(key) + 4 * -(-len(value) // 3)  # the key and its value's base64
        if len(groups[-1]) >= BUNDLE_KEYS or size + entry > BUNDLE_BYTES:
            groups.append({})
            size = 0
        groups[-1][key] = value
        size += entry
    alone += [pair for group in groups if len(group) == 1 for pair in group.items()]
    shared = [group for group in groups if len(group) > 1]
    return [{key: base64.b64encode(value).decode("ascii") for key, value in group.items()} for group in shared], alone
