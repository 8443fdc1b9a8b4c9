"""A peer for ``bench.py``: memcpy into the pool, the floor under any store's reads, measured in
the same run as the stores; not a benchmark by itself.

``MemcpyPeer`` is a "store" held in one plain, page-aligned numpy array: a write copies each
page's pieces out of the host pool's page buffers (``get_page_buffer_meta``, the same pieces
hicachefs's client and the fast_file core move) into the next free place of the array, a read
copies them back into the pool. One thread, no system call: what a page costs when nothing but
its bytes moves. The array holds every page of a case, faulted in when it is made, so a read
comes from memory, not from the CPU's caches, as a first read from a store does.

Not thread-safe (one bench thread calls it).
"""

from __future__ import annotations

import ctypes
from typing import Dict, List, Tuple

import numpy as np

from .bench_sglang import Pool

PAGE = 4096


class MemcpyPeer:
    """Room for ``pages`` pages of ``pool``."""

    label = "numpy copy between the pool's page buffers and an array holding every page, one thread"

    def __init__(self, pool: Pool, pages: int) -> None:
        self.pool = pool
        size = pool.page_bytes * max(1, pages)
        raw = np.empty(size + PAGE, np.uint8)
        self.store = raw[(-raw.ctypes.data) % PAGE:][:size]
        self.store.fill(0)  # faulted in now: the writes measure the copy, not the kernel's first touch
        self.capacity = max(1, pages)  # the warm-up pages included (the caller adds them)
        self.where: Dict[str, int] = {}
        self._pieces: Dict[int, List[List[np.ndarray]]] = {}

    def _page_pieces(self, count: int) -> List[List[np.ndarray]]:
        """Per page of a call of ``count`` pages, numpy views of its pieces in the pool."""
        made = self._pieces.get(count)
        if made is None:
            ptrs, sizes = self.pool.host.get_page_buffer_meta(self.pool.indices[: count * self.pool.ps])
            per_page = len(ptrs) // count
            views = [np.frombuffer((ctypes.c_ubyte * size).from_address(ptr), np.uint8)
                     for ptr, size in zip(ptrs, sizes)]
            made = self._pieces[count] = [views[i * per_page:(i + 1) * per_page] for i in range(count)]
        return made

    def _spans(self, pieces: List[np.ndarray], start: int) -> List[Tuple[np.ndarray, np.ndarray]]:
        spans, at = [], start
        for piece in pieces:
            spans.append((piece, self.store[at:at + piece.size]))
            at += piece.size
        return spans

    def write(self, keys: List[str]) -> bool:
        for key, pieces in zip(keys, self._page_pieces(len(keys))):
            slot = self.where.get(key)
            if slot is None:
                if len(self.where) >= self.capacity:
                    return False
                slot = self.where[key] = len(self.where)
            for piece, room in self._spans(pieces, slot * self.pool.page_bytes):
                np.copyto(room, piece)
        return True

    def read(self, keys: List[str]) -> int:
        for n, (key, pieces) in enumerate(zip(keys, self._page_pieces(len(keys)))):
            slot = self.where.get(key)
            if slot is None:
                return n
            for piece, room in self._spans(pieces, slot * self.pool.page_bytes):
                np.copyto(piece, room)
        return len(keys)

    def clear(self) -> None:
        self.where.clear()

    def close(self) -> None:
        self.where.clear()
