"""The retry seam: ``retries.RetryPolicy``'s backoff, the named policies, ``retries.retry`` with an injected
clock, sleep and random draw (no waiting), and the one root of the API's errors (``kubeapi.KubernetesApiError``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from kube_rendezvous._kube import kubeapi
from kube_rendezvous._kube.kubeapi import (
    ApiError,
    ApiUnavailableError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidError,
    KubernetesApiError,
    NotFoundError,
    ServerUnavailableError,
    api_error,
    is_transient,
)
from kube_rendezvous._rules.retries import (
    EVICTION_CONFLICT_RETRY,
    KEY_CONFLICT_RETRY,
    OUTAGE_RETRY,
    STATE_CONFLICT_RETRY,
    WATCH_RETRY,
    RetryPolicy,
    retry,
)


def longest(low: float, high: float) -> float:
    return high


def shortest(low: float, high: float) -> float:
    return low


class FakeTime:
    """A clock that only the injected sleep moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(failures: list[Exception], result: str = "done") -> Callable[[], str]:
    """A call that raises each of ``failures`` in turn, then returns ``result``."""
    pending = list(failures)

    def call() -> str:
        if pending:
            raise pending.pop(0)
        return result

    return call


# -- the policy ----------------------------------------------------------------------------


def test_delay_doubles_from_first_delay_up_to_the_cap() -> None:
    policy = RetryPolicy(first_delay=0.1, max_delay=1.0)
    assert [policy.longest(attempt) for attempt in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert policy.longest(0) == pytest.approx(0.1)  # no attempt before the first
    assert policy.longest(10_000) == 1.0  # no overflow


def test_delay_is_jittered_between_the_floor_and_the_longest() -> None:
    half = RetryPolicy(first_delay=0.4, max_delay=5.0, jitter_floor=0.5)
    assert half.delay(2, longest) == pytest.approx(0.8)
    assert half.delay(2, shortest) == pytest.approx(0.4)
    full = RetryPolicy(first_delay=0.4, max_delay=5.0)
    assert full.delay(2, shortest) == 0.0
    for attempt in range(1, 20):
        assert 0.5 * half.longest(attempt) <= half.delay(attempt) <= half.longest(attempt)


def test_attempts_bound_the_tries() -> None:
    policy = RetryPolicy(first_delay=0.02, max_delay=1.0, attempts=3)
    assert [policy.exhausted(failures) for failures in (1, 2, 3, 4)] == [False, False, True, True]
    assert not RetryPolicy(first_delay=0.1, max_delay=1.0).exhausted(10**6)


@pytest.mark.parametrize(
    "arguments",
    [
        {"first_delay": -0.1, "max_delay": 1.0},
        {"first_delay": 2.0, "max_delay": 1.0},
        {"first_delay": 0.1, "max_delay": 1.0, "jitter_floor": 1.5},
        {"first_delay": 0.1, "max_delay": 1.0, "attempts": 0},
    ],
)
def test_a_policy_that_cannot_be_followed_is_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**arguments)


def test_the_named_policies_keep_the_waits_they_replaced() -> None:
    """Each named policy gives the waits its call sites had as literals before they were named."""

    def former(attempt: int, base: float, cap: float, floor: float = 0.0) -> tuple[float, float]:
        limit = min(cap, base * 2 ** (attempt - 1))
        return floor * limit, limit

    def bounds(policy: RetryPolicy, attempt: int) -> tuple[float, float]:
        return policy.delay(attempt, shortest), policy.delay(attempt, longest)

    for attempt in range(1, 12):
        assert bounds(OUTAGE_RETRY, attempt) == pytest.approx(former(attempt, 0.1, 2.0, 0.5))
        assert bounds(STATE_CONFLICT_RETRY, attempt) == pytest.approx(former(attempt, 0.02, 2.0))
        assert bounds(EVICTION_CONFLICT_RETRY, attempt) == pytest.approx(former(attempt, 0.02, 1.0))
        # These two were called with the attempt plus one.
        assert bounds(KEY_CONFLICT_RETRY, attempt) == pytest.approx(former(attempt + 1, 0.005, 2.0))
        assert bounds(WATCH_RETRY, attempt) == pytest.approx(former(attempt + 1, 0.2, 5.0, 0.5))
    assert EVICTION_CONFLICT_RETRY.attempts == 20


