"""The store's blocking work (``NeedsIO``: a read from the disk or shared tier, a lookup there)
run in a worker thread, off the event loop.

Why here and not in the thread: a read that finds no room for a copy of its own
(``PrivateReadsFull``) waits for room on the event loop, at most ``PRIVATE_ROOM_WAIT_S``, and only
then tries again in a thread. Waiting in the thread, 40 such reads held every worker thread,
and every other user's request that needed one (a promotion, a fetch) waited behind them.

A worker that cannot be had (the process at its limit of threads: a cgroup's ``pids.max``,
``RLIMIT_NPROC``) is a refusal, ``EAGAIN``, not a bug: it reached the requests' catch-all, which
answered EIO and logged a traceback each time. Nothing has changed by then: the callers do their
changes in the work, or after it (``NeedsIO``).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TypeVar

import trio

from ..store import NeedsIO, PrivateReadsFull
from .errors import FsError

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
            return await _run_in_worker(work)
        except PrivateReadsFull as full:
            while not full.room():
                if full.ended() or trio.current_time() >= deadline:
                    raise
                await trio.sleep(_LOOK_S)


async def _run_in_worker(work: Callable[[], T]) -> T:
    """``work()`` in a worker thread; FsError(EAGAIN) when none could be started for it (trio
    raises the RuntimeError of ``Thread.start``, ``work`` not begun)."""
    begun = False

    def run() -> T:
        nonlocal begun
        begun = True
        return work()

    try:
        return await trio.to_thread.run_sync(run)
    except RuntimeError as exc:
        if begun:
            raise
        raise FsError(errno.EAGAIN,
                      f"no thread could be started for the disk or shared tier ({exc}); try again") from None


async def settled(answer):
    """The answer, after running in worker threads whatever blocking I/O it still needs."""
    while isinstance(answer, NeedsIO):
        answer = answer.finish(await in_thread(answer.work))
    return answer
