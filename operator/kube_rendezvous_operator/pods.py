"""The training pods' index: which pods are each Rendezvous's, kept current from the pod watch.

A pod is a Rendezvous's training pod when its ``spec.podSelector`` (or the default for its owner's
workload kind, ``pods_rules.pod_selector``) selects it, or when it is labelled with the Rendezvous's name.
Its record's ``pods`` is the census its folder completes rounds by (``writer``); ``resync`` lists them anew.
The rules that evict the nodes of pods are ``gone_pods``, ``restarts``, ``resync`` and ``not_ready``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf
from kube_rendezvous import RENDEZVOUS_LABEL

from . import pods_rules
from .memory import Key, OperatorMemo


def rendezvouses_of_pod(memo: OperatorMemo, labels: dict[str, str] | None, namespace: str | None) -> list[str]:
    """The Rendezvous objects of ``namespace`` whose training pod a pod with ``labels`` is."""
    with memo.lock:
        selectors = {
            name: record.selector
            for (where, name), record in memo.records.items()
            if where == namespace and record.selector is not None
        }
    return pods_rules.rendezvouses_of_pod(labels, selectors, RENDEZVOUS_LABEL)


def is_training_pod(labels: dict[str, str], namespace: str | None, memo: OperatorMemo, **_: Any) -> bool:
    """Kopf's filter for the pod watch: a pod some Rendezvous selects (or that names one)."""
    return bool(rendezvouses_of_pod(memo, labels, namespace))


def pods_changed(memo: OperatorMemo, key: Key, update: Callable[[dict[str, dict[str, Any]]], object]) -> None:
    """Apply ``update(pods)`` to ``key``'s pod index (if listed) and wake its folder."""
    with memo.lock:
        record = memo.records.get(key)
        if record is not None and record.pods is not None:
            update(record.pods)
        wake = record.wake_folder if record is not None else None
    if wake is not None:
        wake()


def track_training_pod(
    type: str | None, body: kopf.Body, labels: dict[str, str], namespace: str, memo: OperatorMemo, **_: Any
) -> None:
    """Keep each Rendezvous's pod index current (the census its folder completes rounds by)."""
    pod = dict(body)
    uid = str(pod.get("metadata", {}).get("uid") or pod.get("metadata", {}).get("name"))

    def update(pods: dict[str, dict[str, Any]]) -> None:
        if type == "DELETED":
            pods.pop(uid, None)
        else:
            pods[uid] = pod

    for rendezvous in rendezvouses_of_pod(memo, labels, namespace):
        pods_changed(memo, (namespace, rendezvous), update)
