"""Differential test: tensorplay's own ``DynamicRendezvousHandler`` and our ``folder_rules.fold``, driven alike.

Both sides go through the same seeded random scenarios and must agree after every single step.

**tensorplay's side** runs real ``DynamicRendezvousHandler`` objects (tensorplay 1.0.0), one per node
incarnation, each call in its own thread. They share one thread-safe in-memory ``RendezvousBackend``
(compare-and-swap on an integer token) and use their own ``_BackendRendezvousStateHolder`` (with its 1 s read
cache) and ``_DistributedRendezvousOpExecutor``. The handler's code is not replaced. Three names of its module
are patched, in each test only (pytest's monkeypatch):

- ``_delay``, the executor's 1 s sleep after SYNC, hands control back to the test's thread. So exactly one
  framework thread runs at a time, and the test picks the interleaving. A *turn* of a node is its handler
  running until it would sleep (waiting for the state to change) or its call returns. The sleep still moves that
  node's own monotonic clock forward by the second it would have slept, so the holder's read cache expires as
  it does in production.
- ``time.monotonic`` is that per-node clock. Jumping a node's clock past its join deadline makes it give up the
  way tensorplay does at its join timeout.
- ``datetime.now`` is one wall clock, shared with our fold. It moves only when a scenario lets a last call
  expire, so deadlines and heartbeats can be compared exactly.

**Our side** is ``folder_rules.fold`` plus a model of ``NativeHandler.next_rendezvous``. A participant asks LEAVE.
Then the node asks JOIN, scoped to the round it asks to be in (``join_scope``), and waits until the document
shows it as a participant of a complete round. If a new round overtakes a join and the document does not name
the node, it asks again. Leaving (a shutdown without success) asks LEAVE. Every request is folded when it is
made, as a batch of one.

**Scenarios** (seeded ``random.Random``): 2..6 nodes, 1 <= min <= max <= N, 6..24 events. The events are:

- a node joins (or joins late, once a round has formed, so it lands on the wait list or the redundancy list);
- a participant of a complete round restarts (``next_rendezvous`` again: leave, then join, as after a worker
  failure);
- a node leaves for good (it may join again later as a new incarnation: a new local id, as a new agent process);
- the last call ends: the wall clock moves past the deadline (with no last call running, time just passes).

``test_the_scenarios_reach_every_rule`` checks that the seeds reach every row of ``folder_rules``'s rule table.

After each event, every node still waiting gets a turn, in the folder's order (by the time it asked, then
node). Passes repeat until nothing changes. On our side, a turn folds that node's standing request. On
tensorplay's side, it is one turn of that node's thread. Both sides take the same turns in the same order.

**Compared** after every event and every turn:

- the whole state document: round, complete, closed, deadline, participants with ranks, wait list,
  redundancy list, and heartbeats (exact times, since both sides read one clock);
- each node's outcome: still waiting; formed, with round, rank, world size and participants; or gone.

At the end, the sequences of formed rounds (round, participants with ranks) are compared as well.

**Not compared, or compared only by a stand-in:**

- Batching. The real folder folds every pending request in one pass. Here each fold takes one request, and
  the framework is given exactly that serial order. Other interleavings of tensorplay's threads, at action
  rather than turn granularity, are not explored.
- A node leaving for good. tensorplay has no "leave". A node inside ``next_rendezvous`` (a participant of a
  forming round, or a node on the wait list) gives up at its join timeout, and we trigger that real path.
  A participant of a complete round runs the exit op, as ``next_rendezvous`` does first. A redundant node is
  only ever pruned when its heartbeat expires. For that case, the executor's own REMOVE_FROM_REDUNDANCY_LIST
  action stands in for the pruning (which has the same effect on a non-participant).
- Dead-node pruning and evictions (``fold(dead=...)``), closing, ``lost_members``, keep-alives (the interval is
  one hour, so none fires), timing, and the bootstrap store (a stub answers ``RendezvousStoreInfo.build``).
"""

from __future__ import annotations

