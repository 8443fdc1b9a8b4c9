"""The data plane's two sides without FUSE: a store's shared index and arena, read by the
client's ``Attachment`` through links to this process's own descriptors (as the mount's
``.hicachefs/index``, ``arena`` and ``disk`` are links to the daemon's). A reader never takes a
page that changed under its copy for read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import hicachefs_client.plane_index as plane_index
from hicachefs.store import PageStore, StoreConfig
from hicachefs.store.shared.device import DirectoryDevice
from hicachefs.store.shared.layout import Layout, place
from hicachefs_testing.faults import Fault, FaultyDevice
from hicachefs_testing.workload import content
from pages import wait_until
from hicachefs_client.plane_arena import ArenaMapping
from hicachefs_client.plane_index import Attachment

DIRECTORY = "m/f/tp0of1/kv"
SIZE = 64 << 10


def attach(store: PageStore, root: Path) -> Attachment:
    """An attachment to ``store`` through links under ``root``, as a client makes one."""
    control = root / ".hicachefs"
    control.mkdir(parents=True, exist_ok=True)
    files = store.plane_files()
    for name, fd in (("index", files.index), ("arena", files.arena), ("disk", files.disk)):
        link = control / name
        if link.is_symlink():
            link.unlink()
        if fd is not None:
            link.symlink_to(f"/proc/{os.getpid()}/fd/{fd}")
    return Attachment(str(root))


def read(attachment: Attachment, store: PageStore, key: str, size: int = SIZE):
    """(found, bytes read or None when the copy did not hold)."""
    found = attachment.find(store.plane_dir(DIRECTORY), key)
    if found is None:
        return None, None
    buffer = bytearray(size)
    return found, bytes(buffer) if attachment.copy(found, [memoryview(buffer)], size, verify=False) else None


@pytest.fixture
def store(tmp_path):
    store = PageStore(StoreConfig(memory_bytes=2 << 20, disk_dir=tmp_path / "disk", disk_bytes=64 << 20,
                                  max_page_size=1 << 20))
    yield store
    store.close()


def test_a_page_put_is_found_and_read_whole_and_one_never_put_is_not(store, tmp_path):
    store.put(f"{DIRECTORY}/{'a' * 64}", content(1, SIZE))
    attachment = attach(store, tmp_path / "root")
    found, data = read(attachment, store, "a" * 64)
    assert data == content(1, SIZE) and found.size == SIZE and found.ram >= 0
    assert read(attachment, store, "b" * 64) == (None, None)
    store.put(f"{DIRECTORY}/odd key", content(2, 100))  # not 64 hex digits: hashed by its digest
    assert read(attachment, store, "odd key", 100)[1] == content(2, 100)


def test_a_prefix_lookup_stops_at_the_first_page_not_held(store, tmp_path):
    """SGLang asks how many pages from the first are stored: past the first missing one the
    index is not probed (as HiCacheFile stops at its first failed stat)."""
    for key in ("a" * 64, "c" * 64):
        store.put(f"{DIRECTORY}/{key}", content(1, SIZE))
    attachment = attach(store, tmp_path / "root")
    dir_id = store.plane_dir(DIRECTORY)
    keys = ["a" * 64, "b" * 64, "c" * 64]
    whole = attachment.locate(dir_id, keys)
    assert [type(f).__name__ for f in whole] == ["Found", "bool", "Found"] and whole[1] is False
    prefix = attachment.locate(dir_id, keys, prefix=True)
    assert prefix[0] == whole[0] and prefix[1:] == [False, False]


@pytest.mark.parametrize("change", ["replace", "remove", "demote"])
def test_every_change_of_a_page_fails_a_copy_made_before_it(store, tmp_path, change):
    name = f"{DIRECTORY}/{'c' * 64}"
    store.put(name, content(3, SIZE))
    attachment = attach(store, tmp_path / "root")
    found, _ = read(attachment, store, "c" * 64)
    if change == "replace":
        store.put(name, content(4, SIZE))
    elif change == "remove":
        store.delete(name)
    else:
        for i in range(40):  # more than RAM holds: the page moves down to the disk tier
            store.put(f"{DIRECTORY}/filler{i}", content(100 + i, SIZE))
    assert not attachment.unchanged(found)
    again, data = read(attachment, store, "c" * 64)
    if change == "remove":
        assert again is None
    else:
        assert data == content(4 if change == "replace" else 3, SIZE)
        assert change != "demote" or (again.ram < 0 and again.disk >= 0)


def test_a_page_being_replaced_is_never_a_miss_to_a_reader(store, tmp_path):
    """A replace is atomic, as a rename: a reader that looks the page up while the store swaps
    its row (the old one gone from the table, the new one not yet in) finds the old page, the
    new one, or is told to ask the daemon (None), never that the page is not held (False),
    which the client answers as a miss."""
    name, key = f"{DIRECTORY}/{'f' * 64}", "f" * 64
    store.put(name, content(7, SIZE))
    attachment = attach(store, tmp_path / "root")
    dir_id = store.plane_dir(DIRECTORY)
    index = store._index
    add, seen = index.add, []

    def add_looked_up(*args, **kwargs):
        seen.extend(attachment.locate(dir_id, [key]) + attachment.locate(dir_id, [key], rows=False)
                    + attachment.locate(dir_id, [key], prefix=True))
        return add(*args, **kwargs)

    index.add = add_looked_up
    try:
        store.put(name, content(8, SIZE))
    finally:
        del index.add
    assert len(seen) == 3 and False not in seen, seen
    assert read(attachment, store, key)[1] == content(8, SIZE)


def test_while_the_table_changes_a_hit_stands_and_a_miss_is_unsure(store, tmp_path):
    """A hit's row holds its key and its ``gen`` vouches for the copy, whatever the table does;
    a miss probed while the table is rebuilt or a page replaced (``table_gen`` odd) is unsure."""
    store.put(f"{DIRECTORY}/{'a' * 64}", content(1, SIZE))
    attachment = attach(store, tmp_path / "root")
    dir_id = store.plane_dir(DIRECTORY)
    store._index.memory.rebuilding()
    try:
        held, missing = attachment.locate(dir_id, ["a" * 64, "b" * 64])
    finally:
        store._index.memory.rebuilt()
    assert held is not None and held.size == SIZE and missing is None
    assert attachment.locate(dir_id, ["b" * 64]) == [False]


def test_a_replace_rebuilds_the_table_before_its_name_leaves_its_row(tmp_path, monkeypatch):
    """Removals leave tombstones, and the table is rebuilt in place once they fill it. A replace
    that needs it rebuilt does so before its name leaves its row (``PageIndex.make_room``), not
    while the name is in no row; a reader probing during that rebuild finds the page or is
    unsure (the client asks the daemon), never "not held"."""
    store = PageStore(StoreConfig(memory_bytes=2 << 20))
    try:
        name = f"{DIRECTORY}/{'f' * 64}"
        store.put(name, content(1, 100))
        attachment = attach(store, tmp_path / "root")
        dir_id = store.plane_dir(DIRECTORY)
        memory = store._index.memory
        answers, nested, replacing, rebuild_running = [], [], [], []
        rebuild, rebuilding = type(store._index)._rebuild, type(memory).rebuilding

        def watched_rebuild(self, table_size):
            nested.append(self._replacing)  # a replace's name in no row meanwhile
            rebuild_running.append(True)
            try:
                rebuild(self, table_size)
            finally:
                rebuild_running.clear()

        def probed(self):  # the table begins to change: a reader probes
            rebuilding(self)
            if rebuild_running and replacing:
                answers.append(attachment.locate(dir_id, ["f" * 64], rows=False)[0])

        monkeypatch.setattr(type(store._index), "_rebuild", watched_rebuild)
        monkeypatch.setattr(type(memory), "rebuilding", probed)
        for i in range(3000):
            store.put(f"{DIRECTORY}/x{i}", content(i, 100))
            store.delete(f"{DIRECTORY}/x{i}")
            replacing.append(True)
            store.put(name, content(i, 100))  # a replace
            replacing.clear()
            if answers:
                break
        assert store._index.memory is memory and answers and False not in answers, answers
        assert not any(nested), "the table was rebuilt while a replace's name was in no row"
    finally:
        store.close()


@pytest.mark.parametrize("piece", [SIZE, 4 << 10], ids=["one piece, from the mapping", "pieces of 4 KiB, preadv"])
def test_a_reader_stalled_mid_copy_while_its_slot_gets_another_page_never_takes_it(store, tmp_path, monkeypatch, piece):
    name = f"{DIRECTORY}/{'d' * 64}"
    store.put(name, content(5, SIZE))
    attachment = attach(store, tmp_path / "root")
    found = attachment.find(store.plane_dir(DIRECTORY), "d" * 64)
    reused = []

    def evict_and_reuse(_found):  # between the copy and its check, the page goes, its slot is reused
        store.delete(name)
        store.put(f"{DIRECTORY}/{'e' * 64}", content(6, SIZE))
        reused.append(attachment.find(store.plane_dir(DIRECTORY), "e" * 64).ram)

    monkeypatch.setattr(plane_index, "after_copy", evict_and_reuse)
    buffer = bytearray(SIZE)
    pieces = [memoryview(buffer)[at : at + piece] for at in range(0, SIZE, piece)]
    assert attachment.copy(found, pieces, SIZE, verify=False) is False
    assert reused == [found.ram]  # the slot did get another page's bytes
    assert bytes(buffer) == content(5, SIZE)  # copied whole before the change, and still refused


def test_an_index_that_grows_sends_readers_to_its_new_memory(store, tmp_path):
    attachment = attach(store, tmp_path / "root")
    for i in range(3000):  # past the index's first capacity
        store.put(f"{DIRECTORY}/{i:064x}", content(i, 64))
    assert not attachment.live
    # The moved memory no longer learns of new pages: what it lacks is unsure, not a miss.
    assert attachment.locate(store.plane_dir(DIRECTORY), [f"{2999:064x}"], rows=False) == [None]
    again = attach(store, tmp_path / "root")
    assert again.live and read(again, store, f"{2999:064x}", 64)[1] == content(2999, 64)


def test_an_index_starts_with_a_row_for_each_128_kib_of_ram(tmp_path):
    """Readers attach once: 2,000 pages in a 256 MiB store (2,048 rows) do not move its index,
    which 1,024 rows at first did."""
    store = PageStore(StoreConfig(memory_bytes=256 << 20))
    try:
        attachment = attach(store, tmp_path / "root")
        for i in range(2000):
            store.put(f"{DIRECTORY}/{i:064x}", content(i, 64))
        assert attachment.live and read(attachment, store, f"{1999:064x}", 64)[1] == content(1999, 64)
    finally:
        store.close()


def test_a_closed_store_is_trusted_no_more(tmp_path):
    store = PageStore(StoreConfig(memory_bytes=2 << 20))
    attachment = attach(store, tmp_path / "root")
    assert attachment.live
    store.close()
    assert not attachment.live


def put_on_disk(store: PageStore, name: str, data: bytes) -> None:
    """Publish a page, then more pages than RAM holds: it is demoted to the disk tier."""
    store.put(name, data)
    for i in range(40):
        store.put(f"{DIRECTORY}/filler{i}", content(100 + i, SIZE))
    assert store.info(name).tier == "disk"


def test_a_page_on_the_disk_tier_is_read_from_its_file_and_checked(store, tmp_path):
    put_on_disk(store, f"{DIRECTORY}/{'f' * 64}", content(7, SIZE))
    attachment = attach(store, tmp_path / "root")
    found, data = read(attachment, store, "f" * 64)
    assert found.ram < 0 and data == content(7, SIZE)
    with open(tmp_path / "disk" / "hicachefs.arena", "r+b") as arena:  # a block gone bad
        arena.seek(found.disk + 100)
        arena.write(b"\xff\x00\xff")
    assert read(attachment, store, "f" * 64)[1] is None


def test_a_page_the_plane_reads_twice_from_the_disk_tier_is_promoted_to_ram(store, tmp_path):
    name = f"{DIRECTORY}/{'9' * 64}"
    put_on_disk(store, name, content(8, SIZE))
    attachment = attach(store, tmp_path / "root")
    for reads in (1, 2):
        found, data = read(attachment, store, "9" * 64)
        assert data == content(8, SIZE) and found.ram < 0
        assert store.count_plane_reads([(found.row, found.gen)]) == 1  # the client's report
    wait_until(lambda: store.info(name).tier == "memory", timeout=5)  # promoted by its second read
    found, data = read(attachment, store, "9" * 64)
    assert data == content(8, SIZE) and found.ram >= 0 and store.info(name).hits == 2


def test_the_promotion_two_plane_reads_start_counts_no_third_read_of_the_disk_tier(store, tmp_path):
    """Two reads the plane reported are two disk hits and their bytes, as two ``open``s are: the
    promotion the second one starts is the store's own copy (the disk tier counted a third hit
    for it, so the demo's hits by tier outgrew the pages SGLang loaded)."""
    name = f"{DIRECTORY}/{'8' * 64}"
    put_on_disk(store, name, content(8, SIZE))
    attachment = attach(store, tmp_path / "root")
    before = store.statistics().tier("disk")
    for _ in range(2):
        found, _data = read(attachment, store, "8" * 64)
        assert store.count_plane_reads([(found.row, found.gen)]) == 1
    wait_until(lambda: store.info(name).tier == "memory", timeout=5)
    disk = store.statistics().tier("disk")
    assert (disk.hits - before.hits, disk.bytes_out - before.bytes_out) == (2, 2 * SIZE)


