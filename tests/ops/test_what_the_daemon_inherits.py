"""What the daemon inherits from whoever starts it: a low open-files limit (reached for a moment
under load, or low from the start), a umask that lets others write."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

from hicachefs.daemon import daemon
from hicachefs_testing import mounting
from pages import publish, read_page


def test_a_daemon_out_of_file_descriptors_for_a_while_keeps_its_mount(mount_factory):
    """The look at the mount table each second (is the mount still there?) opens a file: with
    no descriptor to spare for a moment (a shared tier keeps up to 64 files open), its OSError
    ended the daemon, and the mount with it: every acknowledged page unreadable, nothing to
    restart it (found by review). The look is tried again, and a warning says why."""
    mount = mount_factory("--memory", "32M")
    page = publish(mount.page_dir(), "k0", b"acknowledged")
    limit = subprocess.run(["prlimit", "--pid", str(mount.pid), "--nofile", "--raw", "--noheadings",
                            "--output", "SOFT,HARD"], capture_output=True, text=True, check=True).stdout.split()
    held = len(os.listdir(f"/proc/{mount.pid}/fd"))
    subprocess.run(["prlimit", "--pid", str(mount.pid), f"--nofile={held}:{limit[1]}"], check=True)
    try:
        time.sleep(3 * daemon.DETACH_CHECK_S)
        assert mounting.alive(mount.pid)
    finally:
        subprocess.run(["prlimit", "--pid", str(mount.pid), f"--nofile={limit[0]}:{limit[1]}"], check=True)
    assert read_page(page) == b"acknowledged"
    assert "cannot read the mount table" in mount.log_text()


def test_a_daemon_takes_its_hard_open_files_limit(tmp_path):
    """Started from a shell whose soft limit is low (64 here, a unit's 1,024 elsewhere), the
    daemon ran out of descriptors under a shared tier's load (found by review): it raises its
    soft limit to the hard one at start."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    subprocess.run(["prlimit", "--nofile=64:4096", sys.executable, "-m", "hicachefs.cli", "mount", str(mountpoint),
                    "--memory", "32M", "--log-file", str(tmp_path / "daemon.log")], check=True, capture_output=True)
    try:
        pid = json.loads((mountpoint / ".hicachefs" / "config").read_text())["pid"]
        limits = subprocess.run(["prlimit", "--pid", str(pid), "--nofile", "--raw", "--noheadings",
                                 "--output", "SOFT,HARD"], capture_output=True, text=True, check=True).stdout.split()
        assert limits == ["4096", "4096"]
    finally:
        mounting.stop_if_mounted(mountpoint)


def test_a_daemon_started_under_umask_000_makes_nothing_others_may_write(tmp_path):
    """Started under ``umask 000``, the daemon made the shared tier's directories and the disk
    tier's snapshot world-writable, and another user renamed a forged page file over a shared
    page that the clients then served (found by review)."""
    mountpoint, shared, disk = tmp_path / "mnt", tmp_path / "shared", tmp_path / "ssd"
    mountpoint.mkdir()
    flags = ["--memory", "32M", "--disk", str(disk), "--disk-size", "64M", "--shared", str(shared)]
    command = [sys.executable, "-m", "hicachefs.cli", "mount", str(mountpoint), "--log-file",
               str(tmp_path / "daemon.log"), *flags]
    subprocess.run(command, check=True, capture_output=True, preexec_fn=lambda: os.umask(0))
    mount = mounting.Mount(mountpoint, tmp_path / "daemon.log", flags,
                           json.loads((mountpoint / ".hicachefs" / "config").read_text())["pid"])
    try:
        for i in range(4):
            publish(mount.page_dir(), f"k{i}", bytes([i]) * 4096)
        deadline = time.monotonic() + 10
        while len([f for f in shared.rglob("*") if f.is_file()]) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)  # written behind to the shared tier
    finally:
        mounting.stop(mount)
    made = [path for path in [*shared.rglob("*"), *disk.iterdir()] if path != shared]
    writable = [str(path) for path in made if path.lstat().st_mode & stat.S_IWOTH]
    assert len([path for path in made if path.is_file()]) >= 4 and writable == []
