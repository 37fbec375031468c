"""The join rules, in one place: fold the nodes' requests into the rendezvous state document (pure, no I/O).

The shared Rendezvous is written only when membership changes, by one *folder* (the operator when it
runs, else an agent). Each node states what it wants on its own Lease: ``join`` (be in the rendezvous,
scoped to the round it saw) or ``leave`` (be out of it). The folder applies every pending request to
the document in one compare-and-swap with ``fold``, so the result is a serial order of the
framework's own operations (tensorplay's and torch's ``_RendezvousJoinOp``/``_RendezvousExitOp`` and
their executor's actions, which are the same in both; ``tests/test_folding_differential.py`` drives the
framework's own ``DynamicRendezvousHandler`` through the same sequences and compares).

The rules, for a node N asking, with ``min``/``max`` its ``--nnodes`` and P the participants:

| state                         | N asks ``join``                                   | N asks ``leave``          |
|-------------------------------|---------------------------------------------------|---------------------------|
| closed                        | nothing (the node exits cleanly)                  | nothing                   |
| N redundant, len(P) == max    | stays redundant                                   | leaves the list           |
| N redundant, len(P) < max     | leaves the list, then as below                    | leaves the list           |
| complete, N in P              | nothing (it is in the round)                      | out of P; if P is empty,  |
|                               |                                                   | round + 1, not complete;  |
|                               |                                                   | else the carry rule       |
| complete, N not in P          | wait list if len(P) < max, else redundancy list   | leaves its list           |
| forming, N not in P           | into P (off the wait list); len(P) == min starts  | leaves its list           |
|                               | the last call (deadline = now + last_call);       |                           |
|                               | len(P) == max completes the round                 |                           |
| forming, N in P               | nothing                                           | out of P; below min the   |
|                               |                                                   | last call is cancelled    |

- **Completion** assigns ranks 0..n-1 by sorted node (by topology domain first, when the folder knows
  the members' domains: **Topology** below), and happens when len(P) reaches max, or once
  the last call's deadline is past with min <= len(P) <= max, or (only when the folder knows the
  job's training pods, ``TrainingPods``: the operator) during the last call as soon as every live
  training pod has a node in P and no pod of the job is starting. ``completion_rule`` names which.
  A Running pod whose agent is gone (its node evicted or expired, no live Lease of it) is not
  waited for (``TrainingPods.without_gone_agents``).
- **Dead nodes** (evicted by the operator, or their Lease not renewed within its expiry on the
  folder's clock) are removed first, all at once, as the framework's pruning does.
- **Scope:** a join names the round it asks to be in (``join_scope``): the round that forms, or the
  next one once the round is complete (N then waits on the wait or redundancy list). It applies in
  that round or while N is on a list, so a node removed after its round completed (dead, evicted) is
  never put back by its last request, even when a folder judges it alive again.
- **Order:** requests of one fold apply by the time they were asked, then node. When the round moves
  on during a fold, its requests apply once more (the waiting nodes' turns in the new round).

Rules added on top (no framework has them):

- **Topology** (only with ``fold(domain=...)``, which the operator passes: it knows each pod's
  Kubernetes Node): ranks follow the members' domains (``placement.rank_order``), so members that
  share a domain get contiguous ranks; when dead members are removed, a spare (redundant node) of a
  lost member's domain is taken before the other spares.
- **Admission** (only with ``fold(hold=...)``): a node that is not a participant and whose Kubernetes
  Node does not admit it (NotReady, cordoned, a NoExecute taint: ``placement.hold_reason``) leaves the
  wait and redundancy lists and is kept by its heartbeat only, its join standing, until its Node admits
  it. A participant is left alone (eviction and expiry handle lost nodes).

- **Carry** (only with ``fold(carry=...)``; the folder passes it when it knows the job's training
  pods and the participants keep Leases, i.e. run the native handler): a complete round whose dead
  participants are removed (evicted or expired) while others remain is broken. The next round opens
  at once with the others that ``carry`` vouches for as its participants (the last call starts if
  they are at least min; max completes it), as if each had asked to join it: a broken round's
  survivors write nothing to re-form. The folder vouches for a member whose pod is live and whose
  Lease it saw renewed recently. A member not vouched for rejoins by itself, as before. A leave
  carries no one: it comes when the leaving agent chooses, often right after a peer died unnoticed
  (its workers crashed on the lost connection), which would carry the dead peer into a round that
  waits for it. The framework would keep the round complete with fewer participants, whose workers
  wait for the lost one.
- ``lost_members``: a member of a round sees that round lose a member (the state moved on without
  it, or dropped it) and its agent restarts at once; its ``next_rendezvous`` then finds itself
  carried into the new round, or asks to join it.

Not guaranteed: a request is a standing wish within its scope. A node whose Lease says ``join`` for
the current round and that is removed while its Lease keeps renewing (a false eviction) is put back
by the next fold, unless carry has moved the round on: its agent then sees its round lost a member
(itself) and rejoins. A carried member that died unnoticed (its pod's deletion not yet seen by the
operator) is in the new round until its eviction breaks that round too; the others' workers wait for it
until then, and an agent assigning ranks through the store waits for its key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from .document import NodeId, RendezvousDocument
from .placement import Domain, Placement, rank_order


class Desire(str, Enum):
    """What a node asks for on its Lease."""

    JOIN = "join"
    LEAVE = "leave"


@dataclass(frozen=True)
class JoinSettings:
    """The settings of the node that asked, as its framework's handler has them."""

    #: Nodes needed for a round (the launcher's min nodes).
    min_nodes: int
    #: Most nodes a round takes (the launcher's max nodes).
    max_nodes: int
    #: How long a round with at least min_nodes waits for more before it completes.
    last_call: timedelta

    def encode(self) -> str:
        """``min:max:last_call_seconds`` for a Lease annotation."""
        return f"{self.min_nodes}:{self.max_nodes}:{self.last_call.total_seconds():g}"

    @classmethod
    def parse(cls, text: str) -> JoinSettings:
        """The inverse of ``encode``.

        Raises:
            ValueError: ``text`` is not ``min:max:seconds`` with 1 <= min <= max and seconds >= 0.
        """
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"join settings {text!r:.60} are not min:max:last_call_seconds")
        low, high, seconds = int(parts[0]), int(parts[1]), float(parts[2])
        if not 1 <= low <= high or not 0 <= seconds <= 86400:
            raise ValueError(f"join settings {text!r:.60} need 1 <= min <= max and 0 <= last_call <= 86400")
        return cls(low, high, timedelta(seconds=seconds))


