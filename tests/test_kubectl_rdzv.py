"""``kubectl rdzv`` (console script ``kubectl-rdzv``) against the real control plane.

States are real: a valid state document written into the status with the admin client, node and
writer Leases as the backend's contract describes them. The plugin runs as a subprocess with the
admin kubeconfig (or a ServiceAccount's, for the refusal), and the tests assert on what it prints.
"""

from __future__ import annotations

import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_rendezvous._cli import kubectl_rdzv
from kube_rendezvous._rules import kubectl_rdzv_rules as kubectl_rdzv_report
from kube_rendezvous._rules.document import NodeId, RendezvousDocument, encode_document
from kube_rendezvous._rules.summary import format_time, parse_time, summarize_document
from kubernetes import client

from tests.helpers import REPO, create_rendezvous
from tests.testenv import ControlPlane, wait_until

PLUGIN = Path(sys.executable).with_name("kubectl-rdzv")
GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"
MERGE = "application/merge-patch+json"

A = NodeId("10.0.0.1", 100, 0)
B = NodeId("10.0.0.2", 200, 0)
C = NodeId("10.0.0.3", 300, 1)

pytestmark = pytest.mark.usefixtures("crds")


@pytest.fixture
def leases(admin_api: client.ApiClient) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(admin_api)


def plugin(control_plane: ControlPlane, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed console script with the admin kubeconfig (or ``kubeconfig``)."""
    assert PLUGIN.exists(), f"{PLUGIN} is missing: pip install -e . so the console script exists"
    return subprocess.run(
        [str(PLUGIN), "--kubeconfig", str(kubeconfig or control_plane.admin_kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
        stdin=subprocess.DEVNULL,  # no terminal: close asks nothing, it refuses without --yes
    )


def ago(seconds: float) -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=seconds)


def microtime(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_state(
    objects: client.CustomObjectsApi, namespace: str, name: str, document: RendezvousDocument, **status: Any
) -> None:
    """Write ``document`` into the status as the agents do (the document and its summary)."""
    body = {
        "status": {
            "state": encode_document(document),
            **summarize_document(document, now=datetime.now(timezone.utc), writer=str(A)),
            **status,
        }
    }
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body, _content_type=MERGE)


def get(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    result: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return dict(result)


def create_lease(
    leases: client.CoordinationV1Api,
    namespace: str,
    rendezvous_name: str,
    lease_name: str,
    kind: str,
    renewed: datetime,
    *,
    node: NodeId | None = None,
    holder: str | None = None,
) -> None:
    """A node or writer Lease as the backend's contract describes it."""
    metadata: dict[str, Any] = {
        "name": lease_name,
        "labels": {"kube-rendezvous.io/rendezvous": rendezvous_name, "kube-rendezvous.io/lease": kind},
    }
    if node is not None:
        metadata["annotations"] = {"kube-rendezvous.io/node": str(node)}
    spec: dict[str, Any] = {"renewTime": microtime(renewed), "leaseDurationSeconds": 15}
    if holder is not None:
        spec["holderIdentity"] = holder
    body: Any = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
    leases.create_namespaced_lease(namespace, body)


def complete_round(heartbeat_age: float = 1.0) -> RendezvousDocument:
    """Round 3, complete: A rank 0, B rank 1; C waits for the next round."""
    beat = ago(heartbeat_age)
    return RendezvousDocument(
        round=3,
        complete=True,
        participants={A: 0, B: 1},
        wait_list=frozenset({C}),
        last_heartbeats={A: beat, B: beat, C: beat},
    )


def table_row(output: str, node: NodeId) -> list[str]:
    """The cells of ``node``'s row in the status table: node, role, rank, pod, Kubernetes node and the heartbeat
    column as one cell, last (the DOMAIN column, ``-`` here, left out)."""
    for line in output.splitlines():
        if line.startswith(str(node) + " "):
            cells = line.split(None, 6)
            assert cells[5] == "-", f"no topology here, so no domain: {line}"
            return [*cells[:5], cells[6]]
    raise AssertionError(f"no row for {node} in:\n{output}")


def create_pod(core: client.CoreV1Api, namespace: str, name: str, node: str, address: str) -> None:
    """A Running pod bound to Kubernetes node ``node`` with pod IP ``address`` (played: no kubelet)."""
    container = client.V1Container(name="agent", image="trainer:latest")
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name), spec=client.V1PodSpec(node_name=node, containers=[container])
    )
    core.create_namespaced_pod(namespace, pod)
    status = {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
    core.patch_namespaced_pod_status(name, namespace, status)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# -- status ------------------------------------------------------------------------------------


def test_status_shows_ranks_waiting_writer_pods_and_lease_heartbeats(
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    leases: client.CoordinationV1Api,
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    create_rendezvous(objects, namespace, "job", minNodes=2, maxNodes=4)
    # The document's heartbeats are old; the Leases are the truth: A 2 s ago, B 40 s ago (expired), C 1 s ago.
    history = [
        {"round": 2, "startTime": "2026-01-01T10:00:00Z", "formedTime": "2026-01-01T10:00:12Z", "nodes": 3},
        {"round": 3, "startTime": "2026-01-01T10:05:00Z", "formedTime": "2026-01-01T10:05:04Z", "nodes": 2},
    ]
    write_state(objects, namespace, "job", complete_round(heartbeat_age=600), recentRounds=history)
    create_lease(leases, namespace, "job", "job-node-a", "node", ago(2), node=A)
    create_lease(leases, namespace, "job", "job-node-b", "node", ago(40), node=B)
    create_lease(leases, namespace, "job", "job-node-c", "node", ago(1), node=C)
    create_lease(leases, namespace, "job", "job-writer", "writer", ago(1), holder="operator/kube-rendezvous-0")
    create_lease(leases, namespace, "other", "other-node-a", "node", ago(1), node=NodeId("10.9.9.9", 1, 0))
    create_pod(client.CoreV1Api(admin_api), namespace, "trainer-0", "gpu-1", A.addr)

    result = plugin(control_plane, "-n", namespace, "status", "job")

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{namespace}/job" in out
    assert "Complete (round 3, complete, open)" in out
    assert "2 participants, 1 waiting, 0 redundant (minNodes 2, maxNodes 4)" in out
    assert "nothing: the round is complete" in out
    assert "operator/kube-rendezvous-0 (writer Lease renewed" in out
    assert "from node Leases" in out
    assert "round 2 formed in 12s with 3 nodes, round 3 formed in 4s with 2 nodes" in out  # status.recentRounds
    assert table_row(out, A)[1:5] == ["participant", "0", "trainer-0", "gpu-1"]  # its pod, by pod IP
    assert table_row(out, B)[3:5] == ["-", "-"]  # no pod has its address
    assert table_row(out, B)[1:3] == ["participant", "1"]
    assert table_row(out, C)[1:3] == ["waiting", "-"]
    assert table_row(out, B)[-1].endswith("(expired)")
    assert not table_row(out, A)[-1].endswith("(expired)")
    assert table_row(out, A)[-1].endswith("s ago") and int(table_row(out, A)[-1].split("s")[0]) < 30
    assert "10.9.9.9" not in out  # another Rendezvous's Lease


def test_status_json_of_a_forming_round_counts_missing_nodes_with_document_heartbeats(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job", minNodes=3, maxNodes=4)
    document = RendezvousDocument(
        round=2, participants={A: 0, B: 0}, redundancy_list=frozenset({C}), last_heartbeats={A: ago(7), B: ago(7)}
    )
    started = format_time(ago(30))
    write_state(objects, namespace, "job", document, evictedNodes=["10.0.0.9_9_0"], roundStartTime=started)

    result = plugin(control_plane, "status", "job", "-n", namespace, "-o", "json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["phase"] == "Joining"
    assert (report["round"], report["complete"], report["closed"]) == (2, False, False)
    assert report["nodesStillNeeded"] == 1
    assert (report["participantCount"], report["waitingCount"], report["redundantCount"]) == (2, 0, 1)
    assert report["heartbeatSource"] == "document"
    assert report["writer"] is None
    assert report["roundDurations"] == [] and "none recorded yet" in report["roundDurationsNote"]
    assert kubectl_rdzv_report.parse_microtime(report["roundFormingSince"]) == parse_time(started)
    text = plugin(control_plane, "status", "job", "-n", namespace).stdout
    forming = next(line for line in text.splitlines() if line.startswith("Forming"))
    assert forming.split()[1] == "began" and 29 <= int(forming.split()[2].rstrip("s")) < 60, forming
    assert report["evictedNodes"] == ["10.0.0.9_9_0"]
    by_node = {item["node"]: item for item in report["nodes"]}
    assert by_node[str(A)]["role"] == "participant" and by_node[str(A)]["rank"] == 0
    assert by_node[str(C)]["role"] == "redundant" and by_node[str(C)]["heartbeatAgeSeconds"] is None
    assert 6 <= by_node[str(B)]["heartbeatAgeSeconds"] < 60


def test_status_of_a_round_in_last_call_shows_its_deadline(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job", minNodes=2, maxNodes=3, lastCallTimeoutSeconds=30)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=20)
    document = RendezvousDocument(round=5, participants={A: 0, B: 0}, deadline=deadline, last_heartbeats={A: ago(1)})
    write_state(objects, namespace, "job", document)

    result = plugin(control_plane, "-n", namespace, "status", "job")

    assert result.returncode == 0, result.stderr
    assert "LastCall (round 5, forming, open)" in result.stdout
    assert "0 more nodes (minNodes 2 reached); more are admitted up to maxNodes 3 until the deadline" in result.stdout
    # The deadline minus the spec's 30 s last call: minNodes was reached about 10 s ago.
    reached = re.search(r"minNodes reached about (\d+)s ago", result.stdout)
    assert reached is not None, result.stdout
    assert 8 <= int(reached.group(1)) <= 30


def test_status_says_why_the_last_formed_round_was_broken(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job", minNodes=2)
    write_state(objects, namespace, "job", complete_round())

    before = plugin(control_plane, "-n", namespace, "status", "job")
    before_json = plugin(control_plane, "-n", namespace, "status", "job", "-o", "json")

    assert before.returncode == 0 and before_json.returncode == 0, before.stderr + before_json.stderr
    assert "Last departure  none recorded (status.lastDeparture is not set)" in before.stdout
    assert json.loads(before_json.stdout)["lastDeparture"] is None

    # As a writer records it when a formed round loses a member (status.lastDeparture, written as admin here).
    departure = {
        "round": 3,
        "time": "2026-12-04T20:40:02Z",
        "count": 1,
        "nodes": [{"node": "10.0.0.2_7_3", "reason": "Left"}],
    }
    write_state(objects, namespace, "job", complete_round(), lastDeparture=departure)

    text = plugin(control_plane, "-n", namespace, "status", "job")
    report = plugin(control_plane, "-n", namespace, "status", "job", "-o", "json")

    assert text.returncode == 0 and report.returncode == 0, text.stderr + report.stderr
    line = next(line for line in text.stdout.splitlines() if line.startswith("Last departure"))
    assert line == "Last departure  node 10.0.0.2_7_3 left round 3 (at 2026-12-04T20:40:02Z)", line
    assert json.loads(report.stdout)["lastDeparture"] == departure


def test_status_of_a_rendezvous_without_state_is_pending(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job", minNodes=2)

    result = plugin(control_plane, "-n", namespace, "status", "job")

    assert result.returncode == 0, result.stderr
    assert "Pending (no agent has written the state yet)" in result.stdout
    assert "2 more nodes to reach minNodes 2" in result.stdout


def test_status_of_a_missing_rendezvous_is_one_line(control_plane: ControlPlane, namespace: str) -> None:
    result = plugin(control_plane, "-n", namespace, "status", "nope")

    assert_one_line_error(result, f"Rendezvous {namespace}/nope not found", f"kubectl get rdzv -n {namespace}")


def test_status_of_an_invalid_state_names_the_field_and_the_fix(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job")
    body = {"status": {"state": "kr1:not base64!"}}
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "job", body, _content_type=MERGE)

    result = plugin(control_plane, "-n", namespace, "status", "job")

    assert_one_line_error(result, f"{namespace}/job", "status.state text", "invalid base64", "kubectl patch rdzv job")


def test_a_refused_read_names_the_permission(control_plane: ControlPlane, namespace: str) -> None:
    nobody = control_plane.serviceaccount_kubeconfig(namespace, "nobody")

    result = plugin(control_plane, "-n", namespace, "status", "job", kubeconfig=nobody)
    everywhere = plugin(control_plane, "list", "-A", kubeconfig=nobody)

    assert_one_line_error(result, "forbidden", "'get' on 'rendezvouses'", f"namespace '{namespace}'")
    assert_one_line_error(everywhere, "in all namespaces", "ClusterRole", "-n NAMESPACE", "can-i list rendezvouses")


def test_status_without_permission_on_leases_falls_back_to_the_document_and_says_why(
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    leases: client.CoordinationV1Api,
    namespace: str,
) -> None:
    create_rendezvous(objects, namespace, "job")
    write_state(objects, namespace, "job", complete_round(heartbeat_age=5))
    create_lease(leases, namespace, "job", "job-node-a", "node", ago(1), node=A)
    reader = control_plane.serviceaccount_kubeconfig(namespace, "reader")
    control_plane.kubectl(
        "-n", namespace, "create", "role", "rdzv-reader", "--verb=get", f"--resource={PLURAL}.{GROUP}"
    )
    control_plane.kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        "rdzv-reader",
        "--role=rdzv-reader",
        f"--serviceaccount={namespace}:reader",
    )
    wait_until(
        lambda: plugin(control_plane, "-n", namespace, "status", "job", kubeconfig=reader).returncode == 0,
        30,
        "the reader RoleBinding to apply",
    )

    result = plugin(control_plane, "-n", namespace, "status", "job", kubeconfig=reader)

    assert result.returncode == 0, result.stderr
    assert "from the state document (no node Leases); forbidden: you may not list leases" in result.stdout
    pods = "Pods            not matched (POD and K8S NODE are -): forbidden: you may not list pods (the core API group)"
    assert pods in result.stdout and f"(check with: kubectl auth can-i list pods -n {namespace})" in result.stdout
    assert table_row(result.stdout, A)[-1].endswith("s ago")
    assert int(table_row(result.stdout, A)[-1].split("s")[0]) >= 5  # the document's beat, not the Lease's (1 s)


def test_kubectl_finds_the_plugin_on_path(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job")
    write_state(objects, namespace, "job", complete_round())
    environment = dict(
        os.environ,
        PATH=f"{PLUGIN.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        KUBECONFIG=str(control_plane.admin_kubeconfig),
    )

    result = subprocess.run(
        [str(control_plane.binaries.kubectl), "rdzv", "-n", namespace, "status", "job"],
        capture_output=True,
        text=True,
        timeout=90,
        env=environment,
    )

    assert result.returncode == 0, result.stderr
    assert "Complete (round 3, complete, open)" in result.stdout


def test_an_unknown_context_is_one_line(control_plane: ControlPlane) -> None:
    result = plugin(control_plane, "--context", "no-such-context", "status", "job")

    assert_one_line_error(result, "no-such-context", "--context")


# -- list and -o ------------------------------------------------------------------------------


def test_list_prints_like_kubectl_get_in_one_or_all_namespaces_and_as_json_yaml_or_jsonpath(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job", minNodes=2, maxNodes=4)
    create_rendezvous(objects, namespace, "alpha")
    write_state(objects, namespace, "job", complete_round(), minNodes=2, maxNodes=4)  # as the agents' --nnodes

    listed = plugin(control_plane, "-n", namespace, "list")
    everywhere = plugin(control_plane, "ls", "-A")
    as_json = plugin(control_plane, "-n", namespace, "list", "-o", "json")
    as_yaml = plugin(control_plane, "list", "-n", namespace, "-o", "yaml")
    names = plugin(control_plane, "-n", namespace, "list", "-o", "jsonpath={.items[*].metadata.name}")
    status_round = plugin(control_plane, "-n", namespace, "status", "job", "-o", "jsonpath={.round} {.nodes[0].role}")
    status_yaml = plugin(control_plane, "-n", namespace, "status", "job", "-o", "yaml")
    empty = plugin(control_plane, "-n", f"{namespace}-none", "list")

    for result in (listed, everywhere, as_json, as_yaml, names, status_round, status_yaml, empty):
        assert result.returncode == 0, result.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PHASE",
        "ROUND",
        "MEMBERS",
        "MIN",
        "MAX",
        "WAITING",
        "SPARES",
        "ROUND-AGE",
        "AGE",
    ]
    assert [line.split()[:6] for line in lines[1:]] == [
        ["alpha", "<none>", "<none>", "<none>", "<none>", "<none>"],  # no agent has written a state
        ["job", "Complete", "3", "2", "2", "4"],
    ]
    assert everywhere.stdout.splitlines()[0].startswith("NAMESPACE ")
    assert [line.split()[:2] for line in everywhere.stdout.splitlines() if line.startswith(namespace + " ")] == [
        [namespace, "alpha"],
        [namespace, "job"],
    ]
    listing = json.loads(as_json.stdout)
    assert listing["kind"] == "List" and [item["metadata"]["name"] for item in listing["items"]] == ["alpha", "job"]
    assert listing["items"][0]["kind"] == "Rendezvous"
    assert [item["metadata"]["name"] for item in yaml.safe_load(as_yaml.stdout)["items"]] == ["alpha", "job"]
    assert names.stdout == "alpha job\n"
    assert status_round.stdout == "3 participant\n"
    assert yaml.safe_load(status_yaml.stdout)["phase"] == "Complete"
    assert empty.stdout == "" and empty.stderr == f"No resources found in {namespace}-none namespace.\n"


# -- close -------------------------------------------------------------------------------------


def test_close_sets_spec_closed_once(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job")
    write_state(objects, namespace, "job", complete_round())

    first = plugin(control_plane, "-n", namespace, "close", "job", "--yes")

    assert first.returncode == 0, first.stderr
    assert f"Rendezvous {namespace}/job closed: spec.closed set to true (round 3, 2 participants)" in first.stdout
    assert get(objects, namespace, "job")["spec"]["closed"] is True
    version = get(objects, namespace, "job")["metadata"]["resourceVersion"]
    again = plugin(control_plane, "-n", namespace, "close", "job", "-y")
    assert again.returncode == 0, again.stderr
    assert "already closed" in again.stdout
    assert get(objects, namespace, "job")["metadata"]["resourceVersion"] == version
    status = plugin(control_plane, "-n", namespace, "status", "job")
    assert "spec.closed is true; the agents have not applied it yet" in status.stdout


class AnsweringTerminal(io.StringIO):
    """stdin of a terminal on which the user types ``answer``."""

    def isatty(self) -> bool:
        return True


def test_close_changes_nothing_in_a_dry_run_and_asks_first_or_refuses_without_a_terminal(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job")
    write_state(objects, namespace, "job", complete_round())
    version = get(objects, namespace, "job")["metadata"]["resourceVersion"]
    kubeconfig = ["--kubeconfig", str(control_plane.admin_kubeconfig), "-n", namespace]

    client_dry = plugin(control_plane, "-n", namespace, "close", "--dry-run", "job")
    server_dry = plugin(control_plane, "-n", namespace, "close", "job", "--dry-run=server")
    refused = plugin(control_plane, "-n", namespace, "close", "job")
    declined = kubectl_rdzv.run([*kubeconfig, "close", "job"], out=io.StringIO(), stdin=AnsweringTerminal("n\n"))

    assert client_dry.returncode == 0 and server_dry.returncode == 0, client_dry.stderr + server_dry.stderr
    assert f"Rendezvous {namespace}/job (round 3, 2 participants) would be closed" in client_dry.stdout
    assert "the API server accepted the patch (server dry run); nothing changed" in server_dry.stdout
    assert refused.returncode == 1
    assert_one_line_error(refused, "refusing to close", "stdin is not a terminal", "--yes")
    assert declined == 1
    assert get(objects, namespace, "job")["metadata"]["resourceVersion"] == version  # nothing was written
    out = io.StringIO()
    assert kubectl_rdzv.run([*kubeconfig, "close", "job"], out=out, stdin=AnsweringTerminal("yes\n")) == 0
    assert f"Rendezvous {namespace}/job closed" in out.getvalue()
    assert get(objects, namespace, "job")["spec"]["closed"] is True


def test_close_of_a_missing_rendezvous_is_one_line(control_plane: ControlPlane, namespace: str) -> None:
    result = plugin(control_plane, "-n", namespace, "close", "nope", "--yes")

    assert_one_line_error(result, f"Rendezvous {namespace}/nope not found")


# -- evict -------------------------------------------------------------------------------------


def test_evict_adds_the_node_to_evicted_nodes(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job")
    write_state(objects, namespace, "job", complete_round(), evictedNodes=["10.0.0.9_9_0"])

    result = plugin(control_plane, "-n", namespace, "evict", "job", str(B))

    assert result.returncode == 0, result.stderr
    assert f"node {B} (participant of round 3) added to status.evictedNodes" in result.stdout
    assert get(objects, namespace, "job")["status"]["evictedNodes"] == ["10.0.0.9_9_0", str(B)]
    again = plugin(control_plane, "-n", namespace, "evict", "job", str(B))
    assert again.returncode == 0, again.stderr
    assert "already in status.evictedNodes" in again.stdout
    assert get(objects, namespace, "job")["status"]["evictedNodes"] == ["10.0.0.9_9_0", str(B)]


def test_evict_of_a_node_not_in_the_state_is_refused_and_lists_the_known_nodes(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job")
    write_state(objects, namespace, "job", complete_round())
    version = get(objects, namespace, "job")["metadata"]["resourceVersion"]

    result = plugin(control_plane, "-n", namespace, "evict", "job", "10.0.0.1_999_0")

    assert_one_line_error(
        result, "'10.0.0.1_999_0' is not in the state", f"{namespace}/job", "nothing was changed", f"{A}, {B}, {C}"
    )
    after = get(objects, namespace, "job")
    assert after["metadata"]["resourceVersion"] == version
    assert "evictedNodes" not in after["status"]


def test_concurrent_evictions_are_all_kept(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    # Eight evictions released at once (in-process, so none waits for an interpreter to start):
    # a read-modify-write without the compare-and-swap loses some of them.
    nodes = [NodeId(f"10.0.1.{index}", 1000 + index, 0) for index in range(8)]
    document = RendezvousDocument(round=1, complete=True, participants={node: rank for rank, node in enumerate(nodes)})
    create_rendezvous(objects, namespace, "job", maxNodes=8)
    write_state(objects, namespace, "job", document)
    barrier = threading.Barrier(len(nodes))
    codes: dict[str, int] = {}

    def evict(node: NodeId) -> None:
        argv = ["--kubeconfig", str(control_plane.admin_kubeconfig), "-n", namespace, "evict", "job", str(node)]
        barrier.wait(30)
        codes[str(node)] = kubectl_rdzv.run(argv, out=io.StringIO())

    threads = [threading.Thread(target=evict, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)

    assert codes == {str(node): 0 for node in nodes}
    assert sorted(get(objects, namespace, "job")["status"]["evictedNodes"]) == sorted(str(node) for node in nodes)


def test_evict_from_a_missing_rendezvous_is_one_line(control_plane: ControlPlane, namespace: str) -> None:
    result = plugin(control_plane, "-n", namespace, "evict", "nope", str(A))

    assert_one_line_error(result, f"Rendezvous {namespace}/nope not found")


# -- watch -------------------------------------------------------------------------------------


@pytest.fixture
def watch_process(control_plane: ControlPlane) -> Iterator[list[subprocess.Popen[str]]]:
    """Holds the watch processes a test starts; kills any still running afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def read_lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def next_line(lines: queue.Queue[str], timeout: float, what: str) -> str:
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no line within {timeout} s: expected {what}") from None


def test_watch_prints_a_line_for_each_change_of_the_object_and_its_leases(
    control_plane: ControlPlane,
    objects: client.CustomObjectsApi,
    leases: client.CoordinationV1Api,
    namespace: str,
    watch_process: list[subprocess.Popen[str]],
) -> None:
    create_rendezvous(objects, namespace, "job", minNodes=2)
    write_state(objects, namespace, "job", complete_round())
    process = subprocess.Popen(
        [
            str(PLUGIN),
            "--kubeconfig",
            str(control_plane.admin_kubeconfig),
            "-n",
            namespace,
            "watch",
            "job",
            "--max-events",
            "2",
            "--timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watch_process.append(process)
    lines = read_lines(process)
    first = next_line(lines, 30, "the current status")
    assert "now" in first and "Complete round=3 participants=2 waiting=1" in first

    document = RendezvousDocument(round=4, participants={A: 0, B: 0, C: 0}, last_heartbeats={A: ago(1)})
    write_state(objects, namespace, "job", document)
    change = next_line(lines, 30, "the state change")
    assert "Rendezvous MODIFIED" in change and "Joining round=4 participants=3 waiting=0" in change
    assert "needed=0" in change

    create_lease(leases, namespace, "job", "job-writer", "writer", ago(0), holder="agent/10.0.0.1_100_0")
    lease_change = next_line(lines, 30, "the writer Lease")
    assert "writer Lease ADDED (holder agent/10.0.0.1_100_0)" in lease_change
    assert "writer=agent/10.0.0.1_100_0" in lease_change

    assert process.wait(30) == 0, process.stderr.read() if process.stderr else ""


def test_watch_ends_at_its_timeout_without_changes(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_rendezvous(objects, namespace, "job")
    started = time.monotonic()

    result = plugin(control_plane, "-n", namespace, "watch", "job", "--timeout", "2")

    assert result.returncode == 0, result.stderr
    assert 2 <= time.monotonic() - started < 60
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "Pending round=-" in lines[0]


def test_watch_of_a_missing_rendezvous_is_one_line(control_plane: ControlPlane, namespace: str) -> None:
    result = plugin(control_plane, "-n", namespace, "watch", "nope", "--timeout", "5")

    assert_one_line_error(result, f"Rendezvous {namespace}/nope not found")


# -- packaging ---------------------------------------------------------------------------------


def test_the_plugin_imports_no_framework_and_no_operator() -> None:
    code = (
        "import sys, kube_rendezvous._cli.kubectl_rdzv; "
        "print([m for m in sys.modules if m.split('.')[0] in ('tensorplay', 'torch', 'kopf')])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
