"""A hybrid model through SGLang's ``batch_*_v2`` calls: Mamba2 layers beside full attention
(Qwen3-Next's kind), whose recurrent states SGLang stores in a second pool, ``mamba``, one state
under the key of the last page of the prefix it ends. SGLang asks for both pools at once
(``batch_exists_v2``, the KV pool plus the ``mamba`` pool with hit policy ``TRAILING_PAGES``:
a prefix is restorable only where its last page has a state) and moves the states with
``batch_get_v2`` / ``batch_set_v2``. Over HiCacheFS it decides as over HiCacheFile, and every
KV page and every state is exact in storage, in the host pools and on the device."""

from __future__ import annotations

from pathlib import Path

from hicachefs.testing.sglang_cache import Backend, page_keys
from hicachefs.testing.sglang_store import remove_pages
from sglang_runs import HYBRID_SETUP as SETUP, HYBRID_WORKLOAD as WORKLOAD
from sglang_runs import assert_clean, assert_same_decisions, storage_hits


def test_states_go_through_the_v2_calls_and_come_back_exact(side_by_side):
    runs = side_by_side(SETUP, WORKLOAD)
    for run in runs.values():
        assert_clean(run)
    assert_same_decisions(runs["hicachefs"], runs["file"])
    ours = runs["hicachefs"]
    stats = ours.recorder.stats
    assert {"batch_exists_v2", "batch_get_v2", "batch_set_v2"} <= set(stats) and "batch_exists" not in stats
    assert stats["batch_set_v2"].hits > 0 and stats["batch_get_v2"].hits > 0
    assert {page.pool for page in ours.stored_pages().values()} == {"kv", "mamba"}
    assert storage_hits(ours, "cold") == 0
    # Device and host were emptied: a warm turn's prefix is usable only with the state it ends
    # in, and SGLang read that state back from storage with its KV.
    assert all(r.device_hit == 0 and r.storage_hit > 0 for r in ours.phases.requests["warm"])
    assert storage_hits(ours, "burst") > 0
    assert ours.phases.prefetch_outcomes["burst"].get("declined_rate_limited", 0) > 0


def test_a_prefix_whose_last_state_is_gone_is_restored_up_to_the_state_before(side_by_side):
    """``TRAILING_PAGES``: each conversation's second turn stored a state at its end, the first
    turn one at its own. With the second ones removed from storage before the warm turns (``rm``
    on the mount evicts them), every warm turn's KV is still there past the first turn's end,
    but SGLang restores the prefix only up to the first turn's end, the longest one with a
    state; over HiCacheFS exactly as over HiCacheFile."""
    second_turn_states = [page_keys(tokens, SETUP.page_size)[-1] for tokens in WORKLOAD.tokens_after(2)]
    removed = {}

    def remove_second_turn_states(phase: str, backend: Backend) -> None:
        if phase == "warm":
            removed[backend.kind] = remove_pages(Path(backend.path), "mamba", second_turn_states)

    runs = side_by_side(SETUP, WORKLOAD, remove_second_turn_states)
    assert removed == {"hicachefs": len(second_turn_states), "file": len(second_turn_states)}
    for run in runs.values():
        assert_clean(run)
    assert_same_decisions(runs["hicachefs"], runs["file"])
    first_turn_end = {len(tokens) for tokens in WORKLOAD.tokens_after(1)}
    assert len(first_turn_end) == 1 and {len(t) for t in WORKLOAD.tokens_after(2)} != first_turn_end
    warm = runs["hicachefs"].phases.requests["warm"]
    assert {r.device_hit + r.host_hit for r in warm} == first_turn_end
    assert all(r.storage_hit > 0 for r in warm)
