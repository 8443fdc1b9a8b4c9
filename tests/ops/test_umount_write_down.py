"""``hicachefs umount`` waits for a daemon writing a large RAM tier down as long as it makes
progress, and says so now and then; it gave up after 60 s before, and the operator, told that
the daemon "did not finish", might kill it and lose the write-down. It gives up on a daemon
that makes no progress for the stall window (``HICACHEFS_UMOUNT_STALL_S`` here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import publish, read_page

#: Named so that ``mounting.stop`` knows its process for a hicachefs daemon.
SLOW_DAEMON = Path(__file__).with_name("hicachefs_slow_write_down.py")
#: The stall window the tests give umount, and how long each page's write-down waits.
STALL_S = 2.0


def start_slow_daemon(tmp_path: Path, delay: float, flags: list[str]) -> tuple[subprocess.Popen, mounting.Mount]:
    """A foreground daemon whose write-down waits ``delay`` s a page; returned once it answers."""
    path, log = tmp_path / "mnt", tmp_path / "hicachefs.log"
    path.mkdir()
    with open(log, "wb") as stderr:  # a foreground daemon logs to stderr
        daemon = subprocess.Popen([sys.executable, str(SLOW_DAEMON), str(delay), str(path), *flags],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    mount = mounting.Mount(path, log, flags, pid=daemon.pid)
    for _ in range(1200):
        try:
            if json.loads((path / ".hicachefs" / "config").read_text())["pid"] == daemon.pid:
                return daemon, mount
        except (OSError, ValueError):
            pass
        if daemon.poll() is not None:
            break
        time.sleep(0.05)
    daemon.kill()  # the test's own child, by its PID; and whatever it mounted goes too
    daemon.wait()
    mounting.unmount_path(path)
    raise AssertionError("the slow daemon did not mount:\n" + mount.log_text())


def umount(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hicachefs.cli", "umount", str(path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HICACHEFS_UMOUNT_STALL_S": str(STALL_S)})


def test_umount_waits_for_a_write_down_longer_than_its_stall_window(mount_factory, tmp_path):
    flags = ["--memory", "64M", "--disk", str(tmp_path / "ssd"), "--disk-size", "128M"]
    daemon, mount = start_slow_daemon(tmp_path, STALL_S / 4, flags)
    try:
        pages = {f"k{i}": content(i, 1 << 20) for i in range(16)}  # 16 pages of STALL_S / 4: 4 windows
        for key, data in pages.items():
            publish(mount.page_dir(), key, data)
        result = umount(mount.path)
        assert (result.returncode, result.stdout) == (0, f"hicachefs: unmounted {mount.path}\n"), result.stderr
        lines = result.stderr.splitlines()
        assert lines and all(f"daemon {daemon.pid} is writing its RAM tier down to disk" in line
                             for line in lines), result.stderr
        assert daemon.wait(5) == 0 and "store closed" in mount.log_text()
    finally:
        mounting.stop(mount)
        daemon.wait()
    again = mount_factory(*flags, path=mount.path)
    assert again.stats()["tiers"]["disk"]["pages"] == len(pages)
    for key, data in pages.items():
        assert read_page(again.page_dir() / key) == data


def test_umount_of_a_daemon_without_a_disk_tier_speaks_of_no_write_down(tmp_path):
    """A RAM-only daemon slow to exit (a large arena freed) was said to be "writing its RAM tier
    down to disk: 0 MiB written", though it has no disk."""
    daemon, mount = start_slow_daemon(tmp_path, 2.5, ["--memory", "32M"])
    try:
        result = umount(mount.path)
        assert (result.returncode, result.stdout) == (0, f"hicachefs: unmounted {mount.path}\n"), result.stderr
        lines = result.stderr.splitlines()
        assert lines and all(f"daemon {daemon.pid} is freeing its memory (it has no disk tier)" in line
                             for line in lines), result.stderr
    finally:
        mounting.stop(mount)
        daemon.wait()


def test_umount_gives_up_on_a_daemon_that_makes_no_progress(tmp_path):
    flags = ["--memory", "64M", "--disk", str(tmp_path / "ssd"), "--disk-size", "128M"]
    daemon, mount = start_slow_daemon(tmp_path, 3600, flags)  # its write-down never goes on
    try:
        publish(mount.page_dir(), "k", content(1, 1 << 20))
        result = umount(mount.path)
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr.splitlines()[-1] == (
            f"hicachefs: unmounted {mount.path}, but daemon {daemon.pid} made no progress writing its RAM tier "
            f"down for {STALL_S:g} s; gave up waiting for it (it still runs)")
        assert daemon.poll() is None
    finally:
        daemon.kill()  # a stop signal is ignored during the write-down; the process is this test's child
        daemon.wait()
        mounting.unmount_path(mount.path)
