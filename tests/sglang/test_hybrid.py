"""Hybrid models through SGLang's ``batch_*_v2`` calls: beside the KV of their full attention
layers, Mamba2 layers (Qwen3-Next's kind) keep a recurrent state, which SGLang stores in pool
``mamba`` under the key of the last page of the prefix it ends; sliding-window layers
(gpt-oss's kind) keep their last 16 tokens' KV, which SGLang stores in pool ``swa`` for the
last window of each node. SGLang asks for both pools at once (``batch_exists_v2``: the KV pool
plus the second pool with hit policy ``TRAILING_PAGES``, so a prefix is restorable only where
the second pool holds its last page, or its last window's pages) and moves the second pool's
pages with ``batch_get_v2`` / ``batch_set_v2``. Over HiCacheFS it decides as over HiCacheFile,
and every page of both pools is exact in storage, in the host pools and on the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicachefs_testing.sglang_cache import Backend, CacheSetup, page_keys
from hicachefs_testing.sglang_store import remove_pages
from sglang_runs import HYBRID_POOLS, HYBRID_WORKLOAD as WORKLOAD, MAMBA_HYBRID, SWA_HYBRID
from sglang_runs import assert_clean, assert_same_decisions, storage_hits

SETUPS = {"mamba": CacheSetup(MAMBA_HYBRID, **HYBRID_POOLS), "swa": CacheSetup(SWA_HYBRID, **HYBRID_POOLS)}


@pytest.mark.parametrize("pool", list(SETUPS))
def test_the_second_pool_goes_through_the_v2_calls_and_comes_back_exact(side_by_side, pool):
    runs = side_by_side(SETUPS[pool], WORKLOAD)
    for run in runs.values():
        assert_clean(run)
    assert_same_decisions(runs["hicachefs"], runs["file"])
    ours = runs["hicachefs"]
    stats = ours.recorder.stats
    assert {"batch_exists_v2", "batch_get_v2", "batch_set_v2"} <= set(stats)
    assert stats["batch_set_v2"].hits > 0 and stats["batch_get_v2"].hits > 0
    assert {page.pool for page in ours.stored_pages().values()} == {"kv", pool}
    assert storage_hits(ours, "cold") == 0
    # Device and host were emptied: a warm turn's prefix is usable only with its second pool's
    # pages, and SGLang read those back from storage with the KV, up to where the turn before ended.
    warm = ours.phases.requests["warm"]
    assert all(r.device_hit == 0 and r.storage_hit > 0 for r in warm)
    assert {r.host_hit for r in warm} == {len(tokens) for tokens in WORKLOAD.tokens_after(2)}
    assert storage_hits(ours, "burst") > 0
    assert ours.phases.prefetch_outcomes["burst"].get("declined_rate_limited", 0) > 0


def last_state_of_turn_2(setup: CacheSetup):
    """Per conversation, the Mamba state its second turn ended in; without it, the longest
    prefix with a state is the first turn (whose end has one)."""
    return ([page_keys(tokens, setup.page_size)[-1] for tokens in WORKLOAD.tokens_after(2)],
            {len(tokens) for tokens in WORKLOAD.tokens_after(1)})


def window_page_of_turn_2(setup: CacheSetup):
    """Per conversation, a page inside the last window of its second turn; without it, the
    longest prefix whose last window is whole ends just before that page (the second turn's
    other window pages, stored for its nodes, cover the window before it)."""
    back = setup.model.swa.window // 2
    return ([page_keys(tokens, setup.page_size)[-back] for tokens in WORKLOAD.tokens_after(2)],
            {len(tokens) - back for tokens in WORKLOAD.tokens_after(2)})


@pytest.mark.parametrize("pool, lost_pages", [("mamba", last_state_of_turn_2), ("swa", window_page_of_turn_2)])
def test_a_prefix_missing_a_trailing_page_is_restored_up_to_the_last_whole_trailing_pages(
        side_by_side, pool, lost_pages):
    """``TRAILING_PAGES``: each conversation's second turn stored its last state (Mamba) or the
    window pages of its nodes (SWA) in the second pool. With one of those pages removed from
    storage before the warm turns (``rm`` on the mount evicts it), every warm turn's KV is
    still there to the second turn's end, but SGLang restores the prefix only as far as the
    second pool holds the prefix's trailing pages (its last one; its last window's); over
    HiCacheFS exactly as over HiCacheFile."""
    setup = SETUPS[pool]
    keys, restored = lost_pages(setup)
    removed = {}

    def remove_them(phase: str, backend: Backend) -> None:
        if phase == "warm":
            removed[backend.kind] = remove_pages(Path(backend.path), pool, keys)

    runs = side_by_side(setup, WORKLOAD, remove_them)
    assert removed == {"hicachefs": len(keys), "file": len(keys)}
    for run in runs.values():
        assert_clean(run)
    assert_same_decisions(runs["hicachefs"], runs["file"])
    second_turn_end = {len(tokens) for tokens in WORKLOAD.tokens_after(2)}
    assert len(restored) == 1 and max(restored) < min(second_turn_end)
    warm = runs["hicachefs"].phases.requests["warm"]
    assert {r.device_hit + r.host_hit for r in warm} == restored
    assert all(r.storage_hit > 0 for r in warm)
