"""README claims that had no test (see docs/claims.md): each test here fails when its claim is false."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._store.store import KubernetesStore
from kubernetes import client

from tests.helpers import REPO, rendezvous_parameters
from tests.testenv import ControlPlane, free_port, wait_until

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


def modules_loaded_by(imports: str) -> set[str]:
    """Top-level packages in ``sys.modules`` after ``imports`` runs in a fresh interpreter."""
    script = f"import sys\n{imports}\nprint(' '.join(sorted({{name.split('.')[0] for name in sys.modules}})))"
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return set(run.stdout.split())


class TestLayering:
    def test_the_in_pod_library_never_loads_kopf(self) -> None:
        loaded = modules_loaded_by(
            "import kube_rendezvous._engine.connection, kube_rendezvous._adapters.handler, "
            "kube_rendezvous._store.store, kube_rendezvous._engine.backend"
        )
        assert "kubernetes" in loaded and "tensorplay" in loaded  # the imports did happen
        assert "kopf" not in loaded

    def test_the_pure_modules_load_no_framework_and_no_api_client(self) -> None:
        loaded = modules_loaded_by(
            "import kube_rendezvous._rules.document, kube_rendezvous._rules.summary, kube_rendezvous._rules.settings, "
            "kube_rendezvous._rules.intents, kube_rendezvous._rules.statecheck, kube_rendezvous._rules.folder_rules, "
            "kube_rendezvous._rules.adder_rules, kube_rendezvous._rules.retries, kube_rendezvous._rules.leases_rules"
        )
        assert "kube_rendezvous" in loaded
        assert not loaded & {"tensorplay", "torch", "kubernetes", "urllib3", "kopf"}

    def test_the_operators_pure_decisions_load_no_kopf(self) -> None:
        loaded = modules_loaded_by(
            "import kube_rendezvous_operator.conditions_rules, kube_rendezvous_operator.events_rules, "
            "kube_rendezvous_operator.pods_rules, kube_rendezvous_operator.gone_pods_rules, "
            "kube_rendezvous_operator.restarts_rules, kube_rendezvous_operator.resync_rules, "
            "kube_rendezvous_operator.writer_rules, kube_rendezvous_operator.ttl_rules, "
            "kube_rendezvous_operator.not_ready_rules, kube_rendezvous_operator.lost_nodes_rules"
        )
        assert "kube_rendezvous_operator" in loaded
        assert not loaded & {"kopf", "tensorplay", "torch"}

    def test_the_operator_knows_no_framework(self) -> None:
        loaded = modules_loaded_by("import kube_rendezvous_operator.handlers, kube_rendezvous_operator.pods_rules")
        assert "kopf" in loaded
        assert not loaded & {"tensorplay", "torch"}


class TestStockLauncher:
    def test_the_stock_tensorplay_launcher_does_not_know_backend_k8s(self, tmp_path: Path) -> None:
        # tensorplay 1.0.0 never loads entry points: only our launcher (kube_rendezvous.run) registers k8s.
        script = tmp_path / "noop.py"
        script.write_text("print('worker ran')\n")
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "tensorplay.distributed.run",
                "--nnodes=1",
                "--nproc-per-node=1",
                "--rdzv-backend=k8s",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                "--max-restarts=0",
                str(script),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode != 0
        assert "worker ran" not in run.stdout
        assert "The rendezvous backend 'k8s' is not registered" in run.stderr


class TestOwnerOfACreatedRendezvous:
    def test_the_owner_reference_is_set_and_the_rendezvous_is_collected_with_its_owner(
        self, admin_api: client.ApiClient, namespace: str, agent_kubeconfig: Path
    ) -> None:
        core, objects = client.CoreV1Api(admin_api), client.CustomObjectsApi(admin_api)
        owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="j")))
        assert owner.metadata is not None
        uid = str(owner.metadata.uid)
        create_backend(rendezvous_parameters(f"{namespace}/owned", agent_kubeconfig, owner=f"v1/ConfigMap/j/{uid}"))
        created: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "owned")
        assert [(ref["kind"], ref["name"], ref["uid"]) for ref in created["metadata"]["ownerReferences"]] == [
            ("ConfigMap", "j", uid)
        ]
        core.delete_namespaced_config_map("j", namespace)

        def collected() -> bool:
            try:
                objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "owned")
            except client.ApiException as exc:
                return bool(exc.status == 404)
            return False

        wait_until(collected, 60, "the garbage collector to delete the owned Rendezvous")


class TestForbiddenAfterAllowed:
    def test_a_403_for_a_request_the_client_was_allowed_before_is_retried_until_allowed_again(
        self, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path
    ) -> None:
        # What an API server that restarts does for a moment (its RBAC cache is empty): refuse a
        # request it allowed a second ago. Here the refusal is real and lasts until the test ends it.
        _, store = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig, retry_timeout=90))
        assert isinstance(store, KubernetesStore)
        store.set("k", "v")
        assert store.get("k") == b"v"
        control_plane.kubectl("-n", namespace, "delete", "rolebinding", "kube-rendezvous-agent")
        who = f"--as=system:serviceaccount:{namespace}:trainer"
        wait_until(
            lambda: (
                control_plane.kubectl(
                    "-n", namespace, "auth", "can-i", "get", "rendezvouskeys.kube-rendezvous.io", who, check=False
                ).stdout.strip()
                == "no"
            ),
            30,
            "the binding to be gone",
        )
        outcome: list[bool | BaseException] = []

        def read() -> None:
            try:
                outcome.append(store.has("k"))  # a read that goes to the API server (get may use the watch)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                outcome.append(exc)

        sent = store._api.stats["requests"]
        thread = threading.Thread(target=read)
        thread.start()
        wait_until(lambda: store._api.stats["requests"] >= sent + 3, 60, "the refused read to be retried")
        assert outcome == []  # still retrying, not failed
        control_plane.kubectl("-n", namespace, "apply", "-f", str(REPO / "docs" / "rbac.yaml"))
        thread.join(90)
        assert outcome == [True]

    def test_a_403_for_a_request_never_allowed_fails_at_once(
        self, namespace: str, agent_kubeconfig: Path, control_plane: ControlPlane
    ) -> None:
        _, store = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig, retry_timeout=90))
        control_plane.kubectl("-n", namespace, "delete", "rolebinding", "kube-rendezvous-agent")
        who = f"--as=system:serviceaccount:{namespace}:trainer"
        wait_until(
            lambda: (
                control_plane.kubectl(
                    "-n", namespace, "auth", "can-i", "get", "rendezvouskeys.kube-rendezvous.io", who, check=False
                ).stdout.strip()
                == "no"
            ),
            30,
            "the binding to be gone",
        )
        started = time.monotonic()
        with pytest.raises(Exception, match="403"):
            store.get("never", timeout=1)
        assert time.monotonic() - started < 10  # not retried for retry_timeout (90 s)


class TestKubectlWide:
    def test_wide_output_adds_the_held_nodes_the_rank_order_the_ready_condition_and_the_run_id(
        self, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path
    ) -> None:
        import pickle

        from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

        backend, _ = create_backend(rendezvous_parameters(f"{namespace}/job", agent_kubeconfig, run_id="run-7"))
        assert backend.set_state(pickle.dumps(_RendezvousState())) is not None
        plain = control_plane.kubectl("-n", namespace, "get", "rdzv", "job").stdout.splitlines()
        wide = control_plane.kubectl("-n", namespace, "get", "rdzv", "job", "-o", "wide").stdout.splitlines()
        columns = ["NAME", "PHASE", "ROUND", "MEMBERS", "MIN", "MAX", "WAITING", "SPARES"]
        assert plain[0].split() == [*columns, "ROUND-AGE", "AGE"]
        assert wide[0].split() == [*columns, "HELD", "ORDER", "ROUND-AGE", "READY", "RUN", "AGE"]
        assert "run-7" in wide[1].split() and "run-7" not in plain[1]


class TestConflictBackoff:
    @staticmethod
    def losing_calls(namespace: str, kubeconfig: Path, backoff: str, losses: int) -> list[float]:
        """Seconds taken by each of ``losses`` compare-and-swaps in a row that lose (their token is stale)."""
        import pickle

        from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

        def state(round_number: int) -> bytes:
            made = _RendezvousState()
            made.round = round_number
            return pickle.dumps(made)

        loser, _ = create_backend(rendezvous_parameters(f"{namespace}/cas", kubeconfig, conflict_backoff=backoff))
        other, _ = create_backend(rendezvous_parameters(f"{namespace}/cas", kubeconfig))
        first = loser.set_state(state(1))
        assert first is not None
        stale = first[1]
        current = other.get_state()
        assert current is not None
        assert other.set_state(state(2), current[1]) is not None  # the loser's token is stale from now on
        taken = []
        for _ in range(losses):
            started = time.monotonic()
            answer = loser.set_state(state(3), stale)
            taken.append(time.monotonic() - started)
            assert answer is not None and answer[2] is False
        return taken

    def test_lost_compare_and_swaps_in_a_row_wait_a_random_time_doubling_up_to_2_s(
        self, namespace: str, agent_kubeconfig: Path
    ) -> None:
        taken = self.losing_calls(namespace, agent_kubeconfig, "0.1", 6)
        limits = [min(2.0, 0.1 * 2**k) for k in range(6)]  # 0.1, 0.2, 0.4, 0.8, 1.6, 2.0
        # Each call: its random wait (at most the limit) plus two requests (the 409, the read).
        assert all(spent <= limit + 1.0 for spent, limit in zip(taken, limits, strict=True)), taken
        # The waits are uniform: their sum averages 2.55 s; under 0.4 s has a chance below 1e-4.
        assert sum(taken) >= 0.4, taken

    def test_zero_turns_the_backoff_off(self, namespace: str, agent_kubeconfig: Path) -> None:
        taken = self.losing_calls(namespace, agent_kubeconfig, "0", 6)
        assert sum(taken) < 0.4 + 6 * 0.2, taken  # requests only; the waits above would average 2.55 s
