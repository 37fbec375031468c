"""The rendezvous state document: typed, versioned, framework-neutral (pure, no I/O, no pickle).

``Rendezvous.status.state`` holds ``kr1:`` + base64(zlib(JSON)), where the JSON is one flat
object with a column per node field (the "column layout", which compresses well)::

    {"version": 1, "round": 3, "complete": true, "closed": false,
     "deadline": null,                      # microseconds since the Unix epoch (UTC), or null
     "heartbeatBase": 1764745200123456,     # microseconds since the epoch; heartbeats are offsets
     "addr": ["trainer-0.svc", ...],        # one entry per node, sorted by (addr, pid, localId)
     "pid": [1, ...], "localId": [0, ...],
     "role": [1, ...],                      # 0 heartbeat only, 1 participant, 2 waiting, 3 redundant
     "rankDelta": [0, 1, 1, ...],           # per participant, in node order: rank minus the previous
                                            # participant's rank (the first: its rank)
     "heartbeat": [52, ...]}                # microseconds after heartbeatBase, -1 when none

A node has exactly one role, so "participant and waiting at once" cannot even be written.

Decoding is bounded and fails closed: the text and the decompressed JSON have size limits
(zlib is asked for at most ``MAX_DOCUMENT_BYTES`` + 1 bytes, so a bomb costs no more than
that), the JSON's shape is checked by two linear regular-expression passes before it is parsed
(so no attacker-chosen nesting reaches a recursive parser), numbers are parsed only after a
length check, NaN/Infinity/floats/duplicate keys are refused, node uniqueness is checked by
comparing sorted neighbours (nothing attacker-built is hashed before it is validated), and
every count is capped. Decode time grows with the text's size only.

Conversion to and from a framework's ``_RendezvousState`` (tensorplay's and torch's have the
same shape) is duck-typed: ``document_from_state`` reads the attributes, ``state_from_document``
builds the framework's own classes from validated values. No pickle is read or written here.

Not guaranteed: that a valid document is *true* (whoever may patch ``rendezvouses/status`` can
write a valid but wrong membership and so disrupt a job, never run code), and rank bounds
against ``maxNodes`` (the agents follow ``--nnodes``; ``validate_document`` takes it when known).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import IntEnum
from typing import Any, NamedTuple

#: The marker that starts the encoded document; it names the format's version.
DOCUMENT_MARKER = "kr1:"
#: The marker of the first release's pickled state: refused unread.
PICKLE_MARKER = "z1:"
DOCUMENT_VERSION = 1

#: Most nodes a document may name (participants, waiting, redundant and heartbeat-only).
MAX_NODES = 16384
#: Longest node address (a DNS name or an IP address).
MAX_ADDR_LENGTH = 253
#: Largest ``status.state`` text accepted or written (characters).
MAX_ENCODED_BYTES = 1024 * 1024
#: Largest decompressed JSON accepted (bytes); zlib never produces more than this + 1.
MAX_DOCUMENT_BYTES = 8 * 1024 * 1024
#: Largest pid, local id and round accepted.
MAX_INT32 = 2**31 - 1
#: Digits an integer literal may have before it is parsed (2**63 has 19).
MAX_INT_DIGITS = 19

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)
#: Microseconds since the epoch of the latest representable time.
MAX_MICROSECONDS = (_LATEST - EPOCH) // timedelta(microseconds=1)

_COLUMNS = ("addr", "pid", "localId", "role", "heartbeat")
_KEYS = frozenset({"version", "round", "complete", "closed", "deadline", "heartbeatBase", "rankDelta", *_COLUMNS})
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_FLAT_ARRAY = re.compile(r"\[[^\[\]{}]*\]")
_FLAT_OBJECT = re.compile(r"\s*\{[^\[\]{}]*\}\s*")
_ADDR = re.compile(r"[\x21-\x7e]+")
#: The fix an invalid state's errors name (the kubectl plugin fills in the object's name).
CLEAR_HINT = (
    "clear it (kubectl patch rdzv NAME --subresource=status --type=json "
    '-p \'[{"op":"remove","path":"/status/state"}]\') or use a new Rendezvous'
)


class StateDocumentError(ValueError):
    """Raised when a state document is malformed, out of bounds or inconsistent; names the field."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"status.state {field_name}: {problem}")
        #: The document field at fault (``addr[3]``, ``rank``, ``text``, ...).
        self.field = field_name


