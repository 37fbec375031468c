"""How the library waits before it tries again: one backoff formula, the named policies, one retry loop.

Every retry of a request (an unanswered call, a lost compare-and-swap, a watch that dropped) waits
``RetryPolicy.delay(attempt)``: ``first_delay`` doubled per attempt, capped at ``max_delay``, jittered
between ``jitter_floor`` (a fraction) and 1 of that. Full jitter (floor 0) spreads N writers that lost
one compare-and-swap at once; half jitter (floor 0.5) is for retries of a server that did not answer,
which should not come back at once. The policies below are the only parameters the library uses; each
says what it is for, and so does each of the few fixed pauses that are not retries (``*_PAUSE``).
``tests/test_seams.py`` checks that no other module sleeps for a number written in place or retries a
failed call in a loop of its own.

Pure: the clock, the sleep and the random draw are arguments (the real ones by default), so the
loop is tested without waiting. ``retry`` does no I/O itself; the ``call`` it repeats may.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Draws a delay between its two bounds (``random.uniform``'s signature).
Uniform = Callable[[float, float], float]


@dataclass(frozen=True)
class RetryPolicy:
    """Seconds to wait before each retry, and when to stop.

    Attributes:
        first_delay: the longest wait before the first retry (attempt 1).
        max_delay: the cap of the doubling.
        jitter_floor: the shortest wait, as a fraction of the longest (0: full jitter).
        attempts: tries in all before giving up (None: until the caller's deadline).
    """

    first_delay: float
    max_delay: float
    jitter_floor: float = 0.0
    attempts: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.first_delay <= self.max_delay:
            raise ValueError(
                f"first_delay ({self.first_delay!r}) must be >= 0 and <= max_delay ({self.max_delay!r}), in seconds"
            )
        if not 0 <= self.jitter_floor <= 1:
            raise ValueError(f"jitter_floor must be a fraction between 0 and 1, got {self.jitter_floor!r}")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be >= 1 (or None), got {self.attempts!r}")

    def longest(self, attempt: int) -> float:
        """The longest wait before retry ``attempt`` (1: the first): ``first_delay`` doubled, capped."""
        return min(self.max_delay, self.first_delay * 2.0 ** min(max(attempt - 1, 0), 30))

    def delay(self, attempt: int, uniform: Uniform = random.uniform) -> float:
        """Seconds to wait before retry ``attempt`` (1: the first), jittered."""
        limit = self.longest(attempt)
        return uniform(self.jitter_floor * limit, limit)

    def wait(self, attempt: int, at_least: float = 0.0, uniform: Uniform = random.uniform) -> float:
        """Seconds to wait before retry ``attempt``: ``delay``, but never less than ``at_least`` (what the server
        asked for: a ``Retry-After``, honoured as a lower bound, never shortened)."""
        return max(self.delay(attempt, uniform), at_least)

    def exhausted(self, failures: int) -> bool:
        """Whether ``failures`` failed tries are all this policy allows."""
        return self.attempts is not None and failures >= self.attempts


#: A call that got no answer, or a transient status (429, 5xx, a 403 while RBAC syncs), repeated until the
#: caller's deadline: ``call_with_retries``, and a state or eviction write whose outcome is unknown.
OUTAGE_RETRY = RetryPolicy(first_delay=0.1, max_delay=2.0, jitter_floor=0.5)
#: Seconds an agent keeps retrying as ``OUTAGE_RETRY`` says while the API server does not answer, by default: the
#: ``retry_timeout`` of ``--rdzv-conf``, of the compare-and-swap backend and of the store.
OUTAGE_RETRY_SECONDS = 60.0
#: A watch that dropped, listed again. No deadline (a watch lasts as long as its process), so it backs
#: off further than ``OUTAGE_RETRY``: an API server that stays down is asked every 2.5-5 s, not every 1-2.
WATCH_RETRY = RetryPolicy(first_delay=0.4, max_delay=5.0, jitter_floor=0.5)
#: A lost compare-and-swap on the rendezvous state (``set_state``): the default of the agents'
#: ``conflict_backoff`` (``first_delay``, settable) and its cap.
STATE_CONFLICT_RETRY = RetryPolicy(first_delay=0.02, max_delay=2.0)
#: A lost compare-and-swap on a store key (a ``set``, or a fold of a counter), where hundreds of agents may
#: write one key (the exit barrier's counter): it starts shorter than the state's, because each loser
#: reads the winner from its watch (no request), and the state's is a user setting.
KEY_CONFLICT_RETRY = RetryPolicy(first_delay=0.01, max_delay=2.0)
#: A lost compare-and-swap on ``status.evictedNodes`` (the operator, ``kubectl rdzv evict``): a few
#: writers at most, so it gives up after 20 losses in a row (a bug, not contention) with a cap of 1 s,
#: which keeps those 20 within the operator's eviction time (``memory.EVICT_SECONDS``).
EVICTION_CONFLICT_RETRY = RetryPolicy(first_delay=0.02, max_delay=1.0, attempts=20)
#: A close of the rendezvous (``shutdown`` of a handler whose workers succeeded) whose read or fold failed (no
#: answer, a refusal for now): tried again every 0.5 s, no jitter (one agent closes, not N at once), until the
#: shutdown's deadline.
CLOSE_RETRY = RetryPolicy(first_delay=0.5, max_delay=0.5, jitter_floor=1.0)
#: Seconds a folder waits after a fold the API server refused or did not answer before it waits for the next
#: request or tick and folds again: a fold that keeps failing while requests keep waking it does not spin.
FAILED_FOLD_PAUSE = 0.5

# The pauses that are not retries of a failed call, each with its reason.

#: Seconds a store write waits after an answer that does not say whether it committed (none, a 5xx) before it
#: reads the key to learn the outcome: time for the API server to finish (or drop) the write it may still hold.
UNCLEAR_WRITE_PAUSE = 0.2
#: Seconds a blocking ``get`` waits when its watch showed the key but the GET that followed found none (the key was
#: deleted since): the watch catches up on the deletion meanwhile, instead of the get spinning on GETs.
WATCH_CATCH_UP_PAUSE = 0.05
#: Seconds an agent in a pod (``POD_UID`` set) waits, once it sees its own live node evicted, before it joins again
#: as a new node: the operator evicts the node of a pod being deleted the moment the deletion shows, and the
#: kubelet's SIGTERM follows. An agent that rejoined in between joins a round only to leave it at once, and the
#: round breaks twice (a Kueue scale-down, a JobSet's RestartJob, ``kubectl delete pod`` of a spare). A live agent
#: evicted by mistake still rejoins, this much later. Agents outside pods get no SIGTERM from a deletion: none.
FENCED_REJOIN_PAUSE = 5.0


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """The seconds a ``Retry-After`` header value asks for (RFC 9110: delta-seconds, or an HTTP-date, counted
    from ``now``, the current UTC time by default); None when there is none or it is not one of those.
    A date in the past, or a negative number, asks for no wait (0)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(int(text)))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


