"""What ``kubectl rdzv status`` and ``watch`` print, built from objects already read (pure: no I/O; the state is
read by ``decode_document``, the agents' bounded validator). Not guaranteed: heartbeat ages compare the writers'
clocks with ``now`` (off by any skew; negative ages shown as such); ``status.roundStartTime``, ``recentRounds`` and
``lastDeparture`` are the writers' clocks, absent when an older release wrote the status."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from .document import CLEAR_HINT, RendezvousDocument, StateDocumentError, decode_document
from .election_rules import micro_time, parse_micro_time
from .folder_rules import role_of
from .leases_rules import ANNOTATION_NODE, LABEL_LEASE
from .settings import RendezvousTimings
from .summary import completed_by_text, departure_line, format_time, rendezvous_phase

#: The roles in the node table of ``status``, in the order it lists them (``redundant``: a spare; ``held``: its
#: Kubernetes Node does not admit it, ``status.heldNodes``).
ROLES = ("participant", "waiting", "redundant", "held", "heartbeat-only", "lease-only")
Obj = dict[str, Any]


class PluginError(Exception):
    """A failure the user can act on; its message is one line that names the object or field and the fix."""


def parse_microtime(text: object) -> datetime | None:
    """The UTC datetime of an RFC 3339 time (``renewTime``, ``lastChangeTime``), or None if absent or malformed."""
    try:
        moment = parse_micro_time(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return None if moment is None or moment.tzinfo is None else moment.astimezone(timezone.utc)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else micro_time(moment)


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 3)


def decode_state(obj: Obj, namespace: str, name: str) -> RendezvousDocument | None:
    """The state document of ``obj`` as stored (None: none yet), or a ``PluginError`` naming the invalid field and
    the fix. Not ``intents.read_rendezvous``, which folds ``spec.closed`` and evictions into the document."""
    text = (obj.get("status") or {}).get("state")
    try:
        return None if text is None or text == "" else decode_document(text)
    except StateDocumentError as exc:
        fix = CLEAR_HINT.replace("rdzv NAME", f"rdzv {name} -n {namespace}")
        hint = "" if "kubectl patch" in str(exc) else f"; the agents refuse it too: {fix}"
        raise PluginError(f"Rendezvous {namespace}/{name} has an invalid {exc}{hint}") from exc


def _rank_domains(status: Obj) -> dict[int, str]:
    """Each rank's domain, from ``status.topology.domains`` (the runs of the last round that formed)."""
    domains: dict[int, str] = {}
    for item in (status.get("topology") or {}).get("domains") or []:
        first, last = item.get("firstRank"), item.get("lastRank")
        if isinstance(first, int) and isinstance(last, int) and 0 <= first <= last:
            domains.update(dict.fromkeys(range(first, min(last, first + 16384) + 1), str(item.get("domain"))))
    return domains


def node_table(
    document: RendezvousDocument | None, leases: list[Obj], now: datetime, expiry: float, status: Obj | None = None
) -> tuple[list[Obj], Obj | None, bool]:
    """The node table (the document's nodes, then those only a Lease names), the writer Lease, and whether the
    heartbeats are the node Leases' (when there are any) or the document's. With ``status``, each participant's
    topology domain and each held node's reason."""
    lease_names: dict[str, str | None] = {}
    heartbeats: dict[str, datetime | None] = {}
    writer = None
    for lease in leases:
        metadata, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        renewed = parse_microtime(spec.get("renewTime")) or parse_microtime(spec.get("acquireTime"))
        kind = (metadata.get("labels") or {}).get(LABEL_LEASE)
        node = (metadata.get("annotations") or {}).get(ANNOTATION_NODE)
        if kind == "writer":
            writer = {"holderIdentity": spec.get("holderIdentity"), "lease": metadata.get("name")}
            writer.update(renewTime=_iso(renewed), ageSeconds=_age(renewed, now))
        elif kind == "node" and isinstance(node, str) and node:
            lease_names[node], heartbeats[node] = metadata.get("name"), renewed
    document = document or RendezvousDocument()
    roles = dict.fromkeys(lease_names, "lease-only")
    roles.update({str(node): role_of(document, node) or "heartbeat-only" for node in document.nodes()})
    held = {
        str(item.get("node")): str(item.get("reason"))
        for item in (status or {}).get("heldNodes") or []
        if isinstance(item, dict)
    }
    roles.update({node: "held" for node in held if roles.get(node) in ("heartbeat-only", "lease-only")})
    ranks = {str(node): rank for node, rank in document.participants.items()}
    topology = (status or {}).get("topology") or {}
    by_rank = _rank_domains(status or {}) if document.complete and topology.get("order") == "Topology" else {}
    if not lease_names:
        heartbeats = {str(node): moment for node, moment in document.last_heartbeats.items()}
    ages = {node: _age(moment, now) for node, moment in heartbeats.items()}
    rows = [
        {
            "node": node,
            "role": roles[node],
            "rank": ranks.get(node),
            "lastHeartbeat": _iso(heartbeats.get(node)),
            "heartbeatAgeSeconds": (age := ages.get(node)),
            "heartbeatExpired": age is not None and age > expiry,
            "lease": lease_names.get(node),
            "domain": by_rank.get(ranks[node]) if node in ranks else None,
            "heldReason": held.get(node) if roles[node] == "held" else None,
        }
        for node in sorted(roles, key=lambda key: (ROLES.index(roles[key]), ranks.get(key, 0), key))
    ]
    return rows, writer, bool(lease_names)


