"""Page files through a real mount: publish by rename, immutability, sizes, open pages."""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import subprocess
import time

import pytest

from hicachefs_testing.workload import content, errno_of, exists_query, fill_writing_share
from pages import publish, read_page, wait_until, write_all

SIZES = [0, 1, 4095, 4096, 1 << 20, (1 << 20) + 1, 8 << 20, 64 << 20]


@pytest.mark.parametrize("size", SIZES)
def test_bytes_written_are_bytes_read(mount_factory, size):
    mounted = mount_factory("--memory", "512M" if size > 8 << 20 else "64M")  # a page is at most 1/8 of it
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


def test_a_page_published_while_its_file_is_still_open_is_immutable_and_mappable(mounted):
    """A reader still holds the temporary file open when it is renamed into a page: the page
    is then as any other, whole, immutable and mappable."""
    pool = mounted.page_dir()
    data = content(7, 64 << 10)
    with open(pool / ".t", "wb") as f:
        f.write(data)
    reader = os.open(pool / ".t", os.O_RDONLY)
    try:
        os.rename(pool / ".t", pool / "key")
        with pytest.raises(PermissionError):
            os.truncate(pool / "key", 0)
        for flags in (os.O_WRONLY, os.O_RDONLY | os.O_TRUNC):
            with pytest.raises(PermissionError):
                os.open(pool / "key", flags)
        assert (pool / "key").stat().st_size == len(data)
        assert read_page(pool / "key") == data
        fd = os.open(pool / "key", os.O_RDONLY)
        try:
            with mmap.mmap(fd, len(data), prot=mmap.PROT_READ) as mapped:
                assert mapped[:] == data
        finally:
            os.close(fd)
    finally:
        os.close(reader)
    assert mounted.stats()["ram_budget"]["shares"]["writing"]["held_bytes"] == 0


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
    pages = {f"p{i}": content(i, 2 << 20) for i in range(2)}
    for key, data in pages.items():
        publish(pool, key, data)
    held = fill_writing_share(pool, 2 << 20)  # files being written hold all they may
    with pytest.raises(OSError) as info:
        publish(pool, "one-too-many", content(99, 2 << 20))
    assert info.value.errno == errno.ENOSPC
    assert all(read_page(pool / key) == data for key, data in pages.items())
    for path in held:
        os.unlink(path)
    publish(pool, "after", b"z" * 1000)
    assert read_page(pool / "after") == b"z" * 1000
    assert mount.stats()["errors"].get("ENOSPC", 0) >= 1


def test_abandoned_temporary_file_is_discarded(mount_factory):
    mount = mount_factory("--memory", "64M", "--temp-timeout", "1")
    pool = mount.page_dir()
    with open(pool / ".abandoned", "wb") as f:
        f.write(b"partial")
    assert ".abandoned" in os.listdir(pool)
    wait_until(lambda: ".abandoned" not in os.listdir(pool), timeout=15)
    assert mount.stats()["pending_files"] == 0


#: Run as nobody with the system's Python: opens every temporary file in the pool for reading
#: (what ``ls`` shows it) and prints how many; at a line on its standard input, reads each and
#: prints what each read did ("read" or its errno's name).
TEMPORARY_FILE_READER = r"""
import errno, json, os, sys
pool = sys.argv[1]
held = [os.open(os.path.join(pool, name), os.O_RDONLY) for name in os.listdir(pool) if name.startswith(".")]
print(len(held), flush=True)
sys.stdin.readline()
done = []
for fd in held:
    try:
        os.pread(fd, 4096, 0)
        done.append("read")
    except OSError as exc:
        done.append(errno.errorcode[exc.errno])
print(json.dumps(done), flush=True)
"""


def test_a_plain_user_reading_a_dead_writers_temporary_files_does_not_keep_them(public_mount_factory):
    """Before: a plain user holding them open kept all 32 pending, and root's new temporary files
    failed with ENOSPC (they hold all that files being written may) until it closed them."""
    mount = public_mount_factory("--memory", "64M", "--temp-timeout", "1")
    pool = mount.page_dir()
    writer = [os.open(pool / f".dead-{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(32)]
    reader = None
    try:
        for fd in writer:
            os.write(fd, bytes(1 << 20))
        reader = subprocess.Popen(["/usr/bin/python3", "-c", TEMPORARY_FILE_READER, str(pool)], user=65534,
                                  group=65534, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == "32"
        full = os.open(pool / ".one-more", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            assert errno_of(os.write, full, bytes(1 << 20)) == errno.ENOSPC  # they hold all they may
        finally:
            os.close(full)
        for fd in writer:
            os.close(fd)  # the writer dies
        writer = []
        wait_until(lambda: mount.stats()["pending_files"] == 0, timeout=8)
        assert not [name for name in os.listdir(pool) if name.startswith(".")]
        for i in range(32):
            publish(pool, f"after-{i}", content(i, 1 << 20))
        reader.stdin.write("read\n")
        reader.stdin.flush()
        assert json.loads(reader.stdout.readline()) == ["EIO"] * 32
    finally:
        for fd in writer:
            os.close(fd)
        if reader is not None:
            reader.kill()
            reader.wait()
    assert read_page(pool / "after-31") == content(31, 1 << 20)


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
