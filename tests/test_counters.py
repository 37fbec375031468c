"""``Counters``, the agent side's one public stats object, and where the counts are read through public names."""

from __future__ import annotations

import pytest
from kube_rendezvous import Counters, KubernetesApi, KubernetesStore, WatchCache
from kubernetes import client

pytestmark = pytest.mark.pure


def test_counts_are_added_and_read_as_a_mapping() -> None:
    counters = Counters("requests", "conflicts")
    counters.add("requests")
    counters.add("requests", 2)
    assert counters["requests"] == 3 and dict(counters) == {"requests": 3, "conflicts": 0}
    snapshot = counters.snapshot()
    counters.add("conflicts")
    assert snapshot == {"requests": 3, "conflicts": 0}  # a snapshot does not move
    assert counters.get("conflicts") == 1 and list(counters.items()) == [("requests", 3), ("conflicts", 1)]


def test_a_name_it_does_not_count_is_an_error() -> None:
    counters = Counters("requests")
    with pytest.raises(KeyError):
        counters.add("reqeusts")
    with pytest.raises(TypeError):
        counters["requests"] = 5  # type: ignore[index]  # read-only: counted with add


def test_the_agent_sides_objects_count_in_counters() -> None:
    """The API client, a watch and the store each count in their public ``stats`` (nothing is sent here)."""
    api = KubernetesApi(client.ApiClient())
    cache = WatchCache(api, "/api/v1/namespaces/a/configmaps", {}, "configmaps of a")
    store = KubernetesStore(api, "a", "rdzv", "uid-1")
    assert isinstance(api.stats, Counters) and set(api.stats) >= {"requests", "conflicts", "bytes_sent"}
    assert isinstance(cache.stats, Counters) and set(cache.stats) == {"lists", "watches", "events"}
    assert isinstance(store.stats, Counters) and store.stats["requests"] == 0
    assert store.key_watch is None  # reading it starts no watch
