#!/usr/bin/env python3
"""hicachefs beside SGLang's own ``file`` backend (``HiCacheFile``), driven as SGLang drives them.

Both backends get exactly the calls SGLang 0.5.23's cache controller makes, in batches of 128
pages (``STORAGE_BATCH_SIZE``), on one host pool laid out as SGLang's MHA ``page_first`` pool
and filled with random bytes (each written page also carries a unique stamp):
  - ``HiCacheFile``: the controller's generic path. Write: ``get_data_page`` of every page, then
    ``batch_set``. Read: one ``get_dummy_flat_data_page`` staging page per key, ``batch_get``
    into them, then ``set_from_flat_data_page`` back into the host pool.
  - hicachefs (``HiCacheFS`` on a mount this script makes and removes): the zero-copy v1 path,
    ``batch_set_v1`` / ``batch_get_v1`` with host indices.
  - existence: ``batch_exists`` of 128 stored keys with 100,000 pages stored (20,000 with --quick).

Cases: hicachefs RAM tier vs ``HiCacheFile`` on tmpfs (/dev/shm); hicachefs SSD tier, cold
(a small RAM tier, so pages are demoted to --disk on the root filesystem, then
``sync; echo 3 > /proc/sys/vm/drop_caches``) vs ``HiCacheFile`` on the same disk filesystem,
cold. Page sizes 1 MiB (Llama-3.1-8B at TP8: 32 layers x K,V x 1 head x 128 x bf16 x 64 tokens)
and 8 MiB (the same at TP1, 8 KV heads). A sample of pages read back is checked byte for byte.

Prints a table (GB/s, pages/s, p50/p99 per batch, ratio hicachefs/HiCacheFile, fraction of
the memcpy rate measured in the same run, FUSE requests per page) and writes a PNG chart.
Needs root (drop_caches, FUSE). About 8 minutes; --quick about one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from tqdm import tqdm

os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)  # the path given here wins

from hicachefs.testing import mounting  # noqa: E402
from hicachefs.testing.host_pools import MHAHostPool  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    STORAGE_BATCH_SIZE,
    HiCacheFile,
    HiCacheStorageConfig,
)

from hicachefs_client import HiCacheFS  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LAYERS, HEAD_DIM, TOKENS_PER_PAGE = 32, 128, 64
# page MiB -> (KV heads per rank, TP size): Llama-3.1-8B has 8 KV heads.
SHAPES = {1: (1, 8), 8: (8, 1)}
MIB = 1 << 20
HICACHEFS, FILE = "hicachefs", "HiCacheFile"


# ---------------------------------------------------------------------------- plan


@dataclass
class Plan:
    """How much each case moves. Volumes are per backend."""

    ram_memory: str            # --memory of the RAM-tier mount
    ram_batches: Dict[int, int]  # page MiB -> batches written per round (kept for reads)
    ram_write_rounds: int      # rounds of writes (all but the last are deleted again)
    ram_read_passes: int       # passes over the kept batches
    ssd_batches: Dict[int, int]
    exists_pages: int
    exists_queries: int
    memcpy_bytes: int


FULL = Plan("5G", {1: 16, 8: 4}, 2, 3, {1: 16, 8: 4}, 100_000, 400, 1 << 30)
QUICK = Plan("2560M", {1: 8, 8: 2}, 1, 2, {1: 6, 8: 2}, 20_000, 100, 256 << 20)
SSD_MEMORY, SSD_MAX_PAGE, SSD_DISK_SIZE = "128M", "16M", "8G"


# ---------------------------------------------------------------------------- helpers


def storage_config(tp_size: int, model: str = MODEL) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config={})


def make_hicachefs(mount: Path, tp_size: int, pool, model: str = MODEL) -> HiCacheFS:
    config = storage_config(tp_size, model)
    config.extra_config = {"backend_name": "hicachefs", "module_path": "hicachefs_client",
                           "class_name": "HiCacheFS", "interface_v1": 1,
                           "mountpoint": str(mount)}
    backend = HiCacheFS(config, {})
    backend.register_mem_pool_host(pool)
    return backend


def make_file(directory: Path, tp_size: int, pool, model: str = MODEL) -> HiCacheFile:
    backend = HiCacheFile(storage_config(tp_size, model), file_path=str(directory))
    backend.register_mem_pool_host(pool)
    return backend


def sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("sglang")
    except PackageNotFoundError:
        return "?"


def fs_type(path: Path) -> str:
    out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def keys_for(tag: str, count: int) -> List[str]:
    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(count)]


def memcpy_rate(size: int, repeats: int = 5) -> float:
    """GB/s of a numpy copy between two large buffers (bytes copied per second), median."""
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault both in
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        rates.append(size / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def kernel_copy_rate(directory: Path, size: int = 8 * MIB, repeats: int = 64) -> float:
    """GB/s of preadv from a hot tmpfs file into a resident, page-aligned buffer: what one
    kernel-to-user copy costs here (every file-based store pays at least this on a read)."""
    raw = np.empty(size + 4096, np.uint8)
    buf = raw[(-raw.ctypes.data) % 4096:][:size]
    buf[:] = 7
    path = directory / "kernel-copy-probe"
    buf.tofile(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [buf], 0)
        start = time.perf_counter()
        for _ in range(repeats):
            os.preadv(fd, [buf], 0)
        return size * repeats / (time.perf_counter() - start) / 1e9
    finally:
        os.close(fd)
        path.unlink()


def percentile(values: List[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def request_delta(before: dict, after: dict) -> Dict[str, int]:
    b, a = before.get("requests", {}), after.get("requests", {})
    return {op: a[op] - b.get(op, 0) for op in a if a[op] - b.get(op, 0)}


# ---------------------------------------------------------------------------- host pool


class AlignedMHAHostPool(MHAHostPool):
    """The MHA host pool double with its buffer on a 4 KiB boundary, as SGLang's pinned host
    pool is on a GPU server (cudaHostAlloc memory is page-aligned); a plain torch CPU tensor
    is only 64-byte aligned, which costs FUSE one more request per page (a request carries at
    most 256 whole memory pages)."""

    def fill_random(self, seed):
        if self.kv_buffer.data_ptr() % 4096:
            nbytes = self.kv_buffer.numel() * self.kv_buffer.element_size()
            raw = np.empty(nbytes + 4096, np.uint8)
            start = (-raw.ctypes.data) % 4096
            aligned = torch.from_numpy(raw[start:start + nbytes])
            self.kv_buffer = aligned.view(self.dtype).view(self.dims())
        super().fill_random(seed)


class Pool:
    """An MHA page_first host pool of 128 pages (+1 padding) with stamps and checks."""

    SAMPLE_SLOTS = (0, 1, 37, 64, 101, 127)  # pages checked byte for byte after every read

    def __init__(self, page_mib: int) -> None:
        heads, self.tp_size = SHAPES[page_mib]
        self.host = AlignedMHAHostPool(layer_num=LAYERS, head_num=heads, head_dim=HEAD_DIM,
                                page_size=TOKENS_PER_PAGE, pages=STORAGE_BATCH_SIZE,
                                dtype=torch.bfloat16, layout="page_first")
        self.page_bytes = 2 * LAYERS * heads * HEAD_DIM * 2 * TOKENS_PER_PAGE
        assert self.page_bytes == page_mib * MIB
        self.ps = TOKENS_PER_PAGE
        # kv_buffer[2, tokens, layers, heads, head_dim] as bytes
        assert self.host.kv_buffer.data_ptr() % 4096 == 0
        self.u8 = self.host.kv_buffer.view(torch.int16).numpy().view(np.uint8)
        self.indices = torch.arange(0, STORAGE_BATCH_SIZE * self.ps, dtype=torch.int64)
        self.reference = {s: self.page(s).copy() for s in self.SAMPLE_SLOTS}

    def page(self, slot: int) -> np.ndarray:
        """The flat page bytes of ``slot`` (K then V), as SGLang's get_data_page gives them."""
        flat = self.host.get_data_page(slot * self.ps, flat=True)
        return flat.view(torch.int16).numpy().view(np.uint8)

    @staticmethod
    def tag(batch_tag: str, slot: int) -> np.ndarray:
        return np.frombuffer(hashlib.md5(f"{batch_tag}/{slot}".encode()).digest(), np.uint8)

    def stamp(self, batch_tag: str) -> None:
        """Make every page of the next batch unique: 16 bytes at the start of its K and V."""
        for slot in range(STORAGE_BATCH_SIZE):
            t = self.tag(batch_tag, slot)
            self.u8[0, slot * self.ps, 0, 0, :16] = t
            self.u8[1, slot * self.ps, 0, 0, :16] = t

    def scribble(self) -> None:
        """Overwrite the sampled pages so that a read which does not land shows."""
        for s in self.SAMPLE_SLOTS:
            self.u8[:, s * self.ps:(s + 1) * self.ps] = 0xA5

    def check(self, batch_tag: str) -> int:
        """Sampled pages hold exactly what was written under ``batch_tag``: how many do not."""
        bad = 0
        half = self.page_bytes // 2
        for s, ref in self.reference.items():
            want = ref.copy()
            t = self.tag(batch_tag, s)
            want[:16] = t
            want[half:half + 16] = t
            bad += not np.array_equal(self.page(s), want)
        return bad


