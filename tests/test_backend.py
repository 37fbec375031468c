"""KubernetesRendezvousBackend on the real API server, as a pod's ServiceAccount would use it."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import KubernetesRendezvousBackend, create_backend
from kube_rendezvous._kube.kubeapi import KubernetesApi
from kube_rendezvous._rules.document import MAX_NODES, RendezvousDocument, document_from_state
from kubernetes import client, config
from tensorplay.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousStateError,
)
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from tests.helpers import rendezvous_parameters, run_workers
from tests.testenv import ControlPlane

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


@pytest.fixture
def endpoint(namespace: str) -> str:
    return f"{namespace}/rdzv"


@pytest.fixture
def backend(endpoint: str, agent_kubeconfig: Path) -> KubernetesRendezvousBackend:
    made, _ = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
    return made


def read_object(objects: client.CustomObjectsApi, namespace: str, name: str = "rdzv") -> dict[str, Any]:
    found: dict[str, Any] = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return found


def write_raw_status(objects: client.CustomObjectsApi, namespace: str, status: dict[str, Any]) -> None:
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "rdzv", {"status": status}, _content_type="application/merge-patch+json"
    )


def state(round_number: int = 0, **fields: Any) -> bytes:
    """A pickled tensorplay state told apart by its round."""
    made = _RendezvousState()
    made.round = round_number
    for name, value in fields.items():
        setattr(made, name, value)
    return pickle.dumps(made)


def meaning(data: bytes) -> RendezvousDocument:
    """What a state says, whatever its bytes (the backend re-pickles what it reads)."""
    return document_from_state(pickle.loads(data))


class TestBackendContract:
    """The 8 clauses of torch's RendezvousBackendTestMixin, for real rendezvous states."""

    def test_empty_backend_has_no_state(self, backend: KubernetesRendezvousBackend) -> None:
        assert backend.get_state() is None

    def test_set_state_on_empty_backend_creates_it_with_a_token(self, backend: KubernetesRendezvousBackend) -> None:
        written, token, has_set = backend.set_state(state(1))  # type: ignore[misc]
        assert (meaning(written), has_set) == (meaning(state(1)), True)
        assert token is not None

    def test_get_state_returns_what_was_set_with_its_token(self, backend: KubernetesRendezvousBackend) -> None:
        _, token, _ = backend.set_state(state(1))  # type: ignore[misc]
        current = backend.get_state()
        assert current is not None and current[1] == token
        assert meaning(current[0]) == meaning(state(1))

    def test_set_state_with_current_token_writes_and_returns_a_new_token(
        self, backend: KubernetesRendezvousBackend
    ) -> None:
        _, token, _ = backend.set_state(state(1))  # type: ignore[misc]
        written, new_token, has_set = backend.set_state(state(2), token)  # type: ignore[misc]
        assert has_set is True and new_token != token
        assert meaning(written) == meaning(state(2))
        current = backend.get_state()
        assert current is not None and current[1] == new_token and meaning(current[0]).round == 2

    def test_stale_token_returns_current_state_without_writing(self, backend: KubernetesRendezvousBackend) -> None:
        _, first, _ = backend.set_state(state(1))  # type: ignore[misc]
        _, second, _ = backend.set_state(state(2), first)  # type: ignore[misc]
        current, token, has_set = backend.set_state(state(3), first)  # type: ignore[misc]
        assert (meaning(current).round, token, has_set) == (2, second, False)

    def test_none_token_while_state_exists_returns_current_state_without_writing(
        self, backend: KubernetesRendezvousBackend
    ) -> None:
        _, token, _ = backend.set_state(state(1))  # type: ignore[misc]
        current, current_token, has_set = backend.set_state(state(2), None)  # type: ignore[misc]
        assert (meaning(current).round, current_token, has_set) == (1, token, False)

    @pytest.mark.parametrize(
        "bad_token", ["invalid", 42, 1.5, b"7", ""], ids=["text", "int", "float", "bytes", "empty"]
    )
    def test_token_of_wrong_type_or_format_returns_current_state_without_writing(
        self, backend: KubernetesRendezvousBackend, bad_token: object
    ) -> None:
        _, token, _ = backend.set_state(state(1))  # type: ignore[misc]
        current, current_token, has_set = backend.set_state(state(2), bad_token)  # type: ignore[misc]
        assert (meaning(current).round, current_token, has_set) == (1, token, False)
        stored = backend.get_state()
        assert stored is not None and (meaning(stored[0]).round, stored[1]) == (1, token)

    @pytest.mark.parametrize(
        ("data", "message"),
        [(b"x", "are not one"), (pickle.dumps({"round": 1}), "got a pickled dict"), (b"", "are not one")],
        ids=["bytes", "other-object", "empty"],
    )
    def test_bytes_that_are_not_a_rendezvous_state_are_refused_at_set_state_and_never_stored(
        self,
        backend: KubernetesRendezvousBackend,
        objects: client.CustomObjectsApi,
        namespace: str,
        data: bytes,
        message: str,
    ) -> None:
        _, token, _ = backend.set_state(state(1))  # type: ignore[misc]
        with pytest.raises(RendezvousStateError, match=message):
            backend.set_state(data, token)
        assert read_object(objects, namespace)["metadata"]["resourceVersion"] == token

    @pytest.mark.parametrize(
        ("corruption", "message"),
        [
            ("kr1:not*base64!", "invalid base64"),
            ("kr1:" + base64.b64encode(zlib.compress(b"x" * 1000)[:-8]).decode(), "truncated"),
            ("kr1:" + base64.b64encode(b"definitely not zlib").decode(), "corrupt zlib"),
            ("kr1:" + base64.b64encode(zlib.compress(b'{"version":2}')).decode(), "not a field|is missing"),
        ],
        ids=["bad-base64", "truncated", "not-zlib", "wrong-document"],
    )
    def test_corrupt_state_raises_state_error_and_leaves_the_object_as_it_was(
        self,
        backend: KubernetesRendezvousBackend,
        objects: client.CustomObjectsApi,
        namespace: str,
        corruption: str,
        message: str,
    ) -> None:
        backend.set_state(state(1))
        write_raw_status(objects, namespace, {"state": corruption})
        before = read_object(objects, namespace)
        with pytest.raises(RendezvousStateError, match=message):
            backend.get_state()
        with pytest.raises(RendezvousStateError, match=message):
            backend.set_state(state(2), None)
        after = read_object(objects, namespace)
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after["status"]["state"] == corruption

    def test_unreachable_api_server_raises_connection_error_from_the_transport_error(
        self, backend: KubernetesRendezvousBackend, agent_kubeconfig: Path, tmp_path: Path
    ) -> None:
        document = json.loads(agent_kubeconfig.read_text())
        document["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"  # nothing listens there
        dead = tmp_path / "dead.kubeconfig"
        dead.write_text(json.dumps(document))
        api_client = config.new_client_from_config(str(dead))
        unreachable = KubernetesRendezvousBackend(
            KubernetesApi(api_client, request_timeout=2),
            backend.namespace,
            backend.rendezvous_name,
            backend.run_id,
            retry_timeout=1,
            framework=backend.framework,
        )
        with pytest.raises(RendezvousConnectionError, match="could not be reached") as raised:
            unreachable.get_state()
        assert raised.value.__cause__ is not None
        with pytest.raises(RendezvousConnectionError):
            unreachable.set_state(state(1), None)

    def test_the_retry_deadline_is_kept_to_within_one_request_timeout_when_answers_never_come(
        self, backend: KubernetesRendezvousBackend, agent_kubeconfig: Path, tmp_path: Path
    ) -> None:
        import socket
        import threading
        import time

        # A server that accepts connections and never answers: every request times out. Hidden
        # transport retries (urllib3 re-sends GETs three times) would multiply the wait.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])
                except OSError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            document = json.loads(agent_kubeconfig.read_text())
            document["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{listener.getsockname()[1]}"
            silent = tmp_path / "silent.kubeconfig"
            silent.write_text(json.dumps(document))
            request_timeout, retry_timeout = 1.0, 3.0
            unanswered = KubernetesRendezvousBackend(
                KubernetesApi(config.new_client_from_config(str(silent)), request_timeout=request_timeout),
                backend.namespace,
                backend.rendezvous_name,
                backend.run_id,
                retry_timeout=retry_timeout,
                framework=backend.framework,
            )
            started = time.monotonic()
            with pytest.raises(RendezvousConnectionError):
                unanswered.get_state()
            elapsed = time.monotonic() - started
        finally:
            stop.set()
            thread.join(5)
            listener.close()
            for connection in held:
                connection.close()
        print(f"\nretry_timeout {retry_timeout} s, request_timeout {request_timeout} s: gave up after {elapsed:.2f} s")
        assert retry_timeout - request_timeout <= elapsed <= retry_timeout + request_timeout + 0.5


class TestCompareAndSwapUnderConcurrency:
    def test_concurrent_read_modify_write_increments_lose_no_update(
        self, endpoint: str, agent_kubeconfig: Path, backend: KubernetesRendezvousBackend
    ) -> None:
        processes, increments = 4, 25
        results = run_workers("increment-state", processes, endpoint, str(agent_kubeconfig), str(increments))
        current = backend.get_state()
        assert current is not None
        assert meaning(current[0]).round == processes * increments
        conflicts = sum(int(result["conflicts"]) for result in results)
        print(f"\n{processes}x{increments} increments: {conflicts} lost compare-and-swaps")

    @pytest.mark.parametrize("field", ["labels", "annotations"])
    def test_a_foreign_metadata_write_costs_at_most_one_failed_compare_and_swap(
        self,
        backend: KubernetesRendezvousBackend,
        objects: client.CustomObjectsApi,
        namespace: str,
        field: str,
    ) -> None:
        _, token, _ = backend.set_state(state(0))  # type: ignore[misc]
        failures = 0
        for value in range(1, 6):
            objects.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "rdzv", {"metadata": {field: {"example.com/touch": str(value)}}}
            )
            for _attempt in range(3):
                result = backend.set_state(state(value), token)
                assert result is not None
                _, token, has_set = result
                if has_set:
                    break
                failures += 1
            else:
                pytest.fail("set_state kept failing after a single foreign write")
        assert failures == 5  # exactly one per foreign write
        current = backend.get_state()
        assert current is not None and (meaning(current[0]).round, current[1]) == (5, token)


class TestRendezvousSpecValidation:
    def _create(self, objects: client.CustomObjectsApi, namespace: str, spec: dict[str, Any]) -> None:
        objects.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Rendezvous", "metadata": {"name": "bad"}, "spec": spec},
        )

    def test_min_nodes_above_max_nodes_is_rejected_with_a_clear_message(
        self, objects: client.CustomObjectsApi, namespace: str, crds: None
    ) -> None:
        with pytest.raises(client.ApiException) as rejected:
            self._create(objects, namespace, {"minNodes": 4, "maxNodes": 2})
        assert rejected.value.status == 422
        assert "spec.minNodes must be less than or equal to spec.maxNodes" in rejected.value.body

    def test_min_nodes_below_one_is_rejected_naming_the_field(
        self, objects: client.CustomObjectsApi, namespace: str, crds: None
    ) -> None:
        with pytest.raises(client.ApiException) as rejected:
            self._create(objects, namespace, {"minNodes": 0, "maxNodes": 2})
        assert rejected.value.status == 422
        assert "spec.minNodes" in rejected.value.body
        assert "greater than or equal to 1" in rejected.value.body

    def test_a_closed_rendezvous_cannot_be_reopened(
        self, objects: client.CustomObjectsApi, namespace: str, crds: None
    ) -> None:
        self._create(objects, namespace, {"minNodes": 1, "maxNodes": 2, "closed": True})
        with pytest.raises(client.ApiException) as rejected:
            objects.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "bad", {"spec": {"closed": False}}
            )
        assert "spec.closed cannot go back to false" in rejected.value.body


