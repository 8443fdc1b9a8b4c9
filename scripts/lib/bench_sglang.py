"""What SGLang 0.5.23 does with a storage backend, reproduced for ``bench.py`` and its rank
workers (``bench_rank.py``); not a benchmark by itself.

- ``as_sglang_runs()``: one torch thread, as SGLang's ``ModelRunner.load_model`` sets on a GPU
  server (``torch.set_num_threads(1)``); the host-pool copies of the generic path run in it.
- ``Shape`` and ``PAGES``: the pages the bench moves, each as one TP rank of a real model stores it
  (SGLang's MHA pool, bf16, K then V).
- ``Pool``: a host pool laid out as SGLang's MHA ``page_first`` pool, page-aligned as SGLang's
  pinned pool is, filled with random bytes, holding one call's pages; every written batch is
  stamped so that each page is unique, and sampled pages are checked byte for byte after a read.
- The calls SGLang's ``HiCacheController`` makes. It picks them by backend type: the zero-copy
  ``_page_get_zero_copy``/``_page_set_zero_copy`` only for hf3fs, mooncake (and the other
  built-in zero-copy backends) and for a ``dynamic`` backend with ``interface_v1``; SGLang's
  own ``file`` backend (``HiCacheFile``) gets ``_generic_page_get``/``_generic_page_set``.
  A peer of our own (``bench_fast_file.FastFileCore``) is called by its ``write``/``read``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)  # the path given here wins

from hicachefs_testing.host_pools import MHAHostPool  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    STORAGE_BATCH_SIZE,
    HiCacheFile,
    HiCacheStorageConfig,
)

from .bench_report import size_label  # noqa: E402
from hicachefs_client import HiCacheFS  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A KV page as one TP rank of a model stores it: SGLang's MHA pool, bf16, K then V."""

    model: str
    layers: int
    heads: int      # KV heads on this rank
    head_dim: int
    tokens: int     # tokens per page (SGLang's --page-size)
    tp_size: int

    @property
    def page_bytes(self) -> int:
        return 2 * self.layers * self.heads * self.head_dim * 2 * self.tokens

    @property
    def label(self) -> str:
        return size_label(self.page_bytes)

    def describe(self) -> str:
        return (f"{self.model.split('/')[-1]} at TP{self.tp_size}, {self.tokens} tokens a page "
                f"({self.layers} layers, {self.heads} KV head{'s' * (self.heads > 1)} of "
                f"{self.head_dim})")


LLAMA_1B, LLAMA_8B = "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"
QWEN_05B = "Qwen/Qwen2.5-0.5B-Instruct"
# Llama-3.2-1B has 16 layers and 8 KV heads of 64, Llama-3.1-8B 32 layers and 8 KV heads of 128,
# Qwen2.5-0.5B 24 layers and 2 KV heads of 64.
PAGES = {shape.label: shape for shape in (
    Shape(LLAMA_1B, 16, 1, 64, 32, 8),    # 128 KiB: a small model at TP8
    Shape(LLAMA_1B, 16, 1, 64, 64, 8),    # 256 KiB
    Shape(QWEN_05B, 24, 2, 64, 64, 1),    # 768 KiB: 64 tokens x 24 layers (scripts/sglang_calls.py)
    Shape(LLAMA_8B, 32, 1, 128, 64, 8),   # 1 MiB
    Shape(LLAMA_8B, 32, 8, 128, 64, 1),   # 8 MiB
)}
MIB = 1 << 20
TORCH_THREADS = 1
# Bytes between the starts of two token rows in the random block of Pool's fill: 4 KiB-aligned
# pieces of two rows can only match when the rows are 512 apart and the pieces 397,312 bytes.
_ROW_SHIFT = 8 * 97


def as_sglang_runs() -> None:
    """The process runs its torch work as inside an SGLang server on a GPU."""
    torch.set_num_threads(TORCH_THREADS)
    _keep_freed_memory()


