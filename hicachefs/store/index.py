"""Name -> page facts, in numpy columns with an open-addressing hash table: no Python object per page.

Why not a dict of entries: a dict entry plus a 64-char str key plus an entry object costs
300+ bytes per page; at millions of small pages that is the daemon's RAM. Here a page is one
row across fixed-width columns (88 bytes, plus 8 per tier for its location there) plus two
int32 table slots (the table is kept at most half full) and 12 bytes in its directory's
listing (below): about 124 bytes with two tiers.
Tiers are named by their position in the store's list of tiers: ``loc[row, tier]`` is where
the page lives in that tier, -1 where it does not, so a new tier adds a column, not code. A name is split on its last '/': the directory is stored
once and referenced by id; a key of 64 lowercase hex chars is stored as its 32 bytes, any
other key by a 32-byte BLAKE2b digest plus its text in a side dict (rare in real traffic).
Lookups probe linearly from a hash mixed from the directory id and the key's 32 bytes (keys
are hashes already); the mix is plain 64-bit arithmetic, so a batch of names is hashed and
probed with numpy in a few vector operations (``find_many``). Deletes leave tombstones,
swept by a vectorised rebuild when the table gets crowded.

A tier's rows leave and enter in bulk as ``PageColumns`` (``pages_in``, ``load``): that is what
the SSD tier's index snapshot holds, so a warm start does no Python work per page.

The pages located in each tier and the bytes of all are counted as rows come, move and go
(``pages_in_tier``, ``used_bytes``): the statistics, which any user may ask for on the daemon's
one thread, cost the tiers, not the pages.

Each directory keeps its rows in the order their names were first added (``_Listing``), so that
a listing is read a batch at a time from a cursor (``listed``) at a cost that does not grow with
the directory or the store: a page's cursor is a number from one counter, kept while the name
keeps a page (a replace takes the old row's place), so every page that stays is listed exactly
once however the listing interleaves with changes. That costs 20 bytes a page more (the cursor
column, and the directory's row and cursor).

One row's cells are read and written through memoryviews of the columns (``_Cells``), not
numpy's scalar indexing: that costs a third to a half as much, and a data-plane commit writes
some twenty cells a page on the daemon's one thread.

Not thread-safe: the store's lock guards every call.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from hicachefs.store.index_memory import EMPTY as _EMPTY, FREE_DIR as _FREE_DIR, TOMB as _TOMB
from hicachefs.store.index_memory import ROW, Described, IndexMemory
from hicachefs.store.held_paths import HeldPaths
_GONE = -1  # a listing's entry whose row was removed
#: A listing is compacted once more than half its entries are gone (and at least this many).
_FEW_GONE = 64


_MASK = (1 << 64) - 1
_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD)
_FINAL = 0xC4CEB9FE1A85EC53
_KEY = struct.Struct("<4Q")


def _hash_one(dir_id: int, kid: bytes) -> int:
    k0, k1, k2, k3 = _KEY.unpack(kid)
    m0, m1, m2, m3, m4 = _MIX
    h = ((k0 * m0 + k1 * m1 + k2 * m2 + k3 * m3) ^ (dir_id * m4)) & _MASK
    h ^= h >> 33
    h = (h * _FINAL) & _MASK
    return h ^ (h >> 33)


def _hash_many(dir_ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``_hash_one`` over arrays (uint64 arithmetic wraps exactly as the masked Python ints)."""
    mix = np.array(_MIX, np.uint64)
    h = (keys @ mix[:4]) ^ (dir_ids.astype(np.uint64) * mix[4])  # integer matmul: no (n, 4) temporary
    h ^= h >> np.uint64(33)
    h *= np.uint64(_FINAL)
    return h ^ (h >> np.uint64(33))


