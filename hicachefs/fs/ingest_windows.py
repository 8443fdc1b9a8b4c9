"""Writes of ``.hicachefs/ingest`` that a worker copies with one message to the owner instead of
two (``--workers``).

Why: a forwarded WRITE of the ingest file cost two round trips to the owner of the store:
``plan`` (where its bytes go) and ``filled`` (publish the pages it completed). Now the owner,
after answering a write of an ingest handle, reserves the drafts of the pages that follow, up
to ``AHEAD_BYTES`` (``IngestStream.reserve_ahead``), and writes the window down in the handle's
slot (``handle_slots``): where the stream stands and where each page's bytes go in the memory it
shares with the workers (or that the page is kept as it is). A worker whose WRITE continues the
stream inside the window copies the bytes there and checksums the pages it completes, then sends
``filled_at`` with what it copied where: the owner plans the write as ever, checks that the plan
is what the worker copied by, and publishes as ``filled`` does. Any other write goes by ``plan``
and ``filled``.

The owner clears the slot before it answers anything that changes the stream, and writes it
again after, so a window always says where the stream stands.
"""

from __future__ import annotations

import struct

from .handle_slots import HandleSlots, HeldAhead

#: How far past a write the owner reserves drafts for the workers: 8 requests of 1 MiB, and at
#: most a thirty-second of the RAM tier (reserved room is taken from published pages).
AHEAD_BYTES = 8 << 20
RAM_SHARE = 32
#: The most of the RAM tier that the drafts reserved ahead of all ingest handles take together: a
#: batch that stops halfway keeps its drafts until its handle closes or takes a new batch.
ALL_WINDOWS_RAM_SHARE = 8
#: The most pages reserved ahead for one handle (8 MiB of SGLang's 128 KiB pages).
MAX_AHEAD_PAGES = 64
_HEAD = struct.Struct("<QI4x")  # where the stream stands; pages
_PAGE = struct.Struct("<QQq")  # the page's start in the stream, its size, its draft's place (-1: kept)
_KEPT = -1


class IngestWindow:
    """Where an ingest stream stands, and the pages from there on that have their drafts: (start
    in the stream, size, the draft's place in shared memory, or None for a page kept as it is)."""

    def __init__(self, position: int, pages: list[tuple[int, int, int | None]]) -> None:
        self.position = position
        self.pages = pages

    def encode(self) -> bytes:
        return _HEAD.pack(self.position, len(self.pages)) + b"".join(
            _PAGE.pack(start, size, _KEPT if at is None else at) for start, size, at in self.pages)

    @classmethod
    def decode(cls, payload: bytes) -> IngestWindow:
        position, count = _HEAD.unpack_from(payload)
        pages = [(start, size, None if at == _KEPT else at)
                 for start, size, at in _PAGE.iter_unpack(payload[_HEAD.size : _HEAD.size + count * _PAGE.size])]
        return cls(position, pages)

    def plan(self, offset: int, size: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]] | None:
        """For a write of ``size`` bytes at ``offset``: what to copy where (position in the write,
        length, place in shared memory) and which pages to checksum then (place, size), as
        ``IngestStream.plan`` would say; None unless the write continues the stream within the
        window."""
        pages = self.pages
        end = offset + size
        if offset != self.position or not pages or end > pages[-1][0] + pages[-1][1]:
            return None
        copies, checksummed = [], []
        for start, length, at in pages:
            low, high = max(start, offset), min(start + length, end)
            if high <= low:
                if start >= end:
                    break
                continue
            if at is not None:
                copies.append((low - offset, high - low, at + low - start))
                if high == start + length:
                    checksummed.append((at, length))
        return copies, checksummed


class IngestWindows:
    """The windows of every ingest handle. See the module docstring. Made by the owner before
    it forks its workers."""

    def __init__(self, ram_bytes: int) -> None:
        self.slots = HandleSlots(_HEAD.size + (MAX_AHEAD_PAGES + 1) * _PAGE.size)
        self._reserved = HeldAhead(self.slots, min(AHEAD_BYTES, ram_bytes // RAM_SHARE),
                                   ram_bytes // ALL_WINDOWS_RAM_SHARE)

    def ahead_for(self, fh: int) -> int:
        """How far ahead of ``fh``'s stream the owner may reserve drafts now: its share, within
        the room the other handles' reserved drafts leave."""
        return self._reserved.room_for(fh)

    def show(self, fh: int, window: IngestWindow) -> None:
        """The owner, after a write of ``fh``."""
        self._reserved.holds(fh, sum(size for _, size, at in window.pages if at is not None))
        self.slots.put(fh, window.encode() if window.pages else None)

    def hide(self, fh: int) -> None:
        """The owner, before anything that changes ``fh``'s stream (its drafts stay reserved)."""
        self.slots.clear(fh)

    def closed(self, fh: int) -> None:
        """The owner, as ``fh`` closes: it gives its drafts back."""
        self._reserved.holds(fh, 0)
        self.slots.clear(fh)

    def plan(self, fh: int, offset: int, size: int):
        """A worker: ``IngestWindow.plan`` of ``fh``'s window, or None."""
        payload = self.slots.get(fh)
        return None if payload is None else IngestWindow.decode(payload).plan(offset, size)
