"""Bad names and misplaced requests get a clear errno; the daemon keeps serving."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hicachefs_testing import mounting
from pages import as_nobody, publish, read_page


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as info:
        call(*args)
    return info.value.errno


def test_bad_directory_names(mounted):
    root = mounted.path
    assert errno_of(os.mkdir, root / ".hidden") == errno.EINVAL
    assert errno_of(os.mkdir, root / ("x" * 201)) == errno.ENAMETOOLONG
    assert errno_of(os.mkdir, root / "bad\udcff") == errno.EINVAL
    os.mkdir(root / ("y" * 200))


def test_files_only_in_pool_directories_and_no_deeper_directories(mounted):
    assert errno_of(os.open, mounted.path / "file", os.O_WRONLY | os.O_CREAT) == errno.EPERM
    pool = mounted.page_dir()
    assert errno_of(os.mkdir, pool / "deeper") == errno.EPERM
    assert errno_of(os.open, pool / ("k" * 201), os.O_WRONLY | os.O_CREAT) == errno.ENAMETOOLONG


def test_unknown_paths_and_directory_rules(mounted):
    pool = mounted.page_dir()
    assert errno_of(os.stat, pool / "missing") == errno.ENOENT
    assert errno_of(os.open, pool / "missing", os.O_RDONLY) == errno.ENOENT
    assert errno_of(os.unlink, pool / "missing") == errno.ENOENT
    publish(pool, "k", b"data")
    assert errno_of(os.rmdir, pool) == errno.ENOTEMPTY
    assert errno_of(os.mkdir, pool.parent) == errno.EEXIST
    assert errno_of(os.rename, pool.parent, mounted.path / "elsewhere") == errno.EXDEV
    assert read_page(pool / "k") == b"data"


def test_renaming_a_page_moves_it(mounted):
    pool = mounted.page_dir()
    publish(pool, "old", b"payload")
    os.rename(pool / "old", pool / "new")
    assert not (pool / "old").exists()
    assert read_page(pool / "new") == b"payload"


def test_other_users_may_read_but_not_change(public_mount):
    mounted = public_mount
    pool = mounted.page_dir()
    publish(pool, "k", b"shared page")

    assert as_nobody("cat", str(pool / "k")).stdout == "shared page"
    assert as_nobody("ls", str(pool)).stdout.split() == ["k"]
    for command in (["mkdir", str(mounted.path / "new")], ["touch", str(pool / ".tmp")],
                    ["rm", "-f", str(pool / "k")], ["mv", str(pool / "k"), str(pool / "k2")]):
        result = as_nobody(*command)
        assert result.returncode != 0 and "ermission denied" in result.stderr, command
    assert read_page(pool / "k") == b"shared page"
