"""The page index's shared part: the memory from which the data plane's clients read the index
themselves, with no request to the daemon (docs/contract.md, "The data plane").

One memfd, little-endian, laid out as: a 4 KiB header, then ``capacity`` rows of ``ROW`` (80
bytes each), then ``slots`` int32 table entries (the open-addressing table: a row number,
``EMPTY`` or ``TOMB``). The index keeps the columns a client needs here (``hash``, ``key``,
``dir``, ``size``, ``checksum``) and mirrors where a page's bytes are: ``ram``, its byte offset
in the RAM tier's arena, and ``disk``, its byte offset in the disk tier's file (-1 where not).

What a reader may rely on (the daemon's side of the seqlock):
- a row's ``gen`` is odd while the daemon changes the row and even otherwise; it only grows,
  also when the row is freed and reused, so a reader that finds the same even ``gen`` before
  and after copying a page read the row's page, whole;
- a RAM slot or a disk record is reused only after the rows that pointed there changed ``gen``;
- ``table_gen`` is odd while the table is rebuilt in place, and while a page is replaced (a
  probe then may miss a page);
- the daemon moves the index to new memory when it grows: it sets ``state`` to ``MOVED`` in the
  old memory before it changes anything in the new one, so a reader that finds ``LIVE`` after
  its copy may trust what it read; ``CLOSED`` says the daemon is stopping.

Not thread-safe: the store's lock guards every change. Writes are plain stores in program
order, which x86 keeps in order; on other platforms the client checks a page's checksum too.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"HCFSIDX1"
VERSION = 1
HEADER_BYTES = 4096
#: magic, version, header bytes, the daemon's token; then one u64 for each of ``FIELDS``, in order.
PREFIX = struct.Struct("<8sII16s")
FIELDS = ("state", "table_gen", "capacity", "slots", "rows_at", "table_at", "arena_ino", "arena_bytes",
          "disk_dev", "disk_ino", "named", "pid")
LIVE, MOVED, CLOSED = 0, 1, 2
ROW = np.dtype([("gen", "<u8"), ("hash", "<u8"), ("key", "<u8", (4,)), ("dir", "<i4"), ("size", "<u4"),
                ("checksum", "<u8"), ("ram", "<i8"), ("disk", "<i8")])
EMPTY = -1
TOMB = -2
FREE_DIR = -1
#: Linux's F_SEAL_FUTURE_WRITE (5.1; Python's fcntl does not name it): no new writable mapping
#: or write, while the daemon's own mapping stays writable. Clients may read, never scribble.
_SEAL_FUTURE_WRITE = 0x0010


@dataclass(frozen=True)
class Described:
    """What the header says besides the layout: the files the index points into (``st_ino`` and
    size of the arena memfd, ``st_dev``/``st_ino`` of the disk tier's file, 0 when none), whether
    a tier other hosts write exists (then a miss here may be a hit there), and whose it is."""

    token: bytes = bytes(16)
    arena_ino: int = 0
    arena_bytes: int = 0
    disk_dev: int = 0
    disk_ino: int = 0
    named: bool = False
    pid: int = 0


class IndexMemory:
    """One allocation of the shared index: its rows and table as numpy arrays over a memfd."""

    def __init__(self, capacity: int, slots: int, described: Described) -> None:
        self.capacity, self.slots = capacity, slots
        self._changing = 0  # ``rebuilding`` calls not yet ``rebuilt``
        rows_at = HEADER_BYTES
        table_at = rows_at + capacity * ROW.itemsize
        size = table_at + slots * 4
        self.fd = os.memfd_create("hicachefs-index", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | _SEAL_FUTURE_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.rows = np.ndarray((capacity,), ROW, self._map, rows_at)
        self.rows["dir"] = FREE_DIR
        self.rows["ram"] = self.rows["disk"] = -1
        self.table = np.ndarray((slots,), np.int32, self._map, table_at)
        self.table[:] = EMPTY
        self._fields = np.ndarray((len(FIELDS),), np.uint64, self._map, PREFIX.size)
        for name, value in (("capacity", capacity), ("slots", slots), ("rows_at", rows_at), ("table_at", table_at)):
            self._set(name, value)
        self.describe(described)

    def describe(self, described: Described) -> None:
        """Write what the header says of the files and the daemon (see ``Described``)."""
        PREFIX.pack_into(self._map, 0, MAGIC, VERSION, HEADER_BYTES, described.token)
        for name in ("arena_ino", "arena_bytes", "disk_dev", "disk_ino", "pid"):
            self._set(name, getattr(described, name))
        self._set("named", int(described.named))

    def _set(self, name: str, value: int) -> None:
        self._fields[FIELDS.index(name)] = value

    def rebuilding(self) -> None:
        """The table is about to be rewritten in place, or a name is in no row for a moment (a
        replace): probes may miss until ``rebuilt``. Calls nest (a replace's ``add`` may rebuild
        the table): ``table_gen`` stays odd until the outermost one ends."""
        self._changing += 1
        if self._changing == 1:
            self._fields[1] += 1

    def rebuilt(self) -> None:
        self._changing -= 1
        if self._changing == 0:
            self._fields[1] += 1

    def moved(self) -> None:
        """Readers must look for the index in its new memory (see the module docstring)."""
        self._set("state", MOVED)

    def closed(self) -> None:
        """The daemon is stopping: readers use nothing of it from now on."""
        self._set("state", CLOSED)

    def release(self) -> None:
        """Close the daemon's descriptor; the mapping goes once no view of it is left."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