@dataclass(frozen=True)
class Request:
    """One node's standing request, read from its Lease."""

    node: NodeId
    desire: Desire
    settings: JoinSettings
    #: When the node asked (its own clock); orders the requests of one fold, nothing else.
    requested_at: datetime
    #: The round a join asks to be in (``join_scope`` of the state the node saw; the rule **Scope** above).
    round: int | None = None


class CompletedBy(str, Enum):
    """Which rule completed a round (``status.recentRounds[].completedBy``)."""

    MAX_NODES = "MaxNodes"
    LAST_CALL = "LastCall"
    TRAINING_PODS_JOINED = "TrainingPodsJoined"


@dataclass(frozen=True)
class PodAddresses:
    """What an agent in one pod may register as its node's address: the pod's IPs, its name or hostname
    (also as the first label of a longer DNS name)."""

    addresses: frozenset[str]
    names: frozenset[str]
    #: Where the pod runs (its Kubernetes Node's domain and admission), when the operator knows it.
    placement: Placement | None = None

    def ran(self, node: NodeId) -> bool:
        """Whether ``node``'s address is one of this pod's."""
        return (
            node.addr in self.addresses
            or node.addr in self.names
            or any(node.addr.startswith(f"{name}.") for name in self.names)
        )


@dataclass(frozen=True)
class TrainingPods:
    """The job's training pods as the operator's pod watch shows them (its pod selection).

    ``live``: the pods that run (phase Running, with an IP). ``starting``: pods of the job that will
    run but do not yet (Pending, or Running without an IP). Pods that are gone (deleted, terminating,
    every container ended) are in neither.

    Not guaranteed: the operator's view lags the API server by its watch, and a pod its workload's
    controller has not created yet is unknown, so a round may complete without a replacement pod
    that is about to be created: that pod's agent joins the next round, as any late pod does.
    """

    live: tuple[PodAddresses, ...] = ()
    starting: int = 0
    #: Whether the pods' placements are known (the operator reads Nodes); False: ranks follow addresses.
    placed: bool = False

    def all_joined(self, participants: Iterable[NodeId]) -> bool:
        """Whether every live pod has a node in ``participants`` and no pod is starting (a held pod,
        one whose Node does not admit it, is not waited for)."""
        if self.starting or not self.live:
            return False
        ran = _ran_any(participants)
        return all(ran(pod) for pod in self.live if pod.placement is None or pod.placement.hold is None)

    def placement_of(self) -> Callable[[NodeId], Placement | None]:
        """The placement of the live pod a node ran in (None: unknown), one dict lookup per node."""
        by_address: dict[str, Placement] = {}
        for pod in self.live:
            if pod.placement is not None:
                by_address.update(dict.fromkeys(pod.addresses | pod.names, pod.placement))
        if not by_address:
            return lambda node: None
        return lambda node: by_address.get(node.addr) or by_address.get(node.addr.split(".", 1)[0])

    def on_live_pod(self) -> Callable[[NodeId], bool]:
        """Whether a node ran in one of the live pods (``PodAddresses.ran`` for some pod), one set test per node."""
        addresses = {address for pod in self.live for address in pod.addresses}
        names = {name for pod in self.live for name in pod.names}
        return lambda node: (
            node.addr in addresses or node.addr in names or (node.addr.split(".", 1)[0] in names and "." in node.addr)
        )

    def without_gone_agents(self, dead: Iterable[NodeId], alive: Iterable[NodeId]) -> TrainingPods:
        """These pods without the live ones whose agent is gone: a pod that ran a ``dead`` node (evicted,
        or its Lease expired) and runs no node of ``alive`` (nodes whose Lease the folder still counts).

        Such a pod is Running but its agent is frozen, cut off or dead: waiting the last call for it
        only delays the others, and it joins the next round if it comes back, as a late pod does. An
        agent that restarted in its pod writes a new Lease at once, so its pod is waited for.
        """
        ran_dead, ran_alive = _ran_any(dead), _ran_any(alive)
        kept = tuple(pod for pod in self.live if ran_alive(pod) or not ran_dead(pod))
        return self if len(kept) == len(self.live) else TrainingPods(kept, self.starting, self.placed)