class TestPermissions:
    def test_serviceaccount_without_the_role_gets_an_error_naming_the_missing_permission(
        self, control_plane: ControlPlane, namespace: str, crds: None
    ) -> None:
        kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "no-role")
        with pytest.raises(RendezvousConnectionError) as refused:
            create_backend(rendezvous_parameters(f"{namespace}/rdzv", kubeconfig))
        message = str(refused.value)
        assert "403" in message
        assert "'get'" in message and "rendezvouses" in message
        assert f"system:serviceaccount:{namespace}:no-role" in message

    def test_a_role_without_status_patch_is_named_when_writing_the_state(
        self, control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, crds: None
    ) -> None:
        rbac = client.RbacAuthorizationV1Api(admin_api)
        rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="read-only"),
                rules=[client.V1PolicyRule(api_groups=[GROUP], resources=["rendezvouses"], verbs=["get", "create"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="read-only"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-only"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)],
            ),
        )
        kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "reader")
        from tests.testenv import wait_until

        made = wait_until(
            lambda: create_backend(rendezvous_parameters(f"{namespace}/rdzv", kubeconfig))[0], 30, "RBAC to apply"
        )
        with pytest.raises(RendezvousConnectionError) as refused:
            made.set_state(state(1))
        assert "'patch'" in str(refused.value) and "rendezvouses/status" in str(refused.value)


