"""Worker processes for the concurrency tests: ``python -m tests.workers <command> ...``.

Each prints one JSON line with what it did, and exits non-zero on failure.
"""

from __future__ import annotations

import json
import pickle
import sys
import time

from kube_rendezvous.factory import create_backend
from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

from tests.helpers import rendezvous_parameters


def increment_state(endpoint: str, kubeconfig: str, increments: str) -> dict[str, object]:
    """Add 1 to the state's round ``increments`` times by read-modify-write through set_state."""
    backend, _ = create_backend(rendezvous_parameters(endpoint, kubeconfig))
    attempts = 0
    for _ in range(int(increments)):
        current = backend.get_state()
        while True:
            attempts += 1
            state = _RendezvousState() if current is None else pickle.loads(current[0])
            state.round += 1
            result = backend.set_state(pickle.dumps(state), None if current is None else current[1])
            assert result is not None or current is None
            if result is not None and result[2]:
                break
            current = None if result is None else (result[0], result[1])
    return {"attempts": attempts, "conflicts": attempts - int(increments)}


def add_to_key(endpoint: str, kubeconfig: str, key: str, count: str) -> dict[str, object]:
    """Call store.add(key, 1) ``count`` times."""
    _, store = create_backend(rendezvous_parameters(endpoint, kubeconfig))
    values = [store.add(key, 1) for _ in range(int(count))]
    return {"values": values, "conflicts": store.stats["conflicts"]}


def get_key(endpoint: str, kubeconfig: str, key: str, timeout: str) -> dict[str, object]:
    """Blocking store.get(key); report the value and the wall-clock time it returned."""
    _, store = create_backend(rendezvous_parameters(endpoint, kubeconfig))
    print(json.dumps({"ready": True}), flush=True)
    value = store.get(key, timeout=float(timeout))
    return {"value": value.decode(), "returned_at": time.time()}


def claim_key(endpoint: str, kubeconfig: str, key: str, claimant: str) -> dict[str, object]:
    """Try to claim ``key`` with compare_and_swap(key, b"", claimant)."""
    _, store = create_backend(rendezvous_parameters(endpoint, kubeconfig))
    swapped, previous = store.compare_and_swap(key, b"", claimant.encode())
    return {"swapped": swapped, "previous": previous.decode()}


COMMANDS = {"claim-key": claim_key, "increment-state": increment_state, "add-to-key": add_to_key, "get-key": get_key}

if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])), flush=True)
