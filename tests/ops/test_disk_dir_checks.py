"""What ``hicachefs mount`` refuses about ``--disk``, in one line with exit status 2 before
anything is mounted or started: a directory whose arena another daemon holds, an arena file
that is not ours (left exactly as it was), a directory the mount itself would hide."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from hicachefs.daemon.config import DaemonConfig
from hicachefs.store import PageStore, StoreConfig
from hicachefs.store.ssd.device import ArenaRefused, FileDevice
from hicachefs.store.ssd.ssd_tier import ARENA_NAME
from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import publish, read_page

DISK = ["--disk-size", "64M"]


def mount_command(mountpoint: Path, disk: Path | str, log: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hicachefs.cli", "mount", str(mountpoint), "--memory", "32M",
                           "--disk", str(disk), *DISK, "--log-file", str(log)],
                          capture_output=True, text=True, timeout=120)


def refused(result: subprocess.CompletedProcess, mountpoint: Path, log: Path) -> str:
    """The one line of a refusal (without the 'hicachefs: ' prefix), checked to have started nothing."""
    mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)
    assert not mounted and result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and result.stderr.startswith("hicachefs: ") and result.stderr.count("\n") == 1
    assert not log.exists()
    return result.stderr[len("hicachefs: "):-1]


def test_a_second_daemon_on_one_disk_directory_is_refused(mount_factory, tmp_path):
    disk = tmp_path / "ssd"
    first = mount_factory("--memory", "32M", "--disk", str(disk), *DISK, "--write-through")
    publish(first.page_dir(), "k", content(1, 1 << 20))
    second, log = tmp_path / "second", tmp_path / "second.log"
    second.mkdir()
    line = refused(mount_command(second, disk, log), second, log)
    assert line == f"--disk {disk}: {disk / ARENA_NAME} is in use by another hicachefs daemon (pid {first.pid})"
    # The daemon holds the arena for its life, not only while the command checks it.
    with pytest.raises(ArenaRefused):
        PageStore(StoreConfig(memory_bytes=16 << 20, disk_dir=disk, disk_bytes=64 << 20, max_page_size=1 << 20)).close()
    assert read_page(first.page_dir() / "k") == content(1, 1 << 20)
    mounting.stop(first)
    again = mount_factory("--memory", "32M", "--disk", str(disk), *DISK, path=second)  # free once it is gone
    assert read_page(again.page_dir() / "k") == content(1, 1 << 20)


def fingerprint(path: Path) -> tuple:
    status = os.stat(path)
    return status.st_size, hashlib.sha256(path.read_bytes()).hexdigest(), status.st_mtime_ns


def test_a_symlinked_arena_is_refused_and_its_target_left_as_it_was(tmp_path):
    mountpoint, disk, log, target = tmp_path / "mnt", tmp_path / "ssd", tmp_path / "daemon.log", tmp_path / "zeros"
    mountpoint.mkdir()
    disk.mkdir()
    target.write_bytes(bytes(1 << 20))
    (disk / ARENA_NAME).symlink_to(target)
    before = fingerprint(target)
    line = refused(mount_command(mountpoint, disk, log), mountpoint, log)
    assert line == f"--disk {disk}: {disk / ARENA_NAME} is a symbolic link (to {target}): refusing to use it"
    assert fingerprint(target) == before


def test_a_foreign_file_larger_than_the_tier_is_refused_and_not_truncated(tmp_path):
    mountpoint, disk, log = tmp_path / "mnt", tmp_path / "ssd", tmp_path / "daemon.log"
    mountpoint.mkdir()
    disk.mkdir()
    arena = disk / ARENA_NAME
    arena.write_bytes(bytes(4096) + content(7, 80 << 20))  # zeros first, then 80 MiB of someone's data
    before = fingerprint(arena)
    line = refused(mount_command(mountpoint, disk, log), mountpoint, log)
    assert line == (f"--disk {disk}: {arena} is not a hicachefs disk arena (a file of {before[0]:,} bytes; "
                    "its first 4 KiB are zeros): refusing to overwrite it")
    assert fingerprint(arena) == before


@pytest.mark.parametrize("where", ["the mountpoint", "a directory in it", "a symlink into it"])
def test_a_disk_directory_the_mount_would_hide_is_refused(tmp_path, where):
    mountpoint, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mountpoint.mkdir()
    disk = {"the mountpoint": mountpoint, "a directory in it": mountpoint / "ssd",
            "a symlink into it": tmp_path / "link"}[where]
    if where == "a symlink into it":
        disk.symlink_to(mountpoint / "ssd")
    line = refused(mount_command(mountpoint, disk, log), mountpoint, log)
    assert line == f"--disk {disk} is the mountpoint or inside it: the mount would hide the disk tier"
    assert list(mountpoint.iterdir()) == []  # nothing made in it either


def test_the_daemon_itself_refuses_an_arena_another_process_holds(tmp_path):
    """What a second daemon that passed the command's check a moment before the first took the
    arena meets: one ERROR line in its log, no traceback, nothing mounted."""
    mountpoint, disk, log = tmp_path / "mnt", tmp_path / "ssd", tmp_path / "daemon.log"
    mountpoint.mkdir()
    disk.mkdir()
    config = DaemonConfig(mountpoint=str(mountpoint), memory_bytes=32 << 20, disk_dir=str(disk), disk_bytes=64 << 20,
                          write_through=False, max_page_size=4 << 20, log_level="INFO", log_file=str(log))
    holder = FileDevice(disk / ARENA_NAME)
    daemon = subprocess.Popen([sys.executable, "-m", "hicachefs.daemon", json.dumps(asdict(config))])
    try:
        status = daemon.wait(timeout=60)
    finally:
        holder.close()
        if daemon.poll() is None:  # it mounted after all: stop it, as a refused start never runs
            daemon.terminate()
            daemon.wait(timeout=60)
        mounted = mounting.is_mounted(mountpoint)
        mounting.unmount_path(mountpoint)
    assert status == 1 and not mounted
    errors = [line for line in log.read_text().splitlines() if " ERROR " in line or "Traceback" in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"cannot open the store: {disk / ARENA_NAME} is in use by another hicachefs daemon (pid {os.getpid()})")


def test_an_arena_that_cannot_be_opened_is_one_line_and_left_as_it_was(tmp_path):
    """An arena that even root may not open for writing (immutable, ``chattr +i``): the check
    that it is ours opened it and died with a PermissionError traceback."""
    disk = tmp_path / "disk"
    disk.mkdir()
    arena = disk / ARENA_NAME
    arena.write_bytes(b"\0" * 4096)
    if subprocess.run(["chattr", "+i", str(arena)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        mountpoint, log = tmp_path / "mnt", tmp_path / "log"
        mountpoint.mkdir()
        result = mount_command(mountpoint, disk, log)
        assert "Traceback" not in result.stderr, result.stderr
        line = refused(result, mountpoint, log)
        assert f"{arena} cannot be opened: Operation not permitted" in line, line
    finally:
        subprocess.run(["chattr", "-i", str(arena)], capture_output=True)
    assert arena.read_bytes() == b"\0" * 4096


#: ``hicachefs mount`` with the arena's sector at argv[1] unreadable (EIO), as a disk's bad block.
BAD_SECTOR_MOUNT = """
import errno, sys
from hicachefs.cli import main
from hicachefs.store.ssd.device import FileDevice
bad, read = int(sys.argv[1]), FileDevice.pread
def pread(self, size, offset):
    if offset < bad + 512 and bad < offset + size:
        raise OSError(errno.EIO, "Input/output error")
    return read(self, size, offset)
