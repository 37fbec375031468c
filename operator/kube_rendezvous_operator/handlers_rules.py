"""What the operator decides, as pure functions: conditions, spec checks, state checks, events, pods.

Nothing here does I/O; ``handlers`` and ``pods`` feed it Kubernetes objects and act on the answers.

The operator reads ``status.state`` with ``decode_document``, the agents' own bounded validator:
it never unpickles anything. Full membership (events, eviction) comes from
the decoded document, since the readable summary in ``status`` lists only the first nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kube_rendezvous import (
    NodeFacts,
    NodeId,
    PlacementSpec,
    PodAddresses,
    RendezvousDocument,
    RendezvousTimings,
    StateDocumentError,
    TrainingPods,
    decode_document,
    departure_line,
    format_time,
    parse_time,
    placement_of,
)

#: Evicted node names kept in ``status.evictedNodes`` (oldest dropped first; the CRD's maxItems).
#: Nodes named one by one in Events; beyond that, one Event counts them and names the first ones.
NODES_LISTED = 16
#: The Ready reason for a ``status.state`` that the agents would refuse.
STATE_INVALID = "StateInvalid"
#: How much later than its pod's end a node's last heartbeat may be and still be that pod's (clock slack).
HEARTBEAT_SLACK = timedelta(seconds=2)


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


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RendezvousEvent:
    """A Kubernetes Event the operator posts on a Rendezvous; ``count`` is how many nodes it covers."""

    type: str  # Normal or Warning
    reason: str
    message: str
    count: int = 1


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:NODES_LISTED])
    return shown if len(names) <= NODES_LISTED else f"{shown} and {len(names) - NODES_LISTED} more"


def _node_events(reason: str, names: list[str], one: str, many: str) -> list[RendezvousEvent]:
    """One Event per node, or a single counting Event when there are more than ``NODES_LISTED``."""
    if len(names) <= NODES_LISTED:
        return [RendezvousEvent("Normal", reason, one.format(node=name)) for name in names]
    return [RendezvousEvent("Normal", reason, many.format(count=len(names), nodes=_listed(names)), len(names))]


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
        listed = _listed([f"{node}={rank}" for node, rank in ranked])
        events.append(
            RendezvousEvent(
                "Normal", "RoundCompleted", f"round {new.round} completed with {len(ranked)} nodes: {listed}"
            )
        )
    if new.closed and (base is None or not base.closed):
        why = f": {close_reason}" if close_reason else ""
        events.append(RendezvousEvent("Normal", "Closed", f"rendezvous closed in round {new.round}{why}"))
    return events


def placement_spec(spec: Mapping[str, Any]) -> PlacementSpec:
    """The Rendezvous's ``PlacementSpec``; the defaults when its spec is invalid (``spec_problems`` says so)."""
    try:
        return PlacementSpec.from_spec(spec)
    except ValueError:
        return PlacementSpec()


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
    listed = _listed([f"{node} ({now[node].split(':', 1)[0]})" for node in new])
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


# -- pods and nodes --------------------------------------------------------------------------


#: The pod labels a workload's controller sets, by the (API group, kind) of the Rendezvous's owner:
#: label -> which field of the owner it holds ("uid" or "name"), or a fixed value.
WORKLOAD_POD_LABELS: dict[tuple[str, str], dict[str, str]] = {
    ("batch", "Job"): {"batch.kubernetes.io/controller-uid": "uid"},
    ("jobset.x-k8s.io", "JobSet"): {"jobset.sigs.k8s.io/jobset-uid": "uid"},
    ("kubeflow.org", "PyTorchJob"): {
        "training.kubeflow.org/job-name": "name",
        "training.kubeflow.org/operator-name": "=pytorchjob-controller",
    },
    # Kubeflow Trainer runs a TrainJob as a JobSet of the same name.
    ("trainer.kubeflow.org", "TrainJob"): {"jobset.sigs.k8s.io/jobset-name": "name"},
}


@dataclass(frozen=True)
class PodSelector:
    """Which pods are a Rendezvous's training pods, and where that choice came from.

    A pod belongs to the Rendezvous when its labels contain every label of ``match_labels``
    or when it carries ``kube-rendezvous.io/rendezvous: <name>`` (always honoured).
    """

    match_labels: dict[str, str]
    #: Where ``match_labels`` came from: ``spec.podSelector``, ``owner <Kind> <name>``, or ``default``.
    source: str

    def describe(self) -> str:
        """The selector as ``kubectl get pods -l`` takes it."""
        return ",".join(f"{key}={value}" for key, value in sorted(self.match_labels.items()))


