"""Files being written are bounded (issue 20, item 3): what they hold counts against half of
``--memory`` (``writing_budget``), so temporary files nobody renames evict no more than that
share of published pages, files of a size not announced (no ``ftruncate``) cannot grow the
daemon's heap past it, and a write past it fails at once with ENOSPC."""

from __future__ import annotations

import errno
import os

import pytest

from hicachefs_testing import attacks
from hicachefs_testing.workload import content, exists_query, fill_writing_share, publish

PAGE = 64 << 10
#: Before item 3, 1,500 such files on a 64 MiB mount evicted all 500 published pages.
TEMPORARY_FILES = 1500
PUBLISHED = 300


@pytest.fixture
def mounted_64m(mount_factory):
    return mount_factory("--memory", "64M")


def _write_until_refused(pool, count: int, size: int, announce: bool) -> tuple[int, int | None]:
    """Write ``count`` temporary files of ``size`` bytes, closed and never renamed, stopping at
    the first that fails; how many were written, and the errno that stopped them."""
    for i in range(count):
        fd = os.open(pool / f".unrenamed-{i}", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if announce:
                os.ftruncate(fd, size)
            os.write(fd, os.urandom(size))
        except OSError as exc:
            return i, exc.errno
        finally:
            os.close(fd)
    return count, None


def test_unrenamed_temporary_files_evict_no_more_than_their_share(mounted_64m):
    pool = mounted_64m.page_dir()
    keys = [f"{i:064x}" for i in range(PUBLISHED)]
    for i, key in enumerate(keys):
        publish(pool, key, content(i, PAGE))
    written, failure = _write_until_refused(pool, TEMPORARY_FILES, PAGE, announce=True)
    print(f"{written} unrenamed temporary files of 64 KiB, then {errno.errorcode.get(failure, failure)}")
    assert failure == errno.ENOSPC, f"{written} temporary files were all accepted"
    assert written * PAGE <= 32 << 20
    rel = str(pool.relative_to(mounted_64m.path))
    assert exists_query(mounted_64m.path, [f"{rel}/{key}" for key in keys]) == "1" * PUBLISHED
    for i in range(written + 1):  # discarded, they give their room back
        os.unlink(pool / f".unrenamed-{i}")
    publish(pool, "after", content("after", PAGE))
    assert (pool / "after").read_bytes() == content("after", PAGE)


def test_files_of_unannounced_size_count_against_the_same_bound(mounted_64m):
    pool = mounted_64m.page_dir("model", "bfloat16-page_first-64", "tp0of1", "fresh")  # no size known yet
    before = attacks.rss(mounted_64m.pid)
    written, failure = _write_until_refused(pool, 300, 4 << 20, announce=False)
    growth = attacks.rss(mounted_64m.pid) - before
    print(f"{written} files of 4 MiB of no announced size, then {errno.errorcode.get(failure, failure)}; "
          f"the daemon grew by {growth >> 20} MiB")
    assert failure == errno.ENOSPC, f"{written} files were all accepted"
    assert growth < 64 << 20, f"files being written took {growth >> 20} MiB of the daemon's heap"


def test_the_ram_budget_shares_add_up_to_at_most_the_tier_and_show_what_they_hold(mounted_64m):
    """Issue 31, item 2: one owner gives out the shares of ``--memory``; ``.hicachefs/stats``
    shows each one's limit and what it holds, and files being written are held by theirs."""
    pool = mounted_64m.page_dir()
    held = fill_writing_share(pool, 1 << 20)
    shares = mounted_64m.stats()["ram_budget"]["shares"]
    print({name: (share["held_bytes"] >> 20, share["limit_bytes"] >> 20) for name, share in shares.items()})
    inside = {"reserved_ahead", "pins_of_others"}  # parts of ``writing`` and ``pins``
    beside = {"private_reads", "private_reads_of_others"}  # readers' own copies of lower-tier pages: not in the tier
    assert sum(s["limit_bytes"] for name, s in shares.items() if name not in inside | beside) <= 64 << 20
    assert shares["writing"]["limit_bytes"] == 32 << 20
    assert shares["writing"]["held_bytes"] == (len(held) - 1) << 20 == 32 << 20
    for path in held:
        os.unlink(path)
    assert mounted_64m.stats()["ram_budget"]["shares"]["writing"]["held_bytes"] == 0


def test_an_ftruncate_after_rm_gives_the_writing_share_back(mount_factory):
    """A writer's ftruncate after its temporary file was removed kept its bytes in the writing
    share (and a RAM slot) for the daemon's life: 32 of them filled the share of a 64 MiB
    mount, and every writer then got ENOSPC."""
    mounted = mount_factory("--memory", "64M")
    pool = mounted.page_dir()
    for i in range(40):
        fd = os.open(pool / f".t{i}", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.unlink(pool / f".t{i}")
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 1 << 20)
        finally:
            os.close(fd)
    assert mounted.stats()["ram_budget"]["shares"]["writing"]["held_bytes"] == 0
    fd = os.open(pool / ".after", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 1 << 20)
    finally:
        os.close(fd)
