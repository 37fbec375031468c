"""``kubectl rdzv`` (console script ``kubectl-rdzv``; docs/kubectl-rdzv.md): look at and steer a Rendezvous.

It never writes the state document. Not guaranteed: ``evict`` and ``close`` record intents, which take effect
when a live agent next writes the state; the report's limits (clock skew in heartbeat ages) are in its module.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import queue
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, NoReturn, TextIO
from urllib.parse import quote

from .._kube import kubeapi
from .._kube.kubeapi import (
    RENDEZVOUS_PLURAL,
    ApiUnavailableError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    resource_path,
)
from .._kube.leases import parse_node
from .._kube.status import add_evictions
from .._kube.watchcache import WatchCache, object_watch
from .._rules.document import node_names
from .._rules.election_rules import LEASE_PLURAL
from .._rules.folder_rules import role_of
from .._rules.kubectl_rdzv_rules import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    PluginError,
    as_list,
    build_report,
    change_label,
    close_dry_run,
    close_prompt,
    close_refusal,
    confirmed,
    decode_state,
    list_rows,
    no_resources,
    parse_output,
    render_data,
    render_status,
    summary_line,
)
from .._rules.retries import EVICTION_CONFLICT_RETRY
from .._rules.settings import SERVICE_ACCOUNT_NAMESPACE_FILE
from .._rules.summary import format_time

#: Seconds one API request may take, and how long requests are retried while the server is unreachable.
REQUEST_TIMEOUT = RETRY_TIMEOUT = 15.0
#: Nodes an error message names before "and N more".
NODES_NAMED = 20
#: The distribution whose version ``--version`` prints.
DISTRIBUTION = "kube-rendezvous"
#: Pods (the core API group): read to name each node's pod and Kubernetes Node.
POD_PLURAL = "pods"
#: A bare ``--dry-run`` means this, as in kubectl (so ``close --dry-run NAME`` does not take NAME as its value).
DRY_RUN_CLIENT = "--dry-run=client"


def connect(kubeconfig: str | None, context: str | None) -> tuple[KubernetesApi, str]:
    """An API client and the default namespace, as kubectl picks them; in a pod without a kubeconfig, the pod's."""
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    given = kubeconfig is not None or context is not None or bool(os.environ.get("KUBECONFIG"))
    in_pod = not given and not Path(where).expanduser().exists()
    try:
        api_client, namespace = kubeapi.load_api_client(
            None if in_pod else where, context, fix="pass --kubeconfig PATH and --context NAME"
        )
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


def _failure(exc: KubernetesApiError | None, verb: str, resource: str, namespace: str) -> PluginError:
    """One line for a failed request that names the fix; ``exc`` None: the request was refused (403)."""
    if exc is not None and not isinstance(exc, kubeapi.ApiError):  # no answer
        return PluginError(
            f"could not reach the API server to {verb} {resource} in namespace {namespace!r} ({exc}); "
            "check --kubeconfig/--context and that the cluster is up"
        )
    if exc is not None and not (isinstance(exc, kubeapi.ForbiddenError) and exc.status == 403):
        return PluginError(kubeapi.describe_api_error(exc, verb, resource, namespace))
    plural, _, subresource = resource.partition("/")
    group = {LEASE_PLURAL: "coordination.k8s.io", POD_PLURAL: ""}.get(plural, kubeapi.GROUP)
    check = f"kubectl auth can-i {verb} {plural}{'.' if group else ''}{group}"
    check += f" --subresource={subresource}" if subresource else ""
    api_group = f"API group {group!r}" if group else "the core API group"
    return PluginError(
        f"forbidden: you may not {verb} {resource} ({api_group}) in namespace {namespace!r}; "
        f"ask for a Role that grants {verb!r} on {resource!r} there, or use another --context "
        f"(check with: {check} -n {namespace})"
    )


def _request(api: KubernetesApi, method: str, path: str, **options: Any) -> Any:
    call = partial(api.request, method, path, **options)
    return kubeapi.call_with_retries(call, deadline=time.monotonic() + RETRY_TIMEOUT, what=f"{method} {path}")


