"""Name -> page facts, in numpy columns with an open-addressing hash table: no Python object per page.

Why not a dict of entries: a dict entry plus a 64-char str key plus an entry object costs
300+ bytes per page; at millions of small pages that is the daemon's RAM. Here a page is one
row across fixed-width columns (80 bytes, plus 8 per tier for its location there) plus two
int32 table slots (the table is kept at most half full): about 104 bytes with two tiers.
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

Not thread-safe: the store's lock guards every call.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

_EMPTY = -1
_TOMB = -2
_FREE_DIR = -1


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
    chars (real traffic) they are decoded in one call."""
    text = "".join(keys)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32 * len(keys) or raw.hex() != text:  # some key is not canonical hex
        raw = b"".join([_key_id(key)[0] for key in keys])
    return np.frombuffer(raw, np.uint64).reshape(len(keys), 4)


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


class PageIndex:
    """Rows of page facts addressed by name. Columns are public numpy arrays indexed by row."""

    _COLUMNS = {
        "hash": np.uint64,
        "dir": np.int32,
        "size": np.uint32,
        "hits": np.uint32,
        "checksum": np.uint64,
        "mtime": np.int64,
        "atime": np.int64,
    }

    def __init__(self, tiers: int, capacity: int = 1024) -> None:
        self._rows = 0  # rows ever used (high-water mark)
        self._free_rows: list[int] = []
        self._live = 0
        self._tombs = 0
        for column, dtype in self._COLUMNS.items():
            setattr(self, column, np.zeros(capacity, dtype))
        self.dir[:] = _FREE_DIR
        self.keys = np.zeros((capacity, 4), np.uint64)
        self.loc = np.full((capacity, tiers), -1, np.int64)
        self._odd_keys: dict[int, str] = {}  # row -> key text, for keys that are not 64 hex chars
        self._table = np.full(1 << max(4, (2 * capacity - 1).bit_length()), _EMPTY, np.int32)
        self._dir_ids: dict[str, int] = {}
        self._dir_names: list[str] = []
        self._dir_pages: list[int] = []

    # -- lookups -----------------------------------------------------------------------

    def find(self, name: str) -> int:
        """The row holding ``name``, or -1."""
        directory, key = _split(name)
        dir_id = self._dir_ids.get(directory)
        if dir_id is None:
            return -1
        raw = _key_id(key)[0]
        kid = np.frombuffer(raw, np.uint64)
        h = _hash_one(dir_id, raw)
        table, mask = self._table, len(self._table) - 1
        i = h & mask
        while True:
            row = int(table[i])
            if row == _EMPTY:
                return -1
            if (
                row >= 0
                and int(self.hash[row]) == h
                and int(self.dir[row]) == dir_id
                and (self.keys[row] == kid).all()
            ):
                return row
            i = (i + 1) & mask

    @staticmethod
    def prepare_many(names: Iterable[str]) -> tuple[list[str], np.ndarray]:
        """The per-name work of ``find_many`` (splitting, decoding keys), which needs no lock."""
        splits = list(map(str.rpartition, names, repeat("/")))
        return list(map(itemgetter(0), splits)), _key_ids(list(map(itemgetter(2), splits)))

    def find_many(self, prepared: tuple[list[str], np.ndarray]) -> np.ndarray:
        """A bool per name of ``prepare_many(names)``: is it present. Hashing and probing are vectorised."""
        directories, k = prepared
        n = len(directories)
        found = np.zeros(n, bool)
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
            found[active[hit]] = True
            active = active[~hit & (rows != _EMPTY)]
            pos[active] = (pos[active] + np.uint64(1)) & mask
        return found

    def name(self, row: int) -> str:
        directory = self._dir_names[int(self.dir[row])]
        key = self._odd_keys.get(row)
        if key is None:
            key = self.keys[row].tobytes().hex()
        return f"{directory}/{key}" if directory else key

    # -- changes -----------------------------------------------------------------------

    def add(self, name: str, size: int, checksum: int, mtime_ns: int, tier: int, location: int) -> int:
        """Store a new row for ``name``, which must be absent (remove the old row first), at
        ``location`` in ``tier`` (more tiers are set through ``loc``)."""
        if 2 * (self._live + self._tombs + 1) > len(self._table):  # before the new row is filled in
            self._rebuild(len(self._table) * (2 if 4 * (self._live + 1) > len(self._table) else 1))
        directory, key = _split(name)
        kid, plain = _key_id(key)
        dir_id = self._dir_ids.get(directory)
        if dir_id is None:
            dir_id = self._dir_ids[directory] = len(self._dir_names)
            self._dir_names.append(directory)
            self._dir_pages.append(0)
        self._dir_pages[dir_id] += 1
        if self._free_rows:
            row = self._free_rows.pop()
        else:
            if self._rows == len(self.size):
                self._grow()
            row = self._rows
            self._rows += 1
        h = _hash_one(dir_id, kid)
        self.hash[row] = h
        self.dir[row] = dir_id
        self.keys[row] = np.frombuffer(kid, np.uint64)
        if not plain:
            self._odd_keys[row] = key
        self.size[row] = size
        self.hits[row] = 0
        self.checksum[row] = checksum
        self.mtime[row] = self.atime[row] = mtime_ns
        self.loc[row] = -1
        self.loc[row, tier] = location
        table, mask = self._table, len(self._table) - 1
        i = h & mask
        while table[i] >= 0:
            i = (i + 1) & mask
        if table[i] == _TOMB:
            self._tombs -= 1
        table[i] = row
        self._live += 1
        return row

    def remove(self, row: int) -> None:
        """Forget ``row``; its number may be reused by the next add."""
        table, mask = self._table, len(self._table) - 1
        i = int(self.hash[row]) & mask
        while table[i] != row:
            i = (i + 1) & mask
        table[i] = _TOMB
        self._tombs += 1
        self._live -= 1
        self._dir_pages[int(self.dir[row])] -= 1
        self.dir[row] = _FREE_DIR
        self._odd_keys.pop(row, None)
        self._free_rows.append(row)

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

    def load(self, tier: int, pages: PageColumns) -> None:
        """Fill this empty index with ``pages``, located in ``tier``: the columns are copied in
        whole and the hash table built vectorised. Names must be distinct, ``dir`` in range."""
        if self._rows:
            raise ValueError("load needs an empty index")
        n = len(pages.size)
        capacity = max(n, len(self.size))
        for column, dtype in self._COLUMNS.items():
            setattr(self, column, np.zeros(capacity, dtype))
        self.dir[n:] = _FREE_DIR
        self.keys = np.zeros((capacity, 4), np.uint64)
        self.loc = np.full((capacity, self.loc.shape[1]), -1, np.int64)
        self.dir[:n] = pages.dir
        self.keys[:n] = pages.keys
        self.hash[:n] = _hash_many(self.dir[:n], self.keys[:n])
        self.size[:n] = pages.size
        self.checksum[:n] = pages.checksum
        self.mtime[:n] = self.atime[:n] = pages.mtime
        self.loc[:n, tier] = pages.location
        self._dir_names = list(pages.directories)
        self._dir_ids = {name: i for i, name in enumerate(self._dir_names)}
        self._dir_pages = np.bincount(pages.dir, minlength=len(self._dir_names)).tolist()
        self._odd_keys = dict(pages.odd_keys)
        self._rows = self._live = n
        self._rebuild(1 << max(4, (2 * capacity - 1).bit_length()))

    def _grow(self) -> None:
        new = 2 * len(self.size)
        for column in self._COLUMNS:
            old = getattr(self, column)
            grown = np.full(new, _FREE_DIR, old.dtype) if column == "dir" else np.zeros(new, old.dtype)
            grown[: len(old)] = old
            setattr(self, column, grown)
        keys = np.zeros((new, 4), np.uint64)
        keys[: len(self.keys)] = self.keys
        self.keys = keys
        loc = np.full((new, self.loc.shape[1]), -1, np.int64)
        loc[: len(self.loc)] = self.loc
        self.loc = loc

    def _rebuild(self, table_size: int) -> None:
        """Re-insert every live row into a fresh table, vectorised. Rows inserted in the order of
        their home slots each land in the first free slot at or after their home: the later of
        their home and the slot after the previous row's, a running maximum. The few pushed past
        the end wrap round to the first free slots from the start, where a probe finds them."""
        table = np.full(table_size, _EMPTY, np.int32)
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
        self._table = table
        self._tombs = 0

    # -- directories and scans ---------------------------------------------------------

    def rows_in_dir(self, directory: str) -> np.ndarray:
        dir_id = self._dir_ids.get(directory)
        if dir_id is None or self._dir_pages[dir_id] == 0:
            return np.zeros(0, np.int64)
        return np.nonzero(self.dir[: self._rows] == dir_id)[0]

    def rows_under(self, prefix: str) -> np.ndarray:
        """Rows whose name starts with ``prefix + '/'``."""
        ids = [i for d, i in self._dir_ids.items() if self._dir_pages[i] and (d == prefix or d.startswith(prefix + "/"))]
        if not ids:
            return np.zeros(0, np.int64)
        return np.nonzero(np.isin(self.dir[: self._rows], ids))[0]

    def rows_located_between(self, tier: int, start: int, end: int) -> np.ndarray:
        """Rows whose location in ``tier`` lies in [start, end)."""
        where = self.loc[: self._rows, tier]
        return np.nonzero((where >= start) & (where < end) & (self.dir[: self._rows] != _FREE_DIR))[0]

    def top_tier(self, row: int) -> int:
        """The first tier holding the row's page, or -1 (then the row is about to go)."""
        held = np.nonzero(self.loc[row] >= 0)[0]
        return int(held[0]) if held.size else -1

    def directories(self) -> list[str]:
        return [d for d, i in self._dir_ids.items() if self._dir_pages[i]]

    def live_rows(self) -> Sequence[int]:
        return np.nonzero(self.dir[: self._rows] != _FREE_DIR)[0]
