"""The sweep: a slow walk over the shared tier's directories, one directory per step.

It keeps the presence index true to what is on the filesystem (pages older than any journal,
removals nobody announced), removes temporary files whose writer died (those its listings found
unchanged for ``temp_keep_s`` of this host's own time: ``unchanged``), and notes the oldest
pages it saw for the capacity evictor. A step lists one directory, so its cost is one
directory's entries (a few hundred at 100 k pages a pool), never the whole tier; the tier runs
steps within a time budget per tick and waits between cycles.

A listing uses the filesystem's own directory reading with sizes and mtimes (one READDIRPLUS
on a FUSE filesystem), so a walk costs what ``ls -l`` does.

Only the tier's maintenance thread steps it (through its ``CallGuard``); a step that finds an
earlier one still stuck in the filesystem returns at once. ``step`` blocks on the filesystem
and raises ``OSError``.
"""

from __future__ import annotations

import collections
import heapq
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hicachefs.store.shared.device import GONE, Entry
from hicachefs.store.shared.layout import FANOUT_DEPTH, Layout, fanout_name, is_fanout, is_temporary, key_hash
from hicachefs.store.shared.presence import PresenceIndex
from hicachefs.store.shared.unchanged import Unchanged
from hicachefs.typed_stats import level, total


class Candidate(NamedTuple):
    """A page the last cycle saw among the oldest: its file's mtime, page name, size."""

    mtime_ns: int
    name: str
    size: int


@dataclass(frozen=True)
class SweepStatistics:
    sweep_cycles: int = total()
    sweep_last_cycle_seconds: float = level(0.0)
    sweep_directories_listed: int = total()
    sweep_temp_removed: int = total()
    eviction_candidates: int = level()


class Sweeper:
    def __init__(self, device, layout: Layout, presence: PresenceIndex, removing: Callable[[], Collection[str]],
                 oldest_kept: int = 4096, temp_keep_s: float = 600.0) -> None:
        """``removing()``: the pages whose files are being removed here, which a listing that
        still finds them does not count (asked after the listing began recording updates, so
        a removal begun later is in its replay)."""
        self._device = device
        self._layout = layout
        self._presence = presence
        self._removing = removing
        self._oldest_kept = oldest_kept
        self._temp_keep_s = temp_keep_s
        self._temps: dict[str, Unchanged] = {}  # fan-out directory -> its temporary files, as last listed
        self._busy = threading.Lock()
        self._queue: collections.deque[str] = collections.deque()
        self._seen: set[str] = set()
        self._oldest: list[tuple[int, str, int]] = []  # max-heap by -mtime of the oldest pages
        self._cycle_start = 0.0
        self.candidates: collections.deque[Candidate] = collections.deque()  # oldest first
        self.cycles = 0
        self.last_cycle_s = 0.0
        self.last_cycle_end = 0.0
        self.temp_removed = 0
        self.directories_listed = 0

    @property
    def in_cycle(self) -> bool:
        return bool(self._queue)

    def step(self) -> bool | None:
        """List the next directory; return True when that finished a cycle. Returns None at
        once while an earlier step is still stuck in the filesystem."""
        if not self._busy.acquire(blocking=False):
            return None
        try:
            return self._step()
        finally:
            self._busy.release()

    def _step(self) -> bool:
        if not self._queue:
            self._start_cycle()
        relative = self._queue[0]
        fanout = is_fanout(relative)
        removing: Collection[str] = ()
        if fanout:
            self._presence.begin_listing(relative)
            removing = self._removing()
        try:
            entries = self._device.scandir(self._layout.directory(relative))
        except OSError as error:
            if fanout:
                self._presence.abort_listing(relative)
            if error.errno not in GONE or not relative:
                raise  # retried at the next step
            self._presence.forget(relative)
            self._temps.pop(relative, None)
            entries = None
        self._queue.popleft()
        self.directories_listed += 1
        if entries is not None:
            self._take(relative, fanout, entries, removing)
        if self._queue:
            return False
        self._finish_cycle()
        return True

    def _start_cycle(self) -> None:
        # Directories known but not seen last cycle are listed again: gone ones are forgotten,
        # ones made after their parent was listed are kept.
        unseen = [d for d in self._presence.directories() if d not in self._seen] if self.cycles else []
        self._queue.extend([""] + unseen)
        self._seen = set()
        self._oldest = []
        self._cycle_start = time.monotonic()

    def _take(self, relative: str, fanout: bool, entries, removing: Collection[str]) -> None:
        fan = relative.rpartition("/")[2]
        parent = relative.rpartition("/")[0]
        hashes: list[int] = []
        sizes: list[int] = []
        temps: list[Entry] = []
        # Below the fan-out directories' depth nothing is the tier's: not listed.
        deeper = (relative.count("/") + 1 if relative else 0) < FANOUT_DEPTH
        for entry in entries:
            if entry.is_dir:
                if deeper and not entry.name.startswith("."):
                    self._queue.append(f"{relative}/{entry.name}" if relative else entry.name)
                continue
            if entry.name.startswith("."):  # a writer's temporary file, or none of the tier's
                if fanout and is_temporary(relative, entry.name):
                    temps.append(entry)
                continue
            if not fanout:
                continue
            hashed = key_hash(entry.name)
            if fanout_name(hashed) != fan:
                continue  # not a page in its right place: not ours to serve or remove
            name = f"{parent}/{entry.name}" if parent else entry.name
            if name in removing:
                continue
            hashes.append(hashed)
            sizes.append(entry.size)
            item = (-entry.mtime_ns, name, entry.size)
            if len(self._oldest) < self._oldest_kept:
                heapq.heappush(self._oldest, item)
            elif item > self._oldest[0]:
                heapq.heapreplace(self._oldest, item)
        if fanout:
            self._seen.add(relative)
            self._presence.end_listing(relative, np.array(hashes, dtype=np.uint64), np.array(sizes, dtype=np.int64))
            self._remove_old_temps(relative, temps)

    def _remove_old_temps(self, relative: str, temps: list[Entry]) -> None:
        """Remove the temporary files of ``relative`` that its listings found unchanged for
        ``temp_keep_s``: their writers died. Only directories holding some are remembered."""
        unchanged = self._temps.setdefault(relative, Unchanged(self._temp_keep_s))
        if not temps:
            del self._temps[relative]
        for name in unchanged.old(temps):
            self._remove_temp(os.path.join(self._layout.directory(relative), name))

    def _remove_temp(self, path: str) -> None:
        try:
            self._device.unlink(path)
            self.temp_removed += 1
        except OSError as error:
            if error.errno not in GONE:
                raise

    def _finish_cycle(self) -> None:
        oldest = sorted((-negative, name, size) for negative, name, size in self._oldest)
        self.candidates = collections.deque(Candidate(*item) for item in oldest)
        self._oldest = []
        # A directory this cycle did not list is gone: what its temporary files were is forgotten.
        self._temps = {relative: temps for relative, temps in self._temps.items() if relative in self._seen}
        self.cycles += 1
        self.last_cycle_end = time.monotonic()
        self.last_cycle_s = self.last_cycle_end - self._cycle_start

    def statistics(self) -> SweepStatistics:
        return SweepStatistics(sweep_cycles=self.cycles, sweep_last_cycle_seconds=round(self.last_cycle_s, 3),
                               sweep_directories_listed=self.directories_listed,
                               sweep_temp_removed=self.temp_removed, eviction_candidates=len(self.candidates))
