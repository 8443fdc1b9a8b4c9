"""A distributed filesystem for the shared tier's tests and benchmark, behind one small interface.

Each engine (``glusterfs.GlusterVolume``, ``juicefs.JuiceVolume``; all of them in ``engines``)
is brought up by its script under ``scripts/`` with everything under one directory, mounted
twice: ``a`` and ``b`` are two hosts' views of one volume. ``stop``/``start`` make its servers
go away and come back under both mounts, ``frozen`` SIGSTOPs them, ``down`` removes it all.
Processes are addressed by the PIDs the scripts record, never by name.
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
from typing import ClassVar

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


class EngineDidNotStart(RuntimeError):
    """The engine's script could not bring it up here; the message is the script's last line
    (a missing program, a port another instance holds)."""


@dataclass(frozen=True)
class Engine:
    directory: Path

    name: ClassVar[str]  # as people write it: "GlusterFS"
    script: ClassVar[str]  # under scripts/, taking up|down DIR

    @property
    def a(self) -> Path:
        return self.directory / "a"

    @property
    def b(self) -> Path:
        return self.directory / "b"

    def stop(self) -> None:
        """Make the servers behind both mounts go away (the mounts stay)."""
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        """Bring them back and wait until both mounts answer again."""
        self._restart()
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

    def _restart(self) -> None:
        raise NotImplementedError

    def server_pids(self) -> list[int]:
        """The processes that serve the volume: what ``frozen`` stops."""
        raise NotImplementedError

    @contextlib.contextmanager
    def frozen(self) -> Iterator[list[int]]:
        """SIGSTOP the servers: calls on either mount hang until the block ends."""
        pids = self.server_pids()
        stopped = []
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            yield pids
        finally:
            for pid in reversed(stopped):
                os.kill(pid, signal.SIGCONT)

    @classmethod
    def run_script(cls, action: str, directory: Path, timeout: float) -> None:
        # Its own process group, so that a script past its time is stopped with everything it
        # started and still waits for (a mount, a server coming up); daemons it left running
        # are stopped by "down", by the PIDs they recorded.
        process = subprocess.Popen([str(SCRIPTS / cls.script), action, str(directory)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            message = f"{cls.script} {action} {directory} ran past {timeout:g} s"
            raise EngineDidNotStart(message) if action == "up" else RuntimeError(message) from None
        done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exited {done.returncode}"]
            raise EngineDidNotStart(lines[-1]) if action == "up" else RuntimeError(
                f"{cls.script} {action} {directory} exited {done.returncode}: {done.stderr.strip()}")

    @classmethod
    def up(cls, directory: Path) -> "Engine":
        """Bring it up under ``directory``; raises ``EngineDidNotStart`` saying why not (what
        it had made is left for ``down``)."""
        cls.run_script("up", directory, timeout=120)
        return cls(Path(directory))

    @classmethod
    def down(cls, directory: Path) -> None:
        """Take it down; removing 100 k pages takes minutes on a busy machine."""
        cls.run_script("down", directory, timeout=3600)

    @classmethod
    @contextlib.contextmanager
    def volume(cls, directory: Path) -> Iterator["Engine"]:
        """A volume under ``directory`` for the duration of the block; always taken down."""
        try:
            yield cls.up(directory)
        finally:
            cls.down(directory)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (stopped daemons linger as zombies here, so kill -0 is no proof)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