# ---------------------------------------------------------------------------- the calls SGLang makes


def file_write(backend: HiCacheFile, pool: Pool, keys: List[str]) -> bool:
    """CacheController._generic_page_set."""
    host_indices, ps = pool.indices, pool.ps
    data = [pool.host.get_data_page(host_indices[i * ps]) for i in range(len(keys))]
    return backend.batch_set(keys, data)


def file_read(backend: HiCacheFile, pool: Pool, keys: List[str]) -> int:
    """CacheController._generic_page_get: staging pages, batch_get, set_from_flat_data_page."""
    host_indices, ps = pool.indices, pool.ps
    dummy_page_dst = [pool.host.get_dummy_flat_data_page() for _ in keys]
    page_data = backend.batch_get(keys, dummy_page_dst)
    count = 0
    for i in range(len(keys)):
        if page_data[i] is None:
            break
        pool.host.set_from_flat_data_page(host_indices[i * ps], page_data[i])
        count += 1
    return count


def fs_write(backend: HiCacheFS, pool: Pool, keys: List[str]) -> bool:
    """CacheController._page_set_zero_copy."""
    return all(backend.batch_set_v1(keys, pool.indices))


def fs_read(backend: HiCacheFS, pool: Pool, keys: List[str]) -> int:
    """CacheController._page_get_zero_copy."""
    results = backend.batch_get_v1(keys, pool.indices)
    return results.index(False) if False in results else len(results)


