"""Keys written once, together (``KubernetesStore.write_once``, ``bundles``): a round's rank assignment.

The pure half checks how keys are split into bundles and indexed from the watch; the rest runs on the
real API server: one object for N keys, readers in this process and in another, exactly once, and the
round's view gathering the rank keys of a framework's ``_assign_worker_ranks`` into one bundle.
"""

from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._store import bundles
from kube_rendezvous._store.bundles import BUNDLE_KEYS, BUNDLED_VALUE_BYTES, BundledKeys, split
from kube_rendezvous._store.prefixstore import KubernetesPrefixStore
from kube_rendezvous._store.store import KubernetesStore
from kubernetes import client
from tensorplay.distributed import StoreTimeoutError

from tests.helpers import REPO, rendezvous_parameters

GROUP, VERSION = "kube-rendezvous.io", "v1alpha1"
#: The prefixes the adapters declare written once, as each framework spells them: its bootstrap address
#: (``RendezvousStoreInfo.build``, in rendezvous/api.py) and its rank assignment (``_assign_worker_ranks``).
WRITTEN_ONCE = {
    "tensorplay": ("tp_elastic/rdzv/master_", "tp_elastic/role_info/", "tp_elastic/assigned_ranks/"),
    "torch": ("MASTER_ADDR", "MASTER_PORT", "torchelastic/role_info/", "torchelastic/assigned_ranks/"),
}


def bundle(name: str, entries: dict[str, bytes]) -> dict[str, Any]:
    encoded = {key: base64.b64encode(value).decode() for key, value in entries.items()}
    return {"metadata": {"name": name}, "spec": {"key": "k", "value": "", "entries": encoded}}


class TestSplit:
    def test_small_values_share_one_bundle_and_a_large_one_goes_alone(self) -> None:
        pairs = [(f"k{index}", b"v" * 10) for index in range(5)] + [("big", b"x" * (BUNDLED_VALUE_BYTES + 1))]
        made, alone = split(pairs)
        assert len(made) == 1 and sorted(made[0]) == [f"k{index}" for index in range(5)]
        assert base64.b64decode(made[0]["k0"]) == b"v" * 10
        assert alone == [("big", b"x" * (BUNDLED_VALUE_BYTES + 1))]

    def test_bundles_stay_within_the_crds_bounds(self) -> None:
        made, alone = split((f"key/{index}", b"[1, 2, 3, 4]") for index in range(BUNDLE_KEYS + 10))
        assert [len(entries) for entries in made] == [BUNDLE_KEYS, 10] and not alone
        big, alone = split((f"key/{index}", b"v" * BUNDLED_VALUE_BYTES) for index in range(400))
        assert all(
            sum(len(key) + len(value) for key, value in entries.items()) <= bundles.BUNDLE_BYTES for entries in big
        )
        assert sum(len(entries) for entries in big) == 400 and not alone

    def test_a_lone_key_is_written_as_its_own_object_not_as_a_bundle_of_one(self) -> None:
        assert split([("only", b"1")]) == ([], [("only", b"1")])
        assert split([]) == ([], [])
        big = ("big", b"x" * (BUNDLED_VALUE_BYTES + 1))
        made, alone = split([big] + [(f"k{i}", b"v") for i in range(BUNDLE_KEYS + 1)])  # one key left over
        assert [len(entries) for entries in made] == [BUNDLE_KEYS] and alone == [big, (f"k{BUNDLE_KEYS}", b"v")]
        assert split([("a", b"1"), ("a", b"2")]) == ([], [("a", b"2")])  # a key given twice is one key


class TestBundledKeys:
    def test_keys_appear_with_their_bundle_and_go_with_it(self) -> None:
        index = BundledKeys()
        index.changed(bundle("b1", {"a": b"1", "b": b""}), True)
        assert index.get("a") == b"1" and index.get("b") == b"" and index.get("c") is None
        index.changed(bundle("b1", {"a": b"1", "b": b""}), False)  # deleted
        assert index.get("a") is None

    def test_a_list_replaces_everything_and_objects_without_entries_are_no_bundles(self) -> None:
        index = BundledKeys()
        index.changed(bundle("b1", {"a": b"1", "b": b"2"}), True)
        plain = {"metadata": {"name": "k"}, "spec": {"key": "x", "value": "MQ=="}}
        index.changed(None, False, [bundle("b2", {"c": b"3", "d": b"4"}), plain])
        assert index.get("a") is None and index.get("c") == b"3" and index.get("x") is None

    def test_entries_that_are_not_base64_are_ignored(self) -> None:
        index = BundledKeys()
        hostile = {"metadata": {"name": "h"}, "spec": {"entries": {"a": "not base64!", "b": "MQ=="}}}
        index.changed(hostile, True)
        assert index.get("a") is None and index.get("b") is None


def test_the_written_once_prefixes_are_the_keys_each_framework_writes_once_per_round() -> None:
    """Each adapter names them (the frameworks keep most as locals): read from the installed sources."""
    frameworks_source = "".join(
        (REPO / "backend/kube_rendezvous/_adapters" / name).read_text() for name in ("tensorplay.py", "torchrun.py")
    )
    for package, prefixes in WRITTEN_ONCE.items():
        spec = importlib.util.find_spec(package)  # not the submodules: that would import the package
        assert spec is not None and spec.submodule_search_locations
        elastic = Path(spec.submodule_search_locations[0]) / "distributed/elastic"
        agent = (elastic / "agent/server/api.py").read_text()
        ranks = agent[agent.index("def _assign_worker_ranks") :]
        ranks = ranks[: ranks.index("\n    def ", 10)]
        rendezvous = (elastic / "rendezvous/api.py").read_text()
        build = rendezvous[rendezvous.index("class RendezvousStoreInfo") :]
        for prefix in prefixes:
            assert f'"{prefix}' in ranks + build, f"{package} no longer writes {prefix} once per round"
        assert f"written_once={prefixes!r}".replace("'", '"') in frameworks_source, package