@contextmanager
def _explained(api: KubernetesApi, namespace: str, name: str, verb: str, resource: str) -> Iterator[None]:
    """Turn a failed request about the Rendezvous into a ``PluginError`` naming the fix (404: no CRD, or no object)."""
    try:
        yield
    except NotFoundError as exc:
        try:
            served = _request(api, "GET", f"/apis/{kubeapi.API_VERSION}") or {}
            installed = any(item.get("name") == RENDEZVOUS_PLURAL for item in served.get("resources") or [])
        except KubernetesApiError as error:  # other than 404, unknown: say that the object was not found
            installed = not isinstance(error, NotFoundError)
        raise PluginError(
            f"Rendezvous {namespace}/{name} not found; list them with: kubectl get rdzv -n {namespace} "
            "(or pass the right -n/--namespace)"
            if installed
            else f"the Rendezvous CRD (rendezvouses.{kubeapi.GROUP}) is not installed in this cluster, so "
            f"{namespace}/{name} cannot exist; install it: kubectl apply -f crds/ "
            "(or helm install kube-rendezvous charts/kube-rendezvous)"
        ) from exc
    except KubernetesApiError as exc:
        raise _failure(exc, verb, resource, namespace) from exc


def get_rendezvous(api: KubernetesApi, namespace: str, name: str) -> dict[str, Any]:
    """The Rendezvous object; a ``PluginError`` says why it cannot be read."""
    with _explained(api, namespace, name, "get", RENDEZVOUS_PLURAL):
        obj: dict[str, Any] = _request(api, "GET", resource_path(RENDEZVOUS_PLURAL, namespace, name))
    return obj


def command_status(api: KubernetesApi, namespace: str, name: str, output: tuple[str, str | None], out: TextIO) -> None:
    """Print the status of a Rendezvous (``output``: a format and jsonpath template, as ``parse_output`` gives);
    Leases or pods that cannot be listed are reported, not fatal. Not guaranteed: the object, its Leases and the
    pods are read in three requests, a moment apart."""
    obj, leases_error, pods_error = get_rendezvous(api, namespace, name), None, None
    try:
        query = {"labelSelector": f"{kubeapi.RENDEZVOUS_LABEL}={name}"}
        leases = _request(api, "GET", resource_path(LEASE_PLURAL, namespace), query=query).get("items") or []
    except KubernetesApiError as exc:
        leases, leases_error = [], str(_failure(exc, "list", LEASE_PLURAL, namespace))
    pods: list[dict[str, Any]] | None
    try:
        pods_path, cached = f"/api/v1/namespaces/{quote(namespace, safe='')}/{POD_PLURAL}", {"resourceVersion": "0"}
        pods = _request(api, "GET", pods_path, query=cached).get("items") or []
    except KubernetesApiError as exc:
        pods, pods_error = None, str(_failure(exc, "list", POD_PLURAL, namespace))
    now = datetime.now(timezone.utc)
    report = build_report(namespace, name, obj, leases, now, leases_error, pods, pods_error)
    if report["stateError"]:
        raise PluginError(report["stateError"])
    form, template = output
    text = render_status(report, form == "wide") if form in ("text", "wide") else render_data(report, form, template)
    out.write(text + "\n")


def command_list(
    api: KubernetesApi, namespace: str | None, output: tuple[str, str | None], out: TextIO, err: TextIO
) -> None:
    """Print the Rendezvous of ``namespace`` (None: of all namespaces) as ``kubectl get rdzv`` does, or as a
    ``List`` (``-o json|yaml|jsonpath``); none: "No resources found" on ``err``, as kubectl."""
    where = "all namespaces" if namespace is None else namespace
    path = f"/apis/{kubeapi.API_VERSION}/{RENDEZVOUS_PLURAL}" if namespace is None else None
    try:
        answer = _request(api, "GET", path or resource_path(RENDEZVOUS_PLURAL, str(namespace)))
    except NotFoundError as exc:
        raise PluginError(
            f"the Rendezvous CRD (rendezvouses.{kubeapi.GROUP}) is not installed in this cluster; install it: "
            "kubectl apply -f crds/ (or helm install kube-rendezvous charts/kube-rendezvous)"
        ) from exc
    except kubeapi.ForbiddenError as exc:
        if namespace is not None or exc.status != 403:
            raise _failure(exc, "list", RENDEZVOUS_PLURAL, where) from exc
        raise PluginError(
            f"forbidden: you may not list rendezvouses (API group {kubeapi.GROUP!r}) in all namespaces; ask for a "
            "ClusterRole that grants 'list' on 'rendezvouses', or list one namespace with -n NAMESPACE "
            f"(check with: kubectl auth can-i list rendezvouses.{kubeapi.GROUP} -A)"
        ) from exc
    except KubernetesApiError as exc:
        raise _failure(exc, "list", RENDEZVOUS_PLURAL, where) from exc
    items = [{"apiVersion": kubeapi.API_VERSION, "kind": "Rendezvous", **item} for item in answer.get("items") or []]
    form, template = output
    if form not in ("text", "wide"):
        out.write(render_data(as_list(items), form, template) + "\n")
    elif not items:
        print(no_resources(namespace), file=err)
    else:
        rows = list_rows(items, datetime.now(timezone.utc), namespace is None, form == "wide")
        out.write("\n".join(rows) + "\n")


