"""PageStore: the facade the daemon calls, and the engine that moves pages between tiers.

Pages are immutable bytes under '/'-separated names. New pages are written into a RAM slot
(``reserve`` -> ``Draft.write`` -> ``publish``); when the RAM tier is full its least recently
used pages move down to the next tier that takes them (or leave the store without one);
reading a lower tier's page promotes it to RAM on its second read. The engine sees the tiers
only through the ``Tier`` interface plus the RAM tier's slots and LRU; the index records, per
page, its location in each tier.

Every operation either completes or leaves the store as it was: resources are taken, the I/O
done, then the index committed, and a failing device (``OSError`` from a tier) gives the
resources back. Such failures are counted by the tier and surface as ``DeviceError``; when a
page cannot be written down while RAM makes room, it is evicted instead (it is a cache), so
the RAM tier keeps serving while a disk fails.

Behind the local tiers an optional shared tier (a directory on a distributed filesystem that
other hosts' daemons use too) is addressed by name, not indexed: every page published here is
offered to it (write-behind), and a name missing locally is looked for there, read, checked and
promoted into RAM. Asking it whether it holds a page costs no I/O; finding and reading one
blocks up to its deadline, so callers on an event loop run those in a worker thread. A page the
exists query finds only there is fetched at once in the background (``FetchAhead``: SGLang
reads what the query found right after asking), so the read that follows finds it in RAM.

Pages that leave the store on its own initiative (eviction from their last tier, reclaim,
a failed checksum) are reported to ``on_gone`` listeners, so the daemon can tell the kernel.

Thread-safe: one lock guards the index and the tiers. It is not held while checksumming a page
at publish, nor while reading and checking a lower tier's page in ``open`` (the slow path the
daemon runs in a worker thread). It is held while writing to the SSD tier (demotion,
write-through): buffered pwrites into the page cache, memory-speed, and keeping them under the
lock keeps the ring's append order and the index in step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np

from hicachefs.store.arena import size_class
from hicachefs.store.config import StoreConfig
from hicachefs.store.errors import DeviceError, PageCorrupt, PageNotFound, PageTooLarge, StoreFull
from hicachefs.store.eviction import LruPolicy
from hicachefs.store.fetch_ahead import FetchAhead
from hicachefs.store.index import PageIndex
from hicachefs.store.pages import Draft, PageInfo, PageReader, checksum_text
from hicachefs.store.ram_tier import RamTier
from hicachefs.store.shared import SharedTier
from hicachefs.store.ssd_tier import RecoveryListener, SsdTier
from hicachefs.store.tier import PageMeta, ReadResult, Tier

log = logging.getLogger(__name__)

_MiB = 1 << 20
RAM = 0  # the RAM tier's position in the tier list and the index's location columns
_LONGEST_NAME = bytes(4096)  # longer than any valid page name (five components of 200 bytes)
#: Pages found on the shared tier whose facts are kept for ``info`` (a lookup is followed by
#: getattr, getxattr and open of the same name).
_FOUND_KEPT = 4096
#: Write-behind to the shared tier absorbs bursts of publishes up to this many seconds of writes
#: at the filesystem's pace (and a quarter of the RAM tier, which the queued pages keep pinned,
#: at most 1 GiB); beyond, pages are dropped and counted, never waited for.
WRITE_BEHIND_LAG_S = 4.0

#: Up to this many names, the exists query looks them up one by one (8 names: 12 us instead of
#: 39 us through the vectorised lookup, whose numpy set-up dominates small batches).
_FEW_NAMES = 16

GoneListener = Callable[[list[str]], None]


class PageStore:
    """The tiered page store; see the module docstring."""

    def __init__(self, config: StoreConfig, progress: RecoveryListener | None = None,
                 *, disk_device=None, shared_device=None) -> None:
        """``progress``: told how rebuilding the SSD tier's index goes (``RecoveryProgress``).
        ``disk_device``/``shared_device``: the SSD and shared tiers' devices (tests pass
        FaultyDevices); by default the arena file in ``config.disk_dir`` and the plain files
        of ``config.shared_dir``."""
        self.config = config
        self._lock = threading.Lock()
        # Slabs as large as the largest page, but at least 8 of them, so that a small RAM tier
        # does not hold a single size class at a time; larger pages bypass RAM (see reserve).
        slab = min(config.memory_bytes, max(_MiB, min(size_class(config.max_page_size), config.memory_bytes // 8)))
        self._ram = RamTier(config.memory_bytes, slab, LruPolicy())
        self._tiers: list[Tier] = [self._ram]
        self._index = PageIndex(tiers=1 + (config.disk_dir is not None))
        self._listeners: list[GoneListener] = []
        self._gone: list[str] = []
        self._misses = 0
        self._published = 0
        self._closed = False
        if config.disk_dir is not None:
            position = len(self._tiers)
            ssd = SsdTier(config.disk_dir, config.disk_bytes, config.max_page_size,
                          on_reclaim=lambda start, end: self._reclaimed(position, start, end),
                          device=disk_device)
            self._tiers.append(ssd)
            ssd.recover(self._index, position, progress)  # from its snapshot after a clean close, else by a scan
        self._shared: SharedTier | None = None
        self._found: OrderedDict[str, PageMeta] = OrderedDict()
        self._ahead = FetchAhead(self._fetch)  # idle (no threads) without a shared tier
        if config.shared_dir is not None:
            queue_bytes = max(config.max_page_size, min(1 << 30, config.memory_bytes // 4))
            self._shared = SharedTier(config.shared_dir, config.shared_bytes, device=shared_device,
                                      queue_bytes=queue_bytes, queue_pages=4096, queue_lag_s=WRITE_BEHIND_LAG_S)

    def on_gone(self, listener: GoneListener) -> None:
        """Call ``listener(names)`` with pages that left the store on its own initiative. It is
        called with the store's lock held: it must be quick and must not call the store."""
        self._listeners.append(listener)

    def tier(self, name: str) -> Tier | None:
        if self._shared is not None and name == self._shared.name:
            return self._shared
        return next((t for t in self._tiers if t.name == name), None)

    # -- writing -----------------------------------------------------------------------

    def reserve(self, size: int) -> Draft:
        """Room for a page of exactly ``size`` bytes, made by demoting or evicting LRU pages.
        A page larger than a RAM slab (memory_bytes / 8, at most the max page size), or one for
        which RAM has no room that is not held by readers and drafts, is staged in private
        memory and published to a lower tier only."""
        if size > self.config.max_page_size:
            raise PageTooLarge(f"page of {size} bytes exceeds max_page_size {self.config.max_page_size}")
        lower = any(t.fits(_LONGEST_NAME, size) for t in self._tiers[1:])
        if not self._ram.fits(b"", size):
            if not lower:
                raise StoreFull(f"page of {size} bytes fits neither a RAM slab nor a lower tier")
            return Draft(None, size, memoryview(bytearray(size)))
        try:
            with self._lock, self._reporting():
                offset = self._make_room(size)
        except StoreFull:
            if not lower:
                raise
            # RAM is held by readers and drafts: the page goes to a lower tier instead.
            return Draft(None, size, memoryview(bytearray(size)))
        return Draft(offset, size, self._ram.view(offset, size))

    def publish(self, draft: Draft, name: str, mtime_ns: int | None = None) -> PageInfo:
        """Checksum the draft and make it visible under ``name``, replacing any page of that
        name atomically; with write_through it is on the next tier when this returns. On any
        failure the draft is given back and the store is as it was (an old page stays)."""
        checksum = draft.checksum()
        slot = draft.consume()
        page = PageMeta(name, draft.size, checksum, time.time_ns() if mtime_ns is None else mtime_ns)
        with self._lock, self._reporting():
            try:
                lower = -1, -1
                if slot is None or self.config.write_through:
                    # The new copy goes down before the old page is dropped, so that a kill in
                    # between leaves one of the two versions (recovery keeps the newer), never none.
                    lower = self._write_below(page, draft.buffer, RAM)
                    if slot is None and lower[0] < 0:
                        raise StoreFull(f"page name {name!r} is too long for the lower tiers' regions")
            except BaseException:
                if slot is not None:
                    self._ram.retire(slot)
                raise
            old = self._index.find(name)
            if old >= 0:
                self._drop(old)
            self._found.pop(name, None)
            if slot is None:
                row = self._index.add(name, page.size, checksum, page.mtime_ns, *lower)
            else:
                row = self._index.add(name, page.size, checksum, page.mtime_ns, RAM, slot)
                if lower[0] >= 0:
                    self._index.loc[row, lower[0]] = lower[1]
                self._ram.policy.admit(row)
                self._ram.counters.bytes_in += page.size
            info = self._info(row)
            self._published += 1
            shared_copy = self._pinned_reader(row, slot) if self._shared is not None and slot is not None else None
        if shared_copy is not None:  # outside the lock: a refused offer releases at once
            self._shared.offer(page, shared_copy.view(), shared_copy.close)
        return info

    def abandon(self, draft: Draft) -> None:
        offset = draft.consume()
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

    def open(self, name: str, *, memory_only: bool = False, counted: bool = True) -> PageReader | None:
        """Pin the page for reading. A lower tier's page is read and verified here (blocking
        I/O) and promoted to RAM on its second read when room can be made. Raises PageNotFound,
        PageCorrupt or DeviceError.

        With ``memory_only`` a page that would need I/O is not read: None is returned, so an
        event loop can serve RAM pages inline and send only lower-tier reads to a thread.
        ``counted=False`` opens it for the store's own purposes: no hit, no access time, no
        change to the eviction order.

        A name no local tier holds is looked for on the shared tier (blocking), then read,
        checked and promoted into RAM."""
        for _ in range(3):  # a read can race with a replace or reclaim; then look again
            with self._lock:
                row = self._index.find(name)
                if row < 0:
                    if not self.may_be_shared(name):
                        self._count_miss()
                        raise PageNotFound(name)
                    if memory_only:
                        return None
                else:
                    index = self._index
                    slot = int(index.loc[row, RAM])
                    if not counted and (slot >= 0 or memory_only):
                        return self._pinned_reader(row, slot) if slot >= 0 else None
                    index.atime[row] = time.time_ns()
                    if slot >= 0:
                        index.hits[row] += 1
                        self._ram.counters.hits += 1
                        self._ram.counters.bytes_out += int(index.size[row])
                        self._ram.policy.touch(row)
                        return self._pinned_reader(row, slot)
                    if memory_only:
                        return None
                    self._ram.counters.misses += 1
                    position = index.top_tier(row)
                    tier, location, page, info = self._tiers[position], int(index.loc[row, position]), self._meta(row), self._info(row)
                    # Promote on the second read only: a page read once from a lower tier is often
                    # never read again, and promoting it would push another page down (a write).
                    slot = self._slot_for_promotion(page.size) if index.hits[row] > 0 else None
            if row < 0:
                if self._ahead.wait(name):  # was being fetched ahead: read it here now
                    continue
                reader = self._open_shared(name)
                if reader is not None:
                    return reader
                continue  # published or promoted here meanwhile: read the local copy
            buffer = self._ram.view(slot, page.size) if slot is not None else memoryview(bytearray(page.size))
            try:
                result = tier.read_into(page, location, buffer)
            except OSError as exc:
                if slot is not None:
                    self._give_back(slot)
                raise DeviceError(f"{name}: the {tier.name} tier failed to read it: {exc}") from exc
            with self._lock, self._reporting():
                row = self._index.find(name)
                unchanged = row >= 0 and self._index.loc[row, position] == location and self._index.checksum[row] == page.checksum
                if result is ReadResult.OK:
                    if unchanged:
                        self._index.hits[row] += 1
                        info = self._info(row)
                    release = None
                    if slot is not None:
                        if unchanged and self._index.loc[row, RAM] < 0:
                            self._index.loc[row, RAM] = slot
                            self._ram.policy.admit(row)
                            self._ram.counters.promotions += 1
                            self._ram.counters.bytes_in += page.size
                        else:  # a private copy for this reader only
                            self._ram.retire(slot)
                        release = self._unpinner(slot)
                    return PageReader(info, page, buffer, release)
                if slot is not None:
                    self._ram.retire(slot)
                    self._ram.unpin(slot)
                if unchanged:  # the copy is where the index says, and it is bad
                    tier.counters.checksum_failures += 1
                    self._index.loc[row, position] = -1
                    tier.drop(page, location)
                    if self._index.top_tier(row) < 0:
                        self._forget(row)
                        raise PageCorrupt(f"{name}: checksum mismatch on the {tier.name} tier; page dropped")
        raise PageNotFound(name)

    def count_reads(self, names: Iterable[str]) -> int:
        """Count reads of these pages that were served without the store (the kernel's page
        cache, through files a client keeps open): hits, access time and eviction order, as an
        ``open`` would. Names not stored are passed over; how many were counted."""
        now = time.time_ns()
        counted = 0
        with self._lock:
            index = self._index
            for name in names:
                row = index.find(name)
                if row < 0:
                    continue
                index.hits[row] += 1
                index.atime[row] = now
                position = index.top_tier(row)
                self._tiers[position].counters.hits += 1
                if position == RAM:
                    self._ram.policy.touch(row)
                counted += 1
        return counted

    def _open_shared(self, name: str, ahead: bool = False) -> PageReader | None:
        """Find the page on the shared tier, read and check it into a RAM slot and index it
        there (a promotion); None if it appeared locally meanwhile. Blocking. ``ahead``: for a
        read to come, so nothing is read when RAM has no room for it."""
        page = self._shared.find(name, reading=True)
        if page is None:
            with self._lock:
                self._count_miss()
            raise PageNotFound(name)
        with self._lock, self._reporting():
            slot = self._slot_for_promotion(page.size)
        if slot is None and ahead:
            return None
        buffer = self._ram.view(slot, page.size) if slot is not None else memoryview(bytearray(page.size))
        result = self._shared.read_into(page, 0, buffer)  # counts its own hits and failures
        if result is not ReadResult.OK:
            if slot is not None:
                self._give_back(slot)
            if result is ReadResult.CORRUPT:
                raise PageCorrupt(f"{name}: checksum mismatch on the shared tier; its file was removed")
            with self._lock:
                self._count_miss()
            raise PageNotFound(name)
        with self._lock, self._reporting():
            self._found.pop(name, None)
            if self._ahead.cancelled(name):  # removed while it was read: it stays removed
                if slot is not None:
                    self._ram.retire(slot)
                    self._ram.unpin(slot)
                raise PageNotFound(name)
            if self._index.find(name) >= 0:
                if slot is not None:
                    self._ram.retire(slot)
                    self._ram.unpin(slot)
                return None
            if slot is None:  # no room in RAM: a private copy for this reader only
                return PageReader(self._shared_info(page), page, buffer, None)
            row = self._index.add(name, page.size, page.checksum, page.mtime_ns, RAM, slot)
            self._index.hits[row] = 1
            self._ram.policy.admit(row)
            self._ram.counters.promotions += 1
            self._ram.counters.bytes_in += page.size
            return PageReader(self._info(row), page, buffer, self._unpinner(slot))

    def _count_miss(self) -> None:
        self._misses += 1
        for tier in self._tiers:
            tier.counters.misses += 1

    def _pinned_reader(self, row: int, slot: int) -> PageReader:
        """A reader of the page's RAM copy (the hot path of every read: built with one lookup
        of each fact, about 5 us)."""
        self._ram.pin(slot)
        index = self._index
        name, size, checksum, mtime = index.name(row), int(index.size[row]), int(index.checksum[row]), int(index.mtime[row])
        info = PageInfo(name=name, size=size, tier=self._ram.name, checksum=checksum_text(checksum),
                        hits=int(index.hits[row]), mtime_ns=mtime, atime_ns=int(index.atime[row]))
        return PageReader(info, PageMeta(name, size, checksum, mtime), self._ram.view(slot, size), self._unpinner(slot))

    def _unpinner(self, slot: int) -> Callable[[], None]:
        def release() -> None:
            with self._lock:
                self._ram.unpin(slot)

        return release

    def _slot_for_promotion(self, size: int) -> int | None:
        """A pinned RAM slot to read a page into, or None to read into private memory."""
        if not self._ram.fits(b"", size):
            return None
        try:
            with self._reporting():
                slot = self._make_room(size)
        except StoreFull:
            return None
        self._ram.pin(slot)
        return slot

    def _give_back(self, slot: int) -> None:
        with self._lock:
            self._ram.retire(slot)
            self._ram.unpin(slot)

    # -- names -------------------------------------------------------------------------

    def info(self, name: str) -> PageInfo | None:
        """The page's facts, or None; no I/O, no hit counted. A page found on the shared tier
        lately (``find_shared``) but not read yet is described too."""
        with self._lock:
            row = self._index.find(name)
            if row >= 0:
                return self._info(row)
            page = self._found.get(name)
            return None if page is None else self._shared_info(page)

    def may_be_shared(self, name: str) -> bool:
        """Whether the shared tier says it holds ``name``, from memory (no I/O)."""
        return self._shared is not None and self._shared.contains_many([name])[0]

    def shared_has_directory(self, path: str) -> bool:
        """Whether the shared tier holds pages under directory ``path``, from memory (no I/O):
        such a directory exists here too, so that its pages can be opened by path."""
        return self._shared is not None and self._shared.has_directory(path)

    def find_shared(self, name: str) -> PageInfo | None:
        """The facts of a page on the shared tier, read from its file; None if it is not
        there or the tier does not answer in time. Blocking; ``info`` knows it afterwards."""
        if not self.may_be_shared(name):
            return None
        if self._ahead.wait(name):  # was being fetched ahead: its facts came with it, no more I/O
            with self._lock:
                row = self._index.find(name)
                if row >= 0:
                    return self._info(row)
        page = self._shared.find(name)
        if page is None:
            return None
        with self._lock:
            self._found[name] = page
            self._found.move_to_end(name)
            while len(self._found) > _FOUND_KEPT:
                self._found.popitem(last=False)
            row = self._index.find(name)
            return self._info(row) if row >= 0 else self._shared_info(page)

    def delete(self, name: str) -> bool:
        """Remove the page (lower tiers' copies are invalidated in place); open readers keep it.
        Its copy on the shared tier, if any, is removed by ``delete_shared``."""
        with self._lock:
            self._found.pop(name, None)
            self._ahead.cancel(name)
            row = self._index.find(name)
            if row < 0:
                return False
            self._drop(row)
            return True

    def delete_shared(self, name: str) -> bool:
        """Remove the page's copy from the shared tier (blocking, idempotent): a page removed
        here must not come back from there. Whether there was one to remove."""
        if not self.may_be_shared(name):
            return False
        page = self._shared.find(name)
        if page is None:
            return False
        self._shared.drop(page, 0)
        return True

    def delete_tree(self, prefix: str) -> int:
        with self._lock:
            self._ahead.cancel_under(prefix)
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
        """Whether each page is held here or on the shared tier; no I/O. Pages only the shared
        tier holds are fetched ahead, in the background: their reads usually follow."""
        names = list(names)
        if len(names) <= _FEW_NAMES:  # numpy's set-up costs more than a few lookups
            with self._lock:
                found = [self._index.find(name) >= 0 for name in names]
        else:
            prepared = PageIndex.prepare_many(names)
            with self._lock:
                found = self._index.find_many(prepared).tolist()
        if self._shared is not None and not all(found):
            missing = [i for i, there in enumerate(found) if not there]
            remote = []
            for i, there in zip(missing, self._shared.contains_many([names[i] for i in missing])):
                found[i] = there
                if there:
                    remote.append(names[i])
            if remote:
                self._ahead.start(remote)
        return found

    def _fetch(self, name: str) -> bool:
        """Promote a page from the shared tier into RAM ahead of its read (a fetcher thread)."""
        reader = self._open_shared(name, ahead=True)
        if reader is None:
            return False
        reader.close()
        return True

    # -- accounting and shutdown -------------------------------------------------------

    def statistics(self) -> dict:
        """The totals at the top level, and ``tiers``: {'memory': ..., 'disk': ...}. A tier:
        capacity_bytes, used_bytes (slot / record bytes), pages, and its TierCounters.

        A page may be in several tiers; the total ``pages`` counts it once, and the total
        ``used_bytes`` counts its size once (what ``du`` adds up), so ``free_bytes`` is what can
        still be stored: a copy of a page that is also in a lower tier can be dropped at no cost.
        The total ``misses`` counts names not found at all."""
        with self._lock:
            live = self._index.live_rows()
            tiers = {}
            for position, tier in enumerate(self._tiers):
                facts = tier.statistics()
                facts["pages"] = int(np.count_nonzero(self._index.loc[live, position] >= 0))
                tiers[tier.name] = facts
            totals = {key: sum(t[key] for t in tiers.values()) for key in tiers["memory"]}
            totals["pages"] = len(live)
            totals["used_bytes"] = int(self._index.size[live].sum())
            totals["misses"] = self._misses  # a lookup that no tier could serve
            totals["published"] = self._published  # pages published (a page kept as it was is not)
            totals["free_bytes"] = max(0, totals["capacity_bytes"] - totals["used_bytes"])
        if self._shared is not None:  # not in the totals: its room is every host's, not ours
            tiers[self._shared.name] = {**self._shared.statistics(), **self._ahead.statistics()}
        return {**totals, "tiers": tiers}

    def sync(self) -> None:
        """Make the persistent tiers' writes durable (fsync)."""
        with self._lock:
            for tier in self._tiers[1:]:
                tier.sync()

    def close(self) -> None:
        """Write RAM-only pages down (the most recent ones, as room allows), save the SSD tier's
        index snapshot (so the next start need not scan), make the persistent tiers durable,
        release everything. A failing device stops the write-down, not the close. A second close
        does nothing: the tiers' files may belong to a new store by then."""
        if self._shared is not None and not self._closed:
            self._ahead.close()  # first: a fetch promotes into RAM, which must still be there
            self._shared.close()  # first: its write-behind releases pages, which takes the lock
        with self._lock, self._reporting():
            if self._closed:
                return
            self._closed = True
            try:
                if len(self._tiers) > 1:
                    self._write_down_for_restart()
                    for position, tier in enumerate(self._tiers):
                        if isinstance(tier, SsdTier):
                            tier.write_snapshot(self._index, position)
            finally:
                for tier in reversed(self._tiers):
                    try:
                        tier.close()
                    except OSError as exc:
                        log.warning("closing the %s tier failed: %s", tier.name, exc)

    # -- internals (lock held) ---------------------------------------------------------

    def _write_down_for_restart(self) -> None:
        budget = self._tiers[1].retention_bytes()
        rows = [r for r in self._ram.policy.oldest_first() if self._index.top_tier(r) == RAM
                and not (self._index.loc[r, 1:] >= 0).any()]
        keep = []
        for row in reversed(rows):
            budget -= int(self._index.size[row]) + 4096
            if budget < 0:
                break
            keep.append(row)
        for row in reversed(keep):
            if self._index.dir[row] >= 0 and not (self._index.loc[row, 1:] >= 0).any():
                slot = int(self._index.loc[row, RAM])
                if self._write_below(self._meta(row), self._ram.view(slot, int(self._index.size[row])), RAM, row)[0] < 0:
                    break  # the device fails: what is left stays unwritten

    def _info(self, row: int) -> PageInfo:
        index = self._index
        return PageInfo(
            name=index.name(row),
            size=int(index.size[row]),
            tier=self._tiers[index.top_tier(row)].name,
            checksum=checksum_text(int(index.checksum[row])),
            hits=int(index.hits[row]),
            mtime_ns=int(index.mtime[row]),
            atime_ns=int(index.atime[row]),
        )

    @staticmethod
    def _shared_info(page: PageMeta) -> PageInfo:
        return PageInfo(name=page.name, size=page.size, tier=SharedTier.name, checksum=checksum_text(page.checksum),
                        hits=0, mtime_ns=page.mtime_ns, atime_ns=page.mtime_ns)

    def _meta(self, row: int) -> PageMeta:
        index = self._index
        return PageMeta(index.name(row), int(index.size[row]), int(index.checksum[row]), int(index.mtime[row]))

    def _make_room(self, size: int) -> int:
        """A RAM slot for ``size`` bytes, evicting least recently used pages until one frees.
        Evicting in strict LRU order may take out a few pages of other sizes first, as they
        are older; that is the order a user expects. Pages open for reading are passed over:
        evicting them would free nothing and take the page from under its reader."""
        while True:
            offset = self._ram.allocate(size)
            if offset is not None:
                return offset
            row = self._next_victim()
            if row < 0:
                raise StoreFull(f"no room for a page of {size} bytes: the RAM tier is pinned by readers and drafts")
            self._evict_from_ram(row)

    def _next_victim(self) -> int:
        loc = self._index.loc
        for row in self._ram.policy.in_order():
            if not self._ram.is_pinned(int(loc[row, RAM])):
                return row
        return -1

    def _evict_from_ram(self, row: int) -> None:
        """Move the page out of RAM: down to a lower tier unless one holds it already, else
        out of the store."""
        index = self._index
        slot = int(index.loc[row, RAM])
        self._ram.policy.forget(row)
        if not (index.loc[row, 1:] >= 0).any():
            self._write_below(self._meta(row), self._ram.view(slot, int(index.size[row])), RAM, row)
        index.loc[row, RAM] = -1
        self._ram.retire(slot)
        if index.top_tier(row) >= 0:
            self._ram.counters.demotions += 1
        else:
            self._ram.counters.evictions += 1
            self._forget(row)

    def _write_below(self, page: PageMeta, payload, above: int, row: int = -1) -> tuple[int, int]:
        """Write the page to the first tier below ``above`` that takes it: (tier, location),
        or (-1, -1). With ``row`` the index records it; without, a device failure is raised
        (a publish must fail), with it the page simply stays where it was."""
        encoded = page.name.encode()
        for position in range(above + 1, len(self._tiers)):
            tier = self._tiers[position]
            if not tier.fits(encoded, page.size):
                continue
            try:
                location = tier.write(page, payload)
            except OSError as exc:
                if row < 0:
                    raise DeviceError(f"{page.name}: the {tier.name} tier failed to write it: {exc}") from exc
                log.warning("cannot write %s down to the %s tier: %s", page.name, tier.name, exc)
                continue
            if row >= 0 and self._index.dir[row] >= 0:
                self._index.loc[row, position] = location
            return position, location
        return -1, -1

    def _reclaimed(self, position: int, start: int, end: int) -> None:
        """Tier ``position`` is about to overwrite [start, end): forget what lives only there."""
        index = self._index
        for row in index.rows_located_between(position, start, end).tolist():
            index.loc[row, position] = -1
            if index.top_tier(row) < 0:
                self._tiers[position].counters.evictions += 1
                self._forget(row)

    def _drop(self, row: int) -> None:
        """Remove a page from the store at the caller's request: by name now, its RAM slot
        when its readers are done, its lower copies invalidated."""
        page = self._meta(row)
        for position, location in enumerate(self._index.loc[row].tolist()):
            if location < 0:
                continue
            if position == RAM:
                self._ram.policy.forget(row)
            self._tiers[position].drop(page, location)
        self._index.remove(row)

    def _forget(self, row: int) -> None:
        """The page left its last tier on the store's own initiative: tell the listeners."""
        self._gone.append(self._index.name(row))
        self._index.remove(row)

    def _reporting(self):
        return _GoneReport(self)


class _GoneReport:
    """Hands the names gathered in ``_gone`` during one locked operation to the listeners."""

    __slots__ = ("store",)

    def __init__(self, store: PageStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        store = self.store
        if store._gone:
            names, store._gone = store._gone, []
            for listener in store._listeners:
                listener(names)

