"""The join loop's 1 s poll is skipped only in a thread whose next read waits on a watch (``frameworks``)."""

from __future__ import annotations

import threading
from typing import Any

from kube_rendezvous import frameworks
from kube_rendezvous.frameworks import POLL_SECONDS, waited_for_change, watch_aware_delay


def recording() -> tuple[list[Any], Any]:
    slept: list[Any] = []
    return slept, watch_aware_delay(slept.append)


def test_the_poll_is_skipped_once_after_a_read_that_waits_on_a_watch() -> None:
    slept, delay = recording()
    waited_for_change(True)
    delay(POLL_SECONDS)
    assert slept == []
    delay(POLL_SECONDS)  # the flag was used up: no busy loop if nothing sets it again
    assert slept == [POLL_SECONDS]


def test_the_poll_is_kept_when_the_read_does_not_wait() -> None:
    slept, delay = recording()
    waited_for_change(False)
    delay(POLL_SECONDS)
    assert slept == [POLL_SECONDS]


def test_other_delays_are_never_skipped() -> None:
    slept, delay = recording()
    waited_for_change(True)
    delay((0, 0.3))  # the first round's jitter and torch's CAS back-off
    delay(seconds=2)
    assert slept == [(0, 0.3), 2]


def test_the_flag_belongs_to_its_thread() -> None:
    slept, delay = recording()
    waited_for_change(True)
    other = threading.Thread(target=delay, args=(POLL_SECONDS,))
    other.start()
    other.join()
    assert slept == [POLL_SECONDS]  # another thread's wait does not skip this one's poll
    delay(POLL_SECONDS)
    assert slept == [POLL_SECONDS]


def test_wrapping_is_idempotent_and_installed_in_the_framework() -> None:
    _, delay = recording()
    assert watch_aware_delay(delay) is delay
    frameworks.tensorplay()
    from tensorplay.distributed.elastic.rendezvous import dynamic_rendezvous

    assert getattr(dynamic_rendezvous._delay, "watch_aware", False)
