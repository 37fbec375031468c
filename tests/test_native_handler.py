"""The ``k8s`` handler's own protocol on the real API server: ask on the Lease, wait on the watch, confirm.

Handlers here are tensorplay's adapter (``create_k8s_handler``) in threads of this process, as the
benchmarks run them; no operator runs, so the agents' own folder folds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_rendezvous import create_backend
from kube_rendezvous._adapters.handler import KubernetesRendezvousHandler, create_k8s_handler
from kube_rendezvous._kube.leases import ANNOTATION_DESIRE, ANNOTATION_ROUND
from kube_rendezvous._rules.document import RendezvousDocument, encode_document
from kubernetes import client
from tensorplay.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID

from tests.helpers import holds_for, rendezvous_parameters
from tests.testenv import wait_until

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"


@pytest.fixture
def make_handler(namespace: str, agent_kubeconfig: Path) -> Iterator[Callable[..., KubernetesRendezvousHandler]]:
    made: list[KubernetesRendezvousHandler] = []

    def make(**options: Any) -> KubernetesRendezvousHandler:
        options.setdefault("last_call_timeout", 1)
        handler = create_k8s_handler(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig, **options))
        made.append(handler)
        return handler

    yield make
    for handler in made:
        handler._stop_bootstrap_store()


def in_threads(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` at once; return their results (an exception is returned, not raised)."""
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            results[index] = exc

    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a handler did not return within 120 s"
    return results


def status_of(objects: client.CustomObjectsApi, namespace: str) -> dict[str, Any]:
    found = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rdzv")
    return dict(found.get("status") or {})


def write_state(objects: client.CustomObjectsApi, namespace: str, document: RendezvousDocument) -> None:
    objects.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "rdzv",
        {"status": {"state": encode_document(document), "runId": "job-1"}},
        _content_type="application/merge-patch+json",
    )


def test_two_handlers_form_a_round_with_ranks_and_no_framework_state(
    make_handler: Callable[..., KubernetesRendezvousHandler],
) -> None:
    first, second = make_handler(min_nodes=2, max_nodes=2), make_handler(min_nodes=2, max_nodes=2)
    infos = in_threads(first.next_rendezvous, second.next_rendezvous)
    assert sorted(info.rank for info in infos) == [0, 1] and {info.world_size for info in infos} == {2}
    # Both read one bootstrap address: rank 0's fresh store, published under round 0's prefix.
    assert len({(info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port) for info in infos}) == 1
    assert first.num_nodes_waiting() == 0 and second.num_nodes_waiting() == 0


def test_a_join_overtaken_by_a_new_round_is_asked_again_in_the_open_round(
    make_handler: Callable[..., KubernetesRendezvousHandler],
    objects: client.CustomObjectsApi,
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    """The race a late pod meets: it asks to join the round after round 0 (a full round), but that round
    forms and ends before a fold takes it in. The fold drops a join for a round that has ended, so the
    handler must ask again in the open round, at once, not after its join timeout."""
    late = make_handler(min_nodes=2, max_nodes=2)
    other = make_handler(min_nodes=2, max_nodes=2)
    gone_a, gone_b = (late.node._replace(addr=addr) for addr in ("10.9.9.1", "10.9.9.2"))
    write_state(objects, namespace, RendezvousDocument(round=0, complete=True, participants={gone_a: 0, gone_b: 1}))
    wait_until(lambda: late._watch.get("rdzv") is not None and late._read().document is not None, 30, "the watch")
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(late.next_rendezvous()), daemon=True)
    thread.start()
    leases = client.CoordinationV1Api(admin_api)

    def asked_round() -> str | None:
        lease = leases.read_namespaced_lease(late._lease.name, namespace)
        annotations = lease.metadata.annotations or {}
        return annotations.get(ANNOTATION_ROUND) if annotations.get(ANNOTATION_DESIRE) == "join" else None

    wait_until(lambda: asked_round() == "1", 30, "the late node to ask for the round after round 0")
    # Round 1 forms and ends without it before a fold takes it in: round 2 is open.
    write_state(objects, namespace, RendezvousDocument(round=2))
    wait_until(lambda: asked_round() == "2", 30, "the late node to ask again in round 2")
    [info] = in_threads(other.next_rendezvous)
    thread.join(60)
    assert results and results[0].world_size == 2 and {results[0].rank, info.rank} == {0, 1}
    assert late.stats["overtaken"] >= 1
    assert status_of(objects, namespace)["round"] == 2