def _ran_any(nodes: Iterable[NodeId]) -> Callable[[PodAddresses], bool]:
    """Whether a pod ran any of ``nodes`` (``PodAddresses.ran`` for some node), in one set test per pod:
    a fold at N=1024 asks this on every change during a last call, where a test per pair is N x N."""
    addrs = {node.addr for node in nodes}
    first_labels = {addr.split(".", 1)[0] for addr in addrs if "." in addr}
    return lambda pod: (
        not pod.addresses.isdisjoint(addrs) or not pod.names.isdisjoint(addrs) or not pod.names.isdisjoint(first_labels)
    )


#: The carry rule's judgement of a broken round's member: True when it is alive enough to be carried.
Carry = Callable[[NodeId], bool]


#: Why a node is held back from a new round (``placement.hold_reason``); None: admitted.
Hold = Callable[[NodeId], str | None]


class _Working:
    """A mutable copy of a document for one fold."""

    def __init__(
        self,
        document: RendezvousDocument,
        domain: Callable[[NodeId], Domain | None] | None = None,
        hold: Hold | None = None,
    ) -> None:
        self.domain = domain
        self.hold = hold
        #: The nodes this fold held back, with why.
        self.held: dict[NodeId, str] = {}
        self.round = document.round
        self.complete = document.complete
        self.closed = document.closed
        self.deadline = document.deadline
        self.participants = dict(document.participants)
        self.wait_list = set(document.wait_list)
        self.redundancy_list = set(document.redundancy_list)
        self.heartbeats = dict(document.last_heartbeats)

    def document(self) -> RendezvousDocument:
        return RendezvousDocument(
            round=self.round,
            complete=self.complete,
            closed=self.closed,
            deadline=self.deadline,
            participants=self.participants,
            wait_list=frozenset(self.wait_list),
            redundancy_list=frozenset(self.redundancy_list),
            last_heartbeats=self.heartbeats,
        )

    def epilogue(self, settings: JoinSettings, now: datetime, carry: Carry | None) -> None:
        """``_remove_participant_epilogue``: a complete round emptied moves to the next round; with
        ``carry``, a complete round that lost a participant does too, with the others ``carry`` keeps."""
        if self.complete:
            if not self.participants:
                self.complete = False
                self.round += 1
            elif carry is not None and not self.closed:
                self.carry(settings, now, carry)
        elif len(self.participants) < settings.min_nodes:
            self.deadline = None

    def carry(self, settings: JoinSettings, now: datetime, keep: Carry) -> None:
        """The carry rule: open the next round with the broken round's other members that ``keep`` vouches for."""
        self.round += 1
        self.complete = False
        for node in [node for node in self.participants if not keep(node)]:
            del self.participants[node]
            self.heartbeats.pop(node, None)
        self.participants = dict.fromkeys(self.participants, 0)
        self.deadline = now + settings.last_call if len(self.participants) >= settings.min_nodes else None
        if len(self.participants) >= settings.max_nodes:
            self.mark_complete()

    def mark_complete(self) -> None:
        self.complete = True
        self.deadline = None
        ranked = sorted(self.participants) if self.domain is None else rank_order(self.participants, self.domain)
        for rank, node in enumerate(ranked):
            self.participants[node] = rank

    def drop(self, node: NodeId) -> bool:
        """Drop ``node`` from every role; True if it was a participant (then the epilogue is due)."""
        self.heartbeats.pop(node, None)
        self.wait_list.discard(node)
        self.redundancy_list.discard(node)
        return self.participants.pop(node, None) is not None

    def join(self, node: NodeId, settings: JoinSettings, now: datetime) -> None:
        """Apply the join operation's actions for ``node`` until it would only wait (SYNC)."""
        for _ in range(8):  # at most: leave redundancy, join, complete; the bound is a guard
            if self.closed:
                return
            is_participant = node in self.participants
            if not is_participant and self.hold is not None and (reason := self.hold(node)) is not None:
                self.wait_list.discard(node)  # ADMISSION (ours): held back, known by its heartbeat only
                self.redundancy_list.discard(node)
                self.heartbeats.setdefault(node, now)
                self.held[node] = reason
                return
            if node in self.redundancy_list:
                if len(self.participants) == settings.max_nodes:
                    return
                self.redundancy_list.discard(node)  # REMOVE_FROM_REDUNDANCY_LIST
                self.heartbeats.pop(node, None)
                continue
            if self.complete:
                if is_participant:
                    return
                if len(self.participants) < settings.max_nodes:
                    if node not in self.wait_list:  # ADD_TO_WAIT_LIST
                        self.redundancy_list.discard(node)
                        self.wait_list.add(node)
                        self.heartbeats[node] = now
                elif node not in self.redundancy_list and node not in self.wait_list:
                    self.redundancy_list.add(node)  # ADD_TO_REDUNDANCY_LIST
                    self.heartbeats[node] = now
                return
            if is_participant:
                return
            self.wait_list.discard(node)  # ADD_TO_PARTICIPANTS
            self.participants[node] = 0
            self.heartbeats[node] = now
            if len(self.participants) == settings.min_nodes:
                self.deadline = now + settings.last_call
            if len(self.participants) == settings.max_nodes:
                self.mark_complete()
                return

    def complete_if_due(self, settings: JoinSettings, now: datetime, pods: TrainingPods | None) -> None:
        """MARK_RENDEZVOUS_COMPLETE: last call is over with enough participants, or (with ``pods``) every
        live training pod joined during the last call."""
        if (
            not self.complete
            and not self.closed
            and self.deadline is not None
            and (self.deadline < now or (pods is not None and pods.all_joined(self.participants)))
            and settings.min_nodes <= len(self.participants) <= settings.max_nodes
        ):
            self.mark_complete()


