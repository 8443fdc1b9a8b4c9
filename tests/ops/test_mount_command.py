"""``mount -t fuse.hicachefs`` and fstab lines, through mount(8) and fuse3's mount.fuse3."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import publish, read_page


def wait_gone(pid: int) -> None:
    assert mounting.wait_gone(pid, 60), f"daemon {pid} still runs after the unmount"


def test_mount_t_and_fstab_line_mount_and_umount_cleanly(mount_namespace, tmp_path):
    ns = mount_namespace
    mnt, disk = tmp_path / "mnt", tmp_path / "ssd"
    mnt.mkdir()
    log = ns.log_dir / "daemon.log"
    options = f"memory=64M,disk={disk},disk_size=256M,max_page_size=4M,log_file={log}"

    result = ns.run("mount", "-t", "fuse.hicachefs", "hicachefs", str(mnt), "-o", options + ",nosuid,noatime")
    assert result.returncode == 0, result.stderr
    fstype, mount_flags = ns.mounts()[str(mnt)]
    assert fstype == "fuse.hicachefs"
    assert {"nosuid", "noatime"} <= set(mount_flags.split(","))
    config = json.loads((ns.outside(mnt) / ".hicachefs" / "config").read_text())
    assert (config["memory_bytes"], config["disk_bytes"], config["max_page_size"]) == (64 << 20, 256 << 20, 4 << 20)
    pool = ns.outside(mnt) / "m" / "bfloat16-page_first-64" / "tp0of1" / "kv"
    pool.mkdir(parents=True)
    pages = {f"k{i}": content(i, 1 << 20) for i in range(8)}
    for key, data in pages.items():
        publish(pool, key, data)
    pid = ns.daemon_pid(mnt)

    # umount(8) from outside: the daemon sees the mount go, writes RAM down and exits.
    result = ns.run("umount", str(mnt))
    assert result.returncode == 0, result.stderr
    wait_gone(pid)
    assert str(mnt) not in ns.mounts()
    assert "store closed" in log.read_text()

    # The same mount as an fstab line, with the options mount(8), systemd and fstab add.
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# a comment\nhicachefs {mnt} fuse.hicachefs "
                     f"defaults,_netdev,nofail,x-systemd.requires=network-online.target,relatime,"
                     f"allow_other,{options} 0 0\n")
    result = ns.run("mount", "--fstab", str(fstab), str(mnt))
    assert result.returncode == 0, result.stderr
    pid = ns.daemon_pid(mnt)
    stats = json.loads((ns.outside(mnt) / ".hicachefs" / "stats").read_text())
    assert stats["tiers"]["disk"]["pages"] == len(pages) and stats["tiers"]["memory"]["pages"] == 0
    for key, data in pages.items():
        assert read_page(pool / key) == data
    result = ns.run("umount", str(mnt))
    assert result.returncode == 0, result.stderr
    wait_gone(pid)
    assert str(mnt) not in ns.mounts()


@pytest.mark.parametrize("options, message", [
    ("memory=64M,bogus=1", "unknown mount option bogus"),
    ("memory=64M,disk-size=1G", "write it disk_size"),
    ("memory", "takes a value"),
    ("memory=64M,write_through=yes", "takes no value"),
    ("memory=64M,ro", "always writable"),
    ("memory=lots", "bad size"),
    ("memory=64M,log_level=LOUD", "invalid choice: 'LOUD'"),
    ("memory=10T", "--memory 10T is more than the"),
])
def test_bad_mount_options_give_one_line_and_mount_nothing(mount_namespace, tmp_path, options, message):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = mount_namespace.run("mount", "-t", "fuse.hicachefs", "hicachefs", str(mnt), "-o", options)
    assert result.returncode != 0
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert str(mnt) not in mount_namespace.mounts()
    # The command mount.fuse3 runs, by itself: usage errors exit with 2.
    direct = subprocess.run([sys.executable, "-m", "hicachefs.cli", "hicachefs", str(mnt), "-o", options],
                            capture_output=True, text=True, timeout=60)
    assert direct.returncode == 2 and message in direct.stderr and direct.stderr.count("\n") == 1
    assert not mounting.is_mounted(mnt)


def test_o_options_and_flags_combine_on_the_mount_command(mount_factory):
    mount = mount_factory("-o", "memory=32M,max_page_size=1M", "--temp-timeout", "30")
    config = json.loads((mount.path / ".hicachefs" / "config").read_text())
    assert (config["memory_bytes"], config["max_page_size"], config["temp_timeout_s"]) == (32 << 20, 1 << 20, 30)


def test_stop_signals_during_the_write_down_do_not_cut_it_short(mount_factory, tmp_path):
    """systemd stops an fstab mount with umount, then SIGTERM to what is left of its processes."""
    flags = ["--memory", "256M", "--disk", str(tmp_path / "ssd"), "--disk-size", "512M"]
    mount = mount_factory(*flags)
    pool = mount.page_dir()
    pages = {f"k{i}": content(i, 1 << 20) for i in range(160)}
    for key, data in pages.items():
        publish(pool, key, data)
    assert mount.stats()["tiers"]["disk"]["pages"] == 0  # all of them only in RAM
    subprocess.run(["umount", str(mount.path)], check=True)
    signals = 0
    while mounting.alive(mount.pid):
        try:
            os.kill(mount.pid, signal.SIGTERM)
            signals += 1
        except ProcessLookupError:
            break
        time.sleep(0.002)
    assert signals > 1 and "store closed" in mount.log_text()
    again = mount_factory(*flags, path=mount.path)
    assert again.stats()["tiers"]["disk"]["pages"] == len(pages)
    for key, data in pages.items():
        assert read_page(pool / key) == data


def test_a_log_file_rotated_by_renaming_gets_the_lines_after_it(mount_factory):
    """logrotate's ``create`` rotation renames the log and makes a new one: the daemon went on
    writing into the renamed file for good (into a deleted one once compressed), the new one
    empty (found by review). Its next line goes to a new file at the log's path."""
    mount = mount_factory("--memory", "32M")
    rotated = mount.log_file.with_name(mount.log_file.name + ".1")
    mount.log_file.rename(rotated)
    mounting.stop(mount)
    assert "store closed" in mount.log_file.read_text()
    assert "store closed" not in rotated.read_text()


