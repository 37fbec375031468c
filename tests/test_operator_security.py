"""Hostile states written into a Rendezvous while the real operator runs under its own RBAC.

The API server runs the first release's CRD here (no rule on ``status.state``), as in a cluster
whose CRDs were never upgraded (chart 0.1.0 kept them in ``crds/``, which ``helm upgrade`` skips):
what stops these states is the operator's own validator. For every payload the operator must
stay live, post a ``StateInvalid`` Warning naming the problem, set Ready=False/StateInvalid, and
run nothing; a valid state of 10000 nodes must be accepted. The operator's peak RSS over the
whole sequence is printed and bounded.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous._rules.document import (
    MAX_ENCODED_BYTES,
    NodeId,
    RendezvousDocument,
    StateDocumentError,
    decode_document,
    document_to_json,
    encode_document,
)
from kubernetes import client

from tests.e2e.operator_process import OperatorProcess
from tests.helpers import create_rendezvous
from tests.test_operator import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    events,
    read,
    running_operator,
)
from tests.testenv import ControlPlane, wait_until

MERGE_PATCH = "application/merge-patch+json"
#: The peak RSS the hostile states must stay under: the chart's former memory limit (values.yaml now sets 1Gi, sized
#: for 17,000 watched pods, docs/operations.md "Operator memory"); what is validated here does not grow with pods.
RSS_LIMIT_MIB = 512


class RunsCommand:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def kr1(raw: bytes) -> str:
    return "kr1:" + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def zlib_bomb(zeros_mib: int) -> str:
    """``zeros_mib`` MiB of zeros, compressed in a stream (never held in memory at once)."""
    compressor, chunk = zlib.compressobj(9), bytes(1 << 20)
    compressed = b"".join(compressor.compress(chunk) for _ in range(zeros_mib)) + compressor.flush()
    return "kr1:" + base64.b64encode(compressed).decode("ascii")


NOW = datetime.now(timezone.utc)
SMALL = RendezvousDocument(
    round=3,
    complete=True,
    participants={NodeId("10.0.0.1", 1, 0): 0, NodeId("10.0.0.2", 1, 0): 1},
    last_heartbeats={NodeId("10.0.0.1", 1, 0): NOW, NodeId("10.0.0.2", 1, 0): NOW},
)


def small_json(**changes: Any) -> str:
    return json.dumps({**document_to_json(SMALL), **changes}, separators=(",", ":"))


@dataclass(frozen=True)
class Hostile:
    """A status.state payload and a word of the validator's message that names its problem."""

    name: str
    build: Callable[[Path], str]
    names: str


HOSTILE = [
    Hostile(
        "z1-pickle-running-os-system",
        lambda marker: "z1:" + base64.b64encode(zlib.compress(pickle.dumps(RunsCommand(marker)))).decode("ascii"),
        "holds a pickle",
    ),
    Hostile(
        "raw-pickle-base64-without-marker",
        lambda marker: base64.b64encode(pickle.dumps(RunsCommand(marker))).decode("ascii"),
        "not the marker 'kr1:'",
    ),
    Hostile("kr1-pickle", lambda marker: kr1(pickle.dumps(RunsCommand(marker))), "status.state text"),
    Hostile("zlib-bomb-200-mib-of-zeros", lambda _: zlib_bomb(200), "zlib bomb"),
    Hostile("json-nested-100000-deep", lambda _: kr1(b"[" * 100_000 + b"]" * 100_000), "nesting"),
    Hostile("wrong-type", lambda _: kr1(small_json(round="3").encode()), "status.state round"),
    Hostile("nan", lambda _: kr1(small_json(round=float("nan")).encode()), "NaN"),
    Hostile(
        "integer-of-5001-digits",
        lambda _: kr1(small_json().replace('"round":3', '"round":1' + "0" * 5000).encode()),
        "5001 digits",
    ),
    Hostile("rank-held-twice", lambda _: kr1(small_json(rankDelta=[0, 0]).encode()), "rank 0 is held by two"),
]


def large_valid_state(nodes: int) -> str:
    members = [NodeId(f"trainer-{index}.job.team-a.svc.cluster.local", 1000 + index, 0) for index in range(nodes)]
    document = RendezvousDocument(
        round=7,
        complete=True,
        participants={node: rank for rank, node in enumerate(members)},
        last_heartbeats={node: NOW - timedelta(microseconds=index) for index, node in enumerate(members)},
    )
    return encode_document(document)


def write_status(objects: client.CustomObjectsApi, namespace: str, name: str, status: dict[str, Any]) -> None:
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _content_type=MERGE_PATCH
    )


