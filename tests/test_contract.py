"""One contract suite for the ``KubernetesApi`` surface, run against every implementation of it.

As PyTorch's ``RendezvousBackendTestMixin`` does for its backends: the fixture ``server`` is
parametrized over ``fake`` (``tests.fakeapi.FakeKubernetesApi``, in memory: ``pure``) and ``real``
(the control plane of ``tests/testenv`` as a training pod's ServiceAccount: ``cluster``), and
each test states one clause of the backend's peer contract, the store's reference semantics
(``HashStore``'s, see the BRIEF) or the folder's, through the library's own modules. A clause that
holds on ``real`` but not on ``fake`` is a bug of the fake; one that fails on both, of the library.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from kube_rendezvous._adapters.tensorplay import tensorplay_framework
from kube_rendezvous._engine.backend import KubernetesRendezvousBackend
from kube_rendezvous._engine.folder import Folder
from kube_rendezvous._engine.shared import release, shared
from kube_rendezvous._kube.kubeapi import (
    MERGE_PATCH,
    RENDEZVOUS_PLURAL,
    ConflictError,
    KubernetesApi,
    load_api_client,
    resource_path,
)
from kube_rendezvous._kube.leases import LeaseNodeLock, list_node_records
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, decode_document, document_from_state
from kube_rendezvous._rules.folder_rules import Desire, JoinSettings, PodAddresses, TrainingPods
from kube_rendezvous._rules.placement import Placement
from kube_rendezvous._store.store import KubernetesStore
from tensorplay.distributed.elastic.rendezvous.api import RendezvousStateError
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

from tests.fakeapi import FakeKubernetesApi
from tests.helpers import create_rendezvous
from tests.testenv import wait_until

NAME = "rdzv"
RUN_ID = "run-1"


@dataclass
class Server:
    """An API (``KubernetesApi`` or the fake) and the Rendezvous ``namespace/NAME`` (min=max=2) on it."""

    api: Any
    namespace: str
    uid: str

    @property
    def path(self) -> str:
        return resource_path(RENDEZVOUS_PLURAL, self.namespace, NAME)

    def read(self) -> dict[str, Any]:
        found: dict[str, Any] = self.api.request("GET", self.path)
        return found


@pytest.fixture(params=[pytest.param("fake", marks=pytest.mark.pure), pytest.param("real", marks=pytest.mark.cluster)])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """The API of one implementation, with Rendezvous ``NAME`` (minNodes = maxNodes = 2) created in a namespace."""
    if request.param == "fake":
        api: Any = FakeKubernetesApi()
        namespace = "contract"
        body = {
            "apiVersion": "kube-rendezvous.io/v1alpha1",
            "kind": "Rendezvous",
            "metadata": {"name": NAME},
            "spec": {"minNodes": 2, "maxNodes": 2},
        }
        api.request("POST", resource_path(RENDEZVOUS_PLURAL, namespace), body=body)
    else:
        # Asked for here, not in the signature, so that the fake cases never start a control plane.
        request.getfixturevalue("control_plane")
        namespace = request.getfixturevalue("namespace")
        kubeconfig = request.getfixturevalue("agent_kubeconfig")  # applies the CRDs (``crds``) first
        create_rendezvous(request.getfixturevalue("objects"), namespace, NAME, minNodes=2, maxNodes=2)
        api = KubernetesApi(load_api_client(str(kubeconfig), None)[0])
    made = Server(api, namespace, "")
    made.uid = made.read()["metadata"]["uid"]
    yield made
    release(namespace)
    if isinstance(api, FakeKubernetesApi):
        api.close()


# -- the API surface itself: what the fake models, as the real server does it -------------------------------


class TestApi:
    def test_a_status_patch_changes_only_the_status(self, server: Server) -> None:
        before = server.read()
        patch = {"metadata": {"labels": {"x": "y"}}, "spec": {"maxNodes": 3}, "status": {"runId": "r"}}
        written = server.api.request("PATCH", server.path + "/status", body=patch, content_type=MERGE_PATCH)
        assert (written["spec"], written["metadata"].get("labels"), written["status"]) == (
            before["spec"],
            before["metadata"].get("labels"),
            {"runId": "r"},
        )
        assert int(written["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
        assert written["metadata"]["generation"] == before["metadata"]["generation"]

    def test_a_stale_resource_version_conflicts_and_a_write_that_changes_nothing_keeps_it(self, server: Server) -> None:
        stale = server.read()["metadata"]["resourceVersion"]
        patch = {"status": {"runId": "r"}}
        written = server.api.request("PATCH", server.path + "/status", body=patch, content_type=MERGE_PATCH)
        with pytest.raises(ConflictError):
            server.api.request(
                "PATCH",
                server.path + "/status",
                body={"metadata": {"resourceVersion": stale}},
                content_type=MERGE_PATCH,
            )
        again = server.api.request("PATCH", server.path + "/status", body=patch, content_type=MERGE_PATCH)
        assert again["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
        assert server.read()["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]

    def test_a_watch_from_a_list_delivers_the_selected_changes_in_order(self, server: Server) -> None:
        leases = resource_path("leases", server.namespace)
        listed = server.api.request("GET", leases, query={"labelSelector": "contract in (yes),!other"})
        for name, labels in (("a", {"contract": "yes"}), ("b", {"contract": "no"})):
            body = {"metadata": {"name": name, "labels": labels}, "spec": {"holderIdentity": name}}
            server.api.request("POST", leases, body={"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **body})
        server.api.request("PATCH", leases + "/a", body={"spec": {"holderIdentity": "z"}}, content_type=MERGE_PATCH)
        server.api.request("DELETE", leases + "/a")
        query = {"labelSelector": "contract in (yes),!other", "resourceVersion": listed["metadata"]["resourceVersion"]}
        seen = []
        for event in server.api.watch(leases, query=query, timeout_seconds=10):
            seen.append((event["type"], event["object"]["metadata"]["name"], event["object"]["spec"]["holderIdentity"]))
            if len(seen) == 3:
                break
        assert seen == [("ADDED", "a", "a"), ("MODIFIED", "a", "z"), ("DELETED", "a", "z")]


# -- the compare-and-swap backend: the peer contract (BRIEF, "Backend semantics") ---------------------


def state(round_number: int) -> bytes:
    """A pickled tensorplay state told apart by its round."""
    made = _RendezvousState()
    made.round = round_number
    return pickle.dumps(made)


def meaning(data: bytes) -> RendezvousDocument:
    """What a state says, whatever its bytes (the backend re-pickles what it reads)."""
    return document_from_state(pickle.loads(data))


@pytest.fixture
def backend(server: Server) -> KubernetesRendezvousBackend:
    return KubernetesRendezvousBackend(
        server.api,
        server.namespace,
        NAME,
        RUN_ID,
        retry_timeout=10,
        conflict_backoff=0,
        framework=tensorplay_framework(),
    )


class TestBackend:
    def test_an_empty_backend_has_no_state(self, backend: KubernetesRendezvousBackend) -> None:
        assert backend.get_state() is None

    def test_set_state_on_an_empty_backend_creates_it_and_get_state_returns_it_with_its_token(
        self, backend: KubernetesRendezvousBackend
    ) -> None:
        written, token, has_set = backend.set_state(state(1))  # type: ignore[misc]
        assert (meaning(written), has_set) == (meaning(state(1)), True) and token is not None
        current = backend.get_state()
        assert current is not None and current[1] == token and meaning(current[0]) == meaning(state(1))

    def test_set_state_with_the_current_token_writes_and_returns_another_token(
        self, backend: KubernetesRendezvousBackend
    ) -> None:
        _, token, _ = backend.set_state(state(1))  # type: ignore[misc]
        written, new_token, has_set = backend.set_state(state(2), token)  # type: ignore[misc]
        assert (meaning(written), has_set) == (meaning(state(2)), True) and new_token != token
        current = backend.get_state()
        assert current is not None and current[1] == new_token and meaning(current[0]) == meaning(state(2))

    @pytest.mark.parametrize("bad", ["stale", None, "invalid", 7], ids=["stale", "none", "text", "int"])
    def test_a_stale_missing_or_malformed_token_writes_nothing_and_returns_the_current_state(
        self, server: Server, backend: KubernetesRendezvousBackend, bad: object
    ) -> None:
        _, first, _ = backend.set_state(state(1))  # type: ignore[misc]
        _, second, _ = backend.set_state(state(2), first)  # type: ignore[misc]
        token = first if bad == "stale" else bad
        current, current_token, has_set = backend.set_state(state(3), token)  # type: ignore[misc]
        assert (meaning(current).round, current_token, has_set) == (2, second, False)
        assert server.read()["metadata"]["resourceVersion"] == second

    def test_a_corrupt_stored_state_raises_the_state_error(
        self, server: Server, backend: KubernetesRendezvousBackend
    ) -> None:
        backend.set_state(state(1))
        corrupt = {"status": {"state": "kr1:not*base64!"}}
        server.api.request("PATCH", server.path + "/status", body=corrupt, content_type=MERGE_PATCH)
        with pytest.raises(RendezvousStateError, match="invalid base64"):
            backend.get_state()


# -- the store: tensorplay's HashStore semantics (BRIEF, "Store reference semantics") ------------------


@pytest.fixture
def store(server: Server) -> KubernetesStore:
    made = KubernetesStore(server.api, server.namespace, NAME, server.uid, retry_timeout=10)
    made.start_watch()  # as connection.Connection.store does
    wait_until(
        lambda: (cache := made._key_cache()) is not None and cache.healthy, 30, "the store's watch of its keys to list"
    )
    return made


class TestStore:
    def test_get_of_a_key_that_never_appears_raises_the_stores_timeout_error(self, store: KubernetesStore) -> None:
        with pytest.raises(store.timeout_error):
            store.get("never-set", timeout=0.3)

    def test_set_get_has_and_str_values_stored_as_utf8(self, store: KubernetesStore) -> None:
        assert store.has("a") is False
        store.set("a", "h\u00e9llo")
        assert (store.get("a"), store.has("a")) == ("h\u00e9llo".encode(), True)
        store.set("a", b"\x00\xff")
        assert store.get("a", timeout=1) == b"\x00\xff"

    def test_add_returns_the_new_value_and_a_missing_key_counts_as_zero(self, store: KubernetesStore) -> None:
        assert [store.add("n", 3), store.add("n", -1), store.add("n", 0)] == [3, 2, 2]
        assert store.get("n") == b"2"

    def test_compare_and_swap_returns_what_it_swapped_or_what_is_there(self, store: KubernetesStore) -> None:
        assert store.compare_and_swap("missing", b"x", b"y") == (False, b"")
        assert store.has("missing") is False
        assert store.compare_and_swap("k", b"", b"first") == (True, b"")  # a missing key matches b""
        assert store.compare_and_swap("k", b"wrong", b"second") == (False, b"first")
        assert store.compare_and_swap("k", b"first", "second") == (True, b"first")
        assert store.get("k") == b"second"

    def test_compare_set_returns_the_value_now_stored(self, store: KubernetesStore) -> None:
        assert store.compare_set("missing", b"x", b"y") == b""
        assert store.compare_set("k", b"", b"one") == b"one"
        assert store.compare_set("k", b"nope", b"two") == b"one"
        assert store.compare_set("k", b"one", "two") == b"two"

    def test_wait_returns_true_once_every_key_exists_and_false_at_the_timeout(self, store: KubernetesStore) -> None:
        store.set("a", b"1")
        store.set("b", b"2")
        assert store.wait(["a", "b"], 5.0) is True
        assert store.wait(["a", "never"], timedelta(seconds=0.3)) is False

    def test_delete_key_of_a_missing_key_is_a_no_op_and_num_keys_counts_keys(self, store: KubernetesStore) -> None:
        store.delete_key("not-there")
        store.set("a", b"1")
        store.set("b", b"2")
        store.add("c", 1)
        assert store.num_keys() == 3
        store.delete_key("a")
        assert (store.has("a"), store.num_keys()) == (False, 2)


# -- the folder: requests on node Leases folded into the Rendezvous ---------------------------------------


def node(index: int) -> NodeId:
    return NodeId(f"10.0.0.{index}", 100 + index, 0)


def node_lease(server: Server, index: int) -> LeaseNodeLock:
    return LeaseNodeLock(
        server.api,
        server.namespace,
        NAME,
        node(index),
        run_id=RUN_ID,
        settings=JoinSettings(2, 2, timedelta(0)),
        expiry_seconds=15,
    )


def requests_shown(server: Server, desires: dict[NodeId, Desire]) -> None:
    """Wait until the node Leases as the folder lists them (``resourceVersion=0``) show ``desires``."""
    wait_until(
        lambda: {r.node: r.desire for r in list_node_records(server.api, server.namespace, NAME)[0]} == desires,
        30,
        f"the node Leases to show {desires}",
    )


def stored_document(server: Server) -> RendezvousDocument:
    return decode_document(server.read()["status"]["state"])


@pytest.fixture
def formed(server: Server) -> tuple[Folder, LeaseNodeLock, LeaseNodeLock]:
    """Two nodes asked to join, and one fold formed their round (its own test checks how)."""
    first, second = node_lease(server, 1), node_lease(server, 2)
    first.update(Desire.JOIN)
    second.update(Desire.JOIN)
    requests_shown(server, {node(1): Desire.JOIN, node(2): Desire.JOIN})
    watch = shared(server.api, server.namespace, NAME).watch
    folder = Folder(server.api, server.namespace, NAME, identity="contract-folder", preferred=False, rendezvous=watch)
    # Its watch of the Rendezvous lists first: a list answered after a fold's write would show the
    # version before it (the watch catches up within milliseconds; a fold then would lose its CAS).
    wait_until(lambda: folder.rendezvous.healthy, 30, "the folder's watch of the Rendezvous to list")
    assert folder.fold_once() is True
    return folder, first, second


class TestFolder:
    def test_two_join_requests_with_min_and_max_2_fold_into_one_complete_round_ranked_0_and_1(
        self, server: Server, formed: tuple[Folder, LeaseNodeLock, LeaseNodeLock]
    ) -> None:
        document = stored_document(server)
        assert (document.round, document.complete, document.closed) == (0, True, False)
        assert dict(document.participants) == {node(1): 0, node(2): 1}
        assert server.read()["status"]["runId"] == RUN_ID

    def test_a_leave_request_removes_the_node_and_names_it_as_the_last_departure(
        self, server: Server, formed: tuple[Folder, LeaseNodeLock, LeaseNodeLock]
    ) -> None:
        folder, _, second = formed
        second.update(Desire.LEAVE)
        requests_shown(server, {node(1): Desire.JOIN, node(2): Desire.LEAVE})
        assert folder.fold_once() is True
        document = stored_document(server)
        assert node(2) not in document.nodes() and dict(document.participants) == {node(1): 0}
        departure = server.read()["status"]["lastDeparture"]
        assert (departure["round"], departure["nodes"]) == (0, [{"node": str(node(2)), "reason": "Left"}])

    def test_a_fold_that_closes_writes_a_closed_state(
        self, server: Server, formed: tuple[Folder, LeaseNodeLock, LeaseNodeLock]
    ) -> None:
        folder, _, _ = formed
        assert folder.fold_once(close=True) is True
        assert stored_document(server).closed is True

    def test_a_fold_with_nothing_pending_writes_nothing(
        self, server: Server, formed: tuple[Folder, LeaseNodeLock, LeaseNodeLock]
    ) -> None:
        folder, _, _ = formed
        version = server.read()["metadata"]["resourceVersion"]
        assert folder.fold_once() is False
        assert server.read()["metadata"]["resourceVersion"] == version


class TestPlacement:
    """The folder's placement rules through the API: what the operator's folder writes, and what an agent's
    folder keeps of it (``Folder.fold_once(keep_held=...)``)."""

    @staticmethod
    def census(held: bool) -> TrainingPods:
        def pod(index: int, zone: str, hold: str | None) -> PodAddresses:
            placement = Placement(f"n{index}", (zone,), hold)
            return PodAddresses(frozenset({node(index).addr}), frozenset({f"p{index}"}), placement)

        cordoned = "NodeCordoned: Kubernetes node n1 is cordoned (spec.unschedulable)" if held else None
        return TrainingPods((pod(1, "z1", cordoned), pod(2, "z2", None), pod(3, "z1", None)), 0, placed=True)

    def test_the_operators_fold_ranks_by_domain_and_holds_and_an_agents_fold_keeps_or_lifts_the_hold(
        self, server: Server
    ) -> None:
        leases = [node_lease(server, index) for index in (1, 2, 3)]
        for lease in leases:
            lease.update(Desire.JOIN)
        requests_shown(server, {node(1): Desire.JOIN, node(2): Desire.JOIN, node(3): Desire.JOIN})
        watch = shared(server.api, server.namespace, NAME).watch
        census = {"held": True}
        operator = Folder(
            server.api,
            server.namespace,
            NAME,
            identity="operator",
            preferred=True,
            rendezvous=watch,
            training_pods=lambda: self.census(census["held"]),
        )
        wait_until(lambda: operator.rendezvous.healthy, 30, "the folder's watch of the Rendezvous to list")
        assert operator.fold_once() is True
        status = server.read()["status"]
        assert dict(stored_document(server).participants) == {node(3): 0, node(2): 1}, "z1 before z2, node 1 held"
        assert status["topology"] == {
            "order": "Topology",
            "domains": [
                {"domain": "z1", "firstRank": 0, "lastRank": 0},
                {"domain": "z2", "firstRank": 1, "lastRank": 1},
            ],
        }
        reason = "NodeCordoned: Kubernetes node n1 is cordoned (spec.unschedulable)"
        assert status["heldCount"] == 1 and status["heldNodes"] == [{"node": str(node(1)), "reason": reason}]
        assert node(1) in stored_document(server).last_heartbeats and node(1) not in stored_document(server).wait_list

        leases[0].round = 1  # the held agent asks for the next round, as one overtaken by a round does
        leases[0].update(Desire.JOIN)
        wait_until(
            lambda: any(r.round == 1 for r in list_node_records(server.api, server.namespace, NAME)[0]), 30, "re-asked"
        )
        assert operator.fold_once() is False, "still held: nothing to write"
        agent = Folder(server.api, server.namespace, NAME, identity="agent/x", preferred=False, rendezvous=watch)
        assert agent.fold_once(keep_held=True) is False, "an agent beside the operator keeps the hold"
        assert agent.fold_once() is True, "an agent alone (no operator) admits it"
        assert stored_document(server).redundancy_list == {node(1)}, "a spare: the round of 2 is full"
        status = server.read()["status"]
        assert "heldNodes" not in status and status["spareCount"] == 1 and status["spares"] == [str(node(1))]
