"""``kubectl rdzv``: look at and steer a Rendezvous from the command line (console script ``kubectl-rdzv``).

Subcommands (``kubectl rdzv --help``; ``-n/--namespace``, ``--kubeconfig``, ``--context`` as kubectl;
docs/kubectl-rdzv.md shows their output):

- ``status NAME [-o json]``: round, phase, participants with ranks, waiting and redundant nodes, the age
  of each node's last heartbeat, how many nodes the round still needs, the writer, the last departure.
- ``close NAME``: sets ``spec.closed: true`` (a merge patch of the spec); the agents end the job.
- ``evict NAME NODE``: adds NODE to ``status.evictedNodes`` with ``status.add_evictions``, the
  compare-and-swap the operator uses for a node whose pod is gone; the agents drop it from the next round.
- ``watch NAME``: a status line each time the object or its Leases change (two ``WatchCache`` informers).

API access, Leases, eviction and watching are the library's own (``kubeapi``, ``leases``, ``status``,
``watchcache``). ``status.state`` is read with ``decode_document``, the agents' bounded validator:
nothing is ever unpickled, and the plugin never writes the state document. Heartbeats come from the
node Leases when there are any (the contract in ``leases``: ``spec.renewTime`` of the Leases labelled
with the Rendezvous and ``kube-rendezvous.io/lease=node``), else from the state document.

Not guaranteed:

- Heartbeat ages compare the writers' clocks with this machine's; with clock skew they are off by it.
- ``status`` reads the object and the Leases in two requests: the two can be a moment apart.
- ``status.roundStartTime``, ``status.recentRounds`` and ``status.lastDeparture`` are the writers'
  clocks, absent when an older release wrote the status; the LastCall estimate assumes the spec's
  (or the default) last-call timeout.
- ``evict`` and ``close`` record intents: they take effect when a live agent next writes the state.
- ``watch`` shows every change it receives; after a re-list (410 Gone, a dropped watch) only the end
  result of the changes made in between.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

from .document import RendezvousDocument, StateDocumentError, decode_document
from .kubeapi import (
    GROUP,
    MERGE_PATCH,
    RENDEZVOUS_LABEL,
    RENDEZVOUS_PLURAL,
    VERSION,
    ApiError,
    ApiUnavailableError,
    ConflictError,
    ForbiddenError,
    KubernetesApi,
    NotFoundError,
    call_with_retries,
    describe_api_error,
    load_api_client,
    resource_path,
)
from .leases import ANNOTATION_NODE, LABEL_LEASE, LEASE_PLURAL, micro_time, parse_micro_time
from .settings import SERVICE_ACCOUNT_NAMESPACE_FILE, RendezvousTimings
from .status import EVICT_ATTEMPTS, add_evictions
from .summary import departure_line, format_time, rendezvous_phase
from .watchcache import WatchCache

#: Seconds one API request may take, and how long requests are retried while the server is unreachable.
REQUEST_TIMEOUT = 15.0
RETRY_TIMEOUT = 15.0
#: Nodes named in an error message before "and N more".
NODES_NAMED = 20
#: The roles of ``status``'s node table, in the order it lists them.
ROLES = ("participant", "waiting", "redundant", "heartbeat-only", "lease-only")

_ROUND_HISTORY_NOTE = "none recorded yet (status.recentRounds is empty)"
#: What ``watch`` follows: its name in the event lines, and the collection.
_WATCHED = (("Rendezvous", RENDEZVOUS_PLURAL), ("Leases", LEASE_PLURAL))

Objects = dict[str, dict[str, Any]]


class PluginError(Exception):
    """A failure the user can act on; its message is one line that names the object or field and the fix."""


# -- API access ------------------------------------------------------------------------------


def connect(kubeconfig: str | None, context: str | None) -> tuple[KubernetesApi, str]:
    """Return an API client and the default namespace, as kubectl would pick them.

    The kubeconfig (``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``) and its current or
    named context; in a pod where none of those is given or exists, the pod's ServiceAccount.

    Raises:
        PluginError: no usable kubeconfig or context.
    """
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    in_pod = kubeconfig is context is None and "KUBECONFIG" not in os.environ and not Path(where).expanduser().exists()
    try:
        api_client, namespace = load_api_client(None if in_pod else where, context)
        if in_pod:
            namespace = Path(SERVICE_ACCOUNT_NAMESPACE_FILE).read_text().strip()
    except (OSError, ValueError) as exc:
        detail = " ".join(str(exc.__cause__ or exc).split()).rstrip(".")
        raise PluginError(
            f"could not load the kubeconfig {where!r}"
            + (f" (context {context!r})" if context else "")
            + f": {detail}. Pass --kubeconfig PATH and --context NAME, or set KUBECONFIG."
        ) from exc
    return KubernetesApi(api_client, REQUEST_TIMEOUT), namespace or "default"


def _forbidden(verb: str, resource: str, namespace: str) -> PluginError:
    """The permission to ask for, and the ``kubectl auth can-i`` that checks it."""
    group = "coordination.k8s.io" if resource == LEASE_PLURAL else GROUP
    plural, _, subresource = resource.partition("/")
    return PluginError(
        f"forbidden: you may not {verb} {resource} (API group {group!r}) in namespace {namespace!r}; "
        f"ask for a Role that grants {verb!r} on {resource!r} there, or use another --context "
        f"(check with: kubectl auth can-i {verb} {plural}.{group}"
        + (f" --subresource={subresource}" if subresource else "")
        + f" -n {namespace})"
    )


def _api_failure(exc: ApiError | ApiUnavailableError, verb: str, resource: str, namespace: str) -> PluginError:
    """One line for a failed request, naming the permission or the problem."""
    if isinstance(exc, ApiUnavailableError):
        return PluginError(
            f"could not reach the API server to {verb} {resource} in namespace {namespace!r} ({exc}); "
            "check --kubeconfig/--context and that the cluster is up"
        )
    if isinstance(exc, ForbiddenError) and exc.status == 401:
        return PluginError(
            f"the API server did not accept your credentials (401) to {verb} {resource}: {exc.message}; "
            "refresh them or pick another --context"
        )
    if isinstance(exc, ForbiddenError):
        return _forbidden(verb, resource, namespace)
    return PluginError(describe_api_error(exc, verb, resource, namespace))


def _read(api: KubernetesApi, path: str, query: dict[str, Any] | None = None) -> Any:
    """GET ``path``, retrying while the server is unreachable or busy, for ``RETRY_TIMEOUT`` seconds."""
    return call_with_retries(
        lambda: api.request("GET", path, query=query), deadline=time.monotonic() + RETRY_TIMEOUT, what=f"GET {path}"
    )


def _not_found(api: KubernetesApi, namespace: str, rendezvous_name: str) -> PluginError:
    """Why the Rendezvous is missing: no CRD (asked of discovery, which every user may read), or no object."""
    try:
        served = (_read(api, f"/apis/{GROUP}/{VERSION}") or {}).get("resources") or []
        installed = any(item.get("name") == RENDEZVOUS_PLURAL for item in served)
    except NotFoundError:
        installed = False
    except (ApiError, ApiUnavailableError):
        installed = True  # unknown: say what we know, that the object was not found
    if not installed:
        return PluginError(
            f"the Rendezvous CRD (rendezvouses.{GROUP}) is not installed in this cluster, so "
            f"{namespace}/{rendezvous_name} cannot exist; install it: kubectl apply -f crds/ "
            "(or helm install kube-rendezvous charts/kube-rendezvous)"
        )
    return PluginError(
        f"Rendezvous {namespace}/{rendezvous_name} not found; list them with: kubectl get rdzv -n {namespace} "
        "(or pass the right -n/--namespace)"
    )


def get_rendezvous(api: KubernetesApi, namespace: str, rendezvous_name: str) -> dict[str, Any]:
    """Return the Rendezvous object.

    Raises:
        PluginError: it does not exist, the CRD is missing, the request was refused or failed.
    """
    try:
        obj: dict[str, Any] = _read(api, resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name))
    except NotFoundError as exc:
        raise _not_found(api, namespace, rendezvous_name) from exc
    except (ApiError, ApiUnavailableError) as exc:
        raise _api_failure(exc, "get", RENDEZVOUS_PLURAL, namespace) from exc
    return obj


def list_leases(api: KubernetesApi, namespace: str, rendezvous_name: str) -> tuple[list[dict[str, Any]], str | None]:
    """The Rendezvous's node and writer Leases; none and the reason when they could not be listed."""
    query = {"labelSelector": f"{RENDEZVOUS_LABEL}={rendezvous_name}"}
    try:
        return list(_read(api, resource_path(LEASE_PLURAL, namespace), query).get("items") or []), None
    except (ApiError, ApiUnavailableError) as exc:
        return [], str(_api_failure(exc, "list", LEASE_PLURAL, namespace))


