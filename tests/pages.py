"""Writing and reading pages the way the contract says a client does (for the FUSE tests).

Page bytes and the exists query: ``hicachefs_testing.workload`` (the scripts use them too).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path


def publish(pool_dir: Path, key: str, data: bytes, size_hint: bool = True) -> Path:
    """Temporary file, (size hint,) write, close, rename to the key."""
    tmp = pool_dir / f".tmp-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if size_hint:
            os.ftruncate(fd, len(data))
        write_all(fd, data)
    finally:
        os.close(fd)
    os.rename(tmp, pool_dir / key)
    return pool_dir / key


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)


def read_page(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        offset = 0
        while chunk := os.pread(fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def ingest_batch(fd: int, pages: list[tuple[str, bytes]], flags: int = 0) -> int:
    """Write one batch to an ingest handle as DESIGN.md lays it out; the bytes accepted."""
    import struct

    header = b"".join(f"{len(data)} {path}\n".encode() for path, data in pages)
    prefix = struct.pack("<8sIHH", b"HCFSPUT1", len(header), len(pages), flags)
    return os.pwritev(fd, [prefix, header, *(data for _, data in pages)], 0)


def ingest_status(fd: int) -> tuple[int, int]:
    """(pages of the last batch published, errno of the page that failed or 0)."""
    published, err = os.pread(fd, 64, 0).split()
    return int(published), int(err)


def fetch_pages(fd: int, pages: list[tuple[str, int]], offset: int = 0, size: int | None = None) -> bytes:
    """Ask a fetch handle for pages (path, size), then read from ``offset`` (all by default)."""
    import numpy as np

    os.write(fd, b"".join(f"{n} {path}\n".encode() for path, n in pages))
    total = sum(n for _, n in pages) - offset if size is None else size
    raw = np.empty(total + 4096, np.uint8)  # page-aligned, as a host pool is
    buffer = raw[(-raw.ctypes.data) % 4096:][:total]
    done = os.preadv(fd, [buffer], offset)
    return buffer[:done].tobytes()


def as_nobody(*command: str):
    """Run a command as the unprivileged user ``nobody``."""
    import subprocess

    return subprocess.run(command, user=65534, group=65534, capture_output=True, text=True, timeout=60)


def requests_of(mount, action):
    """The FUSE requests ``action()`` cost the mount's daemon (its stats' counts, less what
    reading the stats costs itself), and what it returned."""
    from collections import Counter

    def between(before: dict, after: dict) -> Counter:
        return Counter(after["requests"]) - Counter(before["requests"])

    mount.stats()  # so that every read of the stats below costs the same (their attributes)
    reading = between(mount.stats(), mount.stats())
    before = mount.stats()
    result = action()
    return between(before, mount.stats()) - reading, result


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.01) -> float:
    """Wait for ``predicate``; return the seconds it took. Fails the test after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start
