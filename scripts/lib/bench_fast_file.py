"""A peer for ``bench.py``: the core of SGLang's ``fast_file`` backend (open PR #39880, not in
SGLang 0.5.23), in our own few lines; not a benchmark by itself.

What the PR's backend does at its heart, and nothing else: ``pwritev``/``preadv`` straight
between the host pool's page buffers (``get_page_buffer_meta``, the pieces our client's
zero-copy path uses too) and one plain file per page, published with a temporary file and a
rename, with the reads of a call spread over a pool of threads. Left out: its eviction, free-
space floor, metadata cache, staged fallback for other layouts and namespace directories.

Setting, chosen by measurement on tmpfs on the 2-core development VM (128 pages of 1 MiB:
reads 5.5 GB/s on one thread, 10.3 on four; 8 pages of 128 KiB: 0.17 ms a call on one thread,
0.27 on four): reads in runs of at least 1 MiB on up to ``READ_THREADS`` threads (one run, so
no hand-off, for a call of 1 MiB or less); writes one page after another, as the PR's backup
path does.

Thread-safe for calls on different keys; blocks on the filesystem.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import secrets
import shutil
from pathlib import Path
from typing import List

from .bench_sglang import Pool

READ_THREADS = 4
MIN_RUN_BYTES = 1 << 20


class FastFileCore:
    """One rank's pages of ``pool`` as files ``<key>.bin`` in ``directory``."""

    label = "core of SGLang PR #39880 (not in 0.5.23)"

    def __init__(self, directory: Path, pool: Pool) -> None:
        self.directory, self.pool = Path(directory), pool
        self.directory.mkdir(parents=True, exist_ok=True)
        self.threads = concurrent.futures.ThreadPoolExecutor(READ_THREADS)

    def _buffers(self, count: int) -> List[List[memoryview]]:
        """Per page of the call, memoryviews of its pieces in the pool (K, then V)."""
        ptrs, sizes = self.pool.host.get_page_buffer_meta(self.pool.indices[: count * self.pool.ps])
        per_page = len(ptrs) // count
        views = [memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")
                 for ptr, size in zip(ptrs, sizes)]
        return [views[i * per_page:(i + 1) * per_page] for i in range(count)]

    def write(self, keys: List[str]) -> bool:
        """Publish every page: a temporary file, one pwritev, a rename onto the key's file."""
        for key, page in zip(keys, self._buffers(len(keys))):
            tmp = self.directory / f".{key}.{secrets.token_hex(4)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                written = os.pwritev(fd, page, 0)
            finally:
                os.close(fd)
            if written != self.pool.page_bytes:
                tmp.unlink()
                return False
            os.rename(tmp, self.directory / f"{key}.bin")
        return True

    def _read_run(self, keys: List[str], pages: List[List[memoryview]]) -> int:
        for n, (key, page) in enumerate(zip(keys, pages)):
            try:
                fd = os.open(self.directory / f"{key}.bin", os.O_RDONLY)
            except FileNotFoundError:
                return n
            try:
                if os.preadv(fd, page, 0) != self.pool.page_bytes:
                    return n
            finally:
                os.close(fd)
        return len(keys)

    def read(self, keys: List[str]) -> int:
        """Read the pages into the pool; how many were read before the first miss."""
        pages = self._buffers(len(keys))
        per_run = max(-(-len(keys) // READ_THREADS), -(-MIN_RUN_BYTES // self.pool.page_bytes))
        starts = range(0, len(keys), per_run)
        if len(starts) == 1:
            done = [self._read_run(keys, pages)]
        else:
            done = list(self.threads.map(lambda s: self._read_run(keys[s:s + per_run],
                                                                  pages[s:s + per_run]), starts))
        read = 0
        for start, n in zip(starts, done):
            read += n
            if n < min(per_run, len(keys) - start):
                break
        return read

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        self.threads.shutdown()