def command_close(
    api: KubernetesApi,
    namespace: str,
    name: str,
    out: TextIO,
    *,
    dry_run: str | None = None,
    yes: bool = False,
    stdin: TextIO | None = None,
    err: TextIO | None = None,
) -> None:
    """Set ``spec.closed: true`` (a merge patch: idempotent, retried while the server is unreachable), after asking
    on a terminal unless ``yes``; without a terminal and without ``yes``, refuse. ``dry_run`` ``client``: say what
    it would do; ``server``: the same patch with ``dryRun=All`` (the server validates it and stores nothing).
    Not guaranteed: the agents end the job when they next read it, not when this returns."""
    obj = get_rendezvous(api, namespace, name)
    status, where = obj.get("status") or {}, f"Rendezvous {namespace}/{name}"
    if (obj.get("spec") or {}).get("closed"):
        out.write(f"{where} is already closed (spec.closed is true); nothing changed\n")
        return
    path, body = resource_path(RENDEZVOUS_PLURAL, namespace, name), {"spec": {"closed": True}}
    if dry_run is None and not yes:
        reader = stdin or sys.stdin
        if not reader.isatty():
            raise PluginError(close_refusal(namespace, name))
        prompts = err or sys.stderr
        prompts.write(close_prompt(namespace, name, obj))
        prompts.flush()
        if not confirmed(reader.readline()):
            raise PluginError(f"{where} was not closed: the answer was not yes; nothing changed")
    query = {"dryRun": "All"} if dry_run == "server" else None
    if dry_run != "client":
        with _explained(api, namespace, name, "patch", RENDEZVOUS_PLURAL):
            written = _request(api, "PATCH", path, body=body, content_type=kubeapi.MERGE_PATCH, query=query)
        if not (written.get("spec") or {}).get("closed"):
            raise PluginError(f"the API server accepted the patch but spec.closed of {where} is not true")
    if dry_run is not None:
        out.write(close_dry_run(namespace, name, obj, dry_run) + "\n")
        return
    round_text = f"round {status['round']}" if status.get("round") is not None else "no round yet"
    out.write(
        f"{where} closed: spec.closed set to true ({round_text}, {status.get('participantCount') or 0} "
        "participants). The agents stop their workers and exit 0 when they next read it; no new round forms. "
        "This cannot be undone.\n"
    )


