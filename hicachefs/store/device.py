"""The one file a persistent tier lives in, behind a small interface (CacheLib Navy's Device).

Every byte the SSD tier moves goes through these methods, so tests wrap a ``FileDevice`` in a
``faults.FaultyDevice`` to make reads and writes fail, stall, come up short or come back
corrupt. Offsets are absolute in the file. Methods block on I/O and raise ``OSError``;
``pread``/``preadv`` may run in several threads at once (positional I/O shares no offset).
"""

from __future__ import annotations

import os
from pathlib import Path


class FileDevice:
    """A regular file opened read-write (created if missing), addressed by offset."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

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

    def drop_cache(self) -> None:
        """Write back and evict this file from the kernel's page cache (benchmarks)."""
        os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        os.close(self.fd)
