"""Where each node runs: its topology domain (rank order) and whether its Kubernetes Node admits it (pure, no I/O).

Two rules use a node's Kubernetes Node, as the operator sees it through the node's pod (``spec.nodeName``):

- **Topology-aware ranks.** A round's members are ranked by their Nodes' label values along
  ``spec.topology.keys`` (most significant first; ``DEFAULT_TOPOLOGY_KEYS`` when unset), then by
  node, so the members that share a domain get contiguous ranks (``rank_order``). A Node without
  one of the labels is in one more domain of that key, ranked after the labelled ones.
- **Admission.** A node whose Kubernetes Node is NotReady, cordoned (``spec.unschedulable``), carries
  a ``NoExecute`` taint, or has a condition named in ``spec.admission.conditions`` set to True is
  not admitted to a new round while that holds (``hold_reason``): the folder holds it, and says why.

Not guaranteed: the operator's view of Nodes and pods lags the API server by its watches, so a round
may form with a member whose Node was cordoned a moment before, and ranks follow addresses for a
member whose pod or Node the operator does not know yet (``Placement`` None). Without the operator
(or without its permission to read Nodes) neither rule applies: ranks follow addresses, every node
is admitted, and the status says which order ranked the round (``RankOrder``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .document import NodeId

#: Node label keys of the well-known topology, most significant first: the zone, then GKE's block and
#: sub-block, EKS's network node layers, and GPU feature discovery's NVLink clique.
DEFAULT_TOPOLOGY_KEYS: tuple[str, ...] = (
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "cloud.google.com/gce-topology-block",
    "cloud.google.com/gce-topology-subblock",
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
    "nvidia.com/gpu.clique",
)
#: Most keys ``spec.topology.keys`` and conditions ``spec.admission.conditions`` may list (the CRD's maxItems).
MAX_TOPOLOGY_KEYS = 16
MAX_ADMISSION_CONDITIONS = 16
#: Domains listed in ``status.topology.domains`` (the CRD's maxItems; the rest are counted).
STATUS_DOMAINS_LIMIT = 64
#: Nodes listed in ``status.heldNodes`` (the CRD's maxItems; ``heldCount`` is exact).
STATUS_HELD_LIMIT = 16

#: A node's topology domain: its Node's value of each key, None where the label is missing.
Domain = tuple[str | None, ...]


class RankOrder(str, Enum):
    """Which order ranked a round (``status.topology.order``)."""

    #: By the members' topology domains, then by node.
    TOPOLOGY = "Topology"
    #: By node (address, pid, local id): the frameworks' own order.
    ADDRESS = "Address"


@dataclass(frozen=True)
class PlacementSpec:
    """What a Rendezvous's spec asks of placement, validated."""

    topology_keys: tuple[str, ...] = DEFAULT_TOPOLOGY_KEYS
    #: Node condition types that hold a node back while True (beyond NotReady, cordoned and NoExecute).
    admission_conditions: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> PlacementSpec:
        """``spec.topology.keys`` and ``spec.admission.conditions``, or the defaults.

        Raises:
            ValueError: a list is not a list of distinct non-empty strings within its size limit;
                the message names the field and the fix.
        """
        spec = spec or {}
        topology = spec.get("topology") or {}
        admission = spec.get("admission") or {}
        keys = topology.get("keys") if isinstance(topology, Mapping) else None
        conditions = admission.get("conditions") if isinstance(admission, Mapping) else None
        return cls(
            DEFAULT_TOPOLOGY_KEYS if keys is None else _names("spec.topology.keys", keys, MAX_TOPOLOGY_KEYS),
            () if conditions is None else _names("spec.admission.conditions", conditions, MAX_ADMISSION_CONDITIONS),
        )


def _names(field: str, value: object, limit: int) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{field} must be a list of non-empty strings; set it to e.g. [topology.kubernetes.io/zone]")
    if len(value) > limit or len(set(value)) != len(value):
        raise ValueError(f"{field} must list at most {limit} distinct names; remove the repeated or extra ones")
    return tuple(value)