def _controller(owner_references: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The owner reference marked ``controller: true``, else the first one of a known workload kind."""
    owners = list(owner_references)
    controller = next((owner for owner in owners if owner.get("controller")), None)
    if controller is not None:
        return controller
    return next((owner for owner in owners if _workload_key(owner) in WORKLOAD_POD_LABELS), None)


def _workload_key(owner: dict[str, Any]) -> tuple[str, str]:
    api_version = str(owner.get("apiVersion") or "")
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return group, str(owner.get("kind") or "")


def pod_selector(name: str, spec: dict[str, Any], metadata: dict[str, Any], label: str) -> PodSelector:
    """The training pods of Rendezvous ``name``: ``spec.podSelector``, else its owner's pods, else ``label``.

    - ``spec.podSelector.matchLabels``, when it is set and not empty;
    - else, when the Rendezvous's controller (its ``ownerReferences``) is a Job, a JobSet, a
      PyTorchJob or a TrainJob, the labels that workload's controller puts on its pods
      (``WORKLOAD_POD_LABELS``);
    - else ``{label: name}``: pods labelled ``kube-rendezvous.io/rendezvous: <name>``.

    Not guaranteed: an owner of another kind falls back to the label; labels are matched as
    given (no ``matchExpressions``).
    """
    labels = dict(((spec.get("podSelector") or {}).get("matchLabels")) or {})
    if labels:
        return PodSelector(labels, "spec.podSelector")
    owner = _controller(metadata.get("ownerReferences") or [])
    shape = WORKLOAD_POD_LABELS.get(_workload_key(owner)) if owner is not None else None
    if owner is not None and shape is not None:
        derived = {
            key: field[1:] if field.startswith("=") else str(owner.get(field) or "") for key, field in shape.items()
        }
        if all(derived.values()):
            return PodSelector(derived, f"owner {owner.get('kind')} {owner.get('name')}")
    return PodSelector({label: name}, "default")


def selects(selector: PodSelector, labels: dict[str, str] | None) -> bool:
    """Whether a pod with ``labels`` is selected by ``selector``'s labels."""
    found = labels or {}
    return all(found.get(key) == value for key, value in selector.match_labels.items())


def rendezvouses_of_pod(labels: dict[str, str] | None, selectors: dict[str, PodSelector], label: str) -> list[str]:
    """The Rendezvous names (of one namespace, with their ``selectors``) that a pod with ``labels`` belongs to.

    A pod labelled ``label: <name>`` belongs to ``<name>`` even when that Rendezvous has not been
    seen yet; otherwise every Rendezvous whose selector selects the pod.
    """
    found = labels or {}
    named = found.get(label)
    matched = {name for name, selector in selectors.items() if selects(selector, found)}
    if named:
        matched.add(named)
    return sorted(matched)


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


def pod_is_gone(pod: dict[str, Any], event_type: str | None) -> bool:
    """Whether a training pod can no longer run its agent: deleted, terminating or all containers ended."""
    if event_type == "DELETED" or pod.get("metadata", {}).get("deletionTimestamp"):
        return True
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    containers = status.get("containerStatuses") or []
    return bool(containers) and all((item.get("state") or {}).get("terminated") for item in containers)


def pod_gone_at(pod: dict[str, Any], now: datetime) -> datetime:
    """When ``pod`` stopped being trusted to run its agent: when its deletion was requested, else its
    containers' last finish, else ``now``.

    A heartbeat later than this (``nodes_of_pod``) is another pod's. The deletion request time is
    ``deletionTimestamp`` minus ``deletionGracePeriodSeconds``: the timestamp is when the kubelet must have
    stopped the pod (request plus grace), not when it was told to stop; a newer pod may reuse its address
    long before that.
    """
    metadata, status = pod.get("metadata", {}), pod.get("status") or {}
    if metadata.get("deletionTimestamp"):
        grace = timedelta(seconds=int(metadata.get("deletionGracePeriodSeconds") or 0))
        return parse_time(metadata["deletionTimestamp"]) - grace
    finished = [
        parse_time(terminated["finishedAt"])
        for item in status.get("containerStatuses") or []
        if (terminated := (item.get("state") or {}).get("terminated")) and terminated.get("finishedAt")
    ]
    return max(finished) if finished else now


#: How long after a container's restart its pod's earlier agent may still be evicted for it (later, its
#: node has expired anyway, and every event of the pod would re-read the Leases for nothing).
RESTART_EVICTION_WINDOW = timedelta(minutes=5)


def container_restarted_at(pod: dict[str, Any], now: datetime) -> datetime | None:
    """When a container of ``pod`` that the kubelet restarted last ended (``lastState.terminated``), if
    that was within ``RESTART_EVICTION_WINDOW``: an agent that ran in it before is dead since then.

    Not guaranteed: which container ran the agent. A sidecar's restart counts too; the heartbeat check
    of ``nodes_of_pod`` (``gone_at``) keeps a live agent from eviction all the same.
    """
    ended = [
        parse_time(terminated["finishedAt"])
        for item in (pod.get("status") or {}).get("containerStatuses") or []
        if item.get("restartCount")
        and (terminated := (item.get("lastState") or {}).get("terminated"))
        and terminated.get("finishedAt")
    ]
    latest = max(ended, default=None)
    return latest if latest is not None and now - latest <= RESTART_EVICTION_WINDOW else None


def pod_addresses(pod: dict[str, Any]) -> PodAddresses:
    """The addresses an agent in ``pod`` may register under: its IPs, name and hostname."""
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec") or {}, pod.get("status") or {}
    names = frozenset({metadata.get("name"), spec.get("hostname")} - {None, ""})
    addresses = frozenset({status.get("podIP")} | {item.get("ip") for item in status.get("podIPs") or []}) - {None, ""}
    return PodAddresses(addresses, names)  # type: ignore[arg-type]  # None and "" removed


def training_pods(
    pods: Iterable[dict[str, Any]],
    nodes: Mapping[str, NodeFacts] | None = None,
    placement: PlacementSpec | None = None,
) -> TrainingPods:
    """The census the folder completes a round by (``folder_rules.TrainingPods``) from a Rendezvous's training pods.

    With ``nodes`` (the Kubernetes Nodes, when the operator may read them) and ``placement`` (the Rendezvous's
    spec), each live pod carries its ``Placement``: its Node's domain and whether that Node admits it.
    """
    placed = nodes is not None and placement is not None
    live: list[PodAddresses] = []
    starting = 0
    for pod in pods:
        if pod_is_gone(pod, None):
            continue
        addresses = pod_addresses(pod)
        if (pod.get("status") or {}).get("phase") == "Running" and addresses.addresses:
            facts = nodes.get(str((pod.get("spec") or {}).get("nodeName"))) if nodes is not None else None
            if facts is not None and placement is not None:
                tolerations = (pod.get("spec") or {}).get("tolerations") or []
                addresses = dataclasses.replace(addresses, placement=placement_of(facts, placement, tolerations))
            live.append(addresses)
        else:
            starting += 1
    return TrainingPods(tuple(live), starting, placed)


def nodes_of_pod(
    pod: dict[str, Any],
    nodes: Iterable[NodeId],
    *,
    document: RendezvousDocument | None = None,
    gone_at: datetime | None = None,
) -> list[NodeId]:
    """The rendezvous nodes an agent in ``pod`` registered, matched by pod IP, name or hostname.

    With ``document`` and ``gone_at``, a matched node whose last heartbeat is later than
    ``gone_at`` (plus ``HEARTBEAT_SLACK`` for clocks) is left out: it is alive, so it belongs to
    another pod that reused the address or the hostname (a replacement, or a new pod that got a
    dead pod's IP), and must never be evicted for this pod's end.
    """
    addresses = pod_addresses(pod)
    matched = [node for node in nodes if addresses.ran(node)]
    if document is None or gone_at is None:
        return matched
    return [
        node
        for node in matched
        if (beat := document.last_heartbeats.get(node)) is None or beat <= gone_at + HEARTBEAT_SLACK
    ]


def known_nodes(document: RendezvousDocument | None) -> list[NodeId]:
    """Every node the document names: participants, waiting, redundant and heartbeat-only nodes."""
    return [] if document is None else document.nodes()


def live_agents(document: RendezvousDocument | None, now: datetime, expiry: timedelta) -> list[str]:
    """Nodes whose last heartbeat is within ``expiry`` of ``now`` (agents' clocks; not fenced)."""
    if document is None or document.closed:
        return []
    return sorted(str(node) for node, beat in document.last_heartbeats.items() if now - beat <= expiry)


def nodes_to_evict_on_resync(
    document: RendezvousDocument, pods: Iterable[dict[str, Any]], now: datetime
) -> list[NodeId]:
    """The nodes a resync evicts, given every training pod of the rendezvous that exists now.

    The pod watch misses what happened while the operator was down or its watch was broken: a
    pod deleted then is simply absent from the list, and one that ended is listed as ended. So:

    - the nodes of every listed pod that is gone (``pod_is_gone``), exactly as the pod watch
      matches them (``nodes_of_pod`` with the document and the pod's end, so a live node that
      reuses its address is never taken for it);
    - the nodes that match no listed pod at all, but only while at least one node matches a
      running pod: then the job's agents are recognised by their pods' addresses, and a node
      without a pod is one whose pod was deleted. When no node matches a running pod (pods not
      labelled, or ``--local-addr`` not the pod's IP, name or hostname), nothing is evicted for
      being pod-less.
    """
    known = known_nodes(document)
    listed = list(pods)
    evicted: set[NodeId] = set()
    matched: set[NodeId] = set()
    running_matched = False
    for pod in listed:
        of_pod = nodes_of_pod(pod, known)
        matched.update(of_pod)
        if pod_is_gone(pod, None):
            evicted.update(nodes_of_pod(pod, known, document=document, gone_at=pod_gone_at(pod, now)))
        elif of_pod:
            running_matched = True
    if running_matched:
        evicted.update(node for node in known if node not in matched)
    return sorted(evicted, key=str)
