"""The writer Lease's election (``WriterLease``: the generic ``LeaderElector`` on a ``WriterLock``) on the real API
server: what one renewal costs, that a renewal stays a compare-and-swap, and the writer rules above the elector."""

from __future__ import annotations

from typing import Any

import pytest
from kube_rendezvous._engine.folder import WRITER_ELECTION
from kube_rendezvous._kube.kubeapi import ApiError, ApiUnavailableError, KubernetesApi
from kube_rendezvous._kube.leases import writer_lease_name
from kube_rendezvous._kube.writer_lease import WriterLease, WriterLock
from kubernetes import client

from tests.testenv import wait_until

#: The writer Lease of the Rendezvous ``rdzv`` these tests elect on.
WRITER = writer_lease_name("rdzv")


def elector(
    admin_api: client.ApiClient, namespace: str, identity: str, *, preferred: bool, api: KubernetesApi | None = None
) -> WriterLease:
    api = api or KubernetesApi(admin_api)
    return WriterLease(WriterLock(api, namespace, "rdzv", identity, preferred=preferred), WRITER_ELECTION)


def test_the_holder_renews_with_one_write_and_no_read(admin_api: client.ApiClient, namespace: str) -> None:
    # A quorum GET waits behind every write etcd has not applied yet: at N=1024 on 2 cores the
    # operator's GET-then-PUT renewal took 10-25 s and it lost the writer Lease. The holder now
    # writes on the version its own last write returned.
    api = KubernetesApi(admin_api)
    holder = elector(admin_api, namespace, "agent-a", preferred=False, api=api)
    assert holder.try_acquire_or_renew()
    for _ in range(3):
        before = api.stats["requests"]
        assert holder.try_acquire_or_renew()
        assert api.stats["requests"] - before == 1
    lease = client.CoordinationV1Api(admin_api).read_namespaced_lease(WRITER, namespace)
    assert lease.spec.holder_identity == "agent-a"


def test_a_holder_whose_lease_was_taken_learns_it_at_its_next_renewal(
    admin_api: client.ApiClient, namespace: str
) -> None:
    api = KubernetesApi(admin_api)
    agent = elector(admin_api, namespace, "agent-a", preferred=False, api=api)
    operator = elector(admin_api, namespace, "operator", preferred=True)
    assert agent.try_acquire_or_renew()
    # The operator preempts an agent as soon as it sees the agent's Lease: its read is from the API server's watch
    # cache (resourceVersion=0), which may lag a fresh create under load (the clean-clone CI run of c1634bf: its
    # create answered 409 and the step said False). Its next step takes the Lease.
    wait_until(operator.try_acquire_or_renew, 10, "the operator to preempt the agent", interval=0.1)
    before = api.stats["requests"]
    assert not agent.try_acquire_or_renew()  # its write on its old version is refused (409)
    assert api.stats["requests"] - before == 2  # the refused write, then the read that explains it
    assert agent.holder == "operator" and agent.holder_alive
    assert operator.try_acquire_or_renew()
    lease = client.CoordinationV1Api(admin_api).read_namespaced_lease(WRITER, namespace)
    assert lease.spec.holder_identity == "operator"


def test_an_agent_folder_stopped_at_exit_releases_the_writer_lease(admin_api: client.ApiClient, namespace: str) -> None:
    # shared.release runs at interpreter exit: an agent that exits (done, failed or SIGTERMed)
    # hands the writer role over at once, not after the writer Lease's 10 s without renewal.
    from kube_rendezvous._engine.shared import release, shared

    from tests.testenv import wait_until

    api = KubernetesApi(admin_api)
    folder = shared(api, namespace, "rdzv").folder("agent/a", 15.0)
    leases = client.CoordinationV1Api(admin_api)

    def holder() -> str:
        return str(leases.read_namespaced_lease(WRITER, namespace).spec.holder_identity or "")

    wait_until(lambda: holder() == "agent/a", 30, "the agent folder to take the writer Lease")
    release(namespace)
    assert holder() == ""
    assert shared(api, namespace, "rdzv").folder("agent/b", 15.0) is not folder  # a released folder is forgotten
    release(namespace)


