"""What the operator tells of a Rendezvous as Kubernetes Events, as pure functions: the story of its rounds
(joins, leaves, promoted spares, completed rounds, the close), its held nodes and its broken rounds.

Nothing here does I/O; ``events`` posts what it decides. Full membership comes from the decoded document,
since the readable summary in ``status`` lists only the first nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_rendezvous import (
    NodeId,
    RendezvousDocument,
    departure_line,
    parse_time,
)

#: Evicted node names kept in ``status.evictedNodes`` (oldest dropped first; the CRD's maxItems).
#: Nodes named one by one in Events; beyond that, one Event counts them and names the first ones.
NODES_LISTED = 16


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RendezvousEvent:
    """A Kubernetes Event the operator posts on a Rendezvous; ``count`` is how many nodes it covers."""

    type: str  # Normal or Warning
    reason: str
    message: str
    count: int = 1


def listed_names(names: list[str]) -> str:
    """``names`` joined by commas: the first ``NODES_LISTED``, then how many more."""
    shown = ", ".join(names[:NODES_LISTED])
    return shown if len(names) <= NODES_LISTED else f"{shown} and {len(names) - NODES_LISTED} more"


def _node_events(reason: str, names: list[str], one: str, many: str) -> list[RendezvousEvent]:
    """One Event per node, or a single counting Event when there are more than ``NODES_LISTED``."""
    if len(names) <= NODES_LISTED:
        return [RendezvousEvent("Normal", reason, one.format(node=name)) for name in names]
    return [RendezvousEvent("Normal", reason, many.format(count=len(names), nodes=listed_names(names)), len(names))]


def newly_formed(old: RendezvousDocument | None, new: RendezvousDocument | None) -> bool:
    """Whether ``new`` is a round that formed since ``old`` (complete, and ``old`` was not this round complete)."""
    if new is None or not new.complete:
        return False
    return old is None or not old.complete or old.round != new.round


def formed_members(
    previous: frozenset[NodeId] | None, old: RendezvousDocument | None, new: RendezvousDocument | None
) -> frozenset[NodeId] | None:
    """The participants of the last round that formed: ``new``'s when it just formed, else ``previous``.

    A formed round that loses participants (a survivor leaving it to re-form) keeps ``previous``.
    """
    if new is not None and newly_formed(old, new):
        return frozenset(new.participants)
    return previous


def announced_baseline(
    document: RendezvousDocument, announced: Iterable[tuple[str, str]]
) -> tuple[RendezvousDocument | None, frozenset[NodeId] | None]:
    """What an operator that sees ``document`` for the first time may take as already told.

    ``announced`` are the (reason, message) of the Events already posted on the Rendezvous (by an
    earlier leader or an earlier run of this operator). When its current round's RoundCompleted is
    among them, the round counts as seen (baseline ``document``, formed members its participants),
    so ``state_events`` repeats neither its NodeJoined nor its RoundCompleted; Closed likewise.
    Otherwise ``(None, None)``: everything is new.
    """
    events = list(announced)
    round_told = document.complete and any(
        reason == "RoundCompleted" and message.startswith(f"round {document.round} completed")
        for reason, message in events
    )
    if not round_told:
        return None, None
    closed_told = any(reason == "Closed" for reason, _ in events)
    baseline = document if closed_told or not document.closed else dataclasses.replace(document, closed=False)
    return baseline, frozenset(document.participants)


def state_events(
    old: RendezvousDocument | None,
    new: RendezvousDocument,
    *,
    same_run: bool = True,
    evicted: Iterable[str] = (),
    last_formed: frozenset[NodeId] | None = None,
    spares: frozenset[NodeId] = frozenset(),
    close_reason: str | None = None,
) -> list[RendezvousEvent]:
    """Events for the ``new`` document after the ``old`` one: the story told once per round.

    SparePromoted for each participant of a round that formed that was a spare (``old``'s redundancy list, or
    ``spares``: those seen since the last round formed; a spare may pass the wait list on its way in).

    Membership Events come only when a round forms, against ``last_formed`` (the participants of
    the round that formed before it): NodeJoined for each new participant, NodeLeft for each
    one of the last round that is not in this one. A survivor that leaves a round and joins the
    next, nodes waiting, and every write while a round forms post nothing; each Event names the
    round that formed. ``same_run`` False (``status.runId`` changed) treats everyone as new.
    Nodes in ``evicted`` get no NodeLeft: the operator posted NodeEvicted for them already.

    Not guaranteed: a round that formed and was replaced between two observations of the operator
    (it saw neither complete state) posts nothing of its own; the next one is compared with the
    last formed round the operator saw.
    """
    base = old if same_run else None
    before = (last_formed or frozenset()) if same_run else frozenset()
    events: list[RendezvousEvent] = []
    if newly_formed(base, new):
        after = set(new.participants)
        gone_evicted = set(evicted)
        joined = [str(node) for node in sorted(after - before)]
        left = [str(node) for node in sorted(before - after) if str(node) not in gone_evicted]
        events += _node_events(
            "NodeJoined",
            joined,
            f"node {{node}} joined round {new.round}",
            f"{{count}} nodes joined round {new.round}: {{nodes}}",
        )
        events += _node_events(
            "NodeLeft",
            left,
            f"node {{node}} left: round {new.round} formed without it",
            f"{{count}} nodes left: round {new.round} formed without them: {{nodes}}",
        )
        was_spare = (base.redundancy_list if base is not None else frozenset()) | (spares if same_run else frozenset())
        events += _node_events(
            "SparePromoted",
            [str(node) for node in sorted(after & was_spare - before)],
            f"spare node {{node}} was promoted into round {new.round}",
            f"{{count}} spare nodes were promoted into round {new.round}: {{nodes}}",
        )
        ranked = sorted(new.participants.items(), key=lambda item: (item[1], item[0]))
        listed = listed_names([f"{node}={rank}" for node, rank in ranked])
        events.append(
            RendezvousEvent(
                "Normal", "RoundCompleted", f"round {new.round} completed with {len(ranked)} nodes: {listed}"
            )
        )
    if new.closed and (base is None or not base.closed):
        why = f": {close_reason}" if close_reason else ""
        events.append(RendezvousEvent("Normal", "Closed", f"rendezvous closed in round {new.round}{why}"))
    return events


def held_event(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> RendezvousEvent | None:
    """``NodeHeld`` for the nodes ``status.heldNodes`` lists that ``previous`` did not: their Kubernetes Node
    does not admit them to a new round (``placement.hold_reason``)."""

    def held(of: Mapping[str, Any] | None) -> dict[str, str]:
        items = (of or {}).get("heldNodes") or []
        return {str(item.get("node")): str(item.get("reason")) for item in items if isinstance(item, Mapping)}

    before, now = held(previous), held(status)
    new = sorted(node for node in now if node not in before)
    if not new:
        return None
    if len(new) == 1:
        return RendezvousEvent(
            "Warning", "NodeHeld", f"node {new[0]} waits, not admitted to a new round: {now[new[0]]}"
        )
    listed = listed_names([f"{node} ({now[node].split(':', 1)[0]})" for node in new])
    return RendezvousEvent(
        "Warning", "NodeHeld", f"{len(new)} nodes wait, not admitted to a new round: {listed}", len(new)
    )


def departure_event(
    previous: Mapping[str, Any] | None, status: Mapping[str, Any], announced: Iterable[tuple[str, str]] = ()
) -> RendezvousEvent | None:
    """``RoundBroken`` when ``status.lastDeparture`` is new: a formed round lost members, the others restart.

    None when it did not change since ``previous`` (the last status observed), or when that Event is
    among the ``announced`` (reason, message) pairs (a restarted operator does not repeat it).
    """
    departure = status.get("lastDeparture")
    if not isinstance(departure, Mapping) or departure == (previous or {}).get("lastDeparture"):
        return None
    message = f"{departure_line(departure)}; its other members re-rendezvous without it"
    if ("RoundBroken", message) in set(announced):
        return None
    return RendezvousEvent("Warning", "RoundBroken", message, int(departure.get("count") or 1))


#: The Events of a Rendezvous also told on its workloads (the controllers of its training pods): the story of
#: its rounds, not each node's.
WORKLOAD_REASONS = frozenset({"RoundCompleted", "RoundBroken", "Closed", "StateInvalid"})


def _controller_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The workload that controls ``pod`` (its controller owner: a Job, a JobSet's Job, ...) as an Event's
    involved object, or None."""
    meta = pod.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("controller") and owner.get("kind") and owner.get("name"):
            owned = {"name": owner.get("name"), "namespace": meta.get("namespace"), "uid": owner.get("uid")}
            return {"apiVersion": owner.get("apiVersion"), "kind": owner.get("kind"), "metadata": owned}
    return None