class StateTooLargeError(StateDocumentError):
    """Raised when an encoded document would exceed ``MAX_ENCODED_BYTES``."""


class Role(IntEnum):
    """What a node is in the current round; each node has exactly one."""

    HEARTBEAT_ONLY = 0
    PARTICIPANT = 1
    WAITING = 2
    REDUNDANT = 3


class NodeId(NamedTuple):
    """One agent incarnation: its address, process id and handler-local id."""

    addr: str
    pid: int
    local_id: int

    def __str__(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}"


@dataclass(frozen=True)
class RendezvousDocument:
    """The rendezvous state, as validated values. Equality is equality of meaning."""

    round: int = 0
    complete: bool = False
    closed: bool = False
    deadline: datetime | None = None
    participants: Mapping[NodeId, int] = field(default_factory=dict)
    wait_list: frozenset[NodeId] = frozenset()
    redundancy_list: frozenset[NodeId] = frozenset()
    last_heartbeats: Mapping[NodeId, datetime] = field(default_factory=dict)

    def nodes(self) -> list[NodeId]:
        """Every node the document names, sorted."""
        found = set(self.participants) | self.wait_list | self.redundancy_list | set(self.last_heartbeats)
        return sorted(found)


# -- time ------------------------------------------------------------------------------------


def to_microseconds(moment: datetime, field_name: str) -> int:
    """Return ``moment`` as whole microseconds since the epoch (exact)."""
    if not isinstance(moment, datetime) or moment.tzinfo is None or moment.utcoffset() is None:
        raise StateDocumentError(field_name, f"must be a timezone-aware datetime, got {moment!r:.80}")
    return (moment - EPOCH) // timedelta(microseconds=1)


def from_microseconds(value: int, field_name: str) -> datetime:
    """Return the UTC datetime ``value`` microseconds after the epoch."""
    if not 0 <= value <= MAX_MICROSECONDS:
        raise StateDocumentError(field_name, f"{value} is not a time between 1970 and 9999 in microseconds")
    return EPOCH + timedelta(microseconds=value)


# -- validation ------------------------------------------------------------------------------


#: Nodes that passed ``_check_node`` (exact str and int fields, so an equal node of another type
#: never hits it): a 1024-node state is validated every few seconds by every agent, nearly always
#: with the same nodes. Cleared when it outgrows ``4 * MAX_NODES``.
_VALID_NODES: set[NodeId] = set()


def _check_node(node: NodeId, where: str | None = None) -> None:
    """Raise unless ``node`` is a valid node, naming ``where`` (default ``node <node>``); fast for one seen before."""
    exact = type(node.addr) is str and type(node.pid) is int and type(node.local_id) is int
    if exact and node in _VALID_NODES:
        return
    where = f"node {node}" if where is None else where
    if type(node.addr) is not str or not 1 <= len(node.addr) <= MAX_ADDR_LENGTH or not _ADDR.fullmatch(node.addr):
        raise StateDocumentError(
            f"{where}.addr", f"{node.addr!r:.80} must be 1 to {MAX_ADDR_LENGTH} printable ASCII characters"
        )
    for name, value in (("pid", node.pid), ("localId", node.local_id)):
        _integer(value, f"{where}.{name}", 0, MAX_INT32)
    if len(_VALID_NODES) >= 4 * MAX_NODES:
        _VALID_NODES.clear()
    _VALID_NODES.add(node)


