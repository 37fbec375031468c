"""What the operator decides of a Rendezvous's conditions, as pure functions: the spec's problems, the verdict
on its ``status.state``, and the Ready and Closed conditions that follow.

Nothing here does I/O; ``conditions`` writes what it decides. The operator reads ``status.state`` with
``decode_document``, the agents' own bounded validator: it never unpickles anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import (
    PlacementSpec,
    RendezvousDocument,
    RendezvousTimings,
    StateDocumentError,
    decode_document,
    format_time,
)

#: The Ready reason for a ``status.state`` that the agents would refuse.
STATE_INVALID = "StateInvalid"


def set_condition(
    conditions: list[dict[str, Any]],
    condition_type: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]] | None:
    """Return ``conditions`` with ``condition_type`` set, or None when nothing would change.

    ``lastTransitionTime`` moves only when ``status`` changes (metav1.Condition semantics).
    """
    current = next((item for item in conditions if item.get("type") == condition_type), None)
    wanted = {
        "type": condition_type,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": format_time(now),
    }
    if current is not None:
        if all(current.get(key) == wanted[key] for key in ("status", "reason", "message", "observedGeneration")):
            return None
        if current.get("status") == status:
            wanted["lastTransitionTime"] = current.get("lastTransitionTime", wanted["lastTransitionTime"])
    return [item for item in conditions if item.get("type") != condition_type] + [wanted]


def find_condition(status: dict[str, Any], condition_type: str) -> dict[str, Any] | None:
    """The condition of ``condition_type`` in ``status``, or None."""
    return next((item for item in status.get("conditions") or [] if item.get("type") == condition_type), None)


# -- spec ------------------------------------------------------------------------------------


def _resolve_timings(spec: dict[str, Any]) -> tuple[RendezvousTimings, str | None]:
    try:
        return RendezvousTimings.resolve(None, spec), None
    except ValueError as exc:
        return RendezvousTimings(), str(exc)


def timings(spec: dict[str, Any]) -> RendezvousTimings:
    """The spec's timings as the agents resolve them without rdzv-conf (defaults if the spec is invalid)."""
    return _resolve_timings(spec)[0]


def heartbeat_expiry(spec: dict[str, Any]) -> timedelta:
    """How long a node may miss heartbeats before the agents prune it."""
    return timedelta(seconds=timings(spec).heartbeat_expiry)


def spec_problems(spec: dict[str, Any]) -> list[str]:
    """Return what is wrong with a Rendezvous spec, each naming the field and the fix (empty: valid).

    The CRD's schema and CEL rules already refuse most mistakes; these are the ones they cannot.
    """
    problems = []
    min_nodes, max_nodes = spec.get("minNodes"), spec.get("maxNodes")
    if not isinstance(min_nodes, int) or not isinstance(max_nodes, int) or not 1 <= min_nodes <= max_nodes:
        problems.append(f"spec.minNodes ({min_nodes}) and spec.maxNodes ({max_nodes}) must satisfy 1 <= min <= max")
    resolved, problem = _resolve_timings(spec)
    if problem is not None:
        problems.append(problem)
    elif spec.get("joinTimeoutSeconds") is not None and resolved.join < resolved.heartbeat_expiry:
        problems.append(
            f"spec.joinTimeoutSeconds ({resolved.join:g}) is shorter than the heartbeat expiry "
            f"({resolved.heartbeat_expiry:g} s = keepAliveIntervalSeconds x keepAliveMaxAttempts): "
            "nodes would give up before a dead node is noticed; raise joinTimeoutSeconds"
        )
    try:
        PlacementSpec.from_spec(spec)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


# -- state -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredState:
    """``status.state`` as last read: its text, and its document or the reason it was refused."""

    text: object
    document: RendezvousDocument | None = None
    error: StateDocumentError | None = None


def read_state(text: object, cached: StoredState | None) -> StoredState:
    """Return ``cached`` when ``text`` is what it was read from; else decode ``text`` (bounded, no pickle).

    An empty or absent ``text`` means no agent has written a state yet (as for the agents).
    """
    if cached is not None and (cached.text is text or cached.text == text):
        return cached
    if text is None or text == "":
        return StoredState(text)
    try:
        return StoredState(text, document=decode_document(text))
    except StateDocumentError as exc:
        return StoredState(text, error=exc)
    except Exception as exc:  # noqa: BLE001 - fail closed: a validator bug must not pass a state as valid
        return StoredState(text, error=StateDocumentError("text", f"could not be checked ({type(exc).__name__})"))


@dataclass(frozen=True)
class StateCheck:
    """Whether the stored state is one the agents can use."""

    ok: bool
    reason: str
    message: str


def check_state(stored: StoredState) -> StateCheck:
    """The verdict on a read state: valid, absent, or ``StateInvalid`` with the validator's message."""
    if stored.error is not None:
        return StateCheck(False, STATE_INVALID, str(stored.error))
    if stored.document is None:
        return StateCheck(True, "NoStateYet", "no agent has written the state yet")
    return StateCheck(True, "StateValid", "the state is a valid state document")


def ready_condition(problems: list[str], check: StateCheck) -> tuple[str, str, str, str]:
    """The Ready condition ``(type, status, reason, message)`` for spec problems and a state check.

    An invalid state comes first: it stops the agents now; spec problems are appended to its message.
    """
    if not check.ok:
        message = "; ".join([check.message, *problems])
        return ("Ready", "False", check.reason, message)
    if problems:
        return ("Ready", "False", "InvalidSpec", "; ".join(problems))
    return ("Ready", "True", "Valid", "the spec is valid; agents rendezvous through this object")


def placement_spec(spec: Mapping[str, Any]) -> PlacementSpec:
    """The Rendezvous's ``PlacementSpec``; the defaults when its spec is invalid (``spec_problems`` says so)."""
    try:
        return PlacementSpec.from_spec(spec)
    except ValueError:
        return PlacementSpec()


def closed_condition(status: dict[str, Any]) -> tuple[str, str, str, str]:
    """The ``Closed`` condition of a closed Rendezvous: reason ``Requested`` (a person closed it) or ``Succeeded``
    (the run finished), from ``status.closeReason``; ``Closed`` when no writer of this release said which."""
    reason, _, message = str(status.get("closeReason") or "").partition(": ")
    if reason not in ("Requested", "Succeeded"):
        return ("Closed", "True", "Closed", f"closed in round {status.get('round')}")
    return ("Closed", "True", reason, f"closed in round {status.get('round')}: {message}")


def nodes_until_folded(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, int]:
    """``status.minNodes``/``maxNodes`` from the spec, for an object no fold has written them to yet (else none).

    The folder writes what the agents follow (their ``--nnodes``); ``kubectl get rdzv`` shows those columns.
    """
    low, high = spec.get("minNodes"), spec.get("maxNodes")
    if status.get("minNodes") is not None or not isinstance(low, int) or not isinstance(high, int):
        return {}
    return {"minNodes": low, "maxNodes": high}
