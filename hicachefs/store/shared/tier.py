"""The shared tier: pages in a directory on a distributed filesystem that several hosts mount.

hicachefs rides on the operator's filesystem (GlusterFS, CephFS, NFS, Lustre, JuiceFS, 3FS)
instead of becoming a cluster itself: every host's daemon writes the pages it publishes there
(write-behind), answers "is it there?" from memory (``presence``, kept fresh by the hosts'
``journal`` announcements and a slow ``sweep``), and reads a page it lacks from there, checked
against its checksum. Pages are found by name, so the ``location`` arguments of the ``Tier``
interface are ignored.

The filesystem may be slow, full or gone. Every filesystem call runs on a ``CallGuard`` thread
with a deadline, so no caller waits past it; a call that hangs or keeps failing marks the tier
unavailable, and then ``contains_many`` answers misses at once, ``find`` and ``read_into`` miss,
``offer`` drops, and the maintenance thread probes the filesystem every ``retry_s`` until it
answers. A full filesystem (ENOSPC) only pauses writes for ``retry_s`` and makes the evictor
free room; reads go on.

With ``capacity_bytes`` set, each host removes the oldest pages (by file mtime) when the tier
holds more, a bounded number per tick. Removals are idempotent: two hosts evicting the same
page, or a page another host removed (ENOENT, ESTALE), is a plain miss.

Thread-safe. ``contains_many``, ``offer`` and ``statistics`` never block and never raise (the
engine calls them on its event loop). ``find``, ``read_into``, ``write`` and ``drop`` block up
to their deadline (call them from a worker thread). ``close`` returns within a few deadlines
even when the filesystem hangs.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import itertools
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR
from typing import NamedTuple

from hicachefs.store.shared import engine_checks
from hicachefs.store.shared import format as page_format
from hicachefs.store.shared.device import GONE, RACE_PAUSES_S, DirectoryDevice
from hicachefs.store.shared.failure_log import FailureLog
from hicachefs.store.shared.guard import CallGuard, GuardStatistics, Overtaken, Refused
from hicachefs.store.shared.journal import Journal
from hicachefs.store.shared.layout import Layout, Place, place
from hicachefs.store.shared.owed import OwedRemovals
from hicachefs.store.shared.presence import PresenceIndex
from hicachefs.store.shared.sweep import Sweeper, SweepStatistics
from hicachefs.store.budget import Share
from hicachefs.store.shared.write_behind import WriteBehind, WriteBehindStatistics
from hicachefs.store.pages import page_checksum
from hicachefs.store.statistics import TierCounters, TierStatistics
from hicachefs.typed_stats import level, part, total
from hicachefs.store.pages import PageMeta
from hicachefs.store.tier import ReadResult, Tier, TierEvents

_log = logging.getLogger(__name__)

_FULL = (errno.ENOSPC, errno.EDQUOT)
#: Names a host remembers in each of its lists of pages (removed here, not written behind, to
#: remove once the volume is back): some 10 MB each at most.
REMOVED_REMEMBERED = 100_000
#: How much later than a removal owed to the volume since before this start a file of its name
#: must have been written to be left when the removal is applied (``_remove_file``): a write of
#: the name since, by another host while this one was stopped, or by this one before a kill.
#: Generous, as the removal's time is this host's clock and the file's its writer's or its
#: server's: a removed page's own file must not pass for a later one (it would come back), a later
#: one going is a miss. Removals noted in this run go unconditionally, as they always did.
WRITTEN_SINCE_NS = 60_000_000_000
#: Pages a read found gone that wait to be looked at again (``_vanished``); past that, forgotten at once.
VANISHED_REMEMBERED = 1024
#: Pages announced at another size than counted that wait for a look at their file's size
#: (``_resized``); past that, their announced size counts until the next sweep.
RESIZED_REMEMBERED = 1024
#: The longest a page a read found gone is still counted, whatever the engine's entry cache.
VANISHED_KEPT_MAX_S = 5.0
#: The time a tick may spend on each of its backlogs (names found gone looked at again, one stat
#: each; removals owed since the volume was away, a stat and an unlink each), so that a volume slow
#: to answer does not hold up the journal and the sweep (found by review).
BACKLOG_BUDGET_S = 0.02
#: How often the maintenance thread keeps the removals owed to the volume on disk, while they change
#: (``owed``): a daemon killed loses those of the last period.
OWED_SAVE_S = 1.0
_MiB = 1 << 20


def _note_newest(names: collections.OrderedDict, name: str, value=None) -> None:
    """Note ``name`` as the newest of ``names``, forgetting the oldest past ``REMOVED_REMEMBERED``."""
    names[name] = value
    names.move_to_end(name)
    while len(names) > REMOVED_REMEMBERED:
        names.popitem(last=False)


def _stored_size(page: PageMeta) -> int:
    """Bytes the page's file takes (what the tier's capacity counts)."""
    return page_format.header_length(page.name) + page.size


class _Opened:
    """A page file ``find`` opened and checked, kept for the ``read_into`` that usually follows,
    which then skips the open and the header read (two network round trips). ``ahead``: the
    start of the payload, read with the header when ``find`` was told a read follows."""

    __slots__ = ("fd", "page", "payload_offset", "ahead", "at")

    def __init__(self, fd: int, page: PageMeta, payload_offset: int, ahead: memoryview) -> None:
        self.fd = fd
        self.page = page
        self.payload_offset = payload_offset
        self.ahead = ahead
        self.at = time.monotonic()


class _Root(NamedTuple):
    """Which directory the root is (``inode``: None while it is missing; ``device``: its
    st_dev) and the mount it lies on (its mountpoint, mount ID and filesystem: type, source and
    the directory of it mounted there)."""

    inode: int | None
    device: int | None
    mount: tuple[str, int, str] | None


def _came(seen: _Root, now: _Root, journaled: Callable[[], bool]) -> bool:
    """Whether the root, ``seen`` before and looked at ``now``, is a volume or a directory that
    came since, to be taken up: a mount appeared over it (its mount deeper), the same directory
    is mounted again at the same mountpoint (its inode number kept, as GlusterFS's and JuiceFS's
    are, or the same filesystem, whose root holds the tier's journal directory: ``journaled()``,
    for an engine that numbers inodes anew at each mount), or it was made again on its mount.
    Not when it is missing on its mount, or its mount lies above the one seen (that one went, and
    the path names its bare mountpoint), nor when another directory shows at the same mountpoint:
    the volume unmounted may reveal one mounted under it (a placeholder, of another filesystem),
    which no other host sees (found by review), even one holding a journal directory that a tier
    made there while the volume was not mounted."""
    if seen.mount is None or now.mount is None:
        return False
    if now.mount == seen.mount:
        return now.inode is not None and now.inode != seen.inode
    mountpoint, seen_mountpoint = now.mount[0], seen.mount[0]
    if mountpoint == seen_mountpoint:
        same_filesystem = now.inode is not None and now.mount[2] == seen.mount[2]
        return now.inode == seen.inode or (same_filesystem and journaled())
    return mountpoint.startswith(seen_mountpoint.rstrip("/") + "/")


class _Corrupt(Exception):
    """Raised inside a guarded call: the file is damaged (and was removed)."""


@dataclass(frozen=True)
class SharedTierStatistics(TierStatistics):
    """The shared tier's facts beside every tier's: whether it takes writes, its bound, and
    its parts' (write-behind, the guarded calls, the sweep, pages fetched ahead)."""

    writable: bool = level(True)
    size_bound: bool = level(False)
    fs_free_bytes: int | None = level(None)
    journal_announced: int = total()
    journal_received: int = total()
    journal_pending: int = level()
    write_behind: WriteBehindStatistics = part(WriteBehindStatistics)
    guard: GuardStatistics = part(GuardStatistics)
    sweep: SweepStatistics = part(SweepStatistics)