class TestObjectLifecycle:
    def test_missing_object_without_create_is_a_value_error_naming_the_object(
        self, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        with pytest.raises(ValueError, match=r"Rendezvous .*/rdzv does not exist.*create=true"):
            create_backend(rendezvous_parameters(endpoint, agent_kubeconfig, create="false"))

    def test_unset_run_id_is_tied_to_the_object_uid(
        self, endpoint: str, agent_kubeconfig: Path, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        made, _ = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig, run_id="none"))
        assert made.run_id == read_object(objects, namespace)["metadata"]["uid"]

    def test_state_of_another_run_counts_as_no_state_and_is_replaced(
        self, endpoint: str, agent_kubeconfig: Path, backend: KubernetesRendezvousBackend
    ) -> None:
        backend.set_state(state(1))
        other, _ = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig, run_id="job-2"))
        assert other.get_state() is None
        written, _token, has_set = other.set_state(state(2))  # type: ignore[misc]
        assert (meaning(written).round, has_set) == (2, True)
        assert backend.get_state() is None

    def test_a_new_run_starts_without_the_old_runs_evictions(
        self,
        endpoint: str,
        agent_kubeconfig: Path,
        backend: KubernetesRendezvousBackend,
        objects: client.CustomObjectsApi,
        namespace: str,
    ) -> None:
        backend.set_state(state(1))
        write_raw_status(objects, namespace, {"evictedNodes": ["10.0.0.9_1_7"]})
        other, _ = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig, run_id="job-2"))
        assert other.get_state() is None
        other.set_state(state(0))
        stored = read_object(objects, namespace)["status"]
        assert stored["runId"] == "job-2" and "evictedNodes" not in stored

    def test_deleted_object_raises_closed_error(
        self, backend: KubernetesRendezvousBackend, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        backend.set_state(state(1))
        objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rdzv")
        with pytest.raises(RendezvousClosedError, match="no longer exists"):
            backend.get_state()

    def test_a_state_that_would_not_fit_is_refused_before_writing(
        self, backend: KubernetesRendezvousBackend, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        _, token, _ = backend.set_state(state(1))  # type: ignore[misc]
        huge = {_NodeDesc(os.urandom(100).hex(), 1, 0) for _ in range(MAX_NODES - 1)}
        with pytest.raises(RendezvousStateError, match=r"over the .*-byte limit"):
            backend.set_state(state(2, wait_list=huge), token)
        assert read_object(objects, namespace)["metadata"]["resourceVersion"] == token


class TestReadableSummary:
    def test_kubectl_shows_the_round_members_and_waiting_nodes_of_the_state_written(
        self, backend: KubernetesRendezvousBackend, control_plane: ControlPlane, namespace: str
    ) -> None:
        state = _RendezvousState()
        state.round = 3
        state.complete = True
        now = datetime.now(timezone.utc)
        nodes = [_NodeDesc(f"node-{index}", 100 + index, 0) for index in range(3)]
        state.participants = {nodes[0]: 0, nodes[1]: 1}
        state.wait_list = {nodes[2]}
        state.last_heartbeats = {node: now - timedelta(seconds=1) for node in nodes}
        backend.set_state(pickle.dumps(state))

        shown = json.loads(control_plane.kubectl("-n", namespace, "get", "rdzv", "rdzv", "-o", "json").stdout)
        status = shown["status"]
        assert (status["round"], status["phase"], status["participantCount"], status["waitingCount"]) == (
            3,
            "Complete",
            2,
            1,
        )
        assert status["participants"] == [{"node": "node-0_100_0", "rank": 0}, {"node": "node-1_101_0", "rank": 1}]
        assert status["waiting"] == ["node-2_102_0"]
        assert status["runId"] == "job-1"
        table = control_plane.kubectl("-n", namespace, "get", "rdzv").stdout
        assert table.split("\n")[0].split()[:7] == ["NAME", "PHASE", "ROUND", "MEMBERS", "MIN", "MAX", "WAITING"]
        assert table.split("\n")[1].split()[:7] == ["rdzv", "Complete", "3", "2", "1", "4", "1"]


class TestSafetyAndIntents:
    def test_spec_closed_is_folded_into_the_state_the_agents_read(
        self, backend: KubernetesRendezvousBackend, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        backend.set_state(state(0))
        objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rdzv", {"spec": {"closed": True}})
        current = backend.get_state()
        assert current is not None
        assert pickle.loads(current[0]).closed is True

    def test_closing_before_any_agent_wrote_gives_newcomers_a_closed_state(
        self, backend: KubernetesRendezvousBackend, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rdzv", {"spec": {"closed": True}})
        current = backend.get_state()
        assert current is not None
        assert pickle.loads(current[0]).closed is True

    def test_an_evicted_node_gets_an_expired_heartbeat_so_tensorplay_prunes_it(
        self, backend: KubernetesRendezvousBackend, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        made = _RendezvousState()
        alive, dead = _NodeDesc("10.0.0.1", 1, 0), _NodeDesc("10.0.0.2", 2, 0)
        now = datetime.now(timezone.utc)
        made.complete = True
        made.participants = {alive: 0, dead: 1}
        made.last_heartbeats = {alive: now, dead: now}
        backend.set_state(pickle.dumps(made))
        write_raw_status(objects, namespace, {"evictedNodes": [str(dead)]})
        current = backend.get_state()
        assert current is not None
        folded = pickle.loads(current[0])
        assert folded.last_heartbeats[alive] == now
        assert folded.last_heartbeats[dead] < now - timedelta(days=365)