def _keep_freed_memory() -> None:
    """SGLang's staging pages (``get_dummy_flat_data_page``) are pinned host memory from CUDA's
    caching host allocator, which keeps freed blocks for the next call. Torch's CPU allocator
    leaves them to glibc, which hands large freed blocks back to the kernel and faults them in
    again on a later call: a quarter of a million page faults, twice the CPU time, in one call
    of 128 pages of 8 MiB here. Make glibc keep them, as that cache does."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameters (malloc.h)
    libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum: blocks up to 32 MiB from the heap
    libc.mallopt(m_trim_threshold, (1 << 31) - 1)  # and never give the heap's top back


def storage_config(tp_rank: int, tp_size: int, extra: dict, model: str) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config=dict(extra))


def make_hicachefs(mount: Path, pool: "Pool", client: dict = None, model: str = "") -> HiCacheFS:
    """``HiCacheFS`` as SGLang's dynamic backend factory builds it, zero copy (``interface_v1``).
    ``client``: more extra_config keys (``read_threads``, ``write_threads``)."""
    extra = {"backend_name": "hicachefs", "module_path": "hicachefs_client",
             "class_name": "HiCacheFS", "interface_v1": 1, "mountpoint": str(mount),
             **(client or {})}
    backend = HiCacheFS(storage_config(pool.tp_rank, pool.shape.tp_size, extra,
                                       model or pool.shape.model), {})
    backend.register_mem_pool_host(pool.host)
    return backend


def make_file(directory: Path, pool: "Pool", model: str = "") -> HiCacheFile:
    """``HiCacheFile`` with its defaults (no size cap, metadata cache off), in ``directory``."""
    backend = HiCacheFile(storage_config(pool.tp_rank, pool.shape.tp_size, {},
                                         model or pool.shape.model),
                          file_path=str(directory))
    backend.register_mem_pool_host(pool.host)
    return backend


def keys_for(tag: str, count: int = STORAGE_BATCH_SIZE) -> List[str]:
    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(count)]


class AlignedMHAHostPool(MHAHostPool):
    """The MHA host pool double with its buffer on a 4 KiB boundary, as SGLang's pinned host
    pool is on a GPU server (cudaHostAlloc memory is page-aligned); a plain torch CPU tensor
    is only 64-byte aligned, which costs FUSE one more request per page (a request carries at
    most 256 whole memory pages)."""

    def fill_random(self, seed):
        """Random bytes, made fast (fresh randomness for a GiB takes seconds with one thread):
        one random block, each token row a window of it starting ``_ROW_SHIFT`` bytes after the
        previous row's, so no two pages, and no two 4 KiB-aligned pieces, are alike."""
        nbytes = self.kv_buffer.numel() * self.kv_buffer.element_size()
        if self.kv_buffer.data_ptr() % 4096:
            raw = np.empty(nbytes + 4096, np.uint8)
            start = (-raw.ctypes.data) % 4096
            aligned = torch.from_numpy(raw[start:start + nbytes])
            self.kv_buffer = aligned.view(self.dtype).view(self.dims())
        rows = self.kv_buffer.view(-1).view(torch.uint8).numpy()
        rows = rows.reshape(-1, self.kv_buffer[0, 0].numel() * self.kv_buffer.element_size())
        count, width = rows.shape
        block = np.random.default_rng(seed).integers(0, 256, count * _ROW_SHIFT + width, np.uint8)
        np.copyto(rows, np.lib.stride_tricks.as_strided(block, (count, width), (_ROW_SHIFT, 1)))


