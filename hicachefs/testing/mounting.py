"""Mount the real daemon for a test, and always take it down again.

Used by the fixtures in ``conftest.py`` and by the reliability tests that kill daemons on
purpose. Every daemon is stopped by its PID, every mount removed with ``fusermount3 -u``
(``-uz`` if stuck); nothing is ever killed by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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
    """Mount with ``hicachefs mount`` (background daemon) and wait until it answers."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "hicachefs.cli", "mount", str(path), "--log-file", str(log_file), *flags],
        capture_output=True, text=True, timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"mount failed ({result.returncode}): {result.stderr.strip()}\n"
                           f"{log_file.read_text() if log_file.exists() else ''}")
    mount = Mount(path, log_file, flags)
    mount.pid = json.loads((path / ".hicachefs" / "config").read_text())["pid"]
    return mount


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


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


def stop(mount: Mount) -> None:
    """Clean shutdown by SIGTERM to the daemon's PID; escalate only if it does not finish."""
    try:
        if mount.pid and alive(mount.pid):
            os.kill(mount.pid, signal.SIGTERM)
            if not wait_gone(mount.pid, STOP_TIMEOUT_S):
                os.kill(mount.pid, signal.SIGKILL)
                wait_gone(mount.pid, 10)
    finally:
        unmount_path(mount.path)


def kill(mount: Mount) -> None:
    """Simulate a crash: SIGKILL the daemon by PID, then clean up its dead mount."""
    try:
        os.kill(mount.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_gone(mount.pid, 10)
    unmount_path(mount.path)


def unexpected_log_lines(mount: Mount) -> list[str]:
    """ERROR lines and tracebacks in the daemon's log that the test did not announce."""
    lines = [line for line in mount.log_text().splitlines()
             if " ERROR " in line or line.startswith("Traceback")]
    return [line for line in lines if not any(e in line for e in mount.expected_log_errors)]
