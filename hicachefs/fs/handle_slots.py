"""A few bytes about each open handle that every worker process reads without asking the owner of
the store (``--workers``): in memory that ``fork`` shares, the slot the handle's number names
(``handles.slot_of``; a slot is one open handle's alone).

Only the owner writes a slot, and it writes one only while it answers a request of that handle.
Requests of one handle come one after another (a client's ``preadv`` or ``pwritev`` is cut into
requests each sent once the last is answered), so a worker reads a handle's slot only before or
after the owner changed it; a sequence number (odd while a write is under way, as a seqlock's)
and the handle's number in the slot still guard the reader against a handle that two threads
use at once, or a slot that a closed handle left: such a read finds nothing, and the worker
asks the owner. A worker may mark a slot it used (one word of its head), which tells the owner
when it clears the slot.

Not thread-safe: each process uses it from one thread.
"""

from __future__ import annotations

import mmap
import struct

from .handles import SLOTS, slot_of

#: A slot's head: sequence number, handle number, payload length, and the mark, at _MARK.
_HEAD = struct.Struct("<QQII")
_MARK = struct.calcsize("<QQI")


class HandleSlots:
    """A slot of ``payload_bytes`` for each of ``handles.SLOTS`` handles. A handle (``fh``, its
    number shifted left by one, as ``requests`` makes it) without a slot finds nothing."""

    def __init__(self, payload_bytes: int) -> None:
        self.payload_bytes = payload_bytes
        self._size = _HEAD.size + payload_bytes
        self._memory = mmap.mmap(-1, SLOTS * self._size)  # anonymous and MAP_SHARED: kept by fork

    def _at(self, fh: int) -> int | None:
        slot = slot_of(fh >> 1)
        return None if slot is None else slot * self._size

    def holds(self, fh: int) -> bool:
        """Whether ``fh`` has a slot."""
        return self._at(fh) is not None

    def put(self, fh: int, payload: bytes | None) -> None:
        """The owner: ``fh``'s slot now says ``payload`` (nothing, for None: ``clear``)."""
        if payload is None:
            self.clear(fh)
            return
        if len(payload) > self.payload_bytes:
            raise ValueError(f"a payload of {len(payload)} bytes does not fit a slot of {self.payload_bytes}")
        memory, at = self._memory, self._at(fh)
        if at is None:
            return
        sequence = _HEAD.unpack_from(memory, at)[0] | 1
        _HEAD.pack_into(memory, at, sequence, 0, 0, 0)
        memory[at + _HEAD.size : at + _HEAD.size + len(payload)] = payload
        _HEAD.pack_into(memory, at, sequence + 1, fh, len(payload), 0)

    def clear(self, fh: int) -> bool:
        """The owner: ``fh``'s slot says nothing; whether a worker marked it since ``put``."""
        memory, at = self._memory, self._at(fh)
        if at is None:
            return False
        sequence, owner, _, marked = _HEAD.unpack_from(memory, at)
        if owner != fh:
            return False
        _HEAD.pack_into(memory, at, (sequence | 1) + 1, 0, 0, 0)
        return bool(marked)

    def mark(self, fh: int) -> None:
        """A worker: say that ``fh``'s slot was used (after ``get`` found it)."""
        struct.pack_into("<I", self._memory, self._at(fh) + _MARK, 1)

    def get(self, fh: int) -> bytes | None:
        """What ``fh``'s slot says; None when it says nothing about ``fh`` or was being written."""
        memory, at = self._memory, self._at(fh)
        if at is None:
            return None
        sequence, owner, length, _ = _HEAD.unpack_from(memory, at)
        if owner != fh or sequence & 1 or length > self.payload_bytes:
            return None
        payload = memory[at + _HEAD.size : at + _HEAD.size + length]
        return payload if _HEAD.unpack_from(memory, at)[0] == sequence else None


class HeldAhead:
    """What the windows of one kind hold of the RAM tier ahead of their handles' requests (pages
    pinned, drafts reserved), each handle's part and all of it: a handle may take at most
    ``each_bytes``, within what the others leave of ``all_bytes``; a handle without a slot,
    whose window no worker could read, takes nothing."""

    def __init__(self, slots: HandleSlots, each_bytes: int, all_bytes: int) -> None:
        self.slots = slots
        self.each_bytes = each_bytes
        self.all_bytes = all_bytes
        self._held: dict[int, int] = {}
        self._total = 0

    def room_for(self, fh: int) -> int:
        if not self.slots.holds(fh):
            return 0
        room = self.all_bytes - (self._total - self._held.get(fh, 0))
        return max(0, min(self.each_bytes, room))

    def holds(self, fh: int, held: int) -> None:
        """``fh``'s window holds ``held`` bytes now."""
        self._total += held - self._held.pop(fh, 0)
        if held:
            self._held[fh] = held
