"""Fuzz the state document decoder: it must raise nothing but StateDocumentError, within its bounds.

    .venv/bin/python scripts/fuzz_state.py --seconds 60

Runs Hypothesis outside CI's timed tests: mutated valid documents, arbitrary JSON, arbitrary
bytes in the ``kr1:`` framing and arbitrary text. For every input it checks that
``decode_document`` either returns a document that re-encodes and decodes to itself, or raises
``StateDocumentError``; any other exception, or one decode over ``--slowest`` seconds, fails.
Prints the number of inputs, the outcomes and the slowest decode, and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import zlib
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_rendezvous._rules.document import (
    DOCUMENT_MARKER,
    NodeId,
    RendezvousDocument,
    StateDocumentError,
    decode_document,
    document_to_json,
    encode_document,
)

NOW = datetime(2026, 12, 3, tzinfo=timezone.utc)
SEED = document_to_json(
    RendezvousDocument(
        round=2,
        complete=True,
        participants={NodeId(f"trainer-{index}.svc", 1, 0): index for index in range(4)},
        wait_list=frozenset({NodeId("late.svc", 1, 0)}),
        last_heartbeats={NodeId(f"trainer-{index}.svc", 1, 0): NOW - timedelta(seconds=index) for index in range(4)},
    )
)
OUTCOMES: Counter[str] = Counter()
SLOWEST = [0.0]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=10), children, max_size=6),
    max_leaves=40,
)


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    data = json.loads(json.dumps(SEED))
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from([*sorted(data), "extra"]))
        if isinstance(data.get(key), list) and data[key] and draw(st.booleans()):
            index = draw(st.integers(0, len(data[key]) - 1))
            data[key][index] = draw(json_values)
        elif draw(st.booleans()):
            data[key] = draw(json_values)
        else:
            data.pop(key, None)
    return data


def framed(raw: bytes) -> str:
    return DOCUMENT_MARKER + base64.b64encode(zlib.compress(raw)).decode("ascii")


inputs = st.one_of(
    mutated_documents().map(lambda data: framed(json.dumps(data).encode())),
    json_values.map(lambda data: framed(json.dumps(data).encode())),
    st.binary(max_size=4096).map(framed),
    st.binary(max_size=4096).map(lambda data: DOCUMENT_MARKER + base64.b64encode(data).decode("ascii")),
    st.text(max_size=2048),
    st.text(alphabet='[]{}",:0123456789-truefalsn ', max_size=4096).map(lambda text: framed(text.encode())),
)


def check(text: str, slowest: float) -> None:
    started = time.perf_counter()
    try:
        document = decode_document(text)
    except StateDocumentError as exc:
        OUTCOMES[f"refused: {exc.field.split('[')[0]}"] += 1
    else:
        assert decode_document(encode_document(document)) == document
        OUTCOMES["accepted"] += 1
    elapsed = time.perf_counter() - started
    SLOWEST[0] = max(SLOWEST[0], elapsed)
    assert elapsed <= slowest, f"one decode took {elapsed:.3f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
    parser.add_argument("--slowest", type=float, default=1.0, help="seconds one decode may take (default 1)")
    options = parser.parse_args()
    deadline = time.monotonic() + options.seconds
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1

        @settings(
            max_examples=2000,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(inputs)
        def run(text: str) -> None:
            check(text, options.slowest)

        try:
            run()
        except Exception as exc:  # noqa: BLE001 - report any failure and stop
            print(f"FAILED after {sum(OUTCOMES.values())} inputs: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        print(f"[fuzz] {sum(OUTCOMES.values())} inputs so far, slowest decode {SLOWEST[0] * 1000:.1f} ms", flush=True)
    print(
        f"fuzzed {sum(OUTCOMES.values())} inputs in {options.seconds:.0f} s ({rounds} rounds); "
        f"slowest decode {SLOWEST[0] * 1000:.1f} ms; outcomes:"
    )
    for outcome, count in OUTCOMES.most_common():
        print(f"  {count:8d}  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