def scribble(attachment: Attachment, store: PageStore, key: str) -> None:
    """Write over a RAM page's bytes through the arena, as a buggy client of the plane could."""
    found = attachment.find(store.plane_dir(DIRECTORY), key)
    os.pwrite(attachment.arena_map.fd, b"scribbled", found.ram + 100)


def test_a_ram_page_scribbled_on_is_never_moved_down_to_disk(store, tmp_path):
    name = f"{DIRECTORY}/{'5' * 64}"
    store.put(name, content(9, SIZE))
    attachment = attach(store, tmp_path / "root")
    scribble(attachment, store, "5" * 64)
    for i in range(40):  # more than RAM holds: the page's turn to move down comes
        store.put(f"{DIRECTORY}/filler{i}", content(100 + i, SIZE))
    assert store.info(name) is None  # dropped, not written to the disk tier
    assert store.statistics().tiers[0].checksum_failures == 1


def test_a_ram_page_scribbled_on_is_never_written_to_the_shared_tier(tmp_path):
    shared = FaultyDevice(DirectoryDevice())
    store = PageStore(StoreConfig(memory_bytes=32 << 20, shared_dir=tmp_path / "shared"), shared_device=shared)
    try:
        shared.inject(Fault("pwritev", delay_s=0.5, count=2))  # both writers busy a while
        for i in range(2):
            store.put(f"{DIRECTORY}/slow{i}", content(i, SIZE))
        name = f"{DIRECTORY}/{'6' * 64}"
        store.put(name, content(10, SIZE))
        scribble(attach(store, tmp_path / "root"), store, "6" * 64)  # while it waits in the queue
        wait_until(lambda: not (store.statistics().tiers[-1].write_behind.writing
                                or store.statistics().tiers[-1].write_behind.queue_pages))  # drained
        behind = store.statistics().tiers[-1].write_behind
        assert behind.dropped_corrupt == 1 and behind.written_behind == 2
        on_the_volume = Layout(tmp_path / "shared")
        assert os.path.exists(on_the_volume.page_path(place(f"{DIRECTORY}/slow0")))
        assert not os.path.exists(on_the_volume.page_path(place(name)))
    finally:
        store.close()


@pytest.mark.parametrize("mapped", [True, False], ids=["through the mapping", "with pwritev"])
def test_a_page_given_more_bytes_than_its_slot_never_writes_into_the_next_one(mapped):
    """A caller's buffers that hold more than the page's size (a bug of the caller's) must not
    spill into the slot after its own, which another page may hold."""
    size, arena_bytes = 64 << 10, 1 << 20
    fd = os.memfd_create("arena-test")
    os.ftruncate(fd, arena_bytes)
    os.pwrite(fd, (1234).to_bytes(4, "little"), arena_bytes - 4096 + 8)  # a live daemon's word
    arena = ArenaMapping(fd, arena_bytes, bytes(16), (0, 0))
    arena.mapped_ahead = mapped
    arena.write(size, [memoryview(b"\xbb" * size)], size)  # the next slot's page
    try:
        arena.write(0, [memoryview(b"\xaa" * (size + 4096))], size)
    except OSError:
        pass  # refused: as good
    assert os.pread(fd, size, size) == b"\xbb" * size
    arena.stop()
