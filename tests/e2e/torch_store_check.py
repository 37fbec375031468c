"""Exercise ``TorchKubernetesStore`` under torch's own C++ ``PrefixStore``, in a process without tensorplay.

    python -m tests.e2e.torch_store_check <namespace>/<name> <kubeconfig> [<random sequences>]

tensorplay and torch cannot share a process, and the test session has tensorplay loaded, so the
test runs this as a subprocess. Exits non-zero (an assertion) on the first call that misbehaves;
prints ``ok`` at the end.
"""

import random
import sys
from datetime import timedelta

import torch.distributed as dist
from kube_rendezvous._adapters.torchrun import TorchKubernetesStore, torch_framework
from kube_rendezvous._engine.backend import create_backend
from torch.distributed.elastic.rendezvous import RendezvousParameters

endpoint, kubeconfig = sys.argv[1], sys.argv[2]
params = RendezvousParameters("k8s", endpoint, "job-1", 1, 4, kubeconfig=kubeconfig)
_, kv = create_backend(params, torch_framework())
# Keep the Python store alive while C++ uses it (pybind11 finds the overrides through it), as the
# elastic agent does by holding RendezvousInfo.store.
inner = TorchKubernetesStore(kv)
store = dist.PrefixStore("job/0", inner)
store.set("a", "1")
assert store.get("a") == b"1"
assert store.add("n", 2) == 2 and store.add("n", 3) == 5
assert store.compare_set("c", "", "x") == b"x"
assert store.compare_set("c", "x", "y") == b"y"
store.multi_set(["m1", "m2"], ["v1", "v2"])
assert store.multi_get(["m1", "m2"]) == [b"v1", b"v2"]
store.append("log", "ab")
store.append("log", "cd")
assert store.get("log") == b"abcd"
assert store.check(["a", "m1"]) and not store.check(["missing"])
store.wait(["a", "m2"])
store.wait(["a"], timedelta(seconds=5))
store.set_timeout(timedelta(seconds=1))
for call in (lambda: store.get("never-set"), lambda: store.wait(["never-set"], timedelta(seconds=1))):
    try:
        call()
    except dist.DistStoreError:
        pass
    else:
        raise AssertionError("a blocking call on a missing key did not raise DistStoreError")
# delete_key and num_keys through the C++ PrefixStore (its trampoline calls deleteKey and getNumKeys).
assert store.delete_key("a") is True and store.delete_key("a") is False
assert store.num_keys() >= 5
assert kv.has("job/0/m1")  # the C++ prefix reaches the Kubernetes store
# compare_set on a missing key, as torch's own stores answer it.
assert store.compare_set("fresh", "not-there", "x") == b"not-there" and not store.check(["fresh"])
# torch's own self-test of a Python store through its C++ trampoline: adds, sets, gets, then clone().
dist._test_python_store(inner)

# Random sequences, op for op, against torch's own TCPStore, both through a C++ PrefixStore.
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
for seed in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
    rng = random.Random(seed)
    ours, theirs = dist.PrefixStore(f"random/{seed}", inner), dist.PrefixStore(f"random/{seed}", server)
    present: set[str] = set()
    for step in range(60):
        key = rng.choice(["k0", "k1", "k2", "k3"])
        counter = rng.choice(["n0", "n1"])
        op = rng.choice(["set", "get", "add", "compare_set", "check", "delete_key", "append", "multi"])
        if op == "set":
            value = rng.choice(["", "a", "bb", "xyz"])
            results = [each.set(key, value) for each in (ours, theirs)]
            present.add(key)
        elif op == "get":
            if key not in present:
                continue  # a missing key blocks until the timeout in both
            results = [each.get(key) for each in (ours, theirs)]
        elif op == "add":
            amount = rng.randint(-3, 5)
            results = [each.add(counter, amount) for each in (ours, theirs)]
        elif op == "compare_set":
            expected, desired = rng.choice(["", "a", "bb"]), rng.choice(["a", "bb", "c"])
            results = [each.compare_set(key, expected, desired) for each in (ours, theirs)]
            if theirs.check([key]):
                present.add(key)
        elif op == "check":
            results = [each.check([key, counter]) for each in (ours, theirs)]
        elif op == "delete_key":
            results = [each.delete_key(key) for each in (ours, theirs)]
            present.discard(key)
        elif op == "append":
            results = [each.append(key, "+") for each in (ours, theirs)]
            present.add(key)
        else:
            keys = sorted(present)[:3]
            values = [rng.choice(["p", "q"]) for _ in keys]
            results = [(each.multi_set(keys, values), each.multi_get(keys)) for each in (ours, theirs)]
        assert results[0] == results[1], (
            f"seed {seed} step {step}: {op} {key} {counter}: ours {results[0]!r}, TCPStore {results[1]!r}"
        )
print("ok", flush=True)