def test_a_member_that_leaves_breaks_the_round_for_the_others_and_says_so(
    make_handler: Callable[..., KubernetesRendezvousHandler], objects: client.CustomObjectsApi, namespace: str
) -> None:
    handlers = [make_handler(min_nodes=2, max_nodes=3) for _ in range(3)]
    infos = in_threads(*(handler.next_rendezvous for handler in handlers))
    assert sorted(info.rank for info in infos) == [0, 1, 2]
    assert [handler.num_nodes_waiting() for handler in handlers] == [0, 0, 0]
    leaving = handlers[1]
    assert leaving.shutdown() is True  # its workers did not succeed: it leaves, the round stays open
    for handler in (handlers[0], handlers[2]):
        wait_until(lambda h=handler: h.num_nodes_waiting() == 1, 30, "the others to see the round broken")
    status = status_of(objects, namespace)
    assert status["phase"] == "Complete" and status["participantCount"] == 2
    departure = status["lastDeparture"]
    assert (departure["round"], departure["nodes"]) == (0, [{"node": str(leaving.node), "reason": "Left"}])
    # The survivors re-rendezvous and form round 1 without it.
    again = in_threads(handlers[0].next_rendezvous, handlers[2].next_rendezvous)
    assert sorted(info.rank for info in again) == [0, 1] and {info.world_size for info in again} == {2}
    assert status_of(objects, namespace)["round"] == 1
    assert handlers[0].num_nodes_waiting() == 0


def test_shutdown_closes_only_after_the_agent_entered_its_exit_barrier(
    make_handler: Callable[..., KubernetesRendezvousHandler], objects: client.CustomObjectsApi, namespace: str
) -> None:
    first, second = make_handler(min_nodes=2, max_nodes=2), make_handler(min_nodes=2, max_nodes=2)
    infos = in_threads(first.next_rendezvous, second.next_rendezvous)
    # What tensorplay's agent does after its workers succeeded: the exit barrier on the round's store.
    infos[0].store.add(f"{_TERMINAL_STATE_SYNC_ID}/default_roleARRIVED", 1)
    assert first.succeeded and not second.succeeded
    assert first.shutdown() is True
    assert status_of(objects, namespace)["phase"] == "Closed"
    # Another agent's success neither restarts the others (their workers are finishing) nor breaks the round.
    wait_until(second.is_closed, 30, "the other handler to see the close")
    assert second.num_nodes_waiting() == 0


def test_running_agents_stop_for_a_persons_close_but_not_for_another_agents_success(
    make_handler: Callable[..., KubernetesRendezvousHandler],
    objects: client.CustomObjectsApi,
    namespace: str,
    agent_kubeconfig: Path,
) -> None:
    handler = make_handler()
    # An agent whose training succeeded closed the rendezvous: the others' workers are finishing.
    backend, _ = create_backend(rendezvous_parameters(f"{namespace}/rdzv", agent_kubeconfig))
    backend.set_state(encode_state_closed())
    wait_until(handler.is_closed, 30, "the handler to see the closed state")
    assert handler.num_nodes_waiting() == 0
    # A person closes it: running agents must stop their workers and exit.
    objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rdzv", {"spec": {"closed": True}})
    wait_until(lambda: handler.num_nodes_waiting() == 1, 30, "num_nodes_waiting to report the close")


def encode_state_closed() -> bytes:
    """A pickled tensorplay state, closed by an agent (what the stock handler's close writes)."""
    import pickle

    from tensorplay.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    state = _RendezvousState()
    state.closed = True
    return pickle.dumps(state)


def test_a_spare_waits_past_its_join_timeout_makes_no_one_restart_and_is_promoted_when_a_member_leaves(
    make_handler: Callable[..., KubernetesRendezvousHandler], objects: client.CustomObjectsApi, namespace: str
) -> None:
    """``--nnodes=1:1`` and two agents: the second is a spare (the redundancy list). It waits beyond the 3 s join
    timeout (a spare never times out, as in torch), the member is never told to restart for it, and once the
    member leaves, the spare's ``next_rendezvous`` returns: it is rank 0 of the next round."""
    member, spare = (
        make_handler(min_nodes=1, max_nodes=1, join_timeout=3),
        make_handler(min_nodes=1, max_nodes=1, join_timeout=3),
    )
    (first,) = in_threads(member.next_rendezvous)
    assert first.rank == 0
    result: list[Any] = []
    waiting = threading.Thread(target=lambda: result.append(spare_call(spare)), daemon=True)
    waiting.start()
    wait_until(lambda: status_of(objects, namespace).get("spareCount") == 1, 30, "the spare on the redundancy list")
    spared = status_of(objects, namespace)
    assert spared["spares"] == [str(spare.node)] and spared["participantCount"] == 1
    holds_for(lambda: not result and member.num_nodes_waiting() == 0, 5, "the spare waiting past 3 s, no restart")
    assert member.shutdown() is True  # it leaves
    waiting.join(60)
    assert len(result) == 1 and not isinstance(result[0], Exception), result
    assert (result[0].rank, result[0].world_size) == (0, 1)
    status = status_of(objects, namespace)
    assert status["round"] == 1 and status["participants"] == [{"node": str(spare.node), "rank": 0}]


def spare_call(handler: KubernetesRendezvousHandler) -> Any:
    try:
        return handler.next_rendezvous()
    except Exception as exc:  # noqa: BLE001 - the test asserts on it
        return exc
