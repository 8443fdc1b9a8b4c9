#!/usr/bin/env python3
"""Benchmark the page store: put/get GB/s per tier and page size against this machine's
memcpy rate, and start time (index snapshot vs scan) and index RAM per page at many small pages.

    .venv/bin/python scripts/bench_store.py [--quick] [--dir DIR]

Start time: opening the store on an arena of many small pages, by loading the index snapshot
a clean close wrote, and by scanning the arena (what a start after a crash does), same pages.

RAM put = reserve + copy in + xxh3 + publish; RAM get = open + copy the page out (what a FUSE
read does); SSD put = write-through put (page-cache write) plus the final fsync; SSD get =
open of a disk-only page after its file pages were dropped from the page cache
(posix_fadvise DONTNEED), which reads, verifies and promotes it, plus the copy out.
"""

from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from hicachefs.store import PageStore, StoreConfig
from hicachefs.store.ssd.snapshot import SNAPSHOT_NAME
from hicachefs.store.ssd.ssd_tier import ARENA_NAME
from hicachefs_testing.store_tools import delete_tree, drop_disk_cache

MiB, GiB = 1 << 20, 1 << 30


def memcpy_rate(nbytes: int) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def pages(page_size: int, total: int) -> tuple[list[str], np.ndarray]:
    count = max(4, total // page_size)
    data = np.random.default_rng(page_size).integers(0, 255, page_size, dtype=np.uint8)
    return [f"bench/f/tp0of1/kv/{i:064x}" for i in range(count)], data


def bench_ram(page_size: int, total: int) -> tuple[float, float, float]:
    """(first-pass put, steady put, get): the first pass writes slots never used before, of an
    arena already faulted in (``PageStore`` fills its RAM tier when it opens, as a daemon does
    at start: the pass takes no page faults); the second reuses slots, as a running daemon does."""
    names, data = pages(page_size, total)
    store = PageStore(StoreConfig(memory_bytes=total + 128 * MiB, max_page_size=page_size))
    start = time.perf_counter()
    for name in names:
        store.put(name, data)
    first = len(names) * page_size / (time.perf_counter() - start) / 1e9
    delete_tree(store, "bench")
    start = time.perf_counter()
    for name in names:
        store.put(name, data)
    put = len(names) * page_size / (time.perf_counter() - start) / 1e9
    out = np.empty(page_size, np.uint8)
    start = time.perf_counter()
    for name in names:
        with store.open(name) as reader:
            out[:] = reader.read(0, page_size)
    get = len(names) * page_size / (time.perf_counter() - start) / 1e9
    store.close()
    return first, put, get


def bench_ssd(page_size: int, total: int, directory: Path) -> tuple[float, float]:
    names, data = pages(page_size, total)
    config = StoreConfig(
        memory_bytes=max(64 * MiB, 8 * page_size), disk_dir=directory, disk_bytes=total + total // 2 + 256 * MiB,
        write_through=True, max_page_size=page_size,
    )
    store = PageStore(config)
    start = time.perf_counter()
    for name in names:
        store.put(name, data)
    store.sync()
    put = len(names) * page_size / (time.perf_counter() - start) / 1e9
    store.close()
    store = PageStore(config)  # every page on disk only
    drop_disk_cache(store)
    out = np.empty(page_size, np.uint8)
    start = time.perf_counter()
    for name in names:
        with store.open(name) as reader:
            out[:] = reader.read(0, page_size)
    get = len(names) * page_size / (time.perf_counter() - start) / 1e9
    assert store.statistics().tier("disk").hits == len(names)
    store.close()
    (directory / ARENA_NAME).unlink()
    return put, get


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def drop_file_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bench_recovery(count: int, directory: Path) -> dict:
    """Start times of one arena of ``count`` 4 KiB pages: loading the index snapshot a clean close
    wrote, and scanning the arena (what a start after a crash does), each with the page cache
    cold (arena and snapshot evicted) and warm."""
    size = 4096
    config = StoreConfig(
        memory_bytes=64 * MiB, disk_dir=directory, disk_bytes=count * 4352 + 512 * MiB, write_through=True, max_page_size=64 * 1024
    )
    data = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    store = PageStore(config)
    start = time.perf_counter()
    for i in range(count):
        store.put(f"bench/f/tp0of1/kv/{i:064x}", data)
    fill = time.perf_counter() - start
    start = time.perf_counter()
    store.close()  # everything is on disk already (write-through): this is the snapshot's write
    facts = {"pages": count, "fill_s": fill, "close_s": time.perf_counter() - start,
             "snapshot_bytes": (directory / SNAPSHOT_NAME).stat().st_size}
    del store
    gc.collect()
    # The scan is forced by removing the snapshot (the same scan a start after a crash runs); the
    # store warns about the missing snapshot, which is expected here.
    logging.getLogger("hicachefs").setLevel(logging.ERROR)
    for method in ("snapshot", "scan"):
        for cache in ("cold", "warm"):
            if method == "scan":
                (directory / SNAPSHOT_NAME).unlink()
            if cache == "cold":
                for name in (ARENA_NAME, SNAPSHOT_NAME):
                    if (directory / name).exists():
                        drop_file_cache(directory / name)
            reports = []
            start = time.perf_counter()
            store = PageStore(config, progress=reports.append)
            facts[f"{method}_{cache}_s"] = time.perf_counter() - start
            facts[f"{method}_{cache}_recovery_s"] = reports[-1].seconds
            assert reports[-1].method == method and store.statistics().pages == count
            store.close()
            del store
            gc.collect()
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # a fresh heap, so RSS growth means something
        facts.update(pool.apply(index_memory, (config, count)))
    return facts


def index_memory(config: StoreConfig, count: int) -> dict:
    """Bytes per page the recovered index holds: traced Python/numpy allocations, and RSS growth
    (the RAM arena is not touched, so it adds nothing to either)."""
    rss_before = rss()
    tracemalloc.start()
    store = PageStore(config)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    facts = {"index_bytes_per_page_traced": traced / count, "rss_bytes_per_page": (rss() - rss_before) / count}
    store.close()
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small volumes (a few seconds)")
    parser.add_argument("--dir", type=Path, default=None, help="directory for the SSD arena (default: a temp dir)")
    args = parser.parse_args()
    total = 256 * MiB if args.quick else 2 * GiB
    small_pages = 100_000 if args.quick else 1_000_000
    directory = Path(tempfile.mkdtemp(prefix="hicachefs-bench-", dir=args.dir))
    try:
        memcpy = memcpy_rate(256 * MiB if args.quick else 1 * GiB)
        print(f"memcpy (numpy copy, 1 thread): {memcpy:.2f} GB/s\n")
        print(f"{'tier':<6}{'page':>7}{'put GB/s':>10}{'x memcpy':>10}{'get GB/s':>10}{'x memcpy':>10}")
        first_pass = []
        for page_size in (1 * MiB, 8 * MiB):
            for tier in ("RAM", "SSD"):
                if tier == "RAM":
                    first, put, get = bench_ram(page_size, total)
                    first_pass.append(f"{page_size // MiB}M {first:.2f} GB/s")
                else:
                    put, get = bench_ssd(page_size, total, directory)
                print(f"{tier:<6}{page_size // MiB:>6}M{put:>10.2f}{put / memcpy:>10.2f}{get:>10.2f}{get / memcpy:>10.2f}")
        print(f"RAM put, first pass (slots never used before, of an arena faulted in when the store "
              f"opened, as a daemon's is at start): {', '.join(first_pass)}")
        facts = bench_recovery(small_pages, directory)
        title = f"store open with {facts['pages']:,} 4 KiB pages on disk"
        print(f"\n{title:<48}{'cold cache':>12}{'warm cache':>12}")
        for method, label in (("scan", "scan (a start after a crash, as before)"),
                              ("snapshot", "index snapshot (after a clean close)")):
            print(f"  {label:<46}{facts[f'{method}_cold_s']:>10.2f} s{facts[f'{method}_warm_s']:>10.2f} s")
        ratios = [facts[f"scan_{c}_s"] / facts[f"snapshot_{c}_s"] for c in ("cold", "warm")]
        print(f"  {'scan / snapshot':<46}{ratios[0]:>11.1f}x{ratios[1]:>11.1f}x")
        print(
            f"snapshot: {facts['snapshot_bytes'] / MiB:.1f} MiB, written at close in {facts['close_s']:.2f} s; "
            f"loading it took {facts['snapshot_warm_recovery_s']:.2f} s of the warm open "
            f"(the rest maps the RAM tier); filling took {facts['fill_s']:.1f} s"
        )
        print(
            f"index RAM per page: {facts['index_bytes_per_page_traced']:.0f} B (tracemalloc), "
            f"{facts['rss_bytes_per_page']:.0f} B (RSS growth)"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
