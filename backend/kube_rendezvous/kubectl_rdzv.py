"""``kubectl rdzv``: look at and steer a Rendezvous from the command line (console script ``kubectl-rdzv``).

``status``, ``close``, ``evict`` and ``watch`` (docs/kubectl-rdzv.md shows their output and permissions),
built on the library's own clients: ``kubeapi`` (requests, retries, errors), ``status.add_evictions``
(the eviction compare-and-swap) and ``watchcache`` (list, then watch). What ``status`` and ``watch``
print is built from the objects read by ``kubectl_rdzv_report`` (pure). The plugin never writes the
state document.

Not guaranteed: ``evict`` and ``close`` record intents, which take effect when a live agent next writes
the state; the report's own limits (clock skew in heartbeat ages) are in ``kubectl_rdzv_report``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO, TypeVar

from .folding import role_of
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
from .kubectl_rdzv_report import PluginError, build_report, decode_state, render_status, summary_line
from .leases import ANNOTATION_NODE, LABEL_LEASE, LEASE_PLURAL
from .settings import SERVICE_ACCOUNT_NAMESPACE_FILE
from .status import EVICT_ATTEMPTS, add_evictions
from .summary import format_time
from .watchcache import WatchCache, object_watch

#: Seconds one API request may take, and how long requests are retried while the server is unreachable.
REQUEST_TIMEOUT = 15.0
RETRY_TIMEOUT = 15.0
#: Nodes an error message names before "and N more".
NODES_NAMED = 20
T = TypeVar("T")
#: What ``watch`` follows, by the name its lines give it: the collection of the Rendezvous, of its Leases.
WATCHED = {"Rendezvous": RENDEZVOUS_PLURAL, "Leases": LEASE_PLURAL}
#: One change ``watch`` saw: the collection ("Rendezvous" or "Leases"), the label of its line (None for the
#: first list: the present), and that collection's objects by name right after the change.
Change = tuple[str, str | None, dict[str, dict[str, Any]]]


def connect(kubeconfig: str | None, context: str | None) -> tuple[KubernetesApi, str]:
    """An API client and the default namespace, as kubectl picks them: the kubeconfig (``--kubeconfig``,
    else ``$KUBECONFIG``, else ``~/.kube/config``) and its context; in a pod without one, the pod's
    ServiceAccount and namespace."""
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    given = kubeconfig is not None or context is not None or bool(os.environ.get("KUBECONFIG"))
    in_pod = not given and not Path(where).expanduser().exists()
    try:
        api_client, namespace = load_api_client(None if in_pod else where, context)
        if in_pod:
            namespace = Path(SERVICE_ACCOUNT_NAMESPACE_FILE).read_text().strip()
    except (OSError, ValueError) as exc:
        detail = " ".join(str(exc.__cause__ or exc).split()).rstrip(".")
        named = f" (context {context!r})" if context else ""
        raise PluginError(
            f"could not load the kubeconfig {where!r}{named}: {detail}. "
            "Pass --kubeconfig PATH and --context NAME, or set KUBECONFIG."
        ) from exc
    return KubernetesApi(api_client, REQUEST_TIMEOUT), namespace or "default"


def _failure(exc: ApiError | ApiUnavailableError | None, verb: str, resource: str, namespace: str) -> PluginError:
    """One line for a failed request that names the fix; ``exc`` None: the request was refused (403)."""
    if isinstance(exc, ApiUnavailableError):
        return PluginError(
            f"could not reach the API server to {verb} {resource} in namespace {namespace!r} ({exc}); "
            "check --kubeconfig/--context and that the cluster is up"
        )
    if exc is not None and not (isinstance(exc, ForbiddenError) and exc.status == 403):
        return PluginError(describe_api_error(exc, verb, resource, namespace))
    group = "coordination.k8s.io" if resource == LEASE_PLURAL else GROUP
    plural, _, subresource = resource.partition("/")
    check = f"kubectl auth can-i {verb} {plural}.{group}" + (f" --subresource={subresource}" if subresource else "")
    return PluginError(
        f"forbidden: you may not {verb} {resource} (API group {group!r}) in namespace {namespace!r}; "
        f"ask for a Role that grants {verb!r} on {resource!r} there, or use another --context "
        f"(check with: {check} -n {namespace})"
    )


def _retrying(call: Callable[[], T], what: str) -> T:
    """``call``, repeated while the server is unreachable or busy, for ``RETRY_TIMEOUT`` seconds."""
    return call_with_retries(call, deadline=time.monotonic() + RETRY_TIMEOUT, what=what)


def _read(api: KubernetesApi, path: str, query: dict[str, Any] | None = None) -> Any:
    return _retrying(lambda: api.request("GET", path, query=query), f"GET {path}")


def _not_found(api: KubernetesApi, namespace: str, name: str) -> PluginError:
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
            f"the Rendezvous CRD (rendezvouses.{GROUP}) is not installed in this cluster, so {namespace}/{name} "
            "cannot exist; install it: kubectl apply -f crds/ (or helm install kube-rendezvous charts/kube-rendezvous)"
        )
    return PluginError(
        f"Rendezvous {namespace}/{name} not found; list them with: kubectl get rdzv -n {namespace} "
        "(or pass the right -n/--namespace)"
    )


def get_rendezvous(api: KubernetesApi, namespace: str, name: str) -> dict[str, Any]:
    """The Rendezvous object; a ``PluginError`` says why it cannot be read."""
    try:
        obj: dict[str, Any] = _read(api, resource_path(RENDEZVOUS_PLURAL, namespace, name))
    except NotFoundError as exc:
        raise _not_found(api, namespace, name) from exc
    except (ApiError, ApiUnavailableError) as exc:
        raise _failure(exc, "get", RENDEZVOUS_PLURAL, namespace) from exc
    return obj


def command_status(api: KubernetesApi, namespace: str, name: str, output: str, out: TextIO) -> None:
    """Print the status of a Rendezvous as text or JSON; Leases that cannot be listed are reported, not fatal.

    Not guaranteed: the object and its Leases are read in two requests, a moment apart.
    """
    obj = get_rendezvous(api, namespace, name)
    leases: list[dict[str, Any]] = []
    leases_error = None
    try:
        query = {"labelSelector": f"{RENDEZVOUS_LABEL}={name}"}
        leases = _read(api, resource_path(LEASE_PLURAL, namespace), query).get("items") or []
    except (ApiError, ApiUnavailableError) as exc:
        leases_error = str(_failure(exc, "list", LEASE_PLURAL, namespace))
    report = build_report(namespace, name, obj, leases, datetime.now(timezone.utc), leases_error)
    if report["stateError"]:
        raise PluginError(report["stateError"])
    out.write((json.dumps(report, indent=2) if output == "json" else render_status(report)) + "\n")


def command_close(api: KubernetesApi, namespace: str, name: str, out: TextIO) -> None:
    """Set ``spec.closed: true`` (a merge patch: idempotent, retried while the server is unreachable).

    Not guaranteed: the agents end the job when they next read it, not when this returns.
    """
    obj = get_rendezvous(api, namespace, name)
    status, where = obj.get("status") or {}, f"Rendezvous {namespace}/{name}"
    if (obj.get("spec") or {}).get("closed"):
        out.write(f"{where} is already closed (spec.closed is true); nothing changed\n")
        return
    path = resource_path(RENDEZVOUS_PLURAL, namespace, name)
    body = {"spec": {"closed": True}}
    try:
        written = _retrying(lambda: api.request("PATCH", path, body=body, content_type=MERGE_PATCH), f"PATCH {path}")
    except NotFoundError as exc:
        raise _not_found(api, namespace, name) from exc
    except (ApiError, ApiUnavailableError) as exc:
        raise _failure(exc, "patch", RENDEZVOUS_PLURAL, namespace) from exc
    if not (written.get("spec") or {}).get("closed"):
        raise PluginError(f"the API server accepted the patch but spec.closed of {where} is not true")
    round_text = f"round {status['round']}" if status.get("round") is not None else "no round yet"
    out.write(
        f"{where} closed: spec.closed set to true ({round_text}, {status.get('participantCount') or 0} "
        "participants). The agents stop their workers and exit 0 when they next read it; no new round forms. "
        "This cannot be undone.\n"
    )


def command_evict(api: KubernetesApi, namespace: str, name: str, node: str, out: TextIO) -> None:
    """Add ``node`` to ``status.evictedNodes`` with ``status.add_evictions``: the operator's compare-and-swap,
    again after a jittered backoff when another writer won, so concurrent evictions are never lost. A node
    the state does not name is refused, with the names it does, and nothing is written.

    Not guaranteed: the node is checked against the state read just before ``add_evictions``, which
    reads again for its compare-and-swap; a node that leaves the state in between is still added.
    """
    where = f"Rendezvous {namespace}/{name}"
    already = f"node {node} is already in status.evictedNodes of {where}; nothing changed\n"
    obj = get_rendezvous(api, namespace, name)
    if node in ((obj.get("status") or {}).get("evictedNodes") or []):
        out.write(already)
        return
    document = decode_state(obj, namespace, name)
    members = {} if document is None else {str(item): item for item in document.nodes()}
    names = sorted(members)
    if document is None or node not in members:
        more = f" and {len(names) - NODES_NAMED} more" if len(names) > NODES_NAMED else ""
        known = f"known nodes: {', '.join(names[:NODES_NAMED])}{more}" if names else "the state names no nodes"
        round_text = "" if document is None else f" (round {document.round})"
        raise PluginError(
            f"node {node!r} is not in the state of {where}{round_text}; nothing was changed; {known}. "
            "Pass one of them exactly (addr_pid_localid, as kubectl rdzv status shows)"
        )
    deadline = time.monotonic() + RETRY_TIMEOUT
    try:  # add_evictions retries lost compare-and-swaps and unanswered writes; call_with_retries its reads too
        _, written = call_with_retries(
            lambda: add_evictions(api, namespace, name, [node], deadline=deadline),
            deadline=deadline,
            what=f"evict {node} from {where}",
        )
    except ConflictError as exc:
        lost = f"{EVICT_ATTEMPTS} compare-and-swaps in a row lost to other writers; try again"
        raise PluginError(f"could not evict node {node} from {where}: {lost}") from exc
    except NotFoundError as exc:
        raise _not_found(api, namespace, name) from exc
    except (ApiError, ApiUnavailableError) as exc:
        raise _failure(exc, "patch", f"{RENDEZVOUS_PLURAL}/status", namespace) from exc
    if written is None:  # evicted by another writer since the read above (or by this one, its answer lost)
        out.write(already)
        return
    labels = {"participant": "participant", "waiting": "waiting node", "redundant": "redundant node"}
    role = labels.get(role_of(document, members[node]) or "", "a node (heartbeat only)")
    out.write(
        f"node {node} ({role} of round {document.round}) added to status.evictedNodes of {where}; "
        "the agents drop it when they next write the state\n"
    )


def _follow(cache: WatchCache, source: str, changes: queue.Queue[Change]) -> WatchCache:
    """``cache`` (of ``source``: "Rendezvous" or "Leases"), started, queueing a ``Change`` per change.

    Its listener runs right after each change, under the cache's lock: an object it had not seen is
    ``ADDED``, one now gone ``DELETED``. The first list is the present (no label); a later list (after
    410 Gone or a failed watch) is ``RELISTED``.
    """
    known: set[str] = set()

    def listener(obj: dict[str, Any] | None) -> None:
        objects, label = cache.objects(), None
        if obj is not None:
            metadata = obj["metadata"]
            name, kind = metadata["name"], (metadata.get("labels") or {}).get(LABEL_LEASE)
            event = "DELETED" if name not in objects else "MODIFIED" if name in known else "ADDED"
            if source == "Rendezvous":
                label = f"Rendezvous {event}"
            elif kind == "node":
                label = f"node Lease {(metadata.get('annotations') or {}).get(ANNOTATION_NODE) or name} {event}"
            elif kind == "writer":
                label = f"writer Lease {event} (holder {(obj.get('spec') or {}).get('holderIdentity') or '-'})"
            else:
                label = f"Lease {name} {event}"
        elif cache.epoch > 1:
            label = f"{source} RELISTED"
        known.clear()
        known.update(objects)
        changes.put((source, label, objects))

    cache.add_listener(listener)
    return cache.start()


def command_watch(
    api: KubernetesApi, namespace: str, name: str, output: str, events: int | None, timeout: float | None, out: TextIO
) -> None:
    """Print the current status line, then one line per change of the object or its Leases, each with the
    status right after that change, from two ``WatchCache`` informers (a list, then a watch); until
    ``events`` change lines, ``timeout`` seconds or Ctrl-C. Without permission to list the Leases it warns
    and watches the object alone (heartbeats then come from the document).

    Not guaranteed: after a re-list (410 Gone, a dropped or failed watch) it shows only the end result of
    the changes made in between, as one ``RELISTED`` line.
    """
    get_rendezvous(api, namespace, name)  # its errors name the fix (not found, forbidden)
    changes: queue.Queue[Change] = queue.Queue()
    leases_query = {"labelSelector": f"{RENDEZVOUS_LABEL}={name}"}
    caches = {
        "Rendezvous": object_watch(api, namespace, name),
        "Leases": WatchCache(api, resource_path(LEASE_PLURAL, namespace), leases_query, f"Leases in {namespace}"),
    }
    watched = {source: _follow(cache, source, changes) for source, cache in caches.items()}
    views: dict[str, dict[str, dict[str, Any]]] = {"Rendezvous": {}, "Leases": {}}

    def failure(verb: str, source: str) -> PluginError:  # a refused cache stops: it is no longer ``supported``
        unanswered = None if not watched[source].supported else ApiUnavailableError(f"no answer in {RETRY_TIMEOUT:g} s")
        return _failure(unanswered, verb, WATCHED[source], namespace)

    def emit(label: str) -> None:
        now, obj = datetime.now(timezone.utc), views["Rendezvous"].get(name)
        report = None if obj is None else build_report(namespace, name, obj, list(views["Leases"].values()), now)
        if output == "json":
            out.write(json.dumps({"time": format_time(now), "event": label, "status": report}) + "\n")
        else:
            out.write(
                f"{format_time(now)}  {label:<34}  {summary_line(report) if report else 'the Rendezvous is gone'}\n"
            )
        out.flush()

    try:
        for source in WATCHED:
            if not watched[source].wait_ready(RETRY_TIMEOUT):
                if source == "Rendezvous" or watched[source].supported:
                    raise failure("list", source)
                print(f"warning: {failure('list', source)}; watching the Rendezvous only", file=sys.stderr)
                del watched[source]
        while not changes.empty():  # the first lists, and any change since: the present
            source, _, views[source] = changes.get_nowait()
        emit("now")
        deadline = None if timeout is None else time.monotonic() + timeout
        printed = 0
        while events is None or printed < events:
            remaining = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if remaining <= 0:
                return
            for source, cache in watched.items():
                if not cache.supported:  # its watch was refused after the list
                    raise failure("watch", source)
            try:
                source, label, views[source] = changes.get(timeout=remaining)
            except queue.Empty:
                continue
            if label is not None:
                emit(label)
                printed += 1
    finally:
        for cache in watched.values():
            cache.stop()


def _positive_int(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {int(text)}")
    return int(text)


def _positive_float(text: str) -> float:
    if not float(text) > 0:
        raise argparse.ArgumentTypeError(f"must be positive seconds, got {text}")
    return float(text)


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
    description = "Look at and steer kube-rendezvous Rendezvous objects."
    parser = argparse.ArgumentParser(prog="kubectl rdzv", description=description, parents=[_common_options(None)])
    # Given after the command too (as kubectl allows); SUPPRESS keeps a value given before it.
    common = _common_options(argparse.SUPPRESS)
    common.add_argument("rendezvous_name", metavar="NAME")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status", parents=[common], help="round, members with ranks, heartbeat ages, what the round waits for"
    )
    commands.add_parser("close", parents=[common], help="set spec.closed: the agents end the job")
    evict = commands.add_parser("evict", parents=[common], help="add NODE to status.evictedNodes")
    evict.add_argument("node", metavar="NODE", help="addr_pid_localid, as status shows it")
    watch = commands.add_parser("watch", parents=[common], help="a line per change of the object or its Leases")
    for command in (status, watch):
        command.add_argument("-o", "--output", choices=["text", "json"], default="text")
    watch.add_argument("--max-events", type=_positive_int, help="stop after this many changes")
    watch.add_argument("--timeout", type=_positive_float, help="stop after this many seconds")
    return parser


def run(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``kubectl rdzv`` with ``argv``; return the exit code. Errors are one line on stderr."""
    stream = out or sys.stdout
    arguments = build_parser().parse_args(argv)
    try:
        api, default_namespace = connect(arguments.kubeconfig, arguments.context)
        namespace, name = arguments.namespace or default_namespace, arguments.rendezvous_name
        if arguments.command == "status":
            command_status(api, namespace, name, arguments.output, stream)
        elif arguments.command == "close":
            command_close(api, namespace, name, stream)
        elif arguments.command == "evict":
            command_evict(api, namespace, name, arguments.node, stream)
        else:
            command_watch(api, namespace, name, arguments.output, arguments.max_events, arguments.timeout, stream)
    except (PluginError, ApiError, ApiUnavailableError) as exc:  # the last two: failures no command explained
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def main() -> None:
    """Console-script entry point ``kubectl-rdzv`` (kubectl finds it on PATH as ``kubectl rdzv``)."""
    # The plugin explains failures itself, in one line; the library's log lines (its watches') are for agents.
    logging.getLogger("kube_rendezvous").addHandler(logging.NullHandler())
    sys.exit(run())


if __name__ == "__main__":
    main()
