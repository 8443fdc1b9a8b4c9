"""A worker's wait for its next FUSE request, which must not hold up the requests it has in
flight (``--workers``).

pyfuse3's loop waits until the session's descriptor is readable, then reads a request with a
blocking ``read``. Every worker's clone of the session shares the kernel's one queue, so all of
them wake for a request and all but one find nothing left and block in ``read`` until the next
request comes. A worker blocked there cannot answer the requests it already has while their
answers from the owner wait on its channel; if no request comes, they never would.

So a worker that has calls in flight arms a timer before that ``read`` and disarms it when the
request it read begins (``taken``): a ``read`` that blocks is broken by the timer's signal within
``UNBLOCK_AFTER_S`` (libfuse reports ``EINTR``, and pyfuse3 goes back to waiting, this time
through the event loop). The timer repeats until disarmed: a process descheduled between arming
it and the ``read`` may take its first signal before the ``read`` begins. pyfuse3 has no hook
for this, so the worker's ``trio.lowlevel.wait_readable`` is wrapped for the session's
descriptor alone: pyfuse3 reads right after that wait returns.
"""

from __future__ import annotations

import signal
from typing import Callable

import trio

#: How long a worker that has calls in flight stays blocked in a read another worker won.
UNBLOCK_AFTER_S = 0.002
_TIMER = signal.ITIMER_REAL
_SIGNAL = signal.SIGALRM


class StolenReads:
    """See the module docstring. ``busy()``: whether the worker has calls in flight."""

    def __init__(self, session_fd: int, busy: Callable[[], bool]) -> None:
        self.session_fd = session_fd
        self.busy = busy
        self._armed = False
        self._wait_readable = trio.lowlevel.wait_readable

    def install(self) -> None:
        """In the worker, before its loop starts."""
        signal.signal(_SIGNAL, lambda signum, frame: None)
        signal.siginterrupt(_SIGNAL, True)  # break the read, do not restart it
        trio.lowlevel.wait_readable = self._wait

    def taken(self) -> None:
        """A request began: the read that brought it is over."""
        if self._armed:
            signal.setitimer(_TIMER, 0)
            self._armed = False

    async def _wait(self, fd) -> None:
        if fd != self.session_fd:
            return await self._wait_readable(fd)
        self.taken()
        await self._wait_readable(fd)
        if self.busy():  # again every period: the first may come before the read begins
            signal.setitimer(_TIMER, UNBLOCK_AFTER_S, UNBLOCK_AFTER_S)
            self._armed = True
