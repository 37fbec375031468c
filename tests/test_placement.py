"""The placement rules (``placement`` and the fold's ``domain``/``hold``): topology-aware ranks, spares of the
lost member's domain first, and no admission for nodes whose Kubernetes Node does not admit them (pure)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from kube_rendezvous import NodeFacts, PlacementSpec, node_facts, placement_of
from kube_rendezvous._rules.document import NodeId, RendezvousDocument
from kube_rendezvous._rules.folder_rules import (
    Desire,
    JoinSettings,
    PodAddresses,
    Request,
    TrainingPods,
    fold,
    fold_placed,
)
from kube_rendezvous._rules.placement import (
    DEFAULT_TOPOLOGY_KEYS,
    Domain,
    domain_of,
    domain_ranges,
    domain_text,
    hold_reason,
    rank_order,
    tolerates,
    topology_reason,
    unlabelled_keys,
)
from kube_rendezvous_operator import conditions_rules, events_rules, writer_rules

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
KEYS = ("zone", "block")


def node(addr: str) -> NodeId:
    return NodeId(addr, 1, 0)


def contiguous(ranked: list[NodeId], domain: dict[NodeId, Domain]) -> bool:
    """Whether every domain's members hold one run of ranks."""
    seen: list[Domain] = []
    for member in ranked:
        if not seen or seen[-1] != domain[member]:
            if domain[member] in seen:
                return False
            seen.append(domain[member])
    return True


class TestRankOrder:
    def test_members_of_a_domain_get_contiguous_ranks_and_ties_follow_the_node(self) -> None:
        domain = {
            node("10.0.0.1"): ("z2", "b1"),
            node("10.0.0.2"): ("z1", "b2"),
            node("10.0.0.3"): ("z2", "b1"),
            node("10.0.0.4"): ("z1", "b1"),
            node("10.0.0.5"): ("z1", "b2"),
        }
        ranked = rank_order(domain, domain.get)
        assert ranked == [node("10.0.0.4"), node("10.0.0.2"), node("10.0.0.5"), node("10.0.0.1"), node("10.0.0.3")]
        assert domain_ranges(ranked, domain.get) == [
            {"domain": "z1/b1", "firstRank": 0, "lastRank": 0},
            {"domain": "z1/b2", "firstRank": 1, "lastRank": 2},
            {"domain": "z2/b1", "firstRank": 3, "lastRank": 4},
        ]

    def test_a_missing_label_is_one_more_domain_after_the_labelled_ones_and_an_unknown_node_comes_last(self) -> None:
        domain: dict[NodeId, Domain | None] = {
            node("a"): (None, "b1"),
            node("b"): ("z1", None),
            node("c"): ("z1", "b1"),
            node("d"): None,  # its pod or Node unknown to the operator
            node("e"): (None, "b1"),
        }
        ranked = rank_order(domain, domain.get)
        assert ranked == [node("c"), node("b"), node("a"), node("e"), node("d")]
        assert [item["domain"] for item in domain_ranges(ranked, domain.get)] == ["z1/b1", "z1/-", "-/b1", "?"]

    def test_domain_of_reads_the_keys_in_order_and_an_empty_value_is_missing(self) -> None:
        labels = {"block": "b7", "zone": "", "rack": "r1"}
        assert domain_of(labels, KEYS) == (None, "b7")
        assert domain_text(domain_of(labels, ())) == "-" and domain_text(None) == "?"

    def test_survivors_of_a_lost_member_keep_contiguous_ranks_and_their_order(self) -> None:
        rng = random.Random(7)
        domain = {node(f"10.1.{i // 4}.{i}"): (f"z{i % 3}", f"b{i % 2}") for i in range(24)}
        before = rank_order(domain, domain.get)
        lost = set(rng.sample(before, 5))
        after = rank_order([member for member in domain if member not in lost], domain.get)
        assert contiguous(after, domain)
        assert after == [member for member in before if member not in lost]

    def test_1024_members_over_32_domains_in_any_order_get_one_run_of_ranks_per_domain(self) -> None:
        rng = random.Random(1024)
        domain = {node(f"10.2.{i // 250}.{i % 250}"): (f"zone-{i % 4}", f"block-{i % 8}", None) for i in range(1024)}
        members = list(domain)
        rng.shuffle(members)
        ranked = rank_order(members, domain.get)
        assert len(ranked) == 1024 and contiguous(ranked, domain)
        ranges = domain_ranges(ranked, domain.get)
        assert len(ranges) == 8 and sum(item["lastRank"] - item["firstRank"] + 1 for item in ranges) == 1024
        assert ranked == rank_order(reversed(members), domain.get)  # the order of arrival does not matter


