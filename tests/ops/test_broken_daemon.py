"""A daemon that answers, but with errors where it should not (``EIO`` for its own control
files): the tools say so in one line and leave nothing behind. ``umount`` aborts such a mount's
FUSE connection and removes it; ``mount`` takes down a daemon it started whose first answers
fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicachefs import mount_table
from hicachefs_testing import mounting

EIO_DAEMON = Path(__file__).with_name("eio_daemon.py")


def hicachefs(*args: str, before: str = "") -> subprocess.CompletedProcess:
    """The command line, in a process of its own; ``before``: Python run first in it."""
    code = f"{before}\nimport sys\nfrom hicachefs.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_umount_aborts_and_removes_a_mount_whose_daemon_answers_its_config_with_eio(tmp_path):
    path = tmp_path / "mnt"
    path.mkdir()
    daemon = subprocess.Popen([sys.executable, str(EIO_DAEMON), str(path)], stderr=subprocess.PIPE)
    try:
        started = time.monotonic()
        while mount_table.filesystem_type(path) != mount_table.FSTYPE:
            assert daemon.poll() is None and time.monotonic() - started < 30, daemon.stderr.read()
            time.sleep(0.05)
        stats = hicachefs("stats", str(path))
        assert (stats.returncode, stats.stdout) == (2, "")
        assert stats.stderr == f"hicachefs: cannot read {path}/.hicachefs/stats: Input/output error\n"
        umount = hicachefs("umount", str(path))
        assert (umount.returncode, umount.stderr) == (0, ""), umount.stderr
        assert umount.stdout == (f"hicachefs: {path}: its daemon answered the read of its config with EIO "
                                 "(Input/output error); aborted its FUSE connection and removed the mount\n")
        assert not mounting.is_mounted(path)
        assert daemon.wait(30) is not None  # its connection gone, it ends by itself
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if mounting.is_mounted(path):
            mount_table.remove(path)


#: Injected into the mount command: its look at the new mount's config file fails with EIO, as
#: it would from a daemon that mounted but answers wrongly.
_CONFIG_LOOK_FAILS = """
import errno, pathlib
_read_bytes = pathlib.Path.read_bytes
def _failing(self, *args, **kwargs):
    if self.name == "config" and self.parent.name == ".hicachefs":
        raise OSError(errno.EIO, "Input/output error")
    return _read_bytes(self, *args, **kwargs)
pathlib.Path.read_bytes = _failing
"""


def test_mount_takes_down_the_daemon_it_started_when_the_mount_answers_with_an_error(tmp_path):
    path, log = tmp_path / "mnt", tmp_path / "daemon.log"
    path.mkdir()
    result = hicachefs("mount", str(path), "--memory", "64M", "--log-file", str(log), before=_CONFIG_LOOK_FAILS)
    pid = int(result.stderr.split("(pid ")[1].split(")")[0]) if "(pid " in result.stderr else None
    try:
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == (f"hicachefs: {path} came up, but its daemon answered a look at config with "
                                 f"Input/output error; stopped it (pid {pid}), and nothing is mounted; see {log}\n")
        assert not mounting.is_mounted(path)
        assert not mounting.alive(pid)
        assert "unmounted" in log.read_text()  # it stopped as SIGTERM stops it: cleanly
    finally:
        if pid is not None and mounting.alive(pid):
            os.kill(pid, 9)
        if mounting.is_mounted(path):
            mount_table.remove(path)


#: Injected into the umount command: the mount's config file names ``PID`` (a JSON value).
_CONFIG_NAMES = """
import json
from hicachefs import deadline
_read_bytes = deadline.read_bytes
def _config(path, *args, **kwargs):
    if path.name == "config" and path.parent.name == ".hicachefs":
        return json.dumps({"pid": PID}).encode()
    return _read_bytes(path, *args, **kwargs)
deadline.read_bytes = _config
"""


@pytest.mark.parametrize("named", ["text", "another user's process"])
def test_umount_signals_no_process_but_the_mounts_daemon(mount_factory, named):
    """A config whose pid is not a number gave a traceback; one naming a process of another user
    than the mount's (any user can mount a FUSE filesystem typed hicachefs and write its config)
    had root's umount SIGTERM it. Such a mount answers, but not as a daemon should: aborted and
    removed, nothing signalled."""
    mount = mount_factory("--memory", "32M")
    bystander = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                  "sh", "-c", "echo; exec sleep 120"], stdout=subprocess.PIPE)
    try:
        bystander.stdout.readline()  # it is another user's now: until then it was root's, as the mount
        pid = '"1234"' if named == "text" else str(bystander.pid)
        result = hicachefs("umount", str(mount.path), before=_CONFIG_NAMES.replace("PID", pid))
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        assert result.stdout.startswith(f"hicachefs: {mount.path}: its config names ")
        assert result.stdout.endswith("; aborted its FUSE connection and removed the mount\n")
        assert not mounting.is_mounted(mount.path) and bystander.poll() is None
    finally:
        bystander.kill()  # the test's own child, by its PID
        bystander.wait()
        bystander.stdout.close()
    assert mounting.wait_gone(mount.pid, 60), "the daemon did not end once its mount was gone"