# -- the report ------------------------------------------------------------------------------


def parse_microtime(text: object) -> datetime | None:
    """The UTC datetime of an RFC 3339 time (``renewTime``, ``lastChangeTime``), or None if absent or malformed."""
    try:
        moment = parse_micro_time(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return None if moment is None or moment.tzinfo is None else moment.astimezone(timezone.utc)


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 3)


def decode_state(obj: dict[str, Any], namespace: str, rendezvous_name: str) -> RendezvousDocument | None:
    """The validated state document of ``obj`` as stored (None when no agent wrote one yet); never unpickles.

    Not ``intents.read_rendezvous``: that folds ``spec.closed`` and the evictions into the document,
    and ``status`` shows them apart from what the agents have applied.

    Raises:
        PluginError: ``status.state`` is not a valid state document; names the field and the fix.
    """
    text = (obj.get("status") or {}).get("state")
    try:
        return None if text is None or text == "" else decode_document(text)
    except StateDocumentError as exc:
        message = str(exc)
        if "kubectl patch" not in message:
            message += (
                f"; the agents refuse it too: clear it (kubectl patch rdzv {rendezvous_name} -n {namespace} "
                '--subresource=status --type=json -p \'[{"op":"remove","path":"/status/state"}]\') '
                "or use a new Rendezvous"
            )
        raise PluginError(f"Rendezvous {namespace}/{rendezvous_name} has an invalid {message}") from exc