# ---------------------------------------------------------------------------- measurements


@dataclass
class Result:
    case: str          # "RAM 1 MiB", "SSD cold 8 MiB", "exists"
    op: str            # write / read / exists
    backend: str
    seconds: List[float] = field(default_factory=list)  # per batch
    pages: int = 0
    page_bytes: int = 0
    bad_pages: int = 0
    failed: int = 0
    requests: Dict[str, int] = field(default_factory=dict)
    note: str = ""

    @property
    def total(self) -> float:
        return sum(self.seconds)

    @property
    def gbps(self) -> float:
        return self.pages * self.page_bytes / self.total / 1e9 if self.total else float("nan")

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.total if self.total else float("nan")

    def ms(self, q: float) -> float:
        return percentile(self.seconds, q) * 1e3

    def requests_per_page(self) -> Optional[float]:
        if not self.requests or not self.pages:
            return None
        return sum(self.requests.values()) / self.pages


class Bench:
    def __init__(self, plan: Plan, work: Path, shm: Path, disk: Path) -> None:
        self.plan, self.work, self.shm, self.disk = plan, work, shm, disk
        self.results: List[Result] = []
        self.pools: Dict[int, Pool] = {}

    def pool(self, page_mib: int) -> Pool:
        if page_mib not in self.pools:
            self.pools[page_mib] = Pool(page_mib)
        return self.pools[page_mib]

    def _batches(self, result: Result, pool: Pool, batch_keys: Dict[str, List[str]],
                 op: Callable, write: bool, mount=None, label: str = "") -> Result:
        before = mount.stats() if mount is not None else None
        for tag, keys in tqdm(batch_keys.items(), desc=label, unit="batch", leave=False,
                              file=sys.stderr, dynamic_ncols=True):
            if write:
                pool.stamp(tag)
            else:
                pool.scribble()
            start = time.perf_counter()
            outcome = op(keys)
            result.seconds.append(time.perf_counter() - start)
            if write:
                result.failed += 0 if outcome else len(keys)
                result.pages += len(keys)
            else:
                result.failed += len(keys) - outcome
                result.pages += outcome
                result.bad_pages += pool.check(tag)
        if mount is not None:
            for op, n in request_delta(before, mount.stats()).items():
                result.requests[op] = result.requests.get(op, 0) + n
        return result

    def pages_case(self, tier: str, page_mib: int, mount: mounting.Mount, file_dir: Path) -> None:
        """Write then read one page size on both backends (RAM: warm, SSD: cold reads)."""
        pool = self.pool(page_mib)
        case = f"{'RAM' if tier == 'ram' else 'SSD cold'} {page_mib} MiB"
        file_dir.mkdir(parents=True, exist_ok=True)
        fs = make_hicachefs(mount.path, pool.tp_size, pool.host)
        hf = make_file(file_dir, pool.tp_size, pool.host)
        n = (self.plan.ram_batches if tier == "ram" else self.plan.ssd_batches)[page_mib]
        rounds = self.plan.ram_write_rounds if tier == "ram" else 1
        ops = {
            HICACHEFS: (lambda k: fs_write(fs, pool, k), lambda k: fs_read(fs, pool, k), mount),
            FILE: (lambda k: file_write(hf, pool, k), lambda k: file_read(hf, pool, k), None),
        }
        writes = {b: Result(case, "write", b, page_bytes=pool.page_bytes) for b in ops}
        batch_keys: Dict[str, List[str]] = {}
        for r in range(rounds):
            batch_keys = {f"{case}/r{r}/b{i}": keys_for(f"{case}/r{r}/b{i}", STORAGE_BATCH_SIZE)
                          for i in range(n)}
            for name, (write, _, m) in ops.items():
                self._batches(writes[name], pool, batch_keys, write, True, m,
                              f"{case} write {name} {r + 1}/{rounds}")
                if tier == "ssd":
                    os.sync()  # the next writer does not pay for this one's writeback
            if r < rounds - 1:
                fs.clear()
                hf.clear()
        self.results += writes.values()

        passes = self.plan.ram_read_passes if tier == "ram" else 1
        read_keys = dict(batch_keys)
        note = ""
        if tier == "ssd":
            # Only batches whose every page the daemon holds on disk: a cold read is a disk read.
            directory = Path(mount.path, fs._dir_of("kv"))
            on_disk = {tag: keys for tag, keys in batch_keys.items()
                       if all(os.getxattr(directory / k, "user.hicachefs.tier") == b"disk"
                              for k in keys)}
            note = f"{len(on_disk)} of {len(batch_keys)} batches wholly on the disk tier"
            read_keys = on_disk
        for name, (_, read, m) in ops.items():
            result = Result(case, "read", name, page_bytes=pool.page_bytes, note=note)
            for p in range(passes):
                if tier == "ssd":
                    drop_caches()
                    if name == HICACHEFS:
                        result.note += "; " + self._arena_residency(mount)
                stats_before = m.stats() if m is not None else None
                self._batches(result, pool, read_keys, read, False, m,
                              f"{case} read {name} {p + 1}/{passes}")
                if m is not None and stats_before is not None:
                    after = m.stats()
                    moved = {k: after[k] - stats_before[k] for k in ("promotions", "demotions")}
                    if tier == "ssd":
                        result.note += f"; promotions {moved['promotions']}, demotions {moved['demotions']}"
            self.results.append(result)
        fs.clear()
        fs.close()
        hf.clear()
        shutil.rmtree(file_dir, ignore_errors=True)

    def _arena_residency(self, mount: mounting.Mount) -> str:
        """How much of the disk arena is still in the page cache after dropping it."""
        config = json.loads((mount.path / ".hicachefs" / "config").read_text())
        files = [str(p) for p in Path(config["disk_dir"]).iterdir() if p.is_file()]
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", *files],
                             capture_output=True, text=True)
        resident = sum(int(x) for x in out.stdout.split() if x.isdigit())
        return f"disk arena resident in page cache after drop_caches: {resident / MIB:.0f} MiB"

    def exists_case(self, mount: mounting.Mount, file_dir: Path) -> None:
        """batch_exists of 128 stored keys with many pages stored."""
        pool = self.pool(1)
        model = "bench/exists"
        count = self.plan.exists_pages
        keys = keys_for("exists", count)
        fs = make_hicachefs(mount.path, pool.tp_size, pool.host, model)
        file_dir.mkdir(parents=True, exist_ok=True)
        hf = make_file(file_dir, pool.tp_size, pool.host, model)

        # hicachefs: published through the mount with plain file I/O (64-byte pages).
        directory = Path(mount.path, fs._dir_of("kv"))
        directory.mkdir(parents=True, exist_ok=True)
        payload = b"\0" * 64
        start = time.perf_counter()
        for key in tqdm(keys, desc=f"storing {count:,} small pages in hicachefs", unit="page",
                        leave=False, file=sys.stderr, dynamic_ncols=True, mininterval=0.5):
            tmp = directory / f".{secrets.token_hex(8)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.ftruncate(fd, len(payload))
            os.pwrite(fd, payload, 0)
            os.close(fd)
            os.rename(tmp, directory / key)
        fill_fs = count / (time.perf_counter() - start)
        # HiCacheFile: its file names in its directory.
        start = time.perf_counter()
        for key in tqdm(keys, desc=f"storing {count:,} small pages for HiCacheFile", unit="page",
                        leave=False, file=sys.stderr, dynamic_ncols=True, mininterval=0.5):
            with open(file_dir / f"{hf._get_suffixed_key(key)}.bin", "wb") as f:
                f.write(payload)
        fill_file = count / (time.perf_counter() - start)

        rng = np.random.default_rng(2)
        queries = [[keys[int(j)] for j in rng.choice(count, STORAGE_BATCH_SIZE, replace=False)]
                   for _ in range(self.plan.exists_queries)]
        for name, backend, m in ((HICACHEFS, fs, mount), (FILE, hf, None)):
            result = Result("exists", "exists", name,
                            note=f"{count:,} pages stored ({(fill_fs if m else fill_file):,.0f}/s "
                                 "to store them)")
            before = m.stats() if m else None
            for q in tqdm(queries, desc=f"exists {name}", unit="query", leave=False,
                          file=sys.stderr, dynamic_ncols=True):
                start = time.perf_counter()
                hits = backend.batch_exists(q)
                result.seconds.append(time.perf_counter() - start)
                result.pages += len(q)
                result.failed += len(q) - hits
            if m:
                result.requests = request_delta(before, m.stats())
            self.results.append(result)
        fs.close()
        shutil.rmtree(file_dir, ignore_errors=True)