def command_evict(api: KubernetesApi, namespace: str, name: str, node: str, out: TextIO) -> None:
    """Add ``node`` to ``status.evictedNodes`` (``status.add_evictions``: a compare-and-swap that loses none) if the
    state names it. Not guaranteed: the node is checked against the state read just before ``add_evictions`` reads
    it again for its compare-and-swap; a node that leaves the state in between is still added."""
    where, obj = f"Rendezvous {namespace}/{name}", get_rendezvous(api, namespace, name)
    document = written = None  # both stay None: evicted already, before the read or since (by another writer, or us)
    if node not in ((obj.get("status") or {}).get("evictedNodes") or []):
        document = decode_state(obj, namespace, name)
        names = [] if document is None else node_names(document.nodes())
        if document is None or node not in names:
            more = f" and {len(names) - NODES_NAMED} more" if len(names) > NODES_NAMED else ""
            known = f"known nodes: {', '.join(names[:NODES_NAMED])}{more}" if names else "the state names no nodes"
            round_text = "" if document is None else f" (round {document.round})"
            raise PluginError(
                f"node {node!r} is not in the state of {where}{round_text}; nothing was changed; {known}. "
                "Pass one of them exactly (addr_pid_localid, as kubectl rdzv status shows)"
            )
        with _explained(api, namespace, name, "patch", f"{RENDEZVOUS_PLURAL}/status"):
            try:
                _, written = add_evictions(api, namespace, name, [node], deadline=time.monotonic() + RETRY_TIMEOUT)
            except kubeapi.ConflictError as exc:
                lost = f"{EVICTION_CONFLICT_RETRY.attempts} compare-and-swaps in a row lost to other writers; try again"
                raise PluginError(f"could not evict node {node} from {where}: {lost}") from exc
    if document is None or written is None:
        out.write(f"node {node} is already in status.evictedNodes of {where}; nothing changed\n")
        return
    labels = {"participant": "participant", "waiting": "waiting node", "redundant": "redundant node"}
    role = labels.get(role_of(document, parse_node(node)) or "", "a node (heartbeat only)")
    out.write(
        f"node {node} ({role} of round {document.round}) added to status.evictedNodes of {where}; "
        "the agents drop it when they next write the state\n"
    )


def command_watch(
    api: KubernetesApi, namespace: str, name: str, output: str, events: int | None, timeout: float | None, out: TextIO
) -> None:
    """Print the status now, then a line per change of the object or its Leases (two ``WatchCache``s) with the status
    right after it, until ``events`` lines, ``timeout`` seconds or Ctrl-C; without permission to list the Leases, warn
    and watch the object alone. Not guaranteed: after a re-list (410 Gone, a dropped or failed watch) only the end
    result of the changes made in between shows, as one ``RELISTED`` line."""
    get_rendezvous(api, namespace, name)  # its errors name the fix (not found, forbidden)
    changes: queue.Queue[tuple[str, dict[str, Any] | None, dict[str, dict[str, Any]], int]] = queue.Queue()
    leases_query = {"labelSelector": f"{kubeapi.RENDEZVOUS_LABEL}={name}"}
    watched = {
        "Rendezvous": object_watch(api, namespace, name),
        "Leases": WatchCache(api, resource_path(LEASE_PLURAL, namespace), leases_query, f"Leases in {namespace}"),
    }
    for source, cache in watched.items():
        cache.add_listener(lambda obj, s=source, c=cache: changes.put((s, obj, c.objects(), c.epoch)))  # type: ignore[misc]
        cache.start()
    views: dict[str, dict[str, dict[str, Any]]] = {"Rendezvous": {}, "Leases": {}}
    resources = {"Rendezvous": RENDEZVOUS_PLURAL, "Leases": LEASE_PLURAL}
    try:
        for source, cache in list(watched.items()):
            if not cache.wait_ready(RETRY_TIMEOUT):  # a refused cache stops: it is no longer ``supported``
                unanswered = ApiUnavailableError(f"no answer in {RETRY_TIMEOUT:g} s") if cache.supported else None
                failure = _failure(unanswered, "list", resources[source], namespace)
                if source == "Rendezvous" or unanswered is not None:
                    raise failure
                print(f"warning: {failure}; watching the Rendezvous only", file=sys.stderr)
                del watched[source]
        while not changes.empty():  # the first lists, and any change since: the present
            source, _, views[source], _ = changes.get_nowait()
        label: str | None = "now"  # the first line, the present, is not counted in ``events``
        deadline, printed = None if timeout is None else time.monotonic() + timeout, -1
        while True:
            if label is not None:
                now, obj = datetime.now(timezone.utc), views["Rendezvous"].get(name)
                report = None if obj is None else build_report(namespace, name, obj, [*views["Leases"].values()], now)
                text = summary_line(report) if report else "the Rendezvous is gone"
                line = json.dumps({"time": format_time(now), "event": label, "status": report})
                print(line if output == "json" else f"{format_time(now)}  {label:<34}  {text}", file=out, flush=True)
                printed += 1
            remaining = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if printed == events or remaining <= 0:
                return
            for source, cache in watched.items():
                if not cache.supported:  # its watch was refused after the list
                    raise _failure(None, "watch", resources[source], namespace)
            try:
                source, changed, objects, epoch = changes.get(timeout=remaining)
                label, views[source] = change_label(source, changed, views[source], objects, epoch), objects
            except queue.Empty:
                label = None
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


