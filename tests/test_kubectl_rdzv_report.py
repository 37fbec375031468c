"""``kubectl_rdzv_rules``: what ``kubectl rdzv status`` and ``watch`` print, from objects built by hand (pure).

No control plane and no process: each test builds the Rendezvous object and its Leases as the API server
would return them (hostile ones too) and asserts on the report, its text and the ``watch`` labels.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.metadata
import json
import re
import zlib
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import yaml
from kube_rendezvous._cli import kubectl_rdzv
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, document_to_json, encode_document
from kube_rendezvous._rules.kubectl_rdzv_rules import (
    EXIT_ERROR,
    EXIT_OK,
    PRINTER_COLUMNS,
    PluginError,
    as_list,
    build_report,
    change_label,
    close_dry_run,
    close_prompt,
    close_refusal,
    confirmed,
    decode_state,
    format_age,
    human_duration,
    list_rows,
    no_resources,
    node_table,
    parse_microtime,
    parse_output,
    pod_of,
    render_data,
    render_status,
    summary_line,
)

from tests.helpers import REPO

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=timezone.utc)
A = NodeId("10.0.0.1", 100, 0)
B = NodeId("10.0.0.2", 200, 0)
D = NodeId("10.0.0.4", 400, 0)
C = NodeId("10.0.0.3", 300, 1)
D = NodeId("10.0.0.4", 400, 0)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rendezvous(document: RendezvousDocument | None = None, spec: Any = None, **status: Any) -> dict[str, Any]:
    """A Rendezvous object as the API server returns it; ``document`` encoded into ``status.state``."""
    if document is not None:
        status = {"state": encode_document(document), **status}
    obj: dict[str, Any] = {"metadata": {"name": "job", "namespace": "ns"}, "spec": spec or {}}
    if status:
        obj["status"] = status
    return obj


def lease(name: str, kind: str, renew_time: Any, node: str | None = None, **spec: Any) -> dict[str, Any]:
    """A Lease as the backend writes it (labels, the node annotation); ``renew_time`` as given, even invalid."""
    metadata: dict[str, Any] = {"name": name, "labels": {"kube-rendezvous.io/rendezvous": "job"}}
    metadata["labels"]["kube-rendezvous.io/lease"] = kind
    if node is not None:
        metadata["annotations"] = {"kube-rendezvous.io/node": node}
    return {"metadata": metadata, "spec": {"renewTime": renew_time, **spec}}


def complete_round(beat: datetime = NOW) -> RendezvousDocument:
    """Round 3, complete: A rank 0, B rank 1; C waits for the next round."""
    return RendezvousDocument(
        round=3,
        complete=True,
        participants={A: 0, B: 1},
        wait_list=frozenset({C}),
        last_heartbeats={A: beat, B: beat, C: beat},
    )


# -- times and ages ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0s ago"),
        (59.9, "59s ago"),
        (60, "1m0s ago"),
        (3599, "59m59s ago"),
        (3600, "1h0m ago"),
        (86399, "23h59m ago"),
        (86400, "1d0h ago"),
        (90061, "1d1h ago"),
        (-2.5, "in 2s"),
        (-3700, "in 1h1m"),
    ],
)
def test_format_age(seconds: float | None, text: str) -> None:
    assert format_age(seconds) == text


def test_parse_microtime_takes_rfc3339_in_utc_and_refuses_the_rest() -> None:
    assert parse_microtime("2026-12-05T12:00:00.250000Z") == NOW + timedelta(milliseconds=250)
    assert parse_microtime("2026-12-05T12:00:00Z") == NOW
    assert parse_microtime("2026-12-05T14:00:00+02:00") == NOW
    assert parse_microtime("2026-12-05T14:00:00+02:00").tzinfo == timezone.utc  # type: ignore[union-attr]
    for bad in ("2026-12-05T12:00:00", "yesterday", "", "2026-13-45T99:00:00Z", None, 1733400000, ["x"]):
        assert parse_microtime(bad) is None, bad


# -- the state document ------------------------------------------------------------------------


def test_decode_state_without_a_state_is_none_and_a_valid_one_is_the_document() -> None:
    assert decode_state({"metadata": {"name": "job"}}, "ns", "job") is None
    assert decode_state(rendezvous(state=""), "ns", "job") is None
    assert decode_state(rendezvous(complete_round()), "ns", "job") == complete_round()


def encoded(data: dict[str, Any]) -> str:
    """``data`` stored as the agents store a document (``kr1:``, zlib, base64), whatever its shape."""
    return "kr1:" + base64.b64encode(zlib.compress(json.dumps(data).encode())).decode()


OURS = "the agents refuse it too: clear it (kubectl patch rdzv llama -n team-a --subresource=status --type=json "
LIBRARYS = "clear it (kubectl patch rdzv NAME --subresource=status --type=json "


@pytest.mark.parametrize(
    ("state", "problem", "fix"),
    [
        (42, "status.state text: must be a string, got int", OURS),
        ({"round": 1}, "status.state text: must be a string, got dict", OURS),
        ("kr1:not base64!", "status.state text: holds invalid base64", OURS),
        ("kr1:" + "A" * 8, "status.state text: holds corrupt zlib data", OURS),
        (
            encoded({**document_to_json(complete_round()), "round": -5}),
            "status.state round: -5 must be an integer",
            OURS,
        ),
        ("{'round': 3}", "status.state text: starts with \"{'round': 3}\", not the marker 'kr1:'", LIBRARYS),
        ("z1:gASVAAAA", "status.state text: holds a pickle", LIBRARYS),
    ],
)
def test_a_hostile_state_is_refused_naming_the_rendezvous_the_field_and_the_fix(
    state: Any, problem: str, fix: str
) -> None:
    with pytest.raises(PluginError) as raised:
        decode_state(rendezvous(state=state), "team-a", "llama")

    message = str(raised.value)
    assert message.startswith(f"Rendezvous team-a/llama has an invalid {problem}"), message
    assert "\n" not in message
    assert fix in message and message.count("kubectl patch rdzv") == 1, message  # the fix, once
    assert message.endswith("""'[{"op":"remove","path":"/status/state"}]') or use a new Rendezvous"""), message


# -- the node table ----------------------------------------------------------------------------


def test_node_table_takes_heartbeats_from_node_leases_and_orders_roles() -> None:
    document = RendezvousDocument(
        round=2,
        participants={B: 0, A: 0},
        wait_list=frozenset({C}),
        redundancy_list=frozenset({D}),
        last_heartbeats={A: ago(600), B: ago(600), NodeId("10.0.0.9", 9, 0): ago(1)},
    )
    leases = [
        lease("job-node-a", "node", micro(ago(2)), node=str(A)),
        lease("job-node-b", "node", micro(ago(40)), node=str(B)),
        lease("job-node-c", "node", "not a time", node=str(C)),  # a bad renewTime: no heartbeat, not fatal
        lease("job-node-d", "node", None, node=str(D), acquireTime=micro(ago(3))),  # never renewed: acquired
        lease("job-node-e", "node", micro(ago(5)), node="10.0.0.5_500_0"),  # a Lease the state does not name
        lease("job-node-x", "node", micro(ago(5))),  # no node annotation: ignored
        lease("job-other", "elector", micro(ago(5)), node="10.0.0.6_600_0"),  # another kind: ignored
        lease("job-writer", "writer", micro(ago(1)), holderIdentity="operator/x"),
    ]

    rows, writer, from_leases = node_table(document, leases, NOW, 15.0)

    assert from_leases is True
    assert [(row["node"], row["role"], row["rank"]) for row in rows] == [
        (str(A), "participant", 0),
        (str(B), "participant", 0),
        (str(C), "waiting", None),
        (str(D), "redundant", None),
        ("10.0.0.9_9_0", "heartbeat-only", None),
        ("10.0.0.5_500_0", "lease-only", None),
    ]
    by_node = {row["node"]: row for row in rows}
    assert by_node[str(A)]["heartbeatAgeSeconds"] == 2.0 and by_node[str(A)]["heartbeatExpired"] is False
    assert by_node[str(A)]["lastHeartbeat"] == "2026-12-05T11:59:58.000000Z"
    assert by_node[str(A)]["lease"] == "job-node-a"
    assert by_node[str(B)]["heartbeatAgeSeconds"] == 40.0 and by_node[str(B)]["heartbeatExpired"] is True
    assert by_node[str(C)]["lastHeartbeat"] is None and by_node[str(C)]["heartbeatAgeSeconds"] is None
    assert by_node[str(C)]["heartbeatExpired"] is False
    assert by_node[str(D)]["heartbeatAgeSeconds"] == 3.0
    assert by_node["10.0.0.9_9_0"]["heartbeatAgeSeconds"] is None  # Leases exist: the document's beats are unused
    assert writer == {
        "holderIdentity": "operator/x",
        "lease": "job-writer",
        "renewTime": "2026-12-05T11:59:59.000000Z",
        "ageSeconds": 1.0,
    }


def test_node_table_without_node_leases_uses_the_documents_heartbeats() -> None:
    rows, writer, from_leases = node_table(complete_round(ago(20)), [], NOW, 15.0)

    assert (writer, from_leases) == (None, False)
    assert [(row["node"], row["rank"], row["heartbeatAgeSeconds"]) for row in rows] == [
        (str(A), 0, 20.0),
        (str(B), 1, 20.0),
        (str(C), None, 20.0),
    ]
    assert all(row["heartbeatExpired"] and row["lease"] is None for row in rows)
    assert node_table(None, [], NOW, 15.0) == ([], None, False)


def test_a_heartbeat_expires_after_the_expiry_not_at_it() -> None:
    leases = [lease("a", "node", micro(ago(15)), node=str(A)), lease("b", "node", micro(ago(15.001)), node=str(B))]

    rows, _, _ = node_table(None, leases, NOW, 15.0)

    assert [(row["node"], row["heartbeatExpired"]) for row in rows] == [(str(A), False), (str(B), True)]


# -- the report --------------------------------------------------------------------------------


def test_report_of_a_complete_round() -> None:
    history = [
        {"round": 2, "startTime": "2026-12-05T11:00:00Z", "formedTime": "2026-12-05T11:00:31Z", "nodes": 3},
        {"round": 3, "startTime": "2026-12-05T11:50:00Z", "formedTime": "bad", "nodes": 2},  # skipped
        {"round": 3, "startTime": "2026-12-05T11:55:00Z", "formedTime": "2026-12-05T11:55:04Z", "nodes": 2},
    ]
    departure = {"round": 2, "time": "2026-12-05T11:40:00Z", "count": 1, "nodes": [{"node": "x_1_0", "reason": "Left"}]}
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "Valid",
        "message": "ok",
        "lastTransitionTime": "t",
        "x": 1,
    }
    obj = rendezvous(
        complete_round(),
        {"minNodes": 2, "maxNodes": 4},
        recentRounds=history,
        lastDeparture=departure,
        lastChangeTime="2026-12-05T11:59:57Z",
        lastWriter=str(A),
        evictedNodes=["10.0.0.8_8_0"],
        conditions=[condition],
        runId="run-1",
    )

    report = build_report("ns", "job", obj, [], NOW)

    json.dumps(report)  # JSON-ready
    assert (report["phase"], report["round"], report["complete"], report["closed"]) == ("Complete", 3, True, False)
    assert (report["participantCount"], report["waitingCount"], report["redundantCount"]) == (2, 1, 0)
    assert report["nodesStillNeeded"] is None  # complete: nothing more is needed
    assert report["deadline"] is None and report["lastCallSinceEstimate"] is None
    assert report["roundDurations"] == [
        {"round": 2, "nodes": 3, "formedInSeconds": 31.0, "completedBy": None},
        {"round": 3, "nodes": 2, "formedInSeconds": 4.0, "completedBy": None},
    ]
    assert report["roundDurationsNote"] is None
    assert report["lastDeparture"] == departure
    assert report["lastChangeAgeSeconds"] == 3.0 and report["lastWriter"] == str(A)
    assert report["heartbeatSource"] == "document" and report["heartbeatExpirySeconds"] == 15.0
    assert report["evictedNodes"] == ["10.0.0.8_8_0"] and report["runId"] == "run-1"
    assert report["conditions"] == [{key: condition[key] for key in condition if key != "x"}]
    assert report["stateError"] is None and report["observedAt"] == "2026-12-05T12:00:00.000000Z"


def test_report_of_a_round_in_last_call() -> None:
    document = RendezvousDocument(round=5, participants={A: 0, B: 0}, deadline=NOW + timedelta(seconds=20))
    spec = {"minNodes": 2, "maxNodes": 3, "lastCallTimeoutSeconds": 30, "keepAliveIntervalSeconds": 2}

    report = build_report("ns", "job", rendezvous(document, spec, roundStartTime="2026-12-05T11:59:30Z"), [], NOW)

    assert (report["phase"], report["complete"], report["nodesStillNeeded"]) == ("LastCall", False, 0)
    assert report["deadline"] == "2026-12-05T12:00:20.000000Z" and report["deadlineInSeconds"] == 20.0
    assert report["lastCallSinceEstimate"] == "2026-12-05T11:59:50.000000Z"  # the deadline minus 30 s
    assert report["roundFormingSince"] == "2026-12-05T11:59:30.000000Z"
    assert report["heartbeatExpirySeconds"] == 6.0  # 2 s x the default 3 attempts
    assert report["roundDurations"] == [] and "status.recentRounds is empty" in report["roundDurationsNote"]


def test_report_counts_the_nodes_a_forming_round_still_needs() -> None:
    document = RendezvousDocument(round=1, participants={A: 0})

    assert build_report("ns", "job", rendezvous(document, {"minNodes": 3}), [], NOW)["nodesStillNeeded"] == 2
    assert build_report("ns", "job", rendezvous(document, {}), [], NOW)["nodesStillNeeded"] is None
    assert build_report("ns", "job", rendezvous(document, {"minNodes": "3"}), [], NOW)["nodesStillNeeded"] is None
    pending = build_report("ns", "job", rendezvous(None, {"minNodes": 2}), [], NOW)
    assert (pending["phase"], pending["round"], pending["nodesStillNeeded"]) == ("Pending", None, 2)


def test_report_of_a_hostile_object_never_raises() -> None:
    obj = rendezvous(
        None,
        {"minNodes": 2, "keepAliveMaxAttempts": "many", "closed": True},
        state="kr1:not base64!",
        lastDeparture="yesterday",
        roundStartTime=12,
        lastChangeTime="not a time",
    )
    leases = [lease("job-node-a", "node", "2026-02-30T25:00:00Z", node=str(A))]

    report = build_report("ns", "job", obj, leases, NOW, leases_error="forbidden: you may not list leases")

    assert report["phase"] == "Invalid" and report["round"] is None
    assert report["stateError"].startswith("Rendezvous ns/job has an invalid status.state text")
    assert report["heartbeatExpirySeconds"] == 15.0  # the spec's timing is invalid: the defaults
    assert report["specClosed"] is True and report["closed"] is False
    assert report["lastDeparture"] is None and report["roundFormingSince"] is None
    assert report["lastChangeAgeSeconds"] is None
    assert report["leasesError"] == "forbidden: you may not list leases"
    assert report["nodes"] == [
        {
            "node": str(A),
            "role": "lease-only",
            "rank": None,
            "lastHeartbeat": None,
            "heartbeatAgeSeconds": None,
            "heartbeatExpired": False,
            "lease": "job-node-a",
            "domain": None,
            "heldReason": None,
            "pod": None,
            "kubernetesNode": None,
        }
    ]
    assert summary_line(report) == f"INVALID state: {report['stateError']}"
    assert render_status(report).splitlines()[1] == f"Phase           Invalid state: {report['stateError']}"


# -- the text of status ------------------------------------------------------------------------


def test_render_status_of_a_complete_round_with_leases() -> None:
    history = [
        {"round": 2, "startTime": "2026-12-05T11:00:00Z", "formedTime": "2026-12-05T11:00:31Z", "nodes": 3},
        {"round": 3, "startTime": "2026-12-05T11:55:00Z", "formedTime": "2026-12-05T11:55:04Z", "nodes": 1},
    ]
    obj = rendezvous(
        complete_round(ago(600)),
        {"minNodes": 2, "maxNodes": 4},
        recentRounds=history,
        lastDeparture={"round": 2, "time": "2026-12-05T11:40:00Z", "count": 1, "nodes": [{"node": "x_1_0"}]},
        lastChangeTime="2026-12-05T11:59:57Z",
        lastWriter=str(A),
        conditions=[
            {"type": "Ready", "status": "True", "reason": "Valid", "lastTransitionTime": "2026-12-05T11:55:00Z"}
        ],
    )
    leases = [
        lease("job-node-a", "node", micro(ago(3)), node=str(A)),
        lease("job-node-b", "node", micro(ago(20)), node=str(B)),
        lease("job-node-c", "node", micro(ago(2)), node=str(C)),
        lease("job-writer", "writer", micro(ago(2)), holderIdentity="operator/kube-rendezvous-0"),
    ]

    text = render_status(build_report("team-a", "llama", obj, leases, NOW))

    assert text.splitlines() == [
        "Rendezvous      team-a/llama",
        "Phase           Complete (round 3, complete, open)",
        "Nodes           2 participants, 1 waiting, 0 redundant (minNodes 2, maxNodes 4)",
        "Waiting for     nothing: the round is complete",
        "Forming         -",
        "Past rounds     round 2 formed in 31s with 3 nodes, round 3 formed in 4s with 1 node",
        "Last departure  node x_1_0 left round 2 (at 2026-12-05T11:40:00Z)",
        f"Last change     2026-12-05T11:59:57Z (3s ago) by {A}",
        "Writer          operator/kube-rendezvous-0 (writer Lease renewed 2s ago)",
        "Heartbeats      from node Leases; expired after 15s",
        "Evicted         none",
        "Held            none",
        "Ranks           not recorded in the status (no round formed since a release that records it)",
        "Conditions      Ready=True (Valid, 5m0s ago)",
        "",
        "NODE             ROLE          RANK   POD   K8S NODE   DOMAIN   LAST HEARTBEAT",
        "10.0.0.1_100_0   participant   0      -     -          -        3s ago",
        "10.0.0.2_200_0   participant   1      -     -          -        20s ago (expired)",
        "10.0.0.3_300_1   waiting       -      -     -          -        2s ago",
    ]


def test_render_status_shows_each_members_domain_the_held_nodes_and_why() -> None:
    document = complete_round()
    document = dataclasses.replace(document, last_heartbeats={**document.last_heartbeats, D: NOW})
    topology = {
        "order": "Topology",
        "domains": [
            {"domain": "z1/b2", "firstRank": 0, "lastRank": 0},
            {"domain": "z2/-", "firstRank": 1, "lastRank": 1},
        ],
    }
    held = [{"node": str(D), "reason": "NodeCordoned: Kubernetes node n4 is cordoned (spec.unschedulable)"}]
    obj = rendezvous(document, {"minNodes": 2, "maxNodes": 4}, topology=topology, heldNodes=held, heldCount=1)

    report = build_report("ns", "job", obj, [], NOW)
    lines = render_status(report).splitlines()

    assert report["heldCount"] == 1 and report["rankOrder"] == "Topology"
    assert f"Held            {D}: NodeCordoned: Kubernetes node n4 is cordoned (spec.unschedulable)" in lines
    assert "Ranks           by topology domain (2 domains in this round), then address" in lines
    assert lines[-4:] == [
        "10.0.0.1_100_0   participant   0      -     -          z1/b2    0s ago",
        "10.0.0.2_200_0   participant   1      -     -          z2/-     0s ago",
        "10.0.0.3_300_1   waiting       -      -     -          -        0s ago",
        "10.0.0.4_400_0   held          -      -     -          -        0s ago",
    ]
    by_address = rendezvous(document, {}, topology={"order": "Address", "reason": "the operator may not read Nodes"})
    assert "Ranks           by address: the operator may not read Nodes" in render_status(
        build_report("ns", "job", by_address, [], NOW)
    )


def test_render_status_of_a_forming_round_says_what_it_waits_for() -> None:
    document = RendezvousDocument(round=5, participants={A: 0, B: 0}, deadline=NOW + timedelta(seconds=21))
    spec = {"minNodes": 2, "maxNodes": 3, "lastCallTimeoutSeconds": 30}
    obj = rendezvous(document, spec, roundStartTime="2026-12-05T11:59:48Z")

    lines = render_status(build_report("ns", "job", obj, [], NOW, "forbidden: you may not list leases")).splitlines()

    assert lines[1] == "Phase           LastCall (round 5, forming, open)"
    assert lines[3] == (
        "Waiting for     0 more nodes (minNodes 2 reached); more are admitted up to maxNodes 3 until the deadline "
        "2026-12-05T12:00:21Z (in 21s)"
    )
    assert (
        lines[4]
        == "Forming         began 12s ago; minNodes reached about 9s ago (deadline minus the last-call timeout)"
    )
    assert lines[5] == "Past rounds     none recorded yet (status.recentRounds is empty)"
    assert lines[6] == "Last departure  none recorded (status.lastDeparture is not set)"
    assert lines[7:9] == ["Last change     -", "Writer          none (no writer Lease)"]
    assert lines[9] == (
        "Heartbeats      from the state document (no node Leases); forbidden: you may not list leases; "
        "expired after 15s"
    )
    assert lines[13] == "Conditions      none (no operator has reported yet)"
    assert lines[-2:] == [
        "10.0.0.1_100_0   participant   0      -     -          -        -",
        "10.0.0.2_200_0   participant   0      -     -          -        -",
    ]


def test_render_status_of_a_pending_and_of_a_closing_rendezvous() -> None:
    pending = render_status(build_report("ns", "job", rendezvous(None, {"minNodes": 1}), [], NOW)).splitlines()
    assert pending[1] == "Phase           Pending (no agent has written the state yet)"
    assert pending[3] == "Waiting for     1 more node to reach minNodes 1"
    assert pending[-1].startswith("Conditions")  # no nodes: no table

    closing = build_report("ns", "job", rendezvous(complete_round(), {"closed": True}), [], NOW)
    assert "Complete (round 3, complete, spec.closed is true; the agents have not applied it yet)" in render_status(
        closing
    )
    closed = RendezvousDocument(round=3, complete=True, closed=True, participants={A: 0})
    assert "Closed (round 3, complete, closed)" in render_status(build_report("ns", "job", rendezvous(closed), [], NOW))
    unknown = rendezvous(RendezvousDocument(round=1, participants={A: 0}), {})
    assert "Waiting for     unknown (spec.minNodes is not set)" in render_status(
        build_report("ns", "j", unknown, [], NOW)
    )


# -- watch -------------------------------------------------------------------------------------


def test_summary_line_of_a_round() -> None:
    leases = [
        lease("job-node-a", "node", micro(ago(3)), node=str(A)),
        lease("job-node-b", "node", micro(ago(75)), node=str(B)),
        lease("job-writer", "writer", micro(ago(1)), holderIdentity="agent/10.0.0.1_100_0"),
    ]
    obj = rendezvous(complete_round(), {"minNodes": 2, "closed": True}, evictedNodes=["x_1_0", "y_2_0"])

    line = summary_line(build_report("ns", "job", obj, leases, NOW))

    assert line == (
        "Complete round=3 participants=2 waiting=1 redundant=0 held=0 needed=- closed=true oldest-heartbeat=1m15s ago "
        "no-heartbeat=1 evicted=2 writer=agent/10.0.0.1_100_0"
    )
    pending = summary_line(build_report("ns", "job", rendezvous(None, {"minNodes": 3}), [], NOW))
    assert pending == (
        "Pending round=- participants=0 waiting=0 redundant=0 held=0 needed=3 closed=false oldest-heartbeat=- "
        "no-heartbeat=0 evicted=0 writer=-"
    )


def test_change_label_names_the_change_and_the_object() -> None:
    node_lease = lease("job-node-a", "node", micro(NOW), node=str(A))
    writer = lease("job-writer", "writer", micro(NOW), holderIdentity="operator/x")
    other = lease("job-other", "elector", micro(NOW))
    obj = rendezvous(complete_round())

    assert change_label("Rendezvous", None, {}, {"job": obj}, 1) is None  # the first list: the present
    assert change_label("Leases", None, {}, {}, 2) == "Leases RELISTED"
    assert change_label("Rendezvous", obj, {"job": obj}, {"job": obj}, 1) == "Rendezvous MODIFIED"
    assert change_label("Rendezvous", obj, {"job": obj}, {}, 1) == "Rendezvous DELETED"
    assert change_label("Leases", node_lease, {}, {"job-node-a": node_lease}, 1) == f"node Lease {A} ADDED"
    assert change_label("Leases", writer, {"job-writer": writer}, {}, 3) == "writer Lease DELETED (holder operator/x)"
    del writer["spec"]["holderIdentity"]
    assert change_label("Leases", writer, {"job-writer": writer}, {"job-writer": writer}, 1) == (
        "writer Lease MODIFIED (holder -)"
    )
    assert change_label("Leases", other, {}, {"job-other": other}, 1) == "Lease job-other ADDED"


# -- POD and K8S NODE --------------------------------------------------------------------------


def pod(name: str, ip: str, node: str, phase: str = "Running", hostname: str | None = None) -> dict[str, Any]:
    """A pod as the API server lists it (only what ``pod_of`` reads)."""
    spec = {"nodeName": node, **({"hostname": hostname} if hostname else {})}
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}}


def test_each_node_is_matched_to_its_pod_and_kubernetes_node_as_the_operator_matches_them() -> None:
    pods = [
        pod("train-0", "10.0.0.1", "gpu-1"),
        pod("train-0-old", "10.0.0.1", "gpu-9", phase="Succeeded"),  # a finished pod that had the IP: running first
        pod("host-a", "10.0.0.2", "gpu-2"),  # hostNetwork: two pods share the Node's IP
        pod("host-b", "10.0.0.2", "gpu-2"),
        pod("train-3", "10.9.0.3", "gpu-3", hostname="trainer-3"),
    ]

    assert pod_of(str(A), pods) == ("train-0", "gpu-1")
    assert pod_of(str(B), pods) == (None, "gpu-2")  # which pod is unknown, its Node is not
    assert pod_of("trainer-3_7_0", pods) == ("train-3", "gpu-3")  # by hostname
    assert pod_of("train-3_7_0", pods) == ("train-3", "gpu-3")  # by pod name
    assert pod_of("job-svc.ns_7_0", pods) == (None, None)  # a Service name: the Leases do not record the pod
    assert pod_of(str(C), []) == (None, None)


def test_status_shows_each_nodes_pod_and_node_and_wide_adds_the_lease() -> None:
    leases = [lease("job-node-a", "node", micro(ago(3)), node=str(A))]
    obj = rendezvous(complete_round(), {"minNodes": 2, "maxNodes": 4})
    pods = [pod("train-0", "10.0.0.1", "gpu-1"), pod("train-1", "10.0.0.2", "gpu-2")]

    report = build_report("ns", "job", obj, leases, NOW, None, pods)
    lines = render_status(report).splitlines()
    wide = render_status(report, wide=True).splitlines()
    refused = render_status(build_report("ns", "job", obj, leases, NOW, None, None, "forbidden: list pods"))

    assert [item["pod"] for item in report["nodes"]] == ["train-0", "train-1", None]
    assert [item["kubernetesNode"] for item in report["nodes"]] == ["gpu-1", "gpu-2", None]
    assert report["podsListed"] is True and report["podsError"] is None
    assert "Pods            matched by address (pod IP, name or hostname) among the pods of namespace ns" in lines
    assert lines[-4:] == [
        "NODE             ROLE          RANK   POD       K8S NODE   DOMAIN   LAST HEARTBEAT",
        "10.0.0.1_100_0   participant   0      train-0   gpu-1      -        3s ago",
        "10.0.0.2_200_0   participant   1      train-1   gpu-2      -        -",
        "10.0.0.3_300_1   waiting       -      -         -          -        -",
    ]
    assert wide[-4].split() == ["NODE", "ROLE", "RANK", "POD", "K8S", "NODE", "DOMAIN", "LEASE", "LAST", "HEARTBEAT"]
    assert wide[-3].split()[6:] == ["job-node-a", "3s", "ago", f"({micro(ago(3))})"]
    assert "Pods            not matched (POD and K8S NODE are -): forbidden: list pods" in refused.splitlines()


# -- list --------------------------------------------------------------------------------------


def listed(namespace: str, name: str, created: datetime, **status: Any) -> dict[str, Any]:
    """A Rendezvous as ``list`` gets it (metadata, the status summary the writers keep)."""
    metadata = {"name": name, "namespace": namespace, "creationTimestamp": micro(created)}
    return {"apiVersion": "kube-rendezvous.io/v1alpha1", "kind": "Rendezvous", "metadata": metadata, **status}


def test_the_printer_columns_are_the_crds() -> None:
    crd = yaml.safe_load((REPO / "crds" / "rendezvous.yaml").read_text())
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]

    assert list(PRINTER_COLUMNS) == [
        (item["name"], item["jsonPath"].replace("\\\\", "\\"), item["type"], item.get("priority", 0))
        for item in columns
    ]


def test_list_prints_the_printer_columns_sorted_with_the_namespace_for_all_namespaces() -> None:
    ready = {"conditions": [{"type": "Progressing", "status": "True"}, {"type": "Ready", "status": "False"}]}
    summary = {"phase": "Complete", "round": 3, "participantCount": 2, "minNodes": 2, "maxNodes": 4}
    objects = [
        listed("team-b", "bert", ago(3 * 86400 + 4 * 3600), status={**summary, "roundStartTime": micro(ago(125))}),
        listed("team-a", "llama", ago(30), status={**summary, **ready, "waitingCount": 1, "spareCount": 0}),
        listed("team-a", "gpt", ago(601)),  # no status yet
    ]

    rows = list_rows(objects, NOW, all_namespaces=True)
    wide = list_rows(objects, NOW, wide=True)

    assert rows == [
        "NAMESPACE   NAME    PHASE      ROUND    MEMBERS   MIN      MAX      WAITING   SPARES   ROUND-AGE   AGE",
        "team-a      gpt     <none>     <none>   <none>    <none>   <none>   <none>    <none>   <none>      10m",
        "team-a      llama   Complete   3        2         2        4        1         0        <none>      30s",
        "team-b      bert    Complete   3        2         2        4        <none>    <none>   2m5s        3d4h",
    ]
    assert wide[0].split() == [
        "NAME", "PHASE", "ROUND", "MEMBERS", "MIN", "MAX", "WAITING", "SPARES", "HELD", "ORDER", "ROUND-AGE",
        "READY", "RUN", "AGE",
    ]  # fmt: skip
    assert wide[2].split()[11] == "False"  # Ready, by the filter of its JSONPath
    assert list_rows([], NOW) == []
    assert no_resources("team-a") == "No resources found in team-a namespace."
    assert no_resources(None) == "No resources found"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (599, "9m59s"),
        (600, "10m"),
        (3 * 3600, "3h"),
        (7 * 3600 + 300, "7h5m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (200 * 86400, "200d"),
        ((2 * 365 + 10) * 86400, "2y10d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_ages_are_kubectls(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


# -- -o and jsonpath ---------------------------------------------------------------------------

LIST = {
    "kind": "List",
    "items": [
        {
            "metadata": {"name": "a", "labels": {"kube-rendezvous.io/rendezvous": "x"}},
            "status": {"round": 3, "conditions": [{"type": "Ready", "status": "True"}, {"type": "Closed"}]},
        },
        {"metadata": {"name": "b"}, "spec": {"closed": True, "minNodes": 1}},
    ],
}


@pytest.mark.parametrize(
    ("template", "printed"),
    [
        ("{.items[*].metadata.name}", "a b"),
        ("{range .items[*]}{.metadata.name}{'\\t'}{.status.round}{\"\\n\"}{end}", "a\t3\nb\t\n"),
        ("{range .items}{.metadata.name},{end}", "a,b,"),
        ("{.items[0].status.conditions[?(@.type=='Ready')].status}", "True"),
        ("{.items[?(@.spec.closed==true)].metadata.name}", "b"),
        ("{.items[?(@.spec.closed)].metadata.name}", "b"),
        ("{.items[?(@.status.round>=3)].metadata.name}", "a"),
        ("{.items[?(@.status.round!=4)].metadata.name}", "a"),  # b has no round: not compared
        ("{.items[?(@.spec.minNodes=='1')].metadata.name}", ""),  # a string is not a number
        ("{.items[0].metadata.labels.kube-rendezvous\\.io/rendezvous}", "x"),
        ("{.items[0].metadata.labels['kube-rendezvous.io/rendezvous']}", "x"),
        ("{.items[-1].spec}", '{"closed":true,"minNodes":1}'),
        ("{.items[0:1].metadata.name}", "a"),
        ("{..name}", "a b"),
        ("{$.kind}: {.items[*].status.conditions[*].type}", "List: Ready Closed"),
        ("{.items[1].status.round}{.nothing.here}", ""),  # missing keys print nothing
        ("{range .items[*]}{$.kind}{end}", "ListList"),
        ("plain text", "plain text"),
    ],
)
def test_jsonpath_prints_what_kubectl_prints(template: str, printed: str) -> None:
    assert render_data(LIST, "jsonpath", template) == printed


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{.items[0}", "'[' at 6 is not closed"),
        ("{.items", "unclosed action"),
        ("{range .items[*]}{.a}", "{range ...} without {end}"),
        ("{end}", "{end} without {range ...}"),
        ("{.items[x]}", "[x] is not [N]"),
        ("{.items[?(@.a=~'b')]}", "is not [?(@.path)] or [?(@.path OP literal)]"),
        ("{.items[?(@.a==b)]}", "'b' is not a quoted string, number"),
        ("{items}", "a path starts with"),
        ("{.a.}", "a name is missing after '.'"),
    ],
)
def test_a_bad_jsonpath_is_one_line_naming_what_is_wrong(template: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)) as failure:
        parse_output(f"jsonpath={template}")
    assert str(failure.value).startswith(f"error parsing jsonpath {template!r}: ")


def test_output_formats() -> None:
    report = {"phase": "Complete", "round": 3, "nodes": [{"node": "a", "rank": 0}]}

    assert parse_output("yaml") == ("yaml", None)
    assert parse_output("jsonpath={.round}") == ("jsonpath", "{.round}")
    with pytest.raises(ValueError, match="use one of text, wide, json, yaml, jsonpath=TEMPLATE"):
        parse_output("xml")
    assert yaml.safe_load(render_data(report, "yaml")) == report
    assert render_data(report, "yaml").splitlines()[0] == "phase: Complete"  # in the report's order
    assert json.loads(render_data(report, "json")) == report
    assert render_data(report, "jsonpath", "{.nodes[0].node}") == "a"
    assert as_list([report])["items"] == [report] and as_list([])["kind"] == "List"


# -- close, exit codes, version, krew ----------------------------------------------------------


def test_close_says_what_it_would_do_asks_and_refuses_without_a_terminal() -> None:
    obj = rendezvous(None, {}, round=3, participantCount=2)

    assert close_prompt("ns", "job", obj) == (
        "Close Rendezvous ns/job (round 3, 2 participants)? The agents end the job; this cannot be undone. [y/N]: "
    )
    assert close_dry_run("ns", "job", rendezvous(None, {}), "client") == (
        "Rendezvous ns/job (no round yet, 0 participants) would be closed: a merge patch would set spec.closed to "
        "true (dry run); nothing changed. Without --dry-run this cannot be undone."
    )
    assert "the API server accepted the patch (server dry run); nothing changed" in close_dry_run(
        "ns", "j", obj, "server"
    )
    refusal = close_refusal("ns", "job")
    assert "stdin is not a terminal" in refusal and "pass --yes (-y)" in refusal and "--dry-run" in refusal
    assert [confirmed(answer) for answer in ("y\n", " YES ", "", "n", "yess")] == [True, True, False, False, False]


@pytest.mark.parametrize(
    "argv",
    [
        ["bogus"],
        ["status"],  # no NAME
        ["list", "-o", "xml"],
        ["list", "-o", "jsonpath={.a"],
        ["close", "job", "--dry-run=maybe"],
        ["watch", "job", "--max-events", "0"],
        ["evict", "job"],
    ],
)
def test_a_usage_error_exits_1_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        kubectl_rdzv.run(argv)

    assert exit_.value.code == EXIT_ERROR == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and "--help)" in error


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        kubectl_rdzv.run(["--version"])

    assert exit_.value.code == EXIT_OK
    assert capsys.readouterr().out == f"kubectl-rdzv {importlib.metadata.version('kube-rendezvous')}\n"


def test_the_krew_manifest_names_the_package_version() -> None:
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)[1]  # type: ignore[index]
    manifest = yaml.safe_load((REPO / "plugins" / "rdzv.yaml").read_text())

    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "rdzv"
    assert manifest["spec"]["version"] == f"v{version}"
    assert manifest["spec"]["shortDescription"] and manifest["spec"]["homepage"].startswith("https://")
    (platform,) = manifest["spec"]["platforms"]
    assert platform["uri"].endswith(f"/v{version}/kubectl-rdzv-{version}.tar.gz")  # dist/kubectl-rdzv-<version>.tar.gz
    assert re.fullmatch(r"[0-9a-f]{64}", platform["sha256"])
    assert platform["bin"] == "kubectl-rdzv" and {"from": "kubectl-rdzv", "to": "."} in platform["files"]
