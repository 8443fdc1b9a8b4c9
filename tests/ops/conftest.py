"""A private mount namespace in which ``hicachefs`` is on mount(8)'s PATH.

mount(8) clears PATH before it runs ``mount.fuse3``, whose shell then finds ``hicachefs``
only in the default directories (/usr/local/bin and the like). An operator puts a symlink
there (README); the tests must not change the machine, so they do the same inside a mount
namespace of their own: a directory holding only that symlink is bind-mounted over
/usr/local/bin there. Mounts made inside are invisible outside; the test reaches them
through ``/proc/<holder>/root``. Every daemon started inside is stopped by its PID and every
mount removed at teardown, then the holder process is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicachefs_testing import mounting

VENV_BIN = Path(sys.executable).parent


class MountNamespace:
    """A holder process (``sleep``) that keeps the namespace alive, and ways into it.

    The namespace starts with a copy of the host's mounts, other tests' hicachefs mounts
    among them: those are not ours, and teardown leaves them and their daemons alone."""

    def __init__(self, holder: subprocess.Popen, log_dir: Path):
        self.holder = holder
        self.log_dir = log_dir
        self.daemon_pids: set[int] = set()
        self.inherited = set(self.mounts())

    @property
    def nsenter(self) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--"]

    def run(self, *command: str, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        return subprocess.run([*self.nsenter, *command], **kwargs)

    def popen(self, *command: str, **kwargs) -> subprocess.Popen:
        """A process inside; nsenter execs the command, so its PID is the command's."""
        return subprocess.Popen([*self.nsenter, *command], **kwargs)

    def outside(self, path: Path | str) -> Path:
        """Where a path inside the namespace is, seen from the test."""
        return Path(f"/proc/{self.holder.pid}/root") / Path(path).relative_to("/")

    def mounts(self) -> dict[str, tuple[str, str]]:
        """Mount point -> (type, options), from the namespace's own mount table."""
        table = {}
        for line in Path(f"/proc/{self.holder.pid}/mounts").read_text().splitlines():
            _source, target, fstype, options, *_ = line.split()
            table[target] = (fstype, options)
        return table

    def daemon_pid(self, mountpoint: Path) -> int:
        """The PID of the daemon serving ``mountpoint`` (remembered for teardown)."""
        pid = json.loads((self.outside(mountpoint) / ".hicachefs" / "config").read_text())["pid"]
        self.daemon_pids.add(pid)
        return pid

    def unexpected_log_lines(self) -> list[str]:
        lines = []
        for log in self.log_dir.glob("*.log"):
            lines += [f"{log.name}: {line}" for line in log.read_text().splitlines()
                      if " ERROR " in line or line.startswith("Traceback")]
        return lines

    def own_mounts(self) -> list[str]:
        """The hicachefs mounts made inside the namespace."""
        return [target for target, (fstype, _) in self.mounts().items()
                if fstype == "fuse.hicachefs" and target not in self.inherited]

    def close(self) -> None:
        try:
            for target in self.own_mounts():
                try:
                    self.daemon_pid(Path(target))
                except OSError:
                    pass  # a dead mount: its daemon is already gone
            for pid in self.daemon_pids:
                if mounting.alive(pid):
                    os.kill(pid, signal.SIGTERM)
                    if not mounting.wait_gone(pid, mounting.STOP_TIMEOUT_S):
                        os.kill(pid, signal.SIGKILL)
                        mounting.wait_gone(pid, 10)
            for target in self.own_mounts():
                self.run("umount", "-l", target)
        finally:
            self.holder.send_signal(signal.SIGTERM)
            self.holder.wait(timeout=10)


@pytest.fixture
def mount_namespace(tmp_path) -> MountNamespace:
    """A mount namespace where /usr/local/bin holds only ``hicachefs`` (this venv's)."""
    assert os.path.exists("/dev/fuse"), "/dev/fuse is missing: FUSE tests cannot run"
    bin_dir = tmp_path / "usr-local-bin"
    bin_dir.mkdir()
    (bin_dir / "hicachefs").symlink_to(VENV_BIN / "hicachefs")
    ready = tmp_path / "namespace-ready"
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount --bind "{bin_dir}" /usr/local/bin && touch "{ready}" && exec sleep 3600'],
    )
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert holder.poll() is None, "could not make a mount namespace (unshare)"
        assert time.monotonic() < deadline, "the mount namespace did not come up"
        time.sleep(0.01)
    (tmp_path / "logs").mkdir()
    namespace = MountNamespace(holder, tmp_path / "logs")
    try:
        yield namespace
    finally:
        namespace.close()
    failures = namespace.unexpected_log_lines()
    assert not failures, "the daemon logged errors:\n" + "\n".join(failures)
