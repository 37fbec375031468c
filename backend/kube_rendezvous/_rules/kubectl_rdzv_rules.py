"""What ``kubectl rdzv`` prints, built from objects already read (pure: no I/O): ``status`` and ``watch`` (the state
read by ``decode_document``, the agents' bounded validator), ``list`` (the CRD's printer columns), ``-o
json|yaml|jsonpath`` (kubectl's jsonpath dialect), ``close``'s question, dry run and refusal, and the exit codes.

Not guaranteed: heartbeat ages compare the writers' clocks with ``now`` (off by any skew; negative ages shown as
such); ``status.roundStartTime``, ``recentRounds`` and ``lastDeparture`` are the writers' clocks, absent when an
older release wrote the status; a node's pod is matched by its address (``pod_of``)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import yaml

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


def pod_of(node: str, pods: list[Obj]) -> tuple[str | None, str | None]:
    """The pod an agent ``node`` (``addr_pid_localid``) runs in and that pod's Kubernetes Node, matched as the operator
    matches them: its address is the pod's IP, name or hostname (running pods first). None for either when no pod
    or several match (several on one Node still name the Node: ``hostNetwork`` pods share the Node's IP).
    Not guaranteed: the node Leases do not record the pod, so an agent whose address is a Service name matches none."""
    addr = node.rsplit("_", 2)[0]
    matched = []
    for pod in pods:
        metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        ips = {status.get("podIP"), *(item.get("ip") for item in status.get("podIPs") or [] if isinstance(item, dict))}
        if addr in ips | {metadata.get("name"), spec.get("hostname")}:
            matched.append((status.get("phase") == "Running", metadata.get("name"), spec.get("nodeName")))
    running = [item for item in matched if item[0]] or matched
    hosts = {item[2] for item in running}
    return (running[0][1] if len(running) == 1 else None), (hosts.pop() if len(hosts) == 1 else None)


def node_table(
    document: RendezvousDocument | None,
    leases: list[Obj],
    now: datetime,
    expiry: float,
    status: Obj | None = None,
    pods: list[Obj] | None = None,
) -> tuple[list[Obj], Obj | None, bool]:
    """The node table (the document's nodes, then those only a Lease names), the writer Lease, and whether the
    heartbeats are the node Leases' (when there are any) or the document's. With ``status``, each participant's
    topology domain and each held node's reason; with ``pods`` (the namespace's), each node's pod and Kubernetes
    Node (``pod_of``)."""
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
    placed = {node: pod_of(node, pods or []) for node in roles}
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
            "pod": placed[node][0],
            "kubernetesNode": placed[node][1],
        }
        for node in sorted(roles, key=lambda key: (ROLES.index(roles[key]), ranks.get(key, 0), key))
    ]
    return rows, writer, bool(lease_names)


def build_report(
    namespace: str,
    name: str,
    obj: Obj,
    leases: list[Obj],
    now: datetime,
    leases_error: Any = None,
    pods: list[Obj] | None = None,
    pods_error: str | None = None,
) -> dict[str, Any]:
    """The JSON-ready description of a Rendezvous and its Leases (what ``status -o json`` prints); an
    invalid ``status.state`` gives phase ``Invalid`` and its one-line message in ``stateError``. ``pods``: the
    namespace's pods, to name each node's pod and Kubernetes Node (None: not listed, ``pods_error`` says why)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    try:
        document, state_error = decode_state(obj, namespace, name), None
    except PluginError as exc:
        document, state_error = None, str(exc)
    try:
        timings = RendezvousTimings.resolve(None, spec)
    except ValueError:
        timings = RendezvousTimings()
    nodes, writer, from_leases = node_table(document, leases, now, timings.heartbeat_expiry, status, pods)
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
        "podsListed": pods is not None,
        "podsError": pods_error,
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


def render_status(report: dict[str, Any], wide: bool = False) -> str:
    """The text ``status`` prints for a report of ``build_report``; ``wide`` (``-o wide``) adds each node's Lease
    and the time of its last heartbeat."""
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
    pods = None
    if report.get("podsError"):
        pods = f"not matched (POD and K8S NODE are -): {report['podsError']}"
    elif report.get("podsListed"):
        pods = f"matched by address (pod IP, name or hostname) among the pods of namespace {report['namespace']}"
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
        *([("Pods", pods)] if pods else []),
        ("Evicted", ", ".join(report["evictedNodes"]) or "none"),
        ("Held", "; ".join(held) or "none"),
        ("Ranks", order),
        ("Conditions", conditions or "none (no operator has reported yet)"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label:<{width}}{value}" for label, value in rows]
    header = ["NODE", "ROLE", "RANK", "POD", "K8S NODE", "DOMAIN", *(["LEASE"] if wide else []), "LAST HEARTBEAT"]
    table = [header]
    for item in report["nodes"]:
        beat = format_age(item["heartbeatAgeSeconds"]) + (" (expired)" if item["heartbeatExpired"] else "")
        beat += f" ({item['lastHeartbeat']})" if wide and item["lastHeartbeat"] else ""
        rank = "-" if item["rank"] is None else str(item["rank"])
        cells = [item["node"], item["role"], rank, item.get("pod"), item.get("kubernetesNode"), item["domain"]]
        table.append([str(cell or "-") for cell in [*cells, *([item["lease"]] if wide else [])]] + [beat])
    if report["nodes"]:
        lines += ["", *format_table(table, padding=3, min_width=0)]
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


# -- tables, ``list`` and ``-o`` ---------------------------------------------------------------------------------

#: Exit codes of ``kubectl rdzv`` (docs/kubectl-rdzv.md, "Exit codes"): success; any error, a usage error included
#: (one line on stderr); interrupted (Ctrl-C, 128 + SIGINT).
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130
#: What ``-o`` takes on ``status`` and ``list`` besides ``jsonpath=TEMPLATE`` (``text``: the default's old name).
OUTPUT_FORMATS = ("text", "wide", "json", "yaml")
#: The CRD's ``additionalPrinterColumns`` (crds/rendezvous.yaml; a test keeps the two equal): name, JSONPath,
#: type, priority (1: only with ``-o wide``), as ``kubectl get rdzv`` shows them.
PRINTER_COLUMNS: tuple[tuple[str, str, str, int], ...] = (
    ("Phase", ".status.phase", "string", 0),
    ("Round", ".status.round", "integer", 0),
    ("Members", ".status.participantCount", "integer", 0),
    ("Min", ".status.minNodes", "integer", 0),
    ("Max", ".status.maxNodes", "integer", 0),
    ("Waiting", ".status.waitingCount", "integer", 0),
    ("Spares", ".status.spareCount", "integer", 0),
    ("Held", ".status.heldCount", "integer", 1),
    ("Order", ".status.topology.order", "string", 1),
    ("Round-Age", ".status.roundStartTime", "date", 0),
    ("Ready", ".status.conditions[?(@.type=='Ready')].status", "string", 1),
    ("Run", ".status.runId", "string", 1),
    ("Age", ".metadata.creationTimestamp", "date", 0),
)
#: What a cell without a value shows (as ``kubectl get -o custom-columns``).
NONE_CELL = "<none>"


def format_table(rows: list[list[str]], padding: int = 3, min_width: int = 6) -> list[str]:
    """Rows as kubectl's tab writer aligns them: each column but the last as wide as its longest cell plus
    ``padding``, at least ``min_width``."""
    widths = [max(min_width, max(len(row[column]) for row in rows) + padding) for column in range(len(rows[0]) - 1)]
    return ["".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + row[-1] for row in rows]


def human_duration(seconds: float) -> str:
    """A duration as kubectl's AGE column shows it (apimachinery ``duration.HumanDuration``): ``45s``, ``3m4s``,
    ``25m``, ``5h2m``, ``30h``, ``3d4h``, ``200d``, ``2y10d``; ``0s`` up to 1 s ahead, ``<invalid>`` further ahead."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 120:
        return f"{max(whole, 0)}s"
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    steps = [
        (minutes < 10, minutes, "m", whole % 60, "s"),
        (minutes < 180, minutes, "m", 0, ""),
        (hours < 8, hours, "h", minutes % 60, "m"),
        (hours < 48, hours, "h", 0, ""),
        (hours < 24 * 8, days, "d", hours % 24, "h"),
        (hours < 24 * 365 * 2, days, "d", 0, ""),
        (hours < 24 * 365 * 8, days // 365, "y", days % 365, "d"),
    ]
    big, unit, small, small_unit = next(
        ((b, u, s, su) for fits, b, u, s, su in steps if fits), (days // 365, "y", 0, "")
    )
    return f"{big}{unit}{small}{small_unit}" if small else f"{big}{unit}"


def _cell(value: list[Any], kind: str, now: datetime) -> str:
    if not value or value[0] is None:
        return NONE_CELL
    if kind == "date":
        moment = parse_microtime(value[0])
        return "<unknown>" if moment is None else human_duration((now - moment).total_seconds())
    return ",".join(_scalar_text(item) for item in value)


def list_rows(objects: list[Obj], now: datetime, all_namespaces: bool = False, wide: bool = False) -> list[str]:
    """``list``'s lines (as ``kubectl get rdzv``: the CRD's printer columns, NAMESPACE first with ``-A``), sorted
    by namespace and name; no lines for no objects (the caller says "No resources found")."""
    columns = [column for column in PRINTER_COLUMNS if wide or column[3] == 0]
    header = [*(["NAMESPACE"] if all_namespaces else []), "NAME", *(column[0].upper() for column in columns)]
    rows = [header]
    for obj in sorted(objects, key=lambda item: (item["metadata"].get("namespace", ""), item["metadata"]["name"])):
        metadata = obj["metadata"]
        cells = [_cell(evaluate_path(parse_path(path), obj), kind, now) for _, path, kind, _ in columns]
        rows.append([*([str(metadata.get("namespace"))] if all_namespaces else []), str(metadata["name"]), *cells])
    return format_table(rows) if objects else []


def no_resources(namespace: str | None) -> str:
    """What ``list`` says when there is nothing, as kubectl (``namespace`` None: all namespaces)."""
    return "No resources found" if namespace is None else f"No resources found in {namespace} namespace."


def parse_output(text: str) -> tuple[str, str | None]:
    """``-o``'s value as (format, jsonpath template); a ``ValueError`` names the choices. The template is parsed
    here, so a bad one fails before any request."""
    if text.startswith("jsonpath="):
        template = text.partition("=")[2]
        try:
            parse_template(template)
        except PluginError as exc:
            raise ValueError(str(exc)) from exc
        return "jsonpath", template
    if text not in OUTPUT_FORMATS:
        raise ValueError(f"unknown output format {text!r}; use one of {', '.join(OUTPUT_FORMATS)}, jsonpath=TEMPLATE")
    return text, None


def as_list(objects: list[Obj]) -> Obj:
    """The ``List`` that ``kubectl get -o json|yaml|jsonpath`` shows for several objects."""
    return {"apiVersion": "v1", "kind": "List", "items": objects, "metadata": {"resourceVersion": ""}}


def render_data(data: Any, output: str, template: str | None = None) -> str:
    """``data`` (a report, a List) as ``-o json``, ``yaml`` or ``jsonpath`` shows it (no trailing newline)."""
    if output == "json":
        return json.dumps(data, indent=2)
    if output == "yaml":
        return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False)).rstrip("\n")
    return run_template(parse_template(template or ""), data)


# -- jsonpath: kubectl's dialect (k8s.io/client-go/util/jsonpath), the subset kubectl users write ---------------------
#
# A template is text with actions in braces: ``{.items[*].metadata.name}``, ``{range .items[*]}...{end}``,
# ``{"\n"}`` (a quoted literal). A path is ``$`` (the root) or ``@``/nothing (the current object), then steps:
# ``.name`` (``\.`` is a dot in a name: ``.metadata.labels.kube-rendezvous\.io/rendezvous``), ``['name']``,
# ``..name`` (recursive descent), ``.*``/``[*]``, ``[N]`` (negative from the end), ``[A:B]``, ``[?(@.path)]``,
# ``[?(@.path OP literal)]`` (OP ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``; literal a quoted string, a number,
# ``true``, ``false``, ``null``). Missing keys print nothing (kubectl's ``--allow-missing-template-keys``). Several
# results print space-separated; maps and lists as compact JSON.

Step = tuple[str, Any]
JsonPath = tuple[Step, ...]
Template = list[tuple[str, Any]]
_FILTER = re.compile(r"\s*(@[^=!<>\s]*)\s*(?:(==|!=|<=|>=|<|>)\s*(.+?))?\s*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


class JsonPathError(PluginError):
    """A template or path that is not kubectl's jsonpath (the subset above); ``why`` says what is wrong."""

    def __init__(self, text: str, why: str) -> None:
        super().__init__(f"error parsing jsonpath {text!r}: {why}")
        self.why = why


