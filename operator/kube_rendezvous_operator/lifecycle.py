"""Each Rendezvous's background tasks, started and stopped from its watch events: no finalizer.

Kopf holds every object its daemons and timers serve with a finalizer until they have stopped, so with
the operator stopped or uninstalled a Rendezvous could not be deleted, nor its namespace, nor the CRD.
Its tasks (the folder, the resync, the NotReady-node rule, the TTL deletion: ``handlers.rendezvous_tasks``)
are plain asyncio tasks instead: started when a live Rendezvous is seen, stopped when its deletion starts,
and stopped and forgotten with its whole record (``OperatorMemo.forget``) when its DELETED event arrives;
all stop when the operator exits. A Rendezvous deleted while the operator is down is simply absent when
it starts. The agents take the object's disappearance as the close of their run.

The tasks record the uid of the object they work for: an object created anew under the same name (a new
uid) gets new tasks and a fresh record, and the late DELETED event of the older one does not touch them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from .memory import Key, OperatorMemo, RendezvousTasks

logger = logging.getLogger(__name__)

#: One task of a Rendezvous: runs until the flag it is given is set (or its work is done).
Work = Callable[[asyncio.Event], Awaitable[None]]

#: Seconds a task gets to finish once asked to end (the folder, to release the writer Lease).
TASK_END_SECONDS = 10.0
#: Seconds the tasks of a Rendezvous get to end once asked; then they are cancelled.
STOP_SECONDS = TASK_END_SECONDS + 5
#: Seconds before a task that failed is started again.
RESTART_SECONDS = 5.0


async def stopped_within(stopped: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``stopped``; whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopped.wait(), max(0.0, seconds))
    return stopped.is_set()


async def _run(key: Key, name: str, work: Work, stopped: asyncio.Event) -> None:
    """Run ``work`` until it returns or ``stopped``; start it again after a failure (as Kopf did its daemons)."""
    while not stopped.is_set():
        try:
            await work(stopped)
            return
        except Exception:
            logger.exception(
                "the %s task of rendezvous %s/%s failed; it starts again in %g s", name, *key, RESTART_SECONDS
            )
            await stopped_within(stopped, RESTART_SECONDS)


async def _stop(running: RendezvousTasks | None) -> None:
    """Ask every task of ``running`` to end, wait ``STOP_SECONDS`` for them, then cancel the rest.

    Called from one of these tasks (``forget`` of a Rendezvous found gone), it does not wait for that one.
    """
    if running is None:
        return
    for _, stopped in running.tasks.values():
        stopped.set()
    tasks = [task for task, _ in running.tasks.values() if task is not asyncio.current_task()]
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=STOP_SECONDS)
    for task in late:
        logger.warning("task %s did not end within %g s of being asked to; cancelled", task.get_name(), STOP_SECONDS)
        task.cancel()


async def start(memo: OperatorMemo, key: Key, uid: str, wanted: dict[str, Work]) -> None:
    """Run the tasks ``wanted`` of Rendezvous ``key`` (object ``uid``): start those not running, stop the others.

    A task that ended by itself (its work done) is not started again; one stopped is, once wanted again.
    Tasks of another object of that name (deleted, its DELETED event missed or not handled yet) are
    stopped first, and the record of that object is forgotten.
    """
    record = memo.get(key)
    running = record.tasks if record is not None else None
    if running is not None and running.uid != uid:
        memo.forget(key)
        await _stop(running)
        memo.forget(key)  # what its tasks wrote while they ended
    record = memo.record(key)
    if record.tasks is None:
        record.tasks = RendezvousTasks(uid)
    running = record.tasks
    for name, (task, stopped) in list(running.tasks.items()):
        if name not in wanted:
            stopped.set()
        if stopped.is_set() and task.done():
            del running.tasks[name]  # stopped: started again once wanted again
    for name, work in wanted.items():
        if name not in running.tasks:
            stopped = asyncio.Event()
            task = asyncio.create_task(_run(key, name, work, stopped), name=f"{name} {key[0]}/{key[1]}")
            running.tasks[name] = (task, stopped)


def _take_tasks(memo: OperatorMemo, key: Key) -> RendezvousTasks | None:
    """Take the tasks out of ``key``'s record (None when it has none)."""
    record = memo.get(key)
    if record is None:
        return None
    running, record.tasks = record.tasks, None
    return running


async def stop(memo: OperatorMemo, key: Key) -> None:
    """Stop the tasks of Rendezvous ``key`` (its deletion started); the rest of its record stays."""
    await _stop(_take_tasks(memo, key))


async def forget(memo: OperatorMemo, key: Key, uid: str) -> None:
    """Rendezvous ``key`` (object ``uid``) was deleted: stop its tasks and forget its record whole.

    Nothing happens when the tasks work for another object of that name: created since, it owns the name.
    One of its own tasks may call it, having found the object gone (a deletion whose event was missed).
    """
    record = memo.get(key)
    running = record.tasks if record is not None else None
    if running is not None and running.uid != uid:
        return
    memo.forget(key)
    await _stop(running)
    after = memo.get(key)
    if after is None or after.tasks is None:
        memo.forget(key)  # what its tasks wrote while they ended


async def stop_all(memo: OperatorMemo) -> None:
    """Stop every Rendezvous's tasks (the operator exits): each folder releases its writer Lease."""
    everything = [_take_tasks(memo, key) for key in memo.tracked()]
    await asyncio.gather(*(_stop(running) for running in everything))
