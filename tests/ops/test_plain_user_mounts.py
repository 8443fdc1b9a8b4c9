"""A plain user's (uid 65534's) mount and umount, FUSE opened to that user for each test
(``plain_mounts``): what fusermount3 refuses such a user, said in one line."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from hicachefs_testing import mounting
from hicachefs_testing.plain_mounts import PYTHON, daemon_pid, fuse_for, hicachefs, plain_env, plain_user_directory
from pages import wait_until


def test_allow_other_without_user_allow_other_is_one_line():
    """operations.md advises a plain user ``-o allow_other``, which fusermount3 refuses without
    ``user_allow_other`` in /etc/fuse.conf: the user read 'the daemon exited with status 1:
    daemon failed', the reason a stray line of the log."""
    with fuse_for(user_allow_other=False), plain_user_directory() as home:
        result = hicachefs(home, "mount", str(home / "mnt"), "--memory", "32M", "--log-file",
                           str(home / "log"), "-o", "allow_other")
        assert not mounting.is_mounted(home / "mnt")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stdout + result.stderr
    assert "user_allow_other" in result.stderr and "/etc/fuse.conf" in result.stderr, result.stderr


def test_allow_other_with_user_allow_other_mounts():
    with fuse_for(user_allow_other=True), plain_user_directory() as home:
        result = hicachefs(home, "mount", str(home / "mnt"), "--memory", "32M", "--log-file",
                           str(home / "log"), "-o", "allow_other")
        assert result.returncode == 0, result.stdout + result.stderr
        assert os.listdir(home / "mnt") == []  # root reads it: allow_other
        assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0


def test_a_mountpoint_the_user_cannot_write_is_one_line():
    """fusermount3 mounts only on a directory its user may write: one of root's (0755) failed as
    'daemon failed'."""
    with fuse_for(user_allow_other=True), plain_user_directory() as home:
        roots = home / "roots"
        roots.mkdir(mode=0o755)
        result = hicachefs(home, "mount", str(roots), "--memory", "32M", "--log-file", str(home / "log"))
        assert not mounting.is_mounted(roots)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stdout + result.stderr
    assert f"mountpoint {roots} is not writable by this user" in result.stderr, result.stderr


def test_a_mount_fusermount3_refuses_says_its_reason():
    """A sticky directory of root's that anyone may write (like /tmp) passes the command's checks,
    and fusermount3 refuses it; the command said only 'daemon failed'."""
    with fuse_for(user_allow_other=True), plain_user_directory() as home:
        sticky = home / "sticky"
        sticky.mkdir()
        os.chmod(sticky, 0o1777)
        log = home / "log"
        log.write_text("2026-01-01 00:00:00,000 ERROR hicachefs: an earlier daemon's failure\n")
        os.chown(log, 65534, 65534)
        result = hicachefs(home, "mount", str(sticky), "--memory", "32M", "--log-file", str(log))
        assert not mounting.is_mounted(sticky)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stdout + result.stderr
    assert f"fusermount3 refused the mount (mountpoint {sticky} not owned by user)" in result.stderr, result.stderr


def test_a_plain_user_umounts_their_own_hung_daemon():
    """Where fusectl is not mounted, aborting a connection needs root (``unshare: ... Operation
    not permitted``), and a plain user's ``hicachefs umount`` of their own stopped daemon gave
    up there, leaving the mount, though fusermount3 unmounts it."""
    with fuse_for(user_allow_other=True), plain_user_directory() as home:
        flags = ("--memory", "32M", "--log-file", str(home / "log"))
        mounted = hicachefs(home, "mount", str(home / "mnt"), *flags)
        assert mounted.returncode == 0, mounted.stdout + mounted.stderr
        pid = daemon_pid(mounted)
        os.kill(pid, signal.SIGSTOP)
        try:
            result = hicachefs(home, "umount", str(home / "mnt"))
            assert result.returncode == 0 and result.stdout.count("\n") == 1, result.stdout + result.stderr
            assert not mounting.is_mounted(home / "mnt")
            if not any(line.split()[2] == "fusectl" for line in Path("/proc/mounts").read_text().splitlines()):
                assert "could not abort its FUSE connection" in result.stdout, result.stdout
                assert "unmounted it with fusermount3" in result.stdout, result.stdout
            again = hicachefs(home, "mount", str(home / "mnt"), *flags)
            assert again.returncode == 0, again.stdout + again.stderr
            assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0
        finally:
            os.kill(pid, signal.SIGKILL)