class SharedTier(Tier):
    name = "shared"
    indexed = False

    def __init__(self, root: Path, capacity_bytes: int | None, *, device=None, deadline_s: float = 0.5,
                 io_threads: int = 4, writers: int = 2, queue_pages: int = 256, queue_bytes: int | Share = 256 * _MiB,
                 queue_lag_s: float = 0.5, tick_s: float = 0.1, poll_s: float = 0.2, retry_s: float = 1.0,
                 sweep_interval_s: float = 60.0, sweep_budget_s: float = 0.02, journal_keep_s: float = 600.0,
                 temp_keep_s: float = 600.0, oldest_kept: int = 4096, evictions_per_tick: int = 64,
                 min_bandwidth: float = 32 * _MiB, recent_opens: int = 64, owed_dir: Path | None = None) -> None:
        """``root``: the directory on the distributed filesystem (made if missing).
        ``capacity_bytes``: the size bound; None leaves the filesystem's free space as the limit.
        ``device``: the object making the filesystem calls (tests pass a ``FaultyDevice``).
        ``deadline_s``: the longest a metadata call may take (a data call adds its size at
        ``min_bandwidth``). ``queue_pages``/``queue_bytes`` bound write-behind (and the RAM it
        keeps pinned: a share of the store's RAM budget, or a number of bytes), ``queue_lag_s`` the time a page may wait in that queue. ``tick_s``: the
        maintenance period; ``poll_s``: how often other hosts' journals are read; ``retry_s``:
        how often an unavailable filesystem is probed; ``sweep_interval_s``: the pause between
        two sweeps; ``sweep_budget_s``: the time a tick may spend sweeping (at least one
        directory), which keeps the sweep's share of the interpreter small beside the daemon's
        event loop. ``journal_keep_s``, ``temp_keep_s``: how long a journal file, a temporary
        file, stays once this host saw it unchanged (``unchanged``). ``oldest_kept``: eviction
        candidates a sweep notes. ``owed_dir``: the local directory (the disk tier's) that keeps
        the removals owed to the volume across a stop and a start (``owed``); None: they are
        dropped at the close, with a warning."""
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive or None, got {capacity_bytes}")
        self.root = Path(root)
        self._device = device if device is not None else DirectoryDevice()
        self._layout = Layout(self.root)
        self._limit = capacity_bytes
        self._deadline_s = deadline_s
        self._min_bandwidth = min_bandwidth
        self._tick_s = tick_s
        self._poll_s = poll_s
        self._retry_s = retry_s
        self._sweep_interval_s = sweep_interval_s
        self._sweep_budget_s = sweep_budget_s
        self._evictions_per_tick = evictions_per_tick
        self._recent_max = recent_opens
        self._payload_sizes: dict[str, int] = {}  # pool directory -> size of the last page read
        self.counters = TierCounters()
        self.failure_log = FailureLog(_log)  # failed writes of pages and of the journal
        self._lock = threading.Lock()  # counters, recent opens, fds to close, full state
        self._recent: collections.OrderedDict[str, _Opened] = collections.OrderedDict()
        self._to_close: list[int] = []
        self._full_until = 0.0
        self._free_wanted = 0  # bytes to free after ENOSPC, on a tier without a size bound
        self._fs_free: int | None = None
        self._fs_checked = 0.0
        self._token = secrets.token_hex(6)  # names this writer's temporary files
        self._temp_numbers = itertools.count()
        writer = re.sub(r"[^A-Za-z0-9_-]", "_", f"{socket.gethostname()}-{os.getpid()}")[:100]
        self._guard = CallGuard(io_threads)
        self._root_seen: _Root | None = None  # the root as the probe that took it up found it
        self._engine_unchecked = False  # the root was taken up, its mount's settings not checked since
        self._presence = PresenceIndex()
        self._journal = Journal(self._device, self._layout, f"{writer}-{self._token}", keep_s=journal_keep_s,
                                on_volume=self._on_volume)
        self._sweeper = Sweeper(self._device, self._layout, self._presence, self._removing, oldest_kept, temp_keep_s)
        self._sweep_wanted = True
        self._events: TierEvents | None = None
        self._evicting = threading.Lock()
        # Pages this host removed, lately: another host's older announcement of one must not
        # count it again (a ghost that would make this host evict a real page for it).
        self._removed_here: collections.OrderedDict[str, None] = collections.OrderedDict()  # under _lock
        self._unlinking: collections.Counter[str] = collections.Counter()  # drops under way; under _lock
        queued = queue_bytes if isinstance(queue_bytes, Share) else Share("write_behind", queue_bytes)
        # Pages offered here that were not written, with their offer numbers: an older version of
        # one may still be on the tier, which this host (once its own copy is gone) and others
        # would read for it.
        self._unwritten: collections.OrderedDict[str, tuple[int, PageMeta]] = collections.OrderedDict()  # under _lock
        # Pages whose files another format version wrote (a rolling upgrade), or that are no page
        # files (other data of the directory): never served here, so not counted (each exists
        # query would say yes and each read miss) until rewritten.
        self._foreign: collections.OrderedDict[str, None] = collections.OrderedDict()  # under _lock
        # Pages removed here while the tier was unavailable, with when (ns since the epoch):
        # their files go once it is back, and until then they are absent here (``remove_later``).
        self._removals: collections.OrderedDict[str, int] = collections.OrderedDict()  # under _lock
        self._owed_before_start: set[str] = set()  # those of them loaded, not noted again since (under _lock)
        # Pages presence holds whose file a read found gone (ENOENT, ESTALE), with when: the
        # engine may have answered from an entry it cached before another host replaced the file,
        # so each is looked at again once that cache expired (``_look_again``).
        self._vanished: collections.OrderedDict[str, float] = collections.OrderedDict()  # under _lock
        # Pages another host announced at another size than counted here, with when: this
        # host's own write of the name may have landed after the announced one (its file holds
        # the size counted), so each file's size is looked at once the entry cache expired
        # (``_look_at_sizes``).
        self._resized: collections.OrderedDict[str, float] = collections.OrderedDict()  # under _lock
        # Names being written here now, how many times: an announcement of one may be of a file
        # that landed before or after this host's, which only a look tells.
        self._writing: collections.Counter[str] = collections.Counter()  # under _lock
        self._entry_cache_s = engine_checks.MAX_CACHE_S  # the engine's, where it can be read
        self._write_behind = WriteBehind(self._write_copy, self._accepting, writers, queue_pages, queued, queue_lag_s,
                                         lost=self._lost, removed=self._removed_while_written)
        self._owed = OwedRemovals(owed_dir, self.root)
        for name, removed_at in self._owed.load():  # owed since before the last stop: absent here until removed
            self._remove_when_back(name, removed_at)
            self._owed_before_start.add(name)
        try:
            self._guard.call(self._probe, timeout=deadline_s, probe=True)
            self._check_engine()
        except OSError as error:
            self._guard.mark_unavailable(f"{type(error).__name__}: {error}")
            _log.warning("shared tier %s unavailable at start: %s", self.root, error)
        self._stop = threading.Event()
        self._maintenance = threading.Thread(target=self._maintain, name="hicachefs-shared-maintenance", daemon=True)
        self._maintenance.start()

    def bind(self, events: TierEvents) -> None:
        """The engine, told of each page another host announces (``TierEvents.changed``)."""
        self._events = events

    # -- the engine's questions ------------------------------------------------------------

    def contains_many(self, names: list[str]) -> list[bool]:
        """Whether each page is on the shared tier, from memory: never blocks, never raises."""
        if not self._guard.available:
            return [False] * len(names)
        try:
            found = self._presence.contains_many(names)
            if self._removals:
                with self._lock:
                    found = [held and name not in self._removals for name, held in zip(names, found)]
            return found
        except Exception:  # a name the hash cannot take: a miss, as for any bad input
            _log.exception("shared tier: contains_many failed")
            return [False] * len(names)

    def has_directory(self, path: str) -> bool:
        """Whether some page the tier knows of lies under directory ``path`` (a namespace
        prefix such as ``model/format``), from memory: never blocks, never raises."""
        return self._guard.available and self._presence.holds_under(path)

    def remove_later(self, name: str) -> bool:
        """See ``Tier.remove_later``: a file of the name that lies on the volume when it comes
        back is removed before the sweep could count it again (a later write of the name here
        cancels that). At most ``REMOVED_REMEMBERED`` names wait; older ones come back. With an
        ``owed_dir`` they outlast a stop and a start (``owed``).

        Called for every removal of a page here: write-behind of the name that has not landed
        yet is cancelled either way, so the removed page does not reach the tier after it."""
        self._write_behind.cancel(name)
        if self._guard.available:
            return False
        self._remove_when_back(name)
        return True

    def offer(self, page: PageMeta, payload: memoryview, release: Callable[[], None]) -> bool:
        """Queue ``page`` for write-behind; never blocks. ``release`` is called exactly once,
        when the payload is no longer needed: in the caller's thread when the page is dropped
        (False), else from a write-behind thread once the payload is copied (so it must be
        thread-safe). The payload must stay unchanged until then."""
        return self._write_behind.offer(page, payload, release)

    def find(self, name: str, reading: bool = False) -> PageMeta | None:
        """The page's size, checksum and publish time from its file's header; None on a miss,
        a damaged file (counted and removed), a timeout or an unavailable tier. Blocks up to
        the deadline. ``reading``: ``read_into`` follows, so the payload is read along with the
        header, as long as the last page read from the same pool (one round trip, not two)."""
        where = place(name)
        pool = name.rpartition("/")[0]
        ahead_bytes = self._payload_sizes.get(pool, 0) if reading else 0
        try:
            opened = self._guard.call(self._open_page, name, where, ahead_bytes,
                                      timeout=self._data_deadline(ahead_bytes), expected=GONE,
                                      discard=self._discard_opened)
        except OSError as error:
            if error.errno in GONE:
                self._found_gone(name, where)
            else:
                self._count_failure(error)
            self._count(misses=1)
            return None
        except _Corrupt:
            self._count(misses=1)
            return None
        if opened is None:  # another format version's, or no page file: not counted again until rewritten
            self._not_ours(name, where, 0)
            self._count(misses=1)
            return None
        self._found_again(name, where, _stored_size(opened.page))
        if reading:
            self._payload_sizes[pool] = opened.page.size
        self._remember(opened)
        return opened.page

    def read_into(self, page: PageMeta, location: int, out: memoryview, counted: bool = True) -> ReadResult:
        """Copy ``page``'s payload into ``out``, checked against the header and checksum.
        CORRUPT: a damaged or short file (counted and removed). MISMATCH: not that page there
        (removed or replaced by another host), a timeout, or the tier unavailable. Blocks up to
        the deadline; ``out`` is written only by the calling thread, after the read succeeded."""
        where = place(page.name)
        opened = self._take_recent(page)
        if opened is not None and not self._presence.contains(where.directory, where.key_hash):
            self._defer_close(opened.fd)  # removed since it was found (a journal or a sweep said so)
            opened = None
        try:
            payload = self._guard.call(self._read_page, page, where, opened,
                                       timeout=self._data_deadline(page.size), expected=GONE)
        except Refused as error:
            if opened is not None:  # the read never ran: its file is still ours to close
                self._defer_close(opened.fd)
            self._count_failure(error)
            self._count(misses=1)
            return ReadResult.MISMATCH
        except OSError as error:
            if error.errno in GONE:
                self._found_gone(page.name, where)
            else:
                self._count_failure(error)
            self._count(misses=1)
            return ReadResult.MISMATCH
        except _Corrupt:
            return ReadResult.CORRUPT
        if payload is None:
            self._count(misses=1)
            return ReadResult.MISMATCH
        out[: page.size] = payload
        self._found_again(page.name, where)
        self._count(hits=int(counted), bytes_out=page.size * counted)
        return ReadResult.OK

    def write(self, page: PageMeta, payload) -> int:
        """Write ``page`` now (blocking, up to its deadline): a temporary file renamed to the
        page's name. Raises ``OSError`` (ENOTCONN while unavailable, ETIMEDOUT, ENOSPC, EIO)."""
        self._write_copy(page, memoryview(bytes(payload)))  # a call that times out keeps its own copy
        return 0

    def drop(self, page: PageMeta, location: int) -> None:
        """Remove the page's file; idempotent, never raises. Blocks up to the deadline; a file
        the filesystem failed to remove is removed later (``remove_later``)."""
        where = place(page.name)
        self._forget_recent(page.name)
        stored = _stored_size(page)
        with self._lock:  # a sweep that lists the file meanwhile does not count it (``_removing``)
            self._unlinking[page.name] += 1
        try:
            self._presence.update(where.directory, where.key_hash, stored, False)
            self._note_removed(page.name)
            self._journal.announce(False, stored, page.name)
            try:
                self._guard.call(self._unlink_page, self._layout.page_path(where),
                                 timeout=self._deadline_s, expected=GONE)
            except OSError as error:
                if error.errno not in GONE:
                    self._count_failure(error)
                    # The file may still be there: removed once the volume answers (as for a
                    # removal while it is away), and absent here meanwhile.
                    self._remove_when_back(page.name)
        finally:
            with self._lock:
                self._unlinking[page.name] -= 1
                if not self._unlinking[page.name]:
                    del self._unlinking[page.name]

    def remove(self, name: str) -> bool:
        """Remove the file of page ``name`` (one of this format version); whether there was one.
        Blocks up to two deadlines. When the filesystem fails or hangs, the page cannot be
        looked at: it is taken as removed, absent here meanwhile, and its file is removed once
        the volume answers (``remove_later``), so it never comes back with a sweep."""
        try:
            # Its lookup and its unlink: the two deadlines a find and a drop would have had.
            page = self._guard.call(self._remove_named, name, timeout=2 * self._deadline_s, expected=GONE)
        except OSError as error:
            if error.errno in GONE:  # another host removed it already
                where = place(name)
                self._presence.update(where.directory, where.key_hash, 0, False)
                return False
            self._count_failure(error)
            self._remove_when_back(name)
            return True
        return page

    def _remove_named(self, name: str) -> bool:
        where = place(name)
        path = self._layout.page_path(where)
        self._forget_recent(name)
        try:
            opened = self._open_page(name, where)
        except _Corrupt:
            return True  # removed as damaged
        except OSError as error:
            if error.errno in GONE:
                self._on_volume()  # else not gone from the volume: the volume is gone
            raise
        if opened is None:
            return False  # another format version's, or no page file: not ours
        stored = _stored_size(opened.page)
        self._close_quietly(opened.fd)
        try:
            self._device.unlink(path)
        except OSError as error:
            if error.errno not in GONE:
                raise
        self._note_removed(name)
        self._presence.update(where.directory, where.key_hash, stored, False)
        self._journal.announce(False, stored, name)
        return True

    def fits(self, name: bytes, size: int) -> bool:
        return self._limit is None or page_format.HEADER_BYTES + len(name) + size <= self._limit

    @property
    def capacity_bytes(self) -> int:
        if self._limit is not None:
            return self._limit
        return self.used_bytes + (self._fs_free or 0)

    @property
    def used_bytes(self) -> int:
        return self._presence.totals()[1]

    def statistics(self) -> SharedTierStatistics:
        pages, used = self._presence.totals()
        with self._lock:
            totals = self.counters.snapshot()
            full = time.monotonic() < self._full_until
        guard = self._guard.statistics()
        capacity = self._limit if self._limit is not None else used + (self._fs_free or 0)
        return SharedTierStatistics(
            name=self.name, capacity_bytes=capacity, used_bytes=used, free_bytes=max(0, capacity - used), pages=pages,
            **totals, writable=guard.available and not full, size_bound=self._limit is not None,
            fs_free_bytes=self._fs_free, journal_announced=self._journal.announced,
            journal_received=self._journal.received, journal_pending=self._journal.pending(),
            write_behind=self._write_behind.statistics(), guard=guard, sweep=self._sweeper.statistics())

    def close(self) -> None:
        """Write what is queued for up to a few deadlines, then stop; never hangs on a dead
        filesystem (threads stuck in it are left behind as daemon threads)."""
        self._write_behind.close(deadline_s=4 * self._deadline_s)
        self._stop.set()
        self._maintenance.join(timeout=self._tick_s + 8 * self._deadline_s)
        self._owed.close(self._owed_now())
        try:
            self._guard.call(self._journal.flush, timeout=self._deadline_s)
        except OSError:
            pass  # the sweep of other hosts finds the pages it would have announced
        with self._lock:
            fds = self._to_close + [opened.fd for opened in self._recent.values()]
            self._to_close, self._recent = [], collections.OrderedDict()
        try:
            self._guard.call(self._close_all, fds, timeout=self._deadline_s, probe=True)
            self._guard.call(self._journal.close, timeout=self._deadline_s, probe=True)
        except OSError:
            pass  # a filesystem that hangs keeps them; nothing else is left to do with them
        self._guard.close()
        self.failure_log.close()

    # -- filesystem work, run on guard threads -------------------------------------------

    def _probe(self) -> None:
        """Whether the filesystem answers, and the root is still the directory the tier took up:
        a listing always reaches it (a stat may not). The first probe, and one that finds a
        volume mounted over the root or the root made again (``_came``), takes the root up:
        makes it if it is missing and notes which directory it is and on which mount; the
        others make nothing unless it is there."""
        if self._root_seen is not None:
            try:
                self._on_volume()
            except OSError:
                if self._root_seen is not None:
                    raise  # not there: nothing is made
        if self._root_seen is None:
            self._device.makedirs(self._layout.journal)
            self._root_seen = self._look_at_root()
            self._sweep_wanted = True  # what the tier counted lay elsewhere
            self._engine_unchecked = True  # maybe another mount than at start
        else:
            self._device.makedirs(self._layout.journal, self._on_volume)  # (looked at again after a pause)
        self._device.listdir(self._layout.journal)

    def _look_at_root(self, seen: _Root | None = None) -> _Root:
        """The root now; ``seen`` itself while it is the same directory of the same filesystem,
        without reading the mount table (every tick: 8 ms with 3,000 mounts, found by review)."""
        try:
            stat = self._device.stat(str(self.root))
        except FileNotFoundError:
            stat = None  # not made again: it would be made on the bare mountpoint
        if seen is not None and stat is not None and (stat.st_ino, stat.st_dev) == (seen.inode, seen.device):
            return seen
        return _Root(None if stat is None else stat.st_ino, None if stat is None else stat.st_dev,
                     self._device.mount_of(str(self.root)))

    def _on_volume(self) -> bool:
        """Check that the root is still the directory the tier took up, else mark the tier
        unavailable and raise ENOTCONN: once the volume is unmounted its path names the bare
        mountpoint, where a page written would reach no host and fill the local disk, a
        directory made would hide the journal after a remount, and a removal finding no file
        would be taken as done (the page coming back with the volume). The mount the root lies
        on tells (once the volume is unmounted, that of a directory above its mountpoint), and
        the root's inode number on that mount. A volume mounted over the root since (a daemon
        started before its volume was mounted, a volume mounted again) or the root made again
        on its mount is taken up by the next probe (``_came``)."""
        seen = self._root_seen
        now = self._look_at_root(seen)
        if seen is not None and now == seen:
            return True
        if seen is not None and _came(seen, now, self._journaled):
            self._root_seen = None
            reason = f"shared directory {self.root} changed (a volume mounted over it, or made again): taken up anew"
        else:
            reason = f"shared directory {self.root} is not the one the tier took up (its volume unmounted?)"
        self._guard.mark_unavailable(reason)
        raise OSError(errno.ENOTCONN, reason)

    def _journaled(self) -> bool:
        """Whether the root holds the journal directory, which only the tier makes."""
        try:
            return S_ISDIR(self._device.stat(self._layout.journal).st_mode)
        except OSError:
            return False

    def _check_engine(self) -> None:
        """Say once, in one line, what the filesystem's mount uses that the tier cannot work
        well with (``engine_checks``); raises ``OSError`` when the filesystem does not answer.
        Done at start and again each time a probe takes the root up (a volume mounted after
        start, or mounted again: its settings may differ, or the start saw the bare
        mountpoint's local filesystem), so a late mount is told of as the start's is."""
        local = self._guard.call(engine_checks.local_mount, str(self.root), timeout=self._deadline_s)
        settings = None if local is not None else self._guard.call(engine_checks.settings, str(self.root),
                                                                    timeout=self._deadline_s)
        self._engine_unchecked = False
        if local is not None:
            _log.warning("shared tier %s", engine_checks.local_warning(str(self.root), local))
            return
        if settings is None:
            return
        self._entry_cache_s = min(settings.caches_s.get("entry cache", engine_checks.MAX_CACHE_S), VANISHED_KEPT_MAX_S)
        problems = settings.problems()
        if problems:
            _log.warning("shared tier %s: its %s mount has %s; pages may take longer to reach other hosts "
                         "or be lost (docs/shared-tier.md: what it needs from its filesystem)",
                         self.root, settings.engine, ", ".join(problems))
        else:
            _log.info("shared tier %s on %s: %s", self.root, settings.engine, settings.describe())

    def _open_page(self, name: str, where: Place, payload_ahead: int = 0) -> _Opened | None:
        path = self._layout.page_path(where)
        fd = self._device.open(path, os.O_RDONLY)
        try:
            header = page_format.header_length(name)
            if payload_ahead:
                data = bytearray(header + payload_ahead)
                got = self._device.preadv([data], fd, 0)
                head, ahead = memoryview(data)[: min(got, header)], memoryview(data)[header : max(header, got)]
            else:
                head, ahead = self._device.pread(fd, header, 0), memoryview(b"")
            decoded = page_format.decode(head, name)
            if decoded.verdict is page_format.Verdict.CORRUPT:
                self._remove_damaged(fd, path, where, name)
                raise _Corrupt(path)
            if decoded.verdict in (page_format.Verdict.FOREIGN, page_format.Verdict.STRANGER):
                self._device.close(fd)
                return None
        except BaseException:
            self._close_quietly(fd)
            raise
        return _Opened(fd, decoded.page, decoded.payload_offset, ahead[: decoded.page.size])

    def _read_page(self, page: PageMeta, where: Place, opened: _Opened | None) -> memoryview | bytearray | None:
        if opened is None:
            opened = self._open_page(page.name, where)
            if opened is None:
                return None
        fd = opened.fd
        try:
            if opened.page.size != page.size or opened.page.checksum != page.checksum:
                return None  # replaced by another version since it was found
            if len(opened.ahead) == page.size:
                payload = opened.ahead
            else:
                payload = bytearray(page.size)
                payload[: len(opened.ahead)] = opened.ahead
            view = memoryview(payload)
            filled = len(opened.ahead)
            while filled < page.size:
                got = self._device.preadv([view[filled:]], fd, opened.payload_offset + filled)
                if got <= 0:
                    break
                filled += got
            if filled < page.size or page_checksum(payload) != page.checksum:
                self._remove_damaged(fd, self._layout.page_path(where), where, page.name)
                raise _Corrupt(page.name)
            return payload
        finally:
            self._close_quietly(fd)

    def _remove_damaged(self, fd: int, path: str, where: Place, name: str) -> None:
        """Count a damaged page file and remove it, unless another host already replaced it
        (its inode changed) or removed it."""
        self._count(checksum_failures=1)
        _log.warning("shared tier: damaged page file %s removed", path)
        size = 0
        try:
            stat = self._device.fstat(fd)
            size = stat.st_size
            if stat.st_ino == self._device.stat(path).st_ino:
                self._device.unlink(path)
                self._journal.announce(False, size, name)
        except OSError as error:
            if error.errno not in GONE:
                self._count(io_errors=1)
        self._presence.update(where.directory, where.key_hash, size, False)

    def _write_copy(self, page: PageMeta, payload: memoryview, number: int | None = None) -> None:
        """Write a page from a buffer nobody else changes; raise ``OSError`` on failure.
        ``number``: write-behind's offer it is (None: a write made now, later than any offer)."""
        if not self._accepting():
            raise Refused(errno.ENOTCONN, "shared tier not taking writes")
        where, started = place(page.name), time.monotonic()
        with self._writing_here(page.name):
            self._write_and_count(page, where, payload, number, started)

    @contextlib.contextmanager
    def _writing_here(self, name: str) -> Iterator[None]:
        """``name`` is being written here, until counted (``_count_announced``)."""
        with self._lock:
            self._writing[name] += 1
        try:
            yield
        finally:
            with self._lock:
                self._writing[name] -= 1
                if not self._writing[name]:
                    del self._writing[name]

    def _write_and_count(self, page: PageMeta, where: Place, payload: memoryview, number: int | None,
                         started: float) -> None:
        """``_write_copy``'s work, begun at ``started``: an announcement of the name applied since
        keeps it waiting for its look, as the two files may have landed in either order."""
        try:
            timeout = 4 * self._data_deadline(page.size)
            self._guard.call(self._write_file, page, where, payload, time.monotonic() + timeout / 2, timeout=timeout,
                             expected=_FULL, discard=functools.partial(self._landed_late, page))
        except OSError as error:
            if error.errno in _FULL:
                with self._lock:
                    self._full_until = time.monotonic() + self._retry_s
                    self._free_wanted += 4 * _stored_size(page)  # room for a few more like it
                self._sweep_wanted = True
            self._count_failure(error)
            if isinstance(error, Overtaken):
                _log.debug("shared tier: %s", error)
            elif not isinstance(error, Refused):
                self.failure_log.failed("page write", "shared tier: writing page %r failed: %s", page.name, error)
            raise
        stored = _stored_size(page)
        with self._lock:
            lost = self._unwritten.get(page.name)
            replaced = lost is not None and number is not None and lost[0] > number  # by a later version, never written
            if not replaced:
                self._unwritten.pop(page.name, None)  # this version replaced whatever was there
                self._removals.pop(page.name, None)
                self._owed_before_start.discard(page.name)
                self._foreign.pop(page.name, None)
                # Counted under the lock a look at a name found gone forgets it under, and no
                # longer waiting for that look (found by review: a write during it was undone).
                self._vanished.pop(page.name, None)
                announced = self._resized.get(page.name)
                if announced is not None and announced < started:  # landed after the version announced
                    del self._resized[page.name]
                elif announced is not None:  # one announced since may have landed first or last: looked
                    self._wait_for_look(page.name)  # at once the entry cache has expired after this write
                self._presence.update(where.directory, where.key_hash, stored, True)
        self._count(bytes_in=page.size)
        if replaced:  # neither counted nor announced: the check of the later version removes it
            return
        self._journal.announce(True, stored, page.name)

    def _landed_late(self, page: PageMeta, _result: None) -> None:
        """A write of ``page`` that overran its deadline went through after all, once its caller
        had counted it not written (lost, or its page removed): a later version, or the removal,
        may have come meanwhile, and that stale file would outlast them. It goes (a miss, here and
        on every host), unless a later write of the name here comes first (``_remove_when_back``)."""
        self._remove_when_back(page.name)

    def _lost(self, page: PageMeta, number: int) -> None:
        """Write-behind did not write ``page`` (its offer ``number``): until the file of its name
        is checked, this host does not read it (it may hold an older version), and the
        maintenance thread removes it if it holds another version (``_remove_other_version``).
        A later version already noted lost is the one to check for."""
        with self._lock:
            later = self._unwritten.get(page.name)
            _note_newest(self._unwritten, page.name, later if later is not None and later[0] > number else (number, page))
        where = place(page.name)
        self._presence.update(where.directory, where.key_hash, _stored_size(page), False)

    def _removed_while_written(self, page: PageMeta) -> None:
        """Write-behind wrote ``page`` after the page was removed here: remove that file now
        (or once the volume is back), so the removal holds here and on the other hosts."""
        self._note_removed(page.name)
        if self._guarded(self._remove_version, page) is None:
            self._remove_when_back(page.name)

    def _remove_version(self, page: PageMeta) -> bool:
        """Remove the file of ``page``'s name if it holds that very version; True once checked."""
        self._unlink_unless(page.name, lambda stored: stored != page,  # another version landed since
                            lambda: self._forget_recent(page.name))
        return True

    def _check_unwritten(self, budget: int = 64) -> None:
        with self._lock:
            lost = [self._unwritten.popitem(last=False)[1] for _ in range(min(budget, len(self._unwritten)))]
        for position, (number, page) in enumerate(lost):
            pending = self._write_behind.pending(page.name)
            if pending is not None:
                if pending < number:  # an earlier version is still being written: check once it landed
                    with self._lock:
                        self._unwritten.setdefault(page.name, (number, page))
                continue  # else a later version is on its way: it replaces the file
            if self._guarded(self._remove_other_version, page) is None:
                with self._lock:  # not checked (the filesystem failed): again later
                    for later in lost[position:]:
                        self._unwritten.setdefault(later[1].name, later)
                return

    def _found_gone(self, name: str, where: Place) -> None:
        """A read found no file of ``name`` (ENOENT, ESTALE): a miss now, but a page presence
        holds is not forgotten yet. The engine may have answered from an entry it cached before
        another host replaced the file by rename (JuiceFS answers ENOENT so for up to its 1 s
        entry cache, found by review), and forgotten, the page would answer absent here until the
        next sweep while the volume holds its new version: it is looked at again once that cache
        expired (``_look_again``). Past ``VANISHED_REMEMBERED`` names waiting (an ``rm -r``
        elsewhere whose announcements are late), it is forgotten at once: the next sweep finds it
        again if it is there."""
        if not self._presence.contains(where.directory, where.key_hash):
            return
        with self._lock:
            if name in self._vanished or len(self._vanished) < VANISHED_REMEMBERED:
                self._vanished.setdefault(name, time.monotonic())
                return
        self._presence.update(where.directory, where.key_hash, 0, False)

    def _look_again(self, now: float, budget: int = 64) -> None:
        """Forget the pages a read found gone (``_found_gone``) that are still gone once the
        engine's entry cache has expired since; the others stay counted. At most ``budget``
        names a tick, for ``BACKLOG_BUDGET_S`` (one at least). A name no longer counted (a
        sweep or an announcement said so) is let go unlooked at; one whose look failed goes to
        the end, to wait its turn again (first in line, it failed every tick, found by review)."""
        with self._lock:
            due = [name for name, _ in self._due(self._vanished, now, budget)]
        end = time.monotonic() + BACKLOG_BUDGET_S
        for name in due:
            where = place(name)
            if not self._presence.contains(where.directory, where.key_hash):
                with self._lock:
                    self._vanished.pop(name, None)
                continue
            # (a stat of the page, and of the volume's root where it is gone: two deadlines)
            gone = self._guarded(self._is_gone, name, timeout=2 * self._deadline_s)
            with self._lock:
                if gone is None:  # the filesystem failed: again later
                    if self._vanished.pop(name, None) is not None:
                        self._vanished[name] = time.monotonic()
                    return
                # Forgotten under the lock that a read finding the page takes to count it: the
                # one or the other, whole (``_found_again``).
                if self._vanished.pop(name, None) is not None and gone:
                    self._presence.update(where.directory, where.key_hash, 0, False)
            if time.monotonic() >= end:
                return

    def _due(self, backlog: collections.OrderedDict[str, float], now: float,
             count: int | None = None) -> list[tuple[str, float]]:
        """Under the lock: the first names of ``backlog`` (name: when it was put there, oldest
        first), ``count`` at most, that the engine's entry cache has expired for since."""
        items = backlog.items() if count is None else itertools.islice(backlog.items(), count)
        return list(itertools.takewhile(lambda item: now - item[1] >= self._entry_cache_s, items))

    def _found_again(self, name: str, where: Place, stored_size: int | None = None) -> None:
        """The page of ``name`` was read (``stored_size``: counted as present, at that size), or
        announced: a read that found it gone before says nothing more. Looked at again, the name
        could meet an entry the engine cached since, for a file replaced since (found by review:
        a page replaced twice was forgotten). Under the lock a look forgets a page under, so
        that a read and a look of one name do not undo each other."""
        with self._lock:
            if stored_size is not None:
                self._presence.update(where.directory, where.key_hash, stored_size, True)
            if self._vanished:
                self._vanished.pop(name, None)

    def _is_gone(self, name: str) -> bool:
        """Whether no file of ``name`` is on the volume (raises ENOTCONN when the volume is gone)."""
        return self._file_size(self._layout.page_path(place(name))) < 0 and self._on_volume()

    def _apply_removals(self, budget: int = 64) -> None:
        """Remove the files of pages removed here while the tier was away (``remove_later``): at
        most ``budget`` a tick, for ``BACKLOG_BUDGET_S`` (one at least)."""
        with self._lock:
            owed = [(name, removed_at, name in self._owed_before_start)
                    for name, removed_at in itertools.islice(self._removals.items(), budget)]
        end = time.monotonic() + BACKLOG_BUDGET_S
        for name, removed_at, before_start in owed:
            if self._guarded(self._remove_file, name, removed_at, before_start) is None:
                return  # the filesystem failed: again later
            with self._lock:
                if self._removals.get(name) == removed_at:  # (not removed again meanwhile)
                    del self._removals[name]
                    self._owed_before_start.discard(name)
            if time.monotonic() >= end:
                return

    def _remove_file(self, name: str, removed_at: int, before_start: bool) -> bool:
        """Remove the file of ``name`` if there is one, announced to the other hosts; True once
        done. A later write of the name here, under way meanwhile, may go with it: a miss. For a
        removal owed since before this start (``before_start``, at ``removed_at``), a file written
        ``WRITTEN_SINCE_NS`` after it is another host's write of the name, or this host's before
        a kill: left."""
        where = place(name)
        path = self._layout.page_path(where)
        try:
            found = self._device.stat(path)
            if before_start and found.st_mtime_ns > removed_at + WRITTEN_SINCE_NS:
                self._written_since(name, removed_at, where, found.st_size)
                return True
            stored = found.st_size
            self._device.unlink(path)
        except OSError as error:
            if error.errno in GONE:
                return self._on_volume()  # not gone from the volume if the volume is gone
            raise
        self._presence.update(where.directory, where.key_hash, stored, False)
        self._journal.announce(False, stored, name)
        return True

    def _written_since(self, name: str, removed_at: int, where: Place, stored: int) -> None:
        """A file of ``name`` written since its removal here (at ``removed_at``, kept across a
        stop) was left: counted, and the name's announcements heard again (it was a miss here
        until the next sweep: found by review). Unless the name was written or removed here
        since the look: what that did stands (counting the look's file made a page no file
        held: found by review)."""
        with self._lock:
            if self._removals.get(name) != removed_at or name not in self._owed_before_start:
                return
            self._removed_here.pop(name, None)
            self._presence.update(where.directory, where.key_hash, stored, True)

    def _unlink_page(self, path: str) -> None:
        """Unlink a page file; one not found is removed only if the root is still the volume."""
        try:
            self._device.unlink(path)
        except OSError as error:
            if error.errno in GONE:
                self._on_volume()
            raise

    def _remove_other_version(self, page: PageMeta) -> bool:
        """Remove the file of ``page``'s name if it holds another version (one this host
        replaced by ``page``, which never reached the tier); True once checked."""
        stored = self._unlink_unless(page.name, lambda stored: (stored.size, stored.checksum) == (page.size, page.checksum),
                                     lambda: self._note_removed(page.name))
        if stored is not None:
            where = place(page.name)
            self._presence.update(where.directory, where.key_hash, _stored_size(stored), True)
        return True

    def _unlink_unless(self, name: str, keep: Callable[[PageMeta], bool],
                       removed: Callable[[], None]) -> PageMeta | None:
        """Look at the file of ``name``: the version it holds when ``keep(version)``; else the file
        is unlinked (if its path still names the file looked at), announced to the other hosts and
        marked absent, ``removed()`` is called, and None returned. None too where there is no file
        of ours (gone, damaged, another format's)."""
        where = place(name)
        path = self._layout.page_path(where)
        try:
            opened = self._open_page(name, where)
        except OSError as error:
            if error.errno in GONE:
                return None
            raise
        except _Corrupt:
            return None
        if opened is None:
            return None
        try:
            if keep(opened.page):
                return opened.page
            if self._device.fstat(opened.fd).st_ino == self._device.stat(path).st_ino:
                self._device.unlink(path)
                self._journal.announce(False, _stored_size(opened.page), name)
            self._presence.update(where.directory, where.key_hash, _stored_size(opened.page), False)
            removed()
        except OSError as error:
            if error.errno not in GONE:
                raise
        finally:
            self._close_quietly(opened.fd)
        return None

    def _write_file(self, page: PageMeta, where: Place, payload: memoryview, retry_until: float) -> None:
        """``retry_until``: the last moment a try of the open may start again (``_open_in_new_directory``)."""
        temp = self._layout.temp_path(where, self._token, next(self._temp_numbers))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = self._device.open(temp, flags, 0o644)
        except FileNotFoundError:
            self._on_volume()  # the pool's directories are made on the volume, nowhere else
            fd = self._open_in_new_directory(temp, flags, retry_until)
        try:
            try:
                header = page_format.encode(page)
                written = self._device.pwritev([header, payload], fd, 0)
                if written != len(header) + page.size:
                    raise OSError(errno.EIO, f"short write: {written} of {len(header) + page.size} bytes")
            finally:
                self._device.close(fd)  # a distributed filesystem reports write errors here too
            self._rename_into_place(page, temp, self._layout.page_path(where))
        except BaseException:
            try:
                self._device.unlink(temp)
            except OSError:
                pass  # the sweep removes it later
            raise

    def _open_in_new_directory(self, temp: str, flags: int, retry_until: float) -> int:
        """Make the directories of ``temp``, then open it. The open is tried again, the volume
        checked after each pause (``_on_volume``: unmounted meanwhile, nothing may be made on the
        bare mountpoint), while this host does not see yet a directory another host made at the
        same moment (GlusterFS answered it ENOENT though the directory was there: two hosts
        writing into one new pool at once, once in 6 runs of a test); no pause is begun past
        ``retry_until``, half the write's deadline (a timeout would mark the tier unavailable)."""
        self._device.makedirs(os.path.dirname(temp), self._on_volume)
        for pause in RACE_PAUSES_S:
            try:
                return self._device.open(temp, flags, 0o644)
            except FileNotFoundError:
                if time.monotonic() + pause > retry_until:
                    raise
            time.sleep(pause)
            self._on_volume()
        return self._device.open(temp, flags, 0o644)

    def _rename_into_place(self, page: PageMeta, temp: str, target: str) -> None:
        """The rename that publishes a page file. GlusterFS answers ENOENT to one that another
        host's removal of the name overtook (the temporary file moved, then the name removed: 119
        of 3,643 renames in a review's race): the page is absent, as after a write and then that
        removal, and the volume did no wrong (three such answers in a row marked it unavailable)."""
        try:
            self._device.rename(temp, target)
        except FileNotFoundError:
            try:
                self._device.stat(temp)
            except FileNotFoundError:
                self._on_volume()  # (the volume unmounted under the write: ENOTCONN, a failure)
                raise Overtaken(errno.ENOENT, f"{page.name}: removed by another host as it was written here") from None
            raise

    def _close_quietly(self, fd: int) -> None:
        try:
            self._device.close(fd)
        except OSError:
            pass

    def _close_all(self, fds: list[int]) -> None:
        for fd in fds:
            self._close_quietly(fd)

    def _discard_opened(self, opened: _Opened | None) -> None:
        """A find that finished after its caller gave up: close what it opened."""
        if opened is not None:
            self._defer_close(opened.fd)

    def _evict(self, budget: int) -> None:
        """Remove up to ``budget`` of the oldest pages while the tier is over its bound, or
        until a few pages' room is free after the filesystem said it is full."""
        if not self._evicting.acquire(blocking=False):
            return  # an earlier eviction is still stuck in the filesystem
        try:
            self._evict_some(budget)
        finally:
            self._evicting.release()

    def _evict_some(self, budget: int) -> None:
        candidates = self._sweeper.candidates
        for _ in range(budget):
            if not self._over_capacity():
                return
            if not candidates:
                self._sweep_wanted = True
                return
            candidate = candidates.popleft()
            where = place(candidate.name)
            if not self._presence.contains(where.directory, where.key_hash):
                continue  # already gone
            path = self._layout.page_path(where)
            removed = True
            try:
                if not self._is_page_file(path):
                    self._not_ours(candidate.name, where, candidate.size)
                    continue
                self._device.unlink(path)
            except OSError as error:
                if error.errno not in GONE:
                    candidates.appendleft(candidate)
                    raise
                removed = False  # another host evicted it first
            self._presence.update(where.directory, where.key_hash, candidate.size, False)
            self._forget_recent(candidate.name)
            self._note_removed(candidate.name)
            with self._lock:
                self._free_wanted = max(0, self._free_wanted - candidate.size)
            if removed:
                self._journal.announce(False, candidate.size, candidate.name)
                self._count(evictions=1)

    def _is_page_file(self, path: str) -> bool:
        """Whether the file at ``path`` may be a page file (``may_be_page``): the evictor
        removes no file of the directory's other data that merely lies where a page would. A
        file whose first bytes cannot be read (a GlusterFS split-brain, a JuiceFS block whose
        object is lost: unlink still works) is taken for the page its name hashes to and
        removed: checked again, it would stop every eviction for good as the oldest candidate.
        A file another host removed while it was read is gone (FileNotFoundError), whatever
        the error its read met (JuiceFS answers such a read with another errno)."""
        try:
            fd = self._device.open(path, os.O_RDONLY)
            try:
                return page_format.may_be_page(self._device.pread(fd, len(page_format.MAGIC), 0))
            finally:
                self._close_quietly(fd)
        except OSError as error:
            if error.errno in GONE or not self._exists(path):
                raise FileNotFoundError(errno.ENOENT, "removed meanwhile", path) from error
            self._count(io_errors=1)
            _log.warning("shared tier: %s unreadable (%s), evicted unchecked", path, error)
            return True

    def _exists(self, path: str) -> bool:
        try:
            self._device.stat(path)
        except FileNotFoundError:
            return False
        except OSError:
            pass  # there, as far as can be told
        return True

    def _over_capacity(self) -> bool:
        if self._limit is not None and self.used_bytes > self._limit:
            return True
        with self._lock:
            return self._free_wanted > 0

    def _refresh_free_space(self) -> None:
        stat = self._device.statvfs(str(self.root))
        self._fs_free = stat.f_bavail * stat.f_frsize

    # -- background maintenance ---------------------------------------------------------------

    def _maintain(self) -> None:
        next_poll = next_probe = next_expire = next_save = 0.0
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            self.failure_log.flush_due()
            try:
                if now >= next_save:  # while the volume is away too: that is when removals are owed
                    next_save = now + OWED_SAVE_S
                    self._owed.save(self._owed_now())
                if not self._guard.available:
                    self._write_behind.drop_queued()
                    if now >= next_probe:
                        next_probe = now + self._retry_s
                        self._guarded(self._probe, probe=True)
                        if self._guard.available:  # back: the journal's file may be on the old mount
                            self._journal.start_anew()
                    continue
                if self._guarded(self._on_volume) is None:
                    continue  # unavailable now, or the filesystem failed
                if self._engine_unchecked:
                    try:
                        self._check_engine()
                    except OSError as error:  # checked again next tick
                        self._count_failure(error)
                if self._removals:
                    self._apply_removals()
                self._close_stale(now)
                if self._journal.pending():
                    self._flush_journal()
                if now >= next_poll:
                    next_poll = now + self._poll_s
                    self._apply(self._guarded(self._journal.poll, timeout=4 * self._deadline_s) or [])
                if now >= next_expire:
                    next_expire = now + 60.0
                    self._guarded(self._journal.expire, timeout=4 * self._deadline_s)
                if self._unwritten:
                    self._check_unwritten()
                if self._vanished:
                    self._look_again(now)
                if self._resized:
                    self._look_at_sizes(now)
                if now - self._fs_checked >= 5.0:
                    self._fs_checked = now
                    self._guarded(self._refresh_free_space)
                self._sweep(now)
                if self._over_capacity():
                    self._guarded(self._evict, self._evictions_per_tick, timeout=8 * self._deadline_s)
            except Exception:  # a bug: keep the thread, say so
                _log.exception("shared tier maintenance failed")

    def _flush_journal(self) -> None:
        """Append what this host announced to its journal; a failure is counted and logged (the
        lines wait for the next flush): other hosts learn of this host's pages from it."""
        try:
            self._guard.call(self._journal.flush, timeout=self._deadline_s)
        except OSError as error:
            self._count_failure(error)
            if not isinstance(error, Refused):
                self.failure_log.failed("journal write", "shared tier: appending to the journal failed: %s", error)

    def _guarded(self, fn: Callable, *args, timeout: float | None = None, probe: bool = False):
        """Run background work through the guard; failures are counted, not raised."""
        try:
            return self._guard.call(fn, *args, timeout=timeout or self._deadline_s, probe=probe)
        except OSError as error:
            self._count_failure(error)
            return None

    def _sweep(self, now: float) -> None:
        due = now - self._sweeper.last_cycle_end >= self._sweep_interval_s or self._sweeper.cycles == 0
        if not (self._sweeper.in_cycle or due or self._sweep_wanted):
            return
        self._sweep_wanted = False
        # The budget counts from here, not from the tick's start: a slow call earlier in the tick
        # left no budget, and the wish was dropped with no step taken.
        end = time.monotonic() + self._sweep_budget_s
        while not self._stop.is_set():
            finished = self._guarded(self._sweeper.step, timeout=max(5.0, 10 * self._deadline_s))
            if finished is not False:  # a cycle ended, the step failed, or one is still stuck
                if finished is None and not self._sweeper.in_cycle:
                    self._sweep_wanted = True  # refused before its cycle began (the volume just went): still wanted
                return
            if time.monotonic() >= end:
                return

    def _apply(self, announcements) -> None:
        """Count what other hosts announced. A name announced both written and removed in one
        poll is counted removed: two hosts' journals are read one after the other, not in time
        order, and a removal read before the write it followed made a page counted present that
        no file holds (its bytes taking room from real pages). A page written again after its
        removal is a miss meanwhile, until a sweep finds its file."""
        removed = {announcement.name for announcement in announcements if not announcement.present}
        for announcement in announcements:
            if announcement.present and (announcement.name in removed or self._removed_lately(announcement.name)):
                continue  # written before a removal (the sweep finds a later rewrite)
            where = place(announcement.name)
            self._count_announced(announcement, where)
            self._found_again(announcement.name, where)
            if not announcement.present:
                self._forget_recent(announcement.name)
            elif self._foreign:
                with self._lock:
                    self._foreign.pop(announcement.name, None)  # rewritten: maybe in this version now
            if self._events is not None:
                self._events.changed(announcement.name)

    def _count_announced(self, announcement, where: Place) -> None:
        """Count an announcement. A page announced at another size than counted here: two hosts
        may have written the name at two sizes at nearly once, and the one whose file landed
        first be told of it last; counted by the journal's order, its bytes stayed off until the
        next sweep (found by review). Its file is looked at (``_look_at_sizes``); until then the
        announced size counts. So is one of a name waiting for that look already (the size
        counted may be the last announcement's, not the file's), or being written here (which
        landed last, only a look tells; found by review: both left counts off). Under the lock a
        write here counts under, so that a write that lands meanwhile is not undone unlooked at."""
        name = announcement.name
        with self._lock:
            counted = self._presence.size_of(where.directory, where.key_hash)
            unsure = announcement.present and (name in self._resized or name in self._writing or (
                counted is not None and counted != announcement.size))
            if unsure and (name in self._resized or len(self._resized) < RESIZED_REMEMBERED):
                self._wait_for_look(name)
            elif not announcement.present:
                self._resized.pop(name, None)
            self._presence.update(where.directory, where.key_hash, announcement.size, announcement.present)

    def _wait_for_look(self, name: str) -> None:
        """Under the lock: the size of ``name``'s file is looked at once the engine's entry
        cache has expired from now (``_look_at_sizes``)."""
        self._resized[name] = time.monotonic()
        self._resized.move_to_end(name)

    def _look_at_sizes(self, now: float) -> None:
        """Count the bytes the files of the pages in ``_resized`` hold, once the engine's entry
        cache has expired since their announcement (a stat sooner may meet the entry of the file
        the announced one replaced), for ``BACKLOG_BUDGET_S`` a tick (one stat at least). A name
        written or announced again meanwhile is left to that; one gone is left to its removal's
        announcement or the sweep; one whose stat failed waits its turn again."""
        with self._lock:
            due = self._due(self._resized, now)
        end = time.monotonic() + BACKLOG_BUDGET_S
        for name, announced in due:
            where = place(name)
            size = self._guarded(self._file_size, self._layout.page_path(where))
            with self._lock:
                if self._resized.get(name) != announced:
                    continue
                if name in self._writing:  # which lands last, this host's write or the file looked
                    self._wait_for_look(name)  # at, is told after that write (found by review)
                    continue
                if size is None:  # the filesystem failed: again later
                    self._wait_for_look(name)
                    return
                del self._resized[name]
                if size >= 0 and self._presence.contains(where.directory, where.key_hash):
                    self._presence.update(where.directory, where.key_hash, size, True)
            if time.monotonic() >= end:
                return

    def _file_size(self, path: str) -> int:
        """The bytes of the file at ``path``; -1 where there is none."""
        try:
            return self._device.stat(path).st_size
        except OSError as error:
            if error.errno in GONE:
                return -1
            raise

    def _close_stale(self, now: float) -> None:
        with self._lock:
            while self._recent:
                name, opened = next(iter(self._recent.items()))
                if now - opened.at < 2.0:
                    break
                del self._recent[name]
                self._to_close.append(opened.fd)
            fds, self._to_close = self._to_close, []
        if not fds:
            return
        try:
            self._guard.call(self._close_all, fds, timeout=self._deadline_s)
        except Refused:
            with self._lock:
                self._to_close.extend(fds)  # never ran: try again later
        except OSError as error:  # timed out: some may be closed, and their numbers reused
            self._count_failure(error)

    # -- small helpers ------------------------------------------------------------------------

    def _accepting(self) -> bool:
        if not self._guard.available:
            return False
        with self._lock:
            return time.monotonic() >= self._full_until

    def _data_deadline(self, size: int) -> float:
        return self._deadline_s + size / self._min_bandwidth

    def _remember(self, opened: _Opened) -> None:
        with self._lock:
            old = self._recent.pop(opened.page.name, None)
            if old is not None:
                self._to_close.append(old.fd)
            self._recent[opened.page.name] = opened
            while len(self._recent) > self._recent_max:
                self._to_close.append(self._recent.popitem(last=False)[1].fd)

    def _take_recent(self, page: PageMeta) -> _Opened | None:
        with self._lock:
            return self._recent.pop(page.name, None)

    def _defer_close(self, fd: int) -> None:
        with self._lock:
            self._to_close.append(fd)

    def _note_removed(self, name: str) -> None:
        with self._lock:
            _note_newest(self._removed_here, name)

    def _remove_when_back(self, name: str, removed_at: int | None = None) -> None:
        """The page is removed here (now, or at ``removed_at``, ns since the epoch), and its file
        may still be on the volume: absent here meanwhile, the file removed once the volume
        answers (``_apply_removals``)."""
        with self._lock:
            _note_newest(self._removed_here, name)
            _note_newest(self._removals, name, time.time_ns() if removed_at is None else removed_at)
            self._owed_before_start.discard(name)  # (noted again in this run: goes unconditionally)

    def _not_ours(self, name: str, where: Place, size: int) -> None:
        """The file of ``name`` is another format version's, or no page file: neither served
        nor removed here, and not counted (sweeps included) until a write of the name here."""
        with self._lock:
            _note_newest(self._foreign, name)
        self._presence.update(where.directory, where.key_hash, size, False)

    def _owed_now(self) -> tuple[tuple[str, int], ...]:
        """The pages whose files are owed a removal once the volume answers, with when they were
        removed here (``_removals``)."""
        with self._lock:
            return tuple(self._removals.items())

    def _removing(self) -> frozenset[str]:
        """The pages whose files this host is removing, now (``drop``) or once the volume
        answers (``_removals``), is yet to check for a version it replaced (``_unwritten``), or
        found of another format version or no page file (``_foreign``): a listing that finds one does not count it."""
        with self._lock:
            if not (self._unlinking or self._removals or self._unwritten or self._foreign):
                return frozenset()
            return frozenset(self._unlinking).union(self._removals, self._unwritten, self._foreign)

    def _removed_lately(self, name: str) -> bool:
        with self._lock:
            return name in self._removed_here

    def _forget_recent(self, name: str) -> None:
        with self._lock:
            opened = self._recent.pop(name, None)
            if opened is not None:
                self._to_close.append(opened.fd)

    def _count(self, **amounts: int) -> None:
        with self._lock:
            for field, amount in amounts.items():
                setattr(self.counters, field, getattr(self.counters, field) + amount)

    def _count_failure(self, error: OSError) -> None:
        """A device call failed or overran its deadline (refusals while unavailable are not
        device calls, and writes another host's removal overtook no failures: neither counted)."""
        if not isinstance(error, (Refused, Overtaken)):
            self._count(io_errors=1)