def no_floor(exc: Exception) -> float:
    """No lower bound on a retry's wait (``retry``'s default ``wait_at_least``)."""
    return 0.0


def retry(
    policy: RetryPolicy,
    call: Callable[[], T],
    *,
    retryable: Callable[[Exception], bool],
    deadline: float,
    what: str,
    wait_at_least: Callable[[Exception], float] = no_floor,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    uniform: Uniform = random.uniform,
) -> T:
    """Return ``call()``, repeated after each failure that is ``retryable``, waiting as ``policy`` says but
    never less than ``wait_at_least(failure)`` (the server's ``Retry-After``: a retry never comes sooner).

    Gives up (raises the last failure) when the next wait would end past ``deadline`` (a ``clock``
    time) or ``policy`` allows no more tries: a ``Retry-After`` longer than the time left ends the
    call at once rather than retrying before the server asked. A failure that is not retryable is
    raised at once.
    """
    failures = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not retryable(exc):
                raise
            failures += 1
            delay = policy.wait(failures, wait_at_least(exc), uniform)
            if policy.exhausted(failures) or clock() + delay > deadline:
                raise
            logger.info("%s failed (%s); retrying in %.1f s", what, exc, delay)
        sleep(delay)


__all__ = [
    "CLOSE_RETRY",
    "EVICTION_CONFLICT_RETRY",
    "FAILED_FOLD_PAUSE",
    "KEY_CONFLICT_RETRY",
    "OUTAGE_RETRY",
    "OUTAGE_RETRY_SECONDS",
    "STATE_CONFLICT_RETRY",
    "UNCLEAR_WRITE_PAUSE",
    "WATCH_CATCH_UP_PAUSE",
    "WATCH_RETRY",
    "RetryPolicy",
    "Uniform",
    "no_floor",
    "retry",
    "retry_after_seconds",
]
