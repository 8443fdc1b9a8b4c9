"""A daemon that stops answering (here: SIGSTOP) does not hang the tools that read its mount:
``stats``, ``top`` and ``mount`` give up at their deadline and say so in one line, and
``umount`` aborts the FUSE connection and removes the mount. Continued, the daemon finds its
mount gone, writes its RAM tier down and ends by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import publish, read_page

#: The deadline the tools promise, and how long a command may take on top of it (start-up of
#: Python on a busy 2-core machine).
ANSWER_TIMEOUT_S = 5
SLACK_S = 10


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hicachefs.cli", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(command: subprocess.Popen) -> tuple[int, str, str, float]:
    """Exit status, stdout, stderr and seconds since ``started`` (set on the Popen)."""
    stdout, stderr = command.communicate(timeout=ANSWER_TIMEOUT_S + 3 * SLACK_S)
    return command.returncode, stdout, stderr, time.monotonic() - command.started


def test_tools_give_up_on_a_stopped_daemon_and_umount_removes_its_mount(mount_factory, tmp_path):
    flags = ["--memory", "32M", "--disk", str(tmp_path / "ssd"), "--disk-size", "64M"]
    mount = mount_factory(*flags)
    publish(mount.page_dir(), "k", content(1, 1 << 20))  # in RAM only: no --write-through
    path = mount.path
    commands: list[subprocess.Popen] = []
    os.kill(mount.pid, signal.SIGSTOP)
    try:
        for args in (["stats", str(path)], ["top", str(path), "--count", "1"], ["mount", str(path)]):
            commands.append(start(*args))
            commands[-1].started = time.monotonic()
        stats, top, mount_again = (finish(command) for command in commands)
        no_answer = f"hicachefs: {path}: its daemon did not answer within {ANSWER_TIMEOUT_S} s\n"
        for status, stdout, stderr, seconds in (stats, top):
            assert (status, stdout, stderr) == (1, "", no_answer)
            assert seconds < ANSWER_TIMEOUT_S + SLACK_S
        status, stdout, stderr, seconds = mount_again
        assert (status, stdout) == (2, "")
        assert stderr == (f"hicachefs: mountpoint {path} is already a mount point "
                          "(fuse.hicachefs whose daemon does not answer)\n")
        assert seconds < ANSWER_TIMEOUT_S + SLACK_S

        umount = start("umount", str(path))
        umount.started = time.monotonic()
        commands.append(umount)
        status, stdout, stderr, seconds = finish(umount)
        assert (status, stderr) == (0, ""), stderr
        assert stdout == (f"hicachefs: {path}: its daemon did not answer within {ANSWER_TIMEOUT_S} s; "
                          "aborted its FUSE connection and removed the mount\n")
        assert seconds < ANSWER_TIMEOUT_S + SLACK_S
        assert not mounting.is_mounted(path)
        assert mounting.alive(mount.pid)  # umount signals no process it could not ask
    finally:
        for command in commands:
            if command.poll() is None:
                command.kill()
                command.wait()
        os.kill(mount.pid, signal.SIGCONT)
    assert mounting.wait_gone(mount.pid, 30), "the continued daemon did not end"
    assert "unmounted" in mount.log_text() and "store closed" in mount.log_text()
    again = mount_factory(*flags, path=path)
    assert read_page(again.page_dir() / "k") == content(1, 1 << 20)  # written down on its way out