_jsonpath_error = JsonPathError


def _literal(text: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return re.sub(r"\\(.)", lambda match: _ESCAPES.get(match[1], match[1]), text[1:-1])
    constants = {"true": True, "false": False, "null": None}
    if text in constants:
        return constants[text]
    try:
        return int(text)
    except ValueError:
        return float(text)  # a ValueError: not a literal


def _bracket(path: str, inner: str) -> Step:
    if inner == "*":
        return ("all", None)
    if inner.startswith("?(") and inner.endswith(")"):
        match = _FILTER.fullmatch(inner[2:-1])
        if match is None:
            raise _jsonpath_error(path, f"filter [{inner}] is not [?(@.path)] or [?(@.path OP literal)]")
        try:
            literal = None if match[2] is None else _literal(match[3])
        except ValueError as exc:
            raise _jsonpath_error(path, f"{match[3]!r} is not a quoted string, number, true, false or null") from exc
        return ("filter", (parse_path(match[1]), match[2], literal))
    if inner[:1] in "'\"":
        return ("key", _literal(inner))
    try:
        if ":" in inner:
            start, _, stop = inner.partition(":")
            return ("slice", (int(start) if start.strip() else None, int(stop) if stop.strip() else None))
        return ("index", int(inner))
    except ValueError as exc:
        raise _jsonpath_error(path, f"[{inner}] is not [N], [A:B], [*], ['name'] or a filter [?(...)]") from exc


def parse_path(path: str) -> JsonPath:
    """A path's steps (see above); a ``PluginError`` says what is wrong with it."""
    text, steps, at = path.strip(), list[Step](), 0
    if text in ("", "."):
        return ()  # ``{.}``: the current object
    if text[:1] in ("$", "@"):
        steps.append(("root" if text[0] == "$" else "current", None))
        at = 1
    while at < len(text):
        if text.startswith("..", at) or text[at] == ".":
            recursive = text.startswith("..", at)
            at += 2 if recursive else 1
            name = ""
            while at < len(text) and text[at] not in ".[":
                escaped = text[at] == "\\" and at + 1 < len(text)
                name += text[at + 1] if escaped else text[at]
                at += 2 if escaped else 1
            if not name and not (recursive and text[at : at + 1] == "["):
                raise _jsonpath_error(path, f"a name is missing after '.' at {at}")
            steps.append(("descend", name or None) if recursive else ("all", None) if name == "*" else ("key", name))
        elif text[at] == "[":
            depth, end, quote = 0, at, ""
            for end in range(at, len(text)):
                char = text[end]
                if quote:
                    quote = "" if char == quote else quote
                elif char in "'\"":
                    quote = char
                elif char in "([":
                    depth += 1
                elif char in ")]":
                    depth -= 1
                    if depth == 0:
                        break
            if depth != 0 or quote:
                raise _jsonpath_error(path, f"'[' at {at} is not closed")
            steps.append(_bracket(path, text[at + 1 : end].strip()))
            at = end + 1
        else:
            raise _jsonpath_error(path, f"unexpected {text[at]!r} at {at}; a path starts with '.', '[', '$' or '@'")
    return tuple(steps)


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value[key] for key in sorted(value)]
    return list(value) if isinstance(value, list) else []