class TestAdmission:
    def facts(self, **fields: object) -> NodeFacts:
        return NodeFacts(name="gpu-7", labels={}, ready="True", **fields)  # type: ignore[arg-type]

    def test_a_ready_schedulable_untainted_node_is_admitted(self) -> None:
        assert hold_reason(self.facts()) is None
        assert hold_reason(self.facts(true_conditions=frozenset({"Ready"})), ["Ready"]) is None

    def test_not_ready_cordoned_no_execute_and_named_conditions_hold_a_node_and_say_why(self) -> None:
        assert hold_reason(NodeFacts("gpu-7", {}, ready="Unknown")) == (
            "NodeNotReady: Kubernetes node gpu-7 is NotReady (Ready=Unknown)"
        )
        assert hold_reason(self.facts(unschedulable=True)) == (
            "NodeCordoned: Kubernetes node gpu-7 is cordoned (spec.unschedulable)"
        )
        assert hold_reason(self.facts(no_execute=("gpu-broken",))) == (
            "NodeTainted: Kubernetes node gpu-7 has the NoExecute taint gpu-broken"
        )
        unhealthy = self.facts(true_conditions=frozenset({"GpuUnhealthy"}))
        assert hold_reason(unhealthy) is None  # a condition holds only when the spec names it
        assert hold_reason(unhealthy, ["GpuUnhealthy"]) == (
            "NodeCondition: Kubernetes node gpu-7 has the condition GpuUnhealthy=True"
        )

    @pytest.mark.parametrize(
        ("toleration", "tolerated"),
        [
            ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, True),
            ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}, True),
            ({"key": "nvidia.com/gpu", "value": "present"}, True),  # Equal is the default operator
            ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
            ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}, False),
            ({"key": "other", "operator": "Exists"}, False),
            ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, False),
            # tolerated for a while only: the taint manager evicts the pod after it, so the node still holds
            ({"key": "nvidia.com/gpu", "operator": "Exists", "tolerationSeconds": 300}, False),
        ],
    )
    def test_a_no_execute_taint_the_pod_tolerates_for_good_is_no_hold(
        self, toleration: dict[str, object], tolerated: bool
    ) -> None:
        """A dedicated node pool (a GPU pool's taint, tolerated by its pods) admits its pods."""
        facts = self.facts(no_execute=("nvidia.com/gpu",), no_execute_values={"nvidia.com/gpu": "present"})
        assert tolerates([toleration], "nvidia.com/gpu", "present") is tolerated
        reason = hold_reason(facts, (), [toleration])
        assert (reason is None) is tolerated, reason
        assert placement_of(facts, PlacementSpec(), [toleration]).hold == reason

    def test_a_cordon_alone_holds_a_newcomer_but_not_a_node_that_trained_in_this_run(self) -> None:
        cordoned = placement_of(self.facts(unschedulable=True), PlacementSpec())
        assert cordoned.hold_for(member=False) == "NodeCordoned: Kubernetes node gpu-7 is cordoned (spec.unschedulable)"
        assert cordoned.hold_for(member=True) is None
        broken = placement_of(NodeFacts("gpu-7", {}, unschedulable=True, ready="False"), PlacementSpec())
        assert broken.hold_for(member=True) == "NodeNotReady: Kubernetes node gpu-7 is NotReady (Ready=False)"

    def test_a_topology_key_that_no_members_node_has_is_named_with_the_fix(self) -> None:
        keys = ("topology.kubernetes.io/zon", "kubernetes.io/hostname")
        domains = [(None, "n1"), (None, "n2"), None]  # None: a member whose domain is unknown
        assert unlabelled_keys(keys, domains) == ["topology.kubernetes.io/zon"]
        assert topology_reason(keys, domains) == (
            "no member's Node has the label topology.kubernetes.io/zon: check spec.topology.keys for a misspelt key "
            "(kubectl get nodes -L topology.kubernetes.io/zon)"
        )
        assert topology_reason(keys, [("z1", "n1"), (None, "n2")]) is None  # one member's Node has it: no typo
        assert topology_reason(keys, [None, None]) is None  # nothing known: nothing to say

    def test_node_facts_read_a_node_object(self) -> None:
        facts = node_facts(
            {
                "metadata": {"name": "n1", "labels": {"zone": "z1"}},
                "spec": {
                    "unschedulable": True,
                    "taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}],
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Disk", "status": "True"}]},
            }
        )
        assert facts == NodeFacts("n1", {"zone": "z1"}, True, "True", ("b",), frozenset({"Ready", "Disk"}), {"b": ""})


class TestPlacementSpec:
    def test_defaults_are_the_well_known_keys_and_no_extra_condition(self) -> None:
        assert PlacementSpec.from_spec({}) == PlacementSpec(DEFAULT_TOPOLOGY_KEYS, ())
        assert "topology.kubernetes.io/zone" in DEFAULT_TOPOLOGY_KEYS
        spec = {"topology": {"keys": ["rack"]}, "admission": {"conditions": ["GpuUnhealthy"]}}
        assert PlacementSpec.from_spec(spec) == PlacementSpec(("rack",), ("GpuUnhealthy",))
        assert PlacementSpec.from_spec({"topology": {"keys": []}}).topology_keys == ()

    @pytest.mark.parametrize(
        ("spec", "field"),
        [
            ({"topology": {"keys": "zone"}}, "spec.topology.keys"),
            ({"topology": {"keys": ["zone", "zone"]}}, "spec.topology.keys"),
            ({"admission": {"conditions": [""]}}, "spec.admission.conditions"),
        ],
    )
    def test_a_bad_list_names_the_field_and_the_fix(self, spec: dict[str, object], field: str) -> None:
        with pytest.raises(ValueError, match=field):
            PlacementSpec.from_spec(spec)
        assert any(
            field in problem for problem in conditions_rules.spec_problems({"minNodes": 1, "maxNodes": 2, **spec})
        )
        assert conditions_rules.placement_spec(spec) == PlacementSpec()


SETTINGS = JoinSettings(2, 3, timedelta(seconds=30))


def join(member: NodeId, at: int = 0, round_number: int | None = None) -> Request:
    return Request(member, Desire.JOIN, SETTINGS, NOW + timedelta(milliseconds=at), round_number)


class TestFoldRanksByDomain:
    def test_a_full_round_ranks_by_domain_and_without_domains_by_address(self) -> None:
        domain = {node("10.0.0.1"): ("z2",), node("10.0.0.2"): ("z1",), node("10.0.0.3"): ("z2",)}
        requests = [join(member, i) for i, member in enumerate(domain)]
        placed = fold(None, requests, dead=[], now=NOW, settings=SETTINGS, domain=domain.get)
        assert placed.complete and placed.participants == {
            node("10.0.0.2"): 0,
            node("10.0.0.1"): 1,
            node("10.0.0.3"): 2,
        }
        plain = fold(None, requests, dead=[], now=NOW, settings=SETTINGS)
        assert list(plain.participants.values()) == [0, 1, 2] and plain.participants[node("10.0.0.1")] == 0

    def test_a_spare_of_the_lost_members_domain_is_promoted_before_earlier_spares(self) -> None:
        a, b, c = node("10.0.0.1"), node("10.0.0.2"), node("10.0.0.3")
        spare_z1, spare_z2 = node("10.0.9.1"), node("10.0.9.2")
        domain = {a: ("z1",), b: ("z2",), c: ("z2",), spare_z1: ("z1",), spare_z2: ("z2",)}
        formed = fold(None, [join(a), join(b, 1), join(c, 2)], dead=[], now=NOW, settings=SETTINGS, domain=domain.get)
        spares = [join(spare_z2, 10, 1), join(spare_z1, 20, 1)]  # the z2 spare asked first
        with_spares = fold(formed, spares, dead=[], now=NOW, settings=SETTINGS, domain=domain.get)
        assert with_spares.redundancy_list == {spare_z1, spare_z2}
        standing = [join(b, 1), join(c, 2), *spares]  # the dead node's request is not folded
        carried = fold(
            with_spares, standing, dead=[a], now=NOW, settings=SETTINGS, carry=lambda _: True, domain=domain.get
        )
        assert carried.round == 1 and carried.complete, "the spare completed the round at once, no last call"
        assert set(carried.participants) == {b, c, spare_z1} and carried.redundancy_list == {spare_z2}
        assert carried.participants[spare_z1] == 0  # z1 ranks first
        without = fold(with_spares, standing, dead=[a], now=NOW, settings=SETTINGS, carry=lambda _: True)
        assert set(without.participants) == {b, c, spare_z2}, "no domains: the spare that asked first"


class TestFoldHolds:
    def test_a_held_node_waits_by_its_heartbeat_only_and_joins_once_its_node_admits_it(self) -> None:
        a, b, held = node("10.0.0.1"), node("10.0.0.2"), node("10.0.0.3")
        cordoned = {held: "NodeCordoned: Kubernetes node n3 is cordoned (spec.unschedulable)"}
        requests = [join(a), join(b, 1), join(held, 2)]
        first = fold_placed(None, requests, dead=[], now=NOW, settings=SETTINGS, hold=cordoned.get)
        assert set(first.document.participants) == {a, b} and not first.document.complete
        assert held in first.document.last_heartbeats and held not in first.document.wait_list
        assert first.held == cordoned
        later = NOW + timedelta(seconds=31)
        formed = fold_placed(first.document, requests, dead=[], now=later, settings=SETTINGS, hold=cordoned.get)
        assert formed.document.complete and set(formed.document.participants) == {a, b}, "not waited for"
        assert formed.held == cordoned
        requests[2] = join(held, 2, 1)  # it asks for the next round, as an overtaken agent does
        still = fold_placed(formed.document, requests, dead=[], now=later, settings=SETTINGS, hold=cordoned.get)
        assert still.document == formed.document and still.held == cordoned, "nothing to write while it holds"
        admitted = fold_placed(formed.document, requests, dead=[], now=later, settings=SETTINGS, hold=lambda _: None)
        assert admitted.document.wait_list == {held} and admitted.held == {}

    def test_a_member_on_a_node_that_turns_bad_is_left_alone_and_a_spare_there_is_not_promoted(self) -> None:
        a, b, c, spare = node("10.0.0.1"), node("10.0.0.2"), node("10.0.0.3"), node("10.0.0.4")
        formed = fold(None, [join(a), join(b, 1), join(c, 2)], dead=[], now=NOW, settings=SETTINGS)
        with_spare = fold(formed, [join(spare, 5, 1)], dead=[], now=NOW, settings=SETTINGS)
        assert with_spare.redundancy_list == {spare}
        bad = {b: "NodeTainted: x", spare: "NodeCordoned: y"}
        standing = [join(a), join(b, 1), join(c, 2), join(spare, 5, 1)]
        kept = fold_placed(with_spare, standing, dead=[], now=NOW, settings=SETTINGS, hold=bad.get)
        assert kept.document.participants == with_spare.participants, "a member is left alone"
        assert kept.document.redundancy_list == frozenset() and kept.held == {spare: "NodeCordoned: y"}
        carried = fold_placed(
            kept.document,
            [join(a), join(b, 1), join(spare, 5, 1)],
            dead=[c],
            now=NOW,
            settings=SETTINGS,
            carry=lambda _: True,
            hold=bad.get,
        )
        assert set(carried.document.participants) == {a, b} and not carried.document.complete
        assert spare not in carried.document.participants


class TestTrainingPodsPlacement:
    def pod(self, name: str, ip: str, node_name: str, phase: str = "Running") -> dict[str, object]:
        return {
            "metadata": {"name": name, "uid": name},
            "spec": {"nodeName": node_name},
            "status": {"phase": phase, "podIP": ip},
        }

    def test_a_pod_that_tolerates_its_nodes_no_execute_taint_is_admitted_and_one_that_does_not_is_held(self) -> None:
        """A GPU pool's taint: its training pods tolerate it (admitted); a pod without the toleration is held."""
        nodes = {"gpu": NodeFacts("gpu", {}, ready="True", no_execute=("pool",), no_execute_values={"pool": "gpu"})}
        tolerant = self.pod("p1", "10.0.0.1", "gpu")
        tolerant["spec"] = {"nodeName": "gpu", "tolerations": [{"key": "pool", "value": "gpu", "effect": "NoExecute"}]}
        census = writer_rules.training_pods([tolerant, self.pod("p2", "10.0.0.2", "gpu")], nodes, PlacementSpec())
        holds = {min(pod.addresses): pod.placement.hold for pod in census.live if pod.placement is not None}
        assert holds == {"10.0.0.1": None, "10.0.0.2": "NodeTainted: Kubernetes node gpu has the NoExecute taint pool"}

    def test_min_and_max_come_from_the_spec_only_until_a_fold_wrote_them(self) -> None:
        spec = {"minNodes": 2, "maxNodes": 4}
        assert conditions_rules.nodes_until_folded(spec, {}) == {"minNodes": 2, "maxNodes": 4}
        assert conditions_rules.nodes_until_folded(spec, {"minNodes": 3, "maxNodes": 3}) == {}

    def test_the_census_carries_each_live_pods_placement_and_a_held_pod_is_not_waited_for(self) -> None:
        nodes = {
            "n1": NodeFacts("n1", {"zone": "z1"}, ready="True"),
            "n2": NodeFacts("n2", {"zone": "z2"}, unschedulable=True, ready="True"),
        }
        spec = PlacementSpec(("zone",))
        pods = [self.pod("p1", "10.0.0.1", "n1"), self.pod("p2", "10.0.0.2", "n2"), self.pod("p3", "10.0.0.3", "n9")]
        census = writer_rules.training_pods(pods, nodes, spec)
        where = census.placement_of()
        assert census.placed and where(node("10.0.0.1")) == placement_of(nodes["n1"], spec)
        assert where(node("10.0.0.2")).hold.startswith("NodeCordoned")  # type: ignore[union-attr]
        assert where(node("10.0.0.3")) is None and where(node("p1.job.ns.svc")) == where(node("10.0.0.1"))
        assert census.all_joined([node("10.0.0.1"), node("10.0.0.3")]), "the held pod on n2 is not waited for"
        assert not writer_rules.training_pods(pods).placed, "no Nodes read: no placement"
        gone = census.without_gone_agents([node("10.0.0.3")], [])
        assert gone.placed and len(gone.live) == 2

    def test_pods_without_placement_keep_the_old_census(self) -> None:
        census = TrainingPods((PodAddresses(frozenset({"10.0.0.1"}), frozenset({"p1"})),), 0)
        assert not census.placed and census.placement_of()(node("10.0.0.1")) is None


class TestEvents:
    def test_a_spare_in_a_new_round_is_promoted_and_new_held_nodes_are_announced_once(self) -> None:
        a, b, spare = node("10.0.0.1"), node("10.0.0.2"), node("10.0.0.3")
        before = RendezvousDocument(
            round=0, complete=True, participants={a: 0, b: 1}, redundancy_list=frozenset({spare})
        )
        after = RendezvousDocument(round=1, complete=True, participants={b: 0, spare: 1})
        events = events_rules.state_events(before, after, last_formed=frozenset({a, b}))
        assert [(event.reason, event.message) for event in events if event.reason == "SparePromoted"] == [
            ("SparePromoted", f"spare node {spare} was promoted into round 1")
        ]
        held = {"heldNodes": [{"node": str(spare), "reason": "NodeCordoned: Kubernetes node n3 is cordoned"}]}
        event = events_rules.held_event({}, held)
        assert event is not None and event.type == "Warning" and event.reason == "NodeHeld"
        assert (
            event.message
            == f"node {spare} waits, not admitted to a new round: NodeCordoned: Kubernetes node n3 is cordoned"
        )
        assert events_rules.held_event(held, held) is None
        forming = RendezvousDocument(round=1, participants={b: 0}, wait_list=frozenset({spare}))
        via_wait_list = events_rules.state_events(
            forming, after, last_formed=frozenset({a, b}), spares=frozenset({spare})
        )
        assert [event.message for event in via_wait_list if event.reason == "SparePromoted"] == [
            f"spare node {spare} was promoted into round 1"
        ], "a spare that passed the wait list on its way in is promoted too"
        assert not [
            e
            for e in events_rules.state_events(forming, after, last_formed=frozenset({a, b}))
            if e.reason == "SparePromoted"
        ]
