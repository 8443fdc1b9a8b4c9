"""The plane file's requests in the daemon, without FUSE: a plane handle over a namespace and its
store. What a writer reserves is bounded by what its slots take of the RAM tier, and what one
request does on the event loop is bounded."""

from __future__ import annotations

import errno
import struct

import pytest
import trio

from hicachefs.control import plane
from hicachefs.posix.errors import FsError
from hicachefs.store import PageStore, StoreConfig
from namespace_alone import Alone, partial_requests_until_refused

POOL = "m/f/tp0of1/kv"


def request(handle: plane.PlaneHandle, op: int, count: int, body: bytes) -> bytes:
    trio.run(handle.write, 0, plane.REQUEST.pack(b"HCPQ", op, 0, count, len(body), 1) + body)
    return trio.run(handle.read, 0, 1 << 26)[plane.ANSWER.size:]


@pytest.fixture
def alone():
    store = PageStore(StoreConfig(memory_bytes=4 << 20))
    yield Alone(store)
    store.close()


def test_tiny_reservations_hold_no_more_of_the_ram_tier_than_the_writing_share(alone):
    """Each reservation takes a whole slot (64 bytes at least); a writer reserving 1-byte pages
    must not take the published pages' half of the tier while the writing share says it
    holds a sixty-fourth of that."""
    store = alone.store
    pages = [f"{POOL}/{i:064x}" for i in range(32)]
    for i, name in enumerate(pages):  # half the tier (2 MiB of 4)
        store.put(name, bytes([i]) * (64 << 10))
    handle = alone.open_control(b"plane")
    writing = alone.ns.publishing.writing
    count = 4096
    for _ in range(12):  # 48 Ki one-byte pages: 3 MiB of slots
        try:
            request(handle, plane.RESERVE, count, struct.pack(f"<{count}I", *[1] * count))
        except FsError:
            break
    assert writing.held <= writing.limit
    assert store._ram.arena.used_bytes - 32 * (64 << 10) <= writing.limit  # what the slots take
    assert all(store.info(name) is not None for name in pages), "reservations evicted published pages"
    handle.release()
    assert writing.held == 0


def test_a_reserve_of_more_pages_than_a_commit_holds_is_refused_and_reserves_nothing(alone):
    """A request's work on the event loop is bounded (as a report's is): a RESERVE of a million
    sizes ran there for seconds, every other request of the mount waiting."""
    store = alone.store
    handle = alone.open_control(b"plane")
    count = plane.MAX_REPORT + 1
    with pytest.raises(FsError) as refused:
        request(handle, plane.RESERVE, count, struct.pack(f"<{count}I", *[64] * count))
    assert refused.value.errno == errno.EFBIG
    assert alone.ns.publishing.writing.held == 0 and store._ram.arena.used_bytes == 0
    body = struct.pack(f"<I{count}I", count, *[64] * count)  # a commit reserving as many ahead
    with pytest.raises(FsError) as refused:
        request(handle, plane.COMMIT, 0, body)
    assert refused.value.errno == errno.EFBIG
    assert alone.ns.publishing.writing.held == 0 and store._ram.arena.used_bytes == 0
    handle.release()


def test_a_release_of_more_pages_than_a_commit_holds_is_refused_and_releases_nothing(alone):
    """A RELEASE was bounded only by the request's size: half a million offsets ran on the event
    loop for 64 ms, another client's exists query waiting 56 ms (found by review)."""
    handle = alone.open_control(b"plane")
    slots = struct.unpack("<2q", request(handle, plane.RESERVE, 2, struct.pack("<2I", 64, 64)))
    count = plane.MAX_REPORT + 1
    with pytest.raises(FsError) as refused:
        request(handle, plane.RELEASE, count, struct.pack(f"<{count}q", *([slots[0]] + [-1] * (count - 1))))
    assert refused.value.errno == errno.EFBIG
    assert alone.ns.publishing.writing.held == 2 * 64  # both slots still the handle's
    request(handle, plane.RELEASE, 2, struct.pack("<2q", *slots))
    assert alone.ns.publishing.writing.held == 0
    handle.release()