def _descendants(value: Any) -> list[Any]:
    found = [value]
    for child in _children(value):
        found += _descendants(child)
    return found


def _compare(left: Any, op: str, right: Any) -> bool:
    if op in ("==", "!="):
        same = left == right and isinstance(left, bool) == isinstance(right, bool)  # true is not 1
        return same == (op == "==")
    if isinstance(left, str) and isinstance(right, str):
        sign = (left > right) - (left < right)
    elif all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in (left, right)):
        sign = (float(left) > float(right)) - (float(left) < float(right))
    else:
        return False  # kubectl's filter compares only numbers with numbers and strings with strings
    return {"<": sign < 0, "<=": sign <= 0, ">": sign > 0, ">=": sign >= 0}[op]


def evaluate_path(path: JsonPath, current: Any, root: Any = None) -> list[Any]:
    """The values ``path`` selects from ``current`` (``$``: from ``root``, by default ``current``)."""
    values = [current]
    for kind, argument in path:
        selected: list[Any] = []
        for value in values:
            if kind == "root":
                selected.append(current if root is None else root)
            elif kind == "current":
                selected.append(value)
            elif kind == "key":
                selected += [value[argument]] if isinstance(value, dict) and argument in value else []
            elif kind == "all":
                selected += _children(value)
            elif kind == "descend":
                below = [item for child in _children(value) for item in _descendants(child)]
                selected += (
                    below
                    if argument is None
                    else [item[argument] for item in [value, *below] if isinstance(item, dict) and argument in item]
                )
            elif kind == "index" and isinstance(value, list) and -len(value) <= argument < len(value):
                selected.append(value[argument])
            elif kind == "slice" and isinstance(value, list):
                selected += value[argument[0] : argument[1]]
            elif kind == "filter":
                condition, op, literal = argument
                for item in _children(value):
                    found = evaluate_path(condition, item, root)
                    if (op is None and found and found[0] is not None) or (
                        op and found and _compare(found[0], op, literal)
                    ):
                        selected.append(item)
        values = selected
    return values


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return "null" if value is None else str(value)


