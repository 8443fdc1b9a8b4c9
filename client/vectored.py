"""Vectored reads into several buffers and writes from them (a page's pieces in the host pool):
what is left to move, and copies out of a mapped file and into one."""

from __future__ import annotations

import ctypes
import os
from typing import Callable, List, Sequence


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


def read_into(fd: int, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes read from ``offset`` into ``buffers``, until they are full or the file ends."""
    return _vectored(os.preadv, fd, buffers, offset)


def copy_from(source: memoryview, address: int, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes copied from ``source`` (a mapping at ``address``) at ``offset`` into ``buffers``,
    until they are full or ``source`` ends (``memmove``: other threads run meanwhile)."""
    return _copy(source, address, buffers, offset, into=False)


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


def write_from(target: memoryview, address: int, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes copied from ``buffers`` into ``target`` (a mapping at ``address``) at ``offset``,
    until they are all copied or ``target`` ends (``memmove``: other threads run meanwhile)."""
    return _copy(target, address, buffers, offset, into=True)


def _copy(mapped: memoryview, base: int, buffers: Sequence[memoryview], offset: int, into: bool) -> int:
    """Each buffer's bytes to or from ``mapped`` (writable, at address ``base``) from ``offset`` on. A Python slice
    copy holds the interpreter lock for all of it (a millisecond for 8 MiB, SGLang's scheduler
    waiting), so buffers that ctypes can point to are copied by ``memmove``, which lets go of
    it; a read-only buffer (a source only) is copied by a slice."""
    done = 0
    for buf in buffers:
        n = max(0, min(len(buf), len(mapped) - offset - done))
        if n:
            if into and buf.readonly:
                mapped[offset + done : offset + done + n] = buf[:n]
            elif into:
                ctypes.memmove(base + offset + done, address_of(buf), n)
            else:
                ctypes.memmove(address_of(buf), base + offset + done, n)
        done += n
        if n < len(buf):
            break
    return done


def address_of(view) -> int:
    """A writable buffer's address (the ctypes object, which pins it, goes at once)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))
