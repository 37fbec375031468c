"""The workload controllers users run, built from source, beside a ``tests.testenv.cluster``: JobSet, Kubeflow
Trainer, Kueue and Kubeflow's training-operator v1 (PyTorchJob).

``WorkloadControllers(cluster).start()`` installs each one's manifests as its release renders them
(``kubectl kustomize`` of the module's own ``config/`` or ``manifests/``: CRDs, RBAC, webhook configurations,
the webhook Secret) and runs its controller manager as a local process under its own ServiceAccount (the
release's ClusterRoles and Roles, RBAC on), with:

- its webhooks served through a Service, as in any cluster: the Service has no selector and its
  EndpointSlice names the first node's bridge address, where the process listens (the pattern of
  ``cluster.py``'s kube-dns). The API server calls ``<service>.<namespace>.svc`` through kube-proxy.
- its internal certificate management (open-policy-agent's cert-controller rotator, no cert-manager): the
  rotator creates the CA and the serving certificate in the release's Secret and injects the CA into the
  webhook configurations and CRDs; this harness plays the kubelet's Secret volume, copying ``tls.crt`` and
  ``tls.key`` from the Secret into the folder the process reads them from.
- leader election off (one replica), metrics off, its health probe on 127.0.0.1.

Why local processes and not the releases' Deployments: the nodes pull no image (no registry here), and an
image of each controller would cost a build step per controller (the operator's image takes ~2 min cold).
What differs from a Deployment:

- each process sees a folder of its own at ``/tmp/k8s-webhook-server/serving-certs`` (a bind mount in a
  private mount namespace, ``unshare --mount``; the empty mount point stays on the host), because JobSet and
  Trainer hard-code that path and would otherwise share it;
- the namespace is the release's default, as there is no ServiceAccount namespace file.

Kueue runs with one integration, ``batch/job``, the visibility API server off (``VisibilityOnDemand=false``:
an unavailable APIService breaks discovery and namespace deletion), workload slices on (elastic Jobs) and only the
webhooks of the kinds it then serves (its pod webhook, as rendered, fails closed on every pod outside kube-system).
JobSet runs with ``InPlaceRestart`` and ``RestartJob`` on. The training-operator (no configuration file: flags)
runs with one scheme, ``pytorchjob`` (only its CRD and its webhook installed), and no gang scheduler; its webhook
server takes no host, so it listens on every address of the host at its port.

Not guaranteed: one set of controllers per cluster; the controllers' versions are pinned in ``jobset/``,
``trainer/``, ``kueue/`` and ``trainingoperator/`` (``go.mod``); the upstreams of the first three test against
Kubernetes 1.32-1.36 and the training-operator v1.8 against 1.27-1.29, not 1.37.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .binaries import TESTENV_DIR, build_go_module, log_progress
from .cluster import Cluster
from .commands import run_command
from .controlplane import _Server, free_port, wait_until
from .podnet import run

#: The releases, pinned in each wrapper module's go.mod: the newest the Go module proxy serves of JobSet v0.12,
#: Trainer v2.3 and Kueue (v0.12.1, v2.3.1 and v0.20.0 are refused there), and the only release of the
#: training-operator v1 it serves.
JOBSET_VERSION = "v0.12.0"
TRAINER_VERSION = "v2.3.0"
KUEUE_VERSION = "v0.19.2"
TRAINING_OPERATOR_VERSION = "v1.8.1"

#: Where cert-controller's rotator and controller-runtime's webhook server look for the serving certificate.
SERVING_CERTS = "k8s-webhook-server/serving-certs"

#: Kinds of the rendered manifests that a local process does not use: its Deployment, its ConfigMap (the
#: configuration is written here), its Services (the webhook Service is made here, without selector) and
#: APIServices (Kueue's visibility server is off).
DROPPED_KINDS = frozenset({"Deployment", "ConfigMap", "Service", "APIService"})

#: Kueue's feature gates: its visibility API server off (see the module's docstring), and workload slices (elastic
#: Jobs, ``kueue.x-k8s.io/elastic-job``; beta and on by default since v0.18, named here so a change of default shows).
KUEUE_FEATURE_GATES = "VisibilityOnDemand=false,ElasticJobsViaWorkloadSlices=true"
#: JobSet's feature gates (its Configuration's ``featureGates``), both alpha and off by default in v0.12: the
#: ``InPlaceRestart`` restart strategy and the ``RestartJob`` failure-policy action. What in-place restarts need of
#: Kubernetes is on by default in 1.37: container restart rules (``ContainerRestartRules``, beta since 1.35) and
#: their ``RestartAllContainers`` action (``RestartAllContainersOnContainerExits``, beta since 1.36).
JOBSET_FEATURE_GATES = {"InPlaceRestart": True, "RestartJob": True}

#: The training-operator's one scheme (``--enable-scheme``; all six without it), its CRD and its webhook.
TRAINING_OPERATOR_SCHEME = "pytorchjob"
TRAINING_OPERATOR_CRD = "pytorchjobs.kubeflow.org"
TRAINING_OPERATOR_WEBHOOK = "validator.pytorchjob.training-operator.kubeflow.org"

#: Kueue's webhooks for the kinds it serves with ``integrations.frameworks: [batch/job]``.
KUEUE_WEBHOOKS = frozenset(
    {
        "mjob.kb.io",
        "vjob.kb.io",
        "mworkload.kb.io",
        "vworkload.kb.io",
        "mclusterqueue.kb.io",
        "vclusterqueue.kb.io",
        "mresourceflavor.kb.io",
        "vresourceflavor.kb.io",
        "vcohort.kb.io",
    }
)


@dataclass(frozen=True)
class Recipe:
    """How one controller is built and run."""

    name: str
    version: str
    module: str
    package: str
    binary: str
    namespace: str
    service_account: str
    webhook_service: str
    webhook_secret: str
    #: The manifests' folders inside the module, each rendered with ``kubectl kustomize``.
    manifests: tuple[str, ...]


RECIPES: dict[str, Recipe] = {
    "jobset": Recipe(
        "jobset",
        JOBSET_VERSION,
        "sigs.k8s.io/jobset",
        "sigs.k8s.io/jobset",
        "jobset-controller",
        "jobset-system",
        "jobset-controller-manager",
        "jobset-webhook-service",
        "jobset-webhook-server-cert",
        ("config/default",),
    ),
    "trainer": Recipe(
        "trainer",
        TRAINER_VERSION,
        "github.com/kubeflow/trainer/v2",
        "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
        "trainer-controller-manager",
        "kubeflow-system",
        "kubeflow-trainer-controller-manager",
        "kubeflow-trainer-controller-manager",
        "kubeflow-trainer-webhook-cert",
        ("manifests/base/crds", "manifests/base/rbac", "manifests/base/webhook"),
    ),
    "kueue": Recipe(
        "kueue",
        KUEUE_VERSION,
        "sigs.k8s.io/kueue",
        "sigs.k8s.io/kueue/cmd/kueue",
        "kueue",
        "kueue-system",
        "kueue-controller-manager",
        "kueue-webhook-service",
        "kueue-webhook-server-cert",
        ("config/default",),
    ),
    "trainingoperator": Recipe(
        "trainingoperator",
        TRAINING_OPERATOR_VERSION,
        "github.com/kubeflow/training-operator",
        "github.com/kubeflow/training-operator/cmd/training-operator.v1",
        "training-operator",
        "kubeflow",
        "training-operator",
        "training-operator",
        "training-operator-webhook-cert",
        # The standalone overlay: the base and what its Deployment needs (the Namespace, the webhook Secret).
        ("manifests/overlays/standalone",),
    ),
}


def build_workload_controllers(names: tuple[str, ...] = tuple(RECIPES)) -> dict[str, Path]:
    """Compile each controller of ``names`` once (cached like every testenv binary); return name -> executable."""
    recipes = [RECIPES[name] for name in names]
    return {r.name: build_go_module(r.name, r.package, r.binary, r.version) for r in recipes}


#: JobSet's in-place restart agent (its ``cmd/in-place-restart-agent``, the same module and version as the
#: controller): the main process of a training container under ``restartStrategy: InPlaceRestart``.
IN_PLACE_RESTART_AGENT = ("sigs.k8s.io/jobset/cmd/in-place-restart-agent", "in-place-restart-agent")


def build_in_place_restart_agent() -> Path:
    """Compile JobSet's in-place restart agent once (cached like every testenv binary); return the executable.
    Linked against the host's libc, which the training image has (its ``/usr`` is the host's)."""
    package, binary = IN_PLACE_RESTART_AGENT
    return build_go_module("jobset", package, binary, JOBSET_VERSION)


def module_dir(recipe: Recipe) -> Path:
    """The module's source folder in Go's module cache (downloaded by the build)."""
    done = run_command(["go", "list", "-m", "-f", "{{.Dir}}", recipe.module], cwd=TESTENV_DIR / recipe.name)
    return Path(done.stdout.strip())


def _namespaced(item: dict[str, Any], namespace: str) -> dict[str, Any]:
    """What kustomize's ``namespace:`` does to one object (Trainer's bases carry no namespace of their own)."""
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    if item["kind"] not in cluster_scoped:
        item["metadata"]["namespace"] = namespace
    for subject in item.get("subjects") or []:
        if subject.get("kind") == "ServiceAccount":
            subject["namespace"] = namespace
    for webhook in item.get("webhooks") or []:
        service = (webhook.get("clientConfig") or {}).get("service")
        if service is not None:
            service["namespace"] = namespace
    return item


def rendered_manifests(recipe: Recipe, kubectl: Path) -> list[dict[str, Any]]:
    """The release's objects that a local process needs, in apply order (Namespace and CRDs first)."""
    source = module_dir(recipe)
    objects: list[dict[str, Any]] = []
    for folder in recipe.manifests:
        text = run_command([kubectl, "kustomize", source / folder]).stdout
        objects += [item for item in yaml.safe_load_all(text) if item]
    objects = [item for item in objects if item["kind"] not in DROPPED_KINDS]
    if recipe.name == "trainer":
        objects = [_namespaced(item, recipe.namespace) for item in objects]
        # Trainer's Deployment overlay creates these two; its bases do not.
        objects += [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": recipe.namespace}},
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": recipe.webhook_secret, "namespace": recipe.namespace},
            },
        ]
    if recipe.name == "kueue":
        for item in objects:
            if item["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                item["webhooks"] = [hook for hook in item["webhooks"] if hook["name"] in KUEUE_WEBHOOKS]
    if recipe.name == "trainingoperator":
        objects = [
            item
            for item in objects
            if item["kind"] != "CustomResourceDefinition" or item["metadata"]["name"] == TRAINING_OPERATOR_CRD
        ]
        for item in objects:
            if item["kind"] == "ValidatingWebhookConfiguration":
                item["webhooks"] = [hook for hook in item["webhooks"] if hook["name"] == TRAINING_OPERATOR_WEBHOOK]
    first = {"Namespace": 0, "CustomResourceDefinition": 1}
    return sorted(objects, key=lambda item: first.get(item["kind"], 2))


def training_operator_flags(recipe: Recipe, port: int, health: int) -> list[str]:
    """The training-operator's flags (it reads no configuration file): what ``configuration`` sets for the others,
    one scheme, no gang scheduler."""
    return [
        f"--health-probe-bind-address=127.0.0.1:{health}",
        "--metrics-bind-address=0",
        f"--webhook-server-port={port}",
        f"--webhook-service-name={recipe.webhook_service}",
        f"--webhook-secret-name={recipe.webhook_secret}",
        "--leader-elect=false",
        f"--enable-scheme={TRAINING_OPERATOR_SCHEME}",
        "--gang-scheduler-name=",
    ]


def configuration(recipe: Recipe, host: str, port: int, health: int, certs: Path) -> dict[str, Any]:
    """The controller's configuration file: its webhook on ``host:port``, no leader election, no metrics."""
    common: dict[str, Any] = {
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": host, "port": port},
        "leaderElection": {"leaderElect": False},
    }
    if recipe.name == "jobset":
        return {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            **common,
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": recipe.webhook_service,
                "webhookSecretName": recipe.webhook_secret,
            },
            "featureGates": JOBSET_FEATURE_GATES,
        }
    if recipe.name == "trainer":
        return {
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
            "kind": "Configuration",
            **common,
            "health": {**common["health"], "readinessEndpointName": "readyz", "livenessEndpointName": "healthz"},
            "certManagement": {
                "enable": True,
                "webhookServiceName": recipe.webhook_service,
                "webhookSecretName": recipe.webhook_secret,
            },
        }
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": recipe.namespace,
        **common,
        "webhook": {**common["webhook"], "certDir": f"/tmp/{SERVING_CERTS}"},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": recipe.webhook_service,
            "webhookSecretName": recipe.webhook_secret,
        },
        "integrations": {"frameworks": ["batch/job"]},
    }