# ---------------------------------------------------------------------------- output

TARGETS = {  # (case prefix, op) -> (minimum ratio hicachefs/HiCacheFile)
    ("RAM 8 MiB", "read"): 1.0, ("RAM 1 MiB", "read"): 0.8,
    ("RAM 8 MiB", "write"): 1.5, ("RAM 1 MiB", "write"): 0.8,
    ("SSD cold 8 MiB", "read"): 0.9, ("SSD cold 1 MiB", "read"): 0.9,
}
READ_CEILING_TARGET = 0.6
EXISTS_P50_TARGET_MS = 1.0


def pair(results: List[Result], case: str, op: str):
    found = {r.backend: r for r in results if r.case == case and r.op == op}
    return found.get(HICACHEFS), found.get(FILE)


def verdicts(fs: Result, hf: Result, memcpy: float) -> str:
    out = []
    if fs.op == "exists":
        ok = fs.ms(50) <= EXISTS_P50_TARGET_MS
        return f"p50<={EXISTS_P50_TARGET_MS:g}ms {'ok' if ok else 'MISS'}"
    target = TARGETS.get((fs.case, fs.op))
    if target is not None:
        ratio = fs.gbps / hf.gbps
        out.append(f">={target:g}x {'ok' if ratio >= target else 'MISS'}")
    if fs.op == "read" and fs.case.startswith("RAM"):
        frac = fs.gbps / memcpy
        out.append(f">={READ_CEILING_TARGET:.0%} memcpy {'ok' if frac >= READ_CEILING_TARGET else 'MISS'}")
    return ", ".join(out)