def parse_template(template: str) -> Template:
    """A template's text and actions, ``range`` bodies nested; a ``PluginError`` says what is wrong."""
    stack: list[Template] = [[]]
    at = 0
    while at < len(template):
        start = template.find("{", at)
        if start < 0:
            stack[-1].append(("text", template[at:]))
            break
        if start > at:
            stack[-1].append(("text", template[at:start]))
        end, quote = start + 1, ""
        while end < len(template) and (quote or template[end] != "}"):
            if quote and template[end] == "\\":
                end += 1
            elif template[end] in "'\"":
                quote = "" if quote == template[end] else quote or template[end]
            end += 1
        if end >= len(template):
            raise _jsonpath_error(template, f"unclosed action '{{' at {start}")
        action = template[start + 1 : end].strip()
        if action == "end":
            if len(stack) == 1:
                raise _jsonpath_error(template, "{end} without {range ...}")
            body = stack.pop()
            stack[-1][-1] = ("range", (stack[-1][-1][1], body))
            at = end + 1
            continue
        try:
            if action.startswith("range ") or action.startswith("range\t"):
                stack[-1].append(("range", parse_path(action[6:])))
                stack.append([])
            elif action[:1] in "'\"":
                stack[-1].append(("text", _literal(action)))
            else:
                stack[-1].append(("path", parse_path(action)))
        except JsonPathError as exc:
            raise _jsonpath_error(template, f"in {{{action}}}: {exc.why}") from exc
        at = end + 1
    if len(stack) > 1:
        raise _jsonpath_error(template, "{range ...} without {end}")
    return stack[0]


