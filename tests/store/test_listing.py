"""A directory's pages listed a batch at a time from a cursor (``PageStore.list_dir``): every page
that stays while the listing runs comes exactly once, whatever is published, replaced, evicted or
removed between batches; a batch's work does not grow with the directory."""

from __future__ import annotations

import random
import time

from hicachefs.store import PageStore, StoreConfig
from hicachefs_testing.store_tools import list_all

from store_helpers import KiB, MiB, page_name, reopen

POOL = "m/bf16-page_first-64/tp0of1/kv"


def names_in(batch) -> list[str]:
    return [info.name for _, info in batch]


def test_a_listing_in_batches_sees_every_page_that_stays_once(make_store):
    store = make_store(memory=64 * MiB)
    rng = random.Random(7)
    present = {page_name(i) for i in range(3000)}
    for name in sorted(present):
        store.put(name, b"v1")
    throughout = set(present)
    seen: list[str] = []
    after, fresh, batches = 0, 3000, 0
    while batch := store.list_dir(POOL, after, limit=50):
        seen += names_in(batch)
        after = batch[-1][0]
        batches += 1
        # Between the first 50 batches (changes go on, and a listing that has caught up with
        # them would follow them for ever): replace, remove, publish new.
        for _ in range(20 if batches <= 50 else 0):
            roll = rng.random()
            name = rng.choice(sorted(present)) if present else None
            if roll < 0.4 and name:
                store.put(name, b"v2")  # a replace keeps the page's place
            elif roll < 0.7 and name:
                store.delete(name)
                present.discard(name)
                throughout.discard(name)
            else:
                name = page_name(fresh)
                fresh += 1
                store.put(name, b"new")
                present.add(name)
    assert len(seen) == len(set(seen)), "a page was listed twice"
    assert throughout <= set(seen), f"{len(throughout - set(seen))} pages that stayed were not listed"
    assert set(seen) <= {page_name(i) for i in range(fresh)}


def test_cursors_hold_across_replaces_removals_and_compaction(make_store):
    store = make_store(memory=64 * MiB)
    for i in range(1000):
        store.put(page_name(i), b"x")
    first = store.list_dir(POOL, 0, limit=10)
    cursor = first[-1][0]
    for i in range(10, 900):  # most of the directory goes: its listing is compacted
        store.delete(page_name(i))
    store.put(page_name(5), b"replaced")  # listed already; keeps its place before the cursor
    rest = names_in(store.list_dir(POOL, cursor, limit=1000))
    assert rest == [page_name(i) for i in range(900, 1000)]
    everything = [info.name for info in list_all(store, POOL)]
    assert everything == [page_name(i) for i in [*range(10), *range(900, 1000)]]
    assert store.list_dir(POOL, store.list_dir(POOL, cursor, limit=1000)[-1][0]) == []
    assert store.list_dir("no/such/dir", 0) == []