class Pool:
    """An MHA page_first host pool of one call's pages (+1 padding), with stamps and checks:
    ``shape``'s pages for TP rank ``tp_rank``, ``batch`` of them (a call of SGLang's)."""

    def __init__(self, shape: Shape, batch: int = STORAGE_BATCH_SIZE, tp_rank: int = 0,
                 seed: int = 0) -> None:
        self.shape, self.batch, self.tp_rank = shape, batch, tp_rank
        self.host = AlignedMHAHostPool(layer_num=shape.layers, head_num=shape.heads,
                                       head_dim=shape.head_dim, page_size=shape.tokens,
                                       pages=batch, dtype=torch.bfloat16, layout="page_first")
        if seed:
            self.host.fill_random(seed)
        self.page_bytes = shape.page_bytes
        self.ps = shape.tokens
        assert self.host.kv_buffer.data_ptr() % 4096 == 0
        # kv_buffer[2, tokens, layers, heads, head_dim] as bytes
        self.u8 = self.host.kv_buffer.view(torch.int16).numpy().view(np.uint8)
        self.indices = torch.arange(0, batch * self.ps, dtype=torch.int64)
        # Pages checked byte for byte after every read: the first two, the last, and some between.
        self.sample_slots = sorted({0, 1, batch // 3, batch // 2, 4 * batch // 5, batch - 1})
        self.reference = {s: self.page(s).copy() for s in self.sample_slots}

    def page(self, slot: int) -> np.ndarray:
        """The flat page bytes of ``slot`` (K then V), as SGLang's get_data_page gives them."""
        flat = self.host.get_data_page(slot * self.ps, flat=True)
        return flat.view(torch.int16).numpy().view(np.uint8)

    @staticmethod
    def tag(batch_tag: str, slot: int) -> np.ndarray:
        return np.frombuffer(hashlib.md5(f"{batch_tag}/{slot}".encode()).digest(), np.uint8)

    def stamp(self, batch_tag: str) -> None:
        """Make every page of the next batch unique: 16 bytes at the start of its K and V."""
        for slot in range(self.batch):
            t = self.tag(batch_tag, slot)
            self.u8[0, slot * self.ps, 0, 0, :16] = t
            self.u8[1, slot * self.ps, 0, 0, :16] = t

    def scribble(self, slots: Sequence[int]) -> None:
        """Overwrite pages ``slots`` so that a read which does not land shows."""
        for s in slots:
            self.u8[:, s * self.ps:(s + 1) * self.ps] = 0xA5

    def check(self, batch_tag: str, read: int, slots: Sequence[int]) -> Tuple[int, int]:
        """Whether pages ``slots`` (sampled ones) among the first ``read`` hold exactly what was
        written under ``batch_tag``: (pages checked, pages wrong); a page not read is a miss,
        counted as such elsewhere."""
        checked = bad = 0
        half = self.page_bytes // 2
        for s in slots:
            if s >= read:
                continue
            ref = self.reference[s]
            want = ref.copy()
            t = self.tag(batch_tag, s)
            want[:16] = t
            want[half:half + 16] = t
            checked += 1
            bad += not np.array_equal(self.page(s), want)
        return checked, bad


# ---------------------------------------------------------------------------- the calls


def file_write(backend: HiCacheFile, pool: Pool, keys: List[str]) -> bool:
    """CacheController._generic_page_set: get_data_page of every page, then batch_set."""
    host_indices, ps = pool.indices, pool.ps
    data = [pool.host.get_data_page(host_indices[i * ps]) for i in range(len(keys))]
    return backend.batch_set(keys, data)


def file_read(backend: HiCacheFile, pool: Pool, keys: List[str]) -> int:
    """CacheController._generic_page_get: staging pages, batch_get, set_from_flat_data_page."""
    host_indices, ps = pool.indices, pool.ps
    dummy_page_dst = [pool.host.get_dummy_flat_data_page() for _ in keys]
    page_data = backend.batch_get(keys, dummy_page_dst)
    if page_data is None:
        return 0
    count = 0
    for i in range(len(keys)):
        if page_data[i] is None:
            break
        pool.host.set_from_flat_data_page(host_indices[i * ps], page_data[i])
        count += 1
    return count


def fs_write(backend: HiCacheFS, pool: Pool, keys: List[str]) -> bool:
    """CacheController._page_set_zero_copy, timed until its commit is answered (the call itself
    returns before: ``commit_behind``), so that a write's figure holds all it costs, and the
    commit runs under no other backend's call."""
    stored = all(backend.batch_set_v1(keys, pool.indices[: len(keys) * pool.ps]))
    backend.settle()
    return stored


def fs_read(backend: HiCacheFS, pool: Pool, keys: List[str]) -> int:
    """CacheController._page_get_zero_copy: the pages read before the first miss (into the
    pool's first ``len(keys)`` pages)."""
    results = backend.batch_get_v1(keys, pool.indices[: len(keys) * pool.ps])
    return results.index(False) if False in results else len(results)


def writer(backend, pool: Pool):
    if isinstance(backend, HiCacheFS):
        return lambda keys: fs_write(backend, pool, keys)
    if isinstance(backend, HiCacheFile):
        return lambda keys: file_write(backend, pool, keys)
    return backend.write  # a peer of our own, which knows its pool


def reader(backend, pool: Pool):
    if isinstance(backend, HiCacheFS):
        return lambda keys: fs_read(backend, pool, keys)
    if isinstance(backend, HiCacheFile):
        return lambda keys: file_read(backend, pool, keys)
    return backend.read


@dataclass
class Call:
    """What one timed call did."""

    seconds: float
    cpu: float      # this process's CPU time in the call, all its threads
    pages: int      # written, or read before the first miss
    failed: int
    checked: int    # sampled pages compared byte for byte after a read
    bad: int        # of those, the pages whose bytes were wrong


def timed_call(pool: Pool, tag: str, keys: List[str], op, write: bool,
               slots: Optional[Sequence[int]] = None) -> Call:
    """One call of ``op`` (a ``writer`` or ``reader``) on the batch ``tag``, timed. A write
    stamps the pool's pages first (each page unique); a read overwrites pages ``slots`` (by
    default the pool's sampled ones) first and checks them after."""
    slots = pool.sample_slots if slots is None else slots
    if write:
        pool.stamp(tag)
    else:
        pool.scribble(slots)
    start, start_cpu = time.perf_counter(), time.process_time()
    outcome = op(keys)
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if write:
        return Call(seconds, cpu, len(keys), 0 if outcome else len(keys), 0, 0)
    checked, bad = pool.check(tag, outcome, slots)
    return Call(seconds, cpu, outcome, len(keys) - outcome, checked, bad)


def warm_up(backend, pool: Pool, tag: str) -> None:
    """One untimed page before a pass of writes, left in place: it makes the pool's directories
    and opens the client's handles (a new pool's first batch costs hicachefs a failed try and a
    status read per page, once), so that the pass measures what every later batch costs."""
    writer(backend, pool)(keys_for(f"{tag}/warm-up", 1))


def found_then_read(backend, pool: Pool):
    """A prefetch as SGLang runs it: batch_exists, then the read of the pages it found."""
    read = reader(backend, pool)

    def op(keys: List[str]) -> int:
        found = backend.batch_exists(keys)
        return read(keys[:found]) if found else 0

    return op