@dataclass(frozen=True)
class Folded:
    """What one fold produced: the document, and the nodes it held back (``hold``) with why."""

    document: RendezvousDocument
    held: Mapping[NodeId, str]


def fold(
    document: RendezvousDocument | None,
    requests: Iterable[Request],
    *,
    dead: Iterable[NodeId],
    now: datetime,
    settings: JoinSettings,
    pods: TrainingPods | None = None,
    carry: Carry | None = None,
    domain: Callable[[NodeId], Domain | None] | None = None,
    hold: Hold | None = None,
) -> RendezvousDocument:
    """Return ``document`` with ``dead`` nodes removed and every request applied, in one serial order.

    In the module's order (**Dead nodes**, then **Order**), then the last call's completion if it is
    due (with ``pods``: also once every live training pod joined). ``settings`` apply to the pruning
    and the completion; each join uses the settings of the node that asked. ``carry``: the carry rule,
    for the members it vouches for (None: the framework's own rules). ``domain`` and ``hold``: the
    placement rules (``fold_placed``).
    """
    return fold_placed(
        document, requests, dead=dead, now=now, settings=settings, pods=pods, carry=carry, domain=domain, hold=hold
    ).document


def fold_placed(
    document: RendezvousDocument | None,
    requests: Iterable[Request],
    *,
    dead: Iterable[NodeId],
    now: datetime,
    settings: JoinSettings,
    pods: TrainingPods | None = None,
    carry: Carry | None = None,
    domain: Callable[[NodeId], Domain | None] | None = None,
    hold: Hold | None = None,
) -> Folded:
    """``fold``, with the placement rules (``placement``) where the folder knows where nodes run.

    ``domain`` (a node's topology domain): a round that completes ranks its members by domain, then
    by node (``placement.rank_order``), and a spare (redundant node) of a lost member's domain is
    taken before other spares. ``hold`` (why a node may not join): a node it names that is not a
    participant is taken off the wait and redundancy lists and kept by its heartbeat only (it waits,
    ``Folded.held`` says why) while its join stands; a participant is left alone.
    """
    state = _Working(document or RendezvousDocument(), domain, hold)
    dead = list(dead)
    lost = {domain(node) for node in dead if node in state.participants} if domain is not None else set()
    if [node for node in dead if state.drop(node)]:  # every dead node dropped, then one epilogue
        state.epilogue(settings, now, carry)

    def order(item: Request) -> tuple[int, datetime, NodeId]:
        preferred = lost and item.node in state.redundancy_list and domain is not None and domain(item.node) in lost
        return (0 if preferred else 1, item.requested_at, item.node)

    ordered = sorted(requests, key=order)
    for _ in range(2):
        round_before = state.round
        for request in ordered:
            if request.desire is Desire.LEAVE:
                if state.drop(request.node):
                    state.epilogue(request.settings, now, None)  # no carry: see the rule
            elif (
                request.round is None
                or request.round == state.round + (1 if state.complete else 0)
                or request.node in state.wait_list
                or request.node in state.redundancy_list
                or request.node in state.held
            ):
                state.join(request.node, request.settings, now)
        if state.round == round_before:
            break
    state.complete_if_due(settings, now, pods)
    return Folded(state.document(), dict(state.held))


