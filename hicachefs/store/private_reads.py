"""Pages read from a lower tier into a reader's own memory, not a RAM slot: a page's first read
from the disk tier (it is promoted at its second), or any read when RAM has no slot to spare.

Why a module: those copies are the daemon's memory beside the RAM tier, and nothing bounded
them; 40 worker threads opening 8 MiB disk pages at once held 320 MiB, and the heap kept it.
Their bytes are taken from the ``private_reads`` share before the read, and a read that finds
no room waits for a copy to be let go (a reader's close or lease end), then fails with
``PrivateReadsFull`` (ENOBUFS). Each copy is an anonymous mapping of its own, so its memory goes
back to the system with its last reader.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Callable

from hicachefs.store.budget import Share
from hicachefs.store.errors import PrivateReadsFull

#: How long a read waits for room; readers let go within a lease (2 s) of their last read.
ROOM_WAIT_S = 10.0


class PrivateReads:
    """Hands out private buffers within one share; thread-safe (readers are worker threads)."""

    def __init__(self, share: Share, wait_s: float = ROOM_WAIT_S) -> None:
        self._share = share
        self._wait_s = wait_s
        self._room = threading.Condition(threading.Lock())

    def buffer(self, size: int) -> tuple[memoryview, Callable[[], None]]:
        """A writable buffer of ``size`` bytes, and the release that gives its bytes back (call
        it once). One copy is always allowed when none is held, whatever its size."""
        deadline = time.monotonic() + self._wait_s
        with self._room:
            while self._share.held and not self._share.take(size):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PrivateReadsFull(f"{self._share.held} bytes of pages are being read into private "
                                           f"memory (at most {self._share.limit}); try again")
                self._room.wait(left)
            if not self._share.held:
                self._share.add(size)
        view = memoryview(mmap.mmap(-1, size)) if size else memoryview(bytearray())
        return view, lambda: self._give_back(size)

    def _give_back(self, size: int) -> None:
        with self._room:
            self._share.give_back(size)
            self._room.notify_all()
