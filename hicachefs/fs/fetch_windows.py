"""Reads of ``.hicachefs/fetch`` that a worker answers alone (``--workers``).

Why: forwarded, every READ of a batch (one per MiB) cost the owner of the store a round trip,
100-175 us of its time a page, and the owner was the ceiling. Now the owner, when it answers a
forwarded fetch read (or write), also pins the pages that follow it in RAM, up to
``AHEAD_BYTES`` and within what all windows may pin together (``ahead_for``; for the store's own
clients' handles only: ``FetchHandle._pins_ahead``), and
writes the window down in the handle's slot (``handle_slots``): each page's place in the answer
and in the memory the store shares with the workers. A worker that gets a READ inside the window
copies the bytes from there itself; a READ outside it, or reaching past it where more pages
follow, is forwarded as before, and gives the next window.

The window keeps to the fetch file's rules (``fetch.py``): its pages stay pinned until the owner
answers another read of the handle or its request ends, and the owner clears the slot before
it answers any write or release of the handle, so a window is never read for another request
than its own. A worker that answered from it marks the slot, so that the owner, clearing it,
learns that the answer began (a write then starts a new request). Where a page cannot be served from RAM as asked, the window ends before it: the
answer ends there (a missing page, one of another size), or the owner is asked (a page on a
lower tier, read in a thread).

Reads answered alone are counted in memory shared with the owner, one counter per worker, which
the owner adds to its counts (``answered_alone``).
"""

from __future__ import annotations

import bisect
import mmap
import struct

from .fetch import MAX_WINDOW_PAGES
from .handle_slots import HandleSlots, HeldAhead

#: How far past a forwarded read the owner pins pages for the workers: 16 requests of 1 MiB,
#: and at most a sixteenth of the RAM tier, whose room pinned pages hold.
AHEAD_BYTES = 16 << 20
RAM_SHARE = 16
#: The most of the RAM tier that all windows together hold pinned. A window's pages stay pinned
#: until its handle's next request, however long its client keeps it open and idle, so without
#: this bound a few idle handles could hold the whole tier and leave no room for writes.
ALL_WINDOWS_RAM_SHARE = 8
_HEAD = struct.Struct("<BxxxI")  # the answer ends after the window (1) or the owner knows more (0); pages
_PAGE = struct.Struct("<QQQ")  # the page's start in the answer, its length, its place in shared memory
_COUNT = struct.Struct("<Q")


class Window:
    """A fetch handle's pinned pages, as the owner describes them: (start in the answer, length,
    offset in shared memory) in order, and whether the answer ends after the last."""

    def __init__(self, pages: list[tuple[int, int, int]], ends: bool) -> None:
        self.pages = pages
        self.ends = ends

    @classmethod
    def of(cls, pages: list[tuple[int, memoryview]], ends: bool, offset_of) -> Window:
        """The window of a fetch handle's pinned pages (``FetchHandle.window``): as many as a
        slot holds, up to the first whose bytes are not in shared memory (``offset_of``)."""
        placed = []
        for start, view in pages[:MAX_WINDOW_PAGES]:
            at = offset_of(view)
            if at is None:
                return cls(placed, False)
            placed.append((start, len(view), at))
        return cls(placed, ends and len(pages) <= MAX_WINDOW_PAGES)

    def encode(self) -> bytes:
        return _HEAD.pack(self.ends, len(self.pages)) + b"".join(_PAGE.pack(*page) for page in self.pages)

    @classmethod
    def decode(cls, payload: bytes) -> Window:
        ends, count = _HEAD.unpack_from(payload)
        return cls(list(_PAGE.iter_unpack(payload[_HEAD.size : _HEAD.size + count * _PAGE.size])), bool(ends))

    def answer(self, offset: int, size: int, shared: memoryview) -> list | None:
        """The read's bytes as views of ``shared`` (one for each run of pages that lie end to end
        there); None when the owner must answer it."""
        pages = self.pages
        if not pages or not pages[0][0] <= offset < pages[-1][0] + pages[-1][1]:
            return None
        index = bisect.bisect_right(pages, (offset, 1 << 64)) - 1
        runs, position, end = [], offset, offset + size  # (place in shared memory, length)
        for start, length, at in pages[index:]:
            if position >= end:
                break
            take = min(end, start + length) - position
            begin = at + position - start
            if begin + take > len(shared):
                return None  # not a place in the arena: the slot was misread
            if runs and runs[-1][0] + runs[-1][1] == begin:  # pages side by side: one piece
                runs[-1][1] += take
            else:
                runs.append([begin, take])
            position += take
        if position < end and not self.ends:
            return None
        return [shared[begin : begin + length] for begin, length in runs]


class FetchWindows:
    """The windows of every fetch handle, and the count of reads each worker answered alone. See
    the module docstring. Made by the owner before it forks its workers."""

    def __init__(self, workers: int, ram_bytes: int) -> None:
        self.slots = HandleSlots(_HEAD.size + MAX_WINDOW_PAGES * _PAGE.size)
        self._counts = mmap.mmap(-1, (workers + 1) * _COUNT.size)
        self.workers = workers
        self._pinned = HeldAhead(self.slots, min(AHEAD_BYTES, ram_bytes // RAM_SHARE),
                                 ram_bytes // ALL_WINDOWS_RAM_SHARE)

    # ---- the owner ------------------------------------------------------------------

    def ahead_for(self, fh: int) -> int:
        """How far ahead ``fh``'s next answer may pin pages: its share, within the room the other
        windows leave; nothing for a handle without a slot, whose window no worker could read."""
        return self._pinned.room_for(fh)

    def show(self, fh: int, window: Window) -> None:
        self._pinned.holds(fh, sum(length for _, length, _ in window.pages))
        self.slots.put(fh, window.encode() if window.pages else None)

    def hide(self, fh: int) -> bool:
        """Whether a worker answered a read from the window (the fetch file's answer began). The
        request the owner answers next unpins its pages or pins others (``show``)."""
        self._pinned.holds(fh, 0)
        return self.slots.clear(fh)

    def answered_alone(self) -> dict[int, int]:
        """Reads each worker (1..N) answered without the owner."""
        return {w: _COUNT.unpack_from(self._counts, w * _COUNT.size)[0] for w in range(1, self.workers + 1)}

    # ---- a worker -------------------------------------------------------------------

    def answer(self, fh: int, offset: int, size: int, shared: memoryview) -> list | None:
        """The read's bytes if ``fh``'s window holds them, else None (forward it)."""
        payload = self.slots.get(fh)
        pieces = None if payload is None else Window.decode(payload).answer(offset, size, shared)
        if pieces is not None:
            self.slots.mark(fh)
        return pieces

    def count(self, worker: int) -> None:
        at = worker * _COUNT.size
        _COUNT.pack_into(self._counts, at, _COUNT.unpack_from(self._counts, at)[0] + 1)
