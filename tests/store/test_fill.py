"""The RAM tier's memory is faulted in at start a step at a time (``store/ram/fill.py``): all of
it, told step by step; on a kernel without MADV_POPULATE_WRITE in one go; and a host that cannot
give the memory fails the store's start with a clear error, not the daemon later."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading

import pytest

from hicachefs.store import PageStore, StoreConfig, StoreError
from hicachefs.store.ram import fill as filling
from hicachefs.store.ram import ram_tier
from hicachefs.store.ram.ram_tier import RamTier

MiB = 1 << 20


def resident(fd: int) -> int:
    """Bytes of the memfd that have memory (a page's first touch gives it some)."""
    return os.fstat(fd).st_blocks * 512


@pytest.fixture
def mapping():
    """A memfd of 9 MiB, mapped shared and not yet touched: (fd, address)."""
    fd = os.memfd_create("fill-test")
    os.ftruncate(fd, 9 * MiB)
    mapped = mmap.mmap(fd, 9 * MiB, flags=mmap.MAP_SHARED)
    anchor = ctypes.c_char.from_buffer(mapped)
    yield fd, ctypes.addressof(anchor)
    del anchor
    mapped.close()
    os.close(fd)


def test_a_fill_faults_in_the_whole_mapping_and_says_so_after_each_step(mapping, monkeypatch):
    fd, address = mapping
    monkeypatch.setattr(filling, "STEP", 2 * MiB)
    assert resident(fd) == 0
    told = []
    filling.fill(fd, address, 9 * MiB, told.append)
    assert resident(fd) == 9 * MiB
    # One report a step (4 of 2 MiB, 1 of 1 MiB: they end in any order), the bytes done so far.
    assert len(told) == 5 and told == sorted(told) and told[-1] == 9 * MiB
    assert {b - a for a, b in zip([0] + told, told)} <= {1 * MiB, 2 * MiB}


def failing_madvise(error: int, after: int):
    """A stand-in for madvise that fills ``after`` steps, then fails with ``error``."""
    calls = []

    def madvise(address, length, advice):
        calls.append(length)
        if len(calls) <= after:
            return 0
        ctypes.set_errno(error)
        return -1
    return madvise


def test_a_kernel_without_populate_write_gets_the_memfd_filled_in_one_go(mapping, monkeypatch):
    fd, address = mapping
    monkeypatch.setattr(filling, "_madvise", failing_madvise(errno.EINVAL, after=0))
    told = []
    filling.fill(fd, address, 9 * MiB, told.append)
    assert resident(fd) == 9 * MiB and told == [9 * MiB]


def test_a_host_short_of_memory_fails_the_stores_start_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(filling, "STEP", 1 * MiB)
    monkeypatch.setattr(filling, "_madvise", failing_madvise(errno.ENOMEM, after=2))
    with pytest.raises(StoreError, match=r"cannot fill the RAM tier's 16,777,216 bytes of memory: "
                                         r"Cannot allocate memory"):
        PageStore(StoreConfig(memory_bytes=16 * MiB))


def test_a_fill_thread_that_raises_fails_the_fill_instead_of_leaving_it_waiting(mapping, monkeypatch):
    fd, address = mapping
    monkeypatch.setattr(filling, "STEP", 1 * MiB)

    def broken_madvise(address, length, advice):
        raise ctypes.ArgumentError("a madvise that raises")
    monkeypatch.setattr(filling, "_madvise", broken_madvise)
    outcome = []

    def run() -> None:
        try:
            filling.fill(fd, address, 9 * MiB, lambda done: None)
        except Exception as raised:
            outcome.append(raised)
    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    waiter.join(timeout=10)
    assert not waiter.is_alive(), "the fill waits for a thread that died"
    assert [type(raised) for raised in outcome] == [ctypes.ArgumentError]


@pytest.fixture
def ram_tiers():
    """Makes RAM tiers of 8 MiB, and closes them (their arena's memory and liveness thread)."""
    made = []

    def make() -> RamTier:
        made.append(RamTier(8 * MiB, 1 * MiB))
        return made[-1]
    yield make
    for tier in made:
        tier.close()


def test_a_slow_fill_reports_its_start_its_steps_and_its_end_and_a_quick_one_nothing(ram_tiers, monkeypatch):
    quick, slow = [], []
    ram_tiers().fill(quick.append)
    assert quick == []
    monkeypatch.setattr(ram_tier, "QUIET_FILL_S", 0.0)
    monkeypatch.setattr(filling, "STEP", 2 * MiB)
    tier = ram_tiers()
    tier.fill(slow.append)
    assert [(p.method, p.scanned_bytes, p.total_bytes, p.finished) for p in slow] == [
        ("fill", 0, 8 * MiB, False), ("fill", 2 * MiB, 8 * MiB, False), ("fill", 4 * MiB, 8 * MiB, False),
        ("fill", 6 * MiB, 8 * MiB, False), ("fill", 8 * MiB, 8 * MiB, True)]
    assert resident(tier.shared_fd()) >= 8 * MiB
