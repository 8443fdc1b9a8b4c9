"""The store's page and byte counts: kept up to date as pages come and go, so that asking for
them (``.hicachefs/stats``, ``metrics``, ``statfs``, which any user may do) costs the tiers, not
the pages stored; and always what a full recount of the index gives."""

from __future__ import annotations

import random

import numpy as np
import pytest
from store_helpers import KiB, MiB, page_name, read_all

from hicachefs.store import PageNotFound
from hicachefs.store.index import PageIndex
from hicachefs_testing.workload import content


def _recounted(store) -> tuple[int, int, list[int]]:
    """(pages, used bytes, pages per local tier) from every row of the index."""
    index = store._index
    live = np.nonzero(index.dir[: index._rows] >= 0)[0]
    per_tier = [int(np.count_nonzero(index.loc[live, t] >= 0)) for t in range(index.loc.shape[1])]
    return len(live), int(index.size[live].sum()), per_tier


def _counted(store) -> tuple[int, int, list[int]]:
    facts = store.statistics()
    local = [t for t in facts.tiers if t.name in ("memory", "disk")]
    return facts.pages, facts.page_bytes, [t.pages for t in local]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("write_through", [False, True])
def test_counts_match_a_full_recount_after_a_random_mix(make_store, seed, write_through):
    """Publishes, replaces, removals, renames, reads (promotions), RAM evictions and demotions,
    and the disk ring reclaiming its oldest region (evictions), in a seeded order."""
    rng = random.Random(seed)
    store = make_store(memory=2 * MiB, disk=8 * MiB, max_page_size=256 * KiB, write_through=write_through)
    names = [page_name(i) for i in range(120)]
    for step in range(600):
        name = rng.choice(names)
        action = rng.random()
        if action < 0.55:
            store.put(name, content(step, rng.choice([4 * KiB, 60 * KiB, 200 * KiB])))
        elif action < 0.7:
            store.delete(name)
        elif action < 0.8:
            try:
                store.move(name, rng.choice(names))
            except PageNotFound:
                pass
        else:
            try:
                read_all(store, name)
            except PageNotFound:
                pass
        if step % 25 == 0:
            assert _counted(store) == _recounted(store), step
    facts = store.statistics()
    assert facts.tier("memory").evictions + facts.tier("disk").evictions > 0  # the mix evicted
    assert facts.tier("memory").demotions > 0 or write_through
    assert _counted(store) == _recounted(store)


def test_counts_survive_a_warm_restart(tmp_path, make_store):
    """A restart loads the disk tier's pages in bulk (its snapshot): counted as they load."""
    store = make_store(memory=2 * MiB, disk=16 * MiB, max_page_size=256 * KiB)
    for i in range(40):
        store.put(page_name(i), content(i, 100 * KiB))
    store.close()
    store = make_store(memory=2 * MiB, disk=16 * MiB, max_page_size=256 * KiB)
    assert _counted(store) == _recounted(store) == (40, 40 * 100 * KiB, [0, 40])
    store.put(page_name(0), content(100, 100 * KiB))  # a loaded page replaced
    store.put(page_name(40), content(40, 8 * KiB))
    assert _counted(store) == _recounted(store) == (41, 40 * 100 * KiB + 8 * KiB, [2, 39])


def _visit(*args):
    raise AssertionError("statistics read the index's rows")


class _Untouchable:
    """A column that fails when read: a statistic that reads it looks at every page."""

    __getitem__ = _visit


def test_statistics_do_not_visit_the_pages(make_store, monkeypatch):
    """The statistics cost the tiers, not the pages: with pages stored, asking for them reads no
    column of the index (any user may ask, on the daemon's one thread: at 200,000 pages a full
    count took milliseconds each time)."""
    store = make_store(memory=16 * MiB, disk=16 * MiB, max_page_size=64 * KiB)
    for i in range(500):
        store.put(page_name(i), content(i, 4 * KiB))
    expected = _recounted(store)
    index = store._index
    monkeypatch.setattr(PageIndex, "live_rows", _visit, raising=False)  # the old full count
    for column in ("loc", "size", "dir"):
        monkeypatch.setattr(index, column, _Untouchable())
    counted = _counted(store)
    monkeypatch.undo()
    assert counted == expected
