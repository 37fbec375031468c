"""A job's whole life, not one fault in one run: re-runs under the same name, closes, and what each agent says.

Real agents (tensorplay's launcher and stock torchrun) as separate processes with a training pod's
ServiceAccount token, on the real API server with RBAC on; the operator is not running (the data path
needs only the API server). Each test injects the user's action where it happens: an earlier run's
Rendezvous left closed or held by a finalizer, a ``kubectl patch`` of ``spec.closed``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._rules.document import RendezvousDocument, encode_document
from kube_rendezvous._rules.retries import FENCED_REJOIN_PAUSE
from kubernetes import client

from tests.e2e.harness import ElasticJob, training_in_world
from tests.helpers import REPO, create_rendezvous, holds_for, rendezvous_parameters
from tests.testenv import ControlPlane, wait_until

MakeJob = Callable[..., ElasticJob]
GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"
#: A finalizer of somebody else's (an operator of the last release, a backup tool) that holds a deletion.
FOREIGN_FINALIZER = "example.com/hold"
#: The annotation of a Rendezvous created in place of one that recorded another run's end (README).
REPLACES_ANNOTATION = "kube-rendezvous.io/replaces"


def earlier_run_ended(objects: client.CustomObjectsApi, namespace: str, *, closed_by_person: bool) -> str:
    """Leave Rendezvous ``job`` as run ``run-a`` left it when it ended; return its UID."""
    create_rendezvous(objects, namespace, minNodes=2, maxNodes=2, closed=closed_by_person)
    objects.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "job",
        {"status": {"runId": "run-a", "closed": True, "phase": "Closed", "lastChangeTime": "2026-12-01T10:00:00Z"}},
    )
    found: dict[str, Any] = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job")  # type: ignore[assignment]
    return str(found["metadata"]["uid"])


def rendezvous(objects: client.CustomObjectsApi, namespace: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job")  # type: ignore[assignment]
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


class TestRunsNeverInheritEachOthersEnd:
    def test_a_re_run_waits_for_the_last_runs_rendezvous_being_deleted_then_trains_in_its_own(
        self, make_job: MakeJob, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        """A Job re-created while the old Rendezvous waits on a finalizer: the new agents wait, say why, then train."""
        old_uid = earlier_run_ended(objects, namespace, closed_by_person=False)
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "job", {"metadata": {"finalizers": [FOREIGN_FINALIZER]}}
        )
        objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "job")
        job = make_job(nnodes="2", run_id="run-b")
        agents = job.start(2)
        wait_until(
            lambda: all(not agent.alive() or "this run waits for it to go" in agent.output() for agent in agents),
            90,
            "both agents to say they wait for the deletion",
            explain=job.last_lines,
        )
        assert all(agent.alive() for agent in agents), job.logs()  # before the fix: exit 0, untrained
        assert FOREIGN_FINALIZER in agents[0].output()  # the log names what holds the deletion
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "job", {"metadata": {"finalizers": None}}
        )
        assert job.wait(agents, 180) == [0, 0], job.logs()
        assert len(job.results()) == 4, job.logs()  # 2 agents x 2 workers trained to the end
        new = rendezvous(objects, namespace)
        assert new is not None and new["metadata"]["uid"] != old_uid
        assert new["status"]["runId"] == "run-b"

    def test_a_re_run_replaces_a_rendezvous_a_person_closed_for_the_last_run_and_trains(
        self, make_job: MakeJob, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        """``kubectl rdzv close`` ended run-a; spec.closed cannot be reset, and run-b must not take it as its close."""
        old_uid = earlier_run_ended(objects, namespace, closed_by_person=True)
        job = make_job(nnodes="2", run_id="run-b")
        agents = job.start(2)
        assert job.wait(agents, 180) == [0, 0], job.logs()
        assert len(job.results()) == 4, job.logs()  # before the fix: 0 results, both exited 0 at once
        new = rendezvous(objects, namespace)
        assert new is not None and new["metadata"]["uid"] != old_uid
        assert new["metadata"]["annotations"][REPLACES_ANNOTATION] == f"{old_uid} (run run-a)"
        assert (new["status"]["runId"], new["status"]["phase"]) == ("run-b", "Closed")
        assert new["status"]["closeReason"].startswith("Succeeded: the run finished")
        output = agents[0].output() + agents[1].output()
        assert "closed by a person (spec.closed) for run run-a" in output
        assert output.count("run run-b finished: this agent's workers succeeded") == 2  # why each agent exits 0

    def test_a_re_run_trains_although_every_agent_of_the_last_run_was_killed_and_its_leases_stay(
        self, make_job: MakeJob, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        """The last run's pods all killed (its Job deleted): its node Leases stay, asking to join. Before, they kept
        the stored run the run of every fold and the re-run's joins were never folded, with or without the operator
        (the generated test's CI sequence plays it with the operator). Here the agents' own folder folds."""
        # A 3 s heartbeat expiry (1 s keep-alive x 3): the dead run's Leases stop counting after it.
        quick = {"keep_alive_interval": "1"}
        last = make_job(nnodes="2", run_id="run-a", steps=100000, step_seconds=0.2, rdzv_conf=quick)
        last.start_training(2, timeout=90, what="run-a training")
        last.stop()  # every agent and worker SIGKILLed: no leave is written
        job = make_job(nnodes="2", run_id="run-b", steps=3)
        agents = job.start(2)
        assert job.wait(agents, 120) == [0, 0], job.logs()
        assert len(job.results()) == 4, job.logs()
        assert (rendezvous(objects, namespace) or {})["status"]["runId"] == "run-b"

    def test_a_re_run_trains_when_the_killed_run_s_state_names_none_of_its_nodes(
        self, make_job: MakeJob, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        """Seed 449 of the generated test (``... evict_live sigkill_all run ...``): the last run was killed just after
        its round broke, so its state names none of its nodes (round 1 forming, no participants). The re-run's agents
        ask to join while the dead writer's Lease still holds; the one that takes it over folds once, keeping the
        last run (its Leases are new to it, not expired yet), and before the fix never folded again: the writer
        woke for an expired node only if the state named it."""
        quick = {"keep_alive_interval": "1"}
        last = make_job(nnodes="2", run_id="run-a", steps=100000, step_seconds=0.2, rdzv_conf=quick)
        last.start_training(2, timeout=90, what="run-a training")
        last.stop()  # every agent and worker SIGKILLed: no leave is written, the writer Lease stays held
        broken = encode_document(RendezvousDocument(round=1))  # the round broke just before the kill
        objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "job", {"status": {"state": broken, "stateBytes": len(broken)}}
        )
        job = make_job(nnodes="2", run_id="run-b", steps=3, rdzv_conf=quick)
        agents = job.start(2)
        assert job.wait(agents, 120) == [0, 0], job.logs()  # before the fix: both waited for ever
        assert len(job.results()) == 4, job.logs()
        assert (rendezvous(objects, namespace) or {})["status"]["runId"] == "run-b"

    def test_a_re_run_whose_round_breaks_re_forms_although_the_killed_last_run_s_leases_stay(
        self, make_job: MakeJob, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        """Seed 318 of the generated test (``run sigkill_all ... run sigterm``): the re-run trains, one of its agents
        is SIGTERMed, and the survivor leaves the broken round to join the next. With every member of the re-run
        leaving at once, the first version of the run rule handed the fold to the dead run's Leases (still asking to
        join), and the survivor waited for ever. The run of a fold stays while one of its nodes is alive."""
        quick = {"keep_alive_interval": "1", "last_call_timeout": "1"}
        last = make_job(nnodes="2", run_id="run-a", steps=100000, step_seconds=0.2, rdzv_conf=quick)
        killed = [last.start_agent() for _ in range(2)]
        wait_until(lambda: training_in_world(killed, 4), 90, "run-a training", explain=last.last_lines)
        last.stop()  # every agent and worker SIGKILLed: their Leases stay, asking to join
        job = make_job(nnodes="1:2", run_id="run-b", steps=100000, step_seconds=0.2, rdzv_conf=quick)
        agents = [job.start_agent() for _ in range(2)]
        wait_until(lambda: training_in_world(agents, 4), 90, "run-b training", explain=job.last_lines)
        victim, survivor = agents
        victim.terminate()
        victim.process.wait(60)
        wait_until(
            lambda: (
                training_in_world([survivor], 2, min_step=0)
                and survivor.output().rsplit(" formed", 1)[-1].count(" step ") >= 2
            ),
            60,
            "the survivor training again in a round of its own",
            explain=job.last_lines,
        )
        assert (rendezvous(objects, namespace) or {})["status"]["runId"] == "run-b"

    def test_with_create_false_a_rendezvous_of_an_ended_run_is_refused_naming_the_fix(
        self, make_job: MakeJob, objects: client.CustomObjectsApi, namespace: str
    ) -> None:
        earlier_run_ended(objects, namespace, closed_by_person=True)
        job = make_job(nnodes="1", run_id="run-b", rdzv_conf={"create": "false"})
        agent = job.start_agent()
        assert job.wait([agent], 120) != [0], job.logs()  # before the fix: exit 0 without training
        assert "belongs to an ended run" in agent.output()
        assert f"kubectl delete rdzv -n {namespace} job" in agent.output()
        assert job.results() == []


class TestCloseWithStockTorchrun:
    def test_a_person_closing_the_rendezvous_ends_stock_torchrun_with_exit_0_and_says_who(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str
    ) -> None:
        """torch 2.15 returns None from ``run()`` on a graceful exit and torchrun exits 1 (pytorch#194710)."""
        job = make_job(launcher="torchrun", nnodes="2", steps=400, step_seconds=0.25)
        agents = job.start_training(2)
        control_plane.kubectl("-n", namespace, "patch", "rdzv", "job", "--type=merge", "-p", '{"spec":{"closed":true}}')
        assert job.wait(agents, 120) == [0, 0], job.logs()  # before the fix: [1, 1]
        for agent in agents:
            assert re.search(r"a person closed it \(spec\.closed, set by kubectl\S* at \S+\)", agent.output()), (
                job.logs()
            )
        steps = [item for item in (training_in_world([agent], 4, min_step=0) for agent in agents) if item]
        assert steps, "the workers trained before the close"
        reason = control_plane.kubectl("-n", namespace, "get", "rdzv", "job", "-o", "jsonpath={.status.closeReason}")
        assert re.match(r"Requested: a person closed it \(spec\.closed, set by kubectl\S* at \S+\)", reason.stdout)


class TestErrorsNameTheFix:
    def test_a_missing_namespace_is_named_not_reported_as_a_missing_crd(
        self, control_plane: ControlPlane, crds: None
    ) -> None:
        parameters = rendezvous_parameters("no-such-namespace/job", control_plane.admin_kubeconfig)
        with pytest.raises(ValueError, match=r"Namespace 'no-such-namespace' does not exist: create it"):
            create_backend(parameters)

    def test_a_refused_create_names_the_create_verb(
        self, control_plane: ControlPlane, namespace: str, objects: client.CustomObjectsApi
    ) -> None:
        """The per-job Role grants get (by name) but not create: the error must say 'create', not 'get'."""
        control_plane.kubectl("-n", namespace, "apply", "-f", str(REPO / "examples" / "rbac-per-job.yaml"))
        kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, "llama-train")
        wait_until(
            lambda: (
                control_plane.kubectl(
                    "auth",
                    "can-i",
                    "get",
                    "rendezvouses.kube-rendezvous.io/llama-train",
                    "-n",
                    namespace,
                    kubeconfig=kubeconfig,
                    check=False,
                ).stdout.strip()
                == "yes"
            ),
            30,
            "the per-job RoleBinding to take effect",
        )
        parameters = rendezvous_parameters(f"{namespace}/llama-train", kubeconfig, retry_timeout="5")
        with pytest.raises(Exception, match=r"refused to create rendezvouses.*verb 'create'") as refused:
            create_backend(parameters)
        assert "'get'" not in str(refused.value)


