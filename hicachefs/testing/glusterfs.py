"""A real GlusterFS volume for the shared tier's tests and benchmark, always taken down again.

``scripts/glusterfs.sh up DIR`` starts a private glusterd and a one-node volume mounted at
``DIR/a`` and ``DIR/b`` (two hosts' views); ``down DIR`` removes all of it. ``volume(DIR)`` is a
context manager around the two; ``GlusterVolume`` also stops and starts the volume, and freezes
its brick, to make the filesystem fail under a running tier. Processes are addressed by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "glusterfs.sh"
VOLUME = "hicachefs"


@dataclass(frozen=True)
class GlusterVolume:
    directory: Path

    @property
    def a(self) -> Path:
        return self.directory / "a"

    @property
    def b(self) -> Path:
        return self.directory / "b"

    def gluster(self, *args: str) -> str:
        command = ["gluster", "--mode=script", f"--glusterd-sock={self.directory}/run/glusterd.socket",
                   f"--log-file={self.directory}/log/cli.log", *args]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout

    def stop(self) -> None:
        """Stop the volume under both mounts (its brick goes away; the mounts stay)."""
        self.gluster("volume", "stop", VOLUME, "force")

    def start(self, timeout: float = 30.0) -> None:
        """Start it again and wait until both mounts have reconnected (a few seconds)."""
        self.gluster("volume", "start", VOLUME, "force")
        deadline = time.monotonic() + timeout
        for mount in (self.a, self.b):
            while True:
                try:
                    os.listdir(mount)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def brick_pid(self) -> int:
        pid_files = list((self.directory / "run" / "vols" / VOLUME).glob("*.pid"))
        assert len(pid_files) == 1, f"expected one brick pid file, found {pid_files}"
        return int(pid_files[0].read_text())

    @contextlib.contextmanager
    def frozen_brick(self) -> Iterator[int]:
        """SIGSTOP the brick: calls on the mounts hang (until GlusterFS's ping timeout)."""
        pid = self.brick_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            yield pid
        finally:
            os.kill(pid, signal.SIGCONT)


def _script(action: str, directory: Path, timeout: float) -> None:
    done = subprocess.run([str(SCRIPT), action, str(directory)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"glusterfs.sh {action} {directory} exited {done.returncode}: {done.stderr.strip()}")


def up(directory: Path) -> GlusterVolume:
    _script("up", directory, timeout=120)
    return GlusterVolume(Path(directory))


def down(directory: Path) -> None:
    """Take it down; removing a brick of 100 k pages takes minutes on a busy machine."""
    _script("down", directory, timeout=3600)


@contextlib.contextmanager
def volume(directory: Path) -> Iterator[GlusterVolume]:
    """A volume under ``directory`` for the duration of the block; always taken down."""
    try:
        yield up(directory)
    finally:
        down(directory)