def build_report(
    namespace: str, name: str, obj: Obj, leases: list[Obj], now: datetime, leases_error: Any = None
) -> dict[str, Any]:
    """The JSON-ready description of a Rendezvous and its Leases (what ``status -o json`` prints); an
    invalid ``status.state`` gives phase ``Invalid`` and its one-line message in ``stateError``."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    try:
        document, state_error = decode_state(obj, namespace, name), None
    except PluginError as exc:
        document, state_error = None, str(exc)
    try:
        timings = RendezvousTimings.resolve(None, spec)
    except ValueError:
        timings = RendezvousTimings()
    nodes, writer, from_leases = node_table(document, leases, now, timings.heartbeat_expiry, status)
    counts = {role: sum(1 for item in nodes if item["role"] == role) for role in ROLES}
    complete, min_nodes = document is not None and document.complete, spec.get("minNodes")
    still_needed = max(0, min_nodes - counts["participant"]) if isinstance(min_nodes, int) else None
    deadline = None if document is None or document.complete else document.deadline
    durations = [
        {
            "round": item.get("round"),
            "nodes": item.get("nodes"),
            "formedInSeconds": round((formed - started).total_seconds(), 3),
            "completedBy": item.get("completedBy"),
        }
        for item in status.get("recentRounds") or []
        if (started := parse_microtime(item.get("startTime"))) and (formed := parse_microtime(item.get("formedTime")))
    ]
    return {
        "namespace": namespace,
        "rendezvousName": name,
        "phase": "Invalid" if state_error else rendezvous_phase(document),
        "round": None if document is None else document.round,
        "complete": complete,
        "closed": document is not None and document.closed,
        "specClosed": bool(spec.get("closed")),
        **{key: spec.get(key) for key in ("minNodes", "maxNodes")},
        **{f"{role}Count": counts[role] for role in ("participant", "waiting", "redundant", "held")},
        "rankOrder": (status.get("topology") or {}).get("order"),
        "rankOrderReason": (status.get("topology") or {}).get("reason"),
        "nodesStillNeeded": None if complete else still_needed,
        "deadline": _iso(deadline),
        "deadlineInSeconds": None if deadline is None else round((deadline - now).total_seconds(), 3),
        "lastCallSinceEstimate": None if deadline is None else _iso(deadline - timedelta(seconds=timings.last_call)),
        "roundFormingSince": _iso(parse_microtime(status.get("roundStartTime"))),
        "roundDurations": durations,
        "roundDurationsNote": None if durations else "none recorded yet (status.recentRounds is empty)",
        "lastDeparture": status.get("lastDeparture") if isinstance(status.get("lastDeparture"), dict) else None,
        "lastChangeTime": status.get("lastChangeTime"),
        "lastChangeAgeSeconds": _age(parse_microtime(status.get("lastChangeTime")), now),
        "lastWriter": status.get("lastWriter"),
        "writer": writer,
        "heartbeatSource": "leases" if from_leases else "document",
        "heartbeatExpirySeconds": timings.heartbeat_expiry,
        "leasesError": leases_error,
        "nodes": nodes,
        "evictedNodes": list(status.get("evictedNodes") or []),
        "conditions": [
            {key: item.get(key) for key in ("type", "status", "reason", "message", "lastTransitionTime")}
            for item in status.get("conditions") or []
        ],
        "runId": status.get("runId"),
        "stateError": state_error,
        "observedAt": micro_time(now),
    }


def change_label(source: str, obj: Obj | None, before: dict[str, Obj], after: dict[str, Obj], epoch: int) -> str | None:
    """The label of a ``watch`` line for a change of ``obj`` in ``source`` ("Rendezvous" or "Leases"), whose objects
    were ``before`` and are ``after``; ``obj`` None: a list, the first (``epoch`` 1) the present (None)."""
    if obj is None:
        return f"{source} RELISTED" if epoch > 1 else None
    metadata = obj["metadata"]
    name, kind = metadata["name"], (metadata.get("labels") or {}).get(LABEL_LEASE)
    event = "DELETED" if name not in after else "MODIFIED" if name in before else "ADDED"
    if source == "Rendezvous":
        return f"Rendezvous {event}"
    if kind == "node":
        return f"node Lease {(metadata.get('annotations') or {}).get(ANNOTATION_NODE) or name} {event}"
    if kind == "writer":
        return f"writer Lease {event} (holder {(obj.get('spec') or {}).get('holderIdentity') or '-'})"
    return f"Lease {name} {event}"


def format_age(seconds: float | None) -> str:
    """``12s``, ``3m4s``, ``2h5m``, ``4d3h``; ``in 2s`` for a time ahead of this clock; ``-`` for none."""
    if seconds is None:
        return "-"
    whole = int(abs(seconds))
    text = f"{whole}s"
    for unit, name, part, part_name in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if whole >= unit:
            text = f"{whole // unit}{name}{whole % unit // part}{part_name}"
            break
    return f"in {text}" if seconds < 0 else f"{text} ago"


def _since(text: str | None, now: datetime) -> str:
    return format_age(_age(parse_microtime(text), now))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def render_status(report: dict[str, Any]) -> str:
    """The text ``status`` prints for a report of ``build_report``."""
    now = parse_microtime(report["observedAt"]) or datetime.now(timezone.utc)
    if report["stateError"]:
        phase = f"Invalid state: {report['stateError']}"
    elif report["round"] is None:
        phase = "Pending (no agent has written the state yet)"
    else:
        unapplied = "spec.closed is true; the agents have not applied it yet" if report["specClosed"] else "open"
        closed = "closed" if report["closed"] else unapplied
        progress = "complete" if report["complete"] else "forming"
        phase = f"{report['phase']} (round {report['round']}, {progress}, {closed})"
    needed, deadline = report["nodesStillNeeded"], report["deadline"]
    if report["complete"]:
        waiting = "nothing: the round is complete"
    elif needed is None:
        waiting = "unknown (spec.minNodes is not set)"
    elif needed > 0:
        waiting = f"{_plural(needed, 'more node')} to reach minNodes {report['minNodes']}"
    else:
        waiting = f"0 more nodes (minNodes {report['minNodes']} reached)"
        if deadline is not None:
            waiting += (
                f"; more are admitted up to maxNodes {report['maxNodes']} until the deadline "
                f"{format_time(parse_microtime(deadline) or now)} ({format_age(-report['deadlineInSeconds'])})"
            )
    forming = "-"
    if not report["complete"] and report["round"] is not None:
        started = report["roundFormingSince"]
        forming = "since when is not recorded" if started is None else f"began {_since(started, now)}"
        if report["lastCallSinceEstimate"] is not None:
            reached = _since(report["lastCallSinceEstimate"], now)
            forming += f"; minNodes reached about {reached} (deadline minus the last-call timeout)"
    past_rounds = ", ".join(
        f"round {item['round']} formed in {item['formedInSeconds']:g}s with {_plural(item['nodes'] or 0, 'node')}"
        + completed_by_text({"recentRounds": [item]}, item["round"])
        for item in report["roundDurations"]
    )
    departure = "none recorded (status.lastDeparture is not set)"
    if report["lastDeparture"]:
        departure = f"{departure_line(report['lastDeparture'])} (at {report['lastDeparture'].get('time')})"
    last_change = "-"
    if report["lastChangeTime"]:
        last_change = f"{report['lastChangeTime']} ({format_age(report['lastChangeAgeSeconds'])})"
        last_change += f" by {report['lastWriter']}" if report["lastWriter"] else ""
    writer = "none (no writer Lease)"
    if (lease := report["writer"]) is not None:
        writer = f"{lease['holderIdentity'] or '(no holder)'} (writer Lease renewed {format_age(lease['ageSeconds'])})"
    error = f"; {report['leasesError']}" if report["leasesError"] else ""
    source = "node Leases" if report["heartbeatSource"] == "leases" else f"the state document (no node Leases){error}"
    conditions = "; ".join(
        f"{item['type']}={item['status']} ({item['reason']}, {_since(item['lastTransitionTime'], now)})"
        for item in report["conditions"]
    )
    counts = f"{report['participantCount']} participants, {report['waitingCount']} waiting, "
    counts += f"{report['redundantCount']} redundant (minNodes {report['minNodes']}, maxNodes {report['maxNodes']})"
    if report["rankOrder"] == "Topology":
        domains = sorted({item["domain"] for item in report["nodes"] if item["domain"] is not None})
        order = f"by topology domain ({_plural(len(domains), 'domain')} in this round), then address"
    elif report["rankOrder"] == "Address":
        order = f"by address: {report['rankOrderReason'] or 'no topology'}"
    else:
        order = "not recorded in the status (no round formed since a release that records it)"
    held = [f"{item['node']}: {item['heldReason']}" for item in report["nodes"] if item["role"] == "held"]
    rows = [
        ("Rendezvous", f"{report['namespace']}/{report['rendezvousName']}"),
        ("Phase", phase),
        ("Nodes", counts),
        ("Waiting for", waiting),
        ("Forming", forming),
        ("Past rounds", past_rounds or str(report["roundDurationsNote"])),
        ("Last departure", departure),
        ("Last change", last_change),
        ("Writer", writer),
        ("Heartbeats", f"from {source}; expired after {report['heartbeatExpirySeconds']:g}s"),
        ("Evicted", ", ".join(report["evictedNodes"]) or "none"),
        ("Held", "; ".join(held) or "none"),
        ("Ranks", order),
        ("Conditions", conditions or "none (no operator has reported yet)"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label:<{width}}{value}" for label, value in rows]
    table = [("NODE", "ROLE", "RANK", "DOMAIN", "LAST HEARTBEAT")]
    for item in report["nodes"]:
        beat = format_age(item["heartbeatAgeSeconds"]) + (" (expired)" if item["heartbeatExpired"] else "")
        rank = "-" if item["rank"] is None else str(item["rank"])
        table.append((item["node"], item["role"], rank, item["domain"] or "-", beat))
    widths = [max(len(row[column]) for row in table) + 3 for column in range(4)]
    if report["nodes"]:
        lines += ["", *("".join(map(str.ljust, row[:4], widths)) + row[4] for row in table)]
    return "\n".join(lines)


def summary_line(report: dict[str, Any]) -> str:
    """One line for ``watch``: phase, round, counts, what the round still needs, heartbeats, the writer."""
    if report["stateError"]:
        return f"INVALID state: {report['stateError']}"
    ages = [item["heartbeatAgeSeconds"] for item in report["nodes"] if item["heartbeatAgeSeconds"] is not None]
    needed, writer = report["nodesStillNeeded"], (report["writer"] or {}).get("holderIdentity") or "-"
    return (
        f"{report['phase']} round={'-' if report['round'] is None else report['round']} "
        f"participants={report['participantCount']} waiting={report['waitingCount']} "
        f"redundant={report['redundantCount']} held={report['heldCount']} needed={'-' if needed is None else needed} "
        f"closed={str(report['closed'] or report['specClosed']).lower()} "
        f"oldest-heartbeat={format_age(max(ages)) if ages else '-'} no-heartbeat={len(report['nodes']) - len(ages)} "
        f"evicted={len(report['evictedNodes'])} writer={writer}"
    )
