"""Eight processes (as TP ranks) writing and reading overlapping keys: shared MLA-style pages
that every rank writes with its own content, and per-rank pages. Every read is one whole
write of its key: never torn, never another key's bytes, never another rank's own page.

And readers among direct writers (as cp) and renames (as the client) of a few keys
(``mixed_load``): every read is the start of one write of its key, never zeros where it has bytes,
never a write replaced or removed before the open began."""

from __future__ import annotations

from hicachefs_testing import mixed_load
from hicachefs_testing.scenarios import contention


def test_eight_ranks_never_read_a_torn_or_foreign_page(mounted):
    totals = contention(mounted.path, ranks=8, seconds=6.0, seed=3)
    print(totals)
    assert totals["bad"] == 0 and totals["errors"] == 0, totals
    assert totals["writes"] > 100 and totals["reads"] > 100, totals
    # Several ranks wrote the shared keys: readers must have seen other ranks' whole pages.
    assert totals["foreign_writer_reads"] > 0, totals


def test_readers_among_direct_writers_and_renames_never_read_torn_stale_or_zero_bytes(mount_factory, tmp_path):
    mount = mount_factory("--memory", "64M", "--disk", str(tmp_path / "disk"), "--disk-size", "512M")
    totals = mixed_load.run(mount.path, tmp_path, seconds=6.0, seed=5)
    print(totals)
    assert [totals.get(bad, 0) for bad in ("torn", "stale", "zeros", "unexpected errors", "workers failed")] \
        == [0, 0, 0, 0, 0], totals
    assert min(totals.get(done, 0) for done in ("reads", "direct writes", "renames")) > 100, totals
    # The load did meet the cases of issue 20: files replaced and removed while written and read.
    assert totals.get("direct writes replaced while written", 0) > 0 and totals.get("reads answered EIO", 0) > 0
