"""The arena's liveness word: what a data-plane client reads at every call to know the daemon still
runs. It must change the moment the daemon's process ends, even by SIGKILL, with nobody in that
process left to change it; and when a store closes."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading

from hicachefs.store.ram.arena import LIVENESS_BYTES, Arena
from hicachefs.store.ram.liveness import OWNER_DIED, WORD_OFFSET

MiB = 1 << 20

_OWNER = """
import os, sys
from hicachefs.store.ram.arena import Arena
arena = Arena(4 << 20, 1 << 20)
print(arena.fd, flush=True)
sys.stdin.read()  # until the test kills it
"""


def word(fd: int) -> int:
    size = os.fstat(fd).st_size
    return struct.unpack("<I", os.pread(fd, 4, size - LIVENESS_BYTES + WORD_OFFSET))[0]


def test_the_word_is_a_thread_of_the_store_while_open_and_marked_once_closed():
    arena = Arena(3 * MiB + 100, 1 * MiB)  # the word's page sits past the capacity, page aligned
    try:
        assert os.fstat(arena.fd).st_size == 3 * MiB + 4096 + LIVENESS_BYTES
        alive = word(arena.fd)
        assert alive in {thread.native_id for thread in threading.enumerate()}
        fd = os.dup(arena.fd)
    finally:
        arena.close()
    try:
        assert word(fd) != alive
    finally:
        os.close(fd)


def test_the_kernel_marks_the_word_when_the_owning_process_is_killed():
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        number = int(owner.stdout.readline())
        fd = os.open(f"/proc/{owner.pid}/fd/{number}", os.O_RDONLY)
        try:
            alive = word(fd)
            assert alive and not alive & OWNER_DIED
            owner.kill()  # SIGKILL: nothing in the process runs again
            owner.wait(timeout=10)
            assert word(fd) == OWNER_DIED
        finally:
            os.close(fd)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