#: As the plain user: write page ``k`` of 1 MiB into a pool of the mount ARGV[1] ("w"), or print
#: whether it reads back ("r").
PAGE_SCRIPT = """
import os, sys
pool = os.path.join(sys.argv[1], "model", "bfloat16-page_first-64", "tp0of1", "kv")
data = bytes(range(256)) * 4096
if sys.argv[2] == "w":
    os.makedirs(pool, exist_ok=True)
    with open(os.path.join(pool, ".tmp-k"), "wb") as f:
        f.write(data)
    os.rename(os.path.join(pool, ".tmp-k"), os.path.join(pool, "k"))
else:
    with open(os.path.join(pool, "k"), "rb") as f:
        print(f.read() == data)
"""


def test_root_umounts_a_plain_users_mount_without_allow_other_cleanly():
    """Root's read of the config of a mount made without allow_other is refused (EACCES): the
    command took it for a daemon answering wrongly, aborted its connection and returned while
    the daemon still wrote its RAM tier down, and the owner's mount at once was refused (its
    disk arena in use). ``stats`` said only "Permission denied"."""
    with fuse_for(user_allow_other=True), plain_user_directory() as home:
        (home / "disk").mkdir()
        os.chown(home / "disk", 65534, 65534)
        flags = ("--memory", "32M", "--disk", str(home / "disk"), "--disk-size", "64M",
                 "--log-file", str(home / "log"))
        mounted = hicachefs(home, "mount", str(home / "mnt"), *flags)
        assert mounted.returncode == 0, mounted.stdout + mounted.stderr
        pid = daemon_pid(mounted)
        written = subprocess.run([PYTHON, "-c", PAGE_SCRIPT, str(home / "mnt"), "w"],
                                 user=65534, group=65534, capture_output=True, text=True, timeout=60)
        assert written.returncode == 0, written.stderr

        stats = hicachefs(home, "stats", str(home / "mnt"), user=0)
        assert stats.returncode == 1, stats.stdout + stats.stderr
        assert stats.stderr == (f"hicachefs: {home / 'mnt'}: mounted by uid 65534 without allow_other: "
                                "run hicachefs stats as that user\n")

        result = hicachefs(home, "umount", str(home / "mnt"), user=0)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout == f"hicachefs: unmounted {home / 'mnt'}\n"
        assert not mounting.alive(pid)  # it returns once the daemon has written its RAM tier down

        again = hicachefs(home, "mount", str(home / "mnt"), *flags)
        assert again.returncode == 0, again.stdout + again.stderr
        read = subprocess.run([PYTHON, "-c", PAGE_SCRIPT, str(home / "mnt"), "r"],
                              user=65534, group=65534, capture_output=True, text=True, timeout=60)
        assert read.stdout == "True\n", read.stdout + read.stderr
        assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0