FileDevice.pread = pread
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("bad", [0, 3584], ids=["first copy", "second copy"])
def test_an_arena_whose_superblock_block_cannot_be_read_is_one_line_saying_what_to_do(tmp_path, bad):
    """A bad sector under either copy of the superblock: both lie in one 4 KiB block, which the
    page cache reads whole, so neither serves. The start died with a raw OSError, and the
    command's line named no file (found by review): it names the arena and what to do."""
    mountpoint, disk, log = tmp_path / "mnt", tmp_path / "ssd", tmp_path / "daemon.log"
    mountpoint.mkdir()
    store = PageStore(StoreConfig(memory_bytes=16 << 20, disk_dir=disk, disk_bytes=64 << 20, max_page_size=1 << 20,
                                  write_through=True))
    store.put("d/a", b"abc")
    store.close()
    arena = disk / ARENA_NAME
    before = fingerprint(arena)
    result = subprocess.run([sys.executable, "-c", BAD_SECTOR_MOUNT, str(bad), "mount", str(mountpoint),
                             "--memory", "32M", "--disk", str(disk), *DISK, "--log-file", str(log)],
                            capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    line = refused(result, mountpoint, log)
    assert line == (f"--disk {disk}: {arena}: its first 4 KiB, which hold the superblock, cannot be read "
                    "(Input/output error): remove it to start with an empty disk tier")
    assert fingerprint(arena) == before
