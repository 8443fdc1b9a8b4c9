"""The daemon's RAM arena as a client of the data plane maps it (docs/contract.md, "The data
plane"): one mapping per daemon, for reads and writes, shared by that daemon's successive
attachments (its index moves when it grows; the arena never does), copies out of it and into it.

``map_ahead`` fills the mapping's page tables in the background (``MADV_POPULATE_READ``): the
daemon allocates its whole arena at start, so this maps, allocating nothing, what a long-running
client ends up mapped anyway. Without it, a first copy out of a part of the arena faults on every
64 KiB (half of memcpy's speed), and a copy into it on every 4 KiB. It costs 8 bytes of page
table per 4 KiB of arena (2 MiB a GiB) in each client process, and 0.06 s a GiB on this VM.

Thread-safe: the mapping never changes once made; any thread may copy.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from typing import Sequence

from .vectored import address_of, copy_from, read_into, write_from, write_into

#: Pages whose pieces are this large on average are copied through the mapping (a memcpy,
#: 0.95 of memcpy's speed on this VM), smaller ones with one ``preadv``/``pwritev`` (tmpfs's
#: reads reach 0.6 of it, but a Python call per piece of 4 KiB costs more: docs/performance.md).
MIN_MAPPED_PIECE = 8 << 10
#: Arena bytes whose page tables ``map_ahead`` fills per call (the daemon's end is noticed between
#: two). Each call holds the process's memory-map lock; its thread runs at normal priority, as a
#: thread at nice 19 starved by busy ones held that lock for long and stalled the process's mmaps.
MAP_AHEAD_STEP = 8 << 20
_MADV_POPULATE_READ = 22  # Linux 5.14; older kernels refuse it, and the mapping faults as it goes
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
#: The arena file's last 4 KiB hold the daemon's liveness word, 8 bytes into them: the id of a
#: thread of the daemon's while it runs, which the kernel marks ``FUTEX_OWNER_DIED`` as it ends.
_LIVENESS_FROM_END = 4096 - 8
_WORD = struct.Struct("<I")
_OWNER_DIED = 0x40000000


class ArenaMapping:
    """The arena of the daemon of ``token``, open at ``fd`` (this object's from now on) and mapped
    whole (the daemon never shrinks it); ``arena_id`` is what the index says of it (inode, size).
    OSError ESRCH when its daemon has ended already."""

    def __init__(self, fd: int, size: int, token: bytes, arena_id: tuple) -> None:
        self.fd = fd
        self.token, self.arena_id = token, arena_id
        self._map = None
        try:
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED)
            self._liveness_at = size - _LIVENESS_FROM_END
            self._alive = _WORD.unpack_from(self._map, self._liveness_at)[0]
            if not self._alive or self._alive & _OWNER_DIED:
                raise OSError(errno.ESRCH, "the daemon of this arena has ended, or keeps no liveness word")
        except BaseException:
            self._close()
            raise
        self.view = memoryview(self._map)
        self.address = address_of(self._map)
        self.mapped_ahead = False  # whether map_ahead has filled its page tables
        self._stopped = False

    def map_ahead(self) -> None:
        """Fill the page tables, a step at a time while the daemon lives and nobody stopped it
        (run on a thread of its own: the system call lets other threads run)."""
        for start in range(0, len(self.view), MAP_AHEAD_STEP):
            if self._stopped or not self.daemon_runs():
                return
            step = min(MAP_AHEAD_STEP, len(self.view) - start)
            if _LIBC.madvise(self.address + start, step, _MADV_POPULATE_READ) != 0:
                return  # a kernel without it: pages are mapped as they are touched
        self.mapped_ahead = True

    def stop(self) -> None:
        """Its client closed: ``map_ahead`` stops (the mapping goes with the last reference)."""
        self._stopped = True

    def serves(self, token: bytes, arena_id: tuple) -> bool:
        """Whether this is the arena an index of ``token`` describes, its daemon still running."""
        return (self.token, self.arena_id) == (token, arena_id) and self.daemon_runs()

    def daemon_runs(self) -> bool:
        """Whether the daemon's process still runs: its liveness word is unchanged (one load,
        no system call: SGLang's every call asks)."""
        return _WORD.unpack_from(self._map, self._liveness_at)[0] == self._alive

    def read(self, offset: int, buffers: Sequence[memoryview], size: int, alone: bool = False) -> int:
        """Bytes of the ``size`` at ``offset`` copied into ``buffers``: through the mapping when
        their pieces are ``MIN_MAPPED_PIECE`` or more on average, else with one ``preadv``.
        ``alone``: the page's batch is copied in one run (``vectored.HOLD_LOCK_ALONE_BELOW``)."""
        if size >= MIN_MAPPED_PIECE * len(buffers):
            return copy_from(self.view, self.address, buffers, offset, alone)
        return read_into(self.fd, buffers, offset)

    def write(self, offset: int, buffers: Sequence[memoryview], size: int, alone: bool = False) -> None:
        """Copy a page (``size`` bytes, from ``buffers``) into its slot at ``offset``: through the
        mapping once ``map_ahead`` has filled it and when the page's pieces are
        ``MIN_MAPPED_PIECE`` or more on average, else with one ``pwritev`` (a write through the
        mapping before would fault on every 4 KiB). ``alone`` as for ``read``."""
        if self.mapped_ahead and size >= MIN_MAPPED_PIECE * len(buffers):
            done = write_from(self.view[: offset + size], self.address, buffers, offset, alone)  # not past the slot
        elif sum(map(len, buffers)) > size:
            raise OSError(errno.EINVAL, f"a page of more bytes than its slot's {size}")
        else:
            done = write_into(self.fd, buffers, offset)
        if done != size:
            raise OSError(errno.EINVAL, f"a page of {done} bytes for a slot of {size}")

    def _close(self) -> None:
        if self._map is not None:
            self._map.close()
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass

    def __del__(self) -> None:
        if self._map is not None:
            self.view.release()
        self._close()
