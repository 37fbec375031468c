"""Worker processes for the concurrency tests: ``python -m tests.workers <command> ...``.

Each prints one JSON line with what it did, and exits non-zero on failure.
"""

from __future__ import annotations

import json
import pickle
import sys
import time

from kube_rendezvous import create_backend
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


# -- fault-injection histories (tests/test_faults.py) ------------------------------------------


def fault_mix(
    endpoint: str,
    kubeconfig: str,
    worker: str,
    operations: str,
    seed: str,
    go_file: str,
    history_file: str,
    request_timeout: str,
    retry_timeout: str,
) -> dict[str, object]:
    """Run a random mix of store add, store CAS-chain and state CAS operations; record a history.

    Prints ``{"ready": true}`` once connected, starts when ``go_file`` exists, and writes one
    entry per operation to ``history_file`` (JSON): ``op``, ``invoke`` and ``return``
    (``time.monotonic()``, one clock for every process on the machine), and the result, or
    ``error`` when the operation raised (its outcome is then unknown).

    - ``add``: ``store.add("counter", 1)``; result ``value``.
    - ``cas``: ``store.compare_and_swap("chain", expected, expected + token + ";")`` with a token
      unique to this attempt, ``expected`` being the chain this worker last saw; result
      ``swapped`` and ``previous``.
    - ``state``: ``get_state``, then ``set_state`` of the same state with ``round + 1`` under
      the token read; result ``read_round``, ``has_set`` and ``returned_round``. ``wrote`` is
      false when the read failed (nothing was sent).
    """
    import os
    import random

    backend, store = create_backend(
        rendezvous_parameters(
            endpoint, kubeconfig, request_timeout=request_timeout, retry_timeout=retry_timeout, conflict_backoff=0
        )
    )
    print(json.dumps({"ready": True}), flush=True)
    give_up = time.monotonic() + 120
    while not os.path.exists(go_file):
        if time.monotonic() > give_up:
            raise TimeoutError(f"{go_file} never appeared")
        time.sleep(0.02)
    rng = random.Random(f"{seed}-{worker}")
    history: list[dict[str, object]] = []
    chain = b""
    for number in range(int(operations)):
        kind = rng.choice(("add", "cas", "state"))
        entry: dict[str, object] = {"worker": worker, "op": kind, "invoke": time.monotonic()}
        try:
            if kind == "add":
                entry["value"] = store.add("counter", 1)
            elif kind == "cas":
                token = f"{worker}.{number}"
                entry.update(token=token, expected=chain.decode())
                desired = chain + token.encode() + b";"
                swapped, previous = store.compare_and_swap("chain", chain, desired)
                entry.update(swapped=swapped, previous=previous.decode())
                chain = desired if swapped else previous
            else:
                entry["wrote"] = False
                current = backend.get_state()
                assert current is not None, "the test writes round 0 before the workers start"
                state = pickle.loads(current[0])
                entry["read_round"] = state.round
                state.round += 1
                entry["wrote"] = True
                result = backend.set_state(pickle.dumps(state), current[1])
                assert result is not None
                entry.update(has_set=result[2], returned_round=pickle.loads(result[0]).round)
        except Exception as exc:  # noqa: BLE001 - an operation that raised has an unknown outcome
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        entry["return"] = time.monotonic()
        history.append(entry)
    with open(history_file, "w") as out:
        json.dump(history, out)
    return {
        "worker": worker,
        "operations": len(history),
        "errors": sum(1 for entry in history if "error" in entry),
        "store_requests": store.stats["requests"],
    }


COMMANDS.update({"fault-mix": fault_mix})

if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])), flush=True)
