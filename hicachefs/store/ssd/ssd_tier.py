"""The SSD tier: one preallocated arena file in the disk directory, holding a RegionLog.

Chooses the region size: four of the largest records, so that the tail a region cannot use
(a record never straddles two) wastes at most a quarter and usually a few percent; at
least 16 MiB; and at least 8 regions, so that reclaiming one drops at most an eighth of the
tier. A small tier gets smaller regions, never smaller than one record of the largest page
(the longest name, ``max_page_size``): a page that the store takes must fit below, or it
would be evicted while the disk stays empty (found by review). A tier too small for
``MIN_REGIONS`` such regions is refused (``smallest_disk``).

Making room is the tier's own business: when the ring wraps, the oldest region is reclaimed,
the engine it is bound to is told which locations are about to be overwritten
(``TierEvents.reclaiming``), and the pages that thereby leave the store are counted here as
evictions. Writes are serialised by the store's lock; ``read_into`` may run outside it (see
RegionLog).

The arena is the tier's alone (``FileDevice`` locks it; a file at its name that is not ours is
refused, never reformatted: ``region_log.check_ours``).

So is its recovery: at start the tier gives the engine its pages (``recover``), from the index
snapshot that the last clean close wrote (``persist``) when that still describes the arena
exactly, else by scanning the arena (see ``snapshot.py`` for when a
snapshot is trusted). A snapshot spares the scan, not the checks: every read still verifies
the record's header and payload checksum, so a block that went bad while the daemon was down
is caught at its first read, as it is in a running store.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from hicachefs.store.ssd import doomed, snapshot
from hicachefs.store.ssd.device import FileDevice
from hicachefs.store.index import PageColumns
from hicachefs.store.ssd.region_log import RegionLog, check_ours, payload_offset, record_length
from hicachefs.store.statistics import TierCounters
from hicachefs.store.pages import PageMeta
from hicachefs.store.tier import (LONGEST_NAME_BYTES, ReadResult, RecoveryListener, RecoveryProgress, RecoverySink,
                                  Tier, TierEvents)

log = logging.getLogger(__name__)

ARENA_NAME = "hicachefs.arena"
_MiB = 1 << 20


#: The fewest regions a disk tier has: the ring reclaims one while writing another, and it
#: passes over a region whose first block cannot be written for the one after only with a
#: third (``RegionLog._reclaim_next``); a clean close's write-down then has two regions.
MIN_REGIONS = 3


def largest_record(max_page_size: int) -> int:
    """Bytes the record of the largest page takes: the longest name and ``max_page_size``."""
    return record_length(LONGEST_NAME_BYTES, max_page_size)


def smallest_disk(max_page_size: int) -> int:
    """The smallest ``disk_bytes`` for pages up to ``max_page_size``: the superblock's block
    and ``MIN_REGIONS`` regions, each holding the largest record in whole 4 KiB blocks."""
    return 4096 + MIN_REGIONS * _whole_blocks(largest_record(max_page_size))


def _whole_blocks(size: int) -> int:
    return (size + 4095) // 4096 * 4096


def region_size(capacity: int, max_page_size: int) -> int:
    """The region size for a tier of ``capacity`` bytes (see the module's docstring); raises
    ValueError for one smaller than ``smallest_disk``."""
    if capacity < smallest_disk(max_page_size):
        raise ValueError(f"a disk tier of {capacity:,} bytes is too small for pages of up to {max_page_size:,} "
                         f"bytes: it takes {MIN_REGIONS} regions that each hold the largest page, "
                         f"{smallest_disk(max_page_size):,} bytes at least")
    region = max(16 * _MiB, (4 * largest_record(max_page_size) + _MiB - 1) // _MiB * _MiB)
    if (capacity - 4096) // region < 8:
        region = max(_whole_blocks(largest_record(max_page_size)), (capacity - 4096) // 8 // 4096 * 4096)
    return region


def check_disk_dir(directory: Path) -> None:
    """Raise ``ArenaRefused`` for what opening the tier in ``directory`` would refuse about its
    arena (a symlink, a file of another type or content, one another daemon holds), changing
    nothing: the command line says so before it starts a daemon. No arena yet is fine."""
    path = Path(directory) / ARENA_NAME
    if not os.path.lexists(path):
        return
    device = FileDevice(path)
    try:
        check_ours(device)
    finally:
        device.close()


class SsdTier(Tier):
    name = "disk"

    def __init__(self, directory: Path, capacity: int, max_page_size: int,
                 device: FileDevice | None = None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        device = device or FileDevice(directory / ARENA_NAME)
        try:
            file_id, entries, anew = self._read_doomed()
            self.log = RegionLog(device, capacity, region_size(capacity, max_page_size), largest_record(max_page_size),
                                 anew)
        except BaseException:
            device.close()
            raise
        self.counters = TierCounters()
        self._events: TierEvents | None = None
        # Per name, the offsets of its records let go of (``supersede``) though they are live on
        # the disk: each is older than the name's copy here, which must not be marked dead first.
        self._left_live: dict[str, list[int]] = {}
        # The durable list of such records (``doomed``), by offset: a scan takes them for dead.
        self._doomed: dict[int, int] = entries if file_id == self.log.file_id else {}
        if anew:
            self._undamage_doomed()

    def _undamage_doomed(self) -> None:
        """Write the damaged list anew, empty, for the arena formatted anew: left damaged, it
        would have every later start drop the arena's pages again."""
        try:
            self._write_doomed()
        except OSError as exc:
            log.warning("%s could not be written anew (%s): the next start drops the arena's pages again",
                        self.directory / doomed.DOOMED_NAME, exc.strerror or exc)

    def _read_doomed(self) -> tuple[int, dict[int, int], str | None]:
        """The list of records let go of while live (``doomed``): its file id and entries, and
        why the arena is formatted anew, when the list is damaged: which records are stale is
        then not known, and any of them might bring a replaced page's older version back, so
        the arena's pages are dropped (a list is written whole, by rename: damage is rare)."""
        try:
            return *doomed.read(self.directory), None
        except doomed.ListDamaged as exc:
            return 0, {}, (f"its list of records let go of while live ({self.directory / doomed.DOOMED_NAME}) "
                           f"is unusable: {exc}; what the arena held is dropped, as any of it might be such a record")

    def bind(self, events: TierEvents) -> None:
        self._events = events

    def _reclaiming(self, start: int, end: int) -> None:
        """The region ``start``-``end`` is about to be written over: its pages go. The records
        left live elsewhere are marked dead now, where the disk lets it: the ring passes over
        a region whose erase fails, so the region reclaimed may hold a name's newest copy while
        an older record of it, left live, stays in the region passed over, for the scan after
        a crash to bring back (found by review)."""
        if self._events is not None:
            self.counters.evictions += self._events.reclaiming(start, end)
        self._undoom([offset for offset in self._doomed if start <= offset < end])
        for name, offsets in list(self._left_live.items()):
            offsets[:] = [offset for offset in offsets if not start <= offset < end]
            try:
                self._mark_left_live(name)
            except OSError:
                pass  # kept in mind, tried again at the next reclaim, the name's drop and the stop

    @property
    def capacity_bytes(self) -> int:
        return self.log.capacity

    @property
    def used_bytes(self) -> int:
        return self.log.used_bytes

    @property
    def free_bytes(self) -> int:
        return self.log.free_bytes

    def allocated(self, name_length: int, size: int) -> int:
        return record_length(name_length, size)

    def fits(self, name: bytes, size: int) -> bool:
        return self.log.fits(len(name), size)

    def shared_fd(self) -> int | None:
        return self.log.device.fd

    def byte_offset(self, location, name_length):
        return payload_offset(location, name_length)

    def holds(self, records: Iterable[tuple[int, int]]) -> bool:
        return self.log.holds(record_length(name_length, size) for name_length, size in records)

    def reclaim_turn(self, location: int) -> int:
        return self.log.reclaim_turn(location)

    def fence(self, on: bool) -> None:
        self.log.fence(on)

    def passed_over(self) -> int:
        return self.log.passed_over

    def recover(self, sink: RecoverySink, progress: RecoveryListener | None = None) -> None:
        """Give ``sink`` this tier's pages: loaded from the snapshot if it describes the arena
        exactly, else scanned (then a name found twice, when a process died between writing a
        newer copy and invalidating the older, keeps the newer). ``progress`` hears how it
        goes; its last report has ``finished`` set."""
        started = time.monotonic()
        report = progress or (lambda _: None)
        try:
            if self.log.formatted:
                raise snapshot.SnapshotInvalid(self.log.formatted)
            loaded = snapshot.read(self.directory, self.log)
        except snapshot.SnapshotInvalid as exc:
            reason = str(exc)
            if self.log.clean_token() is not None:  # unmounted cleanly, yet no usable snapshot
                log.warning("%s: %s; scanning the arena instead", self.directory / snapshot.SNAPSHOT_NAME, reason)
        else:
            self.log.restore(loaded.log)
            sink.load(loaded.pages)
            report(RecoveryProgress("snapshot", "", len(loaded.pages.size), 0, 0, time.monotonic() - started, True))
            return
        report(RecoveryProgress("scan", reason, 0, 0, 0, time.monotonic() - started, False))
        pages = 0

        def corrupt() -> None:
            self.counters.checksum_failures += 1

        extent = [0]  # bytes the scan walks: the regions holding records

        def scanned(done: int, total: int, found: int) -> None:
            extent[0] = total
            report(RecoveryProgress("scan", reason, found, done, total, time.monotonic() - started, False))

        superseded = []  # let go of once the scan has numbered what writing hands out next
        for record in self.log.scan(corrupt, scanned, self._doomed):
            page = PageMeta(record.name, record.size, record.checksum, record.mtime_ns)
            older = sink.found(page, record.offset)
            if older is not None:
                superseded.append(older)
            else:
                pages += 1
        for older in superseded:
            self.supersede(*older)
        report(RecoveryProgress("scan", reason, pages, extent[0], extent[0], time.monotonic() - started, True))

    def persist(self, pages: PageColumns) -> None:
        """Save the engine's index of this tier's pages and the log's state, then mark the arena
        clean, so the next start loads them instead of scanning. A failure is logged: that start
        scans. The records let go of while live (``supersede``) are marked dead first, else no
        snapshot is written: a start from one would not know them, and a removal of their name
        then would leave one for the scan after a crash to bring back. A scan now finds each older
        than its name's copy, and lets go of it again."""
        try:
            for name in list(self._left_live):
                self._mark_left_live(name)
            self.log.sync()  # the records first: a snapshot never names a record that is not durable
            token = os.urandom(16)
            snapshot.write(self.directory, token, self.log, pages)
            self.log.mark_clean(token)
        except OSError as exc:
            log.warning("could not write the disk tier's index snapshot (the next start scans): %s", exc)

    def write(self, page: PageMeta, payload) -> int:
        try:
            offset = self.log.append(page.name.encode(), payload, page.checksum, page.mtime_ns, self._reclaiming)
        except OSError:
            self.counters.io_errors += 1
            raise
        self.counters.bytes_in += page.size
        return offset

    def read_into(self, page: PageMeta, location: int, out: memoryview, counted: bool = True) -> ReadResult:
        try:
            result = self.log.read_into(location, page.name.encode(), page.checksum, out)
        except OSError:
            self.counters.io_errors += 1
            raise
        if result is ReadResult.OK:
            self.counters.hits += counted
            self.counters.bytes_out += page.size * counted
        elif result is ReadResult.CORRUPT:
            self.counters.checksum_failures += 1
        return result

    def drop(self, page: PageMeta, location: int) -> None:
        """Mark the page's record dead, after the older records of its name left live
        (``supersede``): with the page's gone, a scan would bring the newest of those back.
        Raises ``OSError`` (counted) when the device fails: the record stays live, and a scan
        would bring the page back, so the caller keeps it too."""
        try:
            self._mark_left_live(page.name)
            self.log.invalidate(location, len(page.name.encode()), page.size)
        except OSError:
            self.counters.io_errors += 1
            raise

    def supersede(self, page: PageMeta, location: int) -> None:
        """``Tier.supersede``: a record that cannot be marked dead is no longer counted, and
        kept in mind as live, until its region is reclaimed or its mark is written, before its
        name's copy is dropped. It is listed, durably, before this returns (``doomed``): a scan
        after a crash takes it for dead. Without the list, the scan passed over it only while it
        found the copy that replaced it; that copy's region dropped (its first header damaged,
        or zeros), it served the older version (found by review). When the list cannot be
        written either, or the arena is not known durable (``_unsure_durable``), that is logged
        and counted, and the record stays as before."""
        try:
            self.drop(page, location)
        except OSError:
            self.log.forget(location, len(page.name.encode()), page.size)
            self._left_live.setdefault(page.name, []).append(location)
            unsure = self._unsure_durable()
            if unsure is not None:
                self._not_listed(page, unsure)
                return
            self._doomed[location] = self.log.next_seq
            try:
                self._write_doomed()
            except OSError as exc:  # listed at the list's next change, which it stays in memory for
                self._not_listed(page, exc.strerror or str(exc))

    def _unsure_durable(self) -> str | None:
        """Why the arena's writes so far are not known durable, or None once an fsync made them
        so. The list must name the record an offset holds now, not one a power loss would bring
        back there, another page's newest copy (found by review); and after any failed fsync of
        the arena that is not known: Linux may never write what it did not (found by review)."""
        if self.log.fsync_failed:  # for good: no fsync after it says more
            return "an earlier fsync of the arena failed"
        try:
            self.log.sync()
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    def _not_listed(self, page: PageMeta, why: str) -> None:
        self.counters.io_errors += 1
        log.warning("%s: an older record of %s, whose dead mark failed, could not be listed either (%s): a crash "
                    "that also loses its newer copy would bring it back", self.directory / doomed.DOOMED_NAME,
                    page.name, why)

    def _mark_left_live(self, name: str) -> None:
        """Mark dead the records of ``name`` let go of while live; raises OSError when one fails."""
        offsets = self._left_live.get(name)
        while offsets:
            self.log.mark_dead(offsets[-1])
            self._undoom([offsets.pop()])
        self._left_live.pop(name, None)

    def _undoom(self, offsets: list[int]) -> None:
        """Take off the list the records at ``offsets``, marked dead or reclaimed, once the arena
        is fsynced: a power loss before it would undo the mark or the erase, and leave the record
        live and no longer listed (found by review). When the fsync or the list's write fails, or
        one failed before (``_unsure_durable``), the entries stay listed (logged): an entry names
        a record dead either way, and none written after it (numbered above its bound)."""
        gone = set(offsets)
        left = {offset: bound for offset, bound in self._doomed.items() if offset not in gone}
        if len(left) == len(self._doomed):
            return
        unsure = self._unsure_durable()
        if unsure is None:
            try:
                doomed.write(self.directory, self.log.file_id, left)
            except OSError as exc:
                unsure = exc.strerror or str(exc)
        if unsure is not None:
            log.warning("%s keeps records that are dead or written over (%s)", self.directory / doomed.DOOMED_NAME,
                        unsure)
            return
        self._doomed = left

    def _write_doomed(self) -> None:
        doomed.write(self.directory, self.log.file_id, self._doomed)

    def sync(self) -> None:
        self.log.sync()

    def close(self) -> None:
        self.log.close()