@dataclass
class _Running:
    recipe: Recipe
    server: _Server
    port: int
    health: int
    tmp: Path


class WorkloadControllers:
    """JobSet, Trainer, Kueue and the training-operator on ``cluster`` (``names``: a subset, in start order);
    ``stop`` removes them."""

    def __init__(self, cluster: Cluster, names: tuple[str, ...] = tuple(RECIPES)) -> None:
        self.cluster = cluster
        self.plane = cluster.plane
        self.workdir = self.plane.workdir / "workloads"
        self.host = cluster.relay.address[0]
        self.recipes = [RECIPES[name] for name in names]
        self._running: dict[str, _Running] = {}

    def start(self, timeout: float = 300.0) -> None:
        """Apply each release's manifests, start each controller, and return once every webhook answers."""
        binaries = build_workload_controllers(tuple(recipe.name for recipe in self.recipes))
        kubectl = self.plane.binaries.kubectl
        for recipe in self.recipes:
            log_progress(f"installing {recipe.name} {recipe.version}")
            objects = rendered_manifests(recipe, kubectl)
            self.plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))
            crds = [f"crd/{item['metadata']['name']}" for item in objects if item["kind"] == "CustomResourceDefinition"]
            self.plane.wait_established(*crds)
            port, health = free_port(), free_port()
            self.plane.kubectl(
                "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(self._service(recipe, port))
            )
            folder = self.workdir / recipe.name
            tmp = folder / "tmp"
            (tmp / SERVING_CERTS).mkdir(parents=True, exist_ok=True)
            kubeconfig = self.plane.serviceaccount_kubeconfig(recipe.namespace, recipe.service_account, 24 * 3600)
            command = [
                "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", f'mkdir -p /tmp/{SERVING_CERTS} && mount --bind "$0" /tmp/{SERVING_CERTS} && exec "$@"',
                str(tmp / SERVING_CERTS),
                # The training-operator's namespace, as its Deployment gives it (the downward API).
                "env", f"KUBECONFIG={kubeconfig}", f"MY_POD_NAMESPACE={recipe.namespace}",
                str(binaries[recipe.name]),
            ]  # fmt: skip
            if recipe.name == "trainingoperator":
                command += training_operator_flags(recipe, port, health)
            else:
                config = folder / "config.yaml"
                config.write_text(yaml.safe_dump(configuration(recipe, self.host, port, health, tmp / SERVING_CERTS)))
                command.append(f"--config={config}")
            if recipe.name == "kueue":
                command.append(f"--feature-gates={KUEUE_FEATURE_GATES}")
            server = _Server(recipe.name, command, self.plane.logdir / f"{recipe.name}.log")
            server.start()
            self._running[recipe.name] = _Running(recipe, server, port, health, tmp)
        started = time.monotonic()
        wait_until(self._all_ready, timeout, "the workload controllers' webhooks to answer")
        log_progress(f"workload controllers ready in {time.monotonic() - started:.0f} s")

    def _service(self, recipe: Recipe, port: int) -> list[dict[str, Any]]:
        name, namespace = recipe.webhook_service, recipe.namespace
        return [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port, "protocol": "TCP"}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "testenv.kube-rendezvous.io",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [self.host], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        ]

    def _sync_certs(self, running: _Running) -> bool:
        """Write the Secret's serving certificate where the process reads it, as the kubelet syncs a Secret volume;
        whether the files hold what the Secret holds (the rotator may rewrite it after a conflict)."""
        recipe = running.recipe
        done = self.plane.kubectl(
            "-n", recipe.namespace, "get", "secret", recipe.webhook_secret, "-o", "json", check=False
        )
        if done.returncode != 0:
            return False
        data = json.loads(done.stdout).get("data") or {}
        if not data.get("tls.crt") or not data.get("tls.key"):
            return False
        target = running.tmp / SERVING_CERTS
        # The key first: the rotator takes the certificate's existence as "mounted".
        for name in ("tls.key", "tls.crt"):
            content = base64.b64decode(data[name])
            path = target / name
            if path.is_file() and path.read_bytes() == content:
                continue
            partial = target / f".{name}.partial"
            partial.write_bytes(content)
            os.replace(partial, path)
        return True

    def _ready(self, running: _Running) -> bool:
        running.server.check_running()
        if not self._sync_certs(running):
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{running.health}/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def _all_ready(self) -> bool:
        if not all([self._ready(running) for running in self._running.values()]):
            return False
        rules = run("iptables-save", "-t", "nat")
        services = [f"{r.recipe.namespace}/{r.recipe.webhook_service}:https" for r in self._running.values()]
        if not all(service in rules for service in services):
            return False
        return all(self._webhooks_answer(name) for name in self._running)

    def _webhooks_answer(self, name: str) -> bool:
        """Whether a server-side dry run of an object that ``name``'s webhooks review gets their answer."""
        probe = _PROBES[name]()
        done = self.plane.kubectl(
            "create", "--dry-run=server", "-o", "name", "-f", "-", input=yaml.safe_dump(probe), check=False
        )
        return done.returncode == 0 or "failed calling webhook" not in done.stderr

    def stop(self) -> None:
        """Remove the webhook configurations (or every later create of their kinds fails), then stop each process."""
        for running in self._running.values():
            for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
                with contextlib.suppress(Exception):
                    names = self.plane.kubectl("get", kind, "-o", "name", check=False).stdout.split()
                    prefixes = (
                        running.recipe.name,
                        "kubeflow-trainer",
                        "defaulter.trainer",
                        "validator.trainer",
                        "validator.training-operator",
                    )
                    mine = [n for n in names if n.split("/", 1)[1].startswith(prefixes)]
                    if mine:
                        self.plane.kubectl("delete", *mine, "--wait=false", check=False)
        for running in self._running.values():
            running.server.stop()
        self._running.clear()

    def logs(self) -> dict[str, Path]:
        """Each controller's log file."""
        return {name: self.plane.logdir / f"{name}.log" for name in (recipe.name for recipe in self.recipes)}


def _jobset_probe() -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "probe",
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "probe"}]}
                            }
                        }
                    },
                }
            ]
        },
    }


def _trainer_probe() -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "webhook-probe"}},
    }


def _kueue_probe() -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "webhook-probe"}}


def _training_operator_probe() -> dict[str, Any]:
    container = {"name": "pytorch", "image": "probe"}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}},
    }


_PROBES: dict[str, Callable[[], dict[str, Any]]] = {
    "jobset": _jobset_probe,
    "trainer": _trainer_probe,
    "kueue": _kueue_probe,
    "trainingoperator": _training_operator_probe,
}