def told_on(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What an eviction of ``pod``'s nodes is told on besides the Rendezvous: the pod, and the workload that
    controls it (``_controller_of``), as Event involved objects."""
    controller = _controller_of(pod)
    return [pod_reference(pod), *([controller] if controller else [])]


def pod_reference(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` as an Event's involved object (its name, namespace and uid)."""
    meta = pod.get("metadata") or {}
    reference: dict[str, Any] = {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": reference}


def workloads(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The distinct workloads that control ``pods`` (a Rendezvous's training pods), as Event involved objects."""
    found: dict[object, dict[str, Any]] = {}
    for pod in pods:
        controller = _controller_of(pod)
        if controller is not None:
            found.setdefault(controller["metadata"]["uid"], controller)
    return list(found.values())


def on_workload(event: RendezvousEvent, namespace: str, rendezvous: str) -> RendezvousEvent:
    """``event`` of Rendezvous ``namespace/rendezvous`` as told on one of its workloads: naming the rendezvous."""
    return dataclasses.replace(event, message=f"rendezvous {namespace}/{rendezvous}: {event.message}")


def pod_eviction_event(
    namespace: str, rendezvous: str, nodes: list[str], pod: Mapping[str, Any], because: str
) -> RendezvousEvent:
    """``NodeEvicted`` as told on the pod and its workload: which rendezvous evicted which agents of which pod,
    on which Kubernetes Node, and why."""
    name = (pod.get("metadata") or {}).get("name")
    node_name = (pod.get("spec") or {}).get("nodeName")
    where = f" on Kubernetes node {node_name}" if node_name else ""
    message = f"rendezvous {namespace}/{rendezvous} evicted agent {listed_names(nodes)} of pod {name}{where}: {because}"
    return RendezvousEvent("Normal", "NodeEvicted", message, len(nodes))


# -- metrics ---------------------------------------------------------------------------------


def state_fingerprint(previous: int | None, text: object) -> tuple[int | None, bool]:
    """The fingerprint of ``status.state`` ``text`` to keep, and whether it is a new write of the state.

    The first state seen is a baseline (not counted); an absent state keeps the last fingerprint.
    """
    if not text:
        return previous, False
    fingerprint = hash(text)
    return fingerprint, previous is not None and fingerprint != previous


def _first_formed_after(status: Mapping[str, Any] | None, round_number: int) -> Mapping[str, Any] | None:
    """The first round after ``round_number`` that ``status.recentRounds`` says formed, or None."""
    formed = [
        item
        for item in (status or {}).get("recentRounds") or []
        if isinstance(item, Mapping) and isinstance(item.get("round"), int) and item["round"] > round_number
    ]
    return min(formed, key=lambda item: int(item["round"])) if formed else None


def recovery_seconds(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> float | None:
    """Seconds from the last broken round (``status.lastDeparture.time``) to the next round forming (its
    ``formedTime`` in ``status.recentRounds``), when that round formed since ``previous`` (the status seen last).

    None when nothing recovered since ``previous``, or when there is no ``previous`` (an operator that just
    started cannot tell whether the recovery was measured before it).
    """
    departure = status.get("lastDeparture")
    if previous is None or not isinstance(departure, Mapping) or not isinstance(departure.get("round"), int):
        return None
    formed = _first_formed_after(status, departure["round"])
    if formed is None:
        return None
    if previous.get("lastDeparture") == departure and _first_formed_after(previous, departure["round"]) is not None:
        return None
    try:
        seconds = (parse_time(str(formed.get("formedTime"))) - parse_time(str(departure.get("time")))).total_seconds()
    except ValueError:
        return None
    return max(0.0, seconds)
