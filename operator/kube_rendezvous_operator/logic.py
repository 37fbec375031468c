"""What the operator decides, as pure functions: conditions, spec checks, events, pod matching.

Nothing here does I/O; ``handlers`` feeds it Kubernetes objects and acts on the answers.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from kube_rendezvous.encoding import StateEncodingError, decode_state
from kube_rendezvous.statecheck import ForbiddenGlobalError, check_state_pickle
from kube_rendezvous.summary import format_time

#: Evicted node names kept in ``status.evictedNodes`` (oldest dropped first).
EVICTED_NODES_KEPT = 256
DEFAULT_HEARTBEAT_EXPIRY = timedelta(seconds=15)


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


def spec_problems(spec: dict[str, Any]) -> list[str]:
    """Return what is wrong with a Rendezvous spec, each naming the field and the fix (empty: valid).

    The CRD's schema and CEL rules already refuse most mistakes; these are the ones they cannot.
    """
    problems = []
    min_nodes, max_nodes = spec.get("minNodes"), spec.get("maxNodes")
    if not isinstance(min_nodes, int) or not isinstance(max_nodes, int) or not 1 <= min_nodes <= max_nodes:
        problems.append(f"spec.minNodes ({min_nodes}) and spec.maxNodes ({max_nodes}) must satisfy 1 <= min <= max")
    interval = spec.get("keepAliveIntervalSeconds")
    heartbeat_budget = (interval or 5) * (spec.get("keepAliveMaxAttempts") or 3)
    join = spec.get("joinTimeoutSeconds")
    if join is not None and join < heartbeat_budget:
        problems.append(
            f"spec.joinTimeoutSeconds ({join}) is shorter than the heartbeat expiry ({heartbeat_budget} s): "
            "nodes would give up before a dead node is noticed; raise joinTimeoutSeconds"
        )
    return problems


@dataclass(frozen=True)
class StateCheck:
    """Whether the stored state is one the agents can use."""

    ok: bool
    reason: str
    message: str


def check_stored_state(encoded: str | None) -> StateCheck:
    """Decode and check ``status.state`` without running any of it (restricted unpickler)."""
    if not encoded:
        return StateCheck(True, "NoStateYet", "no agent has written the state yet")
    try:
        check_state_pickle(decode_state(encoded))
    except StateEncodingError as exc:
        return StateCheck(False, "StateCorrupt", str(exc))
    except ForbiddenGlobalError as exc:
        return StateCheck(False, "HostileState", str(exc))
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        return StateCheck(False, "StateCorrupt", f"status.state is not a rendezvous state pickle: {exc}")
    return StateCheck(True, "StateValid", "the state decodes and refers only to rendezvous types")


@dataclass(frozen=True)
class RendezvousEvent:
    """A Kubernetes Event the operator posts on a Rendezvous."""

    type: str  # Normal or Warning
    reason: str
    message: str


def _members(status: dict[str, Any]) -> dict[str, int]:
    return {item["node"]: item["rank"] for item in status.get("participants") or []}


def summary_events(old: dict[str, Any] | None, new: dict[str, Any]) -> list[RendezvousEvent]:
    """Events for what changed between two readable summaries (``status``) of one Rendezvous."""
    old = old or {}
    events: list[RendezvousEvent] = []
    same_run = old.get("runId") in (None, new.get("runId"))
    before = set(_members(old)) | set(old.get("waiting") or []) if same_run else set()
    after = set(_members(new)) | set(new.get("waiting") or [])
    evicted = set(new.get("evictedNodes") or [])
    for node in sorted(after - before):
        events.append(RendezvousEvent("Normal", "NodeJoined", f"node {node} joined round {new.get('round')}"))
    for node in sorted(before - after):
        if node not in evicted:
            events.append(RendezvousEvent("Normal", "NodeLeft", f"node {node} left"))
    became_complete = new.get("phase") == "Complete" and (
        old.get("phase") != "Complete" or old.get("round") != new.get("round")
    )
    if became_complete:
        members = _members(new)
        listed = ", ".join(f"{node}={rank}" for node, rank in sorted(members.items(), key=lambda item: item[1]))
        events.append(
            RendezvousEvent(
                "Normal",
                "RoundCompleted",
                f"round {new.get('round')} completed with {new.get('participantCount', len(members))} nodes: {listed}",
            )
        )
    if new.get("closed") and not old.get("closed"):
        events.append(RendezvousEvent("Normal", "Closed", f"rendezvous closed in round {new.get('round')}"))
    return events


def node_address(node: str) -> str:
    """The address part of a node name ``<addr>_<pid>_<local id>``."""
    parts = node.rsplit("_", 2)
    return parts[0] if len(parts) == 3 else node


def pod_is_gone(pod: dict[str, Any], event_type: str | None) -> bool:
    """Whether a training pod can no longer run its agent: deleted, terminating or all containers ended."""
    if event_type == "DELETED" or pod.get("metadata", {}).get("deletionTimestamp"):
        return True
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    containers = status.get("containerStatuses") or []
    return bool(containers) and all((item.get("state") or {}).get("terminated") for item in containers)


def nodes_of_pod(pod: dict[str, Any], nodes: list[str]) -> list[str]:
    """The rendezvous nodes an agent in ``pod`` registered, matched by pod IP, name or hostname."""
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec") or {}, pod.get("status") or {}
    names = {metadata.get("name"), spec.get("hostname")} - {None}
    addresses = {status.get("podIP")} | {item.get("ip") for item in status.get("podIPs") or []}
    addresses -= {None, ""}
    matched = []
    for node in nodes:
        address = node_address(node)
        if address in addresses or address in names or any(address.startswith(f"{name}.") for name in names):
            matched.append(node)
    return matched


def known_nodes(status: dict[str, Any]) -> list[str]:
    """Every node named in a summary: participants, waiting nodes and heartbeats."""
    found = set(_members(status)) | set(status.get("waiting") or [])
    found |= {item["node"] for item in status.get("heartbeats") or []}
    return sorted(found)


def with_evicted(status: dict[str, Any], nodes: list[str]) -> list[str] | None:
    """``status.evictedNodes`` with ``nodes`` added (bounded), or None when all are there already."""
    current = list(status.get("evictedNodes") or [])
    added = [node for node in nodes if node not in current]
    if not added:
        return None
    return (current + added)[-EVICTED_NODES_KEPT:]


def live_agents(status: dict[str, Any], now: datetime, expiry: timedelta = DEFAULT_HEARTBEAT_EXPIRY) -> list[str]:
    """Nodes whose last heartbeat is within ``expiry`` of ``now`` (agents' clocks; not fenced)."""
    if status.get("closed"):
        return []
    alive = []
    for item in status.get("heartbeats") or []:
        try:
            beat = datetime.strptime(item["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        except (KeyError, ValueError):
            continue
        if now - beat <= expiry:
            alive.append(item["node"])
    return alive


def heartbeat_expiry(spec: dict[str, Any]) -> timedelta:
    """How long a node may miss heartbeats before the agents prune it."""
    return timedelta(seconds=(spec.get("keepAliveIntervalSeconds") or 5) * (spec.get("keepAliveMaxAttempts") or 3))