import pickle
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, document_from_state
from kube_rendezvous._rules.folder_rules import Desire, JoinSettings, Request, fold, join_scope, role_of, satisfied
from tensorplay.distributed.elastic.rendezvous import dynamic_rendezvous
from tensorplay.distributed.elastic.rendezvous.api import RendezvousTimeout, RendezvousTimeoutError
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousSettings,
    _Action,
    _NodeDesc,
    _RendezvousContext,
    _RendezvousExitOp,
    _RendezvousState,
)

SEEDS = range(300)
JOIN_TIMEOUT = timedelta(seconds=600)
LAST_CALL = timedelta(seconds=30)
#: No keep-alive fires and no heartbeat expires within a scenario: only the join actions stamp heartbeats.
KEEP_ALIVE = timedelta(hours=1)
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: A framework thread that neither sleeps nor returns within this many seconds fails the test.
TURN_SECONDS = 10.0
RUN_ID = "differential"

#: A node's outcome: ``WAITING`` (inside next_rendezvous), ``GONE`` (left for good), or
#: ``("formed", round, rank, world size, participants)`` once next_rendezvous returned.
Outcome = tuple[Any, ...]
WAITING: Outcome = ("waiting",)
GONE: Outcome = ("gone",)


def node_id(node: Any) -> NodeId:
    return NodeId(node.addr, node.pid, node.local_id)


def describe(document: RendezvousDocument) -> str:
    """A document on one line; times as seconds after ``START``."""

    def seconds(moment: datetime | None) -> str:
        return "-" if moment is None else f"{(moment - START).total_seconds():g}s"

    return (
        f"round {document.round} {'complete' if document.complete else 'forming'}"
        f"{' closed' if document.closed else ''} deadline {seconds(document.deadline)}"
        f" P={ {str(node): rank for node, rank in sorted(document.participants.items())} }"
        f" W={sorted(map(str, document.wait_list))} R={sorted(map(str, document.redundancy_list))}"
        f" heartbeats={ {str(node): seconds(beat) for node, beat in sorted(document.last_heartbeats.items())} }"
    )


# -- clocks and turns ------------------------------------------------------------------------


class Clock:
    """The wall clock both sides read (tensorplay through ``datetime.now``, our fold through ``now=``)."""

    def __init__(self) -> None:
        self.now = START


