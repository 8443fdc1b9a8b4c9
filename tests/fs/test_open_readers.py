"""What a process with a file open reads while its name changes, through a real mount: its own
whole bytes or EIO, never another version's bytes, zeros or a cut-off page (DESIGN.md, "An open
page stays consistent"); and an open racing replaces of the name finds one whole version."""

from __future__ import annotations

import errno
import json
import mmap
import os
import subprocess
import sys
import time

import pytest

from hicachefs_testing.workload import content, exists_query, labelled_content
from pages import ingest_batch, publish, read_page, write_all

from hicachefs.posix.page_handle import PIN_LEASE_S

POOL = "model/bfloat16-page_first-64/tp0of1/kv"
KiB, MiB = 1 << 10, 1 << 20


def read_elsewhere(path) -> bytes:
    """The file's bytes as a new process (``cat``) reads them."""
    return subprocess.run(["cat", str(path)], capture_output=True, check=True, timeout=60).stdout


def read_through(fd: int, size: int) -> bytes:
    parts, offset = [], 0
    while piece := os.pread(fd, min(size, 128 * KiB), offset):
        parts.append(piece)
        offset += len(piece)
    return b"".join(parts)


def read_errno(fd: int) -> int:
    try:
        os.pread(fd, 64 * KiB, 0)
    except OSError as exc:
        return exc.errno
    return 0


