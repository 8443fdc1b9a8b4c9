"""Round trips and names, on the RAM tier alone."""

import pytest

from hicachefs.store import PageNotFound, PageTooLarge, StoreFull
from hicachefs_testing.workload import content
from hicachefs_testing.store_tools import delete_tree, list_all

from store_helpers import KiB, MiB, page_name, read_all


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 1 * MiB, 8 * MiB + 3])
def test_round_trip_keeps_bytes_exact(make_store, size):
    store = make_store(memory=128 * MiB, max_page_size=16 * MiB)
    name = page_name(size)
    info = store.put(name, content(size, size))
    assert (info.name, info.size, info.tier) == (name, size, "memory")
    assert info.checksum.startswith("xxh3_64:") and len(info.checksum) == 8 + 16
    assert read_all(store, name) == content(size, size)


def test_draft_written_in_place_then_published(make_store):
    store = make_store()
    draft = store.reserve(10)
    draft.write(0, b"0123456789")
    assert store.info("a/b") is None  # not visible before publish
    store.publish(draft, "a/b", mtime_ns=123)
    info = store.info("a/b")
    assert info.mtime_ns == 123 and read_all(store, "a/b") == b"0123456789"
    abandoned = store.reserve(MiB)
    store.abandon(abandoned)
    assert store.statistics().tier("memory").used_bytes == 64  # only the 10-byte page's slot


def test_reads_clamp_to_the_page_end(make_store):
    store = make_store()
    store.put("d/p", b"abcdef")
    with store.open("d/p") as reader:
        assert bytes(reader.read(4, 100)) == b"ef"
        assert bytes(reader.read(6, 10)) == b""
        assert bytes(reader.read(100, 10)) == b""


def test_replace_is_atomic_and_delete_removes(make_store):
    store = make_store()
    store.put("d/p", b"old")
    store.put("d/p", b"new!")
    assert read_all(store, "d/p") == b"new!" and store.info("d/p").size == 4
    assert store.delete("d/p") is True
    assert store.delete("d/p") is False
    with pytest.raises(PageNotFound):
        store.open("d/p")
    assert store.statistics().misses == 1
    assert store.statistics().tier("memory").used_bytes == 0


def test_directories_list_dir_and_delete_tree(make_store):
    store = make_store()
    names = ["m/f/tp0/kv/a", "m/f/tp0/kv/b", "m/f/tp1/kv/a", "m/g/tp0/kv/a", "mm/f/tp0/kv/a"]
    for name in names:
        store.put(name, name.encode())
    odd = "m/f/tp0/kv/" + "AB" * 32  # 64 upper-case hex chars: not the canonical form
    store.put(odd, b"x")
    assert sorted(store.directories()) == ["m/f/tp0/kv", "m/f/tp1/kv", "m/g/tp0/kv", "mm/f/tp0/kv"]
    assert sorted(i.name for i in list_all(store, "m/f/tp0/kv")) == sorted(["m/f/tp0/kv/a", "m/f/tp0/kv/b", odd])
    assert store.list_dir("m/f") == []
    assert delete_tree(store, "m/f") == 4
    assert sorted(store.directories()) == ["m/g/tp0/kv", "mm/f/tp0/kv"]  # "mm" is not under "m"
    assert read_all(store, "mm/f/tp0/kv/a") == b"mm/f/tp0/kv/a"


def test_info_counts_no_hit_and_open_counts_one(make_store):
    store = make_store()
    store.put("d/p", b"x")
    store.info("d/p")
    before = store.info("d/p")
    assert before.hits == 0
    read_all(store, "d/p")
    after = store.info("d/p")
    assert after.hits == 1 and after.atime_ns >= before.atime_ns
    assert store.statistics().tier("memory").hits == 1


def test_exists_many_is_right(make_store):
    """(Its speed is shown by scripts/bench.py's batch_exists case, not asserted here.)"""
    store = make_store(memory=64 * MiB)
    for i in range(10_000):
        store.put(page_name(i), b"")
    asked = [page_name(i) for i in range(5_000, 15_000)]
    assert store.exists_many(asked) == [i < 10_000 for i in range(5_000, 15_000)]
    assert store.exists_many(["nowhere/x", "x"]) == [False, False]