def test_root_is_told_whose_mount_it_cannot_stop():
    """A mount made without allow_other by a daemon that names no mountpoint on its command line
    (``mount --foreground``, as a service runs it): root is told to run umount as its user."""
    with fuse_for(user_allow_other=True), plain_user_directory() as home:
        foreground = subprocess.Popen([PYTHON, "-m", "hicachefs.cli", "mount", str(home / "mnt"),
                                       "--memory", "32M", "--foreground"], env=plain_env(home), cwd=home.parent / "code",
                                      user=65534, group=65534, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: mounting.is_mounted(home / "mnt"), timeout=30)
            result = hicachefs(home, "umount", str(home / "mnt"), user=0)
            assert result.returncode == 1, result.stdout + result.stderr
            assert result.stderr == (f"hicachefs: {home / 'mnt'}: mounted by uid 65534 without allow_other: "
                                     "run hicachefs umount as that user\n")
            assert mounting.is_mounted(home / "mnt")
            assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0
            assert foreground.wait(30) == 0
        finally:
            if foreground.poll() is None:
                foreground.kill()
                foreground.wait()


def test_a_plain_user_mounts_again_over_their_own_dead_mount():
    """The daemon killed (OOM, kill -9), its mount dead: the next mount there removes it and
    mounts. The check that the user may write the mountpoint ran first, on the dead mount
    (ENOTCONN), and refused it as "not writable by this user" (found by review)."""
    with fuse_for(user_allow_other=False), plain_user_directory() as home:
        flags = ["--memory", "32M", "--log-file", str(home / "log")]
        first = hicachefs(home, "mount", str(home / "mnt"), *flags)
        assert first.returncode == 0, first.stdout + first.stderr
        pid = daemon_pid(first)
        os.kill(pid, signal.SIGKILL)
        assert mounting.wait_gone(pid, 10) and mounting.is_mounted(home / "mnt")
        again = hicachefs(home, "mount", str(home / "mnt"), *flags)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "removed the dead mount" in again.stdout
        assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0


def test_root_is_told_of_a_daemon_left_from_an_earlier_mount():
    """The user's umount of their hung daemon unmounted it and left the daemon (no abort without
    fusectl); they mounted there again. Root's umount found two daemons naming the mountpoint
    and said only "run it as that user" (found by review): it names both."""
    with fuse_for(user_allow_other=False), plain_user_directory() as home:
        flags = ("--memory", "32M", "--log-file", str(home / "log"))
        first = hicachefs(home, "mount", str(home / "mnt"), *flags)
        assert first.returncode == 0, first.stdout + first.stderr
        old = daemon_pid(first)
        os.kill(old, signal.SIGSTOP)
        try:
            assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0
            again = hicachefs(home, "mount", str(home / "mnt"), *flags)
            assert again.returncode == 0, again.stdout + again.stderr
            new = daemon_pid(again)
            result = hicachefs(home, "umount", str(home / "mnt"), user=0)
            assert result.returncode == 1 and mounting.is_mounted(home / "mnt")
            assert f"2 daemons of uid 65534 name this mountpoint (pids {min(old, new)}, {max(old, new)})" \
                in result.stderr, result.stderr
            assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0
        finally:
            os.kill(old, signal.SIGKILL)
            assert mounting.wait_gone(old, 10)


def test_a_plain_user_with_roots_runtime_dir_logs_in_a_place_of_its_own():
    """``su user`` without ``-`` keeps root's XDG_RUNTIME_DIR: the mount took it for a place of
    its own (root's may be trusted) and was refused, "cannot make the log directory ...
    (Permission denied)" (found by review). It passes on to the temp dir."""
    with fuse_for(user_allow_other=False), plain_user_directory() as home:
        roots = home.parent / "run-user-0"
        roots.mkdir(mode=0o700)
        env = {**plain_env(home), "XDG_RUNTIME_DIR": str(roots), "TMPDIR": str(home)}
        mounted = subprocess.run([PYTHON, "-m", "hicachefs.cli", "mount", str(home / "mnt"), "--memory", "32M"],
                                 env=env, cwd=home.parent / "code", user=65534, group=65534, capture_output=True,
                                 text=True, timeout=60)
        assert mounted.returncode == 0, mounted.stdout + mounted.stderr
        assert f"log {home / 'hicachefs-65534'}/" in mounted.stdout and list(roots.iterdir()) == []
        assert hicachefs(home, "umount", str(home / "mnt")).returncode == 0
