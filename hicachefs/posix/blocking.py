"""The store's blocking work (``NeedsIO``: a read from the disk or shared tier, a lookup there)
run in a worker thread, off the event loop.

Why here and not in the thread: a read that finds no room for a copy of its own
(``PrivateReadsFull``) waits for room on the event loop, at most ``PRIVATE_ROOM_WAIT_S``, and only
then tries again in a thread. Waiting in the thread, 40 such reads held every worker thread,
and every other user's request that needed one (a promotion, a fetch) waited behind them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from ..store import NeedsIO, PrivateReadsFull

#: How long a read waits for room for its own copy of a page (readers let go of theirs at
#: their close, or within a lease, 2 s, of their last read).
PRIVATE_ROOM_WAIT_S = 10.0
#: How often a waiting read looks for room.
_LOOK_S = 0.02

T = TypeVar("T")


async def in_thread(work: Callable[[], T]) -> T:
    """``work()`` in a worker thread; tried again once there may be room when it found none
    for a private copy, and the refusal raised when none came in time, or once the daemon
    stops (a stopping daemon answers the requests in flight before it exits)."""
    deadline = trio.current_time() + PRIVATE_ROOM_WAIT_S
    while True:
        try:
            return await trio.to_thread.run_sync(work)
        except PrivateReadsFull as full:
            while not full.room():
                if full.ended() or trio.current_time() >= deadline:
                    raise
                await trio.sleep(_LOOK_S)


async def settled(answer):
    """The answer, after running in worker threads whatever blocking I/O it still needs."""
    while isinstance(answer, NeedsIO):
        answer = answer.finish(await in_thread(answer.work))
    return answer
