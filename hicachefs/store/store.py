"""PageStore: the facade the daemon calls. Pages are immutable bytes under '/'-separated names.

New pages are written into a RAM slot (``reserve`` -> ``Draft.write`` -> ``publish``); when
the RAM tier is full its least recently used pages move down to the SSD tier (or are
dropped without one); reading a disk page promotes it to RAM when room can be made.

Thread-safe: one lock guards the index and both tiers. It is not held while checksumming a
page at publish, nor while reading and checking a disk page in ``open`` (the slow path the
daemon runs in a worker thread). It is held while writing to the SSD tier (demotion,
write-through): those are buffered pwrites into the page cache, memory-speed, and keeping
them under the lock keeps the ring's append order and the index in step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import xxhash

from hicachefs.store.arena import size_class
from hicachefs.store.config import StoreConfig
from hicachefs.store.errors import PageCorrupt, PageNotFound, PageTooLarge, StoreError, StoreFull
from hicachefs.store.eviction import LruPolicy
from hicachefs.store.index import PageIndex
from hicachefs.store.ram_tier import RamTier
from hicachefs.store.region_log import ReadResult
from hicachefs.store.ssd_tier import SsdTier
from hicachefs.store.stats import TierCounters

_MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class PageInfo:
    name: str
    size: int
    tier: str  # 'memory' or 'disk'
    checksum: str  # 'xxh3_64:<16 hex>'
    hits: int
    mtime_ns: int
    atime_ns: int


class Draft:
    """A reserved RAM slot of exactly ``size`` bytes; write the page into ``buffer``, then
    publish or abandon it (once). Only its creator touches it."""

    __slots__ = ("size", "buffer", "_offset", "_live", "_hasher", "_hashed")

    def __init__(self, offset: int | None, size: int, buffer: memoryview) -> None:
        self.size = size
        self.buffer = buffer
        self._offset = offset  # RAM arena offset; None for a page too large for a RAM slot
        self._live = True
        self._hasher = xxhash.xxh3_64()
        self._hashed = 0  # bytes fed to the hasher, in order from the start

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

    def _checksum(self) -> int:
        if self._hasher is not None and self._hashed == self.size:
            return self._hasher.intdigest()
        return xxhash.xxh3_64_intdigest(self.view())

    def _consume(self) -> int | None:
        if not self._live:
            raise StoreError("draft already published or abandoned")
        self._live = False
        return self._offset


class PageReader:
    """An open page: reads return views of bytes pinned until ``close`` (no copy for RAM pages).
    Safe to read from several threads; close once."""

    __slots__ = ("info", "size", "_view", "_store", "_slot")

    def __init__(self, store: PageStore, info: PageInfo, view: memoryview, slot: int | None) -> None:
        self.info = info
        self.size = info.size
        self._view = view
        self._store = store
        self._slot = slot

    def read(self, offset: int, size: int) -> memoryview | bytes:
        if offset >= self.size or size <= 0:
            return b""
        return self._view[offset : min(offset + size, self.size)]

    def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            if self._slot is not None:
                store._unpin(self._slot)

    def __enter__(self) -> PageReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _checksum_text(value: int) -> str:
    return f"xxh3_64:{value:016x}"


class PageStore:
    """The tiered page store; see the module docstring for its locking."""

    def __init__(self, config: StoreConfig, progress: Callable[[int, int], None] | None = None) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._index = PageIndex()
        # Slabs as large as the largest page, but at least 8 of them, so that a small RAM tier
        # does not hold a single size class at a time; larger pages bypass RAM (see reserve).
        slab = min(config.memory_bytes, max(_MiB, min(size_class(config.max_page_size), config.memory_bytes // 8)))
        self._ram = RamTier(config.memory_bytes, slab, LruPolicy())
        self._ssd: SsdTier | None = None
        self._misses = 0
        if config.disk_dir is not None:
            self._ssd = SsdTier(config.disk_dir, config.disk_bytes, config.max_page_size)
            self._recover(progress)

    def _recover(self, progress: Callable[[int, int], None] | None) -> None:
        ssd, index = self._ssd, self._index

        def corrupt() -> None:
            ssd.counters.checksum_failures += 1

        for record in ssd.log.scan(corrupt, progress):
            older = index.find(record.name)
            if older >= 0:  # the process died between writing a newer copy and invalidating this one
                self._drop(older)
            index.add(record.name, record.size, record.checksum, record.mtime_ns, -1, record.offset)

    # -- writing -----------------------------------------------------------------------

    def reserve(self, size: int) -> Draft:
        """Room for a page of exactly ``size`` bytes, made by demoting or evicting LRU pages.
        A page larger than a RAM slab (memory_bytes / 8, at most the max page size) is staged
        in private memory and published to the disk tier only."""
        if size > self.config.max_page_size:
            raise PageTooLarge(f"page of {size} bytes exceeds max_page_size {self.config.max_page_size}")
        if size_class(size) > self._ram.arena.max_slot:
            # Larger than a RAM slab: the page is staged in private memory and goes to disk only.
            if self._ssd is None or not self._ssd.fits_any_name(size):
                raise StoreFull(f"page of {size} bytes does not fit the RAM tier's {self._ram.arena.max_slot}-byte slabs")
            return Draft(None, size, memoryview(bytearray(size)))
        with self._lock:
            offset = self._make_room(size)
        return Draft(offset, size, self._ram.view(offset, size))

    def publish(self, draft: Draft, name: str, mtime_ns: int | None = None) -> PageInfo:
        """Checksum the draft and make it visible under ``name``, replacing any page of that
        name atomically; with write_through it is on the SSD tier when this returns."""
        checksum = draft._checksum()
        offset = draft._consume()
        mtime_ns = time.time_ns() if mtime_ns is None else mtime_ns
        with self._lock:
            disk = -1
            encoded = name.encode()
            if (offset is None or self.config.write_through) and self._ssd.fits(encoded, draft.size):
                # The new record goes down before the old one is invalidated, so that a kill in
                # between leaves one of the two versions (the scan keeps the newer), never none.
                disk = self._ssd.write(encoded, draft.buffer, checksum, mtime_ns, self._reclaim)
            if offset is None and disk < 0:
                raise StoreFull(f"page name {name!r} is too long for the disk tier's regions")
            old = self._index.find(name)
            if old >= 0:
                self._drop(old)
            row = self._index.add(name, draft.size, checksum, mtime_ns, -1 if offset is None else offset, disk)
            if offset is not None:
                self._ram.policy.admit(row)
                self._ram.counters.bytes_in += draft.size
            return self._info(row)

    def abandon(self, draft: Draft) -> None:
        offset = draft._consume()
        if offset is not None:
            with self._lock:
                self._ram.retire(offset)

    def put(self, name: str, data) -> PageInfo:
        source = memoryview(data).cast("B")
        draft = self.reserve(source.nbytes)
        try:
            draft.write(0, source)
        except BaseException:
            self.abandon(draft)
            raise
        return self.publish(draft, name)

    # -- reading -----------------------------------------------------------------------

    def open(self, name: str, *, memory_only: bool = False) -> PageReader | None:
        """Pin the page for reading. A disk page is read and verified here (blocking I/O) and
        promoted to RAM when room can be made. Raises PageNotFound or PageCorrupt.

        With ``memory_only`` a page that would need disk I/O is not read: None is returned, so
        an event loop can serve RAM pages inline and send only disk reads to a thread."""
        for _ in range(3):  # a disk read can race with a replace or reclaim; then look again
            with self._lock:
                row = self._index.find(name)
                if row < 0:
                    self._misses += 1
                    self._ram.counters.misses += 1
                    if self._ssd is not None:
                        self._ssd.counters.misses += 1
                    raise PageNotFound(name)
                index = self._index
                index.atime[row] = time.time_ns()
                size = int(index.size[row])
                slot = int(index.ram[row])
                if slot >= 0:
                    index.hits[row] += 1
                    self._ram.counters.hits += 1
                    self._ram.counters.bytes_out += size
                    self._ram.policy.touch(row)
                    self._ram.pin(slot)
                    return PageReader(self, self._info(row), self._ram.view(slot, size), slot)
                if memory_only:
                    return None
                self._ram.counters.misses += 1
                info = self._info(row)
                offset, checksum = int(index.disk[row]), int(index.checksum[row])
                # Promote on the second read only: a page read once from disk is often never
                # read again, and promoting it would push another page down (a disk write).
                slot = self._slot_for_promotion(size) if index.hits[row] > 0 else None
            buffer = self._ram.view(slot, size) if slot is not None else memoryview(bytearray(size))
            result = self._ssd.log.read_into(offset, name.encode(), checksum, buffer)
            with self._lock:
                row = self._index.find(name)
                unchanged = row >= 0 and self._index.disk[row] == offset and self._index.checksum[row] == checksum
                if result is ReadResult.OK:
                    self._ssd.counters.hits += 1
                    self._ssd.counters.bytes_out += size
                    if unchanged:
                        self._index.hits[row] += 1
                        info = self._info(row)
                    if slot is not None:
                        if unchanged and self._index.ram[row] < 0:
                            self._index.ram[row] = slot
                            self._ram.policy.admit(row)
                            self._ram.counters.promotions += 1
                            self._ram.counters.bytes_in += size
                        else:  # a private copy for this reader only
                            self._ram.retire(slot)
                    return PageReader(self, info, buffer, slot)
                if slot is not None:
                    self._ram.retire(slot)
                    self._ram.unpin(slot)
                if unchanged:  # the record is where the index says, and it is bad
                    self._ssd.counters.checksum_failures += 1
                    self._drop(row)
                    raise PageCorrupt(f"{name}: checksum mismatch on the disk tier; page dropped")
        raise PageNotFound(name)

    def _slot_for_promotion(self, size: int) -> int | None:
        """A pinned RAM slot to read a disk page into, or None to read into private memory."""
        if size_class(size) > self._ram.arena.max_slot:
            return None
        try:
            slot = self._make_room(size)
        except StoreFull:
            return None
        self._ram.pin(slot)
        return slot

    def _unpin(self, slot: int) -> None:
        with self._lock:
            self._ram.unpin(slot)

    # -- names -------------------------------------------------------------------------

    def info(self, name: str) -> PageInfo | None:
        """The page's facts, or None; no I/O, no hit counted."""
        with self._lock:
            row = self._index.find(name)
            return self._info(row) if row >= 0 else None

    def delete(self, name: str) -> bool:
        """Remove the page (its disk record is invalidated in place); open readers keep it."""
        with self._lock:
            row = self._index.find(name)
            if row < 0:
                return False
            self._drop(row)
            return True

    def delete_tree(self, prefix: str) -> int:
        with self._lock:
            rows = self._index.rows_under(prefix)
            for row in rows.tolist():
                self._drop(row)
            return len(rows)

    def list_dir(self, dir_path: str) -> list[PageInfo]:
        with self._lock:
            return [self._info(row) for row in self._index.rows_in_dir(dir_path).tolist()]

    def directories(self) -> list[str]:
        with self._lock:
            return self._index.directories()

    def exists_many(self, names: Iterable[str]) -> list[bool]:
        prepared = PageIndex.prepare_many(names)
        with self._lock:
            return self._index.find_many(prepared).tolist()

    # -- accounting and shutdown -------------------------------------------------------

    def statistics(self) -> dict:
        """The totals at the top level, and ``tiers``: {'memory': ..., 'disk': ...} (disk only
        when configured). A tier: capacity_bytes, used_bytes (slot / record bytes), pages, and
        TierCounters. A page may be on both tiers; the total ``pages`` counts it once, the total
        ``misses`` counts names not found at all."""
        with self._lock:
            live = self._index.live_rows()
            ram_pages = int(np.count_nonzero(self._index.ram[live] >= 0))
            tiers = {"memory": self._tier_stats(self._ram.capacity, self._ram.used_bytes, ram_pages, self._ram.counters)}
            ssd = self._ssd
            if ssd is not None:
                disk_pages = int(np.count_nonzero(self._index.disk[live] >= 0))
                tiers["disk"] = self._tier_stats(ssd.capacity, ssd.used_bytes, disk_pages, ssd.counters)
            totals = {key: sum(t[key] for t in tiers.values()) for key in tiers["memory"]}
            totals["pages"] = len(live)
            totals["misses"] = self._misses  # a lookup that no tier could serve
            totals["free_bytes"] = totals["capacity_bytes"] - totals["used_bytes"]
            return {**totals, "tiers": tiers}

    @staticmethod
    def _tier_stats(capacity: int, used: int, pages: int, counters: TierCounters) -> dict:
        return {"capacity_bytes": capacity, "used_bytes": used, "pages": pages, **counters.as_dict()}

    def close(self) -> None:
        """Write RAM-only pages down (the most recent ones, as room allows), fsync, release."""
        with self._lock:
            if self._ssd is not None:
                budget = self._ssd.capacity - self._ssd.log.region_bytes
                rows = [r for r in self._ram.policy.oldest_first() if self._index.disk[r] < 0]
                keep = []
                for row in reversed(rows):
                    budget -= int(self._index.size[row]) + 4096
                    if budget < 0:
                        break
                    keep.append(row)
                for row in reversed(keep):
                    if self._index.disk[row] < 0:  # a reclaim may not have touched it; a write may have
                        self._write_down(row, self._index.name(row).encode())
                self._ssd.close()
            self._ram.close()

    # -- internals (lock held) ---------------------------------------------------------

    def _info(self, row: int) -> PageInfo:
        index = self._index
        return PageInfo(
            name=index.name(row),
            size=int(index.size[row]),
            tier="memory" if index.ram[row] >= 0 else "disk",
            checksum=_checksum_text(int(index.checksum[row])),
            hits=int(index.hits[row]),
            mtime_ns=int(index.mtime[row]),
            atime_ns=int(index.atime[row]),
        )

    def _make_room(self, size: int) -> int:
        """A RAM slot for ``size`` bytes, evicting least recently used pages until one frees.
        Evicting in strict LRU order may take out a few pages of other sizes first, as they
        are older; that is the order a user expects."""
        while True:
            offset = self._ram.allocate(size)
            if offset is not None:
                return offset
            row = self._ram.policy.victim()
            if row is None:
                raise StoreFull(f"no room for a page of {size} bytes: the RAM tier is pinned by readers and drafts")
            self._evict_from_ram(row)

    def _evict_from_ram(self, row: int) -> None:
        index = self._index
        self._ram.policy.forget(row)
        if index.disk[row] < 0 and self._ssd is not None:
            self._write_down(row, index.name(row).encode())
        slot = int(index.ram[row])
        index.ram[row] = -1
        self._ram.retire(slot)
        if index.disk[row] >= 0:
            self._ram.counters.demotions += 1
        else:
            self._ram.counters.evictions += 1
            index.remove(row)

    def _write_down(self, row: int, name: bytes) -> None:
        """Copy a RAM page to the SSD tier, if it fits a region."""
        index = self._index
        size = int(index.size[row])
        if self._ssd is None or not self._ssd.fits(name, size):
            return
        slot = int(index.ram[row])
        index.disk[row] = self._ssd.write(
            name, self._ram.view(slot, size), int(index.checksum[row]), int(index.mtime[row]), self._reclaim
        )

    def _reclaim(self, start: int, end: int) -> None:
        """The SSD tier is about to overwrite [start, end): forget what lives only there."""
        index = self._index
        for row in index.rows_on_disk_between(start, end).tolist():
            index.disk[row] = -1
            if index.ram[row] < 0:
                self._ssd.counters.evictions += 1
                index.remove(row)

    def _drop(self, row: int) -> None:
        """Remove a page from the store: by name now, its RAM slot when its readers are done."""
        index = self._index
        slot = int(index.ram[row])
        if slot >= 0:
            self._ram.policy.forget(row)
            self._ram.retire(slot)
        if index.disk[row] >= 0:
            self._ssd.invalidate(int(index.disk[row]), index.name(row).encode(), int(index.size[row]))
        index.remove(row)
