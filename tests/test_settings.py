"""Endpoint, namespace, owner and --rdzv-conf parsing of the k8s backend's settings (pure)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kube_rendezvous._rules.settings import (
    KubernetesRendezvousConfig,
    OwnerReference,
    RendezvousTimings,
    parse_endpoint,
    validate_namespace,
    validate_object_name,
)
from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters


def parameters(**config: Any) -> RendezvousParameters:
    """Launcher parameters for backend ``k8s`` with ``config`` as the --rdzv-conf keys."""
    return RendezvousParameters(
        backend="k8s", endpoint="ignored/by-from-parameters", run_id="r", min_nodes=1, max_nodes=2, config=config
    )


class TestParseEndpoint:
    def test_namespace_and_name_are_split(self) -> None:
        assert parse_endpoint("team-a/llama-train") == ("team-a", "llama-train")

    def test_bare_name_has_no_namespace(self) -> None:
        assert parse_endpoint("llama-train") == (None, "llama-train")

    def test_surrounding_whitespace_is_ignored(self) -> None:
        assert parse_endpoint("  team-a/rdzv\n") == ("team-a", "rdzv")

    def test_dotted_name_is_a_valid_object_name(self) -> None:
        assert parse_endpoint("ns/run.v2") == ("ns", "run.v2")

    @pytest.mark.parametrize("endpoint", ["", "   "])
    def test_empty_endpoint_is_rejected_explaining_what_it_names(self, endpoint: str) -> None:
        with pytest.raises(ValueError, match=r"--rdzv-endpoint is empty.*<namespace>/<name> or <name>"):
            parse_endpoint(endpoint)

    def test_three_parts_are_rejected_with_an_example(self) -> None:
        with pytest.raises(ValueError, match=r"--rdzv-endpoint 'a/b/c': expected <namespace>/<name> or <name>, e\.g\."):
            parse_endpoint("a/b/c")

    @pytest.mark.parametrize("endpoint", ["/name", "ns/", "/"])
    def test_empty_part_is_rejected(self, endpoint: str) -> None:
        with pytest.raises(ValueError, match=rf"--rdzv-endpoint '{endpoint}': expected <namespace>/<name>"):
            parse_endpoint(endpoint)

    def test_name_with_uppercase_and_underscore_is_rejected_naming_the_name_field(self) -> None:
        with pytest.raises(
            ValueError, match=r"--rdzv-endpoint name: 'Bad_Name' is not a valid Kubernetes object name; use at most 253"
        ):
            parse_endpoint("Bad_Name")

    def test_invalid_namespace_is_rejected_naming_the_namespace_field(self) -> None:
        with pytest.raises(ValueError, match=r"--rdzv-endpoint namespace: 'Team_A' is not a valid namespace"):
            parse_endpoint("Team_A/rdzv")

    def test_name_of_253_characters_is_accepted(self) -> None:
        name = "a" * 253
        assert parse_endpoint(name) == (None, name)

    def test_name_of_254_characters_is_rejected(self) -> None:
        with pytest.raises(ValueError, match=r"--rdzv-endpoint name: 'a{254}' .*at most 253"):
            parse_endpoint("a" * 254)

    def test_namespace_of_64_characters_is_rejected(self) -> None:
        with pytest.raises(ValueError, match=r"--rdzv-endpoint namespace: .*at most 63"):
            parse_endpoint("n" * 64 + "/rdzv")


class TestValidateNames:
    def test_valid_namespace_is_returned(self) -> None:
        assert validate_namespace("team-a", "namespace") == "team-a"

    def test_namespace_of_63_characters_is_accepted(self) -> None:
        assert validate_namespace("n" * 63, "namespace") == "n" * 63

    def test_namespace_with_uppercase_is_rejected_naming_the_field_and_the_rule(self) -> None:
        with pytest.raises(ValueError, match=r"^my-field: 'Team-A' is not a valid namespace; use at most 63 lowercase"):
            validate_namespace("Team-A", "my-field")

    def test_namespace_over_63_characters_is_rejected(self) -> None:
        with pytest.raises(ValueError, match=r"^ns-field: 'n{64}' is not a valid namespace"):
            validate_namespace("n" * 64, "ns-field")

    @pytest.mark.parametrize("namespace", ["-team", "team-", "team.a", ""])
    def test_namespace_that_is_not_a_dns_label_is_rejected(self, namespace: str) -> None:
        with pytest.raises(ValueError, match=r"starting and ending with a letter or digit"):
            validate_namespace(namespace, "namespace")

    @pytest.mark.parametrize("name", ["-rdzv", "rdzv-", "rdzv..v2", "rdzv.", "r dzv"])
    def test_object_name_that_is_not_a_dns_subdomain_is_rejected(self, name: str) -> None:
        with pytest.raises(ValueError, match=r"^name-field: .* is not a valid Kubernetes object name"):
            validate_object_name(name, "name-field")


class TestOwnerReference:
    def test_grouped_api_version_is_kept_whole(self) -> None:
        assert OwnerReference.parse("batch/v1/Job/train/0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d") == OwnerReference(
            "batch/v1", "Job", "train", "0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d"
        )

    def test_core_api_version_has_one_part(self) -> None:
        assert OwnerReference.parse("v1/Pod/p/0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d") == OwnerReference(
            "v1", "Pod", "p", "0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d"
        )

    def test_as_dict_is_the_owner_references_entry(self) -> None:
        assert OwnerReference.parse("batch/v1/Job/train/0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d").as_dict() == {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train",
            "uid": "0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d",
        }

    @pytest.mark.parametrize("text", ["Job/train", "v1/Pod/p", "a/b/c/d/e/f", "batch/v1//train/uid", ""])
    def test_wrong_shape_is_rejected_quoting_the_value_and_an_example(self, text: str) -> None:
        with pytest.raises(
            ValueError,
            match=rf"rdzv-conf owner='{text}': expected <apiVersion>/<kind>/<name>/<uid>, e\.g\. 'batch/v1/Job/train/",
        ):
            OwnerReference.parse(text)

    def test_an_existing_rendezvous_without_this_owner_says_it_is_ignored_and_what_to_do(self) -> None:
        owner = OwnerReference("batch/v1", "Job", "train", "0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d")
        applied = {"metadata": {"namespace": "team-a", "name": "train"}}
        message = owner.ignored_by(applied)
        assert message is not None
        assert message.startswith(
            "rdzv-conf owner: Rendezvous team-a/train already exists with no owner, so its owner Job train "
            "(uid 0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d) is ignored"
        )
        assert "only if they carry the label kube-rendezvous.io/rendezvous=train" in message
        assert "Let the agents create it (do not apply it first)" in message
        other = {
            **applied,
            "metadata": {**applied["metadata"], "ownerReferences": [{"kind": "Job", "name": "old", "uid": "x"}]},
        }
        assert "already exists with owners Job old," in str(owner.ignored_by(other))
        owned = {**applied, "metadata": {**applied["metadata"], "ownerReferences": [owner.as_dict()]}}
        assert owner.ignored_by(owned) is None


class TestConfigValidation:
    def test_defaults(self) -> None:
        config = KubernetesRendezvousConfig(name="rdzv")
        assert config.namespace is None
        assert config.create is True
        assert config.owner is None
        assert (config.request_timeout, config.retry_timeout, config.store_timeout) == (30.0, 60.0, 300.0)

    @pytest.mark.parametrize("field", ["request_timeout", "retry_timeout", "store_timeout"])
    @pytest.mark.parametrize("value", [0, -1, -0.5])
    def test_non_positive_timeout_is_rejected_naming_the_rdzv_conf_key(self, field: str, value: float) -> None:
        kwargs: dict[str, Any] = {field: value}
        with pytest.raises(
            ValueError, match=rf"^rdzv-conf {field}={value!r}: must be a positive, finite number of seconds$"
        ):
            KubernetesRendezvousConfig(name="rdzv", **kwargs)

    def test_non_numeric_timeout_is_rejected(self) -> None:
        kwargs: dict[str, Any] = {"store_timeout": "300"}
        with pytest.raises(ValueError, match=r"rdzv-conf store_timeout='300': must be a positive, finite number"):
            KubernetesRendezvousConfig(name="rdzv", **kwargs)

    def test_invalid_name_is_rejected_naming_the_rendezvous_name(self) -> None:
        with pytest.raises(ValueError, match=r"^Rendezvous name: 'Rdzv' is not a valid Kubernetes object name"):
            KubernetesRendezvousConfig(name="Rdzv")

    def test_invalid_namespace_is_rejected(self) -> None:
        with pytest.raises(ValueError, match=r"^namespace: 'NS' is not a valid namespace"):
            KubernetesRendezvousConfig(name="rdzv", namespace="NS")


class TestFromParameters:
    def test_endpoint_namespace_wins_over_conf_namespace(self) -> None:
        config = KubernetesRendezvousConfig.from_parameters("team-a/rdzv", parameters(namespace="team-b"))
        assert (config.namespace, config.name) == ("team-a", "rdzv")

    def test_endpoint_namespace_wins_even_over_an_invalid_conf_namespace(self) -> None:
        config = KubernetesRendezvousConfig.from_parameters("team-a/rdzv", parameters(namespace="Not_Valid"))
        assert config.namespace == "team-a"

    def test_conf_namespace_is_used_when_endpoint_has_none(self) -> None:
        config = KubernetesRendezvousConfig.from_parameters("rdzv", parameters(namespace="team-b"))
        assert (config.namespace, config.name) == ("team-b", "rdzv")

    def test_namespace_is_none_when_neither_gives_one(self) -> None:
        assert KubernetesRendezvousConfig.from_parameters("rdzv", parameters()).namespace is None

    def test_invalid_conf_namespace_is_rejected_naming_the_rdzv_conf_key(self) -> None:
        with pytest.raises(ValueError, match=r"^rdzv-conf namespace: 'Team_B' is not a valid namespace"):
            KubernetesRendezvousConfig.from_parameters("rdzv", parameters(namespace="Team_B"))

    def test_endpoint_argument_is_used_not_the_parameters_endpoint(self) -> None:
        assert KubernetesRendezvousConfig.from_parameters("other", parameters()).name == "other"

    def test_invalid_endpoint_is_rejected(self) -> None:
        with pytest.raises(ValueError, match=r"--rdzv-endpoint 'a/b/c'"):
            KubernetesRendezvousConfig.from_parameters("a/b/c", parameters())

    def test_defaults_when_conf_is_empty(self) -> None:
        assert KubernetesRendezvousConfig.from_parameters("ns/rdzv", parameters()) == KubernetesRendezvousConfig(
            name="rdzv", namespace="ns"
        )

    @pytest.mark.parametrize("text", ["false", "False", "0", "no"])
    def test_create_false_is_parsed(self, text: str) -> None:
        assert KubernetesRendezvousConfig.from_parameters("rdzv", parameters(create=text)).create is False

    def test_create_true_is_parsed(self) -> None:
        assert KubernetesRendezvousConfig.from_parameters("rdzv", parameters(create="true")).create is True

    def test_timeouts_are_parsed_as_seconds(self) -> None:
        config = KubernetesRendezvousConfig.from_parameters(
            "rdzv", parameters(request_timeout="2.5", retry_timeout="10", store_timeout="600")
        )
        assert (config.request_timeout, config.retry_timeout, config.store_timeout) == (2.5, 10.0, 600.0)

    @pytest.mark.parametrize("key", ["request_timeout", "retry_timeout", "store_timeout"])
    def test_non_numeric_timeout_is_rejected_naming_the_key(self, key: str) -> None:
        with pytest.raises(ValueError, match=rf"^rdzv-conf {key}='abc': must be a number of seconds$"):
            KubernetesRendezvousConfig.from_parameters("rdzv", parameters(**{key: "abc"}))

    def test_zero_timeout_from_conf_is_rejected_naming_the_key(self) -> None:
        with pytest.raises(
            ValueError, match=r"^rdzv-conf retry_timeout=0\.0: must be a positive, finite number of seconds$"
        ):
            KubernetesRendezvousConfig.from_parameters("rdzv", parameters(retry_timeout="0"))

    def test_owner_is_parsed(self) -> None:
        config = KubernetesRendezvousConfig.from_parameters(
            "rdzv", parameters(owner="batch/v1/Job/train/0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d")
        )
        assert config.owner == OwnerReference("batch/v1", "Job", "train", "0b7c3e1a-5d2f-4c8e-9a61-3f2d4e5b6c7d")

    def test_malformed_owner_is_rejected(self) -> None:
        with pytest.raises(ValueError, match=r"rdzv-conf owner='Job/train': expected"):
            KubernetesRendezvousConfig.from_parameters("rdzv", parameters(owner="Job/train"))

    def test_kubeconfig_and_context_are_passed_through(self) -> None:
        config = KubernetesRendezvousConfig.from_parameters(
            "rdzv", parameters(kubeconfig="/etc/kube/config", context="prod")
        )
        assert (config.kubeconfig, config.context) == ("/etc/kube/config", "prod")

    def test_empty_kubeconfig_and_context_mean_unset(self) -> None:
        config = KubernetesRendezvousConfig.from_parameters("rdzv", parameters(kubeconfig="", context=""))
        assert (config.kubeconfig, config.context) == (None, None)


class TestRejectedValuesFoundInReview:
    @pytest.mark.parametrize("key", ["request_timeout", "retry_timeout", "store_timeout"])
    @pytest.mark.parametrize("value", ["nan", "inf"])
    def test_non_finite_timeout_from_conf_is_rejected_naming_the_key(self, key: str, value: str) -> None:
        with pytest.raises(ValueError, match=rf"rdzv-conf {key}=.*positive, finite"):
            KubernetesRendezvousConfig.from_parameters("rdzv", parameters(**{key: value}))

    def test_owner_without_its_uid_is_rejected_instead_of_misread(self) -> None:
        with pytest.raises(ValueError, match=r"owner='batch/v1/Job/train'.*must be the owner's metadata.uid"):
            OwnerReference.parse("batch/v1/Job/train")


class TestRendezvousTimings:
    """rdzv-conf, then the Rendezvous spec, then the default: resolved in one place."""

    def test_defaults_are_tensorplays(self) -> None:
        timings = RendezvousTimings.resolve({}, {})
        assert (timings.join, timings.last_call, timings.close, timings.heartbeat) == (600, 30, 30, 5)
        assert (timings.keep_alive_interval, timings.keep_alive_max_attempt, timings.heartbeat_expiry) == (5, 3, 15)

    def test_the_spec_fills_in_what_rdzv_conf_does_not_give(self) -> None:
        spec = {"joinTimeoutSeconds": 120, "lastCallTimeoutSeconds": 7, "keepAliveIntervalSeconds": 2}
        timings = RendezvousTimings.resolve({"join_timeout": "900"}, spec)
        assert (timings.join, timings.last_call, timings.keep_alive_interval) == (900, 7, 2)

    def test_the_heartbeat_timeout_never_falls_back_to_the_keep_alive_interval(self) -> None:
        assert RendezvousTimings.resolve({}, {"keepAliveIntervalSeconds": 60}).heartbeat == 5

    def test_the_operator_resolves_from_the_spec_alone(self) -> None:
        timings = RendezvousTimings.resolve(None, {"keepAliveIntervalSeconds": 4, "keepAliveMaxAttempts": 5})
        assert timings.heartbeat_expiry == 20

    @pytest.mark.parametrize(
        ("conf", "spec", "named"),
        [
            ({"join_timeout": "0"}, {}, "rdzv-conf join_timeout='0'"),
            ({"keep_alive_max_attempt": "many"}, {}, "rdzv-conf keep_alive_max_attempt='many'"),
            ({}, {"closeTimeoutSeconds": -1}, "spec.closeTimeoutSeconds=-1"),
        ],
    )
    def test_a_bad_value_names_where_it_came_from(self, conf: dict[str, str], spec: dict[str, int], named: str) -> None:
        with pytest.raises(ValueError, match=re.escape(named)):
            RendezvousTimings.resolve(conf, spec)


class TestWorkloadOwner:
    """``workload_owner``: which workload an agent's pod belongs to (rdzv-conf owner=pod), pure."""

    UID_A, UID_B = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-8999-aaaaaaaaaaaa"

    def test_a_jobsets_labels_win_over_the_pods_controller_its_job(self) -> None:
        from kube_rendezvous._rules.settings import workload_owner

        pod = {
            "metadata": {
                "labels": {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/jobset-uid": self.UID_A},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": "train-node-0",
                        "uid": self.UID_B,
                        "controller": True,
                    }
                ],
            }
        }
        owner = workload_owner(pod)
        assert (owner.api_version, owner.kind, owner.name, owner.uid) == (
            "jobset.x-k8s.io/v1alpha2",
            "JobSet",
            "train",
            self.UID_A,
        )

    def test_otherwise_the_controller_and_never_an_owner_that_is_not_the_controller(self) -> None:
        from kube_rendezvous._rules.settings import workload_owner

        references = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": self.UID_A},
            {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": self.UID_B, "controller": True},
        ]
        owner = workload_owner({"metadata": {"ownerReferences": references}})
        assert (owner.kind, owner.name, owner.uid) == ("Job", "train", self.UID_B)
        with pytest.raises(ValueError, match="pod ns/p has no controller"):
            workload_owner({"metadata": {"namespace": "ns", "name": "p", "ownerReferences": references[:1]}})
