"""A real block device that fails on demand, for the disk tier's directory (needs root).

An ext4 filesystem on a loop device whose backing file lives on a small tmpfs of its own.
``fail()`` kills the device the way a dying SSD goes: the tmpfs is filled, so the loop device
can write no new block (every write fails with an I/O error), and the backing file is cut to
nothing, so every read fails with EIO. ext4 then aborts its journal and turns read-only, as it
does on real media errors. Nothing in the daemon knows it is being tested.

The kernel here has no device-mapper (no ``dmsetup`` ``error``/``flakey`` targets), which is why
the failure comes from under the loop device instead. Every mount and loop device made is
removed by ``remove()``; use it as a context manager.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

MiB = 1 << 20


def _run(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()


class FailingDisk:
    """ext4 on a loop device on a private tmpfs; ``path`` is where the disk tier goes."""

    def __init__(self, workdir: Path, size: int = 128 * MiB) -> None:
        self.workdir = Path(workdir)
        self.size = size
        self.backing = self.workdir / "backing"
        self.image = self.backing / "ssd.img"
        self.path = self.workdir / "ssd"
        self.loop: str | None = None
        self.failed = False

    def __enter__(self) -> FailingDisk:
        try:
            self.make()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def make(self) -> None:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        # Room for the filesystem's own blocks and every page written, not more: fill() is quick.
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size + 8 * MiB}", "hicachefs-failing-disk", str(self.backing))
        with open(self.image, "wb") as image:
            image.truncate(self.size)
        self.loop = _run("losetup", "--find", "--show", str(self.image))
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", self.loop)
        _run("mount", "-o", "errors=remount-ro", self.loop, str(self.path))

    def fail(self) -> None:
        """From now on every read and every write of the device fails."""
        _run("sync", "-f", str(self.path))  # what the filesystem wrote so far is on the device
        os.truncate(self.image, 0)  # first: cutting it frees the tmpfs's room, filling takes it all
        filler = os.open(self.backing / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for chunk in (bytes(MiB), bytes(4096), b"\0"):  # to the last byte
                while True:
                    try:
                        os.write(filler, chunk)
                    except OSError:
                        break
        finally:
            os.close(filler)
        self.failed = True
        # The filesystem finds out when it next writes its journal and then starts a change; make
        # that now rather than at its next commit or the daemon's next write.
        deadline = time.monotonic() + 10
        attempt = 0
        while not self.is_read_only() and time.monotonic() < deadline:
            try:
                fd = os.open(self.path / f"failing-{attempt}", os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                pass
            attempt += 1
        if not self.is_read_only():
            raise RuntimeError(f"ext4 on {self.loop} did not notice its device failing")

    def drop_cache(self, path: Path) -> None:
        """Forget the page cache of a file on the device, so that reading it goes to the device."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def is_read_only(self) -> bool:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if fields[1] == os.path.realpath(self.path):  # ext4 shows an abort as emergency_ro
                    return bool({"ro", "emergency_ro"} & set(fields[3].split(",")))
        return False

    def remove(self) -> None:
        """Unmount the filesystem (lazily if something still holds it), detach, drop the tmpfs."""
        for target in (self.path, self.backing):
            if _mounted(target) and subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
            if target == self.path and self.loop:
                subprocess.run(["losetup", "-d", self.loop], capture_output=True)
                self.loop = None


def _mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)
