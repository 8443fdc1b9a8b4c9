"""The data plane's shared index, read by the client itself (docs/contract.md, "The data plane").

``Attachment`` is one daemon's index, arena and disk file, opened through the mount's links
(``.hicachefs/index``, ``arena``, ``disk``: the daemon's own descriptors, which only root and the
daemon's user may open) and mapped: the index read-only, the arena for reads and writes (the
plane's writers copy pages into their slots through it). ``find`` probes the index's table for a
page and reads its row; ``copy`` moves the page's bytes into the caller's buffers (from the
arena's mapping, or with ``preadv``) and then checks that the row did not change
meanwhile (a seqlock: the row's ``gen`` is odd while the
daemon changes it and grows at every change), so a page evicted, replaced or removed under the
copy is never taken for read. Where loads may pass loads (aarch64), the page's checksum is
checked after the copy too; pages from the disk tier always are (a block may have gone bad).

The arena's mapping is ``plane_arena.ArenaMapping``'s, kept by the next attachment to the same
daemon (its index moves when it grows, the arena never does).

An attachment trusts nothing of a daemon that is gone: ``live`` is False once the daemon's
process has ended (its liveness word in the arena, which the kernel marks as the process ends,
and which a new daemon's arena does not share) or the index says it moved or closed. Its
descriptors close when the last reference to it goes (a thread mid-copy keeps it).

Thread-safe: what an attachment maps never changes once made; any thread may use it.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import platform
import struct
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import xxhash

from .plane_arena import ArenaMapping
from .vectored import read_into

INDEX_LINK, ARENA_LINK, DISK_LINK = ".hicachefs/index", ".hicachefs/arena", ".hicachefs/disk"
_PREFIX = struct.Struct("<8sII16s")
_FIELDS = struct.Struct("<12Q")  # state, table_gen, capacity, slots, rows_at, table_at, arena_ino,
#                                  arena_bytes, disk_dev, disk_ino, named, pid
_STATE_AT, _TABLE_GEN_AT = _PREFIX.size, _PREFIX.size + 8
_ROW = struct.Struct("<QQ32siIQqq")  # gen, hash, key, dir, size, checksum, ram, disk
_HEAD = struct.Struct("<QQ32si")  # a row's gen, hash, key, dir: whom it holds
_TAIL = struct.Struct("<IQqq")  # and the rest: where the page is
_GEN = struct.Struct("<Q")
_SLOT = struct.Struct("<i")
_SIZE = struct.Struct("<I")  # a row's size, right after its head
_KEY = struct.Struct("<4Q")
MAGIC, VERSION, LIVE = b"HCFSIDX1", 1, 0
_EMPTY = -1
#: Probes of one key before the table counts as too crowded to say (the daemon keeps it half full).
_MAX_PROBES = 64
_MASK = (1 << 64) - 1
_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD)
_FINAL = 0xC4CEB9FE1A85EC53
#: Keys of a directory whose table place is kept (about 200 bytes each); all of that directory's
#: are forgotten at once past it.
MAX_PLACES = 1 << 16
#: Whether this CPU keeps loads in order (TSO): then the seqlock alone proves a copy whole.
ORDERED_LOADS = platform.machine() in ("x86_64", "AMD64", "i686", "i386")


def key_id(key: str) -> bytes:
    """A key's 32-byte identity in the index: a key of 64 lowercase hex digits is its bytes,
    any other the BLAKE2b-256 digest of its UTF-8."""
    if len(key) == 64:
        try:
            raw = bytes.fromhex(key)
        except ValueError:
            raw = b""
        if raw.hex() == key:
            return raw
    return hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=32).digest()


def key_hash(dir_id: int, kid: bytes) -> int:
    """Where the index's table holds a key of a directory (the contract's hash)."""
    k0, k1, k2, k3 = _KEY.unpack(kid)
    m0, m1, m2, m3, m4 = _MIX
    h = ((k0 * m0 + k1 * m1 + k2 * m2 + k3 * m3) ^ (dir_id * m4)) & _MASK
    h ^= h >> 33
    h = (h * _FINAL) & _MASK
    return h ^ (h >> 33)


class Found(NamedTuple):
    """A page's row as it was read: which row, its ``gen``, and what it said."""

    row: int
    gen: int
    key: bytes
    size: int
    checksum: int
    ram: int
    disk: int


class Unknown(Exception):
    """The index cannot say now (its table is being rebuilt, a row is changing, it moved):
    ask the daemon."""


