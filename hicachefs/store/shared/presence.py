"""What this host knows is on the shared tier: the key hashes of each fan-out directory.

``contains_many`` is asked on the daemon's event loop, for pages that are mostly real misses,
128 at a time; asking the filesystem per page costs ~0.35 ms a page on GlusterFS (50 ms for
128), and a hung filesystem would hang the loop. So the answer comes from memory: a sorted
array of 64-bit key hashes per fan-out directory (8 bytes a page), taken from a listing of that
directory, plus small sets of hashes added and removed since (this host's own writes and
removals, and what other hosts announce in their journals). Adds and removals are folded into
the array when they grow past a bound, so every operation costs at most one directory's worth.

A listing races with updates that land while it runs: ``begin_listing`` starts recording the
directory's updates, and ``end_listing`` replays them over the listing's result, so an update
made during the listing is never lost.

Each directory counts its pages' bytes (the size bound measures them). A pool's pages share one
size, so a directory keeps its usual size and only the sizes of the pages that differ (a dict,
empty in practice): a page written again at another size, or removed, changes the count by what
was counted for it, so the count stays what the files hold between sweeps.

A 64-bit hash collision could answer yes for a page that is not there; reading it would then
find no such file (a miss), never wrong bytes.

Thread-safe: one lock; nothing here blocks or does I/O.
"""

from __future__ import annotations

import threading

import numpy as np

from hicachefs.store.held_paths import HeldPaths
from hicachefs.store.shared.layout import place

_FOLD_AT = 1024  # adds + removals a directory keeps beside its array before folding them in


class _Directory:
    __slots__ = ("hashes", "added", "removed", "pages", "bytes", "usual", "sizes", "replay")

    def __init__(self) -> None:
        self.hashes = np.empty(0, dtype=np.uint64)
        self.added: set[int] = set()
        self.removed: set[int] = set()
        self.pages = 0
        self.bytes = 0
        self.usual = 0  # the size of most of its pages
        self.sizes: dict[int, int] = {}  # pages of another size than ``usual``
        self.replay: list[tuple[bool, int, int]] | None = None  # updates during a listing

    def has(self, hashed: int) -> bool:
        if hashed in self.added:
            return True
        if hashed in self.removed or not len(self.hashes):
            return False
        index = int(np.searchsorted(self.hashes, np.uint64(hashed)))
        return index < len(self.hashes) and int(self.hashes[index]) == hashed

    def size_of(self, hashed: int) -> int | None:
        return self.sizes.get(hashed, self.usual) if self.has(hashed) else None

    def update(self, present: bool, hashed: int, size: int) -> None:
        """A page appeared (again, maybe at another size: its new size counts) or went (what
        was counted for it goes, whatever ``size`` says)."""
        if self.replay is not None:
            self.replay.append((present, hashed, size))
        held = self.has(hashed)
        if not (present or held):
            return
        if held:
            self.bytes -= self.sizes.pop(hashed, self.usual)
            self.pages -= 1
        if present:
            if not self.pages:
                self.usual = size
            if size != self.usual:
                self.sizes[hashed] = size
            self.bytes += size
            self.pages += 1
        if present == held:
            return
        if present:
            self.removed.discard(hashed)
            self.added.add(hashed)
        else:
            self.added.discard(hashed)
            self.removed.add(hashed)
        if len(self.added) + len(self.removed) >= _FOLD_AT:
            self.fold()

    def fold(self) -> None:
        hashes = self.hashes
        if self.removed:
            hashes = hashes[~np.isin(hashes, np.fromiter(self.removed, np.uint64, len(self.removed)))]
        if self.added:
            hashes = np.union1d(hashes, np.fromiter(self.added, np.uint64, len(self.added)))
        self.hashes, self.added, self.removed = hashes, set(), set()


class PresenceIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._directories: dict[str, _Directory] = {}
        self._held = HeldPaths()  # the directories holding pages, and their ancestors (``holds_under``)

    def contains_many(self, names: list[str]) -> list[bool]:
        places = [place(name) for name in names]  # hashing outside the lock
        with self._lock:
            directories = self._directories
            answers = []
            for where in places:
                directory = directories.get(where.directory)
                answers.append(directory is not None and directory.has(where.key_hash))
            return answers

    def contains(self, directory: str, hashed: int) -> bool:
        with self._lock:
            entry = self._directories.get(directory)
            return entry is not None and entry.has(hashed)

    def size_of(self, directory: str, hashed: int) -> int | None:
        """The bytes counted for the page; None when it is not counted."""
        with self._lock:
            entry = self._directories.get(directory)
            return entry.size_of(hashed) if entry is not None else None

    def update(self, directory: str, hashed: int, size: int, present: bool) -> None:
        """A page appeared (``present``, of ``size`` bytes) or went away (what was counted for
        it goes: ``size`` is not needed)."""
        with self._lock:
            entry = self._directories.get(directory)
            if entry is None:
                if not present:
                    return
                entry = self._directories[directory] = _Directory()
            entry.update(present, hashed, size)
            self._recount(directory)

    def begin_listing(self, directory: str) -> None:
        with self._lock:
            self._directories.setdefault(directory, _Directory()).replay = []

    def end_listing(self, directory: str, hashes: np.ndarray, sizes: np.ndarray) -> None:
        """Replace what is known of ``directory`` by a listing begun with ``begin_listing``:
        ``hashes`` of its pages (any order, uint64) and their ``sizes``."""
        hashes, first = np.unique(hashes.astype(np.uint64, copy=False), return_index=True)
        sizes = np.asarray(sizes, dtype=np.int64)[first]
        with self._lock:
            old = self._directories.get(directory)
            replay = old.replay if old is not None and old.replay is not None else []
            fresh = _Directory()
            fresh.hashes, fresh.pages, fresh.bytes = hashes, len(hashes), int(sizes.sum())
            if len(sizes):
                values, counts = np.unique(sizes, return_counts=True)
                fresh.usual = int(values[np.argmax(counts)])
                other = sizes != fresh.usual
                fresh.sizes = dict(zip(hashes[other].tolist(), sizes[other].tolist()))
            for present, hashed, size in replay:
                fresh.update(present, hashed, size)
            if fresh.pages:
                self._directories[directory] = fresh
            else:
                self._directories.pop(directory, None)
            self._recount(directory)

    def abort_listing(self, directory: str) -> None:
        with self._lock:
            entry = self._directories.get(directory)
            if entry is not None:
                entry.replay = None

    def forget(self, directory: str) -> None:
        """The directory is gone (removed, or no longer listed): forget its pages."""
        with self._lock:
            self._directories.pop(directory, None)
            self._recount(directory)

    def directories(self) -> list[str]:
        with self._lock:
            return list(self._directories)

    def holds_under(self, path: str) -> bool:
        """Whether a directory known to hold pages now lies under ``path`` (a namespace prefix
        such as ``model/format``): one lookup, however many directories the tier holds (a scan
        of them ran at every lookup of a missing name)."""
        with self._lock:
            return self._held.holds(path)

    def _recount(self, directory: str) -> None:
        """Under the lock, after ``directory``'s entry changed: count it as holding pages or not."""
        entry = self._directories.get(directory)
        self._held.mark(directory, entry is not None and entry.pages > 0)

    def totals(self) -> tuple[int, int]:
        """(pages, bytes) known on the tier. O(directories), not O(pages)."""
        with self._lock:
            entries = list(self._directories.values())
        return sum(entry.pages for entry in entries), sum(entry.bytes for entry in entries)

    def clear(self) -> None:
        with self._lock:
            self._directories.clear()
            self._held = HeldPaths()
