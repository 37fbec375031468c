"""Reach the API server and the Rendezvous from the launcher's parameters: ``connect`` and its ``Connection``.

Every ``k8s`` creator starts here: the ``k8s`` handler (``native``) and the compare-and-swap backend's
``create_backend`` (``backend``). It imports neither.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._kube.kubeapi import (
    API_VERSION,
    RENDEZVOUS_PLURAL,
    ConflictError,
    InvalidError,
    KubernetesApi,
    KubernetesApiError,
    NotFoundError,
    call_with_retries,
    load_api_client,
)
from .._kube.kubeapi import resource_path as _resource_path
from .._rules.document import NodeId
from .._rules.intents import Found, judge_found
from .._rules.retries import WATCH_RETRY
from .._rules.settings import (
    SERVICE_ACCOUNT_NAMESPACE_FILE,
    UNSET_RUN_IDS,
    KubernetesRendezvousConfig,
    OwnerReference,
    RendezvousTimings,
    workload_owner,
)
from .._store.store import KubernetesStore
from .frameworks import Framework

logger = logging.getLogger(__name__)


def resolve_namespace(configured: str | None, context_namespace: str | None) -> str:
    """The endpoint's or rdzv-conf's namespace, else the pod's, else the kubeconfig context's, else default."""
    if configured:
        return configured
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE_FILE).read_text().strip()
    except OSError:
        return context_namespace or "default"


#: Annotation a run puts on the Rendezvous it creates in place of one that recorded another run's end.
REPLACES_ANNOTATION = "kube-rendezvous.io/replaces"
#: Seconds between two log lines of an agent that waits for a Rendezvous being deleted.
DELETION_LOG_SECONDS = 10.0

#: The longest one wait for a Rendezvous being deleted lasts before it is read again (a watch ends then).
DELETION_POLL_SECONDS = 5.0


def ensure_rendezvous(
    api: KubernetesApi,
    namespace: str,
    name: str,
    *,
    min_nodes: int,
    max_nodes: int,
    create: bool,
    owner: OwnerReference | None,
    retry_timeout: float,
    framework: Framework,
    run_id: str | None = None,
    wait_timeout: float = 600.0,
) -> dict[str, Any]:
    """Return the Rendezvous object run ``run_id`` uses, creating it from ``min_nodes``/``max_nodes`` when allowed.

    What the run finds under the name is judged by ``intents.judge_found``: an object being deleted is waited
    out (up to ``wait_timeout``, saying so at WARNING every ``DELETION_LOG_SECONDS``), then this run creates its
    own (or, with ``create`` false, waits for one to be applied); an object that records another run's end is
    replaced when ``create`` allows (a DELETE with the UID and resourceVersion as preconditions, then a create
    annotated ``REPLACES_ANNOTATION``), else refused. ``run_id`` None: unset (the object's UID will be the run id).

    Raises:
        ValueError: it does not exist and ``create`` is false, it records another run's end and ``create`` is
            false, the API server rejects its spec, or its namespace or the CRD is missing (naming which).
        RendezvousConnectionError: the API server is unreachable, or refuses (403, naming the verb).
        RendezvousTimeoutError: it was still being deleted after ``wait_timeout`` seconds (naming the finalizers).
    """
    path = _resource_path(RENDEZVOUS_PLURAL, namespace, name)
    where = f"{namespace}/{name}"
    verb = "get"

    def read() -> dict[str, Any] | None:
        nonlocal verb
        verb = "get"
        try:
            obj: dict[str, Any] = call_with_retries(
                lambda: api.request("GET", path), deadline=time.monotonic() + retry_timeout, what=f"GET {path}"
            )
        except NotFoundError:
            return None
        return obj

    def created(replaces: str | None) -> dict[str, Any] | None:
        """Create the object; None when another agent created one first (read it again)."""
        nonlocal verb
        verb = "create"
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if owner is not None:
            metadata["ownerReferences"] = [owner.as_dict()]
        if replaces is not None:
            metadata["annotations"] = {REPLACES_ANNOTATION: replaces}
        body = {
            "apiVersion": API_VERSION,
            "kind": "Rendezvous",
            "metadata": metadata,
            "spec": {"minNodes": min_nodes, "maxNodes": max_nodes},
        }
        try:
            obj: dict[str, Any] = call_with_retries(
                lambda: api.request("POST", _resource_path(RENDEZVOUS_PLURAL, namespace), body=body),
                deadline=time.monotonic() + retry_timeout,
                what=f"create {path}",
            )
        except ConflictError:  # another agent created it first
            return None
        except InvalidError as exc:
            raise ValueError(f"The API server rejected Rendezvous {where}: {exc.message}") from exc
        except NotFoundError as exc:
            if "namespaces" in exc.message and namespace in exc.message:
                raise ValueError(
                    f"Namespace {namespace!r} does not exist: create it (kubectl create namespace {namespace}) "
                    "or name another in --rdzv-endpoint <namespace>/<name>"
                ) from exc
            raise ValueError(
                "The Rendezvous CRD (rendezvouses.kube-rendezvous.io) is not installed in this cluster: "
                "kubectl apply -f crds/ or helm install kube-rendezvous"
            ) from exc
        logger.info("created Rendezvous %s (minNodes=%d, maxNodes=%d)", where, min_nodes, max_nodes)
        return obj

    def delete(obj: dict[str, Any]) -> None:
        """Delete exactly ``obj`` (this UID at this version): a 409 or 404 means it changed or went already."""
        nonlocal verb
        verb = "delete"
        metadata = obj["metadata"]
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": metadata["uid"], "resourceVersion": metadata["resourceVersion"]},
        }
        try:
            api.request("DELETE", path, body=options)
        except (ConflictError, NotFoundError):
            pass

    replaces: str | None = None
    waits_until: float | None = None
    logged_at = 0.0
    try:
        while True:
            obj = read()
            if obj is None:
                if not create:
                    if waits_until is None:
                        raise ValueError(
                            f"Rendezvous {where} does not exist. Create it (kubectl apply -f rendezvous.yaml) "
                            "or let the agents create it (--rdzv-conf create=true)."
                        )
                else:
                    made = created(replaces)
                    if made is not None:
                        return made
                    continue
            else:
                verdict = judge_found(obj, run_id)
                if verdict.action is Found.USE:
                    ignored = None if owner is None else owner.ignored_by(obj)
                    if ignored is not None:
                        logger.warning("%s", ignored)
                    return obj
                if verdict.action is Found.REPLACE:
                    if not create:
                        raise ValueError(
                            f"Rendezvous {where} belongs to an ended run: {verdict.why}. This run ({run_id}) "
                            f"does not take that end as its own. Delete it (kubectl delete rdzv -n {namespace} "
                            f"{name}) and apply it again, or name another Rendezvous in --rdzv-endpoint."
                        )
                    logger.warning(
                        "Rendezvous %s %s; this run (%s) replaces it with a new one", where, verdict.why, run_id
                    )
                    replaces = f"{obj['metadata']['uid']} (run {verdict.ended_run})"
                    delete(obj)
                    continue
            # Being deleted (or, with create false, gone and not applied again yet): wait, bounded.
            now = time.monotonic()
            if waits_until is None:
                waits_until = now + wait_timeout
            if now >= waits_until:
                if obj is None:
                    raise framework.timeout_error(
                        f"Rendezvous {where} was deleted and not applied again within {wait_timeout:g} s "
                        "(--rdzv-conf create=false): apply it (kubectl apply -f rendezvous.yaml)"
                    )
                raise framework.timeout_error(
                    f"Rendezvous {where} was still being deleted after {wait_timeout:g} s: "
                    f"{judge_found(obj, run_id).why}. If the kube-rendezvous operator is not running, remove its "
                    f"finalizer: kubectl patch rdzv -n {namespace} {name} --type=merge "
                    """-p '{"metadata":{"finalizers":null}}'"""
                )
            if now - logged_at >= DELETION_LOG_SECONDS:
                logged_at = now
                logger.warning(
                    "Rendezvous %s %s; this run waits for it to go (%.0f s more at most), then %s",
                    where,
                    judge_found(obj, run_id).why if obj is not None else "was deleted",
                    waits_until - now,
                    "creates its own" if create else "for it to be applied again",
                )
            wait_for_change(api, path, obj, min(DELETION_POLL_SECONDS, max(0.0, waits_until - now)))
    except KubernetesApiError as exc:
        unreachable = "The connection to the Kubernetes API server has failed. See the inner exception for details."
        raise framework.api_failure(exc, verb, RENDEZVOUS_PLURAL, namespace, unreachable) from exc


def wait_for_change(api: KubernetesApi, path: str, obj: dict[str, Any] | None, seconds: float) -> None:
    """Wait up to ``seconds`` for the object at ``path`` to change or go, with one watch (no polling).

    ``obj`` None: wait for one to appear. The watch's server timeout is ``seconds``, so it ends by itself.
    """
    collection, _, name = path.rpartition("/")
    query: dict[str, Any] = {"fieldSelector": f"metadata.name={name}"}
    if obj is not None:
        query["resourceVersion"] = obj["metadata"]["resourceVersion"]
    try:
        for event in api.watch(collection, query=query, timeout_seconds=max(1, int(seconds))):
            if event.get("type") != "BOOKMARK":
                return
    except KubernetesApiError as exc:
        logger.debug("watching %s for its deletion ended: %s", path, exc)
        time.sleep(min(WATCH_RETRY.delay(1), seconds))  # the caller reads again next


def pod_workload(api: KubernetesApi, namespace: str, framework: Framework) -> OwnerReference:
    """The workload of this agent's pod (``workload_owner``), read from the API server.

    The pod is ``POD_NAME`` in ``POD_NAMESPACE`` (set both from the downward API), else the host
    name in the Rendezvous's namespace (a pod's host name is its name unless ``spec.hostname``).

    Raises:
        ValueError: no such pod, or it has no controller (naming the fix).
        RendezvousConnectionError: the API server refused (403 names the missing ``get pods``).
    """
    name = os.environ.get("POD_NAME") or socket.gethostname()
    pod_namespace = os.environ.get("POD_NAMESPACE") or namespace
    try:
        pod = api.request("GET", f"/api/v1/namespaces/{pod_namespace}/pods/{name}")
    except NotFoundError as exc:
        raise ValueError(
            f"rdzv-conf owner=pod: there is no pod {pod_namespace}/{name}; set POD_NAME and POD_NAMESPACE "
            "from the downward API (fieldRef metadata.name and metadata.namespace)"
        ) from exc
    except KubernetesApiError as exc:
        unreachable = f"rdzv-conf owner=pod: could not read pod {pod_namespace}/{name}: {exc}"
        raise framework.api_failure(exc, "get", "pods", pod_namespace, unreachable) from exc
    owner = workload_owner(pod)
    logger.info("owner=pod: pod %s/%s runs in %s %s (uid %s)", pod_namespace, name, owner.kind, owner.name, owner.uid)
    return owner


@dataclass(frozen=True)
class Connection:
    """What every ``k8s`` creator starts from: the API client, the Rendezvous, the run id and the timings."""

    api: KubernetesApi
    namespace: str
    rendezvous_name: str
    #: The Rendezvous object as read (or created).
    rendezvous: dict[str, Any]
    run_id: str
    timings: RendezvousTimings
    config: KubernetesRendezvousConfig

    def store(self, framework: Framework) -> KubernetesStore:
        """The rendezvous store of this Rendezvous, its key watch started (waiting costs no request)."""
        store = KubernetesStore(
            self.api,
            self.namespace,
            self.rendezvous_name,
            self.rendezvous["metadata"]["uid"],
            timeout=self.config.store_timeout,
            retry_timeout=self.config.retry_timeout,
        )
        store.timeout_error = framework.store_timeout_error
        store.start_watch()
        return store


def connect(params: Any, framework: Framework) -> Connection:
    """Resolve the launcher's parameters, reach the API server and read (or create) the Rendezvous.

    An empty or ``none`` run id (the launcher's default) is replaced by the Rendezvous object's UID
    (or with ``owner=pod``, the workload's), so a new Rendezvous never inherits an old job's state.

    Raises:
        ValueError: bad parameters (endpoint, rdzv-conf values, missing object with create=false).
        RendezvousConnectionError: the API server is unreachable or refuses (403, naming the permission).
    """
    try:
        config = KubernetesRendezvousConfig.from_parameters(params.endpoint, params)
        api_client, context_namespace = load_api_client(config.kubeconfig, config.context)
        namespace = resolve_namespace(config.namespace, context_namespace)
        api = KubernetesApi(api_client, config.request_timeout)
        owner = pod_workload(api, namespace, framework) if config.owner_from_pod else config.owner
        run_id = params.run_id
        if run_id in UNSET_RUN_IDS and config.owner_from_pod and owner is not None:
            run_id = owner.uid  # the workload's: a new Job or JobSet is a new run
            logger.info("run id %r is unset; using %s %s's UID %s", params.run_id, owner.kind, owner.name, owner.uid)
        obj = ensure_rendezvous(
            api,
            namespace,
            config.name,
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            create=config.create,
            owner=owner,
            retry_timeout=config.retry_timeout,
            framework=framework,
            run_id=None if run_id in UNSET_RUN_IDS else run_id,
            wait_timeout=RendezvousTimings.resolve(params, None).join,
        )
        if run_id in UNSET_RUN_IDS:
            run_id = obj["metadata"]["uid"]
            logger.info(
                "run id %r is unset; using Rendezvous %s/%s's UID %s", params.run_id, namespace, config.name, run_id
            )
        if len(run_id) > 253:
            raise ValueError(f"--rdzv-id {run_id[:40]!r}...: at most 253 characters")
        spec = obj.get("spec") or {}
        if (spec.get("minNodes"), spec.get("maxNodes")) != (params.min_nodes, params.max_nodes):
            logger.warning(
                "Rendezvous %s/%s says minNodes=%s maxNodes=%s but --nnodes=%s:%s; the agents follow --nnodes",
                namespace,
                config.name,
                spec.get("minNodes"),
                spec.get("maxNodes"),
                params.min_nodes,
                params.max_nodes,
            )
        timings = RendezvousTimings.resolve(params, spec)
    except Exception as exc:
        framework.record_failure(f"{type(exc).__name__}: {exc}", params.run_id)
        raise
    return Connection(api, namespace, config.name, obj, run_id, timings, config)


def incarnation_node(local_addr: str | None) -> NodeId:
    """This agent's node: its address and pid, and a random local id unique to this incarnation.

    In a pod the agent is PID 1 and an Indexed Job's replacement pod keeps the hostname (and may
    get the IP) of the pod it replaces, so ``addr_pid_0`` would name both. The random local id
    tells them apart: an eviction of the old node never matches the new one.
    """
    return NodeId(local_addr or socket.getfqdn(), os.getpid(), secrets.randbelow(2**31))