def test_a_log_directory_removed_costs_its_lines_not_the_clean_stop(tmp_path):
    """With the log opened again once moved, a log whose directory was removed made every line
    raise: the stop's first line ended the daemon before the disk tier's snapshot, and the next
    start scanned the arena as after a crash (found by review). The lines are lost, the stop is
    clean."""
    mountpoint, logs, disk = tmp_path / "mnt", tmp_path / "logs", tmp_path / "ssd"
    mountpoint.mkdir()
    logs.mkdir()
    flags = ["--memory", "32M", "--disk", str(disk), "--disk-size", "64M"]
    mount = mounting.start(mountpoint, logs / "daemon.log", flags)
    try:
        for i in range(4):
            publish(mount.page_dir(), f"k{i}", content(i, 64 << 10))
        shutil.rmtree(logs)
        stderr = Path(f"/proc/{mount.pid}/fd/2")  # the log as the mount command opened it, now deleted
        before = stderr.stat().st_size
        fd = os.open(mount.page_dir() / "too-large", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            with pytest.raises(OSError):  # EFBIG past --max-page-size: a refusal, a line to log
                for _ in range(64):
                    os.write(fd, bytes(1 << 20))
        finally:
            os.close(fd)
        assert stderr.stat().st_size == before  # lost quietly, not a 4 KiB traceback on stderr each
    finally:
        mounting.stop(mount)
    again = mounting.start(mountpoint, tmp_path / "again.log", flags)
    try:
        assert "not unmounted cleanly" not in again.log_text()
        assert again.stats()["pages"] == 4
    finally:
        mounting.stop(again)


def test_a_log_directory_made_again_with_a_symlink_in_it_leads_the_log_nowhere(tmp_path):
    """The log's directory removed (a temp-dir cleaner, an operator's rm) and made again by
    another user with a symlink under the log's name: the daemon (root's) followed it at its
    next reopen and appended its lines to the file the symlink named (found by review)."""
    mountpoint, logs, victim = tmp_path / "mnt", tmp_path / "logs", tmp_path / "victim"
    mountpoint.mkdir()
    logs.mkdir()
    victim.write_text("root's alone\n")
    mount = mounting.start(mountpoint, logs / "daemon.log", ["--memory", "32M"])
    try:
        shutil.rmtree(logs)
        logs.mkdir()
        (logs / "daemon.log").symlink_to(victim)
    finally:
        mounting.stop(mount)  # its stop's lines
    assert victim.read_text() == "root's alone\n"


def test_a_log_directory_removed_and_made_again_by_its_owner_gets_the_log_again(tmp_path):
    """Once its directory was removed (a tmpfs at /run/user unmounted at logout, an rm -r), the
    log was written into the removed directory for the daemon's whole life, nothing at its path
    when the directory came back (found by review)."""
    mountpoint, logs = tmp_path / "mnt", tmp_path / "logs"
    mountpoint.mkdir()
    logs.mkdir()
    mount = mounting.start(mountpoint, logs / "daemon.log", ["--memory", "32M"])
    try:
        shutil.rmtree(logs)
        logs.mkdir()
    finally:
        mounting.stop(mount)  # its stop's lines
    assert "store closed" in (logs / "daemon.log").read_text()


def test_a_fifo_planted_at_the_logs_name_gets_no_line(tmp_path):
    """A FIFO put at the log's name once the log was removed held every logging thread of the
    daemon in its open for good, or, with a reader on it, handed that reader the log's lines
    (found by review). Only a regular file is written to."""
    mountpoint, logs = tmp_path / "mnt", tmp_path / "logs"
    mountpoint.mkdir()
    logs.mkdir()
    mount = mounting.start(mountpoint, logs / "daemon.log", ["--memory", "32M"])
    reader = None
    try:
        (logs / "daemon.log").unlink()
        os.mkfifo(logs / "daemon.log")
        reader = os.open(logs / "daemon.log", os.O_RDONLY | os.O_NONBLOCK)  # (a writer's open never waits)
    finally:
        mounting.stop(mount)  # its stop's lines
    try:
        assert os.read(reader, 1 << 16) == b""
    finally:
        os.close(reader)


def test_a_log_directory_replaced_by_a_new_one_at_its_path_gets_the_log(tmp_path):
    """A tmpfs at /run/user unmounted lazily at logout and mounted anew at login leaves the old
    directory linked but out of reach: the log went on into it, the new one empty for the
    daemon's whole life (found by review). The directory at the path is taken up again."""
    mountpoint, logs = tmp_path / "mnt", tmp_path / "logs"
    mountpoint.mkdir()
    logs.mkdir()
    mount = mounting.start(mountpoint, logs / "daemon.log", ["--memory", "32M"])
    try:
        logs.rename(tmp_path / "old-logs")
        logs.mkdir()
    finally:
        mounting.stop(mount)  # its stop's lines
    assert "store closed" in (logs / "daemon.log").read_text()