def test_pages_demoted_and_evicted_keep_or_leave_their_place(make_store):
    """Pages moving down to the disk tier stay where they were in the listing; those the store
    evicts simply leave it."""
    store = make_store(memory=1 * MiB, disk=4 * MiB, max_page_size=64 * KiB)
    pages = [page_name(i) for i in range(160)]  # 10 MiB through 5 MiB of tiers
    listed = []
    after = 0
    for name in pages[:40]:
        store.put(name, bytes(64 * KiB))
    while batch := store.list_dir(POOL, after, limit=8):
        listed += names_in(batch)
        after = batch[-1][0]
        for name in pages[40 + len(listed) // 2 : 40 + len(listed) // 2 + 4]:
            store.put(name, bytes(64 * KiB))
    assert len(listed) == len(set(listed))
    held = {info.name for info in list_all(store, POOL)}
    tiers = {info.tier for _, info in store.list_dir(POOL, 0, limit=1000)}
    assert tiers == {"memory", "disk"}
    assert held <= set(pages) and held, "evicted pages must leave the listing, held ones stay"
    assert [n for n in pages if n in held] == [info.name for info in list_all(store, POOL)], \
        "the listing follows publish order"


def test_a_restart_from_the_snapshot_lists_every_page(tmp_path):
    config = StoreConfig(memory_bytes=1 * MiB, disk_dir=tmp_path / "disk", disk_bytes=16 * MiB,
                         max_page_size=1 * MiB)
    store = PageStore(config)
    names = [page_name(i) for i in range(100)] + [page_name(i, "other/dir") for i in range(50)]
    for name in names:
        store.put(name, b"p")
    store.close()
    store, recovery = reopen(config)
    try:
        assert recovery.method == "snapshot"
        listed = [info.name for info in list_all(store, POOL)] + [info.name for info in list_all(store, "other/dir")]
        assert sorted(listed) == sorted(names)
        store.put(page_name(100), b"after the restart")
        assert list_all(store, POOL)[-1].name == page_name(100)
    finally:
        store.close()


def test_a_batch_costs_the_same_in_a_small_and_a_huge_directory(make_store):
    """A listing's batch must not cost what the directory holds (the issue: 40,000 pages in one
    pool made one opendir block the daemon for half a second)."""
    store = make_store(memory=256 * MiB)
    for i in range(100_000):
        store.put(page_name(i, "huge/dir"), b"")
    for i in range(100):
        store.put(page_name(i, "small/dir"), b"")

    def batch_time(directory: str) -> float:
        times = []
        for _ in range(20):
            started = time.perf_counter()
            store.list_dir(directory, 0, limit=64)
            times.append(time.perf_counter() - started)
        return sorted(times)[len(times) // 2]

    small, huge = batch_time("small/dir"), batch_time("huge/dir")
    assert huge < 4 * small + 0.0005, f"a batch took {huge * 1e6:.0f} us in a huge directory, {small * 1e6:.0f} us in a small one"


def _held_by_scan(store: PageStore, path: str) -> tuple[bool, set[str]]:
    """Whether pages lie at or below ``path``, and its subdirectories that hold some, from the
    directories the store lists (what ``has_directory`` scanned before it counted)."""
    prefix = f"{path}/" if path else ""
    under = [d for d in store.directories() if d == path or d.startswith(prefix)]
    return bool(under), {d[len(prefix):].split("/")[0] for d in under if d != path}


def test_the_directories_holding_pages_follow_publishes_removals_evictions_and_a_restart(make_store, tmp_path):
    """``has_directory`` (asked at every lookup of a name the tree does not know) and the
    subdirectories a listing adopts answer from counts kept as pages come and go: they must
    say what a scan of the store's directories says, whatever the order of events."""
    store = make_store(memory=4 * MiB, disk=16 * MiB, max_page_size=1 * MiB)
    rng = random.Random(11)
    pools = [f"m{a}/f{b}/tp0of1/kv{c}" for a in range(3) for b in range(2) for c in range(3)]
    held: dict[str, str] = {}  # name -> pool
    paths = {""} | {"/".join(pool.split("/")[:depth]) for pool in pools for depth in range(1, 5)}
    paths |= {"m9", "m0/f9", "m0/f0/tp0of1/kv9"}  # never used
    for step in range(3000):
        pool = rng.choice(pools)
        if rng.random() < 0.6 or not held:
            name = f"{pool}/{rng.randrange(40):064x}"
            store.put(name, bytes([step % 256]) * (64 * KiB))  # RAM holds 64: evicts to disk, then out
            held[name] = pool
        else:
            name = rng.choice(sorted(held))
            store.remove(name)
            del held[name]
        if step % 97 == 0:
            for path in paths:
                has, children = _held_by_scan(store, path)
                assert not path or store.has_directory(path) == has, (step, path)  # (the root is no question)
                assert set(store.held_subdirectories(path)) == children, (step, path)
    config = store.config
    store.close()
    again, _ = reopen(config)
    try:
        for path in paths:
            has, children = _held_by_scan(again, path)
            assert (not path or again.has_directory(path) == has) and set(again.held_subdirectories(path)) == children, path
    finally:
        again.close()