def _integer(value: Any, field_name: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise StateDocumentError(field_name, f"{value!r:.40} must be an integer in {low}..{high}")
    return value


def _boolean(value: Any, field_name: str) -> bool:
    if type(value) is not bool:
        raise StateDocumentError(field_name, f"must be true or false, got {value!r:.40}")
    return value


def _moment_valid(moment: object) -> bool:
    """Whether ``to_microseconds`` then ``from_microseconds`` accept ``moment`` (an aware time in range)."""
    return (
        isinstance(moment, datetime)
        and moment.tzinfo is not None
        and moment.utcoffset() is not None
        and EPOCH <= moment <= _LATEST
    )


def validate_document(document: RendezvousDocument, *, max_participants: int | None = None) -> RendezvousDocument:
    """Return ``document`` if it is a state tensorplay (or torch) could have produced, else raise.

    Checked: types and ranges of every field; at most ``MAX_NODES`` nodes; no node in two of
    participants, wait list and redundancy list; a complete round's ranks are distinct; an
    incomplete round's ranks are all 0 (tensorplay assigns ranks only on completion); at most
    ``max_participants`` participants when given.

    Raises:
        StateDocumentError: the first problem found, naming its field.
    """
    _integer(document.round, "round", 0, MAX_INT32)
    _boolean(document.complete, "complete")
    _boolean(document.closed, "closed")
    if document.deadline is not None:
        from_microseconds(to_microseconds(document.deadline, "deadline"), "deadline")
    nodes = document.nodes()
    if len(nodes) > MAX_NODES:
        raise StateDocumentError("addr", f"names {len(nodes)} nodes, more than the {MAX_NODES} allowed")
    for node in nodes:
        if not isinstance(node, NodeId):
            raise StateDocumentError("addr", f"node {node!r:.80} is not a NodeId")
        _check_node(node)
    roles: dict[NodeId, str] = {}
    for name, members in (
        ("participants", document.participants),
        ("wait list", document.wait_list),
        ("redundancy list", document.redundancy_list),
    ):
        for node in members:
            if node in roles:
                raise StateDocumentError("role", f"node {node} is in both the {roles[node]} and the {name}")
            roles[node] = name
    if max_participants is not None and len(document.participants) > max_participants:
        raise StateDocumentError(
            "role", f"{len(document.participants)} participants, more than the {max_participants} nodes allowed"
        )
    seen = bytearray(MAX_NODES)
    for node, rank in document.participants.items():
        if type(rank) is not int or not 0 <= rank < MAX_NODES:
            raise StateDocumentError("rank", f"node {node} has rank {rank!r:.40}, not an integer in 0..{MAX_NODES - 1}")
        if not document.complete and rank != 0:
            raise StateDocumentError("rank", f"node {node} has rank {rank} before the round completed (must be 0)")
        if document.complete:
            if seen[rank]:
                raise StateDocumentError("rank", f"rank {rank} is held by two participants")
            seen[rank] = 1
    for node, beat in document.last_heartbeats.items():
        if not _moment_valid(beat):
            from_microseconds(to_microseconds(beat, f"heartbeat of {node}"), f"heartbeat of {node}")
    return document


# -- JSON columns ----------------------------------------------------------------------------


def document_to_json(document: RendezvousDocument) -> dict[str, Any]:
    """Return the JSON object of ``document`` in the column layout (validates it first)."""
    validate_document(document)
    nodes = document.nodes()
    beats = {node: to_microseconds(moment, "heartbeat") for node, moment in document.last_heartbeats.items()}
    base = min(beats.values(), default=0)
    roles = dict.fromkeys(document.participants, Role.PARTICIPANT)  # a valid document's lists are disjoint
    roles.update(dict.fromkeys(document.wait_list, Role.WAITING))
    roles.update(dict.fromkeys(document.redundancy_list, Role.REDUNDANT))
    ranks = [document.participants[node] for node in nodes if node in document.participants]
    return {
        "version": DOCUMENT_VERSION,
        "round": document.round,
        "complete": document.complete,
        "closed": document.closed,
        "deadline": None if document.deadline is None else to_microseconds(document.deadline, "deadline"),
        "heartbeatBase": base,
        "addr": [node.addr for node in nodes],
        "pid": [node.pid for node in nodes],
        "localId": [node.local_id for node in nodes],
        "role": [int(roles.get(node, Role.HEARTBEAT_ONLY)) for node in nodes],
        "rankDelta": [rank - previous for previous, rank in zip([0, *ranks], ranks, strict=False)],
        "heartbeat": [beats[node] - base if node in beats else -1 for node in nodes],
    }


def document_from_json(data: Any, *, max_participants: int | None = None) -> RendezvousDocument:
    """Return the validated document held by a decoded JSON object.

    Raises:
        StateDocumentError: a missing, unknown, mistyped or out-of-range field, or an
            inconsistent state; the message names the field.
    """
    if not isinstance(data, dict):
        raise StateDocumentError("text", f"must hold a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise StateDocumentError("text", f"field {unknown[0]!r:.60} is not a field of the state document version 1")
    missing = sorted(_KEYS - set(data))
    if missing:
        raise StateDocumentError(missing[0], "is missing")
    if data["version"] != DOCUMENT_VERSION or type(data["version"]) is not int:
        raise StateDocumentError(
            "version", f"{data['version']!r:.40} is not a version this release reads ({DOCUMENT_VERSION})"
        )
    columns = [data[name] for name in _COLUMNS]
    for name, column in zip(_COLUMNS, columns, strict=True):
        if not isinstance(column, list):
            raise StateDocumentError(name, f"must be a list, got {type(column).__name__}")
        if len(column) > MAX_NODES:
            raise StateDocumentError(name, f"lists {len(column)} nodes, more than the {MAX_NODES} allowed")
        if len(column) != len(columns[0]):
            raise StateDocumentError(name, f"has {len(column)} entries but addr has {len(columns[0])}")
    base = _integer(data["heartbeatBase"], "heartbeatBase", 0, MAX_MICROSECONDS)
    deadline = data["deadline"]
    if deadline is not None:
        deadline = from_microseconds(_integer(deadline, "deadline", 0, MAX_MICROSECONDS), "deadline")
    deltas = data["rankDelta"]
    if not isinstance(deltas, list) or len(deltas) > MAX_NODES:
        raise StateDocumentError("rankDelta", f"must be a list of at most {MAX_NODES} integers")
    participants: dict[NodeId, int] = {}
    waiting: list[NodeId] = []
    redundant: list[NodeId] = []
    heartbeats: dict[NodeId, datetime] = {}
    previous: NodeId | None = None
    rank = 0
    for index, (addr, pid, local_id, role, beat) in enumerate(zip(*columns, strict=True)):
        if type(addr) is not str:
            raise StateDocumentError(f"addr[{index}]", f"must be a string, got {type(addr).__name__}")
        node = NodeId(addr, pid, local_id)
        _check_node(node, f"node[{index}]")
        if previous is not None and not previous < node:
            raise StateDocumentError(
                f"addr[{index}]", f"node {node} is listed twice or out of order (nodes are sorted and unique)"
            )
        previous = node
        role = _integer(role, f"role[{index}]", 0, 3)
        if role == Role.PARTICIPANT:
            position = len(participants)
            if position >= len(deltas):
                raise StateDocumentError("rankDelta", f"has {len(deltas)} entries but there are more participants")
            rank += _integer(deltas[position], f"rankDelta[{position}]", -MAX_NODES, MAX_NODES)
            if not 0 <= rank < MAX_NODES:
                raise StateDocumentError(
                    f"rankDelta[{position}]", f"gives node {node} rank {rank}, not in 0..{MAX_NODES - 1}"
                )
            participants[node] = rank
        elif role == Role.WAITING:
            waiting.append(node)
        elif role == Role.REDUNDANT:
            redundant.append(node)
        offset = _integer(beat, f"heartbeat[{index}]", -1, MAX_MICROSECONDS - base)
        if offset >= 0:
            heartbeats[node] = EPOCH + timedelta(microseconds=base + offset)
        elif role == Role.HEARTBEAT_ONLY:
            raise StateDocumentError(f"heartbeat[{index}]", f"node {node} has neither a role nor a heartbeat")
    if len(deltas) != len(participants):
        raise StateDocumentError("rankDelta", f"has {len(deltas)} entries for {len(participants)} participants")
    document = RendezvousDocument(
        round=data["round"],  # these three are checked by validate_document, first
        complete=data["complete"],
        closed=data["closed"],
        deadline=deadline,
        participants=participants,
        wait_list=frozenset(waiting),
        redundancy_list=frozenset(redundant),
        last_heartbeats=heartbeats,
    )
    return validate_document(document, max_participants=max_participants)


# -- text ------------------------------------------------------------------------------------


def encode_document(document: RendezvousDocument, limit: int = MAX_ENCODED_BYTES) -> str:
    """Return ``document`` as ``status.state`` text: ``kr1:`` + base64(zlib(JSON)).

    Raises:
        StateDocumentError: the document is invalid.
        StateTooLargeError: the text would be longer than ``limit``.
    """
    raw = json.dumps(document_to_json(document), separators=(",", ":")).encode("ascii")
    text = DOCUMENT_MARKER + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")
    if len(text) > limit:
        raise StateTooLargeError(
            "text",
            f"the encoded state is {len(text)} bytes ({len(raw)} before compression), over the {limit}-byte "
            "limit for one Kubernetes object; lower maxNodes or use shorter node names (--local-addr)",
        )
    return text


def _refuse_constant(name: str) -> Any:
    raise StateDocumentError("text", f"holds {name}, which no state document contains")


def _refuse_float(literal: str) -> Any:
    raise StateDocumentError("text", f"holds the non-integer number {literal[:40]!r}; every number is an integer")


def _parse_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise StateDocumentError("text", f"holds an integer of {len(literal)} digits; at most {MAX_INT_DIGITS}")
    return int(literal)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len(pairs) > 4 * len(_KEYS):
        raise StateDocumentError("text", f"an object has {len(pairs)} fields; a state document has {len(_KEYS)}")
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise StateDocumentError("text", f"field {key!r:.60} appears twice")
        result[key] = value
    return result


def _check_shape(text: str) -> None:
    """Refuse anything but one flat object whose values are scalars or flat arrays (linear time)."""
    skeleton = _STRING.sub('""', text)
    skeleton = _FLAT_ARRAY.sub("0", skeleton)
    if not _FLAT_OBJECT.fullmatch(skeleton):
        raise StateDocumentError(
            "text", "is not one JSON object of scalars and flat lists (nesting, or not JSON at all)"
        )


def decode_document(text: object, *, max_participants: int | None = None) -> RendezvousDocument:
    """Return the validated document stored in ``text`` (``status.state``).

    Raises:
        StateDocumentError: anything unexpected (wrong type, unknown marker, the old pickle
            format, bad base64, a zlib bomb or truncated stream, JSON of another shape, an
            invalid field). The message names the field and how to start over.
    """
    if not isinstance(text, str):
        raise StateDocumentError("text", f"must be a string, got {type(text).__name__}")
    if len(text) > MAX_ENCODED_BYTES:
        raise StateDocumentError("text", f"is {len(text)} bytes, over the {MAX_ENCODED_BYTES}-byte limit")
    if text.startswith(PICKLE_MARKER):
        raise StateDocumentError(
            "text",
            "holds a pickle (the 'z1:' format of kube-rendezvous 0.1), which could run code and is refused "
            f"unread; {CLEAR_HINT}",
        )
    if not text.startswith(DOCUMENT_MARKER):
        raise StateDocumentError(
            "text",
            f"starts with {text[:12]!r}, not the marker {DOCUMENT_MARKER!r}; it was not written by "
            f"kube-rendezvous; {CLEAR_HINT}",
        )
    try:
        compressed = base64.b64decode(text[len(DOCUMENT_MARKER) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise StateDocumentError("text", f"holds invalid base64 ({exc})") from exc
    decompressor = zlib.decompressobj()
    try:
        raw = decompressor.decompress(compressed, MAX_DOCUMENT_BYTES + 1)
    except zlib.error as exc:
        raise StateDocumentError("text", f"holds corrupt zlib data ({exc})") from exc
    if len(raw) > MAX_DOCUMENT_BYTES or decompressor.unconsumed_tail:
        raise StateDocumentError("text", f"decompresses to more than {MAX_DOCUMENT_BYTES} bytes (a zlib bomb?)")
    if not decompressor.eof:
        raise StateDocumentError("text", "is truncated: its zlib stream does not end")
    if decompressor.unused_data:
        raise StateDocumentError("text", f"has {len(decompressor.unused_data)} bytes after its zlib stream")
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateDocumentError("text", f"is not UTF-8 JSON ({exc})") from exc
    _check_shape(source)
    try:
        data = json.loads(
            source,
            parse_constant=_refuse_constant,
            parse_float=_refuse_float,
            parse_int=_parse_int,
            object_pairs_hook=_unique_keys,
        )
    except StateDocumentError:
        raise
    except (ValueError, RecursionError) as exc:
        raise StateDocumentError("text", f"is not valid JSON ({exc})") from exc
    return document_from_json(data, max_participants=max_participants)


# -- framework states ------------------------------------------------------------------------


def _node_of(node: Any, where: str) -> NodeId:
    try:
        result = NodeId(node.addr, node.pid, node.local_id)
    except AttributeError as exc:
        raise StateDocumentError(where, f"{node!r:.80} is not a node descriptor (addr, pid, local_id)") from exc
    _check_node(result, where)
    return result


def document_from_state(state: Any, *, max_participants: int | None = None) -> RendezvousDocument:
    """Return the validated document of a framework's ``_RendezvousState`` (duck-typed).

    Raises:
        StateDocumentError: a field is missing, mistyped or inconsistent.
    """
    try:
        document = RendezvousDocument(
            round=state.round,
            complete=state.complete,
            closed=state.closed,
            deadline=state.deadline,
            participants={_node_of(node, "participants"): rank for node, rank in state.participants.items()},
            wait_list=frozenset(_node_of(node, "wait_list") for node in state.wait_list),
            redundancy_list=frozenset(_node_of(node, "redundancy_list") for node in state.redundancy_list),
            last_heartbeats={
                _node_of(node, "last_heartbeats"): moment for node, moment in state.last_heartbeats.items()
            },
        )
    except (AttributeError, TypeError) as exc:
        raise StateDocumentError("text", f"{type(state).__name__} is not a rendezvous state: {exc}") from exc
    return validate_document(document, max_participants=max_participants)


def state_from_document(document: RendezvousDocument, state_class: Any, node_class: Any) -> Any:
    """Build a framework's ``_RendezvousState`` from a validated document, with its own classes."""
    nodes = {node: node_class(node.addr, node.pid, node.local_id) for node in document.nodes()}
    state = state_class()
    state.round = document.round
    state.complete = document.complete
    state.deadline = document.deadline
    state.closed = document.closed
    state.participants = {nodes[node]: rank for node, rank in document.participants.items()}
    state.wait_list = {nodes[node] for node in document.wait_list}
    state.redundancy_list = {nodes[node] for node in document.redundancy_list}
    state.last_heartbeats = {nodes[node]: moment for node, moment in document.last_heartbeats.items()}
    return state


def node_names(nodes: Iterable[NodeId]) -> list[str]:
    """Return the ``addr_pid_localid`` names of ``nodes``, sorted."""
    return sorted(str(node) for node in nodes)
