"""What the TTL rule decides, as pure functions: whether a Rendezvous has a TTL after its close, and how long
is left of it.

Nothing here does I/O; ``ttl`` waits and deletes the object.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kube_rendezvous import parse_time


def has_ttl(spec: Mapping[str, Any]) -> bool:
    """Whether the Rendezvous has ``spec.ttlSecondsAfterClosed`` (then ``ttl.delete_after_ttl`` runs for it)."""
    return spec.get("ttlSecondsAfterClosed") is not None


def ttl_remaining(status: Mapping[str, Any], ttl: int, now: datetime) -> float | None:
    """Seconds left of the ``ttl`` of a closed Rendezvous with ``status`` (counted from its ``lastChangeTime``);
    None while it is not closed or that time cannot be read."""
    try:
        changed = parse_time(status["lastChangeTime"]) if status.get("closed") else None
    except (KeyError, TypeError, ValueError):
        changed = None
    if changed is None:
        return None
    return ttl - (now - changed).total_seconds()
