"""Published pages through the kernel's page cache: warm from publish, never a stale byte, and
mapped with mmap wherever they live.

Reads of a cached page never reach the daemon, so the daemon's READ counter tells whether a
read was served by the kernel. Other processes read, as other ranks would.
"""

from __future__ import annotations

import errno
import mmap
import os
import subprocess
import sys
import time

import pytest

from hicachefs_testing.workload import content, exists_query
from pages import ingest_batch, publish, read_page

PAGE = 1 << 20
POOL = "model/bfloat16-page_first-64/tp0of1/kv"


def daemon_reads(mount, action) -> int:
    """READ requests the daemon served while ``action()`` ran (not counting the reads of
    ``.hicachefs/stats`` that measure it)."""

    def counted() -> int:
        return mount.stats()["requests"].get("read", 0)

    first = counted()
    second = counted()
    action()
    return counted() - second - (second - first)


def read_elsewhere(path) -> bytes:
    """Read a page in another process (another rank), as bytes."""
    out = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())",
                          str(path)], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def until(condition, seconds: float = 1.0) -> float:
    """Wait until ``condition()`` holds; returns the seconds it took (fails past ``seconds``)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, "not within the time allowed"
        time.sleep(0.01)
    return time.monotonic() - start


#: Reads a page's bytes in a process of its own, first saying how much of it the kernel's page
#: cache held (mincore over a shared mapping, which reads nothing): "<resident> <pages>\n<bytes>".
_READ_IF_CACHED = """
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
at = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
vec = (ctypes.c_ubyte * pages)()
assert libc.mincore(ctypes.c_void_p(at), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
libc.munmap(ctypes.c_void_p(at), ctypes.c_size_t(size))
sys.stdout.buffer.write(b"%d %d\\n" % (sum(v & 1 for v in vec), pages) + os.read(fd, size + 1))
"""


def read_if_cached(path) -> tuple[bool, bytes]:
    """Whether the kernel's page cache held all of the page just before another process read
    it, and the bytes that process read."""
    out = subprocess.run([sys.executable, "-c", _READ_IF_CACHED, str(path)], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    counts, _, data = out.stdout.partition(b"\n")
    resident, pages = map(int, counts.split())
    return resident == pages, data


def test_a_new_page_is_read_from_the_kernel_cache_from_the_first_read(mounted):
    """The host may take pages back from the page cache at any time (these VMs run DAMON's
    proactive reclaim of cold page cache), so a round in which some page was no longer all
    there when read proves nothing and is tried again with new pages; so does one in which a
    push was skipped (the pushes queued past their share of RAM, on a busy host: red once in
    CI). A push that did not work leaves every page missing from the cache, and every round
    fails."""
    pool = mounted.page_dir()
    found: list[bool] = []
    for round_number in range(5):
        pages = {f"r{round_number}k{i}": content(8 * round_number + i, PAGE) for i in range(8)}
        before = mounted.stats()["kernel_cache"]
        for key, data in pages.items():
            publish(pool, key, data, size_hint=False)

        def told() -> dict:
            now = mounted.stats()["kernel_cache"]
            return {kind: now[kind] - before[kind] for kind in ("pushes", "pushes_skipped")}

        until(lambda: sum(told().values()) == len(pages), 10)
        if told()["pushes_skipped"]:
            continue
        found.clear()

        def read_all_pages() -> None:
            for key, data in pages.items():
                cached, read = read_if_cached(pool / key)
                assert read == data
                found.append(cached)

        reads = daemon_reads(mounted, read_all_pages)
        if all(found):
            assert reads == 0  # every byte came from the kernel's cache
            return
    pytest.fail(f"in 5 rounds of 8 pushed pages, some page was missing from the kernel's cache at "
                f"its first read each time (last round: {found.count(False)} of 8)")


def test_without_the_kernel_cache_every_read_reaches_the_daemon(mount_factory):
    mount = mount_factory("--memory", "256M", "--no-kernel-cache")
    pool = mount.page_dir()
    data = content(1, PAGE)
    publish(pool, "k", data)
    for _ in range(3):
        assert daemon_reads(mount, lambda: read_page(pool / "k")) >= 1
    assert mount.stats()["kernel_cache"]["pushes"] == 0


def test_a_replaced_page_read_by_another_process_gives_the_new_bytes(mounted):
    pool = mounted.page_dir()
    for version in range(5):
        data = content(100 + version, PAGE)
        publish(pool, "same-key", data)
        assert read_elsewhere(pool / "same-key") == data
        assert read_page(pool / "same-key") == data


def test_a_reader_with_the_page_open_keeps_the_old_bytes(mounted):
    pool = mounted.page_dir()
    old, new = content(1, PAGE), content(2, PAGE)
    publish(pool, "k", old)
    fd = os.open(pool / "k", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == old[:4096]
        publish(pool, "k", new)
        assert read_elsewhere(pool / "k") == new
        assert os.pread(fd, PAGE + 1, 0) == old
        os.unlink(pool / "k")
        assert os.pread(fd, PAGE + 1, 0) == old
        assert os.fstat(fd).st_size == PAGE
    finally:
        os.close(fd)


def test_pages_replaced_through_the_ingest_file_show_as_replaced_once_the_write_is_answered(mounted):
    """The kernel did not see those replaces: the daemon tells it before it answers the write, so
    a reader told of them by the writer finds its open files' pages gone (``st_nlink`` 0) instead
    of reading the old pages from the kernel's cache. A batch replaces 64 pages at once, so that
    telling the kernel takes a while."""
    pool = mounted.page_dir()
    keys = [f"k{i:02d}" for i in range(64)]
    ingest = os.open(mounted.path / ".hicachefs" / "ingest", os.O_RDWR)
    unchanged = 0
    try:
        for version in range(0, 20, 2):
            assert ingest_batch(ingest, [(f"{POOL}/{key}", content(version, 4096)) for key in keys]) > 0
            readers = [os.open(pool / key, os.O_RDONLY) for key in keys]
            try:
                assert all(os.pread(fd, 4096, 0) == content(version, 4096) for fd in readers)  # cached now
                assert all(os.fstat(fd).st_nlink == 1 for fd in readers)  # and so are their attributes
                assert ingest_batch(ingest, [(f"{POOL}/{key}", content(version + 1, 4096)) for key in keys]) > 0
                unchanged += sum(os.fstat(fd).st_nlink != 0 for fd in readers)
            finally:
                for fd in readers:
                    os.close(fd)
    finally:
        os.close(ingest)
    assert unchanged == 0


@pytest.mark.parametrize("flags", [[], ["--no-kernel-cache"]], ids=["cache", "no-cache"])
def test_stat_getfattr_and_exists_agree_within_a_second_of_an_eviction(mount_factory, flags):
    mount = mount_factory("--memory", "16M", *flags)  # 2 MiB pages at most; no disk tier
    pool = mount.page_dir()
    publish(pool, "first", content(0, PAGE))
    assert os.stat(pool / "first").st_size == PAGE  # the kernel now caches its entry
    assert os.getxattr(pool / "first", "user.hicachefs.tier") == b"memory"
    for i in range(20):  # 20 MiB through a 16 MiB RAM tier: "first" is evicted
        publish(pool, f"more{i}", content(i + 1, PAGE))
    assert exists_query(mount.path, [f"{POOL}/first"]) == "0"

    def gone() -> bool:
        try:
            os.stat(pool / "first")
        except FileNotFoundError:
            return True
        return False

    until(gone, 1.0)
    with pytest.raises(OSError):
        os.getxattr(pool / "first", "user.hicachefs.tier")
    assert "first" not in os.listdir(pool)
    assert mount.stats()["tiers"]["memory"]["evictions"] >= 1


def mapped(path) -> bytes:
    """The file's bytes through a shared read-only mapping, as numpy.memmap maps a file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as view:
            return bytes(view)
    finally:
        os.close(fd)


def test_any_page_can_be_mapped_wherever_it_lives(mount_factory, tmp_path):
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "disk"), "--disk-size", "256M")
    pool = mount.page_dir()
    pages = {"cold": content(10, PAGE), "moved": content(11, PAGE), "hot": content(12, PAGE)}
    publish(pool, "cold", pages["cold"])
    publish(pool, "to-move", pages["moved"])
    for i in range(20):  # 20 MiB through a 16 MiB RAM tier: the first pages go down to disk
        publish(pool, f"more{i}", content(20 + i, PAGE))
    assert os.getxattr(pool / "cold", "user.hicachefs.tier") == b"disk"
    os.rename(pool / "to-move", pool / "moved")
    publish(pool, "hot", pages["hot"])
    for key, data in pages.items():
        for _ in range(2):  # every open of it, not only the first
            assert mapped(pool / key) == data, key


def test_without_the_kernel_cache_no_page_can_be_mapped(mount_factory):
    mount = mount_factory("--memory", "64M", "--no-kernel-cache")
    pool = mount.page_dir()
    publish(pool, "k", content(1, PAGE))
    with pytest.raises(OSError) as info:  # FUSE maps only files the kernel may cache
        mapped(pool / "k")
    assert info.value.errno == errno.ENODEV
    assert read_page(pool / "k") == content(1, PAGE)
