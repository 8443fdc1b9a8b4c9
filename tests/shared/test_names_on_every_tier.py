"""Rename, unlink and ``rm -r`` mean the same on every tier: on a mount with ``--shared``, a
page renamed or removed is gone under its old name from the shared tier too, so it never comes
back from there, here or on another host. Two daemons share a local directory as two hosts
would share a distributed filesystem (its journal and presence work the same on any directory)."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from hicachefs_testing.workload import content
from pages import publish, read_page, wait_until

POOL = ("m", "bfloat16-page_first-64", "tp0of1", "kv")


@pytest.fixture
def hosts(mount_factory, tmp_path):
    shared = tmp_path / "shared"
    a = mount_factory("--memory", "64M", "--shared", str(shared))
    b = mount_factory("--memory", "64M", "--shared", str(shared))
    return a, b


def wait_written_behind(mount, pages: int) -> None:
    wait_until(lambda: mount.stats()["tiers"]["shared"]["written_behind"] >= pages)


def test_a_page_renamed_is_gone_under_its_old_name_on_every_host(hosts):
    a, b = hosts
    publish(a.page_dir(*POOL), "old", content(1, 64 << 10))
    wait_written_behind(a, 1)
    wait_until(lambda: (b.path.joinpath(*POOL) / "old").exists())  # B finds it there
    os.rename(a.path.joinpath(*POOL, "old"), a.path.joinpath(*POOL, "new"))
    assert read_page(a.path.joinpath(*POOL, "new")) == content(1, 64 << 10)
    assert not (a.path.joinpath(*POOL) / "old").exists()
    wait_until(lambda: not (b.path.joinpath(*POOL) / "old").exists())
    wait_until(lambda: (b.path.joinpath(*POOL) / "new").exists())
    assert read_page(b.path.joinpath(*POOL, "new")) == content(1, 64 << 10)
    assert not (a.path.joinpath(*POOL) / "old").exists()  # and it did not come back on A


@pytest.mark.parametrize("how", ["rm", "rm -r"])
def test_a_page_removed_never_comes_back_from_the_shared_tier(hosts, how):
    a, b = hosts
    pool = a.page_dir(*POOL)
    for i in range(3):
        publish(pool, f"k{i}", content(i, 32 << 10))
    wait_written_behind(a, 3)
    wait_until(lambda: all((b.path.joinpath(*POOL) / f"k{i}").exists() for i in range(3)))
    if how == "rm":
        os.unlink(pool / "k0")
        gone = ["k0"]
    else:
        shutil.rmtree(a.path / POOL[0])
        gone = ["k0", "k1", "k2"]
    for name in gone:
        assert not (a.path.joinpath(*POOL) / name).exists()
        wait_until(lambda name=name: not (b.path.joinpath(*POOL) / name).exists())
    assert a.stats()["pages"] == 3 - len(gone)


def test_a_pool_whose_pages_only_the_shared_tier_holds_here_is_not_empty(hosts):
    """On B, A's pages lie in the pool only on the shared tier: they answer by name, so ``rmdir``
    fails with ENOTEMPTY, as for any directory that holds files (it succeeded, and the next
    lookup brought the directory back). Once they are removed, it succeeds and stays removed."""
    a, b = hosts
    publish(a.page_dir(*POOL), "k0", content(0, 32 << 10))
    wait_written_behind(a, 1)
    pool = b.path.joinpath(*POOL)
    wait_until(lambda: (pool / "k0").exists())
    for directory in (pool, pool.parent):
        with pytest.raises(OSError) as refused:
            os.rmdir(directory)
        assert refused.value.errno == errno.ENOTEMPTY
    os.unlink(pool / "k0")  # from the shared tier too
    os.rmdir(pool)
    assert not pool.exists() and not (pool / "k0").exists()
