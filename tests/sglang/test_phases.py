"""Per phase (cold, warm after evicting device and host, a burst), SGLang's cache decides the
same storage hits over HiCacheFS as over HiCacheFile, every byte is exact at every step, no
call fails and nothing is logged at WARNING."""

from __future__ import annotations

import pytest

from sglang_runs import MHA, MLA, SMALL_POOLS, assert_clean, assert_same_decisions, storage_hits
from hicachefs_testing.sglang_cache import CacheSetup

CASES = {
    "page_first_direct": CacheSetup(MHA, **SMALL_POOLS),
    "layer_first": CacheSetup(MHA, layout="layer_first", **SMALL_POOLS),
    "best_effort": CacheSetup(MHA, prefetch_policy="best_effort", **SMALL_POOLS),
    "timeout": CacheSetup(MHA, prefetch_policy="timeout", **SMALL_POOLS),
    "write_through_selective": CacheSetup(MHA, write_policy="write_through_selective", **SMALL_POOLS),
    "mla_all_shard": CacheSetup(MLA, **SMALL_POOLS),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sglang_decides_the_same_hits_over_hicachefs_as_over_hicache_file(side_by_side, case):
    runs = side_by_side(CASES[case])
    for run in runs.values():
        assert_clean(run)
    assert_same_decisions(runs["hicachefs"], runs["file"])
    ours = runs["hicachefs"]
    assert storage_hits(ours, "cold") == 0  # a fresh store
    assert storage_hits(ours, "warm") > 0 and storage_hits(ours, "burst") > 0
    if case != "write_through_selective":
        # Device and host were emptied: every page of the warm turns' stored prefixes came back.
        assert all(r.device_hit + r.host_hit > 0 for r in ours.phases.requests["warm"])
    assert ours.phases.prefetch_outcomes["burst"].get("declined_rate_limited", 0) > 0
    # Every page went through the data plane (the first of each pool made its directories).
    assert ours.client_stats["plane_reads"] == ours.client_stats["hits"] > 0
    assert ours.client_stats["plane_writes"] > 0


def test_the_same_hits_with_the_data_plane_off(side_by_side):
    """Through the control files alone (``data_plane`` false), SGLang decides the same hits as
    over HiCacheFile and as through the plane (the test above), and no page crosses the plane."""
    runs = side_by_side(CASES["page_first_direct"], extra={"data_plane": False})
    for run in runs.values():
        assert_clean(run)
    assert_same_decisions(runs["hicachefs"], runs["file"])
    stats = runs["hicachefs"].client_stats
    assert stats["plane_reads"] == stats["plane_writes"] == stats["plane_requests"] == 0
    assert stats["hits"] > 0 and stats["pages_written"] > 0


def test_mla_pages_go_to_the_all_shard_once(side_by_side):
    """Every TP rank holds the same MLA KV: hicachefs keeps one copy, under the ``all`` shard."""
    ours = side_by_side(CASES["mla_all_shard"])["hicachefs"]
    stored = ours.stored_pages()
    assert {page.shard for page in stored.values()} == {"all"}
    assert len({page.key for page in stored.values()}) == len(stored) > 0  # one file per page


def test_write_back_reads_back_from_storage(side_by_side):
    """SGLang issue #26886 reports that under write_back nothing was ever read back from
    storage. With 0.5.23 here it is: a device eviction backs the node up to the host pool, the
    host backup's ack writes it to storage, and the warm and burst turns load it back."""
    runs = side_by_side(CacheSetup(MHA, write_policy="write_back", **SMALL_POOLS))
    for run in runs.values():
        assert_clean(run)
    assert_same_decisions(runs["hicachefs"], runs["file"])
    ours = runs["hicachefs"]
    assert storage_hits(ours, "cold") == 0
    assert storage_hits(ours, "warm") > 0 and storage_hits(ours, "burst") > 0
