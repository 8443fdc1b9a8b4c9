"""The presence index: what a host knows is on the shared tier, answered from memory."""

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
