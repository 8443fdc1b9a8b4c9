"""A file with a failed write is never published: not by rename, not at its last close.

Its writer gets the error at the write (and again at later writes); a rename of such a
temporary file fails with EIO. A file
created directly under a key name is published at its last close with what was written (as on
any filesystem, a writer killed mid-copy leaves a short page: renaming a temporary file is the
atomic way)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from hicachefs_testing.workload import content, exists_query, fill_writing_share
from pages import publish, read_page, write_all

MiB = 1 << 20
POOL = ("model", "bfloat16-page_first-64", "tp0of1", "kv")


def _not_published(mount, pool, key: str) -> None:
    assert key not in os.listdir(pool)
    assert exists_query(mount.path, ["/".join(POOL) + f"/{key}"]) == "0"
    deadline = time.monotonic() + 1.0  # the kernel is told to forget the name given at create
    while os.path.lexists(pool / key) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.lexists(pool / key)


def _write_past_the_maximum(path, seed: int) -> None:
    """Create ``path``, write half a MiB, then a byte at 1 MiB (past --max-page-size 1M): EFBIG."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, content(seed, MiB // 2))
        with pytest.raises(OSError) as info:
            os.pwrite(fd, b"x", MiB)
        assert info.value.errno == errno.EFBIG
    finally:
        os.close(fd)


def test_cp_of_a_file_over_the_maximum_page_size_fails_and_publishes_nothing(mount_factory, tmp_path):
    mount = mount_factory("--memory", "64M", "--max-page-size", "1M")
    pool = mount.page_dir(*POOL)
    source = tmp_path / "big.bin"
    source.write_bytes(content(1, 3 * MiB))
    result = subprocess.run(["cp", str(source), str(pool / "big")], capture_output=True, text=True)
    assert result.returncode != 0 and "File too large" in result.stderr, result.stderr
    _not_published(mount, pool, "big")
    publish(pool, "big", content(2, MiB))  # the key is free: a whole page can be published
    assert read_page(pool / "big") == content(2, MiB)


def test_a_sparse_cp_of_a_file_over_the_maximum_page_size_fails_and_publishes_nothing(mount_factory, tmp_path):
    mount = mount_factory("--memory", "64M", "--max-page-size", "1M")
    pool = mount.page_dir(*POOL)
    source = tmp_path / "sparse.bin"
    with open(source, "wb") as made:
        made.truncate(3 * MiB)  # all hole: cp only sets the copy's size (and fails to)
    result = subprocess.run(["cp", str(source), str(pool / "sparse")], capture_output=True, text=True)
    assert result.returncode != 0 and "File too large" in result.stderr, result.stderr
    _not_published(mount, pool, "sparse")


def test_a_temporary_file_with_a_write_over_the_maximum_cannot_be_renamed_into_a_page(mount_factory):
    mount = mount_factory("--memory", "64M", "--max-page-size", "1M")
    pool = mount.page_dir(*POOL)
    tmp = pool / ".tmp-failed"
    _write_past_the_maximum(tmp, seed=3)
    _rename_fails_and_the_key_stays_free(mount, pool, tmp)


def test_a_temporary_file_whose_write_found_no_room_cannot_be_renamed_into_a_page(mount_factory):
    mount = mount_factory("--memory", "16M")  # pages up to 2 MiB, 1/8 of the RAM tier
    pool = mount.page_dir(*POOL)
    tmp = pool / ".tmp-failed"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        held = fill_writing_share(pool, 2 * MiB)  # files being written hold all they may
        with pytest.raises(OSError) as info:
            os.pwrite(fd, content(3, 2 * MiB), 0)
        assert info.value.errno == errno.ENOSPC
        for path in held:
            os.unlink(path)
        with pytest.raises(OSError) as info:  # there is room again, but the file lost a write
            os.pwrite(fd, content(3, 2 * MiB), 0)
        assert info.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    _rename_fails_and_the_key_stays_free(mount, pool, tmp)


def _rename_fails_and_the_key_stays_free(mount, pool, tmp) -> None:
    with pytest.raises(OSError) as info:
        os.rename(tmp, pool / "page")
    assert info.value.errno == errno.EIO
    _not_published(mount, pool, "page")
    os.unlink(tmp)
    publish(pool, "page", content(4, MiB))
    assert read_page(pool / "page") == content(4, MiB)


def test_a_file_created_under_a_key_with_a_failed_write_is_not_published_at_close(mount_factory):
    mount = mount_factory("--memory", "64M", "--max-page-size", "1M")
    pool = mount.page_dir(*POOL)
    _write_past_the_maximum(pool / "direct", seed=5)
    _not_published(mount, pool, "direct")


def test_a_writer_killed_mid_copy_under_a_key_leaves_a_short_page(mounted):
    """The documented promise of direct creation: what was written is published at the last
    close, which the kernel does for a killed process too."""
    pool = mounted.page_dir(*POOL)
    writer = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        f"fd = os.open({str(pool / 'killed')!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)\n"
        "os.write(fd, b'k' * 65536)\n"
        "print('written', flush=True)\n"
        "time.sleep(60)\n"
    )], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "written"
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
    assert read_page(pool / "killed") == b"k" * 65536