@pytest.fixture
def store(namespace: str, agent_kubeconfig: Path) -> KubernetesStore:
    _, made = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig))
    return made


def key_objects(objects: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    listed: dict[str, Any] = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "rendezvouskeys")
    return list(listed["items"])


class TestOnTheServer:
    def test_n_keys_written_once_cost_one_object_and_one_request_and_read_back_without_requests(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        keys = [f"assigned/{index}" for index in range(1024)]
        values = [f"[{2 * index}, 2048, {2 * index}, 2048]".encode() for index in range(1024)]
        store.start_watch()
        before = store.stats["requests"]
        store.write_once(keys, values, round_number=3)
        assert store.stats["requests"] - before == 1
        (written,) = key_objects(objects, namespace)
        assert written["metadata"]["labels"]["kube-rendezvous.io/round"] == "3"
        assert len(written["spec"]["entries"]) == 1024 and written["spec"]["value"] == ""

        before = store.stats["requests"]
        assert store.multi_get(keys, timeout=5, written_once=True) == values
        assert store.get_written_once("assigned/7") == values[7]
        assert store.stats["requests"] == before  # the watch shows them: no request
        assert store.get("assigned/1023") == values[1023]  # a GET (404), then the bundle: its only value
        assert store.has("assigned/5") and not store.has("assigned/5000")
        assert store.num_keys() == 1024

    def test_writing_the_same_bundle_again_after_a_lost_answer_is_a_no_op(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        keys, values = ["r/0", "r/1", "r/2"], [b"a", b"b", b"c"]
        store.write_once(keys, values)
        store.write_once(keys, values)  # as a retry whose first answer never came: 409, done
        assert len(key_objects(objects, namespace)) == 1
        assert store.multi_get(keys, timeout=5, written_once=True) == values

    def test_a_reader_in_another_process_waits_for_a_bundle_and_reads_it_from_its_watch(
        self, store: KubernetesStore, namespace: str, agent_kubeconfig: Path
    ) -> None:
        script = (
            "import sys\n"
            "from kube_rendezvous import create_backend\n"
            "from tests.helpers import rendezvous_parameters\n"
            f"_, store = create_backend(rendezvous_parameters({namespace + '/rdzv'!r}, {str(agent_kubeconfig)!r}))\n"
            "store.start_watch()\n"
            "print('ready', flush=True)\n"
            "values = store.multi_get([f'k/{i}' for i in range(50)], timeout=60, written_once=True)\n"
            "print(store.get('k/49').decode(), len(values), store.stats['requests'], flush=True)\n"
        )
        reader = subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline().strip() == "ready"
            store.write_once([f"k/{index}" for index in range(50)], [str(index) for index in range(50)])
            out, err = reader.communicate(timeout=60)
        finally:
            reader.kill()
        value, count, requests = out.split()
        assert (value, count) == ("49", "50"), err
        assert int(requests) <= 3, err  # the multi_get cost none; the get one GET (404) before the bundle

    def test_a_written_once_key_never_written_times_out_with_the_frameworks_error(self, store: KubernetesStore) -> None:
        store.write_once(["a/0", "a/1"], [b"0", b"1"])
        began = time.monotonic()
        with pytest.raises(StoreTimeoutError, match="a/2"):
            store.multi_get(["a/0", "a/1", "a/2"], timeout=0.5, written_once=True)
        assert time.monotonic() - began < 5

    def test_a_rounds_view_gathers_the_frameworks_rank_keys_into_one_bundle(
        self, store: KubernetesStore, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        """tensorplay's rank 0 sets every agent's ranks one by one; torch's calls multi_set: one object either way."""
        once = WRITTEN_ONCE["tensorplay"]
        view = KubernetesPrefixStore("tp/run/2", store, round_number=2, pipelined=True, written_once=once)
        for index in range(300):
            view.set(f"tp_elastic/assigned_ranks/{index}", f"[{index}]")
        view.set("other", "1")  # not written once: its own object
        assert view.get("tp_elastic/assigned_ranks/299") == b"[299]"
        view.multi_set([f"tp_elastic/role_info/{index}" for index in range(300)], ["r"] * 300)
        assert view.multi_get([f"tp_elastic/role_info/{index}" for index in range(300)]) == [b"r"] * 300
        view.flush()
        written = key_objects(objects, namespace)
        assert sorted(len(item["spec"].get("entries") or {}) for item in written) == [0, 300, 300]

    def test_gathered_sets_are_sent_after_the_linger_even_if_the_caller_makes_no_other_call(
        self, store: KubernetesStore, namespace: str, agent_kubeconfig: Path
    ) -> None:
        once = WRITTEN_ONCE["torch"]
        view = KubernetesPrefixStore("t/run/1", store, round_number=1, pipelined=True, written_once=once)
        view.set("torchelastic/assigned_ranks/0", "x")
        view.set("torchelastic/assigned_ranks/1", "y")
        _, other = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig))
        assert other.get_written_once("t/run/1/torchelastic/assigned_ranks/1", timeout=10) == b"y"