def run_template(template: Template, current: Any, root: Any = None) -> str:
    """The text a parsed template prints for ``current`` (``root``: what ``$`` is, by default ``current``)."""
    root = current if root is None else root
    parts: list[str] = []
    for kind, argument in template:
        if kind == "text":
            parts.append(argument)
        elif kind == "path":
            parts.append(" ".join(_scalar_text(value) for value in evaluate_path(argument, current, root)))
        else:
            path, body = argument
            for value in evaluate_path(path, current, root):
                for item in _children(value) if path and path[-1][0] not in ("all", "filter", "slice") else [value]:
                    parts.append(run_template(body, item, root))
    return "".join(parts)


# -- close ---------------------------------------------------------------------------------------------------------


def close_summary(namespace: str, name: str, obj: Obj) -> str:
    """``Rendezvous ns/x (round 3, 2 participants)``: what ``close`` names in its prompt and dry run."""
    status = obj.get("status") or {}
    round_text = f"round {status['round']}" if status.get("round") is not None else "no round yet"
    return f"Rendezvous {namespace}/{name} ({round_text}, {status.get('participantCount') or 0} participants)"


def close_dry_run(namespace: str, name: str, obj: Obj, mode: str) -> str:
    """What ``close --dry-run=client|server`` prints: what it would do; nothing was changed."""
    checked = "; the API server accepted the patch (server dry run)" if mode == "server" else " (dry run)"
    return (
        f"{close_summary(namespace, name, obj)} would be closed: a merge patch would set spec.closed to true"
        f"{checked}; nothing changed. Without --dry-run this cannot be undone."
    )


def close_refusal(namespace: str, name: str) -> str:
    """The error of ``close`` without a terminal to ask on and without ``--yes``."""
    return (
        f"refusing to close Rendezvous {namespace}/{name} without confirmation (stdin is not a terminal); closing "
        "cannot be undone: pass --yes (-y) to close it, or --dry-run to see what it would do"
    )


def close_prompt(namespace: str, name: str, obj: Obj) -> str:
    """The question ``close`` asks on a terminal."""
    return f"Close {close_summary(namespace, name, obj)}? The agents end the job; this cannot be undone. [y/N]: "


def confirmed(answer: str) -> bool:
    """Whether an answer to ``close_prompt`` is yes (``y`` or ``yes``, any case)."""
    return answer.strip().lower() in ("y", "yes")
