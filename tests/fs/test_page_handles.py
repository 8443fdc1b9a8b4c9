"""Open pages hold their pin on a lease (``posix/page_handle.py``), without FUSE: a store, a
handle, and explicit clock readings."""

from __future__ import annotations

import errno
import time

import pytest
import trio

from hicachefs.posix.errors import FsError
from hicachefs.posix.page_handle import Leases, PageHandle
from hicachefs.store.budget import Share
from hicachefs.store import PageStore, StoreConfig

NAME = "m/f/tp0of1/kv/page"


@pytest.fixture
def store(tmp_path):
    store = PageStore(StoreConfig(memory_bytes=16 << 20, max_page_size=1 << 20))
    yield store
    store.close()


def used(store) -> int:
    return store.statistics().tier("memory").used_bytes


def test_a_handle_keeps_its_bytes_during_the_lease_and_pins_nothing_after(store):
    store.put(NAME, b"old" * 1000)
    one_page = used(store)
    leases = Leases(lease_s=10)
    handle = PageHandle(store, leases, store.open(NAME))
    store.put(NAME, b"new" * 1000)  # replaced: the handle still has the old page pinned
    assert bytes(trio.run(handle.read, 0, 3)) == b"old" and used(store) == 2 * one_page
    assert leases.expire(now=time.monotonic() + 5) == 0 and handle.reader is not None
    assert leases.expire(now=time.monotonic() + 11) == 1 and handle.reader is None
    assert used(store) == one_page  # the old page's slot is free
    with pytest.raises(FsError) as info:  # its version is no longer stored
        trio.run(handle.read, 0, 3)
    assert info.value.errno == errno.EIO


def test_a_handle_finds_its_version_again_after_the_lease(store):
    store.put(NAME, b"same" * 1000)
    leases = Leases(lease_s=10)
    handle = PageHandle(store, leases, store.open(NAME))
    assert leases.expire(now=time.monotonic() + 11) == 1
    assert bytes(trio.run(handle.read, 4, 4)) == b"same"  # pinned again, for a new lease
    assert handle.reader is not None and len(leases) == 1
    handle.release()
    assert handle.reader is None


def test_reads_renew_the_lease(store):
    store.put(NAME, b"x" * 4096)
    leases = Leases(lease_s=10)
    handle = PageHandle(store, leases, store.open(NAME))
    handle.pinned_until = time.monotonic() + 30  # as a read 20 s from now would leave it
    assert leases.expire(now=time.monotonic() + 11) == 0 and handle.reader is not None
    assert leases.expire(now=time.monotonic() + 31) == 1


def test_bounded_handles_hold_at_most_their_budget_pinned_the_least_recently_read_let_go(store):
    for i in range(3):
        store.put(f"{NAME}{i}", bytes([i]) * (1 << 20))
    leases = Leases(lease_s=10, pins_of_others=Share("pins_of_others", 2 << 20))
    first, second = (PageHandle(store, leases, store.open(f"{NAME}{i}"), bounded=True) for i in range(2))
    trusted = PageHandle(store, leases, store.open(f"{NAME}2"))  # not bounded: not counted
    assert leases.bounded_held == 2 << 20 and first.reader is not None
    assert bytes(trio.run(first.read, 0, 1)) == b"\0"  # read lately: the second is older now
    third = PageHandle(store, leases, store.open(f"{NAME}2"), bounded=True)
    assert second.reader is None and first.reader is not None and third.reader is not None
    assert trusted.reader is not None and leases.bounded_held == 2 << 20
    assert bytes(trio.run(second.read, 0, 1)) == b"\1"  # its next read finds its page again
    assert first.reader is None and leases.bounded_held == 2 << 20
    for handle in (first, second, third, trusted):
        handle.release()
    assert leases.bounded_held == 0


def test_all_handles_together_hold_at_most_the_pins_share_the_least_recently_read_let_go(store):
    """Readers running as root are bounded too (issue 31: one RAM budget), by the larger share."""
    for i in range(3):
        store.put(f"{NAME}{i}", bytes([i]) * (1 << 20))
    pins = Share("pins", 2 << 20)
    leases = Leases(lease_s=10, pins=pins, pins_of_others=Share("pins_of_others", 1 << 20))
    handles = [PageHandle(store, leases, store.open(f"{NAME}{i}")) for i in range(3)]  # root's
    assert [h.reader is not None for h in handles] == [False, True, True] and pins.held == 2 << 20
    assert bytes(trio.run(handles[0].read, 0, 1)) == b"\0"  # found again; the oldest other lets go
    assert [h.reader is not None for h in handles] == [True, False, True] and pins.held == 2 << 20
    for handle in handles:
        handle.release()
    assert pins.held == 0
