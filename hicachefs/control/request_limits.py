"""What the request files (``exists``, ``fetch``) may take of the daemon across all their
handles: memory for the requests they hold, and turns of the daemon's time for the large ones,
each shared out by user, so that small requests are served first and nobody takes another's
share.

Why: any user may open these files. Measured on the 2-core development VM before these bounds:
250 handles, each holding an unread request just under 8 MiB, took the daemon from 317 MiB to
2.37 GiB; and while 4 processes of a plain user sent 8 MiB exists queries, another client's
one-line query went from a median of 0.3 ms (p99 0.45 ms) to 55 ms (p99 100 ms), because up to
four large requests' steps ran back to back between its turns.

Shares (``Shares``): the store's own clients (root and the daemon's user, who alone may write
pages: SGLang's ranks) have one share together; every other user has a share of its own, and
all of them together one more, so nobody else can take the writers' room, nor one user all the
others'. What would go over a share is refused at once with ENOBUFS; it takes nothing, and no
other request is touched.

- Memory (``MEMORY``): a handle holds its request (and what answering it takes) against its
  user's share; a write that would go over fails and ends its request. A snapshot control
  file's handle (``stats``, ``metrics``, ``config``) holds its snapshot against it too, and
  an open that would go over fails. So do the writers' files, against the writers' share: a
  ``plane`` handle the request it gathers from several writes, until whole, and an ``ingest``
  handle its batch's header, until the batch's last page. A writer's handles each holding a
  partial request grew the daemon without bound (500 of 4 MiB: from 108 MiB to 2.1 GiB).
- Time (``ANSWERING``, ``StepLane``): a request answered in one step runs at once, in its own
  FUSE request. A larger one is answered a step at a time, and the steps of all large requests
  take turns in one lane, each followed by a pause in which everything else waiting is served:
  a small request waits behind at most one step of someone else's large one. A large request
  being answered keeps one of pyfuse3's 99 request tasks waiting for its turns, so how many
  there may be at once is a share too, taken by the write that makes a request large: one more
  is refused at its first large write, before it has sent megabytes for nothing (4 processes
  of one user sending 8 MiB queries, 3 of them refused each time after 7 MiB of writes, took
  another client's median from 0.2 to 8 ms).
- Turns of other users (``RequestLimits.others``, ``Account.turn``, ``turn_of``): every read
  and write of a fetch handle, and every opendir and readdir, of a user other than the store's
  own clients takes a turn in a lane of their own, each followed by a pause of 3 ms, so that
  another client's request waits behind at most one of theirs, and their processes wait rather
  than take the host's cores. A read of the fetch file costs a few milliseconds for 256 small pages, and a write of
  a MiB, refused or not, about one. On the 2-core VM, loaded by others (where another client
  alone had a p99 of 2-7 ms), while 4 processes of a plain user sent 4 MiB fetch requests of
  stored pages and read the answers, another client's p50 was 10-16 ms and its p99 48-170 ms;
  with these turns, 0.3-0.5 and 14-20 ms. Sending 1 MiB requests of missing pages (most of
  them refused): p50 6-7 and p99 31-83 ms before, 0.5-2 and 12-27 ms after. A lane of their
  own, not the large requests': a read that waits for the disk tier holds its turn meanwhile.

Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import NamedTuple

import trio

from ..posix.errors import FsError


class Limits(NamedTuple):
    writers: int  # root and the daemon's user, together
    user: int  # any other user
    others: int  # all other users, together


#: Bytes held for requests. Writers: eight exists requests of the maximum at once (a long
#: prompt asked in one go by each of 8 TP ranks), or 900 of SGLang's usual ones (some 70 KB),
#: and the plane requests and ingest headers they send (the plane's only when sent in pieces,
#: over a WRITE's MiB: a rare commit; a batch of SGLang's holds some 50 KB, its lines counted);
#: any other user: four of the costliest exists requests of the maximum (8 MiB and a byte per
#: line: 9.2 MiB each), all of them together: six.
MEMORY = Limits(writers=64 << 20, user=40 << 20, others=56 << 20)
#: Large requests at once: 32 + 6 of pyfuse3's 99 request tasks at most; any other user: four.
#: Served, a large request costs the daemon its steps alone; refused, its sender may send it
#: again at once, a MiB write each time: 4 processes of one user sending 8 MiB queries, with
#: room for one, took another client's median from 0.2 to 6-8 ms, with room for all four
#: to 0.3 ms.
ANSWERING = Limits(writers=32, user=4, others=6)
#: Pause after each step of a large request. A pause, not a bare yield: a daemon that never
#: sleeps gets only its fair share of a busy host's cores, and every other client's request
#: waits for its turn (on 2 loaded cores, a lookup's p99 went from 25-40 ms to 11-13 ms).
STEP_PAUSE_S = 0.001
#: The most a turn of the lane runs steps for: about one step of the costliest lines.
TURN_S = 0.001
#: Pause after each turn of the other users' lane. On the 2-core VM, another client's p99
#: during 4 processes of a plain user's fetch storms: 14.4 ms (stored pages) and 11.2 ms
#: (missing ones) with 1 ms, 6.3 and 7.7 ms with 3 ms; listings: see docs/performance.md.
OTHERS_PAUSE_S = 0.003


class Shares:
    """Amounts held by user within ``Limits`` (see the module docstring)."""

    def __init__(self, writers: frozenset[int], limits: Limits, what: str) -> None:
        self.writers = writers
        self.limits = limits
        self.what = what
        self._by_user: dict[int, int] = {}
        self._writers = 0
        self._others = 0

    def change(self, uid: int, delta: int) -> None:
        """Take (``delta`` > 0) or give back for ``uid``; FsError ENOBUFS, taking nothing, when
        taking would go over a share."""
        if uid in self.writers:
            if delta > 0 and self._writers + delta > self.limits.writers:
                raise self._refused(self.limits.writers, "root and the daemon's user")
            self._writers += delta
            return
        mine = self._by_user.get(uid, 0)
        if delta > 0 and mine + delta > self.limits.user:
            raise self._refused(self.limits.user, f"uid {uid}")
        if delta > 0 and self._others + delta > self.limits.others:
            raise self._refused(self.limits.others, "the users other than root and the daemon's")
        self._others += delta
        if mine + delta:
            self._by_user[uid] = mine + delta
        else:
            self._by_user.pop(uid, None)

    @property
    def held(self) -> int:
        return self._writers + self._others

    def _refused(self, limit: int, whose: str) -> FsError:
        return FsError(errno.ENOBUFS, f"{self.what} of {whose} are at their limit ({limit:,}); "
                                      "try again once some are answered")


class StepLane:
    """Turns of steps, one turn at a time across all handles, each followed by a pause before
    the next turn begins (not before its own answer: a lone step costs its sender no wait).
    Fair: turns run in the order they asked (trio's lock is FIFO)."""

    def __init__(self, pause_s: float = STEP_PAUSE_S) -> None:
        self._turn = trio.Lock()
        self.pause_s = pause_s
        self._free_at = 0.0  # when the pause after the last step ends (time.monotonic)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """What runs inside is one step: it waits for its turn and for the pause after the step
        before it (a refused one too: refusals cost their sender nothing else)."""
        async with self._turn:
            await trio.sleep(max(0.0, self._free_at - time.monotonic()))  # holding the turn: the pause is everyone else's
            try:
                yield
            finally:
                self._free_at = time.monotonic() + self.pause_s

    async def step(self, work: Callable[[], bool]) -> bool:
        """One turn of ``work`` (a step, called until it returns False): as many steps as fit in
        ``TURN_S``, at least one. Whether more remain. Steps of costly lines take a turn each;
        steps of lines that cost nothing to answer (8 MiB of empty lines is 8,192 steps) no
        longer wait a pause each (that request took 12 s, 8 of them pauses)."""
        async with self.turn():
            until = time.monotonic() + TURN_S
            while work():
                if time.monotonic() >= until:
                    return True
            return False


class RequestLimits:
    """The request files' shares and lane, one for the daemon."""

    def __init__(self, writers: frozenset[int]) -> None:
        self.writers = writers
        self.memory = Shares(writers, MEMORY, "bytes held for requests")
        self.answering = Shares(writers, ANSWERING, "large requests being answered")
        self.lane = StepLane()  # large requests' steps
        self.others = StepLane(OTHERS_PAUSE_S)  # other users' fetch reads and writes

    def turn_of(self, uid: int | None) -> AbstractAsyncContextManager[None]:
        """A turn in the lane of the users other than the store's own clients, for one request
        of ``uid`` (opening or listing a directory); none for the store's own clients."""
        return contextlib.nullcontext() if uid is None or uid in self.writers else self.others.turn()

    def account(self, uid: int) -> Account:
        """What one handle opened by ``uid`` takes, charged to that user."""
        return Account(self, uid)


class Account:
    """One request handle's memory and turns."""

    __slots__ = ("limits", "uid", "held", "large")

    def __init__(self, limits: RequestLimits, uid: int) -> None:
        self.limits, self.uid, self.held, self.large = limits, uid, 0, False

    @property
    def writer(self) -> bool:
        """Whether the handle is one of the store's own clients' (root, the daemon's user)."""
        return self.uid in self.limits.writers

    def hold(self, nbytes: int, large: bool = False) -> None:
        """Hold ``nbytes`` from now on; ``large``: the request is answered in steps, and takes
        one of its user's large requests until they end. ENOBUFS when either would go over, and
        the account holds what it held. ``hold(0)`` ends the request: it gives back both."""
        turn = large and not self.large
        if turn:
            self.limits.answering.change(self.uid, 1)
        try:
            self.limits.memory.change(self.uid, nbytes - self.held)
        except FsError:
            if turn:
                self.limits.answering.change(self.uid, -1)
            raise
        self.held, self.large = nbytes, self.large or turn
        if not nbytes:
            self._end_turns()

    def turn(self) -> AbstractAsyncContextManager[None]:
        """A turn in the lane of the users other than the store's own clients, for one read or
        write of their handle (see the module docstring)."""
        return self.limits.others.turn()

    async def in_steps(self, step: Callable[[], bool]) -> None:
        """Call ``step`` until it returns False, each call a turn in the lane (a large request,
        see ``hold``); its large request ends with the last step."""
        try:
            while await self.limits.lane.step(step):
                pass
        finally:
            self._end_turns()

    def _end_turns(self) -> None:
        if self.large:
            self.limits.answering.change(self.uid, -1)
            self.large = False
