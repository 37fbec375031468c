"""What the operator decides of a Rendezvous's conditions, as pure functions: the spec's problems, the verdict
on its ``status.state``, and the Ready, Progressing and Closed conditions that follow (metav1.Condition's shape).

``Ready`` says whether the job can train: its round formed with at least minNodes and lost nobody since.
``Progressing`` says whether a round is forming or nodes wait for the next one. Their messages name the
round, not counts that move with each join, so they change (and are written) once per phase of a round.

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
#: A condition as the operator writes it: (type, status, reason, message).
Condition = tuple[str, str, str, str]
#: The ``status.phase`` of a round that forms (the CRD's enum): the job cannot train yet.
FORMING_PHASES = ("Joining", "LastCall")


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


def _min_nodes(status: Mapping[str, Any], spec: Mapping[str, Any]) -> object:
    """The minimum the agents follow (``status.minNodes``), else the spec's."""
    return status.get("minNodes") if status.get("minNodes") is not None else spec.get("minNodes")


def _broken(status: Mapping[str, Any]) -> bool:
    """Whether the current round lost members (``status.lastDeparture`` is of it): its others restart."""
    departure = status.get("lastDeparture")
    return isinstance(departure, Mapping) and departure.get("round") == status.get("round")


def ready_condition(
    problems: list[str], check: StateCheck, status: Mapping[str, Any], spec: Mapping[str, Any]
) -> Condition:
    """The Ready condition: True when the job can train (a formed round of at least minNodes that lost nobody).

    An invalid state comes first: it stops the agents now; spec problems are appended to its message.
    """
    if not check.ok:
        message = "; ".join([check.message, *problems])
        return ("Ready", "False", check.reason, message)
    if problems:
        return ("Ready", "False", "InvalidSpec", "; ".join(problems))
    phase, round_number, min_nodes = status.get("phase") or "Pending", status.get("round"), _min_nodes(status, spec)
    if status.get("closed") or phase == "Closed":
        return ("Ready", "False", "Closed", f"closed in round {round_number}: no round forms any more")
    if phase == "Complete" and _broken(status):
        return ("Ready", "False", "RoundBroken", f"round {round_number} lost members; its others re-rendezvous")
    count = status.get("participantCount") or 0
    if phase == "Complete" and isinstance(min_nodes, int) and count >= min_nodes:
        return ("Ready", "True", "RoundComplete", f"round {round_number} formed with {count} nodes: the job trains")
    if phase == "LastCall":
        return (
            "Ready",
            "False",
            "LastCall",
            f"round {round_number} has minNodes ({min_nodes}); it forms at its deadline",
        )
    if phase in ("Joining", "Complete"):
        return ("Ready", "False", "BelowMinNodes", f"round {round_number} has fewer than minNodes ({min_nodes}) nodes")
    return ("Ready", "False", "NoStateYet", "no agent has joined yet")


def progressing_condition(check: StateCheck, status: Mapping[str, Any]) -> Condition:
    """The Progressing condition: True while a round forms (or re-forms after a loss) or nodes wait for the next."""
    phase, round_number = status.get("phase") or "Pending", status.get("round")
    if not check.ok:
        return ("Progressing", "False", check.reason, "the agents cannot use the state: no round can form")
    if status.get("closed") or phase == "Closed":
        return ("Progressing", "False", "Closed", f"closed in round {round_number}")
    if phase in FORMING_PHASES:
        return ("Progressing", "True", "RoundForming", f"round {round_number} is forming")
    if _broken(status):
        return ("Progressing", "True", "RoundForming", f"round {round_number} lost members; the next round forms")
    if phase == "Complete" and status.get("waitingCount"):
        return ("Progressing", "True", "NodesWaiting", f"nodes wait for the round after round {round_number}")
    if phase == "Complete":
        return ("Progressing", "False", "RoundComplete", f"round {round_number} formed; no node waits")
    return ("Progressing", "True", "WaitingForAgents", "no agent has joined yet")


def with_document(status: Mapping[str, Any], document: RendezvousDocument | None) -> Mapping[str, Any]:
    """``status`` with its round's fields read from the decoded ``document`` (what the agents agreed on) rather
    than from the readable summary beside it, which a writer may have left stale; ``status`` when no state.

    The phase is the summary's (``kubectl get rdzv``'s Phase column; kept equal to the backend's
    ``rendezvous_phase``, which the library does not export).
    """
    if document is None:
        return status
    if document.closed:
        phase = "Closed"
    elif document.complete:
        phase = "Complete"
    else:
        phase = "LastCall" if document.deadline is not None else "Joining"
    counts = {"participantCount": len(document.participants), "waitingCount": len(document.wait_list)}
    return {**status, "phase": phase, "round": document.round, "closed": document.closed, **counts}


def job_conditions(
    spec: dict[str, Any], check: StateCheck, status: Mapping[str, Any], document: RendezvousDocument | None
) -> list[Condition]:
    """Ready and Progressing for a Rendezvous's spec, state check, status and decoded state ``document``."""
    current = with_document(status, document)
    return [ready_condition(spec_problems(spec), check, current, spec), progressing_condition(check, current)]


def placement_spec(spec: Mapping[str, Any]) -> PlacementSpec:
    """The Rendezvous's ``PlacementSpec``; the defaults when its spec is invalid (``spec_problems`` says so)."""
    try:
        return PlacementSpec.from_spec(spec)
    except ValueError:
        return PlacementSpec()


def closed_condition(status: dict[str, Any]) -> Condition:
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
