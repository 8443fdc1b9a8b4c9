"""A lazy unmount (``umount -l``, ``fusermount3 -uz``) of a mount whose files a client still
holds open: the kernel takes the mount out of the namespace at once, but keeps the FUSE
connection, and the daemon with it, for as long as a file is open on it."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time

import pytest

from hicachefs.daemon import daemon
from hicachefs_testing import mounting
from pages import publish, read_page


def _config_pid(mount: mounting.Mount) -> int:
    return json.loads((mount.path / ".hicachefs" / "config").read_text())["pid"]


def test_a_daemon_lazily_unmounted_under_a_client_stops_and_the_client_sees_it(mount_factory):
    """The daemon served the detached tree for as long as the client held a handle (SGLang's
    ranks hold theirs for the life of the server): the client went on storing pages nobody
    else could see, and the next mount of that --disk was refused ("in use by another daemon")."""
    mount = mount_factory("--memory", "32M")
    held = os.open(mount.path / ".hicachefs" / "plane", os.O_RDWR)
    try:
        subprocess.run(["umount", "-l", str(mount.path)], check=True)
        assert mounting.wait_gone(mount.pid, 10), "the daemon of a detached mount kept running"
        with pytest.raises(OSError) as gone:
            os.pread(held, 64, 0)
        assert gone.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    finally:
        os.close(held)
    assert "unmounted from outside" in mount.log_text()


def test_a_detached_daemon_that_stops_leaves_the_next_mount_at_its_path_alone(mount_factory):
    """A daemon whose mount was detached, stopping later, unmounted whatever was mounted at its
    path by then: the next daemon's mount (libfuse's unmount is a lazy umount2 of the path)."""
    first = mount_factory("--memory", "32M")
    held = os.open(first.path / ".hicachefs" / "config", os.O_RDONLY)
    os.kill(first.pid, signal.SIGSTOP)  # it must not notice the detach before the next mount is up
    try:
        subprocess.run(["umount", "-l", str(first.path)], check=True)
        second = mount_factory("--memory", "32M", path=first.path)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    try:
        os.kill(first.pid, signal.SIGTERM)  # (mounting.stop would also unmount the path)
        assert mounting.wait_gone(first.pid, 20)
        assert mounting.is_mounted(second.path), "the first daemon's stop unmounted the second's mount"
        assert _config_pid(second) == second.pid
    finally:
        os.close(held)


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
