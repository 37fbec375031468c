"""The chart's opt-in Kubeflow Trainer ClusterTrainingRuntime (``trainingRuntime``): rendered with ``helm template``
and compared with the TrainingRuntime of examples/torch/trainjob.yaml, the one source of its spec (the example is
the one ``tests/test_workloads.py`` runs on the real Trainer, as is a TrainJob naming the chart's runtime)."""

from __future__ import annotations

import pytest

from tests.test_chart import CHART, Helm, Manifest, example, objects_of, the
from tests.testenv import ensure_binaries

ENABLED = "trainingRuntime.enabled=true"
KIND = "ClusterTrainingRuntime"


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))


def example_runtime() -> Manifest:
    return the(example("torch/trainjob.yaml"), "TrainingRuntime")


def pod_of(runtime: Manifest) -> Manifest:
    """The pod template spec of the runtime's one replicated Job."""
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod: Manifest = job["template"]["spec"]["template"]["spec"]
    return pod


class TestTheClusterTrainingRuntime:
    def test_it_is_off_by_default(self, helm: Helm) -> None:
        assert objects_of(helm.template(), KIND) == []

    def test_on_it_is_one_cluster_scoped_runtime_of_the_trainer_group_named_by_the_values(self, helm: Helm) -> None:
        runtime = the(helm.template(ENABLED), KIND)
        assert runtime["apiVersion"] == example_runtime()["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
        assert runtime["metadata"]["name"] == "kube-rendezvous-torch"
        assert "namespace" not in runtime["metadata"]
        assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
        renamed = the(helm.template(ENABLED, "trainingRuntime.name=torch-elastic"), KIND)
        assert renamed["metadata"]["name"] == "torch-elastic"

    def test_its_spec_is_the_example_training_runtimes(self, helm: Helm) -> None:
        """torch, the failure policy (a lost pod replaced, not counted, no JobSet restart; 3 restarts for a failed
        Job) and the labels Trainer selects its pods by: the example's spec, with the example's image."""
        example = example_runtime()
        (container,) = pod_of(example)["containers"]
        runtime = the(helm.template(ENABLED, f"trainingRuntime.image={container['image']}"), KIND)
        assert runtime["spec"] == example["spec"]
        assert example["metadata"]["labels"].items() <= runtime["metadata"]["labels"].items()

    def test_its_pods_run_as_the_training_account_with_the_image_and_nodes_of_the_values(self, helm: Helm) -> None:
        runtime = the(
            helm.template(
                ENABLED,
                "trainingRBAC.serviceAccountName=ml-runner",
                "trainingRuntime.image=registry.example.com/train:2",
                "trainingRuntime.numNodes=3",
            ),
            KIND,
        )
        assert runtime["spec"]["mlPolicy"] == {"numNodes": 3, "torch": {}}
        pod = pod_of(runtime)
        assert pod["serviceAccountName"] == "ml-runner"
        assert pod["containers"] == [{"name": "node", "image": "registry.example.com/train:2"}]

    def test_without_an_image_the_trainjob_gives_it(self, helm: Helm) -> None:
        assert pod_of(the(helm.template(ENABLED), KIND))["containers"] == [{"name": "node"}]

    @pytest.mark.parametrize("value", ["trainingRuntime.numNodes=0", "trainingRuntime.name=Not_A_Name"])
    def test_the_schema_rejects_bad_values(self, helm: Helm, value: str) -> None:
        result = helm.run("template", "rdzv", CHART, "--set", ENABLED, "--set", value, check=False)
        assert result.returncode != 0 and "trainingRuntime" in result.stderr, result.stderr
