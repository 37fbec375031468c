"""The node and writer Leases' wire format: their label and annotations (pure).

What ``leases`` (the Leases' I/O), ``writer_lease``, the folder and the readers of Leases (the kubectl
plugin's report, the operator) agree on, without the I/O of ``leases``. The Lease collection and its
times (``LEASE_PLURAL``, ``micro_time``) are any Lease's: they are in ``election_rules``.
"""

from __future__ import annotations

LABEL_LEASE = "kube-rendezvous.io/lease"
ANNOTATION_NODE = "kube-rendezvous.io/node"
ANNOTATION_DESIRE = "kube-rendezvous.io/desire"
ANNOTATION_DESIRED_AT = "kube-rendezvous.io/desired-at"
ANNOTATION_SETTINGS = "kube-rendezvous.io/join-settings"
ANNOTATION_RUN_ID = "kube-rendezvous.io/run-id"
ANNOTATION_ROUND = "kube-rendezvous.io/desired-round"
ANNOTATION_WRITER_PRIORITY = "kube-rendezvous.io/writer-priority"
#: The uid of the pod whose agent created a node Lease (only when the agent runs with ``POD_UID_ENV`` set). The
#: chart's fencing policy (``fencing.enabled``) lets a pod's bound token write only the node Lease carrying its uid.
ANNOTATION_POD_UID = "kube-rendezvous.io/pod-uid"
#: The environment variable an agent reads its pod's uid from (downward API, ``fieldRef: metadata.uid``).
POD_UID_ENV = "POD_UID"