def test_a_malformed_commit_publishes_nothing(alone):
    """A commit whose body ends before what its entries say (a path running past it) fails with
    EINVAL and publishes none of its pages, not those before the bad one."""
    store = alone.store
    handle = alone.open_control(b"plane")
    slots = struct.unpack("<2q", request(handle, plane.RESERVE, 2, struct.pack("<2I", 64, 64)))
    assert all(slot >= 0 for slot in slots)
    good = f"{POOL}/{'a' * 64}".encode()
    body = plane._ENTRY.pack(slots[0], 0, 64, len(good)) + good
    body += plane._ENTRY.pack(slots[1], 0, 64, 4096) + b"short"  # its path runs past the body
    with pytest.raises(FsError) as refused:
        request(handle, plane.COMMIT, 2, body)
    assert refused.value.errno == errno.EINVAL
    assert store.info(good.decode()) is None
    handle.release()
    assert alone.ns.publishing.writing.held == 0


def test_a_report_counts_the_misses_it_carries_after_its_reads(alone):
    """The plane's readers report the reads they found no page for (a trailing ``<I``) as well
    as those they made: the daemon's misses count them as an open of a missing page would. A
    report without them is read as before; one claiming more than a report holds is refused."""
    store = alone.store
    store.put(f"{POOL}/{0:064x}", bytes(4096))
    row = store._index.find(f"{POOL}/{0:064x}")
    gen = int(store._index.gen[row])
    handle = alone.open_control(b"plane")
    read = struct.pack("<IQ", row, gen)
    assert struct.unpack("<I", request(handle, plane.REPORT, 1, read + struct.pack("<I", 3))) == (1,)
    facts = store.statistics()
    assert (facts.hits, facts.misses, facts.tier("memory").misses) == (1, 3, 3)
    assert struct.unpack("<I", request(handle, plane.REPORT, 1, read)) == (1,)
    assert struct.unpack("<I", request(handle, plane.REPORT, 0, struct.pack("<I", 2))) == (0,)
    assert (store.statistics().hits, store.statistics().misses) == (2, 5)
    with pytest.raises(FsError) as refused:
        request(handle, plane.REPORT, 0, struct.pack("<I", plane.MAX_REPORT + 1))
    assert refused.value.errno == errno.EFBIG and store.statistics().misses == 5
    handle.release()


def test_requests_sent_in_pieces_are_held_against_the_writers_request_share(alone):
    """A request sent in several writes is gathered by its handle until whole: up to 4 MiB a
    handle, which no share counted (500 handles each holding a 4 MiB partial commit took the
    daemon from 108 MiB to 2.1 GiB). It is held against the writers' share of the request
    files' memory: the piece that would go over fails with ENOBUFS and ends its request, and
    the share comes back when a request is whole and when a handle closes."""
    memory = alone.ns.control.request_limits.memory
    head = plane.REQUEST.pack(b"HCPQ", plane.COMMIT, 0, 0, (4 << 20) + 1, 1)  # a byte short when sent
    piece = bytes(1 << 20)
    handles, refused = partial_requests_until_refused(alone, b"plane", head)
    assert refused is not None and refused.errno == errno.ENOBUFS
    assert memory.held <= memory.limits.writers
    ended = handles.pop()  # its request ended: nothing held, and a piece after it does not go on
    with pytest.raises(FsError) as not_on:
        trio.run(ended.write, len(head) + 4 * len(piece), piece)
    assert not_on.value.errno == errno.EINVAL
    for handle in handles:
        handle.release()
    assert memory.held == 0
    dir_request = plane.REQUEST.pack(b"HCPQ", plane.DIR, 0, 0, len(POOL), 2) + POOL.encode()
    trio.run(ended.write, 0, dir_request[:10])  # a whole request, in two pieces
    assert memory.held == 10
    trio.run(ended.write, 10, dir_request[10:])
    assert memory.held == 0
    assert trio.run(ended.read, 0, 1 << 20)[:4] == plane.ANSWER_MAGIC
    trio.run(ended.write, 0, head)
    assert memory.held == len(head)
    ended.release()
    assert memory.held == 0
