"""Settings of the ``k8s`` rendezvous backend, parsed from the launcher's parameters (pure, no I/O).

Every ``--rdzv-conf`` key, with unit and default, is in the README's configuration table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from .retries import OUTAGE_RETRY_SECONDS, STATE_CONFLICT_RETRY

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_UID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: Run ids that mean "not set": the launcher's default is ``none`` (pytorch/pytorch#82160).
UNSET_RUN_IDS = frozenset({"", "none"})


def validate_object_name(name: str, field: str) -> str:
    """Return ``name`` if it is a valid Kubernetes object name, else raise ``ValueError`` naming ``field``."""
    return _validated(
        name, field, "Kubernetes object name", _DNS_SUBDOMAIN, 253, "lowercase letters, digits, '-' and '.'"
    )


def validate_namespace(namespace: str, field: str) -> str:
    """Return ``namespace`` if valid, else raise ``ValueError`` naming ``field``."""
    return _validated(namespace, field, "namespace", _DNS_LABEL, 63, "lowercase letters, digits and '-'")


def _validated(value: str, field: str, kind: str, pattern: re.Pattern[str], longest: int, characters: str) -> str:
    """``value`` if ``pattern`` matches it and it has at most ``longest`` characters; else the error that says how."""
    if len(value) > longest or not pattern.match(value):
        raise ValueError(
            f"{field}: {value!r} is not a valid {kind}; use at most {longest} {characters}, "
            "starting and ending with a letter or digit"
        )
    return value


def parse_endpoint(endpoint: str) -> tuple[str | None, str]:
    """Split ``<namespace>/<name>`` or ``<name>`` into (namespace or None, name).

    Raises:
        ValueError: empty, too many parts, or not valid Kubernetes names.
    """
    text = (endpoint or "").strip()
    if not text:
        raise ValueError(
            "--rdzv-endpoint is empty: with --rdzv-backend=k8s it names the Rendezvous object, "
            "as <namespace>/<name> or <name>"
        )
    parts = text.split("/")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"--rdzv-endpoint {text!r}: expected <namespace>/<name> or <name>, e.g. 'team-a/llama-train'")
    namespace = validate_namespace(parts[0], "--rdzv-endpoint namespace") if len(parts) == 2 else None
    return namespace, validate_object_name(parts[-1], "--rdzv-endpoint name")


@dataclass(frozen=True)
class OwnerReference:
    """The owner a created Rendezvous is garbage-collected with."""

    api_version: str
    kind: str
    name: str
    uid: str

    @classmethod
    def parse(cls, text: str) -> OwnerReference:
        """Parse ``<apiVersion>/<kind>/<name>/<uid>`` (``batch/v1/Job/train/<uid>``, ``v1/Pod/p/<uid>``)."""
        parts = text.split("/")
        if len(parts) not in (4, 5) or not all(parts):
            raise ValueError(
                f"rdzv-conf owner={text!r}: expected <apiVersion>/<kind>/<name>/<uid>, e.g. 'batch/v1/Job/train/<uid>'"
            )
        *api_version, kind, name, uid = parts
        if not _UID.match(uid):
            raise ValueError(
                f"rdzv-conf owner={text!r}: the last part must be the owner's metadata.uid (a UUID), got {uid!r}; "
                "expected <apiVersion>/<kind>/<name>/<uid>"
            )
        return cls("/".join(api_version), kind, name, uid)

    def as_dict(self) -> dict[str, Any]:
        """Return the ``metadata.ownerReferences`` entry."""
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}

    def ignored_by(self, obj: dict[str, Any]) -> str | None:
        """Why this owner is ignored for the existing Rendezvous ``obj`` (it names other owners or none, so it
        was applied or created without it), or None when ``obj`` names it (matched by uid)."""
        references = (obj.get("metadata") or {}).get("ownerReferences") or []
        if any(isinstance(ref, dict) and ref.get("uid") == self.uid for ref in references):
            return None
        meta = obj.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        found = ", ".join(f"{ref.get('kind')} {ref.get('name')}" for ref in references if isinstance(ref, dict))
        return (
            f"rdzv-conf owner: Rendezvous {where} already exists with {'owners ' + found if found else 'no owner'}, "
            f"so its owner {self.kind} {self.name} (uid {self.uid}) is ignored: the Rendezvous is not deleted with "
            f"the {self.kind}, and the operator finds this job's pods only if they carry the label "
            f"kube-rendezvous.io/rendezvous={meta.get('name')}. Let the agents create it (do not apply it first), or "
            'give the pod template that label (docs/training-jobs.md, "Use it from a training job")'
        )


#: rdzv-conf ``owner=pod``: the Rendezvous's owner is the workload of the agent's own pod.
OWNER_FROM_POD = "pod"
#: The labels a JobSet puts on its pods (Kubeflow Trainer's TrainJob pods carry them too), and its API version.
JOBSET_NAME_LABEL, JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/jobset-uid"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"


def workload_owner(pod: dict[str, Any]) -> OwnerReference:
    """The workload that runs ``pod``: its JobSet (from the labels a JobSet puts on its pods), else
    the pod's controller (``ownerReferences`` with ``controller: true``: a Job, a PyTorchJob, ...).

    The JobSet comes first because its pods' controller is one of its Jobs, which a JobSet restart
    replaces: the Rendezvous must live as long as the JobSet, and the operator selects the pods of
    every Job of it by the JobSet's uid.

    Raises:
        ValueError: the pod has neither (a bare pod), naming it and the fix.
    """
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if labels.get(JOBSET_NAME_LABEL) and labels.get(JOBSET_UID_LABEL):
        return OwnerReference(JOBSET_API_VERSION, "JobSet", labels[JOBSET_NAME_LABEL], labels[JOBSET_UID_LABEL])
    for reference in metadata.get("ownerReferences") or []:
        if reference.get("controller") and all(reference.get(key) for key in ("apiVersion", "kind", "name", "uid")):
            return OwnerReference(reference["apiVersion"], reference["kind"], reference["name"], reference["uid"])
    raise ValueError(
        f"rdzv-conf owner=pod: pod {metadata.get('namespace')}/{metadata.get('name')} has no controller "
        "(no ownerReferences entry with controller: true, no JobSet labels); run it from a Job, JobSet, "
        "PyTorchJob or TrainJob, or give owner=<apiVersion>/<kind>/<name>/<uid>"
    )


@dataclass(frozen=True)
class KubernetesRendezvousConfig:
    """Where the Rendezvous object is and how to reach it; validated on construction.

    The fields are the ``--rdzv-conf`` keys of the same names (README, "Configuration"), plus
    ``name`` and ``namespace`` from ``--rdzv-endpoint``.
    """

    name: str
    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    create: bool = True
    owner: OwnerReference | None = None
    #: ``owner=pod``: the owner (and an unset run id) come from the agent's own pod (``workload_owner``).
    owner_from_pod: bool = False
    request_timeout: float = 30.0
    retry_timeout: float = OUTAGE_RETRY_SECONDS
    store_timeout: float = 300.0
    conflict_backoff: float = STATE_CONFLICT_RETRY.first_delay

    def __post_init__(self) -> None:
        validate_object_name(self.name, "Rendezvous name")
        if self.namespace is not None:
            validate_namespace(self.namespace, "namespace")
        if not isinstance(self.conflict_backoff, (int, float)) or not 0 <= self.conflict_backoff <= 1:
            raise ValueError(f"rdzv-conf conflict_backoff={self.conflict_backoff!r}: must be seconds between 0 and 1")
        for field in ("request_timeout", "retry_timeout", "store_timeout"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"rdzv-conf {field}={value!r}: must be a positive, finite number of seconds")

    @classmethod
    def from_parameters(cls, endpoint: str, conf: Any) -> KubernetesRendezvousConfig:
        """Build the settings from ``--rdzv-endpoint`` and ``RendezvousParameters`` (``conf.get...``)."""
        namespace, name = parse_endpoint(endpoint)
        conf_namespace = conf.get("namespace")
        if namespace is None and conf_namespace:
            namespace = validate_namespace(str(conf_namespace), "rdzv-conf namespace")
        owner = conf.get("owner")

        def seconds(key: str) -> float:
            value = conf.get(key)
            if value is None:
                return float(getattr(cls, key))  # the field's default
            try:
                return float(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"rdzv-conf {key}={value!r}: must be a number of seconds") from exc

        create = conf.get_as_bool("create", True)
        return cls(
            name=name,
            namespace=namespace,
            kubeconfig=conf.get("kubeconfig") or None,
            context=conf.get("context") or None,
            create=True if create is None else create,
            owner=OwnerReference.parse(str(owner)) if owner and owner != OWNER_FROM_POD else None,
            owner_from_pod=owner == OWNER_FROM_POD,
            request_timeout=seconds("request_timeout"),
            retry_timeout=seconds("retry_timeout"),
            store_timeout=seconds("store_timeout"),
            conflict_backoff=seconds("conflict_backoff"),
        )


@dataclass(frozen=True)
class RendezvousTimings:
    """The rendezvous handler's timings, resolved in one place: rdzv-conf, then the spec, then the default.

    Each field is in seconds except ``keep_alive_max_attempt`` (a count):

    - ``join``: how long a node waits for a round to form (rdzv-conf ``join_timeout``, or
      ``timeout`` as torchrun passes its ``--rdzv-timeout``; spec ``joinTimeoutSeconds``; default
      600; the launchers always pass their ``--rdzv-timeout``).
    - ``last_call``: how long a round waits for more nodes once it has ``min_nodes``
      (``last_call_timeout``, ``lastCallTimeoutSeconds``, 30).
    - ``close``: how long a node tries to mark the rendezvous closed (``close_timeout``,
      ``closeTimeoutSeconds``, 30).
    - ``heartbeat``: how long one heartbeat may take (``heartbeat_timeout``; no spec field; 5).
    - ``keep_alive_interval``: seconds between heartbeats (``keep_alive_interval``,
      ``keepAliveIntervalSeconds``, 5).
    - ``keep_alive_max_attempt``: missed heartbeats before a node is pruned
      (``keep_alive_max_attempt``, ``keepAliveMaxAttempts``, 3).
    """

    join: float = 600.0
    last_call: float = 30.0
    close: float = 30.0
    heartbeat: float = 5.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3

    #: field -> (rdzv-conf key, Rendezvous spec key or None)
    SOURCES: ClassVar[dict[str, tuple[str, str | None]]] = {
        "join": ("join_timeout", "joinTimeoutSeconds"),
        "last_call": ("last_call_timeout", "lastCallTimeoutSeconds"),
        "close": ("close_timeout", "closeTimeoutSeconds"),
        "heartbeat": ("heartbeat_timeout", None),
        "keep_alive_interval": ("keep_alive_interval", "keepAliveIntervalSeconds"),
        "keep_alive_max_attempt": ("keep_alive_max_attempt", "keepAliveMaxAttempts"),
    }

    def __post_init__(self) -> None:
        for name in self.SOURCES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"rendezvous timing {name}={value!r}: must be a positive, finite number")

    @property
    def heartbeat_expiry(self) -> float:
        """Seconds without a heartbeat after which a node counts as dead."""
        return self.keep_alive_interval * self.keep_alive_max_attempt

    @classmethod
    def resolve(cls, conf: Any, spec: dict[str, Any] | None) -> RendezvousTimings:
        """Resolve every timing from ``conf`` (``.get(key)``, may be None), then ``spec``, then the default.

        Raises:
            ValueError: a value that is not a positive whole number, naming its rdzv-conf key or spec field.
        """
        spec = spec or {}
        values: dict[str, Any] = {}
        for name, (conf_key, spec_key) in cls.SOURCES.items():
            raw = conf.get(conf_key) if conf is not None else None
            source = f"rdzv-conf {conf_key}"
            if raw is None and name == "join" and conf is not None and conf.get("timeout") is not None:
                raw, source = conf.get("timeout"), "rdzv-conf timeout"  # torchrun's name for --rdzv-timeout
            if raw is None and spec_key is not None:
                raw, source = spec.get(spec_key), f"spec.{spec_key}"
            if raw is None:
                continue
            try:
                number = int(str(raw))
            except ValueError as exc:
                raise ValueError(f"{source}={raw!r}: must be a positive whole number") from exc
            if number <= 0:
                raise ValueError(f"{source}={raw!r}: must be a positive whole number")
            values[name] = number
        return cls(**values)


#: Seconds without a heartbeat after which a node counts as dead, with the default timings (5 s x 3 attempts).
DEFAULT_HEARTBEAT_EXPIRY: float = RendezvousTimings().heartbeat_expiry