def completion_rule(
    before: RendezvousDocument | None, after: RendezvousDocument, settings: JoinSettings, now: datetime
) -> CompletedBy | None:
    """The rule that completed ``after``'s round in a fold of ``before`` at ``now``; None when no round completed.

    MaxNodes when the round is full; LastCall when the last call ``before`` had set was over; else the
    round completed during its last call because every live training pod joined.
    """
    formed_before = before is not None and before.complete and before.round == after.round
    if not after.complete or after.closed or formed_before:
        return None
    if len(after.participants) >= settings.max_nodes:
        return CompletedBy.MAX_NODES
    if before is not None and before.round == after.round and before.deadline is not None and before.deadline < now:
        return CompletedBy.LAST_CALL
    return CompletedBy.TRAINING_PODS_JOINED


def join_scope(document: RendezvousDocument | None) -> int:
    """The round a node that sees ``document`` asks to join: the round that forms, else the next one."""
    if document is None:
        return 0
    return document.round + (1 if document.complete else 0)


def satisfied(document: RendezvousDocument | None, node: NodeId, desire: Desire) -> bool:
    """Whether ``document`` already reflects ``node``'s ``desire`` (a fold has taken it in)."""
    if document is None:
        return False
    if desire is Desire.JOIN:
        return role_of(document, node) is not None or document.closed
    return node not in document.participants and node not in document.wait_list


def role_of(document: RendezvousDocument, node: NodeId) -> str | None:
    """``participant``, ``waiting``, ``redundant``, or None when ``document`` does not name ``node`` in a role."""
    if node in document.participants:
        return "participant"
    if node in document.wait_list:
        return "waiting"
    if node in document.redundancy_list:
        return "redundant"
    return None


def lost_members(document: RendezvousDocument | None, members: frozenset[NodeId]) -> frozenset[NodeId]:
    """The members of a round that formed with ``members`` that ``document`` no longer shows as participants.

    A member leaves (SIGTERM), is evicted (its pod is gone) or expires; the fold then removes it
    from the participants and the round stays complete with the others, whose workers may wait
    for it forever (in ``init_process_group``, until the process group timeout). Any loss breaks
    the round, so every member still in it must re-rendezvous. Empty when ``document`` is closed
    (a finished job is not broken) or missing.
    """
    if document is None or document.closed:
        return frozenset()
    return members - document.participants.keys()


def carried(document: RendezvousDocument, node: NodeId, last_round: int) -> bool:
    """Whether ``document`` shows ``node`` carried past ``last_round`` (the carry rule): a later
    round, not closed, with ``node`` a participant."""
    return document.round > last_round and not document.closed and node in document.participants
