"""Mount the real daemon for a test, and always take it down again.

Used by the fixtures in ``conftest.py`` and by the reliability tests that kill daemons on
purpose. Every daemon is stopped by its PID, checked to still be that mount's daemon and
signalled through a pidfd (never a process that took the number since); every mount removed
with ``fusermount3 -u`` (``-uz`` if stuck); nothing is ever killed by name.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

STOP_TIMEOUT_S = 60.0


@dataclass
class Mount:
    """A live hicachefs mount: where it is, which daemon serves it, where it logs."""

    path: Path
    log_file: Path
    flags: list[str]
    pid: int = 0
    expected_log_errors: list[str] = field(default_factory=list)
    # (pid, start time in clock ticks) of the daemon ``start`` found: tells it from a later
    # process given the same number (see ``daemon_pidfd``).
    identity: tuple[int, int] | None = None

    def stats(self) -> dict:
        return json.loads((self.path / ".hicachefs" / "stats").read_text())

    def log_text(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    def page_dir(self, *parts: str) -> Path:
        """A pool directory (made if missing): model/format/shard/pool."""
        parts = parts or ("model", "bfloat16-page_first-64", "tp0of1", "kv")
        directory = self.path.joinpath(*parts)
        directory.mkdir(parents=True, exist_ok=True)
        return directory


def start(path: Path, log_file: Path, flags: list[str]) -> Mount:
    """Mount with ``hicachefs mount`` (background daemon) and wait until it answers. A dead mount
    left at ``path`` is the mount command's to remove, as after any crash."""
    if not is_dead_mount(path):
        path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "hicachefs.cli", "mount", str(path), "--log-file", str(log_file), *flags],
        capture_output=True, text=True, timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"mount failed ({result.returncode}): {result.stderr.strip()}\n"
                           f"{log_file.read_text() if log_file.exists() else ''}")
    mount = Mount(path, log_file, flags)
    try:
        config = json.loads((path / ".hicachefs" / "config").read_text())
    except (OSError, ValueError) as exc:  # up but not answering as it should: take it down
        printed = re.search(r"\(pid (\d+),", result.stdout)  # the mount command names its daemon
        mount.pid = int(printed[1]) if printed else 0
        stop(mount)
        unmount_path(path)
        raise RuntimeError(f"mounted, but its config could not be read ({exc}); unmounted it\n"
                           f"{log_file.read_text() if log_file.exists() else ''}") from None
    mount.pid = config["pid"]
    mount.identity = (mount.pid, _start_time(mount.pid))
    return mount


def _start_time(pid: int) -> int:
    """When the process started, in clock ticks since boot (``/proc/PID/stat``, field 22)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait until the process has ended, every thread of it (its pidfd says so: ``/proc``'s
    state says zombie once its first thread has, while the others may still be running)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(fd)


def is_mounted(path: Path) -> bool:
    """From /proc/self/mounts: ``os.path.ismount`` says False for a dead FUSE mount (ENOTCONN)."""
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def unmount_path(path: Path) -> None:
    """Remove whatever is mounted at ``path``: ``fusermount3 -u``, then lazily if stuck."""
    if not is_mounted(path):
        return
    if subprocess.run(["fusermount3", "-u", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["fusermount3", "-uz", str(path)], capture_output=True)


def daemon_pidfd(mount: Mount) -> int | None:
    """A pidfd for the mount's daemon, or None once ``mount.pid`` no longer names it.

    A daemon that ended leaves its number free, and on a busy host (pid_max 32768) another
    process soon has it: a second ``stop`` of the same mount, a fixture's teardown after a test
    stopped its mount itself, once sent SIGTERM to a daemon of another test. So the process is
    checked to be a hicachefs daemon of this mountpoint, and signalled through the pidfd,
    which names that process and no later one.
    """
    if not mount.pid:
        return None
    try:
        fd = os.pidfd_open(mount.pid)
    except (ProcessLookupError, OSError):
        return None
    try:
        command = Path(f"/proc/{mount.pid}/cmdline").read_bytes()
    except OSError:
        command = b""
    same_start = mount.identity is None or mount.identity[0] != mount.pid or \
        mount.identity[1] == _start_time(mount.pid)
    if same_start and b"hicachefs" in command and os.path.realpath(mount.path).encode() in command:
        return fd
    os.close(fd)
    return None


def _signal(fd: int, signum: int, timeout: float) -> bool:
    """Send ``signum`` through a pidfd; True once the process has ended (within ``timeout``)."""
    try:
        signal.pidfd_send_signal(fd, signum)
    except ProcessLookupError:
        return True
    poller = select.poll()  # not select(): a process with many files open has descriptors past 1024
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def stop(mount: Mount) -> None:
    """Clean shutdown by SIGTERM to the daemon; escalate only if it does not finish. A daemon
    already gone is not looked for again (see ``daemon_pidfd``); its mount, if left, is removed
    when it is dead (a live mount at the path is someone else's now)."""
    fd = daemon_pidfd(mount)
    try:
        if fd is not None and not _signal(fd, signal.SIGTERM, STOP_TIMEOUT_S):
            _signal(fd, signal.SIGKILL, 10)
    finally:
        if fd is not None:
            os.close(fd)
        if fd is not None or is_dead_mount(mount.path):
            unmount_path(mount.path)


def stop_if_mounted(path: Path) -> None:
    """Stop the daemon of a mount at ``path`` that a test did not mean to make (a refusal that
    did not happen), by its PID, and remove the mount; nothing when nothing is mounted there."""
    if not is_mounted(path):
        return
    mount = Mount(path, Path(os.devnull), [])
    try:
        mount.pid = json.loads((path / ".hicachefs" / "config").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        pass  # a dead mount: ``stop`` removes it
    stop(mount)


def kill(mount: Mount) -> None:
    """Simulate a crash: SIGKILL the daemon, then clean up its dead mount."""
    fd = daemon_pidfd(mount)
    if fd is not None:
        try:
            _signal(fd, signal.SIGKILL, 10)
        finally:
            os.close(fd)
    if fd is not None or is_dead_mount(mount.path):
        unmount_path(mount.path)


def is_dead_mount(path: Path) -> bool:
    """A mount at ``path`` whose daemon is gone: every access fails with ENOTCONN or ECONNABORTED."""
    if not is_mounted(path):
        return False
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def unexpected_log_lines(mount: Mount) -> list[str]:
    """ERROR lines and tracebacks in the daemon's log that the test did not announce."""
    lines = [line for line in mount.log_text().splitlines()
             if " ERROR " in line or line.startswith("Traceback")]
    return [line for line in lines if not any(e in line for e in mount.expected_log_errors)]
