"""The RAM tier's bytes (one memfd, mapped shared) and their slab allocator.

Why a memfd: the data plane's clients (the store's own writers) open it too, through the mount
(``.hicachefs/arena``), and copy pages in and out of it themselves. It is sealed so that no
one can shrink or grow it under the daemon's mapping. Its last ``LIVENESS_BYTES`` are no slot:
they hold the daemon's liveness word (``liveness.py``), which clients read at every call.

Why slabs: a deployment's pages are mostly one size plus a few small ones, and a page must
be one contiguous run so that readers get a zero-copy memoryview. A general first-fit heap
fragments under LRU churn; a buddy allocator wastes up to half of every odd-sized page. Here
the arena is cut into equal slabs (at least as large as the largest page). A slab serves one
size class at a time; classes keep the top four significant bits of a size (eight classes
per doubling, like jemalloc), so a slot wastes at most 1/8 of its page, and common sizes
(1 MiB, 8 MiB, 4 KiB) are exact. A slab whose last slot is freed returns to the free pool
and can serve any class next, so the split between classes follows the workload.

Not thread-safe: the owning tier's caller (the store) holds its lock.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import heapq
import mmap
import os
from collections.abc import Callable

from hicachefs.store.ram.fill import fill
from hicachefs.store.ram.liveness import LivenessWord

_MIN_SLOT = 64
#: The arena file's last bytes, past ``capacity`` (rounded up to them): the liveness word's page.
LIVENESS_BYTES = 4096


@functools.lru_cache(maxsize=256)  # a deployment has a few page sizes; every reservation asks twice
def size_class(size: int) -> int:
    """The slot size that holds ``size`` bytes: 64-byte aligned, at most 1/8 larger."""
    if size <= _MIN_SLOT:
        return _MIN_SLOT
    shift = max(size.bit_length() - 4, 0)
    rounded = ((size + (1 << shift) - 1) >> shift) << shift
    return (rounded + _MIN_SLOT - 1) & ~(_MIN_SLOT - 1)


class _Slab:
    """Slots never handed out are taken by bumping ``fresh`` (no list of a million tiny slots);
    freed ones lowest first (a heap), so that pages reserved one after another, as a batch's
    are, get slots side by side however the slab was used before (``Arena.merged``). ``held``
    counts its used slots whose page may not be evicted (``Arena.hold``), so that whether
    evicting can empty it is known without a walk of the pages."""

    __slots__ = ("slot_size", "free", "fresh", "end", "used", "held")

    def __init__(self, base: int, slab_bytes: int, slot_size: int) -> None:
        self.slot_size = slot_size
        self.free: list[int] = []
        self.fresh = base
        self.end = base + (slab_bytes // slot_size) * slot_size
        self.used = 0
        self.held = 0

    def has_room(self) -> bool:
        return bool(self.free) or self.fresh < self.end

    def room(self) -> int:
        """Bytes of the slots it can still hand out (its tail past the last whole slot is none)."""
        return len(self.free) * self.slot_size + self.end - self.fresh

    def take(self) -> int:
        """A slot, held: what it will hold is a draft until its page is admitted."""
        self.used += 1
        self.held += 1
        if self.free:
            return heapq.heappop(self.free)
        self.fresh += self.slot_size
        return self.fresh - self.slot_size


class Arena:
    """``capacity`` bytes of anonymous MAP_SHARED memory, handed out as slots of slabs, and the
    liveness word's page after them (kept by a thread from here until ``close``: the thread that
    makes the arena need not live as long as it)."""

    def __init__(self, capacity: int, slab_bytes: int) -> None:
        self.slab_bytes = min(slab_bytes, capacity)
        self.capacity = capacity
        self.fd = os.memfd_create("hicachefs-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            liveness_at = -(-capacity // LIVENESS_BYTES) * LIVENESS_BYTES
            self._file_bytes = liveness_at + LIVENESS_BYTES
            os.ftruncate(self.fd, self._file_bytes)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self.fd, self._file_bytes, flags=mmap.MAP_SHARED)  # filled by ``fill``
        except BaseException:
            os.close(self.fd)
            raise
        self.liveness = LivenessWord(self._map, liveness_at)
        self.view = memoryview(self._map)
        self._address = _address(self.view)
        self._free_slabs = list(range(capacity // self.slab_bytes - 1, -1, -1))
        self._slabs: dict[int, _Slab] = {}  # slab number -> slab in use
        self._partial: dict[int, set[int]] = {}  # slot size -> slab numbers with a free slot
        self.used_bytes = 0

    def fill(self, filled: Callable[[int], None]) -> None:
        """Fault the slots' memory in now (``fill.py``), telling ``filled`` the bytes done."""
        fill(self.fd, self._address, self.capacity, filled)

    def offset_of(self, view) -> int | None:
        """Where ``view`` begins in the arena, if it is a (non-empty, writable) view of it. The
        mapping is shared, so a process forked from this one finds the same bytes there."""
        if not isinstance(view, memoryview) or view.obj is not self._map or view.readonly or not view.nbytes:
            return None
        return _address(view) - self._address

    def merged(self, views: list) -> list:
        """``views`` (a read's pieces, in order) with each run that lies end to end in the arena
        made one view of it: a batch's pages written together sit side by side, so a READ of
        them is answered from one buffer instead of a join that copies every byte once more."""
        merged: list = []
        end = None  # where the last piece ends in the arena, if it is a view of it
        for view in views:
            at = self.offset_of(view)
            if at is not None and at == end:
                start = end - merged[-1].nbytes
                end = at + view.nbytes
                merged[-1] = self.view[start:end]
                continue
            merged.append(view)
            end = None if at is None else at + view.nbytes
        return merged

    def fits(self, size: int) -> bool:
        """Whether a page of ``size`` bytes can ever get a slot (it fits a slab)."""
        return size_class(size) <= self.slab_bytes

    def allocate(self, size: int) -> int | None:
        """Offset of a free slot for ``size`` bytes, or None if a slab would have to be emptied first."""
        slot_size = size_class(size)
        if slot_size > self.slab_bytes:
            return None
        partial = self._partial.setdefault(slot_size, set())
        if partial:
            number = next(iter(partial))
            slab = self._slabs[number]
        elif self._free_slabs:
            number = self._free_slabs.pop()
            slab = self._slabs[number] = _Slab(number * self.slab_bytes, self.slab_bytes, slot_size)
            partial.add(number)
        else:
            return None
        offset = slab.take()
        if not slab.has_room():
            partial.discard(number)
        self.used_bytes += slot_size
        return offset

    @property
    def free_bytes(self) -> int:
        """What ``allocate`` can still hand out without a page evicted: the free slabs, and the
        free slots of the slabs in use (only for their slot size). Not ``capacity - used_bytes``:
        a slab of 2 MiB with one slot of 1.1 MiB is used up (found by review: df said half of a
        full tier was free, and a small page still evicted one)."""
        return len(self._free_slabs) * self.slab_bytes + sum(slab.room() for slab in self._slabs.values())

    def serves(self, offset: int, size: int) -> bool:
        """Whether the used slot at ``offset`` is of the slot size ``size`` takes (freed, it is one)."""
        return self._slabs[offset // self.slab_bytes].slot_size == size_class(size)

    def frees_room(self, size: int) -> bool:
        """Whether evicting every page that is not held lets ``allocate(size)`` find a slot: a
        slab of that slot size has such a page, or a slab has no held slot. Not when each slab
        keeps a held slot (a reader's, a draft's): then nothing need be evicted. A walk of the
        slabs, not of the pages."""
        slot_size = size_class(size)
        return any(slab.held == 0 or (slab.slot_size == slot_size and slab.held < slab.used)
                   for slab in self._slabs.values())

    def slab_if_free_to_empty(self, offset: int) -> tuple[int, int, int] | None:
        """[start, end) of the used slot's slab and its pages, when no slot of it is held
        (evicting its pages empties it for any size); else None."""
        number = offset // self.slab_bytes
        slab = self._slabs[number]
        if slab.held:
            return None
        return number * self.slab_bytes, (number + 1) * self.slab_bytes, slab.used

    def hold(self, offset: int) -> None:
        """The used slot's page may not be evicted now (a reader holds it, or it left its name)."""
        self._slabs[offset // self.slab_bytes].held += 1

    def let_go(self, offset: int) -> None:
        """The used slot's page may be evicted now (admitted, or its last reader gone)."""
        self._slabs[offset // self.slab_bytes].held -= 1

    def free(self, offset: int) -> None:
        """Return the held slot at ``offset``; an emptied slab goes back to the free pool."""
        number = offset // self.slab_bytes
        slab = self._slabs[number]
        heapq.heappush(slab.free, offset)
        slab.used -= 1
        slab.held -= 1
        self.used_bytes -= slab.slot_size
        if slab.used == 0:
            del self._slabs[number]
            self._partial[slab.slot_size].discard(number)
            self._free_slabs.append(number)
        else:
            self._partial[slab.slot_size].add(number)

    def close(self) -> None:
        """Unmap, unless a reader's memoryview still points into the arena (then the GC unmaps),
        and give its memory back at once: a data-plane client may still hold the memfd open
        (until it notices the daemon is gone), and must not keep the RAM tier's memory alive."""
        self.liveness.stop()
        self.view.release()
        try:
            self._map.close()
        except BufferError:
            pass
        if self.fd >= 0:
            _punch_hole(self.fd, self._file_bytes)
            os.close(self.fd)
            self.fd = -1


_LIBC = ctypes.CDLL(None, use_errno=True)
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


def _punch_hole(fd: int, size: int) -> None:
    """Free a memfd's pages (its size is sealed: this keeps the size, reads give zeros)."""
    if _LIBC.fallocate(fd, _PUNCH_HOLE, ctypes.c_long(0), ctypes.c_long(size)) != 0:
        raise OSError(ctypes.get_errno(), "cannot free the arena's memory")


def _address(view: memoryview) -> int:
    """The address of a writable view's first byte (the ctypes object pins it only meanwhile)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))