def table(results: List[Result], memcpy: float) -> str:
    lines = []
    head = (f"{'case':<16}{'op':<7}{'backend':<13}{'GB/s':>7}{'pages/s':>10}{'p50 ms':>9}"
            f"{'p99 ms':>9}{'ratio':>7}{'memcpy':>8}{'req/pg':>8}  target")
    lines += [head, "-" * len(head)]
    seen = []
    for r in results:
        if (r.case, r.op) not in seen:
            seen.append((r.case, r.op))
    for case, op in seen:
        fs, hf = pair(results, case, op)
        for r in (fs, hf):
            if r is None:
                continue
            if op == "exists":
                gb, pps = "-", f"{r.pages_per_s:,.0f}"
                ratio = hf.ms(50) / fs.ms(50) if (r is fs and hf) else None
                frac = "-"
            else:
                gb, pps = f"{r.gbps:.2f}", f"{r.pages_per_s:,.0f}"
                ratio = fs.gbps / hf.gbps if (r is fs and hf) else None
                frac = f"{r.gbps / memcpy:.0%}"
            rpp = r.requests_per_page()
            lines.append(
                f"{case if r is fs else '':<16}{op if r is fs else '':<7}{r.backend:<13}{gb:>7}{pps:>10}"
                f"{r.ms(50):>9.2f}{r.ms(99):>9.2f}{(f'{ratio:.2f}x' if ratio else ''):>7}{frac:>8}"
                f"{(f'{rpp:.2f}' if rpp is not None else ''):>8}  "
                f"{verdicts(fs, hf, memcpy) if (r is fs and hf) else ''}")
    lines.append("")
    lines.append(f"'memcpy' is the fraction of {memcpy:.2f} GB/s (numpy copy, start of this run). 'ratio' is hicachefs/HiCacheFile "
                 "throughput (exists: HiCacheFile p50 / hicachefs p50); p50/p99 are per batch of "
                 f"{STORAGE_BATCH_SIZE} pages.")
    lines.append("")
    lines.append("FUSE requests per page seen by the daemon (.hicachefs/stats 'requests'; exists: per key):")
    for r in results:
        if r.requests:
            per = ", ".join(f"{op} {n / r.pages:.2f}" for op, n in sorted(r.requests.items(),
                                                                        key=lambda kv: -kv[1]))
            lines.append(f"  {r.case} {r.op}: {per}")
    problems = [r for r in results if r.failed or r.bad_pages]
    notes = [r for r in results if r.note]
    if notes:
        lines.append("")
        lines.append("Notes:")
        for r in notes:
            lines.append(f"  {r.case} {r.op} {r.backend}: {r.note.strip('; ')}")
    lines.append("")
    checked = sum(len(Pool.SAMPLE_SLOTS) * len(r.seconds) for r in results if r.op == "read")
    if problems:
        for r in problems:
            lines.append(f"PROBLEM {r.case} {r.op} {r.backend}: {r.failed} pages failed, "
                         f"{r.bad_pages} sampled pages wrong")
    else:
        lines.append(f"Every call succeeded; {checked} sampled pages read back byte-exact.")
    return "\n".join(lines)


