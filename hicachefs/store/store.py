"""PageStore: the store's name-level API, and the engine that moves pages between its tiers.

Pages are immutable bytes under '/'-separated names. The store is given a chain of tiers
(``chain.py``; the ``Tier`` interface says what a tier is): the RAM tier on top, whose slots
new pages are written into (``reserve`` -> ``Draft.write`` -> ``publish``) and read from without
a copy; then indexed tiers (the SSD tier) that take what RAM has no room for (its least recently
used pages move down, or leave the store at the last one) and promote a page back to RAM on its
second read; and tiers that find pages by name (the shared tier, which other hosts write too):
every page published here is offered to them, a name missing locally is looked for there, and a
page found there is read, checked and promoted into RAM. The engine's index records, per page,
its location in each indexed tier. A page only a named tier holds and the exists query found is
fetched into RAM at once, in the background (``FetchAhead``): SGLang reads what it asked about.

What blocks is the store's to say, not its caller's: the calls an event loop makes
(``lookup``, ``try_open``, ``remove``, ``rename``) answer from memory, or return ``NeedsIO``,
whose work the caller runs in a worker thread; ``open``, ``delete`` and ``move`` are their
blocking forms, for everyone else.

Every operation either completes or leaves the store as it was: resources are taken, the I/O
done, then the index committed, and a failing device (``OSError`` from a tier) gives the
resources back. Such failures are counted by the tier and surface as ``DeviceError``; when a
page cannot be written down while RAM makes room, it is evicted instead (it is a cache), so the
RAM tier keeps serving while a disk fails.

Pages that leave the store on its own initiative (eviction from their last tier, reclaim, a
failed checksum) are reported to ``on_gone`` listeners, so the daemon can tell the kernel.

Thread-safe: one lock guards the index and the tiers. It is not held while checksumming a page
at publish, nor while reading and checking a lower tier's page (the slow path the daemon runs in
a worker thread). It is held while writing to an indexed tier below RAM (demotion,
write-through): buffered pwrites into the page cache, memory-speed, and keeping them under the
lock keeps the ring's append order and the index in step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from hicachefs.store.budget import BudgetStatistics, RamBudget
from hicachefs.store.chain import build_chain
from hicachefs.store.config import StoreConfig
from hicachefs.store.errors import DeviceError, PageCorrupt, PageNotFound, PageTooLarge, StoreError, StoreFull
from hicachefs.store.fetch_ahead import FetchAhead, FetchAheadStatistics
from hicachefs.store.index import PageColumns, PageIndex
from hicachefs.store.index_memory import Described
from hicachefs.store.pages import (Draft, NeedsIO, PageInfo, PageMeta, PageReader, checksum_text, page_checksum,
                                   release_private)
from hicachefs.store.private_reads import PrivateReads
from hicachefs.store.statistics import StoreStatistics, TierStatistics, summed
from hicachefs.typed_stats import part
from hicachefs.store.tier import LONGEST_NAME_BYTES, ReadResult, RecoveryListener, Tier, TopTier

log = logging.getLogger(__name__)

RAM = 0  # the RAM tier's position in the chain and the index's location columns
_LONGEST_NAME = bytes(LONGEST_NAME_BYTES)
#: Pages found on a named tier whose facts are kept for ``info`` (a lookup is followed by
#: getattr, getxattr and open of the same name).
_FOUND_KEPT = 4096
#: Up to this many names, the exists query looks them up one by one (8 names: 12 us instead of
#: 39 us through the vectorised lookup, whose numpy set-up dominates small batches).
_FEW_NAMES = 16
#: The index starts with a row for each page of this size the RAM tier holds (at least 1,024, at
#: most 2**20: 130 bytes a row): every time it outgrows its rows it moves to new memory, and each
#: data-plane client opens it again (two requests), which a store of large pages then never pays.
_INDEX_PAGE_BYTES = 128 << 10
#: Pages ``list_dir`` returns by default: a readdir reply's worth or so.
LISTING_BATCH = 64

#: A page that left the store: its name and the version that left (``PageInfo.version``).
Gone = tuple[str, tuple[str, int]]
GoneListener = Callable[[list[Gone]], None]


class PlaneFiles(NamedTuple):
    """The files the data plane's clients open (``PageStore.plane_files``), as descriptors."""

    arena: int
    index: int
    disk: int | None


@dataclass(frozen=True)
class EngineStatistics(StoreStatistics):
    """The store's facts, its pages fetched ahead from named tiers, and the RAM tier's shares."""

    fetch_ahead: FetchAheadStatistics = part(FetchAheadStatistics)
    ram_budget: BudgetStatistics = field(default_factory=BudgetStatistics)