# -- the loop ------------------------------------------------------------------------------


def test_retry_waits_as_the_policy_says_until_the_call_succeeds() -> None:
    time = FakeTime()
    policy = RetryPolicy(first_delay=0.1, max_delay=0.3)
    call = failing([ValueError("a"), ValueError("b"), ValueError("c")])
    result = retry(
        policy,
        call,
        retryable=lambda exc: isinstance(exc, ValueError),
        deadline=time.now + 60,
        what="test",
        clock=time.clock,
        sleep=time.sleep,
        uniform=longest,
    )
    assert result == "done"
    assert time.slept == pytest.approx([0.1, 0.2, 0.3])


def test_retry_raises_a_failure_that_is_not_retryable_at_once() -> None:
    time = FakeTime()
    with pytest.raises(KeyError):
        retry(
            OUTAGE_RETRY,
            failing([KeyError("no")]),
            retryable=lambda exc: isinstance(exc, ValueError),
            deadline=time.now + 60,
            what="test",
            clock=time.clock,
            sleep=time.sleep,
        )
    assert time.slept == []


def test_retry_gives_up_when_the_next_wait_would_end_past_the_deadline() -> None:
    time = FakeTime()
    failures: list[Exception] = [ValueError(str(n)) for n in range(100)]
    with pytest.raises(ValueError) as raised:
        retry(
            RetryPolicy(first_delay=1.0, max_delay=1.0),
            failing(failures),
            retryable=lambda exc: True,
            deadline=time.now + 2.5,
            what="test",
            clock=time.clock,
            sleep=time.sleep,
            uniform=longest,
        )
    assert time.slept == [1.0, 1.0]  # a third wait would end at 3.0 > 2.5
    assert str(raised.value) == "2"  # the last failure


def test_retry_gives_up_after_the_policys_attempts() -> None:
    time = FakeTime()
    with pytest.raises(ValueError) as raised:
        retry(
            RetryPolicy(first_delay=0.1, max_delay=0.1, attempts=3),
            failing([ValueError(str(n)) for n in range(10)]),
            retryable=lambda exc: True,
            deadline=float("inf"),
            what="test",
            clock=time.clock,
            sleep=time.sleep,
        )
    assert len(time.slept) == 2
    assert str(raised.value) == "2"


# -- the root of the API's errors -------------------------------------------------------------


def test_every_api_outcome_is_a_kubernetes_api_error() -> None:
    outcomes: list[KubernetesApiError] = [ApiUnavailableError("GET /x: refused")]
    outcomes += [api_error(status, "Reason", "message", "GET", "/x") for status in (400, 401, 403, 404, 409, 410, 422)]
    outcomes += [api_error(status, "Reason", "message", "GET", "/x") for status in (429, 500, 503)]
    for exc in outcomes:
        assert isinstance(exc, KubernetesApiError)
    for kind in (ConflictError, NotFoundError, GoneError, ForbiddenError, InvalidError, ServerUnavailableError):
        assert issubclass(kind, ApiError)
    assert issubclass(ApiUnavailableError, KubernetesApiError)
    assert not issubclass(ApiUnavailableError, ApiError)


def test_every_error_class_says_when_it_is_raised() -> None:
    errors = [
        value
        for value in vars(kubeapi).values()
        if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == kubeapi.__name__
    ]
    assert KubernetesApiError in errors and len(errors) >= 9
    for error in errors:
        assert (error.__doc__ or "").startswith("Raised when "), error


def test_transient_is_what_call_with_retries_retries() -> None:
    assert is_transient(ApiUnavailableError("no answer"))
    assert is_transient(api_error(503, "ServiceUnavailable", "not ready", "GET", "/x"))
    assert is_transient(api_error(403, "Forbidden", "syncing", "GET", "/x", transient=True))
    assert not is_transient(api_error(403, "Forbidden", "no", "GET", "/x"))
    assert not is_transient(api_error(409, "Conflict", "stale", "PUT", "/x"))
    assert not is_transient(ValueError("not an API outcome"))
