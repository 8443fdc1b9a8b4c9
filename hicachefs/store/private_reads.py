"""Pages read from a lower tier into a reader's own memory, not a RAM slot: a page's first read
from the disk tier (it is promoted at its second), or any read when RAM has no slot to spare.

Why a module: those copies are the daemon's memory beside the RAM tier, and nothing bounded
them; 40 worker threads opening 8 MiB disk pages at once held 320 MiB, and the heap kept it.
Their bytes are taken from the ``private_reads`` share before the read, and those of users who
may not change the store (``bounded``) from ``private_reads_of_others`` inside it too, so that
such users never hold the room the store's own readers need. A read that finds no room is
refused at once with ``PrivateReadsFull``, which says when to try again (``room``): its caller
waits on its event loop (``posix.blocking``), where a wait holds none of the worker threads every
user's requests need. One copy is always allowed when its shares hold none. A large copy is an
anonymous mapping of its own, so that its memory goes back to the system with its last reader.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable

from hicachefs.store.budget import Share
from hicachefs.store.errors import PrivateReadsFull

#: Copies this large or larger are mappings of their own; smaller ones come from the heap (a
#: fresh mapping's page faults made the first read of a 128 KiB disk page 4-5 times slower).
MAPPED_FROM = 1 << 20


class PrivateReads:
    """Hands out private buffers within the shares; thread-safe (readers are worker threads)."""

    def __init__(self, share: Share, of_others: Share) -> None:
        self._all, self._others = share, of_others
        self._lock = threading.Lock()
        self._ended = False

    def buffer(self, size: int, bounded: bool = False) -> tuple[memoryview, Callable[[], None]]:
        """A writable buffer of ``size`` bytes, and the release that gives its bytes back (call
        it once); ``PrivateReadsFull`` when its shares have no room for it now."""
        shares = (self._all, self._others) if bounded else (self._all,)
        with self._lock:
            if not _room(shares, size):
                raise self._full(size, bounded)
            for share in shares:
                share.add(size)
        view = memoryview(mmap.mmap(-1, size)) if size >= MAPPED_FROM else memoryview(bytearray(size))
        return view, lambda: self._give_back(shares, size)

    def has_room(self, size: int, bounded: bool = False) -> bool:
        with self._lock:
            return _room((self._all, self._others) if bounded else (self._all,), size)

    def check(self, size: int, bounded: bool = False) -> None:
        """``PrivateReadsFull`` when a copy of ``size`` would find no room now: a read asks
        before it counts itself (a miss, an access), as a refused read is made again."""
        if not self.has_room(size, bounded):
            raise self._full(size, bounded)

    def end_waits(self) -> None:
        """The daemon is stopping: reads refused for room wait no more (``PrivateReadsFull.ended``),
        as the requests in flight, theirs among them, are answered before it exits; waiting for
        room, each kept it up for as long as its wait, 10 s."""
        self._ended = True

    def _full(self, size: int, bounded: bool) -> PrivateReadsFull:
        return PrivateReadsFull(f"{self._all.held} bytes of pages are being read into private memory "
                                f"(at most {self._all.limit}); try again", room=lambda: self.has_room(size, bounded),
                                ended=lambda: self._ended)

    def _give_back(self, shares: tuple[Share, ...], size: int) -> None:
        with self._lock:
            for share in shares:
                share.give_back(size)


def _room(shares: tuple[Share, ...], size: int) -> bool:
    return all(not share.held or share.held + size <= share.limit for share in shares)
