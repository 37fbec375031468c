"""The README's quickstart as written: the files its commands name exist and agree with each other, and
``examples/train.py`` trains under stock ``torchrun --rdzv-backend=k8s`` (two agents as local processes with a
ServiceAccount token, against the real API server; no real nodes).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from scripts.release import project_version
from tests.e2e.harness import ElasticJob
from tests.helpers import REPO
from tests.test_elastic_job import rendezvous_status
from tests.testenv import ControlPlane

EXAMPLES = REPO / "examples"
VERSION = project_version()


def quickstart_commands() -> str:
    """The bash block of the README's section "Quickstart"."""
    section = (REPO / "README.md").read_text().split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_every_file_the_quickstart_names_exists_or_is_a_release_artifact() -> None:
    commands = quickstart_commands()
    named = set(re.findall(r"(?<![\w/$.-])((?:examples|scripts|dist)/[\w./-]+)", commands))
    assert {"examples/Dockerfile.training", "examples/quickstart-job.yaml", "scripts/release.sh"} <= named, named
    artifacts = {f"dist/kube-rendezvous-operator-{VERSION}.tar", f"dist/kube-rendezvous-{VERSION}.tgz"}
    for path in named:
        assert (REPO / path).is_file() or path in artifacts, path
    assert f"image.tag={VERSION}" in commands and f"kube-rendezvous-train:{VERSION}" in commands


def test_the_training_image_holds_the_wheel_of_this_version_and_the_example_script() -> None:
    dockerfile = (EXAMPLES / "Dockerfile.training").read_text()
    assert f"ARG VERSION={VERSION}\n" in dockerfile
    copies = re.findall(r"^COPY (\S+) (\S+)$", dockerfile, re.MULTILINE)
    sources = [source.replace("${VERSION}", VERSION) for source, _ in copies]
    assert sources == [f"dist/kube_rendezvous-{VERSION}-py3-none-any.whl", "examples/train.py"]
    assert (REPO / sources[1]).is_file()
    # The build context lets in exactly what the COPY lines take (BuildKit reads <Dockerfile>.dockerignore).
    ignore = (EXAMPLES / "Dockerfile.training.dockerignore").read_text().split()
    assert ignore[ignore.index("*") :] == ["*", "!dist/kube_rendezvous-*.whl", "!examples/train.py"]
    assert 'pip install "/tmp/kube_rendezvous-${VERSION}-py3-none-any.whl[torch]"' in dockerfile


def test_the_quickstart_job_runs_stock_torchrun_on_the_images_script_with_the_charts_account() -> None:
    job = yaml.safe_load((EXAMPLES / "quickstart-job.yaml").read_text())
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = container["args"]
    assert container["command"] == ["torchrun"] and args[-1] == "train.py"  # WORKDIR of Dockerfile.training
    assert "--rdzv-backend=k8s" in args and "--rdzv-id=$(JOB_UID)" in args
    endpoint = next(arg for arg in args if arg.startswith("--rdzv-endpoint="))
    assert endpoint == "--rdzv-endpoint=$(POD_NAMESPACE)/" + pod["metadata"]["labels"]["kube-rendezvous.io/rendezvous"]
    chart_values = yaml.safe_load((REPO / "charts" / "kube-rendezvous" / "values.yaml").read_text())
    assert pod["spec"]["serviceAccountName"] == chart_values["trainingRBAC"]["serviceAccountName"]
    assert container["image"].endswith(f"/kube-rendezvous-train:{VERSION}")


def test_examples_train_py_trains_under_stock_torchrun_with_the_k8s_backend(
    tmp_path: Path, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path
) -> None:
    job = ElasticJob(
        tmp_path / "job",
        "k8s",
        f"{namespace}/job",  # the name rendezvous_status reads
        nnodes="2",
        rdzv_conf={"kubeconfig": str(agent_kubeconfig)},
        nproc_per_node=1,
        steps=5,
        launcher="torchrun",
        script=EXAMPLES / "train.py",
    )
    try:
        agents = [job.start_agent(env={"TORCH_ELASTIC_WORKER_IDENTICAL": "1"}) for _ in range(2)]
        assert job.wait(agents, 120) == [0, 0], job.logs()
        outputs = "".join(agent.output() for agent in agents)
        assert "rank 1/2 step 5/5: loss" in outputs and "done: 5 steps on 2 workers" in outputs, job.logs()
        status = rendezvous_status(control_plane, namespace)
        assert (status["phase"], status["participantCount"]) == ("Closed", 2)
    finally:
        job.stop()
