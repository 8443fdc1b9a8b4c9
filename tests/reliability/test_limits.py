"""Running full and hitting limits: RAM and SSD full, pages over --max-page-size, thousands of
open files, a reader holding a page while it is evicted or removed. Each gives the
contract's answer and loses nothing else."""

from __future__ import annotations

import errno
import os
import resource
import shutil

import pytest

from hicachefs_testing.workload import exists_query, labelled_content, publish, read_or_errno, read_whole, serving, tier_counter

MiB = 1 << 20


def test_ram_and_ssd_full_evict_oldest_only_and_an_open_reader_keeps_its_page(mount_factory, tmp_path):
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "disk"), "--disk-size", "32M",
                          "--max-page-size", "1M")
    pool = mount.page_dir()
    first = labelled_content("p000", MiB)
    publish(pool, "p000", first)
    held = os.open(pool / "p000", os.O_RDONLY)
    try:
        head = os.pread(held, MiB // 2, 0)
        pages = {f"p{i:03d}": labelled_content(f"p{i:03d}", MiB) for i in range(1, 90)}
        for key, data in pages.items():  # 90 MiB through 48 MiB of tiers: every publish succeeds
            publish(pool, key, data)
        tail = os.pread(held, MiB, MiB // 2)
        assert head + tail == first, "an open reader saw other bytes after its page was evicted"
    finally:
        os.close(held)
    stats = mount.stats()
    assert tier_counter(stats, "evictions") > 0, stats
    listed = set(os.listdir(pool))
    assert listed <= set(pages) | {"p000"}
    newest = list(pages)[-8:]
    assert set(newest) <= listed, "the most recent pages were evicted before older ones"
    answer = exists_query(mount.path, [f"{pool.relative_to(mount.path)}/{k}" for k in pages])
    assert answer == "".join("1" if k in listed else "0" for k in pages)
    for key, data in pages.items():  # reading promotes, which may evict others: a miss is fine
        got = read_or_errno(pool / key)
        assert got == data or got == errno.ENOENT, f"{key}: {got if isinstance(got, int) else 'wrong bytes'}"


def test_ram_pinned_by_readers_and_drafts_gives_enospc_and_loses_nothing(mount_factory):
    mount = mount_factory("--memory", "16M", "--max-page-size", "2M")
    pool = mount.page_dir()
    held_pages = {f"held-{i}": labelled_content(f"held-{i}", 2 * MiB) for i in range(4)}
    fds = []
    drafts = []
    refused = 0
    try:
        for key, data in held_pages.items():
            publish(pool, key, data)
            fds.append(os.open(pool / key, os.O_RDONLY))
        for i in range(8):  # 8 MiB pinned by readers; drafts take the rest, then run out
            fd = os.open(pool / f".draft-{i}", os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, 2 * MiB)
                os.pwrite(fd, labelled_content(f"d{i}", 2 * MiB), 0)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                refused += 1
                os.close(fd)
                os.unlink(pool / f".draft-{i}")
                continue
            drafts.append((i, fd))
        assert refused > 0, "16 MiB of RAM accepted more than 16 MiB of pinned pages and drafts"
        for fd, data in zip(fds, held_pages.values()):
            assert os.pread(fd, len(data) + 1, 0) == data
        for i, fd in drafts:  # the drafts that were accepted publish intact
            os.close(fd)
            os.rename(pool / f".draft-{i}", pool / f"d{i}")
        drafts = []
    finally:
        for fd in fds:
            os.close(fd)
        for _, fd in drafts:
            os.close(fd)
    for name in os.listdir(pool):
        expected = held_pages.get(name) or labelled_content(name, 2 * MiB)
        assert read_whole(pool / name) == expected
    assert mount.stats()["errors"].get("ENOSPC", 0) >= refused
    assert serving(mount.path)


def test_pages_over_max_page_size_get_efbig_and_the_limit_itself_fits(mount_factory):
    mount = mount_factory("--memory", "64M", "--max-page-size", "1M")
    pool = mount.page_dir()
    fd = os.open(pool / ".big", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for call in (lambda: os.ftruncate(fd, MiB + 1), lambda: os.pwrite(fd, b"x", MiB),
                     lambda: os.pwrite(fd, b"x" * 8192, MiB - 4096), lambda: os.ftruncate(fd, 1 << 50)):
            with pytest.raises(OSError) as info:
                call()
            assert info.value.errno == errno.EFBIG
    finally:
        os.close(fd)
    os.unlink(pool / ".big")
    publish(pool, "exactly-max", labelled_content("exactly-max", MiB))
    assert read_whole(pool / "exactly-max") == labelled_content("exactly-max", MiB)
    assert os.listdir(pool) == ["exactly-max"]


def test_two_thousand_open_files_on_pages(mounted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    pool = mounted.page_dir()
    pages = {f"k{i}": labelled_content(f"k{i}", 8192 + i) for i in range(200)}
    for key, data in pages.items():
        publish(pool, key, data)
    fds = []
    try:
        for _ in range(10):
            for key in pages:
                fds.append((key, os.open(pool / key, os.O_RDONLY)))
        assert len(fds) == 2000
        for key, fd in reversed(fds):
            assert os.pread(fd, 1 << 16, 0) == pages[key]
        assert serving(mounted.path)
    finally:
        for _, fd in fds:
            os.close(fd)
    for key, data in pages.items():
        assert read_whole(pool / key) == data


@pytest.mark.parametrize("removal", ["unlink", "rm -r", "replace"])
def test_open_reader_keeps_old_bytes_when_page_is_removed(mounted, removal):
    pool = mounted.page_dir("m", "f", "tp0of1", "kv")
    old = labelled_content("k", 3 * MiB)
    publish(pool, "k", old)
    fd = os.open(pool / "k", os.O_RDONLY)
    try:
        head = os.pread(fd, MiB, 0)
        if removal == "unlink":
            os.unlink(pool / "k")
        elif removal == "rm -r":
            shutil.rmtree(mounted.path / "m")
        else:
            publish(pool, "k", labelled_content("k", 3 * MiB, gen=1))
        try:
            rest = os.pread(fd, 2 * MiB, MiB)
        except OSError as exc:  # allowed by the contract: EIO, never other bytes
            assert exc.errno == errno.EIO
        else:
            assert head + rest == old
    finally:
        os.close(fd)
    if removal == "replace":
        assert read_whole(pool / "k") == labelled_content("k", 3 * MiB, gen=1)
    else:
        assert not (mounted.path / "m" / "f" / "tp0of1" / "kv" / "k").exists()


def test_pinned_ram_page_survives_pressure_without_disk(mount_factory):
    mount = mount_factory("--memory", "16M", "--max-page-size", "1M")
    pool = mount.page_dir()
    old = labelled_content("pinned", MiB)
    publish(pool, "pinned", old)
    fd = os.open(pool / "pinned", os.O_RDONLY)
    try:
        for i in range(40):
            publish(pool, f"pressure-{i}", labelled_content(f"pressure-{i}", MiB))
        got = os.pread(fd, MiB + 1, 0)
        assert got == old
    finally:
        os.close(fd)
    assert tier_counter(mount.stats(), "evictions") > 0
