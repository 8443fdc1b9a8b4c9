"""Two TP ranks of one server, each in its own process with its own device pool, in one gloo
group, over one mount (``hicachefs_testing.sglang_ranks``). Before the warm turns rank 1 loses
pages of its own shard that rank 0 keeps; SGLang reduces the ranks' storage hit queries (MIN,
``_sync_prefetch_hit_query``: a count for KV alone, one flag per prefix length when a pool has
``TRAILING_PAGES``), so both ranks load only what rank 1 still has, and agree on every hit.
Every byte each rank hands over, reads and loads is its own shard's, exact."""

from __future__ import annotations

import pytest

from hicachefs_testing.sglang_cache import Backend, CacheSetup, page_keys
from hicachefs_testing import mounting
from hicachefs_testing.sglang_ranks import PageDrop, RankCase, run_ranks
from hicachefs_testing.sglang_workload import ChatWorkload
from sglang_runs import HYBRID_POOLS, HYBRID_WORKLOAD, MAMBA_HYBRID, MHA, SMALL_POOLS


def first_page_after_turn_1(setup: CacheSetup, workload: ChatWorkload):
    """Per conversation, the KV page just past its first turn: the second turn's first page."""
    return "kv", [page_keys(tokens, setup.page_size)[len(page_keys(first, setup.page_size))]
                  for tokens, first in zip(workload.tokens_after(2), workload.tokens_after(1))]


def state_at_end_of_turn_2(setup: CacheSetup, workload: ChatWorkload):
    """Per conversation, the Mamba state its second turn ended in."""
    return "mamba", [page_keys(tokens, setup.page_size)[-1] for tokens in workload.tokens_after(2)]


CASES = {
    "mha": (CacheSetup(MHA, **SMALL_POOLS), ChatWorkload(), first_page_after_turn_1, "batch_exists"),
    "mamba_hybrid": (CacheSetup(MAMBA_HYBRID, **HYBRID_POOLS), HYBRID_WORKLOAD, state_at_end_of_turn_2,
                     "batch_exists_v2"),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    """Each case served by the same two rank processes (SGLang's imports cost each some 8 s of
    a core), each case over a mount of its own; per case, each rank's ``RankRun``."""
    workdir = tmp_path_factory.mktemp("two-ranks")
    mounts, cases = [], []
    try:
        for name, (setup, workload, lost_pages, _) in CASES.items():
            mounts.append(mounting.start(workdir / f"mnt-{name}", workdir / f"daemon-{name}.log", ["--memory", "256M"]))
            pool, keys = lost_pages(setup, workload)
            cases.append(RankCase(setup, Backend("hicachefs", str(mounts[-1].path)), workload,
                                  (PageDrop(1, "warm", pool, tuple(keys)),)))
        runs = run_ranks(cases, 2, workdir)
    finally:
        for mount in mounts:
            mounting.stop(mount)
    failures = [line for mount in mounts for line in mounting.unexpected_log_lines(mount)]
    assert not failures, "a daemon logged errors:\n" + "\n".join(failures)
    return dict(zip(CASES, runs))


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_load_what_every_rank_has(served, case):
    setup, workload, lost_pages, exists = CASES[case]
    _, keys = lost_pages(setup, workload)
    ranks = served[case]
    for rank in ranks:
        assert rank.failures == [] and rank.warnings == [] and rank.client_errors == {}
        assert rank.wrong_handed_over == rank.wrong_read == rank.wrong_on_device == 0
        assert rank.read_pages > 0 and rank.stored_pages > 0 and rank.wrong_stored == 0
    zero, one = ranks
    assert one.dropped == len(keys)
    assert zero.hits == one.hits and zero.prefetch_outcomes == one.prefetch_outcomes
    reads = "batch_get_v1"
    assert zero.calls[reads] == one.calls[reads]
    # Rank 0's own query found more than rank 1's; both loaded only what rank 1 had.
    assert zero.calls[exists][2] > one.calls[exists][2]
    first_turn_end = {len(tokens) // setup.page_size for tokens in workload.tokens_after(1)}
    assert {device + host for device, host, _, _ in zero.hits["warm"]} == first_turn_end
    assert all(storage > 0 for _, _, storage, _ in zero.hits["warm"])
