"""Vectored reads into several buffers and writes from them (a page's pieces in the host pool):
what is left to move, and copies out of a mapped file and into one."""

from __future__ import annotations

import os
from typing import List, Sequence


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
    done, rest = 0, list(buffers)
    while rest:
        n = os.preadv(fd, rest, offset + done)
        if n <= 0:
            break
        done += n
        rest = advance(rest, n)
    return done


def copy_from(source: memoryview, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes copied from ``source`` at ``offset`` into ``buffers``, until they are full or
    ``source`` ends."""
    done = 0
    for buf in buffers:
        piece = source[offset + done : offset + done + len(buf)]
        buf[: len(piece)] = piece
        done += len(piece)
        if len(piece) < len(buf):
            break
    return done


def write_into(fd: int, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes written from ``buffers`` at ``offset``, all of them unless the file refuses more."""
    done, rest = 0, list(buffers)
    while rest:
        n = os.pwritev(fd, rest, offset + done)
        if n <= 0:
            break
        done += n
        rest = advance(rest, n)
    return done


def write_from(target: memoryview, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Bytes copied from ``buffers`` into ``target`` at ``offset``, until they are all copied or
    ``target`` ends."""
    done = 0
    for buf in buffers:
        piece = target[offset + done : offset + done + len(buf)]
        piece[:] = buf[: len(piece)]
        done += len(piece)
        if len(piece) < len(buf):
            break
    return done