@pytest.fixture
def operator(
    first_release_crd: None, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator, started after (and stopped before) the CRD swap so that its watch never sees it."""
    with running_operator(control_plane, namespace, tmp_path / "operator.log") as running:
        yield running


def peak_rss_mib(pid: int) -> float:
    """The peak resident set size (VmHWM) of process ``pid``, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def messages(admin_api: client.ApiClient, namespace: str, reason: str) -> list[tuple[str, str]]:
    """(type, message) of every Event with ``reason`` on the Rendezvous ``job``."""
    return [(kind, message) for kind, found, message in events(admin_api, namespace) if found == reason]


def ready_of(objects: client.CustomObjectsApi, namespace: str) -> tuple[str, str] | None:
    """(status, reason) of the Ready condition of ``job``."""
    ready = condition(read(objects, namespace), "Ready")
    return None if ready is None else (ready["status"], ready["reason"])


def wait_for_state_invalid(
    objects: client.CustomObjectsApi, admin_api: client.ApiClient, namespace: str, message: str
) -> list[tuple[str, str]]:
    """Wait until Ready says ``message`` and an Event with it is posted; return those Events (type, message)."""
    wait_until(
        lambda: (condition(read(objects, namespace), "Ready") or {}).get("message") == message,
        30,
        f"Ready to say {message!r}",
    )
    found: list[tuple[str, str]] = wait_until(
        lambda: [item for item in messages(admin_api, namespace, "StateInvalid") if item[1] == message],
        30,
        f"a StateInvalid event saying {message!r}",
    )
    return found


class TestHostileStates:
    def test_hostile_states_only_raise_state_invalid_and_a_valid_10000_node_state_is_accepted(
        self,
        operator: OperatorProcess,
        objects: client.CustomObjectsApi,
        admin_api: client.ApiClient,
        namespace: str,
        tmp_path: Path,
    ) -> None:
        assert operator.process is not None
        create_rendezvous(objects, namespace, minNodes=1, maxNodes=16384)
        wait_until(lambda: ready_of(objects, namespace) == ("False", "NoStateYet"), 30, "Ready judged")
        reported: list[str] = []

        for hostile in HOSTILE:
            marker = tmp_path / f"ran-{hostile.name}"
            payload = hostile.build(marker)
            assert len(payload) <= MAX_ENCODED_BYTES, f"{hostile.name}: {len(payload)} bytes, over the CRD's maxLength"
            with pytest.raises(StateDocumentError) as refused:
                decode_document(payload)  # the agents' validator: the message the operator must post
            expected = str(refused.value)
            assert hostile.names in expected, hostile.name
            assert expected not in reported, f"{hostile.name}: its message must differ from the earlier ones"
            reported.append(expected)

            write_status(objects, namespace, "job", {"state": payload})
            assert wait_for_state_invalid(objects, admin_api, namespace, expected) == [("Warning", expected)]
            assert ready_of(objects, namespace) == ("False", "StateInvalid"), hostile.name
            assert operator.healthy(), f"{hostile.name}: the liveness endpoint must answer 200"
            assert not marker.exists(), f"{hostile.name}: a command in the state ran"
            peak = peak_rss_mib(operator.process.pid)
            print(f"\n{hostile.name}: {len(payload)} bytes; operator peak RSS so far {peak:.1f} MiB")

        payload = large_valid_state(10000)
        write_status(objects, namespace, "job", {"state": payload})
        wait_until(lambda: ready_of(objects, namespace) == ("True", "RoundComplete"), 60, "Ready=True for 10000 nodes")
        joined = wait_until(lambda: messages(admin_api, namespace, "NodeJoined"), 30, "a NodeJoined event")
        assert len(joined) == 1 and joined[0][1].startswith("10000 nodes joined round 7: trainer-0.job")
        completed = wait_until(lambda: messages(admin_api, namespace, "RoundCompleted"), 30, "RoundCompleted")
        assert completed[0][1].startswith("round 7 completed with 10000 nodes: trainer-0.job.team-a.svc")
        # A refusal would have been posted before these Events (same handler call, posted in order).
        assert len(messages(admin_api, namespace, "StateInvalid")) == len(reported)
        assert operator.healthy()
        print(f"\nvalid-10000-nodes: {len(payload)} bytes")

        peak = peak_rss_mib(operator.process.pid)
        print(f"\noperator peak RSS (VmHWM) over every payload: {peak:.1f} MiB")
        assert peak < RSS_LIMIT_MIB
        log = operator.log.read_text()
        assert "Traceback" not in log, log[-3000:]
