"""The page store with a shared tier, two hosts on one local directory: what the exists query
finds there is fetched ahead into RAM, and a page removed meanwhile stays removed."""

import errno
import logging

import pytest
from held_calls import HOLD_TIMEOUT_S, HeldCall
from pages import wait_until
from shared_helpers import KiB, page_name, read_stored

from hicachefs.store import NeedsIO, PageNotFound, PageStore, StoreConfig
from hicachefs.store.shared.device import DirectoryDevice
from hicachefs_testing.workload import content

MiB = 1024 * KiB


@pytest.fixture
def hosts(tmp_path):
    """hosts(b_device=None) -> (store A, store B) sharing tmp_path/'shared'; closed after."""
    stores = []

    def make(b_device=None):
        config = StoreConfig(memory_bytes=16 * MiB, max_page_size=1 * MiB, shared_dir=tmp_path / "shared")
        stores.extend([PageStore(config), PageStore(config, shared_device=b_device)])
        return stores[-2], stores[-1]

    yield make
    for store in stores:
        store.close()


def shared_on_b(a, b, names):
    """Publish on A and wait until B's exists query finds the pages (on the shared tier)."""
    for i, name in enumerate(names):
        a.put(name, content(i, 64 * KiB))
    wait_until(lambda: all(b.exists_many(names)))


def test_pages_the_exists_query_finds_there_are_in_ram_before_their_read(hosts):
    a, b = hosts()
    names = [page_name(i) for i in range(8)]
    shared_on_b(a, b, names)
    wait_until(lambda: b.statistics().fetch_ahead.fetched_ahead == len(names))
    assert all(b.info(name).tier == "memory" for name in names)
    assert [read_stored(b, name) for name in names] == [content(i, 64 * KiB) for i in range(len(names))]
    assert b.statistics().tier("shared").hits == len(names)  # each crossed once


def test_pages_the_exists_query_finds_there_at_their_size_count_once_this_host_holds_pages(hosts):
    """A query of more than a few names, with the size the reader wants (the client's ``.size``
    line), looked them up together: the index's sizes came back unsigned, so a page held nowhere
    here read as held (-1 as 4294967295, of no size asked), and no page only the shared tier holds
    counted (nor was fetched ahead) once B held one of its own: the demo's host B loaded none."""
    a, b = hosts()
    b.put(page_name(1000), content(1000, 4 * KiB))  # B's index is not empty
    names = [page_name(i) for i in range(40)]  # past 16 names the store looks them up together
    for i, name in enumerate(names):  # 160 KiB: within A's write-behind share (2 MiB) however slow its writes
        a.put(name, content(i, 4 * KiB))
    wait_until(lambda: all(isinstance(b.lookup(name), NeedsIO) for name in names))  # only there
    assert b.exists_many(names + [page_name(2000)], 4 * KiB) == [True] * len(names) + [False]
    wait_until(lambda: b.statistics().fetch_ahead.fetched_ahead == len(names))


def test_a_page_removed_while_it_is_fetched_does_not_come_back(hosts):
    device = DirectoryDevice()
    a, b = hosts(device)
    name = page_name(1)
    a.put(name, content(1, 64 * KiB))
    wait_until(lambda: isinstance(b.lookup(name), NeedsIO))  # the shared tier says it has it
    fetch_read = HeldCall(device, "preadv")  # the fetch's read waits in the shared tier until released
    assert b.exists_many([name]) == [True]  # starts the fetch
    assert fetch_read.entered.wait(HOLD_TIMEOUT_S)
    assert b.statistics().fetch_ahead.fetches_in_flight == 1
    assert b.delete(name)  # from every tier, the fetch in flight included
    fetch_read.release()
    wait_until(lambda: b.statistics().fetch_ahead.fetches_in_flight == 0)
    assert not fetch_read.timed_out
    assert b.info(name) is None and b.exists_many([name]) == [False]
    with pytest.raises(PageNotFound):
        b.open(name)
    assert b.statistics().fetch_ahead.fetched_ahead == 0