def test_too_large_and_no_room_fail_cleanly(make_store):
    store = make_store(memory=1 * MiB, max_page_size=4 * MiB)
    with pytest.raises(PageTooLarge):
        store.reserve(4 * MiB + 1)
    with pytest.raises(StoreFull):
        store.put("d/big", bytes(2 * MiB))  # allowed size, but larger than the whole RAM tier
    readers = []
    for i in range(16):
        store.put(f"d/{i}", content(i, 64 * KiB))
        readers.append(store.open(f"d/{i}"))
    with pytest.raises(StoreFull):
        store.put("d/more", bytes(64 * KiB))  # every slot is pinned by a reader
    assert [bytes(r.read(0, 64 * KiB)) for r in readers] == [content(i, 64 * KiB) for i in range(16)]
    for reader in readers:
        reader.close()
    store.put("d/more", bytes(64 * KiB))  # usable again
    assert read_all(store, "d/more") == bytes(64 * KiB)


def test_index_survives_growth_deletes_and_reuse(make_store):
    store = make_store(memory=64 * MiB)
    for i in range(5000):
        store.put(page_name(i), b"")
    for i in range(0, 5000, 2):
        store.delete(page_name(i))
    for i in range(5000, 8000):
        store.put(page_name(i, "other/dir"), b"x")
    expected = [i % 2 == 1 for i in range(5000)]
    assert store.exists_many(page_name(i) for i in range(5000)) == expected
    assert [store.info(page_name(i)) is not None for i in range(5000)] == expected
    assert len(list_all(store, "other/dir")) == 3000
    assert store.statistics().pages == 2500 + 3000


def test_reused_slot_never_shows_an_earlier_pages_bytes(make_store):
    store = make_store()
    store.put("d/old", b"\xab" * MiB)
    store.delete("d/old")  # its slot is free for the next page of the same size
    in_order = store.reserve(MiB)
    in_order.write(0, b"x" * 100)
    store.publish(in_order, "d/in-order")
    scattered = store.reserve(MiB)
    scattered.write(0, b"y" * 10)
    scattered.write(500_000, b"z" * 10)
    store.publish(scattered, "d/scattered")
    assert read_all(store, "d/in-order") == b"x" * 100 + bytes(MiB - 100)
    expected = bytearray(MiB)
    expected[:10] = b"y" * 10
    expected[500_000:500_010] = b"z" * 10
    assert read_all(store, "d/scattered") == bytes(expected)


def _draft_of(store, data: bytes):
    draft = store.reserve(len(data))
    draft.write(0, data)
    return draft


def test_keep_existing_keeps_a_page_of_the_size_being_written(make_store):
    store = make_store()
    store.put("d/p", b"old!")
    assert store.publish_page(_draft_of(store, b"new!"), "d/p", keep_existing=True) is False
    assert read_all(store, "d/p") == b"old!"
    assert store.statistics().tier("memory").used_bytes == 64  # the draft's slot came back


def test_keep_existing_replaces_a_page_of_another_size(make_store):
    """A page of another size (a cut-off copy, another writer's layout) is no page the writer
    could ever read: kept, it would block its name for good."""
    store = make_store()
    store.put("d/p", b"cut")
    assert store.publish_page(_draft_of(store, b"whole!"), "d/p", keep_existing=True) is True
    assert read_all(store, "d/p") == b"whole!" and store.info("d/p").size == 6


def test_holds_of_a_size_counts_only_a_page_of_that_size(make_store):
    store = make_store()
    store.put("d/p", b"cut")
    assert store.holds("d/p") and store.holds("d/p", 3) and not store.holds("d/p", 6)
    assert not store.holds("d/q", 3)


@pytest.mark.parametrize("many", [1, 40])  # a few names are looked up one by one, more at once
def test_exists_many_with_sizes_counts_only_pages_of_those_sizes(make_store, many):
    store = make_store()
    names = [f"m/f/s/kv/{i:04d}" for i in range(many)]
    for name in names:
        store.put(name, b"cut")
    assert store.exists_many(names) == [True] * many
    assert store.exists_many(names, 3) == [True] * many
    assert store.exists_many(names, 6) == [False] * many
    assert store.exists_many(names + ["m/f/s/kv/none"], 3) == [True] * many + [False]
