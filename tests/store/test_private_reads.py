"""Pages read into a reader's own memory (a disk page's first read, or no RAM slot to spare)
are bounded by the ``private_reads`` share, those of users who may not change the store by
``private_reads_of_others`` inside it: a read past it is refused at once, saying when to try
again (its caller waits on its event loop: tests/fs/test_private_read_waits.py)."""

import pytest
from store_helpers import KiB, MiB, page_name

from hicachefs.store import PrivateReadsFull
from hicachefs.store.budget import Share
from hicachefs.store.private_reads import PrivateReads
from hicachefs_testing.workload import content


def shares(store) -> dict:
    return store.statistics().ram_budget.shares


def on_disk(store, count: int) -> list[int]:
    """Put 48 pages of 256 KiB in the store; ``count`` of those the disk tier holds."""
    for i in range(48):
        store.put(page_name(i), content(i, 256 * KiB))
    found = [i for i in range(48) if store.info(page_name(i)).tier == "disk"][:count]
    assert len(found) == count
    return found


def test_disk_reads_past_the_share_are_refused_until_a_reader_lets_go(make_store):
    store = make_store(memory=8 * MiB, disk=64 * MiB, max_page_size=256 * KiB)  # private_reads: 1 MiB
    assert shares(store)["private_reads"].limit_bytes == 1 * MiB
    pages = on_disk(store, 5)
    readers = [store.open(page_name(i)) for i in pages[:4]]  # first reads: private copies
    assert shares(store)["private_reads"].held_bytes == 1 * MiB
    with pytest.raises(PrivateReadsFull) as full:
        store.open(page_name(pages[4]))
    assert not full.value.room()
    readers[0].close()
    assert full.value.room()
    with store.open(page_name(pages[4])) as fifth:
        assert bytes(fifth.view()) == content(pages[4], 256 * KiB)
    for i, reader in zip(pages[1:4], readers[1:]):
        assert bytes(reader.view()) == content(i, 256 * KiB)
        reader.close()
    assert shares(store)["private_reads"].held_bytes == 0


def test_users_who_may_not_change_the_store_never_take_the_room_its_own_readers_need(make_store):
    """A plain user reading disk pages (first reads) held the whole share, and every first read
    of root's waited, then failed (found by review)."""
    store = make_store(memory=8 * MiB, disk=64 * MiB, max_page_size=256 * KiB)  # of others: 512 KiB
    assert shares(store)["private_reads_of_others"].limit_bytes == 512 * KiB
    pages = on_disk(store, 5)
    theirs = [store.open(page_name(i), bounded=True) for i in pages[:2]]
    with pytest.raises(PrivateReadsFull):
        store.open(page_name(pages[2]), bounded=True)
    ours = [store.open(page_name(i)) for i in pages[2:4]]  # root's: the rest of the share
    assert shares(store)["private_reads"].held_bytes == 1 * MiB
    for reader in theirs + ours:
        reader.close()
    assert shares(store)["private_reads"].held_bytes == shares(store)["private_reads_of_others"].held_bytes == 0


def test_one_copy_is_allowed_whatever_its_size_when_none_is_held():
    every, others = Share("private_reads", 1 * MiB), Share("private_reads_of_others", 512 * KiB)
    reads = PrivateReads(every, others)
    held, release = reads.buffer(1 * MiB)
    with pytest.raises(PrivateReadsFull):
        reads.buffer(4 * KiB)
    release()
    big, release_big = reads.buffer(3 * MiB, bounded=True)
    assert len(big) == 3 * MiB and every.held == others.held == 3 * MiB
    assert not reads.has_room(4 * KiB, bounded=True) and not reads.has_room(4 * KiB)
    release_big()
    assert every.held == others.held == 0


def test_a_read_refused_for_room_counts_no_miss_until_it_is_made(make_store):
    """A read refused for room is made again once there is (``posix.blocking``): it counted the
    RAM tier's miss, and the page's access, at every try (found by review)."""
    store = make_store(memory=8 * MiB, disk=64 * MiB, max_page_size=256 * KiB)
    pages = on_disk(store, 5)
    readers = [store.open(page_name(i)) for i in pages[:4]]
    misses = store.statistics().tier("memory").misses
    for _ in range(3):
        with pytest.raises(PrivateReadsFull):
            store.open(page_name(pages[4]))
    assert store.statistics().tier("memory").misses == misses
    readers[0].close()
    store.open(page_name(pages[4])).close()
    assert store.statistics().tier("memory").misses == misses + 1
    for reader in readers[1:]:
        reader.close()