def _node_rows(
    document: RendezvousDocument | None, leases: list[dict[str, Any]], now: datetime, expiry: float
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The node table (every node of the document, then nodes with only a Lease) and the writer Lease."""
    node_leases: dict[str, tuple[str | None, datetime | None]] = {}
    writer = None
    for lease in leases:
        metadata, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        renewed = parse_microtime(spec.get("renewTime")) or parse_microtime(spec.get("acquireTime"))
        kind = (metadata.get("labels") or {}).get(LABEL_LEASE)
        node = (metadata.get("annotations") or {}).get(ANNOTATION_NODE)
        if kind == "writer":
            writer = {
                "holderIdentity": spec.get("holderIdentity"),
                "lease": metadata.get("name"),
                "renewTime": None if renewed is None else micro_time(renewed),
                "ageSeconds": _age(renewed, now),
            }
        elif kind == "node" and isinstance(node, str) and node:
            node_leases[node] = (metadata.get("name"), renewed)
    # A node has one role in a document; a node the document does not name but a Lease does is lease-only.
    members: list[tuple[str, Any]] = [("lease-only", node_leases)]
    heartbeats: dict[str, datetime | None] = {node: renewed for node, (_, renewed) in node_leases.items()}
    ranks: dict[str, int] = {}
    if document is not None:
        members[:0] = [
            ("participant", document.participants),
            ("waiting", document.wait_list),
            ("redundant", document.redundancy_list),
            ("heartbeat-only", document.last_heartbeats),
        ]
        ranks = {str(node): rank for node, rank in document.participants.items()}
        if not node_leases:
            heartbeats = {str(node): moment for node, moment in document.last_heartbeats.items()}
    roles: dict[str, str] = {}
    for role, nodes in members:
        for node in nodes:
            roles.setdefault(str(node), role)
    rows = []
    for node in sorted(roles, key=lambda name: (ROLES.index(roles[name]), ranks.get(name, 0), name)):
        beat = heartbeats.get(node)
        age = _age(beat, now)
        rows.append(
            {
                "node": node,
                "role": roles[node],
                "rank": ranks.get(node),
                "lastHeartbeat": None if beat is None else micro_time(beat),
                "heartbeatAgeSeconds": age,
                "heartbeatExpired": age is not None and age > expiry,
                "lease": node_leases.get(node, (None, None))[0],
            }
        )
    return rows, writer


def build_report(
    namespace: str,
    rendezvous_name: str,
    obj: dict[str, Any],
    leases: list[dict[str, Any]],
    now: datetime,
    leases_error: str | None = None,
) -> dict[str, Any]:
    """Return the JSON-ready description of a Rendezvous (what ``status -o json`` prints).

    An invalid ``status.state`` gives phase ``Invalid`` and its one-line message in ``stateError``.
    """
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    try:
        document, state_error = decode_state(obj, namespace, rendezvous_name), None
    except PluginError as exc:
        document, state_error = None, str(exc)
    try:
        timings = RendezvousTimings.resolve(None, spec)
    except ValueError:
        timings = RendezvousTimings()
    nodes, writer = _node_rows(document, leases, now, timings.heartbeat_expiry)
    counts = {role: sum(1 for item in nodes if item["role"] == role) for role in ROLES}
    complete = document is not None and document.complete
    min_nodes = spec.get("minNodes")
    deadline = None if document is None or document.complete else document.deadline
    durations = []
    for item in status.get("recentRounds") or []:
        started, formed = parse_microtime(item.get("startTime")), parse_microtime(item.get("formedTime"))
        if started is not None and formed is not None:
            seconds = round((formed - started).total_seconds(), 3)
            durations.append({"round": item.get("round"), "nodes": item.get("nodes"), "formedInSeconds": seconds})
    round_start = parse_microtime(status.get("roundStartTime"))
    departure = status.get("lastDeparture")
    return {
        "namespace": namespace,
        "rendezvousName": rendezvous_name,
        "phase": "Invalid" if state_error else rendezvous_phase(document),
        "round": None if document is None else document.round,
        "complete": complete,
        "closed": document is not None and document.closed,
        "specClosed": bool(spec.get("closed")),
        "minNodes": min_nodes,
        "maxNodes": spec.get("maxNodes"),
        "participantCount": counts["participant"],
        "waitingCount": counts["waiting"],
        "redundantCount": counts["redundant"],
        "nodesStillNeeded": (
            max(0, min_nodes - counts["participant"]) if not complete and isinstance(min_nodes, int) else None
        ),
        "deadline": None if deadline is None else micro_time(deadline),
        "deadlineInSeconds": None if deadline is None else round((deadline - now).total_seconds(), 3),
        "lastCallSinceEstimate": (
            None if deadline is None else micro_time(deadline - timedelta(seconds=timings.last_call))
        ),
        "roundFormingSince": None if round_start is None else micro_time(round_start),
        "roundDurations": durations,
        "roundDurationsNote": None if durations else _ROUND_HISTORY_NOTE,
        "lastDeparture": departure if isinstance(departure, dict) else None,
        "lastChangeTime": status.get("lastChangeTime"),
        "lastChangeAgeSeconds": _age(parse_microtime(status.get("lastChangeTime")), now),
        "lastWriter": status.get("lastWriter"),
        "writer": writer,
        "heartbeatSource": "leases" if any(item["lease"] for item in nodes) else "document",
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


# -- text ------------------------------------------------------------------------------------


def format_age(seconds: float | None) -> str:
    """``12s``, ``3m4s``, ``2h5m``, ``4d3h``; ``in 2s`` for a time ahead of this clock; ``-`` for none."""
    if seconds is None:
        return "-"
    whole = int(abs(seconds))
    if whole < 60:
        text = f"{whole}s"
    elif whole < 3600:
        text = f"{whole // 60}m{whole % 60}s"
    elif whole < 86400:
        text = f"{whole // 3600}h{whole % 3600 // 60}m"
    else:
        text = f"{whole // 86400}d{whole % 86400 // 3600}h"
    return f"in {text}" if seconds < 0 else f"{text} ago"


def _since(text: object, now: datetime) -> str:
    """``format_age`` of an RFC 3339 time."""
    return format_age(_age(parse_microtime(text), now))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _phase_text(report: dict[str, Any]) -> str:
    if report["stateError"]:
        return f"Invalid state: {report['stateError']}"
    if report["round"] is None:
        return "Pending (no agent has written the state yet)"
    if report["closed"]:
        closed = "closed"
    elif report["specClosed"]:
        closed = "spec.closed is true; the agents have not applied it yet"
    else:
        closed = "open"
    progress = "complete" if report["complete"] else "forming"
    return f"{report['phase']} (round {report['round']}, {progress}, {closed})"


def _waiting_for_text(report: dict[str, Any]) -> str:
    needed = report["nodesStillNeeded"]
    if report["complete"]:
        return "nothing: the round is complete"
    if needed is None:
        return "unknown (spec.minNodes is not set)"
    if needed > 0:
        return f"{_plural(needed, 'more node')} to reach minNodes {report['minNodes']}"
    text = f"0 more nodes (minNodes {report['minNodes']} reached)"
    if report["deadline"] is not None:
        deadline = parse_microtime(report["deadline"]) or datetime.now(timezone.utc)
        text += (
            f"; more are admitted up to maxNodes {report['maxNodes']} until the deadline {format_time(deadline)} "
            f"({format_age(-report['deadlineInSeconds'])})"
        )
    return text


def _forming_text(report: dict[str, Any], now: datetime) -> str:
    if report["complete"] or report["round"] is None:
        return "-"
    started = report["roundFormingSince"]
    text = "since when is not recorded" if started is None else f"began {_since(started, now)}"
    if report["lastCallSinceEstimate"] is not None:
        reached = _since(report["lastCallSinceEstimate"], now)
        text += f"; minNodes reached about {reached} (deadline minus the last-call timeout)"
    return text


def render_status(report: dict[str, Any]) -> str:
    """The text ``status`` prints for a report of ``build_report``."""
    now = parse_microtime(report["observedAt"]) or datetime.now(timezone.utc)
    past_rounds = ", ".join(
        f"round {item['round']} formed in {item['formedInSeconds']:g}s with {_plural(item['nodes'] or 0, 'node')}"
        for item in report["roundDurations"]
    )
    departure = report["lastDeparture"]
    last_change = "-"
    if report["lastChangeTime"]:
        last_change = f"{report['lastChangeTime']} ({format_age(report['lastChangeAgeSeconds'])})"
        if report["lastWriter"]:
            last_change += f" by {report['lastWriter']}"
    writer = report["writer"]
    source = "node Leases"
    if report["heartbeatSource"] != "leases":
        source = "the state document (no node Leases)" + (f"; {report['leasesError']}" if report["leasesError"] else "")
    conditions = "; ".join(
        f"{item['type']}={item['status']} ({item['reason']}, {_since(item['lastTransitionTime'], now)})"
        for item in report["conditions"]
    )
    rows = [
        ("Rendezvous", f"{report['namespace']}/{report['rendezvousName']}"),
        ("Phase", _phase_text(report)),
        (
            "Nodes",
            f"{report['participantCount']} participants, {report['waitingCount']} waiting, "
            f"{report['redundantCount']} redundant (minNodes {report['minNodes']}, maxNodes {report['maxNodes']})",
        ),
        ("Waiting for", _waiting_for_text(report)),
        ("Forming", _forming_text(report, now)),
        ("Past rounds", past_rounds or str(report["roundDurationsNote"])),
        (
            "Last departure",
            f"{departure_line(departure)} (at {departure.get('time')})"
            if departure
            else "none recorded (status.lastDeparture is not set)",
        ),
        ("Last change", last_change),
        (
            "Writer",
            "none (no writer Lease)"
            if writer is None
            else f"{writer['holderIdentity'] or '(no holder)'} (writer Lease renewed {format_age(writer['ageSeconds'])})",
        ),
        ("Heartbeats", f"from {source}; expired after {report['heartbeatExpirySeconds']:g}s"),
        ("Evicted", ", ".join(report["evictedNodes"]) or "none"),
        ("Conditions", conditions or "none (no operator has reported yet)"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label:<{width}}{value}" for label, value in rows]
    if report["nodes"]:
        table = [("NODE", "ROLE", "RANK", "LAST HEARTBEAT")]
        for item in report["nodes"]:
            beat = format_age(item["heartbeatAgeSeconds"]) + (" (expired)" if item["heartbeatExpired"] else "")
            table.append((item["node"], item["role"], "-" if item["rank"] is None else str(item["rank"]), beat))
        widths = [max(len(row[column]) for row in table) for column in range(3)]
        lines.append("")
        for row in table:
            lines.append("   ".join(cell.ljust(widths[index]) for index, cell in enumerate(row[:3])) + "   " + row[3])
    return "\n".join(lines)


def summary_line(report: dict[str, Any]) -> str:
    """One line for ``watch``: phase, round, counts, what the round still needs, the writer."""
    if report["stateError"]:
        return f"INVALID state: {report['stateError']}"
    ages = [item["heartbeatAgeSeconds"] for item in report["nodes"] if item["heartbeatAgeSeconds"] is not None]
    parts = [
        report["phase"],
        f"round={'-' if report['round'] is None else report['round']}",
        f"participants={report['participantCount']}",
        f"waiting={report['waitingCount']}",
        f"redundant={report['redundantCount']}",
        f"needed={'-' if report['nodesStillNeeded'] is None else report['nodesStillNeeded']}",
        f"closed={str(report['closed'] or report['specClosed']).lower()}",
        f"oldest-heartbeat={format_age(max(ages)) if ages else '-'}",
        f"no-heartbeat={len(report['nodes']) - len(ages)}",
        f"evicted={len(report['evictedNodes'])}",
        f"writer={(report['writer'] or {}).get('holderIdentity') or '-'}",
    ]
    return " ".join(parts)


# -- commands --------------------------------------------------------------------------------


def command_status(api: KubernetesApi, namespace: str, rendezvous_name: str, output: str, out: TextIO) -> None:
    """Print the status of a Rendezvous as text or JSON; Leases that cannot be listed are reported, not fatal.

    Raises:
        PluginError: the object cannot be read, or its ``status.state`` is invalid.
    """
    obj = get_rendezvous(api, namespace, rendezvous_name)
    leases, leases_error = list_leases(api, namespace, rendezvous_name)
    report = build_report(namespace, rendezvous_name, obj, leases, datetime.now(timezone.utc), leases_error)
    if report["stateError"]:
        raise PluginError(report["stateError"])
    out.write((json.dumps(report, indent=2) if output == "json" else render_status(report)) + "\n")


def command_close(api: KubernetesApi, namespace: str, rendezvous_name: str, out: TextIO) -> None:
    """Set ``spec.closed: true`` (a merge patch: idempotent, retried while the server is unreachable).

    Not guaranteed: the agents end the job when they next read it, not when this returns.
    """
    obj = get_rendezvous(api, namespace, rendezvous_name)
    status = obj.get("status") or {}
    if (obj.get("spec") or {}).get("closed"):
        out.write(
            f"Rendezvous {namespace}/{rendezvous_name} is already closed (spec.closed is true); nothing changed\n"
        )
        return
    path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name)
    try:
        written = call_with_retries(
            lambda: api.request("PATCH", path, body={"spec": {"closed": True}}, content_type=MERGE_PATCH),
            deadline=time.monotonic() + RETRY_TIMEOUT,
            what=f"PATCH {path}",
        )
    except NotFoundError as exc:
        raise _not_found(api, namespace, rendezvous_name) from exc
    except (ApiError, ApiUnavailableError) as exc:
        raise _api_failure(exc, "patch", RENDEZVOUS_PLURAL, namespace) from exc
    if not (written.get("spec") or {}).get("closed"):
        raise PluginError(
            f"the API server accepted the patch but spec.closed of {namespace}/{rendezvous_name} is not true"
        )
    round_text = f"round {status['round']}" if status.get("round") is not None else "no round yet"
    out.write(
        f"Rendezvous {namespace}/{rendezvous_name} closed: spec.closed set to true ({round_text}, "
        f"{status.get('participantCount') or 0} participants). The agents stop their workers and exit 0 "
        "when they next read it; no new round forms. This cannot be undone.\n"
    )


def command_evict(api: KubernetesApi, namespace: str, rendezvous_name: str, node: str, out: TextIO) -> None:
    """Add ``node`` to ``status.evictedNodes`` with ``status.add_evictions`` (read, then a compare-and-swap
    on the resourceVersion, again with jittered backoff when another writer won).

    A node the state does not name is refused (the message lists those it does) and nothing is written.
    Not guaranteed: the node is checked against the state as read just before ``add_evictions``, which
    reads again for its compare-and-swap; a node that leaves the state in between is still added.

    Raises:
        PluginError: the node is not in the state, the state is invalid or absent, the request was
            refused, or ``status.EVICT_ATTEMPTS`` compare-and-swaps in a row lost.
    """
    where = f"Rendezvous {namespace}/{rendezvous_name}"
    already = f"node {node} is already in status.evictedNodes of {where}; nothing changed\n"
    obj = get_rendezvous(api, namespace, rendezvous_name)
    if node in ((obj.get("status") or {}).get("evictedNodes") or []):
        out.write(already)
        return
    document = decode_state(obj, namespace, rendezvous_name)
    names = [] if document is None else sorted(str(item) for item in document.nodes())
    if document is None or node not in names:
        known = "the state names no nodes"
        if names:
            more = f" and {len(names) - NODES_NAMED} more" if len(names) > NODES_NAMED else ""
            known = f"known nodes: {', '.join(names[:NODES_NAMED])}{more}"
        raise PluginError(
            f"node {node!r} is not in the state of {where}"
            + ("" if document is None else f" (round {document.round})")
            + f"; nothing was changed; {known}. Pass one of them exactly (addr_pid_localid, as kubectl rdzv status shows)"
        )
    deadline = time.monotonic() + RETRY_TIMEOUT
    try:  # add_evictions retries lost compare-and-swaps; this retries its reads while the server is unreachable
        _, written = call_with_retries(
            lambda: add_evictions(api, namespace, rendezvous_name, [node], deadline=deadline),
            deadline=deadline,
            what=f"evict {node} from {where}",
        )
    except ConflictError as exc:
        raise PluginError(
            f"could not evict node {node} from {where}: {EVICT_ATTEMPTS} compare-and-swaps in a row lost to "
            "other writers; try again"
        ) from exc
    except NotFoundError as exc:
        raise _not_found(api, namespace, rendezvous_name) from exc
    except (ApiError, ApiUnavailableError) as exc:
        read = isinstance(exc, ApiError) and exc.method == "GET"
        resource = RENDEZVOUS_PLURAL if read else f"{RENDEZVOUS_PLURAL}/status"
        raise _api_failure(exc, "get" if read else "patch", resource, namespace) from exc
    if written is None:  # evicted by someone else since the read above (or by this call, its answer lost)
        out.write(already)
        return
    groups = (
        ("participant", document.participants),
        ("waiting node", document.wait_list),
        ("redundant node", document.redundancy_list),
    )
    role = next((label for label, members in groups if node in map(str, members)), "a node (heartbeat only)")
    out.write(
        f"node {node} ({role} of round {document.round}) added to status.evictedNodes of {where}; "
        "the agents drop it when they next write the state\n"
    )


def _event_label(source: str, event_type: str, obj: dict[str, Any]) -> str:
    """What changed, in a line of ``watch``: ``Rendezvous MODIFIED``, ``node Lease <node> ADDED``, ..."""
    metadata = obj.get("metadata") or {}
    kind = (metadata.get("labels") or {}).get(LABEL_LEASE)
    if source == "Rendezvous":
        return f"Rendezvous {event_type}"
    if kind == "node":
        return f"node Lease {(metadata.get('annotations') or {}).get(ANNOTATION_NODE) or metadata.get('name')} {event_type}"
    if kind == "writer":
        return f"writer Lease {event_type} (holder {(obj.get('spec') or {}).get('holderIdentity') or '-'})"
    return f"Lease {metadata.get('name')} {event_type}"


def _follow(cache: WatchCache, source: str, changes: queue.Queue[tuple[str, str | None, Objects]]) -> WatchCache:
    """Start ``cache`` and queue ``(source, label, its objects)`` after each of its changes.

    The listener runs on the cache's thread under its lock, so each entry is the view right after that
    change. The first list is queued without a label (it is the present); a later one is ``RELISTED``.
    """
    known: set[str] = set()

    def listener(obj: dict[str, Any] | None) -> None:
        objects = cache.objects()
        label = None
        if obj is None and cache.epoch > 1:
            label = f"{source} RELISTED"
        elif obj is not None:
            name = obj["metadata"]["name"]
            label = _event_label(
                source, "DELETED" if name not in objects else "MODIFIED" if name in known else "ADDED", obj
            )
        known.clear()
        known.update(objects)
        changes.put((source, label, objects))

    cache.add_listener(listener)
    return cache.start()


def _watch_failure(cache: WatchCache, verb: str, resource: str, namespace: str) -> PluginError:
    """Why ``cache`` could not list or watch: it was refused (then it stops), or no answer came in time."""
    if not cache.supported:
        return _forbidden(verb, resource, namespace)
    unanswered = ApiUnavailableError(f"no answer for {RETRY_TIMEOUT:g} s")
    return _api_failure(unanswered, verb, resource, namespace)


def command_watch(
    api: KubernetesApi,
    namespace: str,
    rendezvous_name: str,
    output: str,
    max_events: int | None,
    timeout: float | None,
    out: TextIO,
) -> None:
    """Print the current status line, then one line per change of the object or its Leases.

    Ends after ``max_events`` change lines, after ``timeout`` seconds, or at Ctrl-C. Without permission
    to list the Leases it warns and watches the object alone (heartbeats then come from the document).

    Raises:
        PluginError: the object cannot be read, listed or watched.
    """
    get_rendezvous(api, namespace, rendezvous_name)  # its errors name the fix (not found, forbidden)
    queries = {
        "Rendezvous": {"fieldSelector": f"metadata.name={rendezvous_name}"},
        "Leases": {"labelSelector": f"{RENDEZVOUS_LABEL}={rendezvous_name}"},
    }
    changes: queue.Queue[tuple[str, str | None, Objects]] = queue.Queue()
    watched: dict[str, tuple[str, WatchCache]] = {}
    for source, plural in _WATCHED:
        cache = WatchCache(api, resource_path(plural, namespace), queries[source], f"{plural} of {rendezvous_name}")
        watched[source] = (plural, _follow(cache, source, changes))
    try:
        for source, (plural, cache) in list(watched.items()):
            if not cache.wait_ready(RETRY_TIMEOUT):
                if source == "Rendezvous" or cache.supported:
                    raise _watch_failure(cache, "list", plural, namespace)
                print(
                    f"warning: {_watch_failure(cache, 'list', plural, namespace)}; watching the Rendezvous only",
                    file=sys.stderr,
                )
                del watched[source]
        views: dict[str, Objects] = {source: {} for source, _ in _WATCHED}

        def take(entry: tuple[str, str | None, Objects]) -> str | None:
            views[entry[0]] = entry[2]
            return entry[1]

        def emit(label: str) -> None:
            obj = views["Rendezvous"].get(rendezvous_name)
            now = datetime.now(timezone.utc)
            report = (
                None if obj is None else build_report(namespace, rendezvous_name, obj, [*views["Leases"].values()], now)
            )
            if output == "json":
                out.write(json.dumps({"time": format_time(now), "event": label, "status": report}) + "\n")
            else:
                out.write(
                    f"{format_time(now)}  {label:<34}  {summary_line(report) if report else 'the Rendezvous is gone'}\n"
                )
            out.flush()

        while not changes.empty():  # what is queued already is the present, shown as "now"
            take(changes.get_nowait())
        emit("now")
        deadline = None if timeout is None else time.monotonic() + timeout
        printed = 0
        while max_events is None or printed < max_events:
            remaining = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if remaining <= 0:
                return
            for plural, cache in watched.values():
                if not cache.supported:
                    raise _watch_failure(cache, "watch", plural, namespace)
            try:
                label = take(changes.get(timeout=remaining))
            except queue.Empty:
                continue
            if label is not None:
                emit(label)
                printed += 1
    finally:
        for _, cache in watched.values():
            cache.stop()


# -- command line ----------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive seconds, got {text}")
    return value


def _common_options(default: Any) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n", "--namespace", default=default, help="namespace of the Rendezvous (default: the context's)"
    )
    common.add_argument(
        "--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)"
    )
    common.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The ``kubectl rdzv`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="kubectl rdzv",
        description="Look at and steer kube-rendezvous Rendezvous objects.",
        parents=[_common_options(None)],
    )
    # Given after the subcommand too (as kubectl allows); SUPPRESS keeps a value given before it.
    common = _common_options(argparse.SUPPRESS)
    common.add_argument("rendezvous_name", metavar="NAME")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status", parents=[common], help="round, members with ranks, heartbeat ages, what the round waits for"
    )
    status.add_argument("-o", "--output", choices=["text", "json"], default="text")
    commands.add_parser("close", parents=[common], help="set spec.closed: the agents end the job")
    evict = commands.add_parser("evict", parents=[common], help="add NODE to status.evictedNodes")
    evict.add_argument("node", metavar="NODE", help="addr_pid_localid, as status shows it")
    watch = commands.add_parser("watch", parents=[common], help="a line per change of the object or its Leases")
    watch.add_argument("-o", "--output", choices=["text", "json"], default="text")
    watch.add_argument("--max-events", type=_positive_int, help="stop after this many changes")
    watch.add_argument("--timeout", type=_positive_float, help="stop after this many seconds")
    return parser


def run(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``kubectl rdzv`` with ``argv``; return the exit code. Errors are one line on stderr."""
    stream = out or sys.stdout
    arguments = build_parser().parse_args(argv)
    try:
        api, default_namespace = connect(arguments.kubeconfig, arguments.context)
        namespace = arguments.namespace or default_namespace
        name = arguments.rendezvous_name
        if arguments.command == "status":
            command_status(api, namespace, name, arguments.output, stream)
        elif arguments.command == "close":
            command_close(api, namespace, name, stream)
        elif arguments.command == "evict":
            command_evict(api, namespace, name, arguments.node, stream)
        else:
            command_watch(api, namespace, name, arguments.output, arguments.max_events, arguments.timeout, stream)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except (ApiError, ApiUnavailableError) as exc:  # a failure no command turned into a message
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    """Console-script entry point ``kubectl-rdzv`` (kubectl finds it on PATH as ``kubectl rdzv``)."""
    # The plugin reports failures itself, in one line; the library's log lines (the watch's) are for agents.
    logging.getLogger("kube_rendezvous").addHandler(logging.NullHandler())
    sys.exit(run())


if __name__ == "__main__":
    main()
