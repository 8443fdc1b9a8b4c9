"""The daemon on a disk that dies under it: a real block device (ext4 on a loop device) whose
every read and write starts failing while the daemon runs. The daemon keeps serving from RAM:
RAM pages read back exactly, new pages are published (write-back) or refused with EIO
(write-through, which promises the disk copy), pages that were only on the dead disk fail with
EIO or are gone, never wrong bytes, and the failures are counted."""

from __future__ import annotations

import errno
import os

import pytest

from hicachefs.testing import mounting
from hicachefs.testing.failing_disk import FailingDisk
from workload import content, exists_query, publish, read_or_errno, serving, tier_counter

MiB = 1 << 20


@pytest.fixture
def failing_disk(tmp_path):
    with FailingDisk(tmp_path / "failing-disk") as disk:
        yield disk


def _mount(mount_factory, disk: FailingDisk, *flags: str) -> mounting.Mount:
    # The store warns about each page it cannot write down; none of that may be an ERROR.
    return mount_factory("--memory", "16M", "--disk", str(disk.path / "tier"), "--disk-size", "64M",
                         "--max-page-size", "1M", *flags)


def _publish_and_locate(mount, count: int) -> tuple[dict[str, bytes], list[str], list[str]]:
    pool = mount.page_dir()
    pages = {f"p{i:03d}": content(f"p{i:03d}", MiB) for i in range(count)}
    for key, data in pages.items():
        publish(pool, key, data)
    tiers = {key: os.getxattr(pool / key, "user.hicachefs.tier").decode() for key in pages}
    return pages, [k for k in pages if tiers[k] == "memory"], [k for k in pages if tiers[k] == "disk"]


def _arena(disk: FailingDisk):
    return next((disk.path / "tier").glob("*.arena"))


def test_write_back_keeps_serving_from_ram_while_the_disk_fails(mount_factory, failing_disk):
    mount = _mount(mount_factory, failing_disk)
    pool = mount.page_dir()
    pages, in_ram, on_disk = _publish_and_locate(mount, 40)  # 40 MiB through 16 MiB of RAM
    assert len(in_ram) >= 8 and len(on_disk) >= 16, (len(in_ram), len(on_disk))

    failing_disk.fail()  # ext4 has turned read-only when this returns
    failing_disk.drop_cache(_arena(failing_disk))  # reads of disk pages now reach the dead device

    for key in in_ram:
        assert read_or_errno(pool / key) == pages[key], f"{key}: a RAM page was not served"
    outcomes = []
    for key in on_disk:
        got = read_or_errno(pool / key)
        assert got in (errno.EIO, errno.ENOENT) or got == pages[key], f"{key}: wrong bytes from the dead disk"
        outcomes.append(got if isinstance(got, int) else "bytes")
    assert outcomes.count(errno.EIO) > 0, f"no read reached the dead device: {outcomes}"
    fresh = {f"n{i:03d}": content(f"n{i:03d}", MiB, gen=1) for i in range(32)}
    for key, data in fresh.items():  # RAM fills and cannot write down: old pages are evicted instead
        publish(pool, key, data)
        assert read_or_errno(pool / key) == data
    newest = list(fresh)[-8:]
    rel = pool.relative_to(mount.path)
    assert exists_query(mount.path, [f"{rel}/{k}" for k in newest]) == "1" * 8
    stats = mount.stats()
    assert tier_counter(stats, "io_errors") >= outcomes.count(errno.EIO), stats
    assert stats["errors"].get("EIO", 0) >= outcomes.count(errno.EIO), stats
    assert mounting.alive(mount.pid) and serving(mount.path)


def test_write_through_refuses_new_pages_with_eio_and_serves_the_old_ones(mount_factory, failing_disk):
    mount = _mount(mount_factory, failing_disk, "--write-through")
    pool = mount.page_dir()
    pages, in_ram, _ = _publish_and_locate(mount, 12)  # all fit in RAM, and all are on disk too
    assert len(in_ram) == 12

    failing_disk.fail()
    with pytest.raises(OSError) as info:
        publish(pool, "after", content("after", MiB))
    assert info.value.errno == errno.EIO
    with pytest.raises(OSError) as info:  # a replace fails too, and leaves the old page
        publish(pool, in_ram[0], content(in_ram[0], MiB, gen=1))
    assert info.value.errno == errno.EIO
    for key in in_ram:
        assert read_or_errno(pool / key) == pages[key]
    assert not os.path.exists(pool / "after")
    stats = mount.stats()
    assert tier_counter(stats, "io_errors") >= 2 and stats["errors"].get("EIO", 0) >= 2, stats
    assert mounting.alive(mount.pid)
