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

``map_ahead`` fills the arena mapping's page tables in the background (``MADV_POPULATE_READ``):
the daemon's arena is all allocated from the start, so this maps, allocating nothing, what a
long-running client ends up mapped anyway; without it, a first copy out of a part of the arena
faults on every 64 KiB (half of memcpy's speed), and a copy into it on every 4 KiB. It costs 8 bytes of page
table per 4 KiB of arena (2 MiB a GiB) in each client process, and 0.06 s a GiB on this VM.

An attachment trusts nothing of a daemon that is gone: ``live`` is False once the daemon's
process has ended (a pidfd, which a new daemon cannot have) or the index says it moved or
closed. Its descriptors close when the last reference to it goes (a thread mid-copy keeps it).

Thread-safe: what an attachment maps never changes once made; any thread may use it.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import platform
import select
import struct
import threading
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import xxhash

from .vectored import copy_from, read_into, write_from, write_into

INDEX_LINK, ARENA_LINK, DISK_LINK = ".hicachefs/index", ".hicachefs/arena", ".hicachefs/disk"
_PREFIX = struct.Struct("<8sII16s")
_FIELDS = struct.Struct("<12Q")  # state, table_gen, capacity, slots, rows_at, table_at, arena_ino,
#                                  arena_bytes, disk_dev, disk_ino, named, pid
_STATE_AT, _TABLE_GEN_AT = _PREFIX.size, _PREFIX.size + 8
_ROW = struct.Struct("<QQ32siIQqq")  # gen, hash, key, dir, size, checksum, ram, disk
_GEN = struct.Struct("<Q")
_SLOT = struct.Struct("<i")
_KEY = struct.Struct("<4Q")
MAGIC, VERSION, LIVE = b"HCFSIDX1", 1, 0
_EMPTY = -1
#: Probes of one key before the table counts as too crowded to say (the daemon keeps it half full).
_MAX_PROBES = 64
_MASK = (1 << 64) - 1
_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD)
_FINAL = 0xC4CEB9FE1A85EC53
#: Pages whose pieces are this large on average are copied from the arena's mapping (a memcpy,
#: 0.95 of memcpy's speed on this VM), smaller ones with one ``preadv`` (tmpfs's reads reach 0.6
#: of it, but a Python copy per piece of 4 KiB costs more than that: docs/performance.md).
MIN_MAPPED_PIECE = 8 << 10
#: Arena bytes whose page tables ``map_ahead`` fills per call (the daemon's end is noticed between two).
MAP_AHEAD_STEP = 8 << 20
#: Keys whose table place is kept (about 200 bytes each); all are forgotten at once past it.
MAX_PLACES = 1 << 16
#: Its thread's nice value (a thread of its own may have its own; 19 is the lowest priority).
MAP_AHEAD_NICE = 19
_MADV_POPULATE_READ = 22  # Linux 5.14; older kernels refuse it, and the mapping faults as it goes
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
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

    def __init__(self, root: str) -> None:
        """Open them under mount ``root``; OSError when they cannot be (EACCES for a user the
        daemon does not let in, ENOENT on a daemon without a data plane), ``Unknown`` when
        what they hold does not fit together."""
        self._fds: List[int] = []
        self._map: Optional[mmap.mmap] = None
        self._arena_map: Optional[mmap.mmap] = None
        self.arena = memoryview(b"")  # the arena, mapped
        self.pidfd = -1
        self._let_go = False
        self.mapped_ahead = False  # whether map_ahead has filled the arena mapping's page tables
        # (directory number, key) -> (table hash, key identity) of keys looked up lately: SGLang
        # asks for a prefix's pages again at every request that shares it.
        self._places: Dict[Tuple[int, str], Tuple[int, bytes]] = {}
        index_path = os.path.join(root, INDEX_LINK)
        self.index_fd = self._open(index_path, os.O_RDONLY)
        self._map = mmap.mmap(self.index_fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
        magic, version, _, self.token = _PREFIX.unpack_from(self._map, 0)
        if magic != MAGIC or version != VERSION:
            raise Unknown(f"{index_path} is not a hicachefs index of version {VERSION}")
        (_, _, self.capacity, slots, self.rows_at, self.table_at, arena_ino, arena_bytes, disk_dev, disk_ino,
         named, pid) = _FIELDS.unpack_from(self._map, _PREFIX.size)
        self.mask, self.named, self.pid = slots - 1, bool(named), pid
        self.arena_fd = self._open(os.path.join(root, ARENA_LINK), os.O_RDWR)
        arena = os.fstat(self.arena_fd)
        if (arena.st_ino, arena.st_size) != (arena_ino, arena_bytes):
            raise Unknown("the arena is not the one the index describes")
        # Mapped whole (the daemon never shrinks it); its page tables are filled by map_ahead.
        self._arena_map = mmap.mmap(self.arena_fd, arena_bytes, mmap.MAP_SHARED)
        self.arena = memoryview(self._arena_map)
        self.disk_fd = -1
        if disk_ino:
            self.disk_fd = self._open(os.path.join(root, DISK_LINK), os.O_RDONLY)
            disk = os.fstat(self.disk_fd)
            if (disk.st_dev, disk.st_ino) != (disk_dev, disk_ino):
                raise Unknown("the disk file is not the one the index describes")
        # The daemon's process, watched from now on; and still the one holding this index (its
        # number could have been given to another process between our open and the pidfd's).
        self.pidfd = os.pidfd_open(pid)
        if os.stat(index_path).st_ino != os.fstat(self.index_fd).st_ino:
            raise Unknown("the index moved while it was opened")

    def _open(self, path: str, flags: int) -> int:
        fd = os.open(path, flags | os.O_CLOEXEC)
        self._fds.append(fd)
        return fd

    @property
    def live(self) -> bool:
        """Whether the daemon still runs and this is still its index."""
        ended = select.poll()  # one per call: a poll object may not be polled by two threads at once
        ended.register(self.pidfd, select.POLLIN)
        return not ended.poll(0) and _GEN.unpack_from(self._map, _STATE_AT)[0] == LIVE

    def map_ahead(self) -> None:
        """Fill the arena mapping's page tables, a step at a time while the daemon lives (run on
        a thread of its own: the system call lets other threads run)."""
        try:  # behind every other thread of the host: it only saves later copies their faults
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), MAP_AHEAD_NICE)
        except OSError:
            pass
        pointer = ctypes.c_char.from_buffer(self._arena_map)  # held only meanwhile: the map stays closable
        address = ctypes.addressof(pointer)
        del pointer
        for start in range(0, len(self.arena), MAP_AHEAD_STEP):
            if self._let_go or not self.live:
                return
            step = min(MAP_AHEAD_STEP, len(self.arena) - start)
            if _LIBC.madvise(address + start, step, _MADV_POPULATE_READ) != 0:
                return  # a kernel without it: pages are mapped as they are touched
        self.mapped_ahead = True

    def let_go(self) -> None:
        """Its client closed: ``map_ahead`` stops (the mappings go with the last reference)."""
        self._let_go = True

    def find(self, dir_id: int, key: str) -> Optional[Found]:
        """The page's row, or None when the index holds no such page; ``Unknown`` when it
        cannot say now."""
        found = self.locate(dir_id, [key])[0]
        if found is None:
            raise Unknown("the index cannot say now")
        return found or None

    def locate(self, dir_id: int, keys: Sequence[str]) -> List[Found | bool | None]:
        """Per key of the directory: its row (``Found``); False when the index does not hold it
        and no other tier may; None when only the daemon can say (a table rebuilt meanwhile, a
        row being changed, a tier other hosts write). The table's ``table_gen`` is read once
        before the batch and once after it: a miss counts only if the table did not change."""
        places = self._places
        if len(places) > MAX_PLACES:
            places.clear()
        m, row_of, slot_of, gen_of = self._map, _ROW.unpack_from, _SLOT.unpack_from, _GEN.unpack_from
        table_gen = gen_of(m, _TABLE_GEN_AT)[0]
        if table_gen & 1:
            return [None] * len(keys)  # the table is being rebuilt
        mask, table_at, rows_at, row_bytes = self.mask, self.table_at, self.rows_at, _ROW.size
        absent = None if self.named else False
        found: List[Found | bool | None] = []
        for key in keys:
            place = places.get((dir_id, key))
            if place is None:
                kid = key_id(key)
                place = places[dir_id, key] = (key_hash(dir_id, kid), kid)
            h, kid = place
            i = h & mask
            for _ in range(_MAX_PROBES):
                row = slot_of(m, table_at + 4 * i)[0]
                if row == _EMPTY:
                    found.append(absent)
                    break
                if row >= 0:
                    gen, row_hash, row_key, row_dir, size, checksum, ram, disk = row_of(m, rows_at + row_bytes * row)
                    if row_hash == h and row_dir == dir_id and row_key == kid:
                        found.append(None if gen & 1 else Found(row, gen, kid, size, checksum, ram, disk))
                        break
                i = (i + 1) & mask
            else:
                found.append(None)  # the table is too crowded to say
        if absent is False and gen_of(m, _TABLE_GEN_AT)[0] != table_gen:
            return [None if f is False else f for f in found]  # rebuilt meanwhile: misses unsure
        return found

    def copy(self, found: Found, buffers: Sequence[memoryview], size: int, verify: bool) -> bool:
        """Copy the page into ``buffers`` (``size`` bytes); True when they hold it whole, False
        when it changed under the copy (the caller looks again) or its bytes fail its checksum
        (``verify``, and always from the disk tier). ``Unknown`` for a row the plane cannot
        read (a page on no tier of its)."""
        if found.ram >= 0:
            if size >= MIN_MAPPED_PIECE * len(buffers):
                done = copy_from(self.arena, buffers, found.ram)
            else:
                done = read_into(self.arena_fd, buffers, found.ram)
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

    def fill(self, offset: int, buffers: Sequence[memoryview], size: int) -> None:
        """Copy a page (``size`` bytes, from ``buffers``) into its slot at ``offset``: through the
        mapping once ``map_ahead`` has filled it and when the page's pieces are
        ``MIN_MAPPED_PIECE`` or more on average, else with one ``pwritev`` (a write through the
        mapping before would fault on every 4 KiB)."""
        if self.mapped_ahead and size >= MIN_MAPPED_PIECE * len(buffers):
            done = write_from(self.arena, buffers, offset)
        else:
            done = write_into(self.arena_fd, buffers, offset)
        if done != size:
            raise OSError(errno.EINVAL, f"a page of {done} bytes for a slot of {size}")

    def unchanged(self, found: Found) -> bool:
        """Whether the row still holds the page it held when ``found`` was read, and the index is
        still the daemon's."""
        gen, _, key = struct.unpack_from("<QQ32s", self._map, self.rows_at + _ROW.size * found.row)
        return gen == found.gen and key == found.key and _GEN.unpack_from(self._map, _STATE_AT)[0] == LIVE

    def __del__(self) -> None:
        self.arena.release()
        if self._arena_map is not None:
            self._arena_map.close()
        if self._map is not None:
            self._map.close()
        for fd in self._fds + ([self.pidfd] if self.pidfd >= 0 else []):
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