def _key_ids(keys: list[str]) -> np.ndarray:
    """``_key_id`` of each key as an (n, 4) uint64 array; when every key is 64 lowercase hex
    chars (real traffic) they are decoded in one call. (Every key's length is checked: keys of
    63 and 65 hex chars side by side decode whole too, each to the wrong identity.)"""
    raw = b""
    if set(map(len, keys)) == {64}:
        text = "".join(keys)
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            pass
        if raw.hex() != text:  # some key is not canonical hex (upper case, spaces fromhex skips)
            raw = b""
    if len(raw) != 32 * len(keys):
        raw = b"".join([_key_id(key)[0] for key in keys])
    return np.frombuffer(raw, np.uint64).reshape(len(keys), 4)


_ROW_BYTES, _KEY_AT = ROW.itemsize, ROW.fields["key"][1]


class _Cells:
    """Memoryviews of the index's columns, for one cell at a time (see the module docstring):
    the shared rows' fields, the table, the private columns, and the shared rows' bytes (a
    key's 32 bytes lie at ``row * _ROW_BYTES + _KEY_AT``). Made anew whenever a column moves."""

    __slots__ = ("gen", "hash", "dir", "size", "checksum", "ram", "disk", "table", "row_bytes",
                 "hits", "mtime", "atime", "cursor", "loc")

    def __init__(self, index: "PageIndex") -> None:
        view = memoryview
        self.gen, self.hash, self.dir, self.size = view(index.gen), view(index.hash), view(index.dir), view(index.size)
        self.checksum, self.ram, self.disk = view(index.checksum), view(index._ram), view(index._disk)
        self.table, self.row_bytes = view(index._table), view(index.memory.rows.view(np.uint8))
        self.hits, self.mtime, self.atime = view(index.hits), view(index.mtime), view(index.atime)
        self.cursor, self.loc = view(index.cursor), view(index.loc)


def _split(name: str) -> tuple[str, str]:
    directory, _, key = name.rpartition("/")
    return directory, key


def _key_id(key: str) -> tuple[bytes, bool]:
    """The key's 32-byte identity, and whether it is plain hex (recoverable from those bytes)."""
    if len(key) == 64:
        try:
            raw = bytes.fromhex(key)
        except ValueError:
            pass
        else:
            if raw.hex() == key:
                return raw, True
    return hashlib.blake2b(key.encode(), digest_size=32).digest(), False


def _table_size(capacity: int) -> int:
    """A table for ``capacity`` rows: a power of two, at least twice as many slots (half full at most)."""
    return 1 << max(4, (2 * capacity - 1).bit_length())


class PageColumns(NamedTuple):
    """The pages of one tier, column by column; ``dir`` indexes ``directories``, ``odd_keys``
    maps a position to the text of a key that is not 64 lowercase hex chars."""

    directories: list[str]
    dir: np.ndarray  # int32
    keys: np.ndarray  # (n, 4) uint64: the keys' 32-byte identities
    odd_keys: dict[int, str]
    size: np.ndarray  # uint32
    checksum: np.ndarray  # uint64
    mtime: np.ndarray  # int64, ns
    location: np.ndarray  # int64: where each page is in the tier

    def name_lengths(self) -> np.ndarray:
        """The UTF-8 length of each page's name (what its record on disk holds), int64."""
        per_dir = np.array([len(d.encode()) + bool(d) for d in self.directories], np.int64)
        lengths = per_dir[self.dir] + 64
        for position, key in self.odd_keys.items():
            lengths[position] += len(key.encode()) - 64
        return lengths


