"""Vectored reads into several buffers and writes from them (a page's pieces in the host pool):
what is left to move, and copies out of a mapped file and into one."""

from __future__ import annotations

import ctypes
import os
from typing import Callable, List, Sequence

#: Buffers one ``preadv``/``pwritev`` takes (Linux: 1024).
MAX_BUFFERS = os.sysconf("SC_IOV_MAX")
#: Bytes one ``preadv``/``pwritev`` of a run of pages moves at most: the kernel moves at most 2 GiB
#: less a page per call (``MAX_RW_COUNT``), and a call it cut short would look like a page missing.
MAX_IO_BYTES = 1 << 30


def advance(buffers: Sequence[memoryview], done: int) -> List[memoryview]:
    """The buffers still to fill after the first ``done`` bytes."""
    rest = []
    for buf in buffers:
        if done >= len(buf):
            done -= len(buf)
            continue
        rest.append(buf[done:] if done else buf)
        done = 0
    return rest


#: Pieces smaller than this are copied holding the interpreter lock (tens of microseconds at most):
#: letting go of it and taking it back for each, under SGLang's other threads, cost more than the
#: copies (a prefetch of 58 pages of 128 KiB under SGLang's controller: 0.73 ms copying, 1.38 ms in
#: all). Larger ones let go of it, so that a batch's runs are copied on several threads at once.
HOLD_LOCK_BELOW = 256 << 10
#: The same for a batch copied in one run (``alone``): no other page thread waits for the lock, and
#: pieces up to this size (some 60 us each) hold it. A prefetch of 34 pages of 768 KiB (pieces of
#: 384 KiB) under SGLang's controller waited 1.3 ms of its 2.6 for the lock when they let go of it.
HOLD_LOCK_ALONE_BELOW = 1 << 20
_memmove_holding_lock = ctypes.PyDLL(None).memmove
_memmove_holding_lock.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_memmove_holding_lock.restype = ctypes.c_void_p


def read_into(fd: int, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes read from ``offset`` into ``buffers``, until they are full or the file ends."""
    return _vectored(os.preadv, fd, buffers, offset)


def copy_from(source: memoryview, address: int, buffers: Sequence[memoryview], offset: int = 0,
              alone: bool = False) -> int:
    """Bytes copied from ``source`` (a mapping at ``address``) at ``offset`` into ``buffers``,
    until they are full or ``source`` ends (``_copy``)."""
    return _copy(source, address, buffers, offset, into=False, alone=alone)


def write_into(fd: int, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes written from ``buffers`` at ``offset``, all of them unless the file refuses more."""
    return _vectored(os.pwritev, fd, buffers, offset)


def _vectored(move: Callable[[int, List[memoryview], int], int], fd: int, buffers: Sequence[memoryview],
              offset: int) -> int:
    """``move`` (``os.preadv`` or ``os.pwritev``) again on what is left until it is all moved
    or the file moves no more."""
    done, rest = 0, list(buffers)
    while rest:
        n = move(fd, rest, offset + done)
        if n <= 0:
            break
        done += n
        rest = advance(rest, n)
    return done


def write_from(target: memoryview, address: int, buffers: Sequence[memoryview], offset: int = 0,
               alone: bool = False) -> int:
    """Bytes copied from ``buffers`` into ``target`` (a mapping at ``address``) at ``offset``,
    until they are all copied or ``target`` ends (``_copy``)."""
    return _copy(target, address, buffers, offset, into=True, alone=alone)


def _copy(mapped: memoryview, base: int, buffers: Sequence[memoryview], offset: int, into: bool,
          alone: bool) -> int:
    """Each buffer's bytes to or from ``mapped`` (writable, at address ``base``) from ``offset`` on,
    by ``memmove``: letting go of the interpreter lock for pieces of ``HOLD_LOCK_BELOW`` or more
    (``HOLD_LOCK_ALONE_BELOW`` for a batch copied in one run: a Python slice copy held it for all
    of an 8 MiB page, a millisecond of SGLang's scheduler waiting), holding it for smaller ones;
    a read-only buffer (a source only) is copied by a slice."""
    hold_below = HOLD_LOCK_ALONE_BELOW if alone else HOLD_LOCK_BELOW
    done = 0
    for buf in buffers:
        n = max(0, min(len(buf), len(mapped) - offset - done))
        if n:
            if into and buf.readonly:
                mapped[offset + done : offset + done + n] = buf[:n]
            else:
                move = ctypes.memmove if n >= hold_below else _memmove_holding_lock
                if into:
                    move(base + offset + done, address_of(buf), n)
                else:
                    move(address_of(buf), base + offset + done, n)
        done += n
        if n < len(buf):
            break
    return done


def address_of(view) -> int:
    """A writable buffer's address (the ctypes object, which pins it, goes at once)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))
