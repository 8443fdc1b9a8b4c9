"""What the store hands out: facts about a page, a page being written, an open page, and the
answer that says a request needs blocking I/O."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple

import xxhash

from hicachefs.store.errors import StoreError



@dataclass(frozen=True, slots=True)
class PageInfo:
    name: str
    size: int
    tier: str  # the fastest tier holding it: 'memory', 'disk' or 'shared'
    checksum: str  # 'xxh3_64:<16 hex>'
    hits: int
    mtime_ns: int
    atime_ns: int
    #: Whether this store holds a copy of its own; a page only a tier other hosts write holds
    #: may be replaced or removed there at any time, without a call here.
    held_here: bool = True

    @property
    def version(self) -> tuple[str, int]:
        """What tells this version of the page from another one published under its name."""
        return self.checksum, self.mtime_ns


def page_checksum(data) -> int:
    """The checksum a page is stored with (``checksum_text`` writes it out)."""
    return xxhash.xxh3_64_intdigest(data)


def checksum_text(value: int) -> str:
    return f"xxh3_64:{value:016x}"


class PageMeta(NamedTuple):
    """What identifies one version of a page: its name, size, xxh3_64 checksum, publish time."""

    name: str
    size: int
    checksum: int
    mtime_ns: int

    @property
    def version(self) -> tuple[str, int]:
        """``PageInfo.version`` of this page."""
        return checksum_text(self.checksum), self.mtime_ns


class NeedsIO:
    """What a non-blocking call answers when only blocking I/O can finish it (a read from the
    disk tier, the shared tier's filesystem): run ``work()`` in a worker thread, then hand its
    result to ``finish`` on the caller's own thread, which gives the call's answer (or another
    ``NeedsIO``). The layer that knows what blocks says so; its callers only follow. ``then``
    adds a step of the caller's own to run on its thread after the work."""

    __slots__ = ("work", "steps")

    def __init__(self, work: Callable[[], object], steps: tuple[Callable[[object], object], ...] = ()) -> None:
        self.work = work
        self.steps = steps

    def then(self, step: Callable[[object], object]) -> NeedsIO:
        return NeedsIO(self.work, self.steps + (step,))

    def finish(self, value: object) -> object:
        for i, step in enumerate(self.steps):
            value = step(value)
            if isinstance(value, NeedsIO):  # more I/O first: the steps left follow it
                for rest in self.steps[i + 1 :]:
                    value = value.then(rest)
                return value
        return value


class Draft:
    """A reserved RAM slot of exactly ``size`` bytes; write the page into ``buffer``, then
    publish or abandon it (once). Only its creator touches it."""

    __slots__ = ("size", "buffer", "_offset", "_live", "_hasher", "_hashed", "_given")

    def __init__(self, offset: int | None, size: int, buffer: memoryview) -> None:
        self.size = size
        self.buffer = buffer
        self._offset = offset  # RAM arena offset; None for a page too large for a RAM slot
        self._live = True
        self._hasher = xxhash.xxh3_64()
        self._hashed = 0  # bytes fed to the hasher, in order from the start
        self._given: int | None = None  # the checksum the process that filled it took

    def write(self, offset: int, data) -> None:
        """Copy ``data`` into the page at ``offset``. Writes in order from the start are
        checksummed as they arrive, while the bytes are still in the CPU cache, which saves
        publish a second pass over the page."""
        if self._hasher is not None and offset != self._hashed:
            self._zero_unwritten()
        end = offset + len(data)
        self.buffer[offset:end] = data
        if self._hasher is not None:
            self._hasher.update(data)
            self._hashed = end

    @property
    def shared_at(self) -> int | None:
        """Where its bytes lie in the memory the store shares with the data plane's clients (its
        RAM slot's offset in the arena they write into too); None for private memory."""
        return self._offset

    def mark_filled(self, checksum: int | None = None) -> None:
        """Another process wrote (some of) the page's bytes straight into that shared memory,
        in order. ``checksum``: it wrote the last of them and checksummed the whole page there,
        saving publish the pass; without it the page is checksummed at publish."""
        self._hasher = None
        self._given = checksum

    def view(self) -> memoryview:
        """The page's bytes as written so far; bytes never written read as zeros."""
        if self._hasher is not None and self._hashed < self.size:
            self._zero_unwritten()
        return self.buffer

    def _zero_unwritten(self) -> None:
        """Leave in-order mode: the slot still holds an earlier page's bytes past what was
        written, and those must never be seen, so they become zeros."""
        self.buffer[self._hashed :] = bytes(self.size - self._hashed)
        self._hasher = None

    def checksum(self) -> int:
        if self._given is not None:
            return self._given
        if self._hasher is not None and self._hashed == self.size:
            return self._hasher.intdigest()
        return page_checksum(self.view())

    def consume(self) -> int | None:
        """End the draft (the store takes its slot over or frees it); returns the slot."""
        if not self._live:
            raise StoreError("draft already published or abandoned")
        self._live = False
        return self._offset


def release_private() -> None:
    """The release of private memory (a reader's copy, a staging buffer): nothing to do, it goes
    with its last reference."""


class PageReader:
    """An open page: reads return views of bytes pinned until ``close`` (no copy for RAM pages).
    Safe to read from several threads; close once (later closes do nothing)."""

    __slots__ = ("info", "meta", "size", "in_ram", "_view", "_release")

    def __init__(self, info: PageInfo, meta: PageMeta, view: memoryview,
                 release: Callable[[], None] | None, in_ram: bool = False) -> None:
        """``release``: what lets go of the bytes (None: a private copy, which goes with its last
        reference); ``in_ram``: the reader was served from the RAM tier (a read is a memory copy)."""
        self.info = info
        self.in_ram = in_ram
        self.meta = meta
        self.size = info.size
        self._view = view
        self._release = release_private if release is None else release  # None once closed

    def read(self, offset: int, size: int) -> memoryview | bytes:
        if offset >= self.size or size <= 0:
            return b""
        return self._view[offset : min(offset + size, self.size)]

    def view(self) -> memoryview:
        """The whole page (valid until ``close``)."""
        return self._view[: self.size]

    def duplicate(self) -> PageReader:
        """Another reader of the same bytes; they stay pinned until both are closed."""
        release = self._release
        if release is None:
            raise ValueError("the reader is closed")
        lock, left = threading.Lock(), [2]

        def one() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                release()

        self._release = one
        return PageReader(self.info, self.meta, self._view, one, self.in_ram)

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> PageReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
