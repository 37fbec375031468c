"""Which pods are a Rendezvous's training pods (``pods_rules.pod_selector``): pure, no API server."""

from __future__ import annotations

from typing import Any

import pytest
from kube_rendezvous._kube.kubeapi import RENDEZVOUS_LABEL
from kube_rendezvous_operator import pods_rules


def owner(
    api_version: str, kind: str, name: str = "train", uid: str = "u-1", controller: bool = True
) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller}


@pytest.mark.parametrize(
    ("reference", "labels"),
    [
        (owner("batch/v1", "Job"), {"batch.kubernetes.io/controller-uid": "u-1"}),
        (owner("jobset.x-k8s.io/v1alpha2", "JobSet"), {"jobset.sigs.k8s.io/jobset-uid": "u-1"}),
        (
            owner("kubeflow.org/v1", "PyTorchJob"),
            {"training.kubeflow.org/job-name": "train", "training.kubeflow.org/operator-name": "pytorchjob-controller"},
        ),
        (owner("trainer.kubeflow.org/v1alpha1", "TrainJob"), {"jobset.sigs.k8s.io/jobset-name": "train"}),
    ],
    ids=["Job", "JobSet", "PyTorchJob", "TrainJob"],
)
def test_the_owners_workload_kind_gives_the_default_selector(reference: dict[str, Any], labels: dict[str, str]) -> None:
    selector = pods_rules.pod_selector("job", {}, {"ownerReferences": [reference]}, RENDEZVOUS_LABEL)
    assert selector.match_labels == labels
    assert selector.source == f"owner {reference['kind']} train"


def test_spec_pod_selector_wins_over_the_owner() -> None:
    spec = {"podSelector": {"matchLabels": {"app": "trainer"}}}
    selector = pods_rules.pod_selector("job", spec, {"ownerReferences": [owner("batch/v1", "Job")]}, RENDEZVOUS_LABEL)
    assert (selector.match_labels, selector.source) == ({"app": "trainer"}, "spec.podSelector")


def test_without_a_selector_or_a_known_owner_the_pods_are_those_labelled_with_the_name() -> None:
    for metadata in (
        {},
        {"ownerReferences": [owner("apps/v1", "StatefulSet")]},
        {"ownerReferences": [owner("batch/v1", "Job", uid="")]},
    ):
        selector = pods_rules.pod_selector("job", {"podSelector": {"matchLabels": {}}}, metadata, RENDEZVOUS_LABEL)
        assert (selector.match_labels, selector.source) == ({RENDEZVOUS_LABEL: "job"}, "default")


def test_a_known_workload_owner_counts_even_when_another_owner_is_listed_first_without_controller() -> None:
    references = [owner("v1", "ConfigMap", controller=False), owner("batch/v1", "Job", controller=False)]
    selector = pods_rules.pod_selector("job", {}, {"ownerReferences": references}, RENDEZVOUS_LABEL)
    assert selector.match_labels == {"batch.kubernetes.io/controller-uid": "u-1"}


def test_a_pod_belongs_to_every_rendezvous_that_selects_it_and_to_the_one_it_names() -> None:
    selectors = {
        "a": pods_rules.PodSelector({"batch.kubernetes.io/controller-uid": "u-1"}, "owner Job a"),
        "b": pods_rules.PodSelector({"app": "trainer", "team": "x"}, "spec.podSelector"),
        "c": pods_rules.PodSelector({RENDEZVOUS_LABEL: "c"}, "default"),
    }
    assert pods_rules.rendezvouses_of_pod(
        {"batch.kubernetes.io/controller-uid": "u-1"}, selectors, RENDEZVOUS_LABEL
    ) == ["a"]
    assert (
        pods_rules.rendezvouses_of_pod({"app": "trainer"}, selectors, RENDEZVOUS_LABEL) == []
    )  # every label must match
    assert pods_rules.rendezvouses_of_pod({"app": "trainer", "team": "x"}, selectors, RENDEZVOUS_LABEL) == ["b"]
    assert pods_rules.rendezvouses_of_pod({RENDEZVOUS_LABEL: "d"}, selectors, RENDEZVOUS_LABEL) == ["d"]  # not seen yet
    assert (
        pods_rules.rendezvouses_of_pod({"batch.kubernetes.io/controller-uid": "u-2"}, selectors, RENDEZVOUS_LABEL) == []
    )
    assert pods_rules.rendezvouses_of_pod(None, selectors, RENDEZVOUS_LABEL) == []


def test_describe_is_a_kubectl_label_selector() -> None:
    selector = pods_rules.PodSelector({"b": "2", "a": "1"}, "spec.podSelector")
    assert selector.describe() == "a=1,b=2"
