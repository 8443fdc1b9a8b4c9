"""fio with ``verify=crc32c`` writing and reading pages through the mount.

What works: a write job with ``create_on_open=1`` (the file is created by the job's own
open, written, and published at its last close, as DESIGN.md allows for a file created
directly under a key name), then a separate read job with the same ``verify`` that checks
every block; also a write to a ``.name`` temporary file renamed to its key (the client's
protocol), several jobs at once, O_DIRECT, and a verify after a remount from the disk tier.
What cannot work, by contract: fio's default layout step creates the file, closes it (which
publishes it) and reopens it for writing, which fails with EPERM (pages are immutable); so
does ``verify_only`` on a write job and ``do_verify=1`` (both reopen the page read-write).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from hicachefs_testing import mounting
from hicachefs_testing.workload import labelled_content, publish

FIO = shutil.which("fio") or "/usr/bin/fio"


def fio(pool, *args: str) -> subprocess.CompletedProcess:
    # verify_state_save=0: a write job would otherwise leave *-verify.state files in the cwd.
    return subprocess.run(
        [FIO, "--name=page", f"--directory={pool}", "--bs=64k", "--size=4m", "--ioengine=psync",
         "--verify=crc32c", "--verify_state_save=0", *args],
        capture_output=True, text=True, timeout=120, cwd=pool.parents[4],
    )


def _ok(result) -> bool:
    return result.returncode == 0 and "err= 0" in result.stdout


def test_fio_write_then_verify_read_through_the_mount(mounted):
    pool = mounted.page_dir()
    for direct in ("0", "1"):
        name = f"fio-direct{direct}"
        written = fio(pool, "--rw=write", f"--filename={name}", "--create_on_open=1", "--do_verify=0",
                      f"--direct={direct}")
        assert _ok(written), written.stdout + written.stderr
        assert (pool / name).stat().st_mode & 0o777 == 0o444  # published at close
        for rw in ("read", "randread"):
            verified = fio(pool, f"--rw={rw}", f"--filename={name}", f"--direct={direct}")
            assert _ok(verified), verified.stdout + verified.stderr


def test_fio_four_jobs_and_the_temporary_file_protocol(mounted):
    pool = mounted.page_dir()
    written = fio(pool, "--rw=write", "--numjobs=4", "--filename_format=page.$jobnum", "--create_on_open=1",
                  "--do_verify=0")
    assert _ok(written), written.stdout + written.stderr
    assert _ok(fio(pool, "--rw=read", "--numjobs=4", "--filename_format=page.$jobnum"))
    tmp = fio(pool, "--rw=write", "--filename=.fio-tmp", "--create_on_open=1", "--do_verify=0")
    assert _ok(tmp), tmp.stdout + tmp.stderr
    os.rename(pool / ".fio-tmp", pool / "published")
    assert _ok(fio(pool, "--rw=read", "--filename=published"))
    assert sorted(os.listdir(pool)) == ["page.0", "page.1", "page.2", "page.3", "published"]


def test_fio_verify_catches_a_page_that_is_not_fios(mounted):
    """The verify read can fail: a page of other bytes does not pass."""
    pool = mounted.page_dir()
    publish(pool, "other", labelled_content("other", 4 << 20))
    result = fio(pool, "--rw=read", "--filename=other")
    assert result.returncode != 0 and "verify" in (result.stdout + result.stderr).lower()


def test_fio_default_layout_reopens_a_published_page_and_gets_eperm(mounted):
    pool = mounted.page_dir()
    result = fio(pool, "--rw=write", "--filename=laid-out", "--do_verify=0")
    assert result.returncode != 0 and "err=1/" in result.stdout + result.stderr  # errno 1: EPERM
    assert mounting.alive(mounted.pid)


def test_fio_pages_verify_after_a_remount_from_disk(mount_factory, tmp_path):
    flags = ["--memory", "64M", "--max-page-size", "8M", "--disk", str(tmp_path / "disk"), "--disk-size", "128M"]
    mount = mount_factory(*flags)
    pool = mount.page_dir()
    written = fio(pool, "--rw=write", "--numjobs=4", "--filename_format=page.$jobnum", "--create_on_open=1",
                  "--do_verify=0", "--size=6m")
    assert _ok(written), written.stdout + written.stderr
    mounting.stop(mount)
    mount = mount_factory(*flags, path=mount.path)
    pool = mount.page_dir()
    assert sorted(os.listdir(pool)) == ["page.0", "page.1", "page.2", "page.3"]
    verified = fio(pool, "--rw=read", "--numjobs=4", "--filename_format=page.$jobnum", "--size=6m")
    assert _ok(verified), verified.stdout + verified.stderr