@dataclass(frozen=True)
class NodeFacts:
    """What the rules read of one Kubernetes Node (``node_facts``)."""

    name: str
    labels: Mapping[str, str]
    #: ``spec.unschedulable`` (``kubectl cordon``).
    unschedulable: bool = False
    #: The Ready condition's status (``True``, ``False``, ``Unknown``), None when the Node has none.
    ready: str | None = None
    #: Keys of the Node's ``NoExecute`` taints.
    no_execute: tuple[str, ...] = ()
    #: Types of the Node's conditions whose status is True.
    true_conditions: frozenset[str] = frozenset()
    #: The values of the ``NoExecute`` taints by key ("" for none), to match a pod's tolerations.
    no_execute_values: Mapping[str, str] = field(default_factory=dict)


def tolerates(tolerations: Iterable[Mapping[str, Any]], key: str, value: str) -> bool:
    """Whether ``tolerations`` (a pod's ``spec.tolerations``) tolerate the ``NoExecute`` taint ``key=value`` for good.

    Kubernetes' matching: the effect is ``NoExecute`` or empty (every effect); ``operator: Exists`` matches any
    value (and with an empty key every taint), ``Equal`` (the default) matches ``value``. A toleration with
    ``tolerationSeconds`` tolerates only for a while (the taint manager then evicts the pod), so it does not count.
    """
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", "NoExecute") or toleration.get("tolerationSeconds") is not None:
            continue
        exists = toleration.get("operator") == "Exists"
        if exists and not toleration.get("key"):
            return True
        if toleration.get("key") == key and (exists or str(toleration.get("value") or "") == value):
            return True
    return False


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """The ``NodeFacts`` of a Node object."""
    metadata, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    conditions = [item for item in status.get("conditions") or [] if isinstance(item, Mapping)]
    ready = next((str(item.get("status")) for item in conditions if item.get("type") == "Ready"), None)
    return NodeFacts(
        name=str(metadata.get("name") or ""),
        labels={str(key): str(value) for key, value in (metadata.get("labels") or {}).items()},
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        no_execute=tuple(
            str(taint.get("key"))
            for taint in spec.get("taints") or []
            if isinstance(taint, Mapping) and taint.get("effect") == "NoExecute"
        ),
        true_conditions=frozenset(str(item.get("type")) for item in conditions if item.get("status") == "True"),
        no_execute_values={
            str(taint.get("key")): str(taint.get("value") or "")
            for taint in spec.get("taints") or []
            if isinstance(taint, Mapping) and taint.get("effect") == "NoExecute"
        },
    )


def domain_of(labels: Mapping[str, str], keys: Sequence[str]) -> Domain:
    """The node's value of each of ``keys`` (None where missing)."""
    return tuple(labels.get(key) or None for key in keys)


def domain_text(domain: Domain | None) -> str:
    """A domain as ``kubectl rdzv status`` and ``status.topology`` show it: its values joined by ``/``
    (``-`` for a missing label; ``?`` when the node's domain is unknown)."""
    if domain is None:
        return "?"
    return "/".join(value if value is not None else "-" for value in domain) or "-"


def hold_reason(
    facts: NodeFacts,
    conditions: Iterable[str] = (),
    tolerations: Iterable[Mapping[str, Any]] = (),
    *,
    cordon: bool = True,
) -> str | None:
    """Why a node on the Node of ``facts`` is not admitted to a new round; None when it is.

    The first that holds of: NotReady, cordoned, a ``NoExecute`` taint that the pod's ``tolerations`` do not
    tolerate for good (``tolerates``: a dedicated or GPU node pool's taint is no hold), a True condition of
    ``conditions``. ``cordon`` False: a cordon is no hold (``Placement.member_hold``).
    """
    tolerations = list(tolerations)
    if facts.ready is not None and facts.ready != "True":
        return f"NodeNotReady: Kubernetes node {facts.name} is NotReady (Ready={facts.ready})"
    if facts.unschedulable and cordon:
        return f"NodeCordoned: Kubernetes node {facts.name} is cordoned (spec.unschedulable)"
    for key in facts.no_execute:
        if not tolerates(tolerations, key, facts.no_execute_values.get(key, "")):
            return f"NodeTainted: Kubernetes node {facts.name} has the NoExecute taint {key}"
    for condition in conditions:
        if condition in facts.true_conditions and condition != "Ready":
            return f"NodeCondition: Kubernetes node {facts.name} has the condition {condition}=True"
    return None