def test_a_rename_onto_a_key_being_written_replaces_that_file_for_good(mounted):
    pool = mounted.page_dir()
    old, new = content(1, 64 * KiB), content(2, 64 * KiB)
    writer = os.open(pool / "k", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # as cp does
    write_all(writer, old)
    reader = os.open(pool / "k", os.O_RDONLY)
    os.close(writer)  # the reader still has it open: not published yet
    publish(pool, "k", new)
    assert read_page(pool / "k") == new
    assert read_errno(reader) == errno.EIO  # what it had open was replaced before it became a page
    os.close(reader)  # the last close of the replaced file publishes nothing
    assert read_elsewhere(pool / "k") == new
    assert os.listdir(pool) == ["k"] and exists_query(mounted.path, [f"{POOL}/k"]) == "1"


def test_the_writer_of_a_file_replaced_by_a_rename_gets_eperm_and_publishes_nothing(mounted):
    pool = mounted.page_dir()
    writer = os.open(pool / "k", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(writer, content(1, 64 * KiB))
        publish(pool, "k", content(2, 64 * KiB))
        with pytest.raises(OSError) as info:
            os.pwrite(writer, content(3, 4 * KiB), 64 * KiB)
        assert info.value.errno == errno.EPERM
    finally:
        os.close(writer)
    assert read_elsewhere(pool / "k") == content(2, 64 * KiB)

def test_a_reader_of_a_file_being_written_gets_eio_once_it_is_removed(mounted):
    pool = mounted.page_dir()
    writer = os.open(pool / "k", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    write_all(writer, content(3, 64 * KiB))
    reader = os.open(pool / "k", os.O_RDONLY)
    try:
        assert os.pread(reader, 64 * KiB, 0) == content(3, 64 * KiB)
        os.unlink(pool / "k")
        assert read_errno(reader) == errno.EIO  # never the 64 KiB of zeros it once read
    finally:
        os.close(reader)
        os.close(writer)
    assert os.listdir(pool) == []


def test_a_reader_of_a_temporary_file_reads_the_page_it_became(mounted):
    pool = mounted.page_dir()
    data = content(4, 100 * KiB)
    writer = os.open(pool / ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    write_all(writer, data)
    reader = os.open(pool / ".tmp", os.O_RDONLY)
    try:
        os.close(writer)
        os.rename(pool / ".tmp", pool / "k")
        assert read_through(reader, len(data) + 1) == data
    finally:
        os.close(reader)


def test_a_page_replaced_by_a_smaller_one_leaves_its_reader_the_whole_old_page(mounted):
    pool = mounted.page_dir()
    old, new = content(5, MiB), content(6, 4 * KiB)
    publish(pool, "k", old)
    fd = os.open(pool / "k", os.O_RDONLY)
    try:
        assert os.pread(fd, 4 * KiB, 0) == old[: 4 * KiB]
        publish(pool, "k", new)
        st = os.fstat(fd)
        assert (st.st_size, st.st_nlink) == (MiB, 0)  # the old page, no longer linked
        assert read_through(fd, MiB + 1) == old
    finally:
        os.close(fd)
    assert read_page(pool / "k") == new and os.stat(pool / "k").st_size == len(new)


def test_a_direct_reader_of_a_replaced_page_reads_the_whole_old_page_from_the_daemon(mounted):
    pool = mounted.page_dir()
    old, new = content(7, MiB), content(8, 4 * KiB)
    publish(pool, "k", old)
    fd = os.open(pool / "k", os.O_RDONLY | os.O_DIRECT)  # past the kernel's cache: its handle's pin
    block = mmap.mmap(-1, MiB)  # page-aligned, as O_DIRECT needs
    try:
        publish(pool, "k", new)
        st = os.fstat(fd)
        assert (st.st_size, st.st_nlink) == (MiB, 0)
        reads = mounted.stats()["requests"].get("read", 0)
        assert os.preadv(fd, [block], 0) == MiB and block[:] == old
        assert mounted.stats()["requests"].get("read", 0) > reads
    finally:
        os.close(fd)
        block.close()
    assert read_page(pool / "k") == new

READER = r"""
import errno, json, os, sys, time
from hicachefs_testing.workload import identify
path, seconds = sys.argv[1], float(sys.argv[2])
counts = {"opens": 0, "whole": 0, "torn": 0, "errors": 0}
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        counts["errors"] += 1
        continue
    counts["opens"] += 1
    try:
        parts = []
        while piece := os.pread(fd, 65536, sum(map(len, parts))):
            parts.append(piece)
        counts["whole" if identify(b"".join(parts), "k") else "torn"] += 1
    except OSError:
        counts["errors"] += 1
    finally:
        os.close(fd)
print(json.dumps(counts))
"""


def test_opens_racing_replaces_of_their_name_find_one_whole_version(mounted):
    pool = mounted.page_dir()
    publish(pool, "k", labelled_content("k", 128 * KiB))
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(pool / "k"), "3"], stdout=subprocess.PIPE,
                                text=True) for _ in range(2)]
    try:
        generation = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # every replace changes the size too
            generation += 1
            publish(pool, "k", labelled_content("k", (128 - generation % 5 * 4) * KiB, 0, generation))
        counts = [json.loads(reader.communicate(timeout=60)[0]) for reader in readers]
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()
    opens = sum(c["opens"] for c in counts)
    assert opens > 100 and generation > 100
    assert [(c["torn"], c["errors"]) for c in counts] == [(0, 0), (0, 0)]
    assert sum(c["whole"] for c in counts) == opens


def ingest_one(mounted, key: str, data: bytes) -> None:
    """Replace the page ``key`` of the pool through ``.hicachefs/ingest``."""
    ingest = os.open(mounted.path / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        assert ingest_batch(ingest, [(f"{POOL}/{key}", data)]) > 0
    finally:
        os.close(ingest)


@pytest.mark.parametrize("how", ["rename", "ingest", "rm"])
def test_a_reopen_of_a_replaced_pages_open_file_reads_that_files_own_page(mounted, how):
    """``/proc/self/fd/N`` opens the inode of an open file again: the kernel's second try lands
    on that inode, not on the name's new page. It used to be served the name's current page
    past the kernel's cache, under the old inode's size; mapped privately, its faults filled the
    old inode's cache with the new page, which the file opened before the replace then read."""
    pool = mounted.page_dir()
    old, new = content(1, 64 * KiB), content(2, 128 * KiB)
    publish(pool, "k", old)
    fd = os.open(pool / "k", os.O_RDONLY)
    try:
        assert read_through(fd, MiB) == old
        if how == "rename":
            publish(pool, "k", new)
        elif how == "ingest":
            ingest_one(mounted, "k", new)
        else:
            os.unlink(pool / "k")
        again = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        try:
            assert os.fstat(again).st_size == len(old)
            assert read_through(again, MiB) == old
            with mmap.mmap(again, 0, prot=mmap.PROT_READ) as shared:
                assert shared[:] == old
            with mmap.mmap(again, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as private:
                assert private[:] == old
        finally:
            os.close(again)
        assert read_through(fd, MiB) == old
    finally:
        os.close(fd)
    if how != "rm":
        assert read_elsewhere(pool / "k") == new


def test_a_reopen_after_the_open_files_pin_ended_never_puts_the_new_page_under_its_inode(mounted):
    """A file read from the kernel's cache stops pinning its page 2 s after its last read that
    reached the daemon. Reopened (``/proc/self/fd/N``) after the page was replaced, it finds that
    version gone: EIO. It used to be served the new page, whose private mapping filled the old
    inode's cache with it, which the file opened before the replace then read, cut short. That
    file reads its page from the kernel's cache, or fails with EIO where the kernel let a cached
    block go (the version is no longer stored: the contract allows it; seen once in ten runs
    under load), never the new page's bytes."""
    pool = mounted.page_dir()
    old, new = content(1, 256 * KiB), content(2, 64 * KiB)
    publish(pool, "k", old)
    fd = os.open(pool / "k", os.O_RDONLY)
    try:
        assert read_through(fd, MiB) == old
        time.sleep(PIN_LEASE_S + 1)
        ingest_one(mounted, "k", new)
        try:
            again = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        except OSError as exc:
            assert exc.errno == errno.EIO
        else:
            try:
                with mmap.mmap(again, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as private:
                    assert private[: 4 * KiB] == old[: 4 * KiB]
            finally:
                os.close(again)
        try:
            assert read_through(fd, MiB) == old
        except OSError as exc:
            assert exc.errno == errno.EIO
    finally:
        os.close(fd)
    assert read_elsewhere(pool / "k") == new