def test_a_name_asked_for_twice_in_one_query_is_fetched_once(hosts):
    """The exists query may name a page twice: it is read from the shared tier once (it was
    fetched twice at once, each fetch reading the whole page)."""
    device = DirectoryDevice()
    a, b = hosts(device)
    name = page_name(1)
    a.put(name, content(1, 64 * KiB))
    wait_until(lambda: isinstance(b.lookup(name), NeedsIO))  # the shared tier says it has it
    reads = []
    read = device.preadv
    device.preadv = lambda *args: reads.append(args) or read(*args)
    assert b.exists_many([name, name]) == [True, True]
    wait_until(lambda: b.statistics().fetch_ahead.fetched_ahead == 1)
    b.close()  # lets a second fetch under way end
    assert len(reads) == 1


def described(store, name):
    """The page's facts as a lookup (and a stat) gets them."""
    found = store.lookup(name)
    return found.work() if isinstance(found, NeedsIO) else found


def test_a_page_another_host_replaced_is_described_as_its_new_version(hosts):
    """B found A's page on the shared tier, then A replaced it: B's stat and xattrs describe the
    new version (they described the old one, its size and checksum, until B read the page)."""
    a, b = hosts()
    name = page_name(1)
    a.put(name, content(1, 64 * KiB))
    wait_until(lambda: isinstance(b.lookup(name), NeedsIO))
    assert described(b, name).size == 64 * KiB
    new = a.put(name, content(2, 32 * KiB))
    wait_until(lambda: written_behind(a))
    wait_until(lambda: described(b, name).version == new.version)
    assert described(b, name).size == 32 * KiB and read_stored(b, name) == content(2, 32 * KiB)


def written_behind(store) -> bool:
    behind = store.statistics().tier("shared").write_behind
    return behind.queue_pages == 0 and behind.writing == 0


def test_a_page_staged_past_ram_is_written_behind_too(tmp_path):
    """A page published while readers hold every RAM slot is staged in private memory and goes
    to the disk tier; it must reach the shared tier as a page published in RAM does, or other
    hosts miss it for good."""
    shared = tmp_path / "shared"
    a = PageStore(StoreConfig(memory_bytes=8 * MiB, disk_bytes=64 * MiB, disk_dir=tmp_path / "disk",
                              max_page_size=1 * MiB, shared_dir=shared))
    b = PageStore(StoreConfig(memory_bytes=16 * MiB, max_page_size=1 * MiB, shared_dir=shared))
    readers = []
    try:
        held = [page_name(100 + i) for i in range(32)]
        for i, name in enumerate(held):  # 8 MiB of RAM in 1 MiB slabs of 256 KiB slots
            a.put(name, content(100 + i, 256 * KiB))
        readers = [a.open(name) for name in held]
        wait_until(lambda: written_behind(a))  # the queue has room again
        name, data = page_name(1), content(1, 256 * KiB)
        a.put(name, data)
        assert a.info(name).tier == "disk"
        wait_until(lambda: b.exists_many([name]) == [True])
        assert read_stored(b, name) == data
    finally:
        for reader in readers:
            reader.close()
        a.close()
        b.close()


def test_a_page_read_from_the_shared_tier_is_a_hit_of_the_store(hosts):
    """The store's totals are sums over its tiers (``StoreStatistics``; the metrics leave them to
    ``sum by``): its ``hits`` left the shared tier's out, so a host serving from there showed no
    hits and ``top`` no hit rate."""
    a, b = hosts()
    name = page_name(1)
    a.put(name, content(1, 64 * KiB))
    wait_until(lambda: isinstance(b.lookup(name), NeedsIO))  # no exists query: no fetch ahead
    assert read_stored(b, name) == content(1, 64 * KiB)
    facts = b.statistics()
    assert facts.tier("shared").hits == 1 and facts.tier("memory").hits == 0
    assert facts.hits == 1 and facts.bytes_out == 64 * KiB
    assert facts.hits == sum(tier.hits for tier in facts.tiers)


