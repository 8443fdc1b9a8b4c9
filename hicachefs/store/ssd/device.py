"""The one file a persistent tier lives in, behind a small interface (CacheLib Navy's Device).

Every byte the SSD tier moves goes through these methods, so tests wrap a ``FileDevice`` in a
``faults.FaultyDevice`` to make reads and writes fail, stall, come up short or come back
corrupt. Offsets are absolute in the file. Methods block on I/O and raise ``OSError``;
``pread``/``preadv`` may run in several threads at once (positional I/O shares no offset).

The file is the opener's alone: a ``FileDevice`` holds an exclusive ``flock`` on it until it is
closed (for the daemon, its life; the kernel drops the lock when the process dies), so a second
store on the same arena, two daemons sharing one ``--disk`` directory, is refused instead of
each overwriting the other's records. A symbolic link, or anything but a regular file, at the
arena's name is refused before it is opened: the tier would resize and format whatever it
points to.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from hicachefs.store.errors import StoreError

#: File types an arena cannot be, as named in the refusal.
_NOT_FILES = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
              stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


class ArenaRefused(StoreError):
    """Raised when a tier's arena file is not ours to use: a symbolic link, not a regular file,
    held by another store (another daemon), or a file with foreign content. Nothing was
    changed; the message says in one line what was found."""


class FileDevice:
    """A regular file opened read-write (created if missing), addressed by offset, and locked."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd = _open_regular_file(self.path)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(self.fd)
            os.close(self.fd)
            held_by = f" (pid {holder})" if holder is not None else ""
            raise ArenaRefused(f"{self.path} is in use by another hicachefs daemon{held_by}") from None
        except BaseException:
            os.close(self.fd)
            raise

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def preadv(self, buffers, offset: int) -> int:
        return os.preadv(self.fd, buffers, offset)

    def pwrite(self, data, offset: int) -> int:
        return os.pwrite(self.fd, data, offset)

    def pwritev(self, buffers, offset: int) -> int:
        return os.pwritev(self.fd, buffers, offset)

    def allocate(self, size: int) -> None:
        """Make the file exactly ``size`` bytes with its blocks reserved (no ENOSPC later)."""
        os.ftruncate(self.fd, size)
        os.posix_fallocate(self.fd, 0, size)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _open_regular_file(path: Path) -> int:
    """Open ``path`` read-write, made if missing, refusing a symlink or a file of another type
    (looked at before opening: opening a FIFO or a device can block or act)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if stat.S_ISLNK(mode):
        raise ArenaRefused(f"{path} is a symbolic link (to {os.readlink(path)}): refusing to use it")
    if not stat.S_ISREG(mode):
        raise _not_a_file(path, mode)
    try:  # O_NOFOLLOW and O_NONBLOCK: the name may have been replaced since the lstat
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArenaRefused(f"{path} is a symbolic link: refusing to use it") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_a_file(path, mode)
    os.set_blocking(fd, True)
    return fd


def _not_a_file(path: Path, mode: int) -> ArenaRefused:
    kind = _NOT_FILES.get(stat.S_IFMT(mode), "of an unknown type")
    return ArenaRefused(f"{path} is {kind}, not a file: refusing to use it")


def _lock_holder(fd: int) -> int | None:
    """The PID that holds the flock on ``fd``'s file, from /proc/locks; None if not found."""
    status = os.fstat(fd)
    inode = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:  # "1: FLOCK  ADVISORY  WRITE 4242 fd:00:131077 0 EOF"
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:  # not a waiter ('->')
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    return None