class _Listing:
    """One directory's rows in the order their names were added: ``cursors`` ascending, and
    ``rows`` the row at each (``_GONE`` once removed). Appending is amortised O(1), removing is
    a binary search, and the gone entries are dropped in one vectorised pass when they are more
    than half (so a listing never holds more than twice its pages)."""

    __slots__ = ("cursors", "rows", "count", "gone", "_cursor_cells", "_row_cells")

    def __init__(self, cursors: np.ndarray | None = None, rows: np.ndarray | None = None) -> None:
        self._hold(np.zeros(16, np.int64) if cursors is None else cursors,
                   np.full(16, _GONE, np.int32) if rows is None else rows)
        self.count = 0 if cursors is None else len(cursors)
        self.gone = 0

    def _hold(self, cursors: np.ndarray, rows: np.ndarray) -> None:
        """Keep these arrays, and memoryviews of them for one entry at a time (``_Cells``)."""
        self.cursors, self.rows = cursors, rows
        self._cursor_cells, self._row_cells = memoryview(cursors), memoryview(rows)

    def make_room(self) -> None:
        """Room for one more entry (``PageIndex.make_room``)."""
        if self.count == len(self.rows):
            self._resize(2 * self.count)

    def append(self, cursor: int, row: int) -> None:
        self.make_room()
        self._cursor_cells[self.count] = cursor
        self._row_cells[self.count] = row
        self.count += 1

    def position(self, cursor: int) -> int:
        return bisect_left(self._cursor_cells, cursor, 0, self.count)  # half numpy's time for one

    def hold(self, cursor: int) -> None:
        """The entry's row goes, and another takes its place at once (``take``)."""
        self._row_cells[self.position(cursor)] = _GONE

    def take(self, cursor: int, row: int) -> None:
        self._row_cells[self.position(cursor)] = row

    def remove(self, cursor: int) -> None:
        self._row_cells[self.position(cursor)] = _GONE
        self.gone += 1
        if self.gone > max(_FEW_GONE, self.count // 2):
            kept = np.flatnonzero(self.rows[: self.count] != _GONE)
            # Room for one more kept: a publish made room for its page before its own work
            # removed pages here (an eviction, a rename's source), and its add must not grow.
            self._resize(max(16, len(kept) + 1), kept)
            self.gone = 0

    def after(self, cursor: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``limit`` (rows, cursors) that follow ``cursor``. Gone entries are skipped in
        vectorised windows, so a request's work is its entries and the gone ones among them."""
        start = int(np.searchsorted(self.cursors[: self.count], cursor, side="right"))
        rows, cursors = [], []
        found = 0
        while start < self.count and found < limit:
            end = min(self.count, start + 2 * (limit - found) + 16)
            live = np.flatnonzero(self.rows[start:end] != _GONE)[: limit - found] + start
            rows.append(self.rows[live])
            cursors.append(self.cursors[live])
            found += len(live)
            start = end if found < limit else int(live[-1]) + 1
        if not rows:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(cursors)

    def _resize(self, capacity: int, kept: np.ndarray | None = None) -> None:
        """Arrays of ``capacity`` entries for the entries kept: all, or those at ``kept``."""
        count = self.count if kept is None else len(kept)
        kept = slice(0, count) if kept is None else kept
        cursors = np.zeros(capacity, np.int64)
        rows = np.full(capacity, _GONE, np.int32)
        cursors[:count] = self.cursors[kept]
        rows[:count] = self.rows[kept]
        self._hold(cursors, rows)
        self.count = count


class PageIndex:
    """Rows of page facts addressed by name. Columns are public numpy arrays indexed by row: the
    ones the data plane reads (``hash``, ``keys``, ``dir``, ``size``, ``checksum``, and each row's
    ``gen``) are views of ``memory``, the shared part (``index_memory``); the others are private."""

    _COLUMNS = {
        "hits": np.uint32,
        "mtime": np.int64,
        "atime": np.int64,
        "cursor": np.int64,  # the row's place in its directory's listing
    }

    def __init__(self, tiers: int, capacity: int = 1024, described: Described = Described()) -> None:
        self._described = described
        self._rows = 0  # rows ever used (high-water mark)
        self._free_rows: list[int] = []
        self._live = 0
        self._tombs = 0
        self._replacing = False  # a name is between its old row and its new one (``replacing``)
        # Pages located in each tier, and the bytes of all: kept as rows change, so that the
        # statistics (any user may ask) cost the tiers, not the pages.
        self._tier_pages = [0] * tiers
        self._live_bytes = 0
        for column, dtype in self._COLUMNS.items():
            setattr(self, column, np.zeros(capacity, dtype))
        self.loc = np.full((capacity, tiers), -1, np.int64)
        self._use(IndexMemory(capacity, _table_size(capacity), described))
        self._odd_keys: dict[int, str] = {}  # row -> key text, for keys that are not 64 hex chars
        self._dir_ids: dict[str, int] = {}
        self._dir_names: list[str] = []
        self._dir_pages: list[int] = []
        self._held = HeldPaths()  # the directories holding pages, and their ancestors
        self._listings: list[_Listing] = []  # by directory id
        self._next_cursor = 1
        # The last name looked up, and its parts: (name, directory, key, key id, plain, dir id,
        # hash). A publish finds a name and then adds it; parsing and hashing it once is a tenth
        # of the daemon's work per page of a data-plane commit.
        self._last: tuple | None = None

    def _use(self, memory: IndexMemory) -> None:
        """Point the shared columns at ``memory`` (the old memory, if any, is left to its readers)."""
        self.memory = memory
        rows = memory.rows
        self.gen, self.hash, self.keys, self.dir = rows["gen"], rows["hash"], rows["key"], rows["dir"]
        self.size, self.checksum, self._ram, self._disk = rows["size"], rows["checksum"], rows["ram"], rows["disk"]
        self._table = memory.table
        self._cells = _Cells(self)

    def _move_to(self, capacity: int, slots: int, private: dict[str, np.ndarray] | None = None) -> None:
        """Move the shared columns to new memory of this shape: the rows are copied, the table is
        copied where it keeps its size (the rows keep their numbers: growing the rows of millions
        of pages spent 40 % of its stall of the event loop re-inserting them), else built anew
        there, and readers of the old memory are told to look again. ``private``: the private
        columns' arrays for that capacity, taken once the new memory is had (where it is not, for
        want of memory, the index stays as it was)."""
        old = self.memory
        memory = IndexMemory(capacity, slots, self._described)
        for column, values in (private or {}).items():
            setattr(self, column, values)
        if self._replacing:  # the name replaced is in no row until the replace ends
            memory.rebuilding()
        kept = min(old.capacity, capacity)
        memory.rows[:kept] = old.rows[:kept]
        self._use(memory)
        if slots == old.slots and capacity >= old.capacity:
            self._table[:] = old.table  # (its tombstones with it: still counted)
        else:
            self._fill_table(self._table)
        old.moved()
        old.release()

    @property
    def described(self) -> Described:
        return self._described

    def describe(self, described: Described) -> None:
        """What the shared index says of the files its rows point into (``index_memory``)."""
        self._described = described
        self.memory.describe(described)

    def dir_id(self, directory: str) -> int:
        """The number of ``directory``, given it if it has none yet (the data plane's clients
        hash it with the key: ``_hash_one``). Numbers are never reused while the index lives."""
        dir_id = self._dir_ids.get(directory)
        if dir_id is None:
            dir_id = self._dir_ids[directory] = len(self._dir_names)
            self._dir_names.append(directory)
            self._dir_pages.append(0)
            self._listings.append(_Listing())
        return dir_id

    def locate(self, row: int, tier: int, location: int, offset: int = -1) -> None:
        """The row's page is at ``location`` in ``tier`` now (-1: not there); ``offset``: where
        its bytes begin in the file that tier shares with the data plane (tiers 0 and 1)."""
        gen = self._cells.gen
        gen[row] += 1  # odd: changing
        self._place(row, tier, location, offset)
        gen[row] += 1

    def _place(self, row: int, tier: int, location: int, offset: int) -> None:
        cells = self._cells
        if cells.dir[row] != _FREE_DIR:
            self._tier_pages[tier] += (location >= 0) - (cells.loc[row, tier] >= 0)
        cells.loc[row, tier] = location
        if tier == 0:
            cells.ram[row] = offset
        elif tier == 1:
            cells.disk[row] = offset

    # -- lookups -----------------------------------------------------------------------

    def _parsed(self, name: str) -> tuple:
        """``name``'s parts (see ``_last``), its dir id and hash -1 while its directory has none."""
        last = self._last
        if last is not None and last[0] == name and last[5] >= 0:
            return last
        directory, key = _split(name)
        kid, plain = _key_id(key)
        dir_id = self._dir_ids.get(directory, -1)
        self._last = (name, directory, key, kid, plain, dir_id, _hash_one(dir_id, kid) if dir_id >= 0 else -1)
        return self._last

    def find(self, name: str) -> int:
        """The row holding ``name``, or -1."""
        _, _, _, raw, _, dir_id, h = self._parsed(name)
        if dir_id < 0:
            return -1
        cells = self._cells
        table, mask = cells.table, len(cells.table) - 1
        i = h & mask
        while True:
            row = table[i]
            if row == _EMPTY:
                return -1
            if row >= 0 and cells.hash[row] == h and cells.dir[row] == dir_id:
                at = row * _ROW_BYTES + _KEY_AT
                if cells.row_bytes[at : at + 32].tobytes() == raw:
                    return row
            i = (i + 1) & mask

    @staticmethod
    def prepare_many(names: Iterable[str]) -> tuple[list[str], np.ndarray]:
        """The per-name work of ``find_many`` (splitting, decoding keys), which needs no lock."""
        splits = list(map(str.rpartition, names, repeat("/")))
        return list(map(itemgetter(0), splits)), _key_ids(list(map(itemgetter(2), splits)))

    def find_many(self, prepared: tuple[list[str], np.ndarray]) -> np.ndarray:
        """A bool per name of ``prepare_many(names)``: is it present."""
        return self._rows_many(prepared) >= 0

    def sizes_many(self, prepared: tuple[list[str], np.ndarray]) -> np.ndarray:
        """Per name of ``prepare_many(names)``: its page's size, -1 where none (signed: sizes
        are stored unsigned, and -1 among them would read as 4294967295, a page held)."""
        rows = self._rows_many(prepared)
        return np.where(rows >= 0, self.size[np.maximum(rows, 0)].astype(np.int64), -1)

    def _rows_many(self, prepared: tuple[list[str], np.ndarray]) -> np.ndarray:
        """Per name of ``prepare_many(names)``: its row, -1 where none. Hashing and probing are
        vectorised."""
        directories, k = prepared
        n = len(directories)
        found = np.full(n, -1, np.int32)
        if n == 0 or self._live == 0:
            return found
        d = np.fromiter(map(self._dir_ids.get, directories, repeat(-2)), np.int32, n)
        h = _hash_many(d, k)
        mask = np.uint64(len(self._table) - 1)
        pos = h & mask
        active = np.nonzero(d >= 0)[0]
        while active.size:
            rows = self._table[pos[active].astype(np.int64)]
            safe = np.maximum(rows, 0)
            hit = (
                (rows >= 0)
                & (self.hash[safe] == h[active])
                & (self.dir[safe] == d[active])
                & (self.keys[safe] == k[active]).all(axis=1)
            )
            found[active[hit]] = rows[hit]
            active = active[~hit & (rows != _EMPTY)]
            pos[active] = (pos[active] + np.uint64(1)) & mask
        return found

    def name(self, row: int) -> str:
        cells = self._cells
        directory = self._dir_names[cells.dir[row]]
        key = self._odd_keys.get(row)
        if key is None:
            at = row * _ROW_BYTES + _KEY_AT
            key = cells.row_bytes[at : at + 32].hex()
        return f"{directory}/{key}" if directory else key

    def names(self, rows: np.ndarray) -> list[str]:
        """``name`` of many rows at once (a listing's batch)."""
        hexed = self.keys[rows].tobytes().hex()
        dirs = [self._dir_names[d] for d in self.dir[rows].tolist()]
        odd = self._odd_keys
        return [f"{d}/{odd.get(row) or hexed[64 * i : 64 * i + 64]}" if d else odd.get(row) or hexed[64 * i : 64 * i + 64]
                for i, (d, row) in enumerate(zip(dirs, rows.tolist()))]

    # -- changes -----------------------------------------------------------------------

    def add(self, name: str, size: int, checksum: int, mtime_ns: int, tier: int, location: int,
            cursor: int = 0, offset: int = -1) -> int:
        """Store a new row for ``name``, which must be absent (remove the old row first), at
        ``location`` in ``tier`` (more tiers are set through ``locate``), its bytes at ``offset``
        in the file that tier shares with the data plane. ``cursor``: the place in its
        directory's listing that ``remove(..., keep_place=True)`` of its old row returned; 0: a
        new place, at the end."""
        self._table_room()  # before the new row is filled in
        _, directory, key, kid, plain, dir_id, h = self._parsed(name)
        if dir_id < 0:
            dir_id = self.dir_id(directory)
            h = _hash_one(dir_id, kid)
        if self._free_rows:
            row = self._free_rows.pop()
        else:
            if self._rows == len(self.size):
                self._grow()  # (may fail for memory: nothing is counted before it)
            row = self._rows
            self._rows += 1
        self._dir_pages[dir_id] += 1
        if self._dir_pages[dir_id] == 1:
            self._held.gained(self._dir_names[dir_id])
        cells = self._cells
        cells.gen[row] += 1  # odd while the row is filled; in the table only once whole
        cells.hash[row] = h
        cells.dir[row] = dir_id
        at = row * _ROW_BYTES + _KEY_AT
        cells.row_bytes[at : at + 32] = kid
        if not plain:
            self._odd_keys[row] = key
        cells.size[row] = size
        cells.hits[row] = 0
        cells.checksum[row] = checksum
        cells.mtime[row] = cells.atime[row] = mtime_ns
        loc = cells.loc
        for column in range(loc.shape[1]):
            loc[row, column] = -1
        cells.ram[row] = cells.disk[row] = -1
        self._place(row, tier, location, offset)
        self._live_bytes += size
        cells.gen[row] += 1
        listing = self._listings[dir_id]
        if cursor:
            listing.take(cursor, row)
        else:
            cursor = self._next_cursor
            self._next_cursor += 1
            listing.append(cursor, row)
        cells.cursor[row] = cursor
        table, mask = cells.table, len(cells.table) - 1
        i = h & mask
        while table[i] >= 0:
            i = (i + 1) & mask
        if table[i] == _TOMB:
            self._tombs -= 1
        table[i] = row
        self._live += 1
        return row

    def remove(self, row: int, keep_place: bool = False) -> int:
        """Forget ``row``; its number may be reused by the next add. ``keep_place``: the name is
        added again at once (a replace), in the same place of its directory's listing, whose
        cursor this returns for that ``add``."""
        cells = self._cells
        table, mask = cells.table, len(cells.table) - 1
        i = cells.hash[row] & mask
        while table[i] != row:
            i = (i + 1) & mask
        table[i] = _TOMB
        self._tombs += 1
        self._live -= 1
        self._uncount(row)
        dir_id = cells.dir[row]
        self._dir_pages[dir_id] -= 1
        if not self._dir_pages[dir_id]:
            self._held.lost(self._dir_names[dir_id])
        cursor = cells.cursor[row]
        if keep_place:
            self._listings[dir_id].hold(cursor)
        else:
            self._listings[dir_id].remove(cursor)
        cells.gen[row] += 1
        cells.dir[row] = _FREE_DIR
        cells.ram[row] = cells.disk[row] = -1
        cells.gen[row] += 1
        self._odd_keys.pop(row, None)
        self._free_rows.append(row)
        return cursor

    def _uncount(self, row: int) -> None:
        """The live ``row`` goes: its page leaves the counts of its tiers and bytes."""
        cells = self._cells
        for tier in range(len(self._tier_pages)):
            if cells.loc[row, tier] >= 0:
                self._tier_pages[tier] -= 1
        self._live_bytes -= cells.size[row]

    @contextlib.contextmanager
    def replacing(self) -> Iterator[None]:
        """A page is swapped for a new one of its name (``remove(..., keep_place=True)``, then
        ``add``): meanwhile the name is in no row of the table, so ``table_gen`` is odd, as
        during a rebuild, and the data plane's readers ask the daemon rather than take that
        for a miss (a replace is atomic, as a rename). ``add`` may move the index: the new
        memory is marked as well until the replace ends (``_move_to``)."""
        memory = self.memory
        memory.rebuilding()
        self._replacing = True
        try:
            yield
        finally:
            self._replacing = False
            memory.rebuilt()
            if self.memory is not memory:
                self.memory.rebuilt()

    def pages_in(self, tier: int) -> PageColumns:
        """The rows located in ``tier``, as columns (copies), with only the directories they use."""
        rows = np.nonzero((self.loc[: self._rows, tier] >= 0) & (self.dir[: self._rows] != _FREE_DIR))[0]
        used, dirs = np.unique(self.dir[rows], return_inverse=True)
        odd_rows = np.fromiter(self._odd_keys, np.int64, len(self._odd_keys))
        odd_rows = odd_rows[np.isin(odd_rows, rows)]
        odd_keys = dict(zip(np.searchsorted(rows, odd_rows).tolist(), map(self._odd_keys.get, odd_rows.tolist())))
        return PageColumns(
            directories=[self._dir_names[i] for i in used.tolist()],
            dir=dirs.astype(np.int32),
            keys=self.keys[rows],
            odd_keys=odd_keys,
            size=self.size[rows],
            checksum=self.checksum[rows],
            mtime=self.mtime[rows],
            location=self.loc[rows, tier],
        )

    def load(self, tier: int, pages: PageColumns, offsets: np.ndarray | None = None) -> None:
        """Fill this empty index with ``pages``, located in ``tier`` (``offsets``: where their
        bytes begin in the file that tier shares with the data plane): the columns are copied in
        whole and the hash table built vectorised. Names must be distinct, ``dir`` in range."""
        if self._rows:
            raise ValueError("load needs an empty index")
        n = len(pages.size)
        capacity = max(n + n // 4, len(self.size))  # room to add: sized to n, the first add after a
        # start grew the whole index on the event loop (3.8 s at 8 million pages; found by review)
        for column, dtype in self._COLUMNS.items():
            setattr(self, column, np.zeros(capacity, dtype))
        self.loc = np.full((capacity, self.loc.shape[1]), -1, np.int64)
        self._move_to(capacity, _table_size(capacity))
        self.gen[:n] = 2
        self.dir[:n] = pages.dir
        self.keys[:n] = pages.keys
        self.hash[:n] = _hash_many(self.dir[:n], self.keys[:n])
        self.size[:n] = pages.size
        self.checksum[:n] = pages.checksum
        self.mtime[:n] = self.atime[:n] = pages.mtime
        self.loc[:n, tier] = pages.location
        if offsets is not None and tier in (0, 1):
            (self._ram if tier == 0 else self._disk)[:n] = offsets
        self._dir_names = list(pages.directories)
        self._dir_ids = {name: i for i, name in enumerate(self._dir_names)}
        self._last = None  # its dir id may have been another's
        self._dir_pages = np.bincount(pages.dir, minlength=len(self._dir_names)).tolist()
        self._held = HeldPaths()
        for name, count in zip(self._dir_names, self._dir_pages):
            if count:
                self._held.gained(name)
        self._odd_keys = dict(pages.odd_keys)
        self._rows = self._live = n
        self._tier_pages = [0] * self.loc.shape[1]
        self._tier_pages[tier] = int(np.count_nonzero(pages.location >= 0))
        self._live_bytes = int(pages.size.sum(dtype=np.int64))
        self._rebuild(len(self._table))
        by_dir = np.argsort(pages.dir, kind="stable").astype(np.int32)  # each directory's rows in order
        self.cursor[by_dir] = np.arange(1, n + 1)
        self._next_cursor = n + 1
        ends = np.cumsum(self._dir_pages)
        self._listings = [_Listing(self.cursor[rows], rows) for rows in np.split(by_dir, ends[:-1])
                          ] if self._dir_names else []

    def make_room(self, name: str) -> None:
        """Grow now what ``add(name)`` would grow (the table, the rows, the directory's listing),
        so that it cannot fail for want of memory once its caller has begun to change the store
        (``remove`` neither needs room nor makes a later ``add`` need more)."""
        self._table_room()
        if not self._free_rows and self._rows == len(self.size):
            self._grow()
        self._listings[self.dir_id(self._parsed(name)[1])].make_room()

    def _table_room(self) -> None:
        """Rebuild the table where one more row would fill it past half, tombstones counted."""
        if 2 * (self._live + self._tombs + 1) > len(self._table):
            self._rebuild(len(self._table) * (2 if 4 * (self._live + 1) > len(self._table) else 1))

    def _grow(self) -> None:
        new = 2 * len(self.size)
        private = {}
        for column in self._COLUMNS:
            old = getattr(self, column)
            private[column] = np.zeros(new, old.dtype)
            private[column][: len(old)] = old
        private["loc"] = np.full((new, self.loc.shape[1]), -1, np.int64)
        private["loc"][: len(self.loc)] = self.loc
        self._move_to(new, len(self._table), private)

    def _rebuild(self, table_size: int) -> None:
        """Re-insert every live row into a fresh table: in place when it keeps its size (readers'
        probes may miss meanwhile: ``table_gen``), else in new shared memory."""
        if table_size != len(self._table):
            self._move_to(len(self.size), table_size)
            return
        table = np.full(table_size, _EMPTY, np.int32)
        self._fill_table(table)
        self.memory.rebuilding()
        self._table[:] = table
        self.memory.rebuilt()

    def _fill_table(self, table: np.ndarray) -> None:
        """Insert every live row into ``table`` (all ``EMPTY``), vectorised. Rows inserted in the
        order of their home slots each land in the first free slot at or after their home: the
        later of their home and the slot after the previous row's, a running maximum. The few
        pushed past the end wrap round to the first free slots from the start, where a probe
        finds them."""
        table_size = len(table)
        rows = np.nonzero(self.dir[: self._rows] != _FREE_DIR)[0]
        home = (self.hash[rows] & np.uint64(table_size - 1)).astype(np.int64)
        order = np.argsort(home)
        rows, home = rows[order], home[order]
        steps = np.arange(len(rows), dtype=np.int64)
        slots = np.maximum.accumulate(home - steps) + steps
        inside = slots < table_size
        table[slots[inside]] = rows[inside]
        free = 0
        for row in rows[~inside].tolist():
            while table[free] != _EMPTY:
                free += 1
            table[free] = row
        self._tombs = 0

    # -- directories and scans ---------------------------------------------------------

    def listed(self, directory: str, after: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``limit`` rows of ``directory`` that follow cursor ``after`` (0: the first), in
        listing order, and each one's cursor."""
        dir_id = self._dir_ids.get(directory)
        if dir_id is None:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        return self._listings[dir_id].after(after, limit)

    def rows_located_between(self, tier: int, start: int, end: int) -> np.ndarray:
        """Rows whose location in ``tier`` lies in [start, end)."""
        where = self.loc[: self._rows, tier]
        return np.nonzero((where >= start) & (where < end) & (self.dir[: self._rows] != _FREE_DIR))[0]

    def top_tier(self, row: int) -> int:
        """The first tier holding the row's page, or -1 (then the row is about to go)."""
        loc = self._cells.loc
        for tier in range(loc.shape[1]):
            if loc[row, tier] >= 0:
                return tier
        return -1

    def directories(self) -> list[str]:
        return [d for d, i in self._dir_ids.items() if self._dir_pages[i]]

    def has_directory(self, path: str) -> bool:
        """Whether pages lie in directory ``path`` or below it: O(1), however many directories
        were ever used."""
        return self._held.holds(path)

    def held_subdirectories(self, path: str) -> list[str]:
        """The names of ``path``'s subdirectories under which pages lie (``""``: the root's)."""
        return self._held.children(path)

    @property
    def pages(self) -> int:
        """Pages held (rows in use): O(1)."""
        return self._live

    @property
    def used_bytes(self) -> int:
        """The bytes of the pages held, each page once: O(1)."""
        return self._live_bytes

    def pages_in_tier(self, tier: int) -> int:
        """Pages located in ``tier``: O(1)."""
        return self._tier_pages[tier]
