"""Writing and reading pages the way the contract says a client does (for the FUSE tests)."""

from __future__ import annotations

import os
import uuid
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


def pattern(size: int, seed: int = 0) -> bytes:
    """Bytes that differ at every position and between seeds, so a misplaced byte shows."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size, dtype=np.uint8).tobytes()
