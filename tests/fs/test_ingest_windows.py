"""Ingest writes that a worker copies by the handle's window, in one message to the owner
(``fs/ingest_windows.py``), without FUSE or workers: the stream and a real store, with the
worker's side played here."""

from __future__ import annotations

import errno
import struct

import pytest

from hicachefs.fs.errors import FsError
from hicachefs.fs.ingest import MAGIC, IngestStream, WritePlan
from hicachefs.fs.handles import DirectoryHandle, HandleTable
from hicachefs.fs.ingest_windows import IngestWindow, IngestWindows
from hicachefs.store import PageStore, StoreConfig, page_checksum
from hicachefs.testing.workload import content

MIB = 1 << 20


class StraightToTheStore:
    """The publisher's face with none of the namespace's rules: pages go to the store by path."""

    def __init__(self, store: PageStore) -> None:
        self.store = store

    def has_page(self, path: str) -> bool:
        return self.store.holds(path)

    def reserve_page(self, path: str, size: int):
        return self.store.reserve(size)

    def abandon_page(self, draft) -> None:
        self.store.abandon(draft)

    def publish_page(self, path: str, draft) -> None:
        self.store.publish(draft, path)


@pytest.fixture
def store():
    store = PageStore(StoreConfig(memory_bytes=32 * MIB, max_page_size=2 * MIB))
    yield store
    store.close()


def batch(pages: list[tuple[str, bytes]]) -> bytes:
    header = b"".join(f"{len(data)} {path}\n".encode() for path, data in pages)
    return struct.pack("<8sIHH", MAGIC, len(header), len(pages), 0) + header + b"".join(d for _, d in pages)


def copy(shared: memoryview, write: memoryview, copies, checksummed) -> list[int]:
    """What a worker does with a plan: the bytes where it says, then the completed pages' sums."""
    for at, length, target in copies:
        shared[target : target + length] = write[at : at + length]
    return [page_checksum(shared[at : at + length]) for at, length in checksummed]


def write_as_a_worker(stream: IngestStream, shared: memoryview, stream_bytes: bytes, step: int) -> int:
    """Write the stream in ``step``-byte writes as a worker would; how many went by the window."""
    by_window = 0
    for offset in range(0, len(stream_bytes), step):
        write = memoryview(stream_bytes)[offset : offset + step]
        stream.reserve_ahead(8 * MIB, 64)
        planned = IngestWindow(*stream.window()).plan(offset, len(write))
        if planned is not None:
            assert stream.filled_at(offset, len(write), planned[0], copy(shared, write, *planned)) == len(write)
            by_window += 1
            continue
        head = write[:4096] if offset == 0 else write[:0]
        plan = stream.plan(offset, len(write), head)
        assert isinstance(plan, WritePlan)
        assert stream.filled([], copy(shared, write, plan.copies, plan.checksummed)) == len(write)
    return by_window


def test_writes_after_the_first_go_by_the_window_and_publish_every_page_whole(store):
    stream = IngestStream(StraightToTheStore(store), store.config.max_page_size)
    pages = [(f"m/f/tp0of1/kv/p{i}", content(i, MIB + 4096 * i + 1)) for i in range(10)]
    whole = batch(pages)
    assert write_as_a_worker(stream, store.shared_memory(), whole, MIB) == len(whole) // MIB  # all but the first
    assert stream.status() == b"10 0\n"
    for path, data in pages:
        with store.open(path) as reader:
            assert bytes(reader.read(0, reader.size)) == data
            assert reader.info.checksum == f"xxh3_64:{page_checksum(data):016x}"


def test_a_write_copied_by_a_window_that_no_longer_holds_is_refused_and_publishes_nothing(store):
    stream = IngestStream(StraightToTheStore(store), store.config.max_page_size)
    pages = [(f"m/f/tp0of1/kv/p{i}", content(i, MIB)) for i in range(4)]
    whole = memoryview(batch(pages))
    head = whole[:MIB]
    plan = stream.plan(0, MIB, head[:4096])
    stream.filled([], copy(store.shared_memory(), head, plan.copies, plan.checksummed))
    stream.reserve_ahead(8 * MIB, 64)
    copies, checksummed = IngestWindow(*stream.window()).plan(MIB, MIB)
    wrong = [(at, length, target + 4096) for at, length, target in copies]
    with pytest.raises(FsError) as info:
        stream.filled_at(MIB, MIB, wrong, [0] * len(checksummed))
    assert info.value.errno == errno.EIO
    assert stream.status() == b"0 0\n" and not store.holds(pages[0][0])


def test_drafts_reserved_ahead_are_given_back_when_the_handle_closes(store):
    stream = IngestStream(StraightToTheStore(store), store.config.max_page_size)
    pages = [(f"m/f/tp0of1/kv/p{i}", content(i, MIB)) for i in range(16)]
    whole = memoryview(batch(pages))
    stream.write(0, whole[:4096])
    stream.reserve_ahead(16 * MIB, 64)
    assert len(IngestWindow(*stream.window()).pages) >= 15
    stream.close()
    drafts = [store.reserve(MIB) for _ in range(30)]  # the whole RAM tier, but a slab's slack
    for draft in drafts:
        store.abandon(draft)


def test_drafts_reserved_ahead_of_all_handles_take_at_most_an_eighth_of_the_ram_tier():
    windows, table = IngestWindows(16 << 20), HandleTable()  # 512 KiB ahead each, 2 MiB in all
    def handle():
        return DirectoryHandle(lambda offset: iter(()))  # any handle: only its number matters here

    handles = [table.add(handle(), slotted=True) << 1 for _ in range(5)]
    unslotted = table.add(handle()) << 1
    assert windows.ahead_for(handles[0]) == 512 << 10 and windows.ahead_for(unslotted) == 0
    for fh in handles[:3]:
        windows.show(fh, IngestWindow(0, [(0, 512 << 10, 0)]))
    windows.show(handles[3], IngestWindow(0, [(0, 256 << 10, 0), (256 << 10, 256 << 10, None)]))  # one kept
    assert windows.ahead_for(handles[4]) == 256 << 10  # what the others leave
    windows.hide(handles[0])  # a write of its stream: its drafts are still reserved
    assert windows.ahead_for(handles[4]) == 256 << 10
    windows.closed(handles[0])  # its handle closed and gave them back
    assert windows.ahead_for(handles[4]) == 512 << 10
    windows.show(handles[1], IngestWindow(0, []))  # its batch ended
    assert windows.ahead_for(handles[4]) == 512 << 10 and windows.ahead_for(handles[2]) == 512 << 10
