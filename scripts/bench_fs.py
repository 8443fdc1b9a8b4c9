#!/usr/bin/env python3
"""Pages through the mount beside the same client code on tmpfs, in one run.

Prints a table: write and read GB/s for 1 MiB and 8 MiB pages (page-aligned buffers,
preadv/pwritev, one open/close per page as the client does), the ratio hicachefs/tmpfs,
then the stat rate and the latency of exists queries of 128 and 10,000 paths with many
pages stored. Mounts and unmounts its own daemon.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hicachefs_testing import mounting

POOL = ("bench", "bfloat16-page_first-64", "tp0of1", "kv")


def aligned(size: int) -> np.ndarray:
    raw = np.empty(size + 4096, np.uint8)
    return raw[(-raw.ctypes.data) % 4096:][:size]


def write_pages(directory: Path, buffer: np.ndarray, count: int) -> float:
    start = time.perf_counter()
    view = memoryview(buffer)
    for i in range(count):
        tmp = directory / f".w{i}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, len(view))
        os.pwritev(fd, [view], 0)
        os.close(fd)
        os.rename(tmp, directory / f"p{i}")
    return time.perf_counter() - start


def read_pages(directory: Path, buffer: np.ndarray, count: int) -> float:
    start = time.perf_counter()
    view = memoryview(buffer)
    for i in range(count):
        fd = os.open(directory / f"p{i}", os.O_RDONLY)
        got = os.preadv(fd, [view], 0)
        os.close(fd)
        assert got == len(view)
    return time.perf_counter() - start


def throughput(directory: Path, size: int, total: int, rounds: int) -> tuple[float, float]:
    count = max(4, total // size)
    buffer = aligned(size)
    buffer[:] = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    writes, reads = [], []
    for _ in range(rounds):
        for entry in directory.iterdir():
            entry.unlink()
        writes.append(count * size / write_pages(directory, buffer, count) / 1e9)
        reads.append(count * size / read_pages(directory, buffer, count) / 1e9)
    return statistics.median(writes), statistics.median(reads)


def stat_rate(directory: Path, count: int) -> float:
    return stat_rate_names([directory / f"p{i}" for i in range(count)] * 200)


def stat_rate_names(names: list[Path]) -> float:
    count = len(names)
    start = time.perf_counter()
    for name in names:
        os.stat(name)
    return count / (time.perf_counter() - start)


def fill_small_pages(directory: Path, count: int) -> None:
    for i in range(count):
        tmp = directory / f".s{i}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, 1)
        os.close(fd)
        os.rename(tmp, directory / f"{i:064x}")
        if i % 20000 == 0:
            print(f"  stored {i:,} of {count:,} small pages", file=sys.stderr)


def exists_latency(mount: Path, count: int, stored: int, repeats: int = 50) -> float:
    prefix = "/".join(POOL[:3]) + "/small"
    rng = np.random.default_rng(1)
    fd = os.open(mount / ".hicachefs" / "exists", os.O_RDWR)
    times = []
    try:
        for _ in range(repeats):
            keys = rng.integers(0, stored * 2, count)
            request = "".join(f"{prefix}/{int(k):064x}\n" for k in keys).encode()
            start = time.perf_counter()
            os.write(fd, request)
            answer = os.read(fd, count + 1)
            times.append(time.perf_counter() - start)
            assert len(answer) == count + 1
    finally:
        os.close(fd)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller volumes: about a minute")
    parser.add_argument("--small-pages", type=int, help="pages stored for the exists figures")
    args = parser.parse_args()
    total = (256 << 20) if args.quick else (1 << 30)
    rounds = 2 if args.quick else 3
    small = args.small_pages or (100_000 if args.quick else 1_000_000)

    work = Path(tempfile.mkdtemp(prefix="hicachefs-bench-"))
    tmpfs = Path(tempfile.mkdtemp(prefix="hicachefs-bench-", dir="/dev/shm"))
    mount = mounting.start(work / "mnt", work / "daemon.log", ["--memory", "6G"])
    rows = []
    try:
        fuse_dir = mount.page_dir(*POOL)
        for size in (1 << 20, 8 << 20):
            fw, fr = throughput(fuse_dir, size, total, rounds)
            tw, tr = throughput(tmpfs, size, total, rounds)
            rows.append((f"{size >> 20} MiB write", fw, tw))
            rows.append((f"{size >> 20} MiB read", fr, tr))
        stats = stat_rate(fuse_dir, max(4, total // (8 << 20)))
        print(f"storing {small:,} small pages for the exists query...", file=sys.stderr)
        small_dir = mount.page_dir(*POOL[:3], "small")
        fill_small_pages(small_dir, small)
        Path("/proc/sys/vm/drop_caches").write_text("2\n")  # forget dentries: next stats are LOOKUPs
        cold = stat_rate_names([small_dir / f"{i:064x}" for i in range(min(small, 20_000))])
        e128 = exists_latency(mount.path, 128, small)
        e10k = exists_latency(mount.path, 10_000, small, repeats=10)
    finally:
        mounting.stop(mount)
        shutil.rmtree(tmpfs, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'case':<14}{'hicachefs GB/s':>16}{'tmpfs GB/s':>12}{'ratio':>8}")
    for name, fuse, plain in rows:
        print(f"{name:<14}{fuse:>16.2f}{plain:>12.2f}{fuse / plain:>8.2f}")
    print(f"\nstat of a page the kernel knows: {stats:,.0f}/s; after dropping the dentry cache (one LOOKUP each): {cold:,.0f}/s")
    print(f"exists query with {small:,} pages stored: 128 paths {e128:.2f} ms, 10,000 paths {e10k:.2f} ms (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