def wall_clock_datetime(clock: Clock) -> type[datetime]:
    """A ``datetime`` whose ``now()`` is ``clock``: tensorplay's module gets it in place of its ``datetime``."""

    class WallClockDatetime(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:
            return clock.now

    return WallClockDatetime


class Gone(BaseException):
    """Ends a framework thread whose node is gone (as killing its process would)."""


_current = threading.local()  # ``.call``: the Call whose thread this is


class Call:
    """One call into a framework handler, in its own thread, run one turn at a time by the test's thread."""

    def __init__(self, node: FrameworkNode, target: Callable[[], Any], name: str) -> None:
        self.node = node
        self._target = target
        self._go = threading.Event()
        self._yielded = threading.Event()
        self._gone = False
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        _current.call = self
        try:
            self.result = self._target()
        except Gone:
            pass
        except Exception as exc:  # noqa: BLE001 - the outcome the test compares
            self.error = exc
        finally:
            self.done = True
            self._yielded.set()

    def start(self) -> None:
        """Start the call and run its first turn."""
        self._thread.start()
        self._await()

    def turn(self) -> None:
        """Let the call run until it sleeps again or returns."""
        if self.done:
            return
        self._yielded.clear()
        self._go.set()
        self._await()

    def sleep(self, seconds: float) -> None:
        """In the call's thread: the node sleeps ``seconds`` on its own clock, until the test gives it a turn."""
        self.node.offset += seconds
        self._yielded.set()
        self._go.wait()
        self._go.clear()
        if self._gone:
            raise Gone

    def end(self) -> None:
        """Kill the call (its node's process is gone)."""
        if not self.done:
            self._gone = True
            self._go.set()
            self._thread.join(TURN_SECONDS)

    def _await(self) -> None:
        if not self._yielded.wait(TURN_SECONDS):
            raise AssertionError(f"{self._thread.name} neither slept nor returned within {TURN_SECONDS} s")


def turn_based_delay(seconds: float | tuple[float, float]) -> None:
    """tensorplay's ``_delay`` in a call's thread: the SYNC sleep ends the turn; the start-up jitter is skipped."""
    call: Call | None = getattr(_current, "call", None)
    if call is not None and not isinstance(seconds, tuple):
        call.sleep(seconds)


class NodeTime:
    """tensorplay's ``time``: ``monotonic()`` is the calling node's own clock (the real one plus its offset)."""

    @staticmethod
    def monotonic() -> float:
        call: Call | None = getattr(_current, "call", None)
        return time.monotonic() + (call.node.offset if call is not None else 0.0)


# -- tensorplay's side -------------------------------------------------------------------------


class MemoryBackend(RendezvousBackend):
    """One in-memory state, written by compare-and-swap on an integer token (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: bytes | None = None
        self._token = 0

    @property
    def name(self) -> str:
        return "memory"

    def get_state(self) -> tuple[bytes, int] | None:
        with self._lock:
            return None if self._value is None else (self._value, self._token)

    def set_state(self, value: bytes, token: int | None = None) -> tuple[bytes, int, bool] | None:
        with self._lock:
            if token != (None if self._value is None else self._token):
                return None if self._value is None else (self._value, self._token, False)
            self._value, self._token = value, self._token + 1
            return value, self._token, True

    def read(self) -> tuple[_RendezvousState | None, int]:
        with self._lock:
            return (None if self._value is None else pickle.loads(self._value)), self._token


class BootstrapStore:
    """The store ``RendezvousStoreInfo.build`` publishes rank 0's address in; never blocks."""

    master_addr_port = ("127.0.0.1", 29500)

    def set(self, key: str, value: bytes) -> None:
        pass

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return b"29500" if key.endswith("port") else b"127.0.0.1"


class Handler(DynamicRendezvousHandler):
    """tensorplay's handler; it only records the last deadline it computed (to give up at it)."""

    last_deadline = 0.0

    def _get_deadline(self, timeout: timedelta) -> float:
        self.last_deadline = super()._get_deadline(timeout)
        return self.last_deadline


class WithdrawFromRedundancyList:
    """An op standing in for heartbeat expiry: tensorplay drops a redundant node only by pruning it."""

    def __call__(self, ctx: _RendezvousContext, deadline: float) -> _Action:
        return _Action.REMOVE_FROM_REDUNDANCY_LIST if ctx.node in ctx.state.redundancy_list else _Action.FINISH


class FrameworkNode:
    """One node incarnation on tensorplay's side: its handler, its own monotonic clock, its call in progress."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        #: Seconds this node's monotonic clock is ahead of the real one (its sleeps and give-ups).
        self.offset = 0.0
        self.call: Call | None = None


class Tensorplay:
    """tensorplay's handlers over one in-memory backend."""

    def __init__(self, low: int, high: int) -> None:
        self.backend = MemoryBackend()
        self.settings = RendezvousSettings(
            run_id=RUN_ID,
            min_nodes=low,
            max_nodes=high,
            timeout=RendezvousTimeout(join=JOIN_TIMEOUT, last_call=LAST_CALL),
            keep_alive_interval=KEEP_ALIVE,
            keep_alive_max_attempt=3,
        )
        self.nodes: dict[NodeId, FrameworkNode] = {}
        self.outcomes: dict[NodeId, Outcome] = {}

    def document(self) -> RendezvousDocument:
        state, _ = self.backend.read()
        return RendezvousDocument() if state is None else document_from_state(state)

    def version(self) -> int:
        return self.backend.read()[1]

    def next_rendezvous(self, node: NodeId) -> None:
        member = self.nodes.get(node)
        if member is None:
            handler = Handler(
                backend=self.backend,
                settings=self.settings,
                run_id=RUN_ID,
                store=BootstrapStore(),
                node=_NodeDesc(node.addr, node.pid, node.local_id),
            )
            member = self.nodes[node] = FrameworkNode(handler)
        self.outcomes[node] = WAITING
        member.call = Call(member, member.handler.next_rendezvous, f"{node} next_rendezvous")
        member.call.start()
        self._collect(node)

    def turn(self, node: NodeId) -> None:
        call = self.nodes[node].call
        assert call is not None, f"{node} has no call in progress on tensorplay's side"
        call.turn()
        self._collect(node)

    def _collect(self, node: NodeId) -> None:
        member = self.nodes[node]
        call = member.call
        if call is None or not call.done:
            return
        member.call = None
        if call.error is not None:
            self.outcomes[node] = ("error", repr(call.error))
        else:
            info = call.result
            participants = tuple(node_id(other) for other in info.participants)
            round_number = member.handler._state_holder.state.round
            self.outcomes[node] = ("formed", round_number, info.rank, info.world_size, participants)

    def leave(self, node: NodeId, role: str | None) -> None:
        """The node leaves for good, the framework's way for where it is (module docstring)."""
        member = self.nodes[node]
        handler = member.handler
        call, member.call = member.call, None
        expected: type[BaseException] | None = None
        if call is None:  # a participant of a complete round: the exit op next_rendezvous starts with
            handler._stop_heartbeats()
            ending = Call(member, lambda: self._run_op(handler, _RendezvousExitOp()), f"{node} exit op")
            ending.start()
        elif role == "redundant":  # never withdraws itself; pruned when its heartbeat expires (stand-in)
            call.end()
            ending = Call(member, lambda: self._run_op(handler, WithdrawFromRedundancyList()), f"{node} withdraws")
            ending.start()
        else:  # a participant of a forming round or a waiting node: it gives up at its join deadline
            member.offset += handler.last_deadline + 2.5 - (time.monotonic() + member.offset)
            ending = call
            ending.turn()
            expected = RendezvousTimeoutError
        finished = ending.done
        ending.end()
        if finished and (ending.error is None if expected is None else isinstance(ending.error, expected)):
            self.outcomes[node] = GONE
        else:
            self.outcomes[node] = ("error", repr(ending.error), "returned" if finished else "still running")

    @staticmethod
    def _run_op(handler: Handler, op: Callable[[_RendezvousContext, float], _Action]) -> None:
        handler._executor.run(op, handler._get_deadline(JOIN_TIMEOUT))

    def close(self) -> None:
        for member in self.nodes.values():
            member.handler._stop_heartbeats()
            if member.call is not None:
                member.call.end()


# -- our side ----------------------------------------------------------------------------------


class Ours:
    """``fold`` with a model of ``NativeHandler``'s asking and waiting; every request folded as it is made."""

    def __init__(self, low: int, high: int, clock: Clock) -> None:
        self.settings = JoinSettings(low, high, LAST_CALL)
        self.clock = clock
        self.document = RendezvousDocument()
        self.requests: dict[NodeId, Request] = {}
        #: Nodes inside next_rendezvous, and the round their join was asked in.
        self.asked: dict[NodeId, int] = {}
        self.outcomes: dict[NodeId, Outcome] = {}
        self.overtaken = 0
        self._sequence = 0

    def waiting_in_order(self) -> list[NodeId]:
        """The nodes inside next_rendezvous, in the folder's order: by the time they asked, then node."""
        return sorted(self.asked, key=lambda node: (self.requests[node].requested_at, node))

    def _ask(self, node: NodeId, desire: Desire) -> Request:
        self._sequence += 1
        asked_at = self.clock.now + timedelta(microseconds=self._sequence)
        scope = join_scope(self.document) if desire is Desire.JOIN else self.document.round
        request = Request(node, desire, self.settings, asked_at, scope)
        self.requests[node] = request
        self._fold(request)
        return request

    def _fold(self, request: Request) -> None:
        self.document = fold(self.document, [request], dead=(), now=self.clock.now, settings=self.settings)

    def next_rendezvous(self, node: NodeId) -> None:
        if node in self.document.participants:
            self._ask(node, Desire.LEAVE)
            assert satisfied(self.document, node, Desire.LEAVE)
        self.asked[node] = self._ask(node, Desire.JOIN).round
        self.outcomes[node] = WAITING
        self._look(node)

    def turn(self, node: NodeId) -> None:
        """The node looks at the document, and its standing request is folded (as any fold takes it)."""
        self._look(node)
        if node in self.asked:
            self._fold(self.requests[node])
            self._look(node)

    def _look(self, node: NodeId) -> None:
        """NativeHandler._settle on a new document: done once in a complete round; asks again when overtaken."""
        document = self.document
        if role_of(document, node) is None and join_scope(document) != self.asked[node]:
            self.overtaken += 1
            self.asked[node] = self._ask(node, Desire.JOIN).round
            document = self.document
        if document.complete and node in document.participants:
            del self.asked[node]
            participants = tuple(sorted(document.participants))
            rank = document.participants[node]
            self.outcomes[node] = ("formed", document.round, rank, len(participants), participants)

    def leave(self, node: NodeId) -> None:
        self.asked.pop(node, None)
        self._ask(node, Desire.LEAVE)
        self.outcomes[node] = GONE


# -- scenarios -----------------------------------------------------------------------------------


class Differential:
    """One seeded scenario, run on our side and (unless ``framework`` is False) on tensorplay's."""

    def __init__(self, seed: int, clock: Clock, framework: bool = True) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.size = self.rng.randint(2, 6)
        self.high = self.rng.randint(1, self.size)
        self.low = self.rng.randint(1, self.high)
        self.clock = clock
        self.ours = Ours(self.low, self.high, clock)
        self.theirs = Tensorplay(self.low, self.high) if framework else None
        self.incarnations = [0] * self.size
        self.log = [f"seed {seed}: {self.size} nodes, min {self.low}, max {self.high}, last call {LAST_CALL}"]
        self.formed_ours: list[tuple[int, dict[NodeId, int]]] = []
        self.formed_theirs: list[tuple[int, dict[NodeId, int]]] = []
        self.seen: Counter[str] = Counter()

    def node(self, slot: int) -> NodeId:
        return NodeId(f"host-{slot}", 1, self.incarnations[slot])

    def run(self) -> None:
        try:
            self.check("start")
            for _ in range(self.rng.randint(6, 24)):
                kind, slot = self.rng.choice(self.events())
                self.apply(kind, slot)
            assert self.formed_theirs == self.formed_ours or self.theirs is None, self.report("formed rounds differ")
        finally:
            if self.theirs is not None:
                self.theirs.close()

    def events(self) -> list[tuple[str, int]]:
        """The events possible now, weighted by repetition."""
        events: list[tuple[str, int]] = []
        for slot in range(self.size):
            outcome = self.ours.outcomes.get(self.node(slot))
            if outcome is None or outcome == GONE:
                events += [("join", slot)] * 3
            elif outcome == WAITING:
                events.append(("leave", slot))
            else:
                events += [("restart", slot), ("restart", slot), ("leave", slot)]
        document = self.ours.document
        if document.deadline is not None and not document.complete:
            events += [("last call ends", -1)] * 3
        else:
            events.append(("time passes", -1))
        return events

    def apply(self, kind: str, slot: int) -> None:
        if kind in ("join", "restart"):
            if self.ours.outcomes.get(self.node(slot)) == GONE:
                self.incarnations[slot] += 1  # a new agent process on that host
            node = self.node(slot)
            if kind == "join" and self.ours.document.complete:
                kind = "late join"
            self.seen[kind] += 1
            self.ours.next_rendezvous(node)
            if self.theirs is not None:
                self.theirs.next_rendezvous(node)
        elif kind == "leave":
            node = self.node(slot)
            role = role_of(self.ours.document, node)
            self.seen[f"leave as {role}{' (formed)' if self.ours.outcomes[node] != WAITING else ''}"] += 1
            self.ours.leave(node)
            if self.theirs is not None:
                self.theirs.leave(node, role)
        else:
            self.seen[kind] += 1
            self.clock.now += LAST_CALL + timedelta(seconds=1)
        self.check(f"{kind} {self.node(slot) if slot >= 0 else ''}".rstrip())
        self.settle()

    def settle(self) -> None:
        """Give each waiting node a turn in the folder's order, until a whole pass changes nothing."""
        for _ in range(2 * self.size + 2):
            before = self.snapshot()
            for node in self.ours.waiting_in_order():
                if node in self.ours.asked:
                    self.ours.turn(node)
                    if self.theirs is not None:
                        self.theirs.turn(node)
                    self.check(f"  turn of {node}")
            if self.snapshot() == before:
                return
        raise AssertionError(self.report("the scenario did not settle"))

    def snapshot(self) -> tuple[Any, ...]:
        return (self.ours.document, dict(self.ours.outcomes), self.theirs.version() if self.theirs else None)

    def check(self, step: str) -> None:
        ours = self.ours.document
        self.log.append(f"{step}: {describe(ours)}")
        self._note(self.formed_ours, ours)
        self.seen["wait list"] += bool(ours.wait_list)
        self.seen["redundancy list"] += bool(ours.redundancy_list)
        if self.theirs is None:
            return
        theirs = self.theirs.document()
        self._note(self.formed_theirs, theirs)
        if theirs != ours or self.theirs.outcomes != self.ours.outcomes:
            differing = {
                str(node): (self.ours.outcomes.get(node), self.theirs.outcomes.get(node))
                for node in sorted(set(self.ours.outcomes) | set(self.theirs.outcomes))
                if self.ours.outcomes.get(node) != self.theirs.outcomes.get(node)
            }
            raise AssertionError(
                self.report(
                    f"tensorplay and the fold disagree after '{step}'\n  fold:       {describe(ours)}\n"
                    f"  tensorplay: {describe(theirs)}\n  outcomes (fold, tensorplay): {differing}"
                )
            )

    def _note(self, formed: list[tuple[int, dict[NodeId, int]]], document: RendezvousDocument) -> None:
        if document.complete and (not formed or formed[-1] != (document.round, dict(document.participants))):
            formed.append((document.round, dict(document.participants)))

    def report(self, headline: str) -> str:
        return "\n".join([headline, *self.log[-60:]])


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    """tensorplay's module, in this test only: turn-based ``_delay``, per-node ``time``, the shared wall clock."""
    wall = Clock()
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # no bootstrap TCPStore of rank 0
    monkeypatch.setattr(dynamic_rendezvous, "_delay", turn_based_delay)
    monkeypatch.setattr(dynamic_rendezvous, "time", NodeTime)
    monkeypatch.setattr(dynamic_rendezvous, "datetime", wall_clock_datetime(wall))
    yield wall


@pytest.mark.parametrize("seed", SEEDS)
def test_tensorplay_and_the_fold_form_the_same_rounds(seed: int, clock: Clock) -> None:
    Differential(seed, clock).run()


def test_the_scenarios_reach_every_rule() -> None:
    """The seeds cover every row of the rule table (counted on our side, which equals tensorplay's)."""
    seen: Counter[str] = Counter()
    rounds = 0
    for seed in SEEDS:
        scenario = Differential(seed, Clock(), framework=False)
        scenario.run()
        seen += scenario.seen
        rounds += len(scenario.formed_ours)
        seen["overtaken"] += scenario.ours.overtaken
    for kind in (
        "join",
        "late join",
        "restart",
        "last call ends",
        "wait list",
        "redundancy list",
        "leave as participant (formed)",
        "leave as participant",
        "leave as waiting",
        "leave as redundant",
    ):
        assert seen[kind] >= 10, (kind, seen)
    assert rounds >= 5 * len(SEEDS), rounds
