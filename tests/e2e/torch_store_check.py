"""Exercise ``TorchKubernetesStore`` under torch's own C++ ``PrefixStore``, in a process without tensorplay.

    python -m tests.e2e.torch_store_check <namespace>/<name> <kubeconfig>

tensorplay and torch cannot share a process, and the test session has tensorplay loaded, so the
test runs this as a subprocess. Exits non-zero (an assertion) on the first call that misbehaves;
prints ``ok`` at the end.
"""

import sys
from datetime import timedelta

import torch.distributed as dist
from kube_rendezvous import frameworks
from kube_rendezvous.factory import create_backend
from kube_rendezvous.torchrun import TorchKubernetesStore
from torch.distributed.elastic.rendezvous import RendezvousParameters

endpoint, kubeconfig = sys.argv[1], sys.argv[2]
params = RendezvousParameters("k8s", endpoint, "job-1", 1, 4, kubeconfig=kubeconfig)
_, kv = create_backend(params, frameworks.torch())
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
# torch's C++ trampoline forwards neither deleteKey nor getNumKeys to Python; called from Python they work.
assert inner.delete_key("job/0/a") is True and inner.delete_key("job/0/a") is False
assert inner.num_keys() >= 5
assert kv.has("job/0/m1")  # the C++ prefix reaches the Kubernetes store
print("ok", flush=True)
