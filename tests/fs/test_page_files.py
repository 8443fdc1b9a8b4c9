"""Page files through a real mount: publish by rename, immutability, sizes, open pages."""

from __future__ import annotations

import errno
import os
import stat
import time

import pytest

from hicachefs.testing.workload import content, exists_query
from pages import publish, read_page, write_all

SIZES = [0, 1, 4095, 4096, 1 << 20, (1 << 20) + 1, 8 << 20, 64 << 20]


@pytest.mark.parametrize("size", SIZES)
def test_bytes_written_are_bytes_read(mounted, size):
    pool = mounted.page_dir()
    data = content(size, size)
    publish(pool, "k", data)
    assert read_page(pool / "k") == data
    assert (pool / "k").stat().st_size == size


def test_page_without_size_hint_round_trips(mounted):
    pool = mounted.page_dir()
    data = content(7, 3 << 20)
    publish(pool, "nohint", data, size_hint=False)
    assert read_page(pool / "nohint") == data


def test_page_is_invisible_until_renamed(mounted):
    pool = mounted.page_dir()
    tmp = pool / ".tmp-writer"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, 8192)
        write_all(fd, b"x" * 4096)
        assert not (pool / "key").exists()
        assert "key" not in os.listdir(pool)
        assert exists_query(mounted.path, ["model/bfloat16-page_first-64/tp0of1/kv/key"]) == "0"
    finally:
        os.close(fd)
    os.rename(tmp, pool / "key")
    assert (pool / "key").exists()
    assert not tmp.exists()
    assert exists_query(mounted.path, ["model/bfloat16-page_first-64/tp0of1/kv/key"]) == "1"


def test_published_page_is_immutable(mounted):
    pool = mounted.page_dir()
    path = publish(pool, "fixed", b"abc")
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o444
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND):
        with pytest.raises(PermissionError):
            os.open(path, flags)
    with pytest.raises(PermissionError):
        os.truncate(path, 0)
    assert read_page(path) == b"abc"


def test_rename_onto_existing_key_replaces_it(mounted):
    pool = mounted.page_dir()
    old, new = content(1, 2 << 20), content(2, 1 << 20)
    publish(pool, "k", old)
    publish(pool, "k", new)
    assert read_page(pool / "k") == new
    assert os.listdir(pool) == ["k"]


def test_open_reader_keeps_old_bytes_across_replace_and_unlink(mounted):
    pool = mounted.page_dir()
    old = content(3, 4 << 20)
    publish(pool, "k", old)
    fd = os.open(pool / "k", os.O_RDONLY)
    try:
        head = os.pread(fd, 1 << 20, 0)
        publish(pool, "k", content(4, 4 << 20))
        middle = os.pread(fd, 2 << 20, 1 << 20)
        os.unlink(pool / "k")
        tail = os.pread(fd, 1 << 20, 3 << 20)
        assert head + middle + tail == old
    finally:
        os.close(fd)
    assert not (pool / "k").exists()


def test_stat_shows_size_blocks_and_times(mounted):
    pool = mounted.page_dir()
    before = time.time()
    path = publish(pool, "k", content(0, 10000))
    st = path.stat()
    assert st.st_size == 10000
    assert st.st_blocks * 512 >= 10000
    assert before - 2 <= st.st_mtime <= time.time() + 2
    assert st.st_nlink == 1


def test_file_created_under_key_is_published_at_close(mounted):
    pool = mounted.page_dir()
    data = content(9, 100000)
    with open(pool / "direct", "wb") as f:
        f.write(data)
    assert read_page(pool / "direct") == data
    with pytest.raises(PermissionError):
        open(pool / "direct", "wb")


def test_page_over_max_page_size_is_refused_with_efbig(mount_factory):
    mount = mount_factory("--memory", "64M", "--max-page-size", "1M")
    pool = mount.page_dir()
    fd = os.open(pool / ".big", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as info:
            os.ftruncate(fd, (1 << 20) + 1)
        assert info.value.errno == errno.EFBIG
        with pytest.raises(OSError) as info:  # the first 1 MiB request is written, the rest refused
            write_all(fd, b"x" * ((1 << 20) + 4096))
        assert info.value.errno == errno.EFBIG
    finally:
        os.close(fd)
    publish(pool, "fits", b"y" * (1 << 20))
    assert read_page(pool / "fits") == b"y" * (1 << 20)


def test_full_store_gives_enospc_and_loses_nothing(mount_factory):
    mount = mount_factory("--memory", "16M")  # pages up to 2 MiB, 1/8 of the RAM tier
    pool = mount.page_dir()
    pages = {f"p{i}": content(i, 2 << 20) for i in range(8)}
    held = []
    try:
        for key, data in pages.items():  # hold every page open: none may be evicted
            publish(pool, key, data)
            held.append(os.open(pool / key, os.O_RDONLY))
        with pytest.raises(OSError) as info:
            publish(pool, "one-too-many", content(99, 2 << 20))
        assert info.value.errno == errno.ENOSPC
        for fd, data in zip(held, pages.values()):
            assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        for fd in held:
            os.close(fd)
    publish(pool, "after", b"z" * 1000)
    assert read_page(pool / "after") == b"z" * 1000
    assert mount.stats()["errors"].get("ENOSPC", 0) >= 1


def test_abandoned_temporary_file_is_discarded(mount_factory):
    mount = mount_factory("--memory", "64M", "--temp-timeout", "1")
    pool = mount.page_dir()
    with open(pool / ".abandoned", "wb") as f:
        f.write(b"partial")
    assert ".abandoned" in os.listdir(pool)
    deadline = time.monotonic() + 15
    while ".abandoned" in os.listdir(pool) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ".abandoned" not in os.listdir(pool)
    assert mount.stats()["pending_files"] == 0


def test_unwritten_bytes_read_as_zeros_never_an_earlier_page(mounted):
    pool = mounted.page_dir()
    publish(pool, "old", b"\xab" * (1 << 20))
    os.unlink(pool / "old")
    tmp = pool / ".sparse"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, 1 << 20)
        os.pwrite(fd, b"tail", (1 << 20) - 4)
        assert os.pread(fd, 8, 0) == bytes(8)
    finally:
        os.close(fd)
    os.rename(tmp, pool / "sparse")
    assert read_page(pool / "sparse") == bytes((1 << 20) - 4) + b"tail"