def _output(text: str) -> tuple[str, str | None]:
    try:
        return parse_output(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def package_version() -> str:
    """The installed version of the package (``--version``)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (the kube-rendezvous package is not installed)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors exit ``EXIT_ERROR`` (argparse's default is 2) with one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``kubectl rdzv`` argument parser; its usage errors exit ``EXIT_ERROR``."""
    description = "Look at and steer kube-rendezvous Rendezvous objects."
    parser: argparse.ArgumentParser = _Parser(prog="kubectl rdzv", description=description)
    parser.add_argument("--version", action="version", version=f"kubectl-rdzv {package_version()}")
    # Given before the command or after it (as kubectl allows); SUPPRESS keeps a value given before it.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for group in (parser, common):
        group.add_argument("-n", "--namespace", help="namespace of the Rendezvous (default: the context's)")
        group.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
        group.add_argument("--context", help="kubeconfig context (default: the current one)")
    named = argparse.ArgumentParser(add_help=False, parents=[common])
    named.add_argument("rendezvous_name", metavar="NAME")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = partial(commands.add_parser, parents=[named])
    listing = commands.add_parser("list", aliases=["ls"], parents=[common], help="the Rendezvous, as kubectl get")
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="of every namespace")
    status = add("status", help="round, members with ranks, pods, heartbeat ages, what the round waits for")
    close = add("close", help="set spec.closed: the agents end the job (asks first; cannot be undone)")
    close.add_argument(
        "--dry-run",
        choices=["client", "server"],
        metavar="[=server]",
        help="say what it would do and change nothing (=server: the API server checks the patch and stores nothing)",
    )
    close.add_argument("-y", "--yes", action="store_true", help="do not ask (needed without a terminal)")
    evict = add("evict", help="add NODE to status.evictedNodes")
    evict.add_argument("node", metavar="NODE", help="addr_pid_localid, as status shows it")
    watch = add("watch", help="a line per change of the object or its Leases")
    formats = "text|wide|json|yaml|jsonpath=TEMPLATE"
    for command in (status, listing):
        command.add_argument("-o", "--output", type=_output, default=("text", None), metavar=formats)
    watch.add_argument("-o", "--output", choices=["text", "json"], default="text")
    watch.add_argument("--max-events", type=_positive_int, help="stop after this many changes")
    watch.add_argument("--timeout", type=_positive_float, help="stop after this many seconds")
    return parser


def run(argv: Sequence[str] | None = None, out: TextIO | None = None, stdin: TextIO | None = None) -> int:
    """Run ``kubectl rdzv`` with ``argv``; return the exit code (``EXIT_OK``, ``EXIT_ERROR``, ``EXIT_INTERRUPTED``).
    Errors are one line on stderr; ``stdin``: where ``close`` reads its confirmation."""
    given = sys.argv[1:] if argv is None else list(argv)
    given = [DRY_RUN_CLIENT if item == "--dry-run" else item for item in given]  # kubectl's bare --dry-run
    stream, arguments = out or sys.stdout, build_parser().parse_args(given)
    try:
        api, default_namespace = connect(arguments.kubeconfig, arguments.context)
        namespace = arguments.namespace or default_namespace
        if arguments.command in ("list", "ls"):
            command_list(api, None if arguments.all_namespaces else namespace, arguments.output, stream, sys.stderr)
            return EXIT_OK
        name = arguments.rendezvous_name
        if arguments.command == "status":
            command_status(api, namespace, name, arguments.output, stream)
        elif arguments.command == "close":
            command_close(api, namespace, name, stream, dry_run=arguments.dry_run, yes=arguments.yes, stdin=stdin)
        elif arguments.command == "evict":
            command_evict(api, namespace, name, arguments.node, stream)
        else:
            command_watch(api, namespace, name, arguments.output, arguments.max_events, arguments.timeout, stream)
    except (PluginError, KubernetesApiError) as exc:  # the second: API failures no command explained
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


def main() -> None:
    """Console-script entry point ``kubectl-rdzv`` (``kubectl rdzv`` on PATH); the library's log lines are not shown:
    the plugin explains failures itself, in one line."""
    logging.getLogger("kube_rendezvous").addHandler(logging.NullHandler())
    sys.exit(run())


if __name__ == "__main__":
    main()
