"""``kubectl rdzv``: look at and steer a Rendezvous from the command line (console script ``kubectl-rdzv``).

Subcommands (``kubectl rdzv --help``; ``-n/--namespace``, ``--kubeconfig``, ``--context`` as kubectl):

- ``status NAME [-o json]``: round, phase, participants with ranks, waiting and redundant nodes,
  the age of each node's last heartbeat, how many nodes the round still needs, the writer.
- ``close NAME``: sets ``spec.closed: true`` (a merge patch of the spec); the agents end the job.
- ``evict NAME NODE``: adds NODE to ``status.evictedNodes`` by compare-and-swap, as the operator
  does for a node whose pod is gone; the agents drop it from the next round.
- ``watch NAME``: a status line each time the object or its Leases change (a watch, not polling).

``status.state`` is read with ``decode_document``, the agents' own bounded validator: nothing is
ever unpickled. Heartbeats come from the per-node Leases when there are any (labels
``kube-rendezvous.io/rendezvous=<rendezvous name>`` and ``kube-rendezvous.io/lease=node``,
annotation ``kube-rendezvous.io/node`` = ``addr_pid_localid``, ``spec.renewTime``), else from
the state document. The writer Lease (``kube-rendezvous.io/lease=writer``) names the writer.
The plugin never writes the state document itself.

Not guaranteed:

- Heartbeat ages compare the writers' clocks (``renewTime``, the document's heartbeats) with this
  machine's clock; with clock skew they are off by the skew (negative ages are shown as such).
- ``status`` reads the object and the Leases in two requests: the two can be a moment apart.
- When the current round began forming (``status.roundStartTime``) and how long the last rounds
  took (``status.recentRounds``, the last 5) are the writers' clocks; a Rendezvous last written by
  an older release has neither. In LastCall the time since minNodes was reached is estimated from
  the deadline minus the spec's (or the default) last-call timeout; agents with their own
  rdzv-conf differ.
- ``evict`` and ``close`` record intents: they take effect when a live agent next writes the state.
  ``evict`` checks that the node is in the state when it writes, not that it is still there later.
- ``watch`` shows every change it receives, but after its watch is re-established (server timeout,
  410 Gone, a dropped connection) it shows only the end result of changes made in between.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

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
    GoneError,
    KubernetesApi,
    NotFoundError,
    call_with_retries,
    resource_path,
)
from .settings import SERVICE_ACCOUNT_NAMESPACE_FILE, RendezvousTimings
from .summary import format_time, rendezvous_phase

#: Labels and annotation of the per-node and writer Leases (the backend's contract).
LEASE_KIND_LABEL = "kube-rendezvous.io/lease"
NODE_ANNOTATION = "kube-rendezvous.io/node"
LEASE_GROUP = "coordination.k8s.io"
#: ``status.evictedNodes`` keeps this many names (the CRD's maxItems; oldest dropped first, as the operator).
EVICTED_NODES_KEPT = 256
#: Seconds one API request may take, and how long reads are retried while the server is unreachable.
REQUEST_TIMEOUT = 15.0
RETRY_TIMEOUT = 15.0
#: Compare-and-swap attempts of ``evict`` before giving up.
EVICT_ATTEMPTS = 20
#: Seconds one watch request lasts before it is re-established.
WATCH_SECONDS = 240
#: Nodes named in an error message before "and N more".
NODES_NAMED = 20

_ROUND_HISTORY_NOTE = "none recorded yet (status.recentRounds is empty)"
_MICROTIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


class PluginError(Exception):
    """A failure the user can act on; its message is one line that names the object or field and the fix."""


# -- connection ------------------------------------------------------------------------------


def _in_cluster() -> bool:
    return bool(
        os.environ.get("KUBERNETES_SERVICE_HOST")
        and not os.environ.get("KUBECONFIG")
        and not Path("~/.kube/config").expanduser().exists()
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    )


def connect(kubeconfig: str | None, context: str | None) -> tuple[KubernetesApi, str]:
    """Return an API client and the default namespace, as kubectl would pick them.

    The kubeconfig (``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``) and its
    current or named context; in a pod without a kubeconfig, the pod's ServiceAccount.

    Raises:
        PluginError: no usable kubeconfig or context.
    """
    try:
        if kubeconfig is None and context is None and _in_cluster():
            configuration = k8s_client.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            namespace = Path(SERVICE_ACCOUNT_NAMESPACE_FILE).read_text().strip()
            return KubernetesApi(k8s_client.ApiClient(configuration), REQUEST_TIMEOUT), namespace or "default"
        api_client = k8s_config.new_client_from_config(config_file=kubeconfig, context=context)
        contexts, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            active = next((item for item in contexts if item.get("name") == context), active)
        namespace = ((active or {}).get("context") or {}).get("namespace") or "default"
        return KubernetesApi(api_client, REQUEST_TIMEOUT), namespace
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        detail = " ".join(str(exc).split()).rstrip(".")
        raise PluginError(
            f"could not load the kubeconfig {where!r}"
            + (f" (context {context!r})" if context else "")
            + f": {detail}. Pass --kubeconfig PATH and --context NAME, or set KUBECONFIG."
        ) from exc


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
        group = LEASE_GROUP if resource.startswith("leases") else GROUP
        return PluginError(
            f"forbidden: you may not {verb} {resource} (API group {group!r}) in namespace {namespace!r}; "
            f"ask for a Role that grants {verb!r} on {resource!r} there, or use another --context "
            f"(check with: kubectl auth can-i {verb} {resource.split('/')[0]}.{group}"
            + (f" --subresource={resource.split('/')[1]}" if "/" in resource else "")
            + f" -n {namespace})"
        )
    return PluginError(
        f"the API server refused to {verb} {resource} in namespace {namespace!r}: {exc.status} {exc.reason}: "
        f"{exc.message}"
    )


def _read(api: KubernetesApi, path: str, query: dict[str, Any] | None = None) -> Any:
    """GET ``path``, retrying unavailability for ``RETRY_TIMEOUT`` seconds."""
    return call_with_retries(
        lambda: api.request("GET", path, query=query),
        deadline=time.monotonic() + RETRY_TIMEOUT,
        what=f"GET {path}",
    )


def _crd_installed(api: KubernetesApi) -> bool:
    """Whether the API server serves ``rendezvouses`` (discovery, which every authenticated user may read)."""
    try:
        resources = _read(api, f"/apis/{GROUP}/{VERSION}")
    except NotFoundError:
        return False
    except (ApiError, ApiUnavailableError):
        return True  # unknown: say what we know, that the object was not found
    return any(item.get("name") == RENDEZVOUS_PLURAL for item in (resources or {}).get("resources") or [])


def _not_found(api: KubernetesApi, namespace: str, rendezvous_name: str) -> PluginError:
    if not _crd_installed(api):
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


def leases_path(namespace: str) -> str:
    """URL path of the Lease collection of ``namespace``."""
    return f"/apis/{LEASE_GROUP}/v1/namespaces/{namespace}/leases"


def lease_selector(rendezvous_name: str) -> str:
    """The label selector of every Lease (node and writer) of a Rendezvous."""
    return f"{RENDEZVOUS_LABEL}={rendezvous_name}"


def list_leases(api: KubernetesApi, namespace: str, rendezvous_name: str) -> tuple[list[dict[str, Any]], str]:
    """Return the Rendezvous's Leases and the list's resourceVersion.

    Raises:
        ApiError, ApiUnavailableError: the list failed (the caller decides whether that is fatal).
    """
    answer = _read(api, leases_path(namespace), {"labelSelector": lease_selector(rendezvous_name)})
    return list(answer.get("items") or []), str((answer.get("metadata") or {}).get("resourceVersion") or "")


# -- reading a snapshot ----------------------------------------------------------------------


def parse_microtime(text: object) -> datetime | None:
    """The UTC datetime of an RFC 3339 time (``renewTime``, ``lastChangeTime``), or None if absent or malformed."""
    if not isinstance(text, str):
        return None
    match = _MICROTIME.fullmatch(text.strip())
    if match is None:
        return None
    base, fraction, zone = match.groups()
    try:
        moment = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    return (moment + timedelta(microseconds=micros)).astimezone(timezone.utc)


def decode_state(obj: dict[str, Any], namespace: str, rendezvous_name: str) -> RendezvousDocument | None:
    """The validated state document of ``obj`` (None when no agent wrote one yet); never unpickles.

    Raises:
        PluginError: ``status.state`` is not a valid state document; names the field and the fix.
    """
    text = (obj.get("status") or {}).get("state")
    if text is None or text == "":
        return None
    try:
        return decode_document(text)
    except StateDocumentError as exc:
        message = str(exc)
        if "kubectl patch" not in message:
            message += (
                f"; the agents refuse it too: clear it (kubectl patch rdzv {rendezvous_name} -n {namespace} "
                '--subresource=status --type=json -p \'[{"op":"remove","path":"/status/state"}]\') '
                "or use a new Rendezvous"
            )
        raise PluginError(f"Rendezvous {namespace}/{rendezvous_name} has an invalid {message}") from exc


@dataclass(frozen=True)
class Snapshot:
    """What ``status`` reads: the object and its Leases (``leases_error`` when they could not be listed)."""

    namespace: str
    rendezvous_name: str
    obj: dict[str, Any]
    leases: list[dict[str, Any]]
    leases_error: str | None = None


def read_snapshot(api: KubernetesApi, namespace: str, rendezvous_name: str) -> Snapshot:
    """Read the Rendezvous, then its Leases; Leases that cannot be listed are reported, not fatal."""
    obj = get_rendezvous(api, namespace, rendezvous_name)
    try:
        leases, _ = list_leases(api, namespace, rendezvous_name)
    except (ApiError, ApiUnavailableError) as exc:
        return Snapshot(namespace, rendezvous_name, obj, [], str(_api_failure(exc, "list", "leases", namespace)))
    return Snapshot(namespace, rendezvous_name, obj, leases)


def _lease_kind(lease: dict[str, Any]) -> str | None:
    return ((lease.get("metadata") or {}).get("labels") or {}).get(LEASE_KIND_LABEL)


def _iso(moment: datetime | None) -> str | None:
    """RFC 3339 with microseconds in UTC, as Kubernetes writes MicroTime (None stays None)."""
    return None if moment is None else moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 3)


def _timings(spec: dict[str, Any]) -> RendezvousTimings:
    try:
        return RendezvousTimings.resolve(None, spec)
    except ValueError:
        return RendezvousTimings()


def build_report(
    snapshot: Snapshot, now: datetime, document: RendezvousDocument | None, state_error: str | None = None
) -> dict[str, Any]:
    """Return the JSON-ready description of a Rendezvous (what ``status -o json`` prints)."""
    obj = snapshot.obj
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    timings = _timings(spec)
    min_nodes = spec.get("minNodes")
    node_leases: dict[str, dict[str, Any]] = {}
    writer: dict[str, Any] | None = None
    for lease in snapshot.leases:
        metadata = lease.get("metadata") or {}
        lease_spec = lease.get("spec") or {}
        renewed = parse_microtime(lease_spec.get("renewTime")) or parse_microtime(lease_spec.get("acquireTime"))
        kind = _lease_kind(lease)
        if kind == "writer":
            writer = {
                "holderIdentity": lease_spec.get("holderIdentity"),
                "lease": metadata.get("name"),
                "renewTime": _iso(renewed),
                "ageSeconds": _age(renewed, now),
            }
        elif kind == "node":
            node = (metadata.get("annotations") or {}).get(NODE_ANNOTATION)
            if isinstance(node, str) and node:
                node_leases[node] = {"lease": metadata.get("name"), "renewed": renewed}
    from_leases = bool(node_leases)
    roles: dict[str, tuple[str, int | None]] = {}
    document_beats: dict[str, datetime] = {}
    if document is not None:
        for member, position in document.participants.items():
            roles[str(member)] = ("participant", position)
        for node in document.wait_list:
            roles[str(node)] = ("waiting", None)
        for node in document.redundancy_list:
            roles[str(node)] = ("redundant", None)
        for member, moment in document.last_heartbeats.items():
            roles.setdefault(str(member), ("heartbeat-only", None))
            document_beats[str(member)] = moment
    for node in node_leases:
        roles.setdefault(node, ("lease-only", None))
    order = {"participant": 0, "waiting": 1, "redundant": 2, "heartbeat-only": 3, "lease-only": 4}
    nodes = []
    for node, (role, rank) in sorted(roles.items(), key=lambda item: (order[item[1][0]], item[1][1] or 0, item[0])):
        beat: datetime | None = node_leases[node]["renewed"] if node in node_leases else None
        if not from_leases:
            beat = document_beats.get(node)
        age = _age(beat, now)
        nodes.append(
            {
                "node": node,
                "role": role,
                "rank": rank,
                "lastHeartbeat": _iso(beat),
                "heartbeatAgeSeconds": age,
                "heartbeatExpired": age is not None and age > timings.heartbeat_expiry,
                "lease": node_leases.get(node, {}).get("lease"),
            }
        )
    participants = [item for item in nodes if item["role"] == "participant"]
    complete = document is not None and document.complete
    still_needed = None
    if not complete and isinstance(min_nodes, int):
        still_needed = max(0, min_nodes - len(participants))
    deadline = None if document is None or document.complete else document.deadline
    last_call_since = None
    if deadline is not None:
        last_call_since = deadline - timedelta(seconds=timings.last_call)
    last_change = parse_microtime(status.get("lastChangeTime"))
    round_start = parse_microtime(status.get("roundStartTime"))
    durations = []
    for item in status.get("recentRounds") or []:
        started, formed = parse_microtime(item.get("startTime")), parse_microtime(item.get("formedTime"))
        if started is not None and formed is not None:
            seconds = round((formed - started).total_seconds(), 3)
            durations.append({"round": item.get("round"), "nodes": item.get("nodes"), "formedInSeconds": seconds})
    return {
        "namespace": snapshot.namespace,
        "rendezvousName": snapshot.rendezvous_name,
        "phase": "Invalid" if state_error else rendezvous_phase(document),
        "round": None if document is None else document.round,
        "complete": complete,
        "closed": document is not None and document.closed,
        "specClosed": bool(spec.get("closed")),
        "minNodes": min_nodes,
        "maxNodes": spec.get("maxNodes"),
        "participantCount": len(participants),
        "waitingCount": sum(1 for item in nodes if item["role"] == "waiting"),
        "redundantCount": sum(1 for item in nodes if item["role"] == "redundant"),
        "nodesStillNeeded": still_needed,
        "deadline": _iso(deadline),
        "deadlineInSeconds": None if deadline is None else round((deadline - now).total_seconds(), 3),
        "lastCallSinceEstimate": _iso(last_call_since),
        "roundFormingSince": _iso(round_start),
        "roundDurations": durations,
        "roundDurationsNote": None if durations else _ROUND_HISTORY_NOTE,
        "lastChangeTime": status.get("lastChangeTime"),
        "lastChangeAgeSeconds": _age(last_change, now),
        "lastWriter": status.get("lastWriter"),
        "writer": writer,
        "heartbeatSource": "leases" if from_leases else "document",
        "heartbeatExpirySeconds": timings.heartbeat_expiry,
        "leasesError": snapshot.leases_error,
        "nodes": nodes,
        "evictedNodes": list(status.get("evictedNodes") or []),
        "conditions": [
            {key: item.get(key) for key in ("type", "status", "reason", "message", "lastTransitionTime")}
            for item in status.get("conditions") or []
        ],
        "runId": status.get("runId"),
        "stateError": state_error,
        "observedAt": _iso(now),
    }


# -- text ------------------------------------------------------------------------------------


def format_age(seconds: float | None) -> str:
    """``12s``, ``3m4s``, ``2h5m``, ``4d3h``; ``in 2s`` for a time ahead of this clock; ``-`` for none."""
    if seconds is None:
        return "-"
    ahead = seconds < 0
    whole = int(abs(seconds))
    if whole < 60:
        text = f"{whole}s"
    elif whole < 3600:
        text = f"{whole // 60}m{whole % 60}s"
    elif whole < 86400:
        text = f"{whole // 3600}h{whole % 3600 // 60}m"
    else:
        text = f"{whole // 86400}d{whole % 86400 // 3600}h"
    return f"in {text}" if ahead else f"{text} ago"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _phase_text(report: dict[str, Any]) -> str:
    if report["stateError"]:
        return f"Invalid state: {report['stateError']}"
    if report["round"] is None:
        return "Pending (no agent has written the state yet)"
    words = [f"round {report['round']}", "complete" if report["complete"] else "forming"]
    if report["closed"]:
        words.append("closed")
    elif report["specClosed"]:
        words.append("spec.closed is true; the agents have not applied it yet")
    else:
        words.append("open")
    return f"{report['phase']} ({', '.join(words)})"


def _waiting_for_text(report: dict[str, Any]) -> str:
    if report["complete"]:
        return "nothing: the round is complete"
    needed = report["nodesStillNeeded"]
    if needed is None:
        return "unknown (spec.minNodes is not set)"
    if needed > 0:
        return f"{_plural(needed, 'more node')} to reach minNodes {report['minNodes']}"
    text = f"0 more nodes (minNodes {report['minNodes']} reached)"
    deadline = parse_microtime(report["deadline"])
    if deadline is not None:
        text += (
            f"; more are admitted up to maxNodes {report['maxNodes']} until the deadline {format_time(deadline)} "
            f"({format_age(-report['deadlineInSeconds'])})"
        )
    return text


def _forming_text(report: dict[str, Any], now: datetime) -> str:
    if report["complete"] or report["round"] is None:
        return "-"
    started = parse_microtime(report["roundFormingSince"])
    text = "since when is not recorded" if started is None else f"began {format_age(_age(started, now))}"
    since = parse_microtime(report["lastCallSinceEstimate"])
    if since is not None:
        text += f"; minNodes reached about {format_age(_age(since, now))} (deadline minus the last-call timeout)"
    return text


def _past_rounds_text(report: dict[str, Any]) -> str:
    if not report["roundDurations"]:
        return str(report["roundDurationsNote"])
    return ", ".join(
        f"round {item['round']} formed in {item['formedInSeconds']:g}s with {_plural(item['nodes'] or 0, 'node')}"
        for item in report["roundDurations"]
    )


def _writer_text(report: dict[str, Any]) -> str:
    writer = report["writer"]
    if writer is None:
        return "none (no writer Lease)"
    return f"{writer['holderIdentity'] or '(no holder)'} (writer Lease renewed {format_age(writer['ageSeconds'])})"


def render_status(report: dict[str, Any]) -> str:
    """The text ``status`` prints for a report of ``build_report``."""
    now = parse_microtime(report["observedAt"]) or datetime.now(timezone.utc)
    source = (
        "node Leases"
        if report["heartbeatSource"] == "leases"
        else "the state document (no node Leases)" + (f"; {report['leasesError']}" if report["leasesError"] else "")
    )
    conditions = "; ".join(
        f"{item['type']}={item['status']} ({item['reason']}, "
        f"{format_age(_age(parse_microtime(item['lastTransitionTime']), now))})"
        for item in report["conditions"]
    )
    last_change = "-"
    if report["lastChangeTime"]:
        last_change = f"{report['lastChangeTime']} ({format_age(report['lastChangeAgeSeconds'])})"
        if report["lastWriter"]:
            last_change += f" by {report['lastWriter']}"
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
        ("Past rounds", _past_rounds_text(report)),
        ("Last change", last_change),
        ("Writer", _writer_text(report)),
        ("Heartbeats", f"from {source}; expired after {report['heartbeatExpirySeconds']:g}s"),
        ("Evicted", ", ".join(report["evictedNodes"]) or "none"),
        ("Conditions", conditions or "none (no operator has reported yet)"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label:<{width}}{value}" for label, value in rows]
    if report["nodes"]:
        table = [("NODE", "ROLE", "RANK", "LAST HEARTBEAT")]
        for item in report["nodes"]:
            beat = format_age(item["heartbeatAgeSeconds"])
            if item["heartbeatExpired"]:
                beat += " (expired)"
            rank = "-" if item["rank"] is None else str(item["rank"])
            table.append((item["node"], item["role"], rank, beat))
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


def describe(snapshot: Snapshot, now: datetime) -> dict[str, Any]:
    """``build_report`` of a snapshot whose state must be valid.

    Raises:
        PluginError: ``status.state`` is invalid.
    """
    document = decode_state(snapshot.obj, snapshot.namespace, snapshot.rendezvous_name)
    return build_report(snapshot, now, document)


def command_status(api: KubernetesApi, namespace: str, rendezvous_name: str, output: str, out: TextIO) -> None:
    """Print the status of a Rendezvous as text or JSON."""
    report = describe(read_snapshot(api, namespace, rendezvous_name), datetime.now(timezone.utc))
    if output == "json":
        out.write(json.dumps(report, indent=2) + "\n")
    else:
        out.write(render_status(report) + "\n")


def command_close(api: KubernetesApi, namespace: str, rendezvous_name: str, out: TextIO) -> None:
    """Set ``spec.closed: true`` (a merge patch: idempotent, retried while the server is unreachable)."""
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


def _known_nodes_text(names: list[str]) -> str:
    if not names:
        return "the state names no nodes"
    shown = ", ".join(names[:NODES_NAMED])
    more = f" and {len(names) - NODES_NAMED} more" if len(names) > NODES_NAMED else ""
    return f"known nodes: {shown}{more}"


def command_evict(api: KubernetesApi, namespace: str, rendezvous_name: str, node: str, out: TextIO) -> None:
    """Add ``node`` to ``status.evictedNodes`` by compare-and-swap on ``metadata.resourceVersion``.

    Raises:
        PluginError: the node is not in the state (lists the known ones), the state is invalid or
            absent, the request was refused, or ``EVICT_ATTEMPTS`` compare-and-swaps in a row lost.
    """
    path = resource_path(RENDEZVOUS_PLURAL, namespace, rendezvous_name)
    conflicts = 0
    deadline = time.monotonic() + RETRY_TIMEOUT
    while True:
        obj = get_rendezvous(api, namespace, rendezvous_name)
        status = obj.get("status") or {}
        current = list(status.get("evictedNodes") or [])
        if node in current:
            out.write(
                f"node {node} is already in status.evictedNodes of Rendezvous {namespace}/{rendezvous_name}; "
                "nothing changed\n"
            )
            return
        document = decode_state(obj, namespace, rendezvous_name)
        names = [] if document is None else sorted(str(item) for item in document.nodes())
        if node not in names:
            raise PluginError(
                f"node {node!r} is not in the state of Rendezvous {namespace}/{rendezvous_name}"
                + ("" if document is None else f" (round {document.round})")
                + f"; nothing was changed; {_known_nodes_text(names)}. "
                "Pass one of them exactly (addr_pid_localid, as kubectl rdzv status shows)"
            )
        body = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "status": {"evictedNodes": [*current, node][-EVICTED_NODES_KEPT:]},
        }
        try:
            api.request("PATCH", f"{path}/status", body=body, content_type=MERGE_PATCH)
        except ConflictError:
            conflicts += 1
            if conflicts >= EVICT_ATTEMPTS:
                raise PluginError(
                    f"could not evict node {node} from Rendezvous {namespace}/{rendezvous_name}: "
                    f"{conflicts} compare-and-swaps in a row lost to other writers; try again"
                ) from None
            continue
        except ApiUnavailableError as exc:
            # Outcome unknown: the next read shows whether it committed (then "already evicted").
            if time.monotonic() > deadline:
                raise _api_failure(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", namespace) from exc
            time.sleep(0.5)
            continue
        except NotFoundError as exc:
            raise _not_found(api, namespace, rendezvous_name) from exc
        except ApiError as exc:
            raise _api_failure(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", namespace) from exc
        role = "a node"
        if document is not None:
            role = next(
                (
                    label
                    for label, members in (
                        ("participant", {str(item) for item in document.participants}),
                        ("waiting node", {str(item) for item in document.wait_list}),
                        ("redundant node", {str(item) for item in document.redundancy_list}),
                    )
                    if node in members
                ),
                "a node (heartbeat only)",
            )
        out.write(
            f"node {node} ({role} of round {document.round if document else '-'}) added to status.evictedNodes "
            f"of Rendezvous {namespace}/{rendezvous_name}; the agents drop it when they next write the state\n"
        )
        return


@dataclass
class _WatchEvent:
    source: str  # "rendezvous" or "lease"
    event_type: str  # ADDED, MODIFIED, DELETED, RELISTED
    obj: Any  # the object, or the list of items after a relist


class _WatchFailed(Exception):
    def __init__(self, error: PluginError) -> None:
        super().__init__(str(error))
        self.error = error


def _pump(
    api: KubernetesApi,
    source: str,
    path: str,
    query: dict[str, Any],
    resource_version: str,
    events: queue.Queue[_WatchEvent | _WatchFailed],
    namespace: str,
) -> None:
    """Feed ``events`` from a watch on ``path`` forever, resuming from the last resourceVersion seen."""
    resource = RENDEZVOUS_PLURAL if source == "rendezvous" else "leases"
    delay = 0.2
    while True:
        try:
            for event in api.watch(
                path, query=dict(query, resourceVersion=resource_version), timeout_seconds=WATCH_SECONDS
            ):
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    resource_version = str(version)
                if event.get("type") != "BOOKMARK":
                    events.put(_WatchEvent(source, str(event.get("type")), obj))
                delay = 0.2
        except GoneError:
            try:
                answer = _read(api, path, query)
            except (ApiError, ApiUnavailableError) as exc:
                events.put(_WatchFailed(_api_failure(exc, "list", resource, namespace)))
                return
            resource_version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
            events.put(_WatchEvent(source, "RELISTED", list(answer.get("items") or [])))
        except ApiUnavailableError:
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        except ApiError as exc:
            if exc.transient:
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            events.put(_WatchFailed(_api_failure(exc, "watch", resource, namespace)))
            return


def _watch_report(
    namespace: str, rendezvous_name: str, obj: dict[str, Any] | None, leases: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    if obj is None:
        return None
    snapshot = Snapshot(namespace, rendezvous_name, obj, list(leases.values()))
    now = datetime.now(timezone.utc)
    try:
        return describe(snapshot, now)
    except PluginError as exc:
        return build_report(snapshot, now, None, state_error=str(exc))


def _event_label(event: _WatchEvent) -> str:
    if event.source == "rendezvous":
        return f"Rendezvous {event.event_type}"
    if event.event_type == "RELISTED":
        return "Leases RELISTED"
    metadata = event.obj.get("metadata") or {}
    kind = _lease_kind(event.obj)
    if kind == "node":
        node = (metadata.get("annotations") or {}).get(NODE_ANNOTATION) or metadata.get("name")
        return f"node Lease {node} {event.event_type}"
    if kind == "writer":
        holder = (event.obj.get("spec") or {}).get("holderIdentity") or "-"
        return f"writer Lease {event.event_type} (holder {holder})"
    return f"Lease {metadata.get('name')} {event.event_type}"


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

    Ends after ``max_events`` change lines, after ``timeout`` seconds, or at Ctrl-C.
    """
    rendezvous_collection = resource_path(RENDEZVOUS_PLURAL, namespace)
    rendezvous_query = {"fieldSelector": f"metadata.name={rendezvous_name}"}
    obj = get_rendezvous(api, namespace, rendezvous_name)
    try:
        listed = _read(api, rendezvous_collection, rendezvous_query)
    except (ApiError, ApiUnavailableError) as exc:
        raise _api_failure(exc, "list", RENDEZVOUS_PLURAL, namespace) from exc
    rendezvous_version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
    items = listed.get("items") or []
    obj = items[0] if items else obj
    watches = [("rendezvous", rendezvous_collection, rendezvous_query, rendezvous_version)]
    lease_items: list[dict[str, Any]] = []
    try:
        lease_items, lease_version = list_leases(api, namespace, rendezvous_name)
        watches.append(
            ("lease", leases_path(namespace), {"labelSelector": lease_selector(rendezvous_name)}, lease_version)
        )
    except ForbiddenError as exc:
        # Watch the object alone; heartbeats then come from the state document.
        print(
            f"warning: {_api_failure(exc, 'list', 'leases', namespace)}; watching the Rendezvous only", file=sys.stderr
        )
    except (ApiError, ApiUnavailableError) as exc:
        raise _api_failure(exc, "list", "leases", namespace) from exc
    leases = {item["metadata"]["name"]: item for item in lease_items}
    events: queue.Queue[_WatchEvent | _WatchFailed] = queue.Queue()
    # Each watch has its own client: a watch holds its connection for as long as it runs.
    for source, path, query, version in watches:
        worker_api = KubernetesApi(api.api_client, api.request_timeout)
        threading.Thread(
            target=_pump,
            args=(worker_api, source, path, query, version, events, namespace),
            name=f"watch-{source}",
            daemon=True,
        ).start()

    def emit(label: str, current: dict[str, Any] | None) -> None:
        report = _watch_report(namespace, rendezvous_name, current, leases)
        stamp = format_time(datetime.now(timezone.utc))
        if output == "json":
            out.write(json.dumps({"time": stamp, "event": label, "status": report}) + "\n")
        else:
            out.write(f"{stamp}  {label:<34}  {summary_line(report) if report else 'the Rendezvous is gone'}\n")
        out.flush()

    emit("now", obj)
    current: dict[str, Any] | None = obj
    deadline = None if timeout is None else time.monotonic() + timeout
    printed = 0
    while max_events is None or printed < max_events:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        try:
            event = events.get(timeout=remaining)
        except queue.Empty:
            return
        if isinstance(event, _WatchFailed):
            raise event.error
        if event.source == "rendezvous" and event.event_type == "RELISTED":
            current = event.obj[0] if event.obj else None
        elif event.source == "rendezvous":
            current = None if event.event_type == "DELETED" else event.obj
        elif event.event_type == "RELISTED":
            leases = {item["metadata"]["name"]: item for item in event.obj}
        elif event.event_type == "DELETED":
            leases.pop(event.obj["metadata"]["name"], None)
        else:
            leases[event.obj["metadata"]["name"]] = event.obj
        emit(_event_label(event), current)
        printed += 1


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
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status", parents=[common], help="round, members with ranks, heartbeat ages, what the round waits for"
    )
    status.add_argument("rendezvous_name", metavar="NAME")
    status.add_argument("-o", "--output", choices=["text", "json"], default="text")
    close = commands.add_parser("close", parents=[common], help="set spec.closed: the agents end the job")
    close.add_argument("rendezvous_name", metavar="NAME")
    evict = commands.add_parser("evict", parents=[common], help="add NODE to status.evictedNodes")
    evict.add_argument("rendezvous_name", metavar="NAME")
    evict.add_argument("node", metavar="NODE", help="addr_pid_localid, as status shows it")
    watch = commands.add_parser("watch", parents=[common], help="a line per change of the object or its Leases")
    watch.add_argument("rendezvous_name", metavar="NAME")
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
    sys.exit(run())


if __name__ == "__main__":
    main()