def chart(results: List[Result], memcpy: float, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = []
    for r in results:
        if r.op != "exists" and (r.case, r.op) not in groups:
            groups.append((r.case, r.op))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [4, 1]})
    x = np.arange(len(groups))
    width = 0.38
    for offset, backend, color in ((-width / 2, HICACHEFS, "#1f77b4"), (width / 2, FILE, "#ff7f0e")):
        values = []
        for case, op in groups:
            fs, hf = pair(results, case, op)
            r = fs if backend == HICACHEFS else hf
            values.append(r.gbps if r else 0)
        bars = ax.bar(x + offset, values, width, label=backend, color=color)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(memcpy, color="gray", linestyle="--", linewidth=1)
    ax.text(len(groups) - 0.5, memcpy, f"memcpy {memcpy:.1f} GB/s", ha="right", va="bottom",
            fontsize=8, color="gray")
    ax.set_xticks(x, [f"{c}\n{o}" for c, o in groups], fontsize=8)
    ax.set_ylabel("GB/s (batches of 128 pages)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left")
    fs, hf = pair(results, "exists", "exists")
    if fs and hf:
        names = [HICACHEFS, FILE]
        p50 = [fs.ms(50), hf.ms(50)]
        p99 = [fs.ms(99), hf.ms(99)]
        xs = np.arange(2)
        b1 = ax2.bar(xs - 0.2, p50, 0.4, label="p50", color=["#1f77b4", "#ff7f0e"])
        b2 = ax2.bar(xs + 0.2, p99, 0.4, label="p99", color=["#1f77b4", "#ff7f0e"], alpha=0.5)
        ax2.bar_label(b1, fmt="%.2f", fontsize=7)
        ax2.bar_label(b2, fmt="%.2f", fontsize=7)
        ax2.set_xticks(xs, names, fontsize=8)
        ax2.set_ylabel("ms per batch_exists of 128 keys")
        ax2.set_title(f"existence ({fs.note.split(' pages')[0]} pages stored)\nsolid p50, light p99",
                      fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller volumes: about a minute")
    parser.add_argument("--chart", type=Path, default=Path("bench.png"),
                        help="where the PNG chart goes (default: bench.png here)")
    parser.add_argument("--disk-dir", type=Path, default=Path("/var/tmp"),
                        help="a directory on the disk filesystem (not tmpfs) for the SSD cases")
    parser.add_argument("--exists-pages", type=int, help="pages stored for the existence case")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench.py needs root (FUSE mounts and drop_caches)", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    if args.exists_pages:
        plan.exists_pages = args.exists_pages
    logging.basicConfig(level=logging.ERROR)

    work = Path(tempfile.mkdtemp(prefix="hicachefs-bench-"))
    shm = Path(tempfile.mkdtemp(prefix="hicachefs-bench-", dir="/dev/shm"))
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    disk = Path(tempfile.mkdtemp(prefix="hicachefs-bench-", dir=args.disk_dir))
    disk_fs = fs_type(disk)
    if disk_fs in ("tmpfs", "ramfs"):
        print(f"--disk-dir {args.disk_dir} is on {disk_fs}, not a disk", file=sys.stderr)
        return 2
    started = time.perf_counter()
    load_start = load()
    print(f"hicachefs vs SGLang HiCacheFile, {os.cpu_count()} CPUs, {load_start}; "
          f"tmpfs {shm}, disk {disk} ({disk_fs})", file=sys.stderr)
    bench = Bench(plan, work, shm, disk)
    memcpy = memcpy_rate(plan.memcpy_bytes)
    kernel_copy = kernel_copy_rate(shm)
    print(f"memcpy: {memcpy:.2f} GB/s; kernel copy from tmpfs: {kernel_copy:.2f} GB/s", file=sys.stderr)
    try:
        mount = mounting.start(work / "ram", work / "ram.log", ["--memory", plan.ram_memory])
        try:
            for page_mib in (1, 8):
                bench.pages_case("ram", page_mib, mount, shm / f"file-{page_mib}")
            bench.exists_case(mount, shm / "file-exists")
        finally:
            mounting.stop(mount)
        (disk / "arena").mkdir()
        mount = mounting.start(work / "ssd", work / "ssd.log",
                               ["--memory", SSD_MEMORY, "--max-page-size", SSD_MAX_PAGE,
                                "--disk", str(disk / "arena"), "--disk-size", SSD_DISK_SIZE])
        try:
            for page_mib in (1, 8):
                bench.pages_case("ssd", page_mib, mount, disk / f"file-{page_mib}")
        finally:
            mounting.stop(mount)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    memcpy_end = memcpy_rate(plan.memcpy_bytes)
    shm.mkdir(exist_ok=True)
    kernel_copy = (kernel_copy + kernel_copy_rate(shm)) / 2
    shutil.rmtree(shm, ignore_errors=True)
    elapsed = time.perf_counter() - started

    print()
    print(f"hicachefs vs SGLang {sglang_version()} HiCacheFile"
          f"{' (--quick)' if args.quick else ''}: {os.cpu_count()} CPUs; at start {load_start}, "
          f"at end {load()}; {elapsed / 60:.1f} min")
    print(f"RAM: hicachefs --memory {plan.ram_memory} vs HiCacheFile on tmpfs; SSD cold: hicachefs "
          f"--memory {SSD_MEMORY} --disk on {disk_fs} vs HiCacheFile on {disk_fs}, page cache "
          "dropped before each read pass")
    print(f"memcpy (numpy copy of {plan.memcpy_bytes >> 20} MiB): {memcpy:.2f} GB/s at the start, "
          f"{memcpy_end:.2f} GB/s at the end; one kernel copy (preadv of a hot 8 MiB tmpfs file): "
          f"{kernel_copy:.2f} GB/s")
    print()
    print(table(bench.results, memcpy))
    args.chart.parent.mkdir(parents=True, exist_ok=True)
    chart(bench.results, memcpy, args.chart,
          f"hicachefs (zero-copy v1) vs SGLang HiCacheFile (generic path), {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"\nchart: {args.chart.resolve()}")
    return 1 if any(r.failed or r.bad_pages for r in bench.results) else 0


if __name__ == "__main__":
    sys.exit(main())
