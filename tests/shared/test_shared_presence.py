"""The presence index: what a host knows is on the shared tier, answered from memory."""

import random

import numpy as np
from shared_helpers import page_name

from hicachefs.store.shared.layout import place
from hicachefs.store.shared.presence import PresenceIndex


def add(index, name, size=100, present=True):
    where = place(name)
    index.update(where.directory, where.key_hash, size, present)


def test_adds_and_removals_answer_and_count():
    index = PresenceIndex()
    names = [page_name(i) for i in range(5000)]  # past the fold threshold in some directories
    for name in names:
        add(index, name)
    for name in names[::2]:
        add(index, name, present=False)
    assert index.contains_many(names) == [i % 2 == 1 for i in range(5000)]
    assert index.totals() == (2500, 2500 * 100)
    assert index.contains_many([page_name(-1)]) == [False]


def test_a_listing_replaces_what_was_known_but_keeps_updates_made_during_it():
    index = PresenceIndex()
    names = [page_name(i) for i in range(20000)]
    directory = place(names[0]).directory
    in_dir = [n for n in names if place(n).directory == directory]
    old, listed, added_during, removed_during = in_dir[:10], in_dir[10:20], in_dir[20], in_dir[11]
    for name in old:
        add(index, name)
    index.begin_listing(directory)
    add(index, added_during)  # published while the listing ran: the listing missed it
    add(index, removed_during, present=False)  # removed while the listing ran: the listing saw it
    index.end_listing(directory, np.array([place(n).key_hash for n in listed], dtype=np.uint64), np.full(10, 100))
    expected = {n: n in listed or n == added_during for n in in_dir[:21]}
    expected[removed_during] = False
    assert index.contains_many(list(expected)) == list(expected.values())
    assert index.totals()[0] == 10  # 10 listed - 1 removed + 1 added


def test_an_empty_listing_forgets_the_directory():
    index = PresenceIndex()
    name = page_name(1)
    add(index, name)
    index.begin_listing(place(name).directory)
    index.end_listing(place(name).directory, np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64))
    assert index.contains_many([name]) == [False] and index.directories() == []



def test_what_lies_under_a_path_follows_adds_removals_listings_and_forgets():
    """``holds_under`` (asked at every lookup of a name this host does not know above the pool
    level) answers from counts kept as directories gain and lose pages: it must say what a
    scan of the directories holding pages says, whatever the order of events."""
    rng = random.Random(5)
    index = PresenceIndex()
    pools = [f"m{a}/f{b}/tp0of1/kv{c}" for a in range(2) for b in range(2) for c in range(3)]
    names = [page_name(i, rng.choice(pools)) for i in range(40)]  # a few a pool: it empties often
    paths = {"/".join(pool.split("/")[:depth]) for pool in pools for depth in range(1, 5)} | {"m7", "m0/f0/tp0of1/kv7"}
    listing: set[str] = set()
    for step in range(4000):
        name = rng.choice(names)
        directory = place(name).directory
        action = rng.random()
        if action < 0.55:
            add(index, name, present=True)
        elif action < 0.9:
            add(index, name, present=False)
        elif action < 0.95:
            if directory not in listing:
                index.begin_listing(directory)
                listing.add(directory)
        elif action < 0.99 and listing:
            done = rng.choice(sorted(listing))
            listing.discard(done)
            kept = [n for n in names if place(n).directory == done and rng.random() < 0.5]
            index.end_listing(done, np.array([place(n).key_hash for n in kept], dtype=np.uint64),
                              np.full(len(kept), 100))
        else:
            index.forget(directory)
            listing.discard(directory)
        if step % 10 == 0:
            holding = [d for d, entry in index._directories.items() if entry.pages > 0]  # the scan it saves
            for path in paths:
                assert index.holds_under(path) == any(d.startswith(path + "/") for d in holding), (step, path)
    index.clear()
    assert not any(index.holds_under(path) for path in paths)
