"""Eight processes (as TP ranks) writing and reading overlapping keys: shared MLA-style pages
that every rank writes with its own content, and per-rank pages. Every read is one whole
write of its key: never torn, never another key's bytes, never another rank's own page."""

from __future__ import annotations

from hicachefs.testing.scenarios import contention


def test_eight_ranks_never_read_a_torn_or_foreign_page(mounted):
    totals = contention(mounted.path, ranks=8, seconds=6.0, seed=3)
    print(totals)
    assert totals["bad"] == 0 and totals["errors"] == 0, totals
    assert totals["writes"] > 100 and totals["reads"] > 100, totals
    # Several ranks wrote the shared keys: readers must have seen other ranks' whole pages.
    assert totals["foreign_writer_reads"] > 0, totals
