"""kube-rendezvous: a Kubernetes-native rendezvous for elastic training (tensorplay and torchrun).

One framework-neutral engine (``_engine``): the ``k8s`` handler on its own protocol (``native``: ask on the
node's Lease, wait on the watch, confirm), the one writer of the join rules (``folder``) and the seed's
compare-and-swap backend (``backend``, for the stock ``DynamicRendezvousHandler``). Beneath it: the pure state
and rules (``_rules``: the state document, the join rules ``folder_rules``, the settings, the retry policies),
the Kubernetes I/O (``_kube``: the API client, watches, Leases, the election) and the store (``_store``). Thin
adapters per framework (``_adapters``): ``handler`` for tensorplay (``kube-rendezvous[tensorplay]``) and
``torchrun`` for torch (``kube-rendezvous[torch]``); the kubectl plugin (``_cli``); our launcher (``run``).

The layer folders are internal. The public names are the ones below, each imported on first use; the entry
points and ``python -m kube_rendezvous.run`` are the other public paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as the type checker sees them; at run time each is imported on first use
    from ._adapters.backend import create_backend as create_backend
    from ._adapters.handler import KubernetesRendezvousHandler as KubernetesRendezvousHandler
    from ._adapters.handler import create_k8s_handler as create_k8s_handler
    from ._adapters.handler import register as register
    from ._engine.backend import KubernetesRendezvousBackend as KubernetesRendezvousBackend
    from ._engine.folder import Folder as Folder
    from ._kube.election import ElectorRun as ElectorRun
    from ._kube.election import LeaderElectionConfig as LeaderElectionConfig
    from ._kube.election import LeaderElector as LeaderElector
    from ._kube.election import LeaseLock as LeaseLock
    from ._kube.election import ResourceLock as ResourceLock
    from ._kube.election import Takeover as Takeover
    from ._kube.kubeapi import GROUP as GROUP
    from ._kube.kubeapi import RENDEZVOUS_LABEL as RENDEZVOUS_LABEL
    from ._kube.kubeapi import RENDEZVOUS_PLURAL as RENDEZVOUS_PLURAL
    from ._kube.kubeapi import VERSION as VERSION
    from ._kube.kubeapi import ApiError as ApiError
    from ._kube.kubeapi import ApiUnavailableError as ApiUnavailableError
    from ._kube.kubeapi import ConflictError as ConflictError
    from ._kube.kubeapi import ForbiddenError as ForbiddenError
    from ._kube.kubeapi import InvalidError as InvalidError
    from ._kube.kubeapi import KubernetesApi as KubernetesApi
    from ._kube.kubeapi import KubernetesApiError as KubernetesApiError
    from ._kube.kubeapi import NotFoundError as NotFoundError
    from ._kube.kubeapi import load_api_client as load_api_client
    from ._kube.kubeapi import resource_path as resource_path
    from ._kube.leases import parse_node as parse_node
    from ._kube.leases import writer_lease_name as writer_lease_name
    from ._kube.status import add_evictions as add_evictions
    from ._kube.status import write_status as write_status
    from ._kube.watchcache import WatchCache as WatchCache
    from ._kube.watchcache import object_watch as object_watch
    from ._rules.counters import Counters as Counters
    from ._rules.document import NodeId as NodeId
    from ._rules.document import RendezvousDocument as RendezvousDocument
    from ._rules.document import StateDocumentError as StateDocumentError
    from ._rules.document import decode_document as decode_document
    from ._rules.election_rules import LEASE_PLURAL as LEASE_PLURAL
    from ._rules.election_rules import LeaderElectionRecord as LeaderElectionRecord
    from ._rules.election_rules import parse_micro_time as parse_micro_time
    from ._rules.folder_rules import PodAddresses as PodAddresses
    from ._rules.folder_rules import TrainingPods as TrainingPods
    from ._rules.intents import with_evicted as with_evicted
    from ._rules.leases_rules import ANNOTATION_NODE as ANNOTATION_NODE
    from ._rules.leases_rules import LABEL_LEASE as LABEL_LEASE
    from ._rules.placement import NodeFacts as NodeFacts
    from ._rules.placement import PlacementSpec as PlacementSpec
    from ._rules.placement import domain_text as domain_text
    from ._rules.placement import node_facts as node_facts
    from ._rules.placement import placement_of as placement_of
    from ._rules.settings import RendezvousTimings as RendezvousTimings
    from ._rules.summary import departure_line as departure_line
    from ._rules.summary import format_time as format_time
    from ._rules.summary import parse_time as parse_time
    from ._store.prefixstore import KubernetesPrefixStore as KubernetesPrefixStore
    from ._store.store import KubernetesStore as KubernetesStore

#: Each public name and the module that defines it: the one list of what the package offers.
_EXPORTS = {
    "create_k8s_handler": "._adapters.handler",
    "KubernetesRendezvousHandler": "._adapters.handler",
    "register": "._adapters.handler",
    "create_backend": "._adapters.backend",
    "KubernetesRendezvousBackend": "._engine.backend",
    "Folder": "._engine.folder",
    "ElectorRun": "._kube.election",
    "LeaderElectionConfig": "._kube.election",
    "LeaderElector": "._kube.election",
    "LeaseLock": "._kube.election",
    "ResourceLock": "._kube.election",
    "Takeover": "._kube.election",
    "ApiError": "._kube.kubeapi",
    "ApiUnavailableError": "._kube.kubeapi",
    "ConflictError": "._kube.kubeapi",
    "ForbiddenError": "._kube.kubeapi",
    "GROUP": "._kube.kubeapi",
    "InvalidError": "._kube.kubeapi",
    "KubernetesApi": "._kube.kubeapi",
    "KubernetesApiError": "._kube.kubeapi",
    "load_api_client": "._kube.kubeapi",
    "NotFoundError": "._kube.kubeapi",
    "RENDEZVOUS_LABEL": "._kube.kubeapi",
    "RENDEZVOUS_PLURAL": "._kube.kubeapi",
    "resource_path": "._kube.kubeapi",
    "VERSION": "._kube.kubeapi",
    "parse_node": "._kube.leases",
    "writer_lease_name": "._kube.leases",
    "add_evictions": "._kube.status",
    "write_status": "._kube.status",
    "object_watch": "._kube.watchcache",
    "WatchCache": "._kube.watchcache",
    "Counters": "._rules.counters",
    "decode_document": "._rules.document",
    "NodeId": "._rules.document",
    "RendezvousDocument": "._rules.document",
    "StateDocumentError": "._rules.document",
    "LEASE_PLURAL": "._rules.election_rules",
    "LeaderElectionRecord": "._rules.election_rules",
    "parse_micro_time": "._rules.election_rules",
    "PodAddresses": "._rules.folder_rules",
    "TrainingPods": "._rules.folder_rules",
    "with_evicted": "._rules.intents",
    "NodeFacts": "._rules.placement",
    "PlacementSpec": "._rules.placement",
    "domain_text": "._rules.placement",
    "node_facts": "._rules.placement",
    "placement_of": "._rules.placement",
    "ANNOTATION_NODE": "._rules.leases_rules",
    "LABEL_LEASE": "._rules.leases_rules",
    "RendezvousTimings": "._rules.settings",
    "departure_line": "._rules.summary",
    "format_time": "._rules.summary",
    "parse_time": "._rules.summary",
    "KubernetesPrefixStore": "._store.prefixstore",
    "KubernetesStore": "._store.store",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use: the pure modules stay light, tensorplay loads only for the
    handler, and a process that needs one layer does not load the others."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
