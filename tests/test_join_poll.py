"""The join loop's 1 s poll is skipped only in a thread whose backend's next read waits on a watch (``frameworks``)."""

from __future__ import annotations

import threading
from typing import Any

from kube_rendezvous import frameworks
from kube_rendezvous.frameworks import POLL_SECONDS, next_read_waits, poll_skipped, watch_aware_delay


def recording() -> tuple[list[Any], Any]:
    poll_skipped()  # no flag left over from another test in this thread
    slept: list[Any] = []
    return slept, watch_aware_delay(slept.append)


def test_the_poll_is_skipped_once_and_the_next_read_told_to_wait_instead() -> None:
    slept, delay = recording()
    next_read_waits(True)
    delay(POLL_SECONDS)
    assert slept == []
    assert poll_skipped()  # the read that follows waits on the watch for a change ...
    assert not poll_skipped()  # ... once: a read no poll precedes answers at once
    delay(POLL_SECONDS)  # the flag was used up: no busy loop if nothing sets it again
    assert slept == [POLL_SECONDS]
    assert not poll_skipped()


def test_the_poll_is_kept_when_the_read_cannot_wait() -> None:
    slept, delay = recording()
    next_read_waits(False)
    delay(POLL_SECONDS)
    assert slept == [POLL_SECONDS]
    assert not poll_skipped()


def test_other_delays_are_never_skipped() -> None:
    slept, delay = recording()
    next_read_waits(True)
    delay((0, 0.3))  # the first round's jitter and torch's CAS back-off
    next_read_waits(True)
    delay(seconds=2)
    assert slept == [(0, 0.3), 2]
    assert not poll_skipped()


def test_the_flags_belong_to_their_thread() -> None:
    slept, delay = recording()
    next_read_waits(True)
    other = threading.Thread(target=delay, args=(POLL_SECONDS,))
    other.start()
    other.join()
    assert slept == [POLL_SECONDS]  # another thread's watch does not skip this one's poll
    delay(POLL_SECONDS)
    assert slept == [POLL_SECONDS]
    assert poll_skipped()


def test_wrapping_is_idempotent_and_installed_in_the_framework() -> None:
    _, delay = recording()
    assert watch_aware_delay(delay) is delay
    frameworks.tensorplay()
    from tensorplay.distributed.elastic.rendezvous import dynamic_rendezvous

    assert getattr(dynamic_rendezvous._delay, "watch_aware", False)