class PageStore:
    """The tiered page store; see the module docstring."""

    def __init__(self, config: StoreConfig, progress: RecoveryListener | None = None, *,
                 tiers: list[Tier] | None = None, disk_device=None, shared_device=None) -> None:
        """``progress``: told how filling the RAM tier and rebuilding the persistent tiers'
        index go. ``tiers``: the chain (RAM first); by default ``build_chain(config)``, given
        ``disk_device`` and ``shared_device`` (tests pass FaultyDevices)."""
        self.config = config
        self._lock = threading.Lock()
        #: The shares of the RAM tier that what holds RAM may take (``budget``): the shared
        #: tier's write-behind here, the namespace's files being written and pins, the kernel's
        #: pushes and the data plane's reservations in the daemon.
        self.budget = RamBudget(config.memory_bytes, config.max_page_size)
        self._private = PrivateReads(self.budget.share("private_reads"), self.budget.share("private_reads_of_others"))
        chain = tiers if tiers is not None else build_chain(config, self.budget, disk_device=disk_device,
                                                            shared_device=shared_device)
        if not isinstance(chain[0], TopTier):
            raise ValueError("a tier chain starts with the RAM tier")
        self._ram: TopTier = chain[0]
        self._tiers = [t for t in chain if t.indexed]  # the index has a location column for each
        self._named = [t for t in chain if not t.indexed]
        self._by_name = {t.name: t for t in chain}  # (a page's st_blocks asks its tier, per stat)
        self._index = PageIndex(tiers=len(self._tiers), described=self._described(),
                                capacity=min(max(config.memory_bytes // _INDEX_PAGE_BYTES, 1024), 1 << 20))
        self._listeners: list[GoneListener] = []
        self._give_way: list[Callable[[], bool]] = []  # pins that let go for a writer (``on_pinned_full``)
        self._gone: list[Gone] = []
        self._gone_report = _GoneReport(self)  # holds no state of its own: one serves every operation
        self._found: OrderedDict[str, PageMeta] = OrderedDict()
        # Names being read from a named tier (how many reads), and those of them removed
        # meanwhile: such a read must not bring its page back (under _lock).
        self._named_reads: dict[str, int] = {}
        self._removed_while_read: set[str] = set()
        self._misses = 0
        self._published = 0
        self._closed = False
        try:
            self._ram.fill(progress)
            for position, tier in enumerate(self._tiers):
                tier.bind(_Events(self, position))
                tier.recover(_Recovered(self._index, position, tier), progress)
            for tier in self._named:
                tier.bind(_Events(self, -1))
        except BaseException:
            for tier in reversed(chain):
                tier.close()
            raise
        self._ahead = FetchAhead(self._fetch)  # idle (no threads) without a named tier
        # Pages the data plane's clients read a second time from a lower tier: into RAM, as an
        # ``open`` would promote them (``count_plane_reads``).
        self._promoting = FetchAhead(self._promote, threads=1, name="hicachefs-promote")

    def _described(self) -> Described:
        """What the shared index says of the files it points into and of this store."""
        arena = os.fstat(self._ram.shared_fd())
        disk_fd = self._below_fd()
        disk = os.fstat(disk_fd) if disk_fd is not None else None
        return Described(token=os.urandom(16), arena_ino=arena.st_ino, arena_bytes=arena.st_size,
                         disk_dev=disk.st_dev if disk else 0, disk_ino=disk.st_ino if disk else 0,
                         named=bool(self._named), pid=os.getpid())

    def on_gone(self, listener: GoneListener) -> None:
        """Call ``listener(gone)`` with the pages (name and version) that left the store on its
        own initiative. It is called with the store's lock held: it must be quick and must not
        call the store."""
        self._listeners.append(listener)

    def on_pinned_full(self, give_way: Callable[[], bool]) -> None:
        """``give_way()`` is asked when readers' pins leave RAM no slot for a new page (each
        pinned slot keeps its whole slab from serving another size): it lets go of the pins that
        may give way to a writer, whether it let go of any. Called without the store's lock."""
        self._give_way.append(give_way)

    def merged(self, pieces: list) -> list:
        """A read's pieces with those that lie end to end in RAM made one (``Arena.merged``)."""
        return self._ram.merged(pieces)

    @property
    def open_to_other_hosts(self) -> bool:
        """Whether pages may appear under any name without a call here (a tier other hosts write)."""
        return bool(self._named)

    # -- writing -----------------------------------------------------------------------

    def reserve(self, size: int) -> Draft:
        """Room for a page of exactly ``size`` bytes, made by demoting or evicting LRU pages.
        A page larger than a RAM slab (memory_bytes / 8, at most the max page size), or one for
        which RAM has no room that is not held by readers and drafts, is staged in private
        memory and published to a lower tier only."""
        if size > self.config.max_page_size:
            raise PageTooLarge(f"page of {size} bytes exceeds max_page_size {self.config.max_page_size}")
        if not self._ram.fits(b"", size):
            if not self._lower_fits(size):
                raise StoreFull(f"page of {size} bytes fits neither a RAM slab nor a lower tier")
            return Draft(None, size, memoryview(bytearray(size)))
        try:
            offset = self._room_for(size)
        except StoreFull:
            if not self._lower_fits(size):
                raise
            # RAM is held by readers and drafts: the page goes to a lower tier instead.
            return Draft(None, size, memoryview(bytearray(size)))
        return Draft(offset, size, self._ram.view(offset, size))

    def _room_for(self, size: int) -> int:
        """``_make_room``, tried once more after the pins that may give way let go (``on_pinned_full``)."""
        try:
            with self._lock, self._reporting():
                return self._make_room(size)
        except StoreFull:
            if not any([give_way() for give_way in self._give_way]):
                raise
        with self._lock, self._reporting():
            return self._make_room(size)

    def _lower_fits(self, size: int) -> bool:
        """Whether a lower tier can ever take a page of ``size`` bytes (asked only where RAM
        cannot: ``fits`` is a pure function of the size)."""
        return any(t.fits(_LONGEST_NAME, size) for t in self._tiers[1:])

    def publish(self, draft: Draft, name: str, mtime_ns: int | None = None,
                keep_existing: bool = False) -> PageInfo | None:
        """Checksum the draft and make it visible under ``name``, replacing any page of that
        name atomically; with write_through it is on the next tier when this returns (StoreFull
        when no lower tier takes it). On any failure the draft is given back and the store is
        as it was (an old page stays).
        ``keep_existing``: a page of that name and of the draft's size stored here or on a
        named tier (``holds``) is kept as it is instead, the draft given back, and None
        returned; one of another size is replaced (no reader of this size could take it)."""
        published = self._publish(draft, name, mtime_ns, keep_existing)
        return None if published is None else self._published_info(*published)

    def _published_info(self, page: PageMeta, position: int) -> PageInfo:
        """The ``PageInfo`` of a page just published, held first at tier ``position``."""
        return PageInfo(name=page.name, size=page.size, tier=self._tiers[position].name,
                        checksum=checksum_text(page.checksum), hits=0, mtime_ns=page.mtime_ns, atime_ns=page.mtime_ns)

    def publish_page(self, draft: Draft, name: str, keep_existing: bool = False) -> bool:
        """``publish``, for a caller that needs no ``PageInfo`` of the page (a data-plane
        commit's pages, where building one was a twentieth of the daemon's work per page)."""
        return self._publish(draft, name, None, keep_existing) is not None

    def _publish(self, draft: Draft, name: str, mtime_ns: int | None, keep_existing: bool,
                 write_through: bool | None = None, vacate: Callable[[], None] | None = None,
                 keep_any: bool = False) -> tuple[PageMeta, int] | None:
        """``publish``'s work: the page, and the position of the fastest tier holding it.
        ``write_through``: whether a page in RAM is written below now, whatever the config
        (None: as the config says). ``keep_any``: with ``keep_existing``, a page of any size
        the name holds is kept.
        ``vacate``: a rename's removal of its source (lock held), done after the page's copy
        below is written and before the page is indexed (``_vacated``)."""
        checksum = draft.checksum()
        slot = draft.consume()
        page = PageMeta(name, draft.size, checksum, time.time_ns() if mtime_ns is None else mtime_ns)
        elsewhere = keep_existing and bool(self._named) and self._named_may_hold(name)  # (not under the lock)
        with self._lock, self._reporting():
            old = self._index.find(name)
            if keep_existing and self._of_size(name, old, None if keep_any else page.size, elsewhere):
                if slot is not None:
                    self._ram.retire(slot)
                return None
            try:
                # Room in the index first: an add that failed for memory after the old page was
                # dropped, or its copy written below, lost the old page, or brought the failed
                # one back at the next start (found by review). No room there is a full store.
                try:
                    self._index.make_room(name)
                except (OSError, MemoryError) as exc:
                    raise StoreFull(f"{name}: the page index has no memory to grow into ({exc})") from None
                lower = None
                if slot is None or (self.config.write_through if write_through is None else write_through):
                    # The new copy goes down before the old page is dropped, so that a kill in
                    # between leaves one of the two versions (recovery keeps the newer), never none.
                    # A page that no lower tier takes is not published: under write-through, one
                    # in RAM alone would be lost by a crash (found by review).
                    lower = self._write_below(page, draft.buffer, RAM)
                    if lower is None:
                        raise StoreFull(f"{name}: no lower tier takes a page of {page.size:,} bytes under this name")
            except BaseException:
                if slot is not None:
                    self._ram.retire(slot)
                raise
            if vacate is not None:
                self._vacated(vacate, page, slot, lower)
            if lower is not None or vacate is not None:  # making room below, or the source's removal, moved rows
                old = self._index.find(name)
            # A replace: the data plane's readers take a miss meanwhile as unsure, not as "not held".
            with self._index.replacing() if old >= 0 else contextlib.nullcontext():
                place = self._replace(old, page, slot, lower) if old >= 0 else 0  # listed where the old one was
                self._found.pop(name, None)
                if slot is None:
                    row = self._index.add(name, page.size, checksum, page.mtime_ns, *lower, cursor=place,
                                          offset=self._tiers[lower[0]].byte_offset(lower[1], len(name.encode())))
                else:
                    row = self._index.add(name, page.size, checksum, page.mtime_ns, RAM, slot, cursor=place,
                                          offset=slot)
            if slot is not None:
                if lower is not None:
                    self._locate(row, *lower)
                self._ram.admit(row, slot, page.size)
            self._published += 1
            # What each named tier writes behind: the RAM slot, pinned until written; a page staged
            # in private memory offers that memory, which nobody else holds or changes.
            offered = ([(copy.view(), copy.close) for copy in (self._pinned_reader(row, slot) for _ in self._named)]
                       if slot is not None else [(draft.buffer, release_private) for _ in self._named])
        for tier, (payload, release) in zip(self._named, offered):  # outside the lock: a refused offer releases at once
            tier.offer(page, payload, release)
        return page, RAM if slot is not None else lower[0]

    def _replace(self, old: int, page: PageMeta, slot: int | None, lower: tuple[int, int] | None) -> int:
        """Drop the name's old page for the new one; the listing cursor the new one takes over.
        When the old page's lower copy cannot be invalidated, the publish is refused (DeviceError)
        unless ``_refused`` cannot make that last: then the new version takes the old one's place
        all the same, so that the name holds one version before and after a crash."""
        try:
            return self._drop(old, keep_place=True)
        except DeviceError as exc:
            self._refuse_if_it_lasts(exc, page, slot, lower, "replaced all the same, as the {} tier could mark "
                                     "neither the old copy nor the new one dead, and a crash would bring the new one back")
            return self._supersede(old)

    def _vacated(self, vacate: Callable[[], None], page: PageMeta, slot: int | None,
                 lower: tuple[int, int] | None) -> None:
        """Remove a rename's source once the page's copy below is written, so that a kill at any
        point leaves the page under one of its names. A source whose copy cannot be marked dead
        refuses the rename (DeviceError, the target untouched), unless ``_refused`` cannot make
        that last: then the rename goes through with the source kept, as a crash would keep both."""
        try:
            vacate()
        except DeviceError as exc:
            self._refuse_if_it_lasts(exc, page, slot, lower, "renamed with its source kept, as the {} tier could "
                                     "mark neither the source's copy nor the new one dead, and a crash would bring both back")

    def _refuse_if_it_lasts(self, exc: DeviceError, page: PageMeta, slot: int | None,
                            lower: tuple[int, int] | None, going_on: str) -> None:
        """A publish whose old copy (``exc``) cannot be removed: raise ``exc`` once ``_refused``
        made the refusal last; else log ``going_on`` (``{}``: the tier) and return, the publish
        going on, since a crash would bring its new copy back anyway."""
        if self._refused(page, slot, lower):
            raise exc
        log.warning("%s: %s (%s)", page.name, going_on.format(self._tiers[lower[0]].name), exc)

    def _refused(self, page: PageMeta, slot: int | None, lower: tuple[int, int] | None) -> bool:
        """A publish cannot drop the old page: mark the copy it wrote below dead and give its RAM
        slot back. False, nothing given back, when that mark fails: a scan after a crash would
        bring back the refused version, newer than the old page kept."""
        if lower is not None:
            try:
                self._tiers[lower[0]].drop(page, lower[1])
            except OSError:
                return False
        if slot is not None:
            self._ram.retire(slot)
        return True

    def abandon(self, draft: Draft) -> None:
        offset = draft.consume()
        if offset is not None:
            with self._lock:
                self._ram.retire(offset)

    def put(self, name: str, data, mtime_ns: int | None = None) -> PageInfo:
        source = memoryview(data).cast("B")
        draft = self.reserve(source.nbytes)
        try:
            draft.write(0, source)
        except BaseException:
            self.abandon(draft)
            raise
        return self.publish(draft, name, mtime_ns)

    # -- reading -----------------------------------------------------------------------

    def try_open(self, name: str, counted: bool = True, size: int | None = None,
                 bounded: bool = False) -> PageReader | NeedsIO:
        """The page pinned for reading if it is in RAM; else ``NeedsIO`` whose work (``open``)
        reads it from where it is. Raises PageNotFound when no tier can hold it, or when ``size``
        is given and the page has another size (a miss: a reader that names a wrong size must not
        count hits, nor change the eviction order).
        ``counted=False``: for the store's own purposes (no hit, no access time, no change to
        the eviction order), and never I/O: a page not in RAM is then PageNotFound. ``bounded``:
        for a user who may not change the store (``PrivateReads``)."""
        with self._lock:
            row = self._index.find(name)
            if row >= 0 and size is not None and int(self._index.size[row]) != size:
                self._count_miss()
                raise PageNotFound(name)
            if row >= 0:
                slot = int(self._index.loc[row, RAM])
                if slot >= 0:
                    if counted:
                        self._counted_hit(row)
                    return self._pinned_reader(row, slot)
            elif not self._named_may_hold(name):
                self._count_miss()
                raise PageNotFound(name)
        if not counted:
            raise PageNotFound(name)
        return NeedsIO(lambda: self.open(name, size, bounded))

    def open(self, name: str, size: int | None = None, bounded: bool = False) -> PageReader:
        """Pin the page for reading. A lower tier's page is read and verified here (blocking
        I/O) and promoted to RAM on its second read when room can be made; a page only a named
        tier holds is read, checked and promoted into RAM. Raises PageNotFound (also when
        ``size`` is given and the page has another), PageCorrupt, DeviceError, or
        PrivateReadsFull (a copy for this reader only finds no room now). ``bounded``: for a
        user who may not change the store (``PrivateReads``)."""
        for _ in range(3):  # a read can race with a replace or reclaim; then look again
            with self._lock:
                row = self._index.find(name)
                if row < 0:
                    if not self._named_may_hold(name):
                        self._count_miss()
                        raise PageNotFound(name)
                elif size is not None and int(self._index.size[row]) != size:
                    self._count_miss()
                    raise PageNotFound(name)
                else:
                    index = self._index
                    slot = int(index.loc[row, RAM])
                    if slot >= 0:
                        self._counted_hit(row)
                        return self._pinned_reader(row, slot)
                    position = index.top_tier(row)
                    page = self._meta(row)
                    # Promote on the second read only: a page read once from a lower tier is often
                    # never read again, and promoting it would push another page down (a write).
                    slot = self._slot_for_promotion(page.size) if index.hits[row] > 0 else None
                    if slot is None:  # refused before it counts: a read refused for room is made again
                        self._private.check(page.size, bounded)
                    index.atime[row] = time.time_ns()
                    self._ram.count_miss()
                    tier, location, info = self._tiers[position], int(index.loc[row, position]), self._info(row)
            if row < 0:
                if self._ahead.wait(name):  # was being fetched ahead: read it here now
                    continue
                reader = self._open_named(name, size=size, bounded=bounded)
                if reader is not None:
                    return reader
                continue  # published or promoted here meanwhile: read the local copy
            reader = self._read_below(name, tier, position, location, page, info, slot, bounded=bounded)
            if reader is not None:
                return reader
        raise PageNotFound(name)

    def _count_read(self, row: int, now: int) -> None:
        index = self._index
        index.hits[row] += 1
        index.atime[row] = now
        size = int(index.size[row])  # the reader copied the page out of the tier itself
        if index.loc[row, RAM] >= 0:
            self._ram.hit(row, size)
        else:
            self._tiers[index.top_tier(row)].count_hit(size)

    # -- the data plane ----------------------------------------------------------------

    def plane_files(self) -> PlaneFiles:
        """The descriptors of what the data plane's clients read and write themselves (they
        open them through the mount): the RAM tier's arena, the shared index (its memory moves
        when the index grows: ask again at each open), the disk tier's file (None without one)."""
        with self._lock:
            index_fd = self._index.memory.fd
        return PlaneFiles(self._ram.shared_fd(), index_fd, self._below_fd())

    def _below_fd(self) -> int | None:
        """The file the data plane reads the indexed tier below RAM from (None: none, or a tier
        the plane does not read)."""
        return self._tiers[1].shared_fd() if len(self._tiers) > 1 else None

    @property
    def plane_token(self) -> bytes:
        """This store's token, as its shared index's header holds it: a data-plane client checks
        that a handle it opened through the mount reaches the store whose memory it maps."""
        return self._index.described.token

    def plane_dir(self, directory: str) -> int:
        """The number the data plane's clients hash ``directory``'s keys with (``PageIndex.dir_id``)."""
        with self._lock:
            return self._index.dir_id(directory)

    def count_plane_reads(self, reads: Iterable[tuple[int, int]]) -> int:
        """Count reads the data plane's clients made themselves, each named by the index row and
        its ``gen`` as they read it, as an ``open`` would count them (hits, access time, eviction
        order), for the rows that still hold that page (a row changed since stands for another
        page, or none). How many were counted."""
        now = time.time_ns()
        counted = 0
        promote = []
        with self._lock:
            index = self._index
            for row, gen in reads:
                if 0 <= row < len(index.gen) and int(index.gen[row]) == gen and index.dir[row] >= 0:
                    self._count_read(row, now)
                    counted += 1
                    if index.loc[row, RAM] < 0 and index.hits[row] > 1:  # read again from below
                        promote.append(index.name(row))
        if promote:
            self._promoting.start(promote)
        return counted

    def count_misses(self, count: int = 1) -> None:
        """Count reads served no page without asking the store for it: the data plane's
        clients' (the index held none of the name, or one of another size), or a fetch line
        whose path no name can hold (not UTF-8). Misses all the same, as an ``open`` of them
        would count."""
        with self._lock:
            self._count_miss(count)

    # -- names -------------------------------------------------------------------------

    def allocated(self, info: PageInfo) -> int:
        """Bytes the page takes on the tier ``info`` names (a slot, a record): its ``st_blocks``.
        No lock: a tier's answer depends on the size and the name alone."""
        return self._by_name[info.tier].allocated(len(info.name.encode()), info.size)

    def info(self, name: str) -> PageInfo | None:
        """The page's facts, or None; no I/O, no hit counted. A page found on a named tier
        lately (``lookup``) but not read yet is described too."""
        with self._lock:
            row = self._index.find(name)
            if row >= 0:
                return self._info(row)
            page = self._found.get(name)
        if page is None:
            return None
        if not self._named_may_hold(name):  # removed there since (another host, or a rename)
            with self._lock:
                self._found.pop(name, None)
            return None
        return self._named_info(page)

    def holds(self, name: str, size: int | None = None) -> bool:
        """Whether a page of that name is stored here or on a named tier (from memory); with
        ``size``, only a page of that size counts (see ``_of_size``)."""
        with self._lock:
            row = self._index.find(name)
            if row >= 0:
                return self._of_size(name, row, size, elsewhere=False)
        elsewhere = self._named_may_hold(name)  # (not under the lock)
        with self._lock:
            return self._of_size(name, -1, size, elsewhere)

    def _size_here(self, row: int) -> int:
        """Under the lock: the size of the page at ``row``, -1 for no row."""
        return int(self._index.size[row]) if row >= 0 else -1

    def _of_size(self, name: str, row: int, size: int | None, elsewhere: bool) -> bool:
        """Under the lock: whether the name holds a page of ``size`` (any, when None): its
        ``row`` here, or, none here, one a named tier may hold (``elsewhere``) whose facts
        seen lately (``find``) say no other size. A named tier's page of unknown size counts:
        its size is in its file, which is not read here."""
        if row >= 0:
            return size is None or self._size_here(row) == size
        known = self._found.get(name)
        return elsewhere and (size is None or known is None or known.size == size)

    def lookup(self, name: str) -> PageInfo | None | NeedsIO:
        """The page's facts from memory, None if no tier has it, or ``NeedsIO`` when a named
        tier says it holds the page: its work reads the facts there (``find``)."""
        info = self.info(name)
        if info is not None or not self._named_may_hold(name):
            return info
        return NeedsIO(lambda: self.find(name))

    def find(self, name: str) -> PageInfo | None:
        """The page's facts, looked for on every tier (blocking on a named tier, up to its
        deadline); ``info`` knows them afterwards."""
        info = self.info(name)
        if info is not None:
            return info
        if self._ahead.wait(name):  # was being fetched ahead: its facts came with it
            info = self.info(name)
            if info is not None:
                return info
        for tier in self._named:
            if not tier.contains_many([name])[0]:
                continue
            page = tier.find(name)
            if page is None:
                continue
            with self._lock:
                self._remember(name, page)
                row = self._index.find(name)
                return self._info(row) if row >= 0 else self._named_info(page)
        return None

    def _remember(self, name: str, page: PageMeta) -> None:
        """Under the lock: keep the facts of a page found on a named tier (``_found``)."""
        self._found[name] = page
        self._found.move_to_end(name)
        while len(self._found) > _FOUND_KEPT:
            self._found.popitem(last=False)

    def has_directory(self, path: str) -> bool:
        """Whether pages lie under directory ``path`` here or on a named tier (from memory)."""
        with self._lock:
            if self._index.has_directory(path):
                return True
        return any(tier.has_directory(path) for tier in self._named)

    def remove(self, name: str) -> bool | NeedsIO:
        """Remove the page from the local tiers now (open readers keep it); whether it was
        there. When a named tier may hold it too, ``NeedsIO`` whose work removes it there as
        well (``delete``), so that it does not come back from there (a named tier that cannot
        see its pages now removes it once it can: ``Tier.remove_later``). Raises DeviceError,
        the page kept, when a lower tier cannot invalidate its copy (``_drop``)."""
        removed = self._remove_local(name)
        if any(not tier.remove_later(name) and tier.contains_many([name])[0] for tier in self._named):
            return NeedsIO(lambda: self._delete_named(name) or removed)
        return removed

    def delete(self, name: str) -> bool:
        """Remove the page from every tier (blocking on named tiers); whether there was one."""
        removed = self._remove_local(name)
        return self._delete_named(name) or removed

    def rename(self, old: str, new: str) -> PageInfo | NeedsIO:
        """Move a page to another name: published under ``new`` (replacing what was there),
        removed from every tier under ``old``; it keeps its publish time, so it is the same
        version under its new name. Done at once for a page in RAM on a store with no named
        tier; else ``NeedsIO`` whose work does it (``move``)."""
        if not self._named:
            try:
                reader = self.try_open(old, counted=False)
            except PageNotFound:
                reader = None
            if isinstance(reader, PageReader):
                with reader:
                    return self._moved(reader, old, new)[0]
        return NeedsIO(lambda: self.move(old, new))

    def move(self, old: str, new: str) -> PageInfo:
        """``rename``'s blocking form. Raises PageNotFound when there is no page ``old``."""
        with self.open(old) as reader:
            info, removed = self._moved(reader, old, new)
        if removed is not None:
            self._delete_named(old)
        return info

    def _moved(self, reader: PageReader, old: str, new: str) -> tuple[PageInfo, bool | None]:
        """Move the page ``reader`` holds from ``old`` to ``new`` locally: the page published
        under ``new``, and whether ``old`` held it (``_unname``: only the version moved leaves
        the old name, one published there meanwhile stays; None when it was kept). The room
        for the page is taken first, and ``old`` goes inside the publish, after the page's copy
        below (write-through) is written and before ``new`` is touched: a store with no room,
        or a lower copy of ``old`` that cannot be marked dead (DeviceError), fails the rename
        with ``new`` and the page it held as they were, and a kill at any point leaves the page
        under one of its names, or both. A publish that fails after ``old`` went puts it back."""
        draft = self._copy_of(reader)
        removed: list[bool | None] = []
        try:
            page, position = self._publish(draft, new, reader.info.mtime_ns, keep_existing=False,
                                           vacate=lambda: removed.append(self._unname(old, reader.meta.version)))
        except BaseException:
            if removed and removed[0]:
                self._put_back(old, reader)
            raise
        return self._published_info(page, position), removed[0] if removed else None

    def _put_back(self, name: str, reader: PageReader) -> None:
        """A rename's publish failed after its source was removed (its lower copy marked dead):
        the source is published again, unless its name holds a page again; written below as
        well, whatever the config, so that a crash does not lose it, else (the disk may be what
        failed) into RAM only. A store that cannot take it any more loses it, as a cache may;
        the rename's own error is what the caller hears."""
        try:
            try:
                self._published_again(name, reader, write_through=True)
            except StoreError:
                self._published_again(name, reader, write_through=False)
        except StoreError as exc:
            log.warning("%s: a rename failed and the page could not be put back: %s", name, exc)

    def _published_again(self, name: str, reader: PageReader, write_through: bool) -> None:
        """``_put_back``'s publish of the page ``reader`` holds under ``name``: not over a page
        published there since the rename took it away, whatever that page's size (the lock is
        let go in between: a writer's newer page must not give way to the older one)."""
        self._publish(self._copy_of(reader), name, reader.info.mtime_ns, keep_existing=True,
                      write_through=write_through, keep_any=True)

    def _copy_of(self, reader: PageReader) -> Draft:
        """A draft holding the bytes of the page ``reader`` holds (given back if the copy fails)."""
        draft = self.reserve(reader.meta.size)
        try:
            draft.write(0, reader.view())
        except BaseException:
            self.abandon(draft)
            raise
        return draft

    def list_dir(self, dir_path: str, after: int = 0, limit: int = LISTING_BATCH) -> list[tuple[int, PageInfo]]:
        """Up to ``limit`` pages held here in directory ``dir_path`` that follow cursor ``after``
        (0: from the first), each with its own cursor (positive, to continue after it). Pages
        come in the order their names were first published; a page that replaces another keeps
        its place, so a listing read on from cursors sees each page that stays exactly once, and
        pages published or removed meanwhile, or not. The work is the pages returned, whatever
        the directory's or the store's size."""
        with self._lock:
            rows, cursors = self._index.listed(dir_path, after, limit)
            return list(zip(cursors.tolist(), self._infos(rows)))

    def directories(self) -> list[str]:
        with self._lock:
            return self._index.directories()

    def held_subdirectories(self, path: str) -> list[str]:
        """The names of directory ``path``'s subdirectories under which pages lie here (not on a
        named tier: ``ls`` lists this host's pages)."""
        with self._lock:
            return self._index.held_subdirectories(path)

    def exists_many(self, names: Iterable[str], size: int | None = None) -> list[bool]:
        """Whether each page is held here or on a named tier; no I/O. ``size``: only a page of
        that size counts (``_of_size``). Pages only a named tier holds are fetched ahead, in
        the background: their reads usually follow (and tell this host their size)."""
        names = list(names)
        if len(names) <= _FEW_NAMES:  # numpy's set-up costs more than a few lookups
            with self._lock:
                here = [self._size_here(self._index.find(name)) for name in names]
            local = [held >= 0 for held in here]
            found = local if size is None else [held == size for held in here]
        else:
            prepared = PageIndex.prepare_many(names)
            with self._lock:
                if size is None:
                    local = found = self._index.find_many(prepared).tolist()
                else:
                    held = self._index.sizes_many(prepared)
                    local, found = (held >= 0).tolist(), (held == size).tolist()
        if self._named and not all(local):
            remote = self._held_elsewhere(names, local, found)
            if remote:
                self._ahead.start([names[i] for i in remote])
            if remote and size is not None:
                with self._lock:
                    for i in remote:
                        found[i] = self._of_size(names[i], -1, size, elsewhere=True)
        return found

    def _held_elsewhere(self, names: list[str], local: list[bool], found: list[bool]) -> list[int]:
        """Which of the names not held here (``local``) a named tier may hold, marked in
        ``found``."""
        missing = [i for i, there in enumerate(local) if not there]
        remote = []
        for tier in self._named:
            for i, there in zip(missing, tier.contains_many([names[i] for i in missing])):
                if there and not found[i]:
                    found[i] = True
                    remote.append(i)
        return remote

    # -- accounting and shutdown -------------------------------------------------------

    def statistics(self) -> EngineStatistics:
        """The store's facts and every tier's (``StoreStatistics`` says what each means): the
        totals are sums over every tier (what this host counted); the room and the pages are the
        local tiers' (a named tier's room is every host's, not ours)."""
        with self._lock:
            index = self._index
            local = [_with_pages(tier.statistics(), index.pages_in_tier(position))
                     for position, tier in enumerate(self._tiers)]
            page_bytes, pages = index.used_bytes, index.pages
            misses, published = self._misses, self._published
        named = [tier.statistics() for tier in self._named]
        room = self._room(local)
        capacity, free = sum(t.capacity_bytes for t in room), sum(t.free_bytes for t in room)
        return EngineStatistics(
            capacity_bytes=capacity, used_bytes=capacity - free, free_bytes=free, page_bytes=page_bytes, pages=pages,
            **{**summed(local + named), "misses": misses}, published=published, tiers=tuple(local + named),
            fetch_ahead=self._ahead.statistics(), ram_budget=self.budget.statistics())

    def _room(self, local: list[TierStatistics]) -> list[TierStatistics]:
        """The tiers whose room is the store's: every local tier, but RAM with --write-through,
        where it holds copies of pages the tiers below hold too (counting it would count those
        pages twice, and its room as room a page takes without also taking theirs)."""
        return local[1:] if self.config.write_through and len(local) > 1 else local

    def sync(self) -> None:
        """Make the persistent tiers' writes durable (fsync)."""
        with self._lock:
            for tier in self._tiers[1:]:
                tier.sync()

    def stopping(self) -> None:
        """The daemon is stopping (a stop signal, or its mount unmounted lazily): the data
        plane's clients stop trusting its memory now, not after the requests in flight, the
        shared tier's flush and the write-down that come before ``close``; and reads waiting for
        room for a private copy are refused now, not at the end of their wait."""
        with self._lock:
            self._index.memory.closed()
        self._private.end_waits()

    def close(self) -> None:
        """Write RAM-only pages down (the most recent ones, as room allows), let every tier
        keep its part of the index (``persist``: the SSD tier's snapshot, so the next start need
        not scan), make the persistent tiers durable, release everything. A failing device stops
        the write-down, not the close. A second close does nothing: the tiers' files may belong
        to a new store by then."""
        if not self._closed:
            self._promoting.close()  # first: a promotion reads into RAM, which must still be there
        if self._named and not self._closed:
            self._ahead.close()  # so does a fetch from a named tier
            for tier in self._named:
                tier.close()  # first: write-behind releases pages, which takes the lock
        with self._lock, self._reporting():
            if self._closed:
                return
            self._closed = True
            self._index.memory.closed()  # the data plane's clients let go before anything moves
            try:
                held, written = self._index.pages, 0
                if len(self._tiers) > 1:
                    written = self._write_down_for_restart()
                self._log_stop(held, written)
                for position, tier in enumerate(self._tiers):
                    tier.persist(self._index.pages_in(position))
            finally:
                for tier in reversed(self._tiers):
                    try:
                        tier.close()
                    except OSError as exc:
                        log.warning("closing the %s tier failed: %s", tier.name, exc)

    # -- reading below RAM -------------------------------------------------------------

    def _read_below(self, name: str, tier: Tier, position: int, location: int, page: PageMeta,
                    info: PageInfo, slot: int | None, counted: bool = True, bounded: bool = False) -> PageReader | None:
        """Read and check a page an indexed tier below RAM holds, into ``slot`` (a promotion)
        or private memory; None when it changed meanwhile (look again). ``counted``: the read
        is a hit of the page's (not a promotion of the store's own)."""
        if slot is not None:
            buffer, release = self._ram.view(slot, page.size), self._unpinner(slot)
        else:
            buffer, release = self._private.buffer(page.size, bounded)
        try:
            result = tier.read_into(page, location, buffer, counted)
        except BaseException as exc:
            if slot is not None:
                self._give_back(slot)
            else:
                release()
            if isinstance(exc, OSError):
                raise DeviceError(f"{name}: the {tier.name} tier failed to read it: {exc}") from exc
            raise
        with self._lock, self._reporting():
            row = self._index.find(name)
            unchanged = row >= 0 and self._index.loc[row, position] == location and self._index.checksum[row] == page.checksum
            if result is ReadResult.OK:
                if unchanged:
                    self._index.hits[row] += counted
                    info = self._info(row)
                if slot is not None:
                    if unchanged and self._index.loc[row, RAM] < 0:
                        self._locate(row, RAM, slot)
                        self._ram.admit(row, slot, page.size, promoted=True)
                    else:  # a private copy for this reader only
                        self._ram.retire(slot)
                return PageReader(info, page, buffer, release)
            if slot is not None:
                self._ram.retire(slot)
                self._ram.unpin(slot)
            else:
                release()
            if unchanged:  # the copy is where the index says, and it is bad
                if result is ReadResult.MISMATCH:  # a damaged header or name, counted here: the tier
                    tier.counters.checksum_failures += 1  # cannot tell it from a record reclaimed meanwhile
                self._drop_bad_copy(row, tier, position, page, location)
        return None

    def _drop_bad_copy(self, row: int, tier: Tier, position: int, page: PageMeta, location: int) -> None:
        """A read found the row's copy in tier ``position`` bad: drop it, and the row with it
        when no tier holds it any more (PageCorrupt). A copy the tier cannot drop (its device
        fails the dead mark) stays indexed, as a scan after a crash would bring it back: a bit
        flipped on the way is then read right by the next read, a bad block fails it again."""
        try:
            tier.drop(page, location)
        except OSError as exc:
            if self._index.top_tier(row) != position:
                return  # a tier above holds it (a reader promoted it meanwhile): read it there
            raise PageCorrupt(f"{page.name}: checksum mismatch on the {tier.name} tier; page kept, as its "
                              f"copy could not be marked dead: {exc}") from exc
        self._locate(row, position, -1)
        if self._index.top_tier(row) < 0:
            self._forget(row)
            raise PageCorrupt(f"{page.name}: checksum mismatch on the {tier.name} tier; page dropped")

    def _open_named(self, name: str, ahead: bool = False, size: int | None = None,
                    bounded: bool = False) -> PageReader | None:
        """Find the page on a named tier, read and check it into a RAM slot and index it there
        (a promotion); None if it appeared locally meanwhile. Blocking. ``ahead``: for a read to
        come, so nothing is read when RAM has no room for it. ``size``: only a page of that size.
        ``bounded``: for a user who may not change the store (``PrivateReads``)."""
        with self._lock:
            self._named_reads[name] = self._named_reads.get(name, 0) + 1
        try:
            return self._open_named_counted(name, ahead, size, bounded)
        finally:
            with self._lock:
                left = self._named_reads.pop(name) - 1
                if left:
                    self._named_reads[name] = left
                else:
                    self._removed_while_read.discard(name)

    def _open_named_counted(self, name: str, ahead: bool, size: int | None, bounded: bool) -> PageReader | None:
        for tier in self._named:
            page = tier.find(name, reading=True) if tier.contains_many([name])[0] else None
            if page is None:
                continue
            if size is not None and page.size != size:
                with self._lock:  # so that ``holds`` and ``keep_existing`` know it is of another size
                    self._remember(name, page)
                continue
            with self._lock, self._reporting():
                slot = self._slot_for_promotion(page.size)
            if slot is None and ahead:
                return None
            if slot is not None:
                buffer, release = self._ram.view(slot, page.size), self._unpinner(slot)
            else:
                buffer, release = self._private.buffer(page.size, bounded)
            try:
                result = tier.read_into(page, 0, buffer)  # counts its own hits and failures
            except BaseException:
                if slot is not None:
                    self._give_back(slot)
                else:
                    release()
                raise
            if result is not ReadResult.OK:
                if slot is not None:
                    self._give_back(slot)
                else:
                    release()
                if result is ReadResult.CORRUPT:
                    raise PageCorrupt(f"{name}: checksum mismatch on the {tier.name} tier; its copy was removed")
                continue
            with self._lock, self._reporting():
                self._found.pop(name, None)
                removed = self._ahead.cancelled(name) or name in self._removed_while_read
                if removed or self._index.find(name) >= 0:
                    # Removed while it was read (it stays removed), or published here meanwhile.
                    if slot is not None:
                        self._ram.retire(slot)
                        self._ram.unpin(slot)
                    else:
                        release()
                    if removed and self._index.find(name) < 0:
                        raise PageNotFound(name)
                    return None
                if slot is None:  # no room in RAM: a private copy for this reader only
                    return PageReader(self._named_info(page), page, buffer, release)
                try:
                    self._index.make_room(name)
                except (OSError, MemoryError):  # no memory for the index: not promoted, the
                    self._ram.retire(slot)  # slot this reader's alone until it closes (it leaked)
                    return PageReader(self._named_info(page), page, buffer, release)
                row = self._index.add(name, page.size, page.checksum, page.mtime_ns, RAM, slot, offset=slot)
                self._index.hits[row] = 1
                self._ram.admit(row, slot, page.size, promoted=True)
                return PageReader(self._info(row), page, buffer, release, in_ram=True)
        with self._lock:
            self._count_miss()
        raise PageNotFound(name)

    def _fetch(self, name: str) -> bool:
        """Promote a page from a named tier into RAM ahead of its read (a fetcher thread)."""
        reader = self._open_named(name, ahead=True)
        if reader is None:
            return False
        reader.close()
        return True

    def _promote(self, name: str) -> bool:
        """Read a page a lower tier holds into a RAM slot and index it there (blocking); whether
        it was. Nothing happens when RAM has no room that is not held."""
        with self._lock:
            row = self._index.find(name)
            if row < 0 or self._index.loc[row, RAM] >= 0:
                return False
            position = self._index.top_tier(row)
            tier, location = self._tiers[position], int(self._index.loc[row, position])
            page, info = self._meta(row), self._info(row)
            slot = self._slot_for_promotion(page.size)
        if slot is None:
            return False
        reader = self._read_below(name, tier, position, location, page, info, slot, counted=False)
        if reader is None:
            return False
        reader.close()
        return True

    def _named_may_hold(self, name: str) -> bool:
        return any(tier.contains_many([name])[0] for tier in self._named)

    def _named_holds(self, row: int) -> bool:
        """Whether a named tier holds the row's page (from memory): one leaving the local tiers
        then stays in the store, and is no eviction."""
        return bool(self._named) and self._named_may_hold(self._index.name(row))

    def _remove_local(self, name: str, version: tuple[str, int] | None = None) -> bool | None:
        """Remove the page from the local tiers; whether there was one. ``version``: only that
        version of it (a rename's source); None, removing nothing, when the name holds another."""
        with self._lock:
            return self._unname(name, version)

    def _delete_named(self, name: str) -> bool:
        """Remove the page's copies from the named tiers (blocking, idempotent)."""
        removed = False
        for tier in self._named:
            if tier.remove_later(name):
                continue
            if tier.contains_many([name])[0] and tier.remove(name):
                removed = True
        return removed

    # -- internals (lock held) ---------------------------------------------------------

    def _unname(self, name: str, version: tuple[str, int] | None = None) -> bool | None:
        """``_remove_local``'s work."""
        row = self._index.find(name)
        if version is not None and row >= 0 and self._meta(row).version != version:
            return None
        if row >= 0:
            self._drop(row)  # first: a device that fails it leaves everything as it was
        self._found.pop(name, None)
        self._ahead.cancel(name)
        if name in self._named_reads:
            self._removed_while_read.add(name)
        return row >= 0

    def _counted_hit(self, row: int) -> None:
        index = self._index
        index.atime[row] = time.time_ns()
        index.hits[row] += 1
        self._ram.hit(row, int(index.size[row]))

    def _forget_found(self, name: str) -> None:
        """Another host wrote or removed the page: the facts found of it may be another
        version's, so the next lookup reads them again."""
        with self._lock:
            self._found.pop(name, None)

    def _count_miss(self, count: int = 1) -> None:
        self._misses += count
        for tier in self._tiers + self._named:
            tier.count_miss(count)

    def _pinned_reader(self, row: int, slot: int) -> PageReader:
        """A reader of the page's RAM copy (the hot path of every read: built with one lookup
        of each fact, about 5 us)."""
        self._ram.pin(slot)
        index = self._index
        name, size, checksum, mtime = index.name(row), int(index.size[row]), int(index.checksum[row]), int(index.mtime[row])
        info = PageInfo(name=name, size=size, tier=self._ram.name, checksum=checksum_text(checksum),
                        hits=int(index.hits[row]), mtime_ns=mtime, atime_ns=int(index.atime[row]))
        return PageReader(info, PageMeta(name, size, checksum, mtime), self._ram.view(slot, size),
                          self._unpinner(slot), in_ram=True)

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

    def _log_stop(self, held: int, written: int) -> None:
        """One line on what a stop keeps of the ``held`` pages for the next start, ``written``
        of them written down now, so that an operator who finds fewer pages after a restart
        knows where they went (the log said only "store closed"; found by review)."""
        shared = "; the shared tier keeps what it holds" if self._named else ""
        if len(self._tiers) == 1:
            if held:
                log.info("closing: the %d pages in RAM are dropped (no --disk)%s", held, shared)
            return
        lower = self._index.loc[:, 1:]
        left = sum(1 for row in self._ram.oldest_first() if not (lower[row] >= 0).any())  # in RAM only
        kept = self._index.pages - left
        log.info("closing: %d of the %d pages held are kept on the %s tier for the next start (%d written down "
                 "now); %d dropped: %d in RAM only past its room (the least recently used, or after a failed "
                 "write logged above), %d of its own overwritten to make that room%s", kept, held,
                 self._tiers[1].name, written, held - kept, left, held - kept - left, shared)

    def _write_down_for_restart(self) -> int:
        """Write RAM-only pages down, the most recent ones as room allows; how many were written.
        Room is counted for every RAM page, newest first, also for one whose lower copy is there
        already: writing
        reclaims the oldest regions, which may hold that copy (a promoted page, or a page
        published with write-through before those regions wrapped) and so make it RAM-only, and
        a page that was on disk must not lose its place to older ones written over it. Pages
        made RAM-only that way are written down in further passes. The tier counts the room as
        it packs the pages, in the order they are written (``_write_down_order``; a ring leaves
        the end of a region empty when the next record does not fit there): what is written in
        all fits, so nothing written here is reclaimed. A region whose first block cannot be
        written takes its room away (the ring passes over it, ``Tier.passed_over``): the pages
        not yet written are planned again, the newest that still fit, and the tier is fenced
        (``Tier.fence``) so that no write wraps onto the first pages written and the newest
        there before them."""
        below = self._tiers[1]
        newest_first = [row for row in reversed(self._ram.oldest_first()) if self._index.top_tier(row) == RAM
                        and below.fits(self._index.name(row).encode(), int(self._index.size[row]))]
        below.fence(True)
        try:
            return self._write_down(newest_first)
        finally:
            below.fence(False)

    def _write_down(self, newest_first: list[int]) -> int:
        """``_write_down_for_restart``'s passes over the pages planned, planned again after the
        ring passes over a region; how many pages were written."""
        below = self._tiers[1]
        order = self._write_down_plan(newest_first)
        tried: set[int] = set()
        written = 0
        while True:
            rows = [r for r in order if r not in tried and self._index.dir[r] >= 0
                    and self._index.top_tier(r) == RAM and not (self._index.loc[r, 1:] >= 0).any()]
            if not rows:
                return written
            for row in rows:
                tried.add(row)
                if self._index.dir[row] >= 0 and not (self._index.loc[row, 1:] >= 0).any():
                    view = self._ram.view(int(self._index.loc[row, RAM]), int(self._index.size[row]))
                    passed_over = below.passed_over()
                    if self._intact(row, view):
                        if self._write_below(self._meta(row), view, RAM, row) is None:
                            return written  # the device fails: what is left stays unwritten
                        written += 1
                    if below.passed_over() != passed_over:  # less room than planned
                        order = self._write_down_plan([r for r in newest_first if r not in tried])
                        break

    def _write_down_plan(self, newest_first: list[int]) -> list[int]:
        """The pages to write down, in the order to write them: the newest of these RAM pages
        whose records the tier holds (``Tier.holds``) in that order."""
        below = self._tiers[1]
        rank = {row: i for i, row in enumerate(newest_first)}
        order = self._write_down_order(newest_first)
        records = [(len(self._index.name(row).encode()), int(self._index.size[row])) for row in order]
        kept = _most_that_fit(len(newest_first), lambda count: below.holds(
            record for row, record in zip(order, records) if rank[row] < count))
        return [row for row in order if rank[row] < kept]

    def _write_down_order(self, newest_first: list[int]) -> list[int]:
        """The order the write-down writes these RAM pages in: those in RAM only, oldest first,
        then those whose copy below its writes reclaim, in the order the tier reclaims them, as
        its further passes write them. A copy the tier reclaims only after what is written now
        stays where it is (the write-down stops short of that), and is left out. Each pass
        writes in this order, and the pages of a pass lie in regions reclaimed after those of
        the pass before: what is written is this order less some pages, which ``Tier.holds``
        never finds to need more room."""
        below = self._tiers[1]
        oldest_first = newest_first[::-1]
        turns = {row: below.reclaim_turn(int(self._index.loc[row, 1])) for row in oldest_first
                 if self._index.loc[row, 1] >= 0}
        ram_only = [row for row in oldest_first if row not in turns]
        return ram_only + sorted((row for row, turn in turns.items() if turn), key=turns.__getitem__)

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

    def _infos(self, rows: np.ndarray) -> list[PageInfo]:
        """``_info`` of many rows, each column read once (a listing's batch: 3 us a page, not 20)."""
        index = self._index
        tiers = [self._tiers[t].name for t in np.argmax(index.loc[rows] >= 0, axis=1).tolist()]
        return [PageInfo(name=name, size=size, tier=tier, checksum=checksum_text(checksum), hits=hits,
                         mtime_ns=mtime, atime_ns=atime)
                for name, size, tier, checksum, hits, mtime, atime in zip(
                    index.names(rows), index.size[rows].tolist(), tiers, index.checksum[rows].tolist(),
                    index.hits[rows].tolist(), index.mtime[rows].tolist(), index.atime[rows].tolist())]

    def _named_info(self, page: PageMeta) -> PageInfo:
        tier = next((t.name for t in self._named if t.contains_many([page.name])[0]), self._named[0].name)
        return PageInfo(name=page.name, size=page.size, tier=tier, checksum=checksum_text(page.checksum),
                        hits=0, mtime_ns=page.mtime_ns, atime_ns=page.mtime_ns, held_here=False)

    def _meta(self, row: int) -> PageMeta:
        index = self._index
        return PageMeta(index.name(row), int(index.size[row]), int(index.checksum[row]), int(index.mtime[row]))

    def _make_room(self, size: int) -> int:
        """A RAM slot for ``size`` bytes, made by evicting (``_victims_for``). Pages open for
        reading are passed over: evicting them would free nothing and take the page from under
        its reader. Nothing is evicted when evicting every page left would not free a slot (each
        slab holds a reader's or a draft's): the store stays as it was, and the caller goes
        another way."""
        while True:
            offset = self._ram.allocate(size)
            if offset is not None:
                return offset
            victims = self._victims_for(size)
            if not victims:
                raise StoreFull(f"no room for a page of {size} bytes: the RAM tier is pinned by readers and drafts")
            for row in victims:
                self._evict_from_ram(row)

    def _victims_for(self, size: int) -> list[int]:
        """The pages to evict for a slot of ``size`` bytes: in LRU order up to the first of that
        slot size, as long as they are no more than the pages of a slab that could be emptied
        instead (that of the least recently used page whose slab nothing holds); else that
        slab's pages, which frees it for the new size. Evicting in LRU order across sizes until
        some slab happened to empty took out nearly the whole tier for the first page of a new
        size (1,005 of 1,024 pages, read in no order of slabs, for one 1 MiB page)."""
        victims = self._evictable()
        row, slot = next(victims, (-1, -1))
        if row < 0 or self._ram.serves(slot, size):
            return [row] if row >= 0 else []
        if not self._ram.frees_room(size):  # (asked of the slabs' counts: no walk of the pages)
            return []
        walked, slab = [row], self._ram.slab_if_free_to_empty(slot)
        for row, slot in victims:
            if slab is not None and len(walked) >= slab[2]:
                break
            walked.append(row)
            if self._ram.serves(slot, size):
                return walked
            slab = slab or self._ram.slab_if_free_to_empty(slot)
        return [] if slab is None else self._index.rows_located_between(RAM, slab[0], slab[1]).tolist()

    def _evictable(self) -> Iterator[tuple[int, int]]:
        """(row, RAM slot) of the pages that may be evicted, least recently used first (lazily:
        stop before changing the RAM tier)."""
        loc = self._index.loc
        for row in self._ram.victims():
            slot = int(loc[row, RAM])
            if not self._ram.is_pinned(slot):
                yield row, slot

    def _evict_from_ram(self, row: int) -> None:
        """Move the page out of RAM: down to a lower tier unless one holds it already, else
        out of the index (a demotion still when a named tier holds it: it is served from
        there, not lost)."""
        index = self._index
        slot = int(index.loc[row, RAM])
        demoted = False
        if len(self._tiers) > 1:  # (in a RAM-only store the row simply goes)
            if not (index.loc[row, 1:] >= 0).any():
                view = self._ram.view(slot, int(index.size[row]))
                if self._intact(row, view):
                    self._write_below(self._meta(row), view, RAM, row)
            self._locate(row, RAM, -1)
            demoted = index.top_tier(row) >= 0
        if not demoted:
            demoted = self._named_holds(row)
            self._forget(row)
        self._ram.release(row, slot, demoted)

    def _intact(self, row: int, view: memoryview) -> bool:
        """Whether a RAM page's bytes still match its checksum, checked whenever the page moves
        down: the data plane's clients write RAM pages themselves, and a page scribbled on in
        RAM must not spread to a tier where it would outlive the daemon. Counted when not."""
        if page_checksum(view) == int(self._index.checksum[row]):
            return True
        self._ram.counters.checksum_failures += 1
        log.warning("%s: its bytes in RAM fail its checksum; dropped, not moved down", self._index.name(row))
        return False

    def _write_below(self, page: PageMeta, payload, above: int, row: int = -1) -> tuple[int, int] | None:
        """Write the page to the first indexed tier below ``above`` that takes it: (tier,
        location), or None. With ``row`` the index records it; without, a device failure is
        raised (a publish must fail), with it the page simply stays where it was."""
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
                self._locate(row, position, location)
            return position, location
        return None

    def _locate(self, row: int, position: int, location: int) -> None:
        """The index learns where the row's page is in tier ``position`` now (-1: not there),
        and where its bytes begin in the file that tier shares with the data plane."""
        offset = -1 if location < 0 else self._tiers[position].byte_offset(
            location, len(self._index.name(row).encode()) if position else 0)
        self._index.locate(row, position, location, offset)

    def _reclaimed(self, position: int, start: int, end: int) -> int:
        """Tier ``position`` is about to overwrite [start, end): forget what lives only there;
        how many pages thereby left the store."""
        index = self._index
        left = 0
        for row in index.rows_located_between(position, start, end).tolist():
            self._locate(row, position, -1)
            if index.top_tier(row) < 0:
                left += not self._named_holds(row)
                self._forget(row)
        return left

    def _drop(self, row: int, keep_place: bool = False) -> int:
        """Remove a page from the store at the caller's request: its lower copies invalidated
        first, then by name, its RAM slot when its readers are done. ``keep_place``: a new page
        of the name follows at once; returns the listing cursor it takes over. Raises
        DeviceError, the page kept, when a lower copy cannot be invalidated: a scan after a
        crash would bring it back (there is one indexed tier below RAM, so nothing changed)."""
        page = self._meta(row)
        locations = self._index.loc[row].tolist()
        for position, location in enumerate(locations[RAM + 1 :], RAM + 1):
            if location >= 0:
                try:
                    self._tiers[position].drop(page, location)
                except OSError as exc:
                    raise DeviceError(f"{page.name}: the {self._tiers[position].name} tier failed to "
                                      f"invalidate its copy: {exc}") from exc
        return self._unlist(row, locations[RAM], keep_place)

    def _supersede(self, row: int) -> int:
        """``_drop`` for the old page of a publish that must go through though its lower copy
        cannot be invalidated (``_replace``): the tiers let go of it (``Tier.supersede``), since
        a scan keeps the newer copy written there."""
        page = self._meta(row)
        locations = self._index.loc[row].tolist()
        for position, location in enumerate(locations[RAM + 1 :], RAM + 1):
            if location >= 0:
                self._tiers[position].supersede(page, location)
        return self._unlist(row, locations[RAM], keep_place=True)

    def _unlist(self, row: int, slot: int, keep_place: bool) -> int:
        """The end of a drop: the row's RAM slot goes when its readers are done, then the row."""
        if slot >= 0:
            self._ram.forget(row, slot)
        return self._index.remove(row, keep_place)

    def _forget(self, row: int) -> None:
        """The page left its last tier on the store's own initiative: tell the listeners."""
        page = self._meta(row)
        self._gone.append((page.name, page.version))
        self._index.remove(row)

    def _reporting(self) -> _GoneReport:
        return self._gone_report


def _most_that_fit(count: int, fit: Callable[[int], bool]) -> int:
    """The largest n <= ``count`` for which ``fit(n)`` holds, where ``fit`` holds below any n it
    holds for (0 is taken to fit): a binary search, as a check can be long."""
    if fit(count):
        return count
    low, high = 0, count - 1  # fit(low) holds, fit(high + 1) does not
    while low < high:
        middle = (low + high + 1) // 2
        if fit(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _with_pages(facts: TierStatistics, pages: int) -> TierStatistics:
    return dataclasses.replace(facts, pages=pages)


class _Events:
    """What a tier tells the engine (``TierEvents``), for its position in the chain (-1: a
    named tier)."""

    __slots__ = ("store", "position")

    def __init__(self, store: PageStore, position: int) -> None:
        self.store, self.position = store, position

    def reclaiming(self, start: int, end: int) -> int:
        return self.store._reclaimed(self.position, start, end)

    def changed(self, name: str) -> None:
        self.store._forget_found(name)


class _Recovered:
    """Where an indexed tier puts the pages it recovers (``RecoverySink``): its index column."""

    __slots__ = ("index", "position", "tier")

    def __init__(self, index: PageIndex, position: int, tier: Tier) -> None:
        self.index, self.position, self.tier = index, position, tier

    def load(self, pages: PageColumns) -> None:
        self.index.load(self.position, pages, self.tier.byte_offset(pages.location, pages.name_lengths()))

    def found(self, page: PageMeta, location: int) -> tuple[PageMeta, int] | None:
        index = self.index
        older = index.find(page.name)
        replaced = None
        if older >= 0:
            replaced = (PageMeta(page.name, int(index.size[older]), int(index.checksum[older]), 0),
                        int(index.loc[older, self.position]))
            index.remove(older)
        index.add(page.name, page.size, page.checksum, page.mtime_ns, self.position, location,
                  offset=self.tier.byte_offset(location, len(page.name.encode())))
        return replaced


class _GoneReport:
    """Hands the pages gathered in ``_gone`` during one locked operation to the listeners."""

    __slots__ = ("store",)

    def __init__(self, store: PageStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        store = self.store
        if store._gone:
            gone, store._gone = store._gone, []
            for listener in store._listeners:
                listener(gone)
