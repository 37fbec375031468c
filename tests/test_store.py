"""KubernetesStore on the real API server: tensorplay's Store semantics, atomicity, blocking, ownership."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._kube.kubeapi import ApiUnavailableError, KubernetesApi, load_api_client
from kube_rendezvous._rules.adder_rules import ADDS_TO_LABEL, CounterValueError, counter_digest, request_name
from kube_rendezvous._store.prefixstore import KubernetesPrefixStore
from kube_rendezvous._store.store import KubernetesStore
from kubernetes import client
from tensorplay.distributed import HashStore, StoreTimeoutError

from tests.helpers import REPO, rendezvous_parameters, run_workers
from tests.testenv import ControlPlane, wait_until

GROUP, VERSION = "kube-rendezvous.io", "v1alpha1"


@pytest.fixture
def endpoint(namespace: str) -> str:
    return f"{namespace}/rdzv"


@pytest.fixture
def store(endpoint: str, agent_kubeconfig: Path) -> KubernetesStore:
    _, made = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
    return made


def key_objects(objects: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    listed: dict[str, Any] = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "rendezvouskeys")
    return list(listed["items"])


def add_request(store: KubernetesStore, key: str, request_id: str, amount: int) -> dict[str, Any]:
    """An add request on ``key`` as an agent creates it (the body of a RendezvousKey)."""
    counter = store.object_name(key)
    labels = {ADDS_TO_LABEL: counter_digest(counter), "kube-rendezvous.io/rendezvous-uid": store.rendezvous_uid}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RendezvousKey",
        "metadata": {"name": request_name(counter, request_id), "labels": labels},
        "spec": {"key": key, "value": base64.b64encode(str(amount).encode()).decode()},
    }


# The same script runs against tensorplay's in-process HashStore (the reference) and ours.
CONFORMANCE_SCRIPT: list[tuple[str, tuple[Any, ...]]] = [
    ("has", ("a",)),
    ("set", ("a", b"1")),
    ("get", ("a",)),
    ("has", ("a",)),
    ("set", ("a", "h\u00e9llo")),
    ("get", ("a",)),
    ("add", ("counter", 3)),
    ("add", ("counter", -1)),
    ("add", ("counter", 0)),
    ("get", ("counter",)),
    ("compare_and_swap", ("missing-cas", b"x", b"y")),
    ("has", ("missing-cas",)),
    ("compare_and_swap", ("cas", b"", b"first")),
    ("compare_and_swap", ("cas", b"wrong", b"second")),
    ("compare_and_swap", ("cas", b"first", b"second")),
    ("get", ("cas",)),
    ("compare_set", ("missing-cs", b"x", b"y")),
    ("has", ("missing-cs",)),
    ("compare_set", ("cs", b"", b"one")),
    ("compare_set", ("cs", b"nope", b"two")),
    ("compare_set", ("cs", b"one", b"two")),
    ("delete_key", ("not-there",)),
    ("delete_key", ("a",)),
    ("has", ("a",)),
    ("num_keys", ()),
    ("wait", (["counter", "cas"], 1.0)),
    ("wait", (["counter", "never"], 0.3)),
]


class TestStoreSemantics:
    def test_every_method_behaves_like_tensorplays_hash_store(self, store: KubernetesStore) -> None:
        reference = HashStore()
        for method, args in CONFORMANCE_SCRIPT:
            expected = getattr(reference, method)(*args)
            actual = getattr(store, method)(*args)
            assert actual == expected, f"{method}{args}: HashStore gave {expected!r}, KubernetesStore {actual!r}"

    @pytest.mark.parametrize("timeout", [0.5, timedelta(seconds=0.5)], ids=["seconds", "timedelta"])
    def test_get_of_a_missing_key_raises_store_timeout_error_at_the_deadline(
        self, store: KubernetesStore, timeout: float | timedelta
    ) -> None:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError, match="never-set"):
            store.get("never-set", timeout=timeout)
        assert time.monotonic() - started >= 0.45

    def test_get_without_timeout_uses_the_assignable_default(self, store: KubernetesStore) -> None:
        store.timeout = timedelta(seconds=0.5)
        assert store.timeout == timedelta(seconds=0.5)
        with pytest.raises(StoreTimeoutError):
            store.get("never-set")

    def test_empty_values_set_get_and_compare_and_swap_like_any_other(self, store: KubernetesStore) -> None:
        store.set("empty", b"")
        assert store.get("empty") == b""
        assert store.compare_and_swap("empty", b"", b"full") == (True, b"")
        assert store.compare_and_swap("empty", b"full", b"") == (True, b"full")
        assert store.get("empty") == b""
        assert store.compare_set("empty", b"", "") == b""

    def test_invalid_default_timeout_is_refused(self, store: KubernetesStore) -> None:
        with pytest.raises(ValueError, match="positive"):
            store.timeout = 0

    @pytest.mark.parametrize(
        "key",
        [
            "tp_elastic/rendezvous/run/0/tp_elastic/role_info/0",
            "UPPER and spaces",
            "\u00fcnic\u00f8de/\u2603",
            "k" * 2000,
        ],
        ids=["path", "spaces", "unicode", "long"],
    )
    def test_arbitrary_keys_round_trip(self, store: KubernetesStore, key: str) -> None:
        store.set(key, b"\x00\xffbinary")
        assert store.get(key) == b"\x00\xffbinary"
        assert store.has(key)

    def test_prefix_store_prefixes_keys_and_labels_them_with_its_round(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        view = KubernetesPrefixStore("tp_elastic/rendezvous/run/7", store, round_number=7)
        view.set("master_port", "1234")
        assert store.get("tp_elastic/rendezvous/run/7/master_port") == b"1234"
        assert view.get("master_port") == b"1234"
        assert view.add("n", 2) == 2
        assert view.wait(["master_port", "n"], 1)
        written = sorted(key_objects(objects, namespace), key=lambda item: item["spec"]["key"])
        assert [item["spec"]["key"] for item in written] == [
            "tp_elastic/rendezvous/run/7/master_port",
            "tp_elastic/rendezvous/run/7/n",
        ]
        assert all(item["metadata"]["labels"]["kube-rendezvous.io/round"] == "7" for item in written)

    def test_multi_get_reads_a_rounds_keys_in_one_list_and_waits_for_the_missing_one(
        self, store: KubernetesStore
    ) -> None:
        view = KubernetesPrefixStore("run/3", store, round_number=3)
        keys = [f"rank/{index}" for index in range(20)]
        view.multi_set(keys[:-1], [str(index).encode() for index in range(19)])
        before = store.stats["requests"]
        late = threading.Timer(0.5, view.set, (keys[-1], b"19"))
        late.start()
        try:
            values = view.multi_get(keys, timeout=10)
        finally:
            late.join()
        assert values == [str(index).encode() for index in range(20)]
        # One LIST for the 19 that were there, the late set, then the missing key's blocking get (one
        # GET before it waits on the watch, at most one after): not one request per key.
        assert store.stats["requests"] - before <= 4, store.stats["requests"] - before
        with pytest.raises(StoreTimeoutError):
            view.multi_get(["rank/0", "never"], timeout=0.5)

    def test_a_pipelined_view_sends_sets_side_by_side_and_later_calls_see_them(self, store: KubernetesStore) -> None:
        view = KubernetesPrefixStore("run/4", store, round_number=4, pipelined=True)
        for index in range(40):
            view.set(f"rank/{index}", str(index))
        view.set("rank/0", "again")  # a second set of a pending key waits for the first: last write wins
        assert view.get("rank/0") == b"again"
        assert view.multi_get([f"rank/{index}" for index in range(1, 40)]) == [
            str(index).encode() for index in range(1, 40)
        ]

    def test_a_pipelined_set_that_fails_is_raised_by_the_next_call_and_the_others_are_stored(
        self, store: KubernetesStore
    ) -> None:
        view = KubernetesPrefixStore("run/5", store, round_number=5, pipelined=True)
        view.set("small", "1")
        view.set("too-large", b"x" * (4 << 20))  # over the API server's request limit
        view.set("also-small", "2")
        with pytest.raises(RuntimeError, match="413 Request Entity Too Large"):
            view.flush()
        view.flush()  # reported once
        assert view.get("small") == b"1" and view.get("also-small") == b"2"
        assert not view.check(["too-large"])


class TestAtomicity:
    def test_concurrent_adds_from_several_processes_sum_exactly(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        processes, adds = 4, 20
        results = run_workers("add-to-key", processes, endpoint, str(agent_kubeconfig), "counter", str(adds))
        assert store.get("counter") == str(processes * adds).encode()
        every_value = sorted(value for result in results for value in result["values"])
        assert every_value == list(range(1, processes * adds + 1))  # each add saw a distinct total
        print(f"\n{processes}x{adds} adds: {sum(r['conflicts'] for r in results)} conflicts retried")

    def test_an_add_whose_request_was_created_though_its_answer_was_lost_adds_once(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A loaded API server commits a create and answers 504 (or the answer is lost); the retry gets 409
        # AlreadyExists. CI saw 4 processes x 20 adds sum to 82 so: the adder took its request, which its
        # watch did not show yet, for one deleted unfolded and added again with a second request.
        assert store.add("counter", 1) == 1  # makes the key watch
        watch = store.key_watch
        assert watch is not None
        api, cache = store._api, watch.cache
        wait_until(lambda: cache.healthy, timeout=30, what="the key watch listed")  # adds combine from here
        lost: list[str] = []
        send, deliver = api.request, cache.apply_event

        def answer_lost(method: str, path: str, **kwargs: Any) -> Any:
            answer = send(method, path, **kwargs)
            name = str(((kwargs.get("body") or {}).get("metadata") or {}).get("name", ""))
            if method == "POST" and ".a-" in name and not lost:
                lost.append(name)
                raise ApiUnavailableError(f"POST {path}: ReadTimeoutError: the answer was lost")
            return answer

        def late(kind: str, obj: dict[str, Any]) -> None:  # the watch shows the lost request late: never here
            if not (kind == "ADDED" and obj["metadata"]["name"] in lost):
                deliver(kind, obj)

        monkeypatch.setattr(api, "request", answer_lost)
        monkeypatch.setattr(cache, "apply_event", late)
        assert store.add("counter", 1) == 2
        assert lost, "the injection never ran: no add request was created"
        monkeypatch.undo()  # the answers and the watch are whole again; a list shows every request
        cache.refresh()
        wait_until(
            lambda: sorted(name for name in cache.objects() if ".a-" in name) == self._add_requests(store),
            timeout=30,
            what="the key watch listed again",
        )
        assert store.add("counter", 1) == 3  # a stray first request would fold in here too: 4
        assert store.get("counter") == b"3"
        wait_until(
            lambda: not self._add_requests(store),
            timeout=30,
            what="every add request deleted",
            explain=lambda: str(self._add_requests(store)),
        )

    @staticmethod
    def _add_requests(store: KubernetesStore) -> list[str]:
        path = f"/apis/kube-rendezvous.io/v1alpha1/namespaces/{store.namespace}/rendezvouskeys"
        listed = store._api.request("GET", path)
        return sorted(
            each["metadata"]["name"] for each in listed["items"] if ADDS_TO_LABEL in each["metadata"]["labels"]
        )

    def test_an_add_whose_watch_stopped_delivering_lists_again_and_completes(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # An API server whose watch cache fell behind etcd keeps the watch open and silent: the adder's
        # view of the counter stays old, and a fold on it loses every compare-and-swap (CI saw an add
        # wait out the whole 300 s store timeout so).
        assert store.add("counter", 1) == 1
        cache = store._key_cache()
        assert cache is not None
        monkeypatch.setattr(cache, "apply_event", lambda kind, obj: None)  # the watch delivers nothing more
        run_workers("add-to-key", 1, endpoint, str(agent_kubeconfig), "counter", "5")
        store.timeout = 60
        assert store.add("counter", 1) == 7
        assert store.stats["stale_refreshes"] >= 1

    def test_an_exit_barrier_of_many_agents_on_one_counter_costs_about_two_requests_each(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        # torch's and tensorplay's exit barrier: every agent adds 1 to one key, then waits for the last.
        agents = 48
        stores = [create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))[1] for _ in range(agents)]
        counts: list[int] = []
        gate = threading.Barrier(agents)

        def check_in(each: KubernetesStore) -> None:
            gate.wait()
            counts.append(each.add("exit/num_members", 1))

        threads = [threading.Thread(target=check_in, args=(each,)) for each in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert sorted(counts) == list(range(1, agents + 1))
        requests = sum(each.stats["requests"] for each in stores)
        folds = sum(each.stats["folds"] for each in stores)
        # A compare-and-swap of the counter per add costs O(N log N) requests even with back-off
        # (O(N^2) without); a combining add costs its own request's create and delete, plus a
        # share of the folds, each of which writes every add pending at that moment.
        print(f"\n{agents} agents on one counter: {requests} requests, {folds} folds")
        assert requests <= 3 * agents
        assert folds < agents / 2
        assert store.get("exit/num_members") == str(agents).encode()

    @pytest.mark.parametrize("orphan_id", ["000000000000", "ffffffffffff"])
    def test_an_add_whose_adder_died_before_its_fold_is_folded_by_the_next_adder(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str, orphan_id: str
    ) -> None:
        # An agent SIGKILLed between creating its add request and seeing it folded: the request
        # stays, and counts. With the smallest id it is the one expected to fold, so the next adder
        # folds it after waiting FOLD_PATIENCE_SECONDS; with the largest, at once.
        store.start_watch()
        orphan = add_request(store, "exit/arrived", orphan_id, 5)
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "rendezvouskeys", orphan)
        cache = store._key_cache()
        assert cache is not None
        wait_until(lambda: cache.get(orphan["metadata"]["name"]) is not None, 10, "the watch shows the orphan")
        # Folded in id order, with the orphan: after it (5 + 1) or before it (1, then the orphan's 6).
        assert store.add("exit/arrived", 1) == (6 if orphan_id == "000000000000" else 1)
        assert store.get("exit/arrived") == b"6"
        assert store.add("exit/arrived", 1) == 7  # the orphan is not added twice
        # The orphan stays (nobody knows that its adder will never read its value) until the
        # counter, its round or the Rendezvous goes; it is not a key.
        left = sorted(item["metadata"]["name"] for item in key_objects(objects, namespace))
        assert left == sorted([store.object_name("exit/arrived"), orphan["metadata"]["name"]])
        assert store.num_keys() == 1

    def test_an_add_to_a_key_that_holds_no_integer_names_the_key_and_loses_nothing(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        store.start_watch()
        store.set("role", b"trainer")
        with pytest.raises(CounterValueError, match=r"add\('role'\): the key holds b'trainer', not an integer"):
            store.add("role", 1)
        assert store.get("role") == b"trainer"
        assert len(key_objects(objects, namespace)) == 1  # its add request went too: it never folds later
        store.set("role", b"41")
        assert store.add("role", 1) == 42

    def test_deleting_a_counter_deletes_the_adds_still_pending_on_it(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        store.start_watch()
        assert store.add("n", 3) == 3
        pending = add_request(store, "n", "000000000000", 100)  # never folded: nobody adds meanwhile
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "rendezvouskeys", pending)
        assert store.num_keys() == 1  # an add request is not a key
        store.delete_key("n")
        assert key_objects(objects, namespace) == []
        assert store.add("n", 1) == 1  # a new counter: the deleted key's pending add is gone with it

    def test_concurrent_compare_and_swap_has_exactly_one_winner(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.workers",
                    "claim-key",
                    endpoint,
                    str(agent_kubeconfig),
                    "leader",
                    f"p{i}",
                ],
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        results = [json.loads(process.communicate(timeout=120)[0].splitlines()[-1]) for process in processes]
        winners = [index for index, result in enumerate(results) if result["swapped"]]
        assert len(winners) == 1
        assert store.get("leader") == f"p{winners[0]}".encode()
        assert all(result["previous"] == f"p{winners[0]}" for result in results if not result["swapped"])


class TestBlockingCalls:
    def test_blocking_get_in_another_process_wakes_after_a_set(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        waiter = subprocess.Popen(
            [sys.executable, "-m", "tests.workers", "get-key", endpoint, str(agent_kubeconfig), "late", "60"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert waiter.stdout is not None
        assert json.loads(waiter.stdout.readline()) == {"ready": True}
        store.set("late", "arrived")
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == 0
        assert json.loads(out.splitlines()[-1])["value"] == "arrived"

    def test_a_blocking_get_is_woken_by_its_watch_when_another_client_sets_the_key(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        _, waiter = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
        outcome: list[bytes] = []
        thread = threading.Thread(target=lambda: outcome.append(waiter.get("late", timeout=60)))
        thread.start()
        wait_until(lambda: waiter.stats["shared_waits"] == 1, 10, "the get to wait on the shared watch")
        store.set("late", "arrived")
        thread.join(60)
        assert outcome == [b"arrived"]
        assert waiter.stats["watch_wakeups"] == 1  # the watch event woke it, not a read
        assert waiter.stats["requests"] == 2  # a GET before and after; no list or watch of its own

    def test_blocking_calls_of_many_stores_share_one_watch_and_list_or_watch_nothing_of_their_own(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        waiters = [create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))[1] for _ in range(16)]
        outcome: list[bytes | bool] = []
        calls = [lambda w=w: w.get("address", timeout=60) for w in waiters]
        calls += [lambda w=w: w.wait(["address"], 60) for w in waiters]
        calls += [lambda w=w: w.get_written_once("address", 60) for w in waiters]
        threads = [threading.Thread(target=lambda call=call: outcome.append(call())) for call in calls]
        for thread in threads:
            thread.start()
        wait_until(lambda: sum(w.stats["shared_waits"] for w in waiters) == 48, 20, "every call to wait")
        store.set("address", "10.0.0.1:29500")
        for thread in threads:
            thread.join(60)
        assert sorted(map(str, outcome)) == sorted(["b'10.0.0.1:29500'"] * 32 + ["True"] * 16)
        # a get reads before and after, a wait and a read of a written-once key not at all; no list or
        # watch per call
        assert sum(w.stats["requests"] for w in waiters) == 32
        assert all(w._key_cache() is waiters[0]._key_cache() for w in waiters)

    def test_a_deleted_key_is_waited_for_again_once_the_watch_shows_the_deletion(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        _, reader = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
        store.set("reused", "old")
        assert reader.get("reused", timeout=10) == b"old"
        store.delete_key("reused")
        cache = reader._key_cache()
        assert cache is not None
        wait_until(lambda: cache.get(store.object_name("reused")) is None, 10, "the watch to show the deletion")
        outcome: list[bytes] = []
        thread = threading.Thread(target=lambda: outcome.append(reader.get("reused", timeout=60)))
        thread.start()
        wait_until(lambda: reader.stats["shared_waits"] == 1, 10, "the get to wait for the key to come back")
        store.set("reused", "new")
        thread.join(60)
        assert outcome == [b"new"]

    def test_without_permission_to_watch_the_keys_blocking_calls_read_again_until_the_key_is_there(
        self, store: KubernetesStore, endpoint: str, control_plane: ControlPlane, admin_api: client.ApiClient
    ) -> None:
        namespace = endpoint.split("/")[0]
        rules = [
            client.V1PolicyRule(
                api_groups=["kube-rendezvous.io"], resources=["rendezvouses"], verbs=["get", "list", "watch"]
            ),
            client.V1PolicyRule(
                api_groups=["kube-rendezvous.io"], resources=["rendezvouskeys"], verbs=["get", "create"]
            ),
        ]
        rbac = client.RbacAuthorizationV1Api(admin_api)
        rbac.create_namespaced_role(
            namespace, client.V1Role(metadata=client.V1ObjectMeta(name="no-watch"), rules=rules)
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="no-watch"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="no-watch"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="no-watch", namespace=namespace)],
            ),
        )
        kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "no-watch")
        api = KubernetesApi(load_api_client(str(kubeconfig), None)[0])
        path = f"/apis/kube-rendezvous.io/v1alpha1/namespaces/{namespace}/rendezvouses/rdzv"
        wait_until(lambda: api.request("GET", path), 30, "RBAC to apply")
        # A process of its own: in this one, the store's key watch (allowed) would be shared.
        waiter = subprocess.Popen(
            [sys.executable, "-m", "tests.workers", "get-key", endpoint, str(kubeconfig), "late", "60"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiter.stdout is not None and json.loads(waiter.stdout.readline()) == {"ready": True}
        assert waiter.stderr is not None
        errors: list[str] = []
        reader = threading.Thread(target=lambda: errors.extend(waiter.stderr or []), daemon=True)
        reader.start()
        # The key is set only once the waiter is blocked and has said why it reads again instead of
        # watching; set earlier, its first read could simply find it (seen under CI load).
        wait_until(lambda: any("cannot watch" in line for line in errors), 30, "the waiter to find it cannot watch")
        store.set("late", "arrived")
        out = waiter.stdout.read()
        waiter.wait(60)
        reader.join(10)
        assert waiter.returncode == 0, "".join(errors)[-2000:]
        assert json.loads(out.strip().splitlines()[-1])["value"] == "arrived"

    def test_wait_for_several_keys_returns_once_all_exist(
        self, store: KubernetesStore, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        _, waiter = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
        outcome: list[bool] = []
        thread = threading.Thread(target=lambda: outcome.append(waiter.wait(["x", "y"], 30)))
        thread.start()
        wait_until(lambda: waiter.stats["shared_waits"] == 1, 10, "the wait to start")
        store.set("x", "1")
        store.set("y", "2")
        thread.join(40)
        assert outcome == [True]
        assert waiter.stats["requests"] == 0  # answered by the shared watch

    def test_a_wait_that_spans_an_api_server_restart_still_returns_the_value(
        self, store: KubernetesStore, control_plane: ControlPlane, endpoint: str, agent_kubeconfig: Path
    ) -> None:
        outcome: list[bytes | BaseException] = []

        def blocking_get() -> None:
            try:
                outcome.append(store.get("after-restart", timeout=120))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                outcome.append(exc)

        thread = threading.Thread(target=blocking_get)
        thread.start()
        wait_until(lambda: store.stats["shared_waits"] == 1, 10, "the get to wait on the shared watch")
        cache = store._key_cache()
        assert cache is not None
        lists = cache.stats["lists"]
        control_plane.restart_apiserver(downtime=2)
        _, writer = create_backend(rendezvous_parameters(endpoint, agent_kubeconfig))
        writer.set("after-restart", "survived")
        thread.join(120)
        assert outcome == [b"survived"]
        assert cache.stats["lists"] > lists  # the shared watch broke with the server and listed again


class TestOwnershipAndIsolation:
    def test_store_traffic_leaves_the_rendezvous_resource_version_unchanged(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        def resource_version() -> str:
            found: dict[str, Any] = objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "rendezvouses", "rdzv"
            )
            return str(found["metadata"]["resourceVersion"])

        before = resource_version()
        store.set("a", "1")
        store.add("b", 5)
        store.compare_and_swap("c", b"", b"x")
        store.delete_key("a")
        store.wait(["b"], 1)
        assert resource_version() == before

    def test_keys_are_garbage_collected_with_their_rendezvous(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        store.set("a", "1")
        store.set("b", "2")
        assert len(key_objects(objects, namespace)) == 2
        objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, "rendezvouses", "rdzv")
        wait_until(lambda: key_objects(objects, namespace) == [], 60, "the garbage collector to delete the keys")

    def test_keys_of_finished_rounds_are_deleted_and_the_rest_kept(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        for round_number in range(5):
            KubernetesPrefixStore(f"r/{round_number}", store, round_number=round_number).set("k", "v")
        store.set("no-round", "kept")
        store.delete_rounds_except([3, 4])
        remaining = sorted(item["spec"]["key"] for item in key_objects(objects, namespace))
        assert remaining == ["no-round", "r/3/k", "r/4/k"]

    def test_stores_of_two_rendezvous_do_not_see_each_others_keys(
        self, store: KubernetesStore, namespace: str, agent_kubeconfig: Path
    ) -> None:
        _, other = create_backend(rendezvous_parameters(f"{namespace}/other", agent_kubeconfig))
        store.set("shared-name", "mine")
        assert not other.has("shared-name")
        assert other.num_keys() == 0
