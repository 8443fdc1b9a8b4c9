"""Every filesystem call the shared tier makes, in one small class (its "device").

Tests wrap a ``DirectoryDevice`` in ``faults.FaultyDevice`` to make any of these calls fail
with an errno (ENOTCONN, ESTALE, EIO, ENOSPC), hang, write short or read back flipped bits,
the same way the SSD tier's ``FileDevice`` is tested. Data-carrying methods take their buffers
first, which is the shape ``FaultyDevice`` expects for short writes and flipped reads.

Paths are absolute. Every method may block for as long as the filesystem takes (a dead
distributed filesystem: forever) and raises ``OSError``; callers bound them with
``guard.CallGuard``. Thread-safe: it holds no state.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import NamedTuple

from hicachefs.store.shared import engine_checks

#: The pauses between tries of a call racing another host's making of the same directories.
RACE_PAUSES_S = (0.05, 0.25, 1.0)
#: The errnos of a file another host removed or replaced: a plain miss, not a failure.
GONE = (errno.ENOENT, errno.ESTALE)


class Entry(NamedTuple):
    """One name in a directory listing, with what the listing learned about it."""

    name: str
    is_dir: bool
    size: int
    mtime_ns: int


class DirectoryDevice:
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def preadv(self, buffers: list, fd: int, offset: int) -> int:
        return os.preadv(fd, buffers, offset)

    def pwritev(self, buffers: list, fd: int, offset: int) -> int:
        return os.pwritev(fd, buffers, offset)

    def write(self, data: bytes, fd: int) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def mount_of(self, path: str) -> tuple[str, int, str] | None:
        """The mountpoint, mount ID and filesystem (its type, source and the directory of it
        mounted there) of the mount ``path`` lies on (``engine_checks.mount_of``): they change
        when a volume is mounted over it, or unmounted from under it; the filesystem stays when
        the same volume is mounted again, and differs for another directory of it (a bind mount
        of another tier's directory: its pages are not this tier's)."""
        mount = engine_checks.mount_of(path)
        return None if mount is None else (mount.mountpoint, mount.mount_id,
                                           f"{mount.fstype} {mount.source} {mount.root}")

    def makedirs(self, path: str, before_retry: Callable[[], object] = lambda: None) -> None:
        """``os.makedirs``, tried again when another host makes the same directories at once:
        GlusterFS then answered ENOENT for a parent both had just made, until the kernel's
        entry for it (1 s) expired, or EEXIST for the directory itself while a stat of it
        still said ENOENT (which ``exist_ok`` does not forgive: FileExistsError), or ESTALE for
        the parent the other host had just made (a handle its kernel had not looked up yet).
        ``before_retry`` is called after each pause and raises where nothing may be made any
        more (the volume unmounted meanwhile: the next try would make the tree on the bare
        mountpoint, found by review)."""
        for pause in RACE_PAUSES_S:
            try:
                os.makedirs(path, exist_ok=True)
                return
            except (FileNotFoundError, FileExistsError):
                pass
            except OSError as error:
                if error.errno != errno.ESTALE:
                    raise
            time.sleep(pause)
            before_retry()
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def scandir(self, path: str) -> list[Entry]:
        """The directory's entries with size and mtime. On FUSE filesystems the listing
        (READDIRPLUS) fills the kernel's attribute cache, so the per-entry stat is local."""
        entries = []
        with os.scandir(path) as listing:
            for item in listing:
                try:
                    stat = item.stat(follow_symlinks=False)
                except OSError as error:
                    if error.errno in GONE:
                        continue  # removed since the listing (another host evicted it)
                    raise
                entries.append(Entry(item.name, item.is_dir(follow_symlinks=False), stat.st_size, stat.st_mtime_ns))
        return entries

    def statvfs(self, path: str) -> os.statvfs_result:
        return os.statvfs(path)