@dataclass(frozen=True)
class Placement:
    """Where one pod's nodes run, as the operator knows it."""

    #: The Kubernetes Node's name.
    node_name: str
    #: The Node's topology domain along the Rendezvous's keys.
    domain: Domain
    #: Why the pod's nodes are not admitted (``hold_reason``); None: admitted.
    hold: str | None = None
    #: Why they are not admitted once they trained in this run (a cordon alone is no hold for them: cordoning
    #: stops new pods, not running ones, so a member whose round broke is not dropped from training for it).
    member_hold: str | None = None

    def hold_for(self, member: bool) -> str | None:
        """Why a node of this pod is held back: ``member_hold`` once it trained in this run, else ``hold``."""
        return self.member_hold if member else self.hold


def placement_of(facts: NodeFacts, spec: PlacementSpec, tolerations: Iterable[Mapping[str, Any]] = ()) -> Placement:
    """A pod's ``Placement`` on the Node of ``facts``; ``tolerations``: the pod's ``spec.tolerations``."""
    tolerations = list(tolerations)
    return Placement(
        facts.name,
        domain_of(facts.labels, spec.topology_keys),
        hold_reason(facts, spec.admission_conditions, tolerations),
        hold_reason(facts, spec.admission_conditions, tolerations, cordon=False),
    )


def _value_key(value: str | None) -> tuple[int, str]:
    return (1, "") if value is None else (0, value)


def rank_key(domain: Domain | None) -> tuple[tuple[int, str], ...]:
    """The sort key of a domain: values in key order, a missing label after every value, and an
    unknown domain (None) after every known one."""
    if domain is None:
        return ((2, ""),)
    return tuple(_value_key(value) for value in domain)


def rank_order(nodes: Iterable[NodeId], domain: Callable[[NodeId], Domain | None]) -> list[NodeId]:
    """``nodes`` in rank order: by ``domain`` (``rank_key``), then by node. One ``domain`` call per node."""
    keyed = [(rank_key(domain(node)), node) for node in nodes]
    keyed.sort()
    return [node for _, node in keyed]


def unlabelled_keys(keys: Sequence[str], domains: Iterable[Domain | None]) -> list[str]:
    """The ``keys`` that no known domain has a value for: no member's Node carries that label, so a misspelt
    ``spec.topology.keys`` entry (it ranks every member as one ``-`` domain) is said, not silently accepted."""
    known = [domain for domain in domains if domain is not None]
    if not known:
        return []
    return [key for index, key in enumerate(keys) if all(index >= len(d) or d[index] is None for d in known)]


def topology_reason(keys: Sequence[str], domains: Iterable[Domain | None]) -> str | None:
    """``status.topology.reason`` of a round ranked by topology: the labels no member's Node has, with the fix."""
    missing = unlabelled_keys(keys, domains)
    if not missing:
        return None
    labels = ",".join(missing)
    return (
        f"no member's Node has the label {labels}: check spec.topology.keys for a misspelt key "
        f"(kubectl get nodes -L {labels})"
    )


def domain_ranges(
    ranked: Sequence[NodeId], domain: Callable[[NodeId], Domain | None], limit: int = STATUS_DOMAINS_LIMIT
) -> list[dict[str, Any]]:
    """Runs of equal domain in ``ranked`` (the members by rank): ``{"domain", "firstRank", "lastRank"}``
    for at most ``limit`` runs (``status.topology.domains``)."""
    runs: list[dict[str, Any]] = []
    last: str | None = None
    for rank, node in enumerate(ranked):
        text = domain_text(domain(node))
        if runs and text == last:
            runs[-1]["lastRank"] = rank
            continue
        if len(runs) == limit:
            break
        runs.append({"domain": text, "firstRank": rank, "lastRank": rank})
        last = text
    return runs


__all__ = [
    "DEFAULT_TOPOLOGY_KEYS",
    "MAX_ADMISSION_CONDITIONS",
    "MAX_TOPOLOGY_KEYS",
    "STATUS_DOMAINS_LIMIT",
    "STATUS_HELD_LIMIT",
    "Domain",
    "NodeFacts",
    "Placement",
    "PlacementSpec",
    "RankOrder",
    "domain_of",
    "domain_ranges",
    "domain_text",
    "hold_reason",
    "node_facts",
    "placement_of",
    "rank_key",
    "rank_order",
    "tolerates",
    "topology_reason",
    "unlabelled_keys",
]