def test_an_agent_takes_the_lease_of_a_writer_that_died_after_its_duration_and_within_the_bound(
    admin_api: client.ApiClient, namespace: str
) -> None:
    import time

    from kube_rendezvous._engine import folder as folders
    from kube_rendezvous._engine.shared import release, shared

    from tests.testenv import wait_until

    api = KubernetesApi(admin_api)
    dead = elector(admin_api, namespace, "agent/dead", preferred=False)
    assert dead.try_acquire_or_renew()  # its last renewal: it never renews again
    last_renewal = time.monotonic()
    leases = client.CoordinationV1Api(admin_api)
    shared(api, namespace, "rdzv").folder("agent/b", 15.0)
    try:
        wait_until(
            lambda: leases.read_namespaced_lease(WRITER, namespace).spec.holder_identity == "agent/b",
            30,
            "an agent to take the writer Lease over",
        )
        took = time.monotonic() - last_renewal
    finally:
        release(namespace)
    bound = folders.CANDIDATE_RETRY_SECONDS + folders.WRITER_ELECTION.lease_duration + folders.STALE_MARGIN_SECONDS
    assert folders.WRITER_ELECTION.lease_duration < took < bound + 1.0  # + 1 s: the requests and this test's polling


def test_a_candidate_that_takes_a_stale_lease_records_the_dead_holder_and_its_last_renewal(
    admin_api: client.ApiClient, namespace: str
) -> None:
    import time

    from tests.testenv import wait_until

    dead = elector(admin_api, namespace, "agent/10.0.0.9_7_1", preferred=False)
    assert dead.try_acquire_or_renew()
    renew_time = client.CoordinationV1Api(admin_api).read_namespaced_lease(WRITER, namespace).spec.renew_time
    candidate = elector(admin_api, namespace, "agent/10.0.0.8_7_1", preferred=False)
    assert not candidate.try_acquire_or_renew()  # alive: first seen now
    first_seen = time.monotonic()
    assert candidate.taken_from_stale is None
    wait_until(candidate.try_acquire_or_renew, 20, "the candidate to take the stale writer Lease", interval=0.5)
    taken = candidate.taken_from_stale
    assert taken is not None and taken.identity == "agent/10.0.0.9_7_1"
    assert taken.renewed_at == renew_time
    # The candidate's own clock: when it first saw that renewal, a whole duration before the take.
    assert taken.seen_at <= first_seen <= time.monotonic() - candidate.duration
    # Renewing its own Lease takes nothing from anybody: the record stays the one take's.
    assert candidate.try_acquire_or_renew()
    assert candidate.taken_from_stale is taken


def test_a_holder_silent_through_an_outage_the_candidate_saw_too_is_dated_from_when_the_candidate_got_through(
    admin_api: client.ApiClient, namespace: str, control_plane: Any
) -> None:
    """The CI failure this fixes: after an API server restart, the agent that took the writer Lease dated
    the old writer's node from the writer Lease's last renewal before the outage, and removed a live node
    (it could not renew through the outage either). The candidate's own failed steps now bound that date."""
    import time

    from tests.testenv import wait_until

    holder = elector(admin_api, namespace, "agent/10.0.0.9_7_1", preferred=False)
    assert holder.try_acquire_or_renew()
    candidate = elector(admin_api, namespace, "agent/10.0.0.8_7_1", preferred=False)
    assert not candidate.try_acquire_or_renew()
    first_seen = time.monotonic()
    control_plane.stop_apiserver()
    try:
        # Through the outage, past the Lease's duration: every step of the candidate fails.
        while True:
            with pytest.raises((ApiError, ApiUnavailableError)):
                candidate.try_acquire_or_renew()
            if time.monotonic() > first_seen + candidate.duration + 1:
                break
            time.sleep(1)
    finally:
        control_plane.start_apiserver()
    last_failure = candidate.unreachable_at
    assert last_failure > first_seen + candidate.duration
    wait_until(candidate.try_acquire_or_renew, 60, "the candidate to take the writer Lease", interval=0.5)
    taken = candidate.taken_from_stale
    assert taken is not None and taken.identity == "agent/10.0.0.9_7_1"
    assert taken.seen_at >= last_failure  # not first_seen: the holder's silence counts from the end of the outage
