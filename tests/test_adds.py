"""Combining adds: the pure fold (``adder_rules``), and the index a process keeps of its watch (``AddIndex``)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kube_rendezvous._rules.adder_rules import (
    ADDS_ANNOTATION,
    ADDS_TO_LABEL,
    AddRequest,
    CounterValueError,
    counter_digest,
    encode,
    fold,
    folded,
    request_name,
    request_of,
)
from kube_rendezvous._store.adder import AddIndex

COUNTER = "rdzv.k-0123456789abcdef0123456789abcdef"


def request(request_id: str, amount: int = 1, counter: str = COUNTER) -> dict[str, Any]:
    return {
        "metadata": {"name": request_name(counter, request_id), "labels": {ADDS_TO_LABEL: counter_digest(counter)}},
        "spec": {"key": "k", "value": base64.b64encode(str(amount).encode()).decode()},
    }


def counter(done: dict[str, int], name: str = COUNTER) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {ADDS_ANNOTATION: encode(done)}}, "spec": {"value": ""}}


class TestFold:
    def test_folds_pending_requests_in_id_order_each_seeing_its_own_total(self) -> None:
        value, done = fold("k", b"10", {}, [AddRequest("b", 2), AddRequest("a", 1), AddRequest("c", -3)], "abc")
        assert value == 10
        assert done == {"a": 11, "b": 13, "c": 10}

    def test_a_missing_counter_counts_as_zero(self) -> None:
        assert fold("k", None, {}, [AddRequest("a", 5)], "a") == (5, {"a": 5})

    def test_a_request_already_folded_is_not_added_twice(self) -> None:
        value, done = fold("k", b"11", {"a": 11}, [AddRequest("a", 1), AddRequest("b", 1)], "ab")
        assert (value, done) == (12, {"a": 11, "b": 12})

    def test_entries_of_requests_gone_are_dropped_and_the_rest_kept(self) -> None:
        value, done = fold("k", b"3", {"gone": 2, "kept": 3}, [AddRequest("new", 1)], ["kept", "new"])
        assert (value, done) == (4, {"kept": 3, "new": 4})

    def test_a_value_that_is_not_an_integer_names_the_key_and_the_fix(self) -> None:
        with pytest.raises(CounterValueError, match=r"add\('exit/num'\): the key holds b'abc', not an integer; set"):
            fold("exit/num", b"abc", {}, [AddRequest("a", 1)], "a")


class TestParsing:
    def test_request_name_and_request_of_round_trip(self) -> None:
        assert request_of(request("00ff00ff00ff", 7)) == (counter_digest(COUNTER), AddRequest("00ff00ff00ff", 7))
        assert request_name(COUNTER, "x").startswith("rdzv.a-0123456789abcdef")

    @pytest.mark.parametrize(
        "obj",
        [
            {"metadata": {"name": COUNTER}, "spec": {"value": "MQ=="}},  # a key, not a request
            {**request("a"), "spec": {"value": base64.b64encode(b"one").decode()}},  # amount not an integer
        ],
    )
    def test_what_is_not_a_well_formed_request_is_ignored(self, obj: dict[str, Any]) -> None:
        assert request_of(obj) is None

    @pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"a": "x"}'])
    def test_a_malformed_map_reads_as_empty_or_keeps_only_integers(self, text: str) -> None:
        obj = {"metadata": {"annotations": {ADDS_ANNOTATION: text}}}
        assert folded(obj) == {}


class TestIndex:
    def test_the_first_pending_request_is_the_smallest_id_not_yet_folded(self) -> None:
        index = AddIndex()
        digest = counter_digest(COUNTER)
        index.expect("b", digest)
        for request_id in ("c", "a", "b"):
            index.changed(request(request_id), True)
        assert index.first_pending(digest) == "a"
        index.changed(counter({"a": 1}), True)
        assert index.first_pending(digest) == "b"
        index.changed(request("a"), False)  # its adder read its value and deleted it
        assert index.first_pending(digest) == "b"
        assert index.pending(digest, {"a": 1}) == ([AddRequest("b", 1), AddRequest("c", 1)], {"b", "c"})

    def test_a_result_shown_by_any_version_is_kept_even_when_a_later_version_drops_it(self) -> None:
        index = AddIndex()
        digest = counter_digest(COUNTER)
        index.expect("b", digest)
        index.changed(request("b"), True)
        index.changed(counter({"b": 4}), True)
        index.changed(request("b"), False)  # deleted (by delete_key) before the waiter woke
        index.changed(counter({}), False)
        assert not index.shown(digest, "b")
        assert index.result("b") == 4
        index.forget("b")
        assert index.result("b") is None

    def test_results_of_requests_nobody_here_waits_for_are_not_kept(self) -> None:
        index = AddIndex()
        index.changed(counter({"x": 1}), True)
        assert index.result("x") is None

    def test_a_new_list_rebuilds_the_requests(self) -> None:
        index = AddIndex()
        digest = counter_digest(COUNTER)
        index.changed(request("a"), True)
        index.changed(None, False, [request("b"), counter({})])
        assert index.pending(digest, {})[1] == {"b"}