def test_a_page_dropped_from_ram_that_the_shared_tier_holds_is_not_an_eviction(tmp_path):
    """Evictions are pages dropped from the store, lost; a page that leaves RAM while the shared
    tier holds it is still served (from there): it moved down, as one the disk tier holds does."""
    store = PageStore(StoreConfig(memory_bytes=1 * MiB, max_page_size=64 * KiB, shared_dir=tmp_path / "shared"))
    try:
        names = [page_name(i) for i in range(20)]
        for i, name in enumerate(names[:16]):  # RAM exactly full; each written behind (a queue of 128 KiB)
            store.put(name, content(i, 64 * KiB))
            wait_until(lambda: written_behind(store))
        assert store.statistics().tier("shared").pages == 16
        for i, name in enumerate(names[16:], 16):  # four leave RAM, held by the shared tier
            store.put(name, content(i, 64 * KiB))
        memory = store.statistics().tier("memory")
        assert (memory.evictions, memory.demotions) == (0, 4)
        assert store.statistics().evictions == store.statistics().tier("shared").evictions == 0
        assert read_stored(store, names[0]) == content(0, 64 * KiB)
    finally:
        store.close()


def test_a_page_the_disk_ring_reclaims_that_the_shared_tier_holds_is_not_an_eviction(tmp_path):
    """The same for the disk tier's ring, reclaiming its oldest region: the pages there that the
    shared tier holds leave this host's tiers, not the store."""
    store = PageStore(StoreConfig(memory_bytes=2 * MiB, disk_dir=tmp_path / "disk", disk_bytes=8 * MiB,
                                  write_through=True, max_page_size=256 * KiB, shared_dir=tmp_path / "shared"))
    try:
        for i in range(48):  # 12 MiB through an 8 MiB ring; each written behind first
            store.put(page_name(i), content(i, 256 * KiB))
            wait_until(lambda: written_behind(store))
        facts = store.statistics()
        assert facts.tier("shared").pages == 48 and facts.pages < 48  # the ring reclaimed some
        assert facts.tier("disk").evictions == facts.tier("memory").evictions == 0
        assert read_stored(store, page_name(0)) == content(0, 256 * KiB)
    finally:
        store.close()


def test_a_read_from_the_shared_tier_the_index_has_no_memory_for_is_served_and_gives_its_slot_back(hosts, monkeypatch):
    """A page only the shared tier holds is read into a RAM slot and indexed there (promoted).
    Where the index had no memory to grow (ENOMEM), the read failed and its slot stayed taken
    and pinned for good (found by review). It is served from that slot, not promoted, and the
    slot comes back at its close."""
    a, b = hosts()
    name = page_name(99999)
    a.put(name, content(7, 4 * KiB))
    wait_until(lambda: isinstance(b.lookup(name), NeedsIO))
    for i in range(len(b._index.size) - b._index.pages):  # B's index full
        b.put(page_name(i), b"x" * 64)
    used = b.statistics().tier("memory").used_bytes

    def no_memory(*_):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    with monkeypatch.context() as patched:
        patched.setattr("hicachefs.store.index.IndexMemory", no_memory)
        for _ in range(3):
            assert read_stored(b, name) == content(7, 4 * KiB)
    assert b.statistics().tier("memory").used_bytes == used
    assert read_stored(b, name) == content(7, 4 * KiB)  # memory back: promoted


def test_a_close_with_a_shared_tier_and_no_disk_says_the_shared_tier_keeps_its_pages(tmp_path, caplog):
    """The stop's line said the RAM pages were dropped, "no lower tier keeps them", where a
    shared tier held every one of them after the restart (found by review)."""
    config = StoreConfig(memory_bytes=16 * MiB, max_page_size=1 * MiB, shared_dir=tmp_path / "shared")
    store = PageStore(config)
    names = [page_name(i) for i in range(5)]
    for i, name in enumerate(names):
        store.put(name, content(i, 64 * KiB))
    with caplog.at_level(logging.INFO, logger="hicachefs.store"):
        store.close()
    assert "the 5 pages in RAM are dropped (no --disk); the shared tier keeps what it holds" in caplog.text
    again = PageStore(config)
    try:
        wait_until(lambda: all(again.exists_many(names)))
    finally:
        again.close()