class TestFencing:
    def test_a_live_agent_evicted_by_mistake_rejoins_as_a_new_member_and_the_round_breaks_once(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str, tmp_path: Path
    ) -> None:
        """``kubectl rdzv evict`` of a live member (as after a healed partition), with the operator folding: before,
        every fold dropped the rejoined agent again and the round broke over and over."""
        from tests.test_operator import running_operator

        with running_operator(control_plane, namespace, tmp_path / "operator.log"):
            self.evict_a_live_member(make_job, control_plane, namespace)

    def test_in_a_pod_an_evicted_live_agent_rejoins_only_after_its_pause(
        self,
        make_job: MakeJob,
        control_plane: ControlPlane,
        namespace: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """With ``POD_UID`` set (agents in pods: a deletion brings a SIGTERM), an evicted live agent says it waits
        ``FENCED_REJOIN_PAUSE``, then rejoins as a new member; the round breaks once."""
        from tests.test_operator import running_operator

        monkeypatch.setenv("POD_UID", str(uuid.uuid4()))
        with running_operator(control_plane, namespace, tmp_path / "operator.log"):
            victim = self.evict_a_live_member(make_job, control_plane, namespace)
        output = victim.output()
        assert f"it joins again as a new node in {FENCED_REJOIN_PAUSE:g} s" in output
        assert output.index("it joins again as a new node in") < output.index("it joins again as node")

    def test_in_a_pod_an_evicted_agent_sigtermed_in_its_pause_never_rejoins_and_the_round_breaks_once(
        self, make_job: MakeJob, control_plane: ControlPlane, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The agent of a pod being deleted: evicted (as the operator does the moment the deletion shows) and then
        SIGTERMed (as the kubelet does). It never rejoins: the others re-form once without it. Before, it rejoined
        at once, joined their round and broke it again on its way out (a Kueue scale-down, a JobSet's RestartJob)."""
        monkeypatch.setenv("POD_UID", str(uuid.uuid4()))
        job = make_job(nnodes="2:3", steps=400, step_seconds=0.25, max_restarts=3, rdzv_conf={"last_call_timeout": "2"})
        agents = job.start_training(3)
        victim = agents[2]
        self.evict(control_plane, namespace, victim.node_name)
        wait_until(lambda: "it joins again as a new node in" in victim.output(), 30, "the victim's pause")
        victim.terminate()
        survivors = [agent for agent in agents if agent is not victim]
        self.wait_training_in_round_1(job, survivors)
        assert "it joins again as node" not in victim.output(), victim.output()[-2000:]
        holds_for(
            lambda: all(agent.alive() and "round 2 formed" not in agent.output() for agent in survivors),
            10,
            "round 1 holding: the SIGTERMed agent never rejoined",
        )

    @staticmethod
    def wait_training_in_round_1(job: ElasticJob, agents: list[Any]) -> None:
        """Until every one of ``agents`` trained 4 steps in round 1."""
        wait_until(
            lambda: all(
                "round 1 formed" in agent.output() and agent.output().split("round 1 formed")[1].count(" step ") >= 4
                for agent in agents
            ),
            120,
            f"the {len(agents)} training again in round 1",
            explain=job.last_lines,
        )

    @staticmethod
    def evict(control_plane: ControlPlane, namespace: str, node: str) -> None:
        """``kubectl rdzv evict job NODE``."""
        plugin = str(Path(sys.executable).parent / "kubectl-rdzv")
        subprocess.run(
            [plugin, "--kubeconfig", str(control_plane.admin_kubeconfig), "-n", namespace, "evict", "job", node],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def evict_a_live_member(self, make_job: MakeJob, control_plane: ControlPlane, namespace: str) -> Any:
        job = make_job(nnodes="3", steps=400, step_seconds=0.25, max_restarts=3)
        agents = job.start_training(3)
        victim = agents[1]
        evicted = victim.node_name
        self.evict(control_plane, namespace, evicted)
        self.wait_training_in_round_1(job, agents)
        assert f"node {evicted} was evicted from Rendezvous" in victim.output()
        # The round broke once: it stays formed while they train on (before the fix: it broke every few seconds).
        holds_for(
            lambda: all(agent.alive() and "round 2 formed" not in agent.output() for agent in agents),
            15,
            "round 1 holding",
        )
        control_plane.kubectl("-n", namespace, "patch", "rdzv", "job", "--type=merge", "-p", '{"spec":{"closed":true}}')
        assert job.wait(agents, 120) == [0, 0, 0], job.logs()
        assert all("a person closed it (spec.closed, set by kubectl" in agent.output() for agent in agents)
        return victim


def played_pod_on_a_node(core: client.CoreV1Api, namespace: str, node: client.V1Node, address: str) -> None:
    """Node ``node`` (an object only: no kubelet) and a Running training pod of Rendezvous ``job`` bound to it."""
    core.create_node(node)
    create_pod_on(core, namespace, "trainer-0", node.metadata.name, address)


def create_pod_on(core: client.CoreV1Api, namespace: str, name: str, node: str, address: str) -> None:
    """A Running training pod of Rendezvous ``job`` bound to ``node`` with ``address`` (played: no kubelet)."""
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"kube-rendezvous.io/rendezvous": "job"}),
            spec=client.V1PodSpec(
                node_name=node, containers=[client.V1Container(name="agent", image="trainer:latest")]
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
    )


def joining_handler(namespace: str, kubeconfig: Path, address: str, **conf: str) -> tuple[Any, list[object]]:
    """A tensorplay ``k8s`` handler at ``address`` (min = max = 1) joining in a thread; its result lands in the list."""
    from kube_rendezvous._adapters.handler import create_k8s_handler
    from tensorplay.distributed.elastic.rendezvous.api import RendezvousParameters

    parameters = RendezvousParameters(
        backend="k8s",
        endpoint=f"{namespace}/job",
        run_id="job-1",
        min_nodes=1,
        max_nodes=1,
        local_addr=address,
        kubeconfig=str(kubeconfig),
        create="false",
        **conf,
    )
    handler = create_k8s_handler(parameters)
    result: list[object] = []

    def join() -> None:
        try:
            result.append(handler.next_rendezvous())
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            result.append(exc)

    threading.Thread(target=join, daemon=True).start()
    return handler, result


class TestHoldsEnd:
    def test_a_node_held_by_its_cordoned_kubernetes_node_times_out_at_its_join_timeout_saying_why(
        self,
        control_plane: ControlPlane,
        namespace: str,
        agent_kubeconfig: Path,
        admin_api: client.ApiClient,
        objects: client.CustomObjectsApi,
        tmp_path: Path,
    ) -> None:
        """The operator holds an agent whose Node is cordoned (``status.heldNodes``). A hold counts against the join
        timeout: before, the held agent's deadline moved on for as long as the hold lasted, so it waited for ever."""

        from tests.test_operator import running_operator

        core = client.CoreV1Api(admin_api)
        node = f"cordoned-{namespace[-6:]}"
        create_rendezvous(objects, namespace, minNodes=1, maxNodes=1)
        address = "127.0.0.61"
        played_pod_on_a_node(
            core,
            namespace,
            client.V1Node(metadata=client.V1ObjectMeta(name=node), spec=client.V1NodeSpec(unschedulable=True)),
            address,
        )
        try:
            log = tmp_path / "operator.log"
            with running_operator(control_plane, namespace, log) as operator:
                # The census first (the first resync lists the pods on their Nodes): a join folded before it is
                # admitted, as the README says of a Node cordoned a moment before.
                wait_until(lambda: operator.metric("kube_rendezvous_operator_resyncs_total") >= 1, 30, "a pod census")
                handler, result = joining_handler(namespace, agent_kubeconfig, address, join_timeout="8")
                wait_until(
                    lambda: any(
                        item.get("node") == str(handler.node)
                        for item in (rendezvous(objects, namespace) or {}).get("status", {}).get("heldNodes") or []
                    ),
                    30,
                    "the operator to hold the agent of the cordoned node",
                    explain=lambda: f"{rendezvous(objects, namespace)} {result}",
                )
                wait_until(lambda: result, 40, "the held agent to give up (an 8 s join timeout)")
                assert type(result[0]).__name__ == "RendezvousTimeoutError", result
                assert f"held back all along: NodeCordoned: Kubernetes node {node} is cordoned" in str(result[0])
        finally:
            core.delete_node(node)

    def test_members_on_a_node_cordoned_while_they_train_are_not_dropped_when_their_round_re_forms(
        self,
        make_job: MakeJob,
        control_plane: ControlPlane,
        namespace: str,
        admin_api: client.ApiClient,
        objects: client.CustomObjectsApi,
        tmp_path: Path,
    ) -> None:
        """A member's Node is cordoned (as before maintenance), then another member leaves (SIGTERM): the round
        re-forms, and the cordoned Node's member is in it. Before, it was held back as a newcomer would be (its
        leave and join after the break made it one), so the survivors fell below MIN until someone uncordoned."""
        from tests.test_operator import running_operator

        core = client.CoreV1Api(admin_api)
        cordoned, other = f"c-{namespace[-6:]}", f"o-{namespace[-6:]}"
        # Also a misspelt topology key (``zon``): before, one silent ``-`` domain; now the status names it.
        create_rendezvous(objects, namespace, minNodes=2, maxNodes=3, topology={"keys": ["topology.kubernetes.io/zon"]})
        placed = {
            "trainer-0": (cordoned, "127.0.0.71"),
            "trainer-1": (other, "127.0.0.72"),
            "trainer-2": (other, "127.0.0.73"),
        }
        for node in (cordoned, other):
            labels = {"topology.kubernetes.io/zone": "z1"}
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels=labels)))
        try:
            for pod, (node, address) in placed.items():
                create_pod_on(core, namespace, pod, node, address)
            with running_operator(control_plane, namespace, tmp_path / "operator.log") as operator:
                wait_until(lambda: operator.metric("kube_rendezvous_operator_resyncs_total") >= 1, 30, "a pod census")
                job = make_job(nnodes="2:3", steps=100000, step_seconds=0.2, rdzv_conf={"last_call_timeout": "2"})
                agents = job.start_training([address for _, address in placed.values()], timeout=90)
                topology = (rendezvous(objects, namespace) or {})["status"]["topology"]
                assert topology["order"] == "Topology", topology
                assert topology["reason"] == (
                    "no member's Node has the label topology.kubernetes.io/zon: check spec.topology.keys for a "
                    "misspelt key (kubectl get nodes -L topology.kubernetes.io/zon)"
                ), topology
                core.patch_node(cordoned, {"spec": {"unschedulable": True}})
                leaving = agents[2]
                leaving.terminate()
                leaving.process.wait(60)
                core.delete_namespaced_pod("trainer-2", namespace, grace_period_seconds=0)
                survivors = agents[:2]
                wait_until(
                    lambda: (
                        training_in_world(survivors, 4, min_step=0)
                        and all(agent.output().rsplit(" formed", 1)[-1].count(" step ") >= 2 for agent in survivors)
                    ),
                    60,
                    "the 2 survivors training again, the cordoned Node's member among them",
                    explain=lambda: f"{job.last_lines()}\n{(rendezvous(objects, namespace) or {}).get('status')}",
                )
                job.stop()
        finally:
            for node in (cordoned, other):
                core.delete_node(node)


class TestErrorsNameTheFixOnRealNodes:
    def test_kubectl_get_shows_the_min_and_max_the_agents_follow_not_a_spec_they_override(
        self, control_plane: ControlPlane, namespace: str, agent_kubeconfig: Path, objects: client.CustomObjectsApi
    ) -> None:
        """The agents follow ``--nnodes`` (and warn) where the spec says otherwise: MIN/MAX say what is in force."""
        from kube_rendezvous._adapters.handler import create_k8s_handler

        create_rendezvous(objects, namespace, minNodes=1, maxNodes=4)
        handler = create_k8s_handler(
            rendezvous_parameters(f"{namespace}/job", agent_kubeconfig, min_nodes=1, max_nodes=1, create="false")
        )
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        status = (rendezvous(objects, namespace) or {})["status"]
        assert (status["minNodes"], status["maxNodes"]) == (1, 1)
        table = control_plane.kubectl("-n", namespace, "get", "rdzv", "job").stdout.splitlines()
        columns = dict(zip(table[0].split(), table[1].split(), strict=True))
        assert (columns["MIN"], columns["MAX"]) == ("1", "1"), table
        handler.shutdown()
