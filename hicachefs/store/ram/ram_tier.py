"""The RAM tier: the arena, its eviction order, and pins that keep slots alive for readers.

A location here is a slot's offset in the arena. Pages are written in place (a Draft is a
view of its slot) and read without a copy (``view``), so beside the Tier methods this tier
hands out slots and views, and keeps the order in which its pages should leave; it is the top
of every chain. The engine tells it what happens to its pages (``admit``, ``hit``, ``release``)
and it counts those itself.

A slot leaves the tier in two steps: ``drop``/``retire`` (the page is no longer reachable by
name) and the actual free, which waits for the last reader's ``unpin``. So a reader keeps the
old bytes of a page that was deleted, replaced or evicted meanwhile, and its slot can never be
handed to another page while it reads.

A used slot is held (its page may not be evicted) unless it holds an admitted page that no
reader pins; the arena counts held slots per slab (``Arena.hold``), which tells the engine
whether evicting can free a slot at all without a walk of the pages.

Not thread-safe: the store's lock guards every call. Nothing here blocks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from hicachefs.store.ram.arena import Arena, size_class
from hicachefs.store.errors import StoreError, StoreFull
from hicachefs.store.ram.eviction import LruPolicy
from hicachefs.store.statistics import TierCounters
from hicachefs.store.pages import PageMeta
from hicachefs.store.tier import ReadResult, RecoveryListener, RecoveryProgress, TopTier


#: A start that fills the RAM tier within this says nothing of it (a small --memory).
QUIET_FILL_S = 1.0


class RamTier(TopTier):
    name = "memory"

    def __init__(self, capacity: int, slab_bytes: int, policy: LruPolicy | None = None) -> None:
        self.arena = Arena(capacity, slab_bytes)
        self.policy = policy or LruPolicy()
        self.counters = TierCounters()
        self._pins: dict[int, int] = {}  # slot offset -> readers
        self._retired: set[int] = set()  # pinned slots whose page is gone; freed at last unpin
        self._pages: set[int] = set()  # slots of admitted pages (evictable unless pinned)

    @property
    def capacity_bytes(self) -> int:
        return self.arena.capacity

    @property
    def used_bytes(self) -> int:
        return self.arena.used_bytes

    @property
    def free_bytes(self) -> int:
        return self.arena.free_bytes

    def allocated(self, name_length: int, size: int) -> int:
        return size_class(size)

    def fits(self, name: bytes, size: int) -> bool:
        return self.arena.fits(size)

    def shared_fd(self) -> int | None:
        return self.arena.fd

    def byte_offset(self, location, name_length):
        return location  # a slot's offset is its page's first byte

    def fill(self, progress: RecoveryListener | None = None) -> None:
        """``TopTier.fill``; a fill done within ``QUIET_FILL_S`` tells ``progress`` nothing."""
        total, started = self.arena.capacity, time.monotonic()
        told = False

        def filled(done: int) -> None:
            nonlocal told
            seconds = time.monotonic() - started
            if progress is None or (not told and seconds < QUIET_FILL_S):
                return
            if not told:
                progress(RecoveryProgress("fill", "", 0, 0, total, seconds, False))
                told = True
            progress(RecoveryProgress("fill", "", 0, done, total, seconds, done == total))

        try:
            self.arena.fill(filled)
        except OSError as exc:
            raise StoreError(f"cannot fill the RAM tier's {total:,} bytes of memory: {exc.strerror}") from exc

    def allocate(self, size: int) -> int | None:
        return self.arena.allocate(size)

    def serves(self, slot: int, size: int) -> bool:
        return self.arena.serves(slot, size)

    def frees_room(self, size: int) -> bool:
        """Whether evicting every page no reader pins would free a slot for ``size`` bytes."""
        return self.arena.frees_room(size)

    def slab_if_free_to_empty(self, slot: int) -> tuple[int, int, int] | None:
        return self.arena.slab_if_free_to_empty(slot)

    def view(self, offset: int, size: int) -> memoryview:
        return self.arena.view[offset : offset + size]

    def merged(self, pieces: list) -> list:
        return self.arena.merged(pieces) if len(pieces) > 1 else pieces

    def write(self, page: PageMeta, payload) -> int:
        slot = self.arena.allocate(page.size)
        if slot is None:
            raise StoreFull(f"no free RAM slot for {page.size} bytes")
        try:
            self.view(slot, page.size)[:] = payload
        except BaseException:
            self.arena.free(slot)  # the copy failed: no page holds the slot
            raise
        self.counters.bytes_in += page.size
        return slot

    def read_into(self, page: PageMeta, location: int, out: memoryview, counted: bool = True) -> ReadResult:
        out[:] = self.view(location, page.size)
        self.counters.bytes_out += page.size * counted
        return ReadResult.OK

    def drop(self, page: PageMeta, location: int) -> None:
        self.retire(location)

    # -- what happens to its pages (the engine tells; the tier counts) -----------------------

    def admit(self, row: int, slot: int, size: int, promoted: bool = False) -> None:
        self.policy.admit(row)
        self._pages.add(slot)
        if slot not in self._pins:
            self.arena.let_go(slot)
        self.counters.bytes_in += size
        if promoted:
            self.counters.promotions += 1

    def hit(self, row: int, size: int) -> None:
        self.policy.touch(row)
        self.counters.hits += 1
        self.counters.bytes_out += size

    def release(self, row: int, slot: int, demoted: bool) -> None:
        self._leave(row, slot)
        if demoted:
            self.counters.demotions += 1
        else:
            self.counters.evictions += 1

    def forget(self, row: int, slot: int) -> None:
        self._leave(row, slot)

    def _leave(self, row: int, slot: int) -> None:
        """The admitted page leaves: its slot is held (no longer evictable) until it is freed."""
        self.policy.forget(row)
        self._pages.discard(slot)
        if slot not in self._pins:
            self.arena.hold(slot)
        self.retire(slot)

    def victims(self) -> Iterator[int]:
        return self.policy.in_order()

    def oldest_first(self) -> list[int]:
        return list(self.policy.oldest_first())

    # -- slots held by readers ----------------------------------------------------------------

    def pin(self, offset: int) -> None:
        readers = self._pins.get(offset, 0)
        if not readers and offset in self._pages:
            self.arena.hold(offset)
        self._pins[offset] = readers + 1

    def unpin(self, offset: int) -> None:
        left = self._pins[offset] - 1
        if left:
            self._pins[offset] = left
            return
        del self._pins[offset]
        if offset in self._retired:
            self._retired.discard(offset)
            self.arena.free(offset)
        elif offset in self._pages:
            self.arena.let_go(offset)

    def is_pinned(self, offset: int) -> bool:
        return offset in self._pins

    def retire(self, offset: int) -> None:
        if offset in self._pins:
            self._retired.add(offset)
        else:
            self.arena.free(offset)

    def close(self) -> None:
        self.arena.close()
