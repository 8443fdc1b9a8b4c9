"""A lazy unmount (``umount -l``, ``fusermount3 -uz``) of a mount whose files a client still
holds open: the kernel takes the mount out of the namespace at once, but keeps the FUSE
connection, and the daemon with it, for as long as a file is open on it."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess

import pytest

from hicachefs_testing import mounting


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