class Attachment:
    """One daemon's shared index, arena and disk file. See the module docstring."""

    def __init__(self, root: str, arena_map: Optional[ArenaMapping] = None) -> None:
        """Open them under mount ``root``; OSError when they cannot be (EACCES for a user the
        daemon does not let in, ENOENT on a daemon without a data plane), ``Unknown`` when
        what they hold does not fit together. The arena's mapping is ``arena_map`` when that
        maps this daemon's arena (``new_mapping`` says which)."""
        self._fds: List[int] = []
        self._map: Optional[mmap.mmap] = None
        # directory number -> key -> (table hash, key identity) of keys looked up lately: SGLang
        # asks for a prefix's pages again at every request that shares it.
        self._places: Dict[int, Dict[str, Tuple[int, bytes]]] = {}
        self.root = root
        self._mount_dev = os.stat(root).st_dev  # the mount this daemon serves (``reached_by_path``)
        index_path = os.path.join(root, INDEX_LINK)
        self.index_fd = self._open(index_path, os.O_RDONLY)
        self._map = mmap.mmap(self.index_fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
        magic, version, _, self.token = _PREFIX.unpack_from(self._map, 0)
        if magic != MAGIC or version != VERSION:
            raise Unknown(f"{index_path} is not a hicachefs index of version {VERSION}")
        (_, _, self.capacity, slots, self.rows_at, self.table_at, arena_ino, arena_bytes, disk_dev, disk_ino,
         named, _) = _FIELDS.unpack_from(self._map, _PREFIX.size)
        self.mask, self.named = slots - 1, bool(named)
        self.arena_id = (arena_ino, arena_bytes)
        if arena_map is not None and arena_map.serves(self.token, self.arena_id):
            self.arena_map, self.new_mapping = arena_map, False
        else:
            arena_fd = os.open(os.path.join(root, ARENA_LINK), os.O_RDWR | os.O_CLOEXEC)
            try:
                arena = os.fstat(arena_fd)
                if (arena.st_ino, arena.st_size) != self.arena_id:
                    raise Unknown("the arena is not the one the index describes")
            except BaseException:
                os.close(arena_fd)
                raise
            self.arena_map = ArenaMapping(arena_fd, arena_bytes, self.token, self.arena_id)
            self.new_mapping = True
        self.disk_fd = -1
        if disk_ino:
            self.disk_fd = self._open(os.path.join(root, DISK_LINK), os.O_RDONLY)
            disk = os.fstat(self.disk_fd)
            if (disk.st_dev, disk.st_ino) != (disk_dev, disk_ino):
                raise Unknown("the disk file is not the one the index describes")

    def _open(self, path: str, flags: int) -> int:
        fd = os.open(path, flags | os.O_CLOEXEC)
        self._fds.append(fd)
        return fd

    def reached_by_path(self) -> bool:
        """Whether the mount's path still leads to this index's daemon (a system call: asked
        twice a second by the reports' thread). A daemon that still runs (hung, then taken down
        by an abort of its connection) keeps its liveness word, and a client that only asks
        whether pages exist sends it no request that would fail."""
        try:
            return os.stat(self.root).st_dev == self._mount_dev
        except OSError:
            return False

    @property
    def live(self) -> bool:
        """Whether the daemon still runs and this is still its index."""
        return self.arena_map.daemon_runs() and _GEN.unpack_from(self._map, _STATE_AT)[0] == LIVE

    def find(self, dir_id: int, key: str) -> Optional[Found]:
        """The page's row, or None when the index holds no such page; ``Unknown`` when it
        cannot say now."""
        found = self.locate(dir_id, [key])[0]
        if found is None:
            raise Unknown("the index cannot say now")
        return found or None

    def locate(self, dir_id: int, keys: Sequence[str], prefix: bool = False,
               rows: bool = True, size: Optional[int] = None) -> List[Found | bool | None]:
        """Per key of the directory: its row (``Found``; True instead when not ``rows``, for who
        asks only whether it is held); False when the index does not hold it and no other tier
        may; None when only the daemon can say (a table rebuilt meanwhile, a row being changed,
        a tier other hosts write) or the key is no string. The table's ``table_gen`` is read
        once before the batch and once after it: a miss counts only if the table was not being
        changed and did not change.
        ``prefix``: the keys after the first one not held are not probed, and answered False
        (who asks how many keys from the first are held needs no more).
        ``size`` (with ``rows`` False): a page of another size is answered False, as not held:
        no read of ``size`` takes it, and a write of the name replaces it."""
        places = self._places.get(dir_id)
        if places is None or len(places) > MAX_PLACES:
            places = self._places[dir_id] = {}
        m, head_of, tail_of, slot_of, size_of = (self._map, _HEAD.unpack_from, _TAIL.unpack_from,
                                                 _SLOT.unpack_from, _SIZE.unpack_from)
        # Read before the probes: a miss counts only if the table was not being changed (odd:
        # rebuilt, or a page replaced) nor changed meanwhile. A hit needs no such check: its
        # row holds the key, and the row's ``gen`` vouches for the copy.
        table_gen = _GEN.unpack_from(m, _TABLE_GEN_AT)[0]
        mask, table_at, rows_at, row_bytes = self.mask, self.table_at, self.rows_at, _ROW.size
        absent = None if self.named else False
        found: List[Found | bool | None] = []
        for key in keys:
            if not isinstance(key, str):  # no name: the caller's checks refuse it
                found.append(None)
                continue
            place = places.get(key)
            if place is None:
                kid = key_id(key)
                place = places[key] = (key_hash(dir_id, kid), kid)
            h, kid = place
            i = h & mask
            for _ in range(_MAX_PROBES):
                row = slot_of(m, table_at + 4 * i)[0]
                if row == _EMPTY:
                    found.append(absent)
                    if prefix and absent is False:
                        found += [False] * (len(keys) - len(found))
                        return self._misses_checked(found, table_gen)
                    break
                if row >= 0:
                    at = rows_at + row_bytes * row
                    gen, row_hash, row_key, row_dir = head_of(m, at)
                    if row_hash == h and row_dir == dir_id and row_key == kid:
                        if gen & 1:
                            found.append(None)
                        elif rows:
                            found.append(Found(row, gen, kid, *tail_of(m, at + _HEAD.size)))
                        else:
                            found.append(size is None or size_of(m, at + _HEAD.size)[0] == size)
                        break
                i = (i + 1) & mask
            else:
                found.append(None)  # the table is too crowded to say
        return self._misses_checked(found, table_gen) if absent is False else found

    def _misses_checked(self, found: List[Found | bool | None], table_gen: int) -> List[Found | bool | None]:
        """``found``, with its misses made unsure (None) if the table was being changed when the
        probes began (``table_gen`` odd: rebuilt in place, or a page replaced) or changed
        meanwhile, or this memory is no longer the index's (it moved as the index grew: pages
        added since are not in it)."""
        m = self._map
        if (table_gen & 1 or _GEN.unpack_from(m, _TABLE_GEN_AT)[0] != table_gen
                or _GEN.unpack_from(m, _STATE_AT)[0] != LIVE):
            return [None if f is False else f for f in found]
        return found

    def copy(self, found: Found, buffers: Sequence[memoryview], size: int, verify: bool, alone: bool = False) -> bool:
        """Copy the page into ``buffers`` (``size`` bytes); True when they hold it whole, False
        when it changed under the copy (the caller looks again) or its bytes fail its checksum
        (``verify``, and always from the disk tier). ``Unknown`` for a row the plane cannot
        read (a page on no tier of its). ``alone``: its batch is copied in one run."""
        if found.ram >= 0:
            done = self.arena_map.read(found.ram, buffers, size, alone)
        elif found.disk >= 0 and self.disk_fd >= 0:
            done, verify = read_into(self.disk_fd, buffers, found.disk), True
        else:
            raise Unknown("the page is on no tier the plane reads")
        copied_whole = done == size
        if after_copy is not None:
            after_copy(found)
        if not self.unchanged(found):
            return False
        if not copied_whole:
            raise OSError(errno.EIO, "a page's bytes end short in the file the index points into")
        return not verify or page_checksum(buffers) == found.checksum

    def unchanged(self, found: Found) -> bool:
        """Whether the row still holds the page it held when ``found`` was read, and the index is
        still the daemon's."""
        gen, _, key, _ = _HEAD.unpack_from(self._map, self.rows_at + _ROW.size * found.row)
        return gen == found.gen and key == found.key and _GEN.unpack_from(self._map, _STATE_AT)[0] == LIVE

    def __del__(self) -> None:
        if self._map is not None:
            self._map.close()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass


#: Called between a copy and its check (the tests stall a reader there); None in use.
after_copy = None


def page_checksum(buffers: Sequence[memoryview]) -> int:
    """The checksum a page is published with: xxh3_64 of its bytes, in order."""
    hasher = xxhash.xxh3_64()
    for buffer in buffers:
        hasher.update(buffer)
    return hasher.intdigest()
