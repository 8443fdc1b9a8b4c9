#!/usr/bin/env python3
"""Benchmark the shared tier on a real GlusterFS volume (brought up and down here).

    .venv/bin/python scripts/bench_shared.py [--pages 10000,100000] [--dir DIR]

Host A and host B are the volume's two FUSE mounts. For each tier size (4 KiB pages written by
A) it measures, on B:
- ``contains_many`` for 128 names (all misses, all hits, half and half), answered from the
  presence index (what the tier does), against the options it replaced, measured on the same
  volume: one ``stat`` per name (serial, and in a pool of 8 threads), and listing every
  fan-out directory of the pool (what a listing cache must redo to stay fresh);
- ``find`` + ``read_into`` of a 4 KiB page against a plain open+read of another page file;
- how long a fresh host takes to know every page (its first sweep) and what one journal poll
  costs.
Then write-behind: A offers 1 MiB pages as fast as it can for a few seconds (throughput, drops),
and at a steady rate, with the delay from ``offer`` on A to ``contains_many`` saying yes on B.

The machine is shared and has 2 cores: absolute figures are noisy; compare rows of one run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import logging
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import xxhash

from hicachefs.store.shared import SharedTier
from hicachefs.store.shared.layout import Layout, place
from hicachefs.store.tier import PageMeta, ReadResult
from hicachefs.testing import glusterfs

POOL = "bench/bf16-page_first-64/tp0of1/kv"
KiB, MiB = 1 << 10, 1 << 20
BATCH = 128


def name(i: int) -> str:
    return f"{POOL}/{hashlib.sha256(str(i).encode()).hexdigest()}"


def page(i: int, data: bytes) -> PageMeta:
    return PageMeta(name(i), len(data), xxhash.xxh3_64_intdigest(data), time.time_ns())


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def populate(tiers: list[SharedTier], first: int, stop: int, threads: int = 4) -> float:
    """Write pages ``first..stop-1`` (4 KiB) through both hosts; return pages per second."""
    data = np.random.default_rng(0).integers(0, 256, 4 * KiB, dtype=np.uint8).tobytes()
    done = [0]
    lock = threading.Lock()

    def work(worker: int) -> None:
        tier = tiers[worker % len(tiers)]
        for i in range(first + worker, stop, threads):
            tier.write(page(i, data), data)
            with lock:
                done[0] += 1
                if done[0] % 5000 == 0:
                    print(f"  populated {first + done[0]} of {stop}", flush=True)

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    return (stop - first) / (time.monotonic() - start)


def time_calls(call, reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def stat_all(paths: list[str], pool: concurrent.futures.ThreadPoolExecutor | None) -> list[bool]:
    def exists(path: str) -> bool:
        try:
            os.stat(path)
            return True
        except FileNotFoundError:
            return False

    return list(pool.map(exists, paths)) if pool else [exists(path) for path in paths]


def list_pool(root: Path) -> int:
    """List every fan-out directory of the pool: what a listing cache redoes per refresh."""
    pool_dir = root / POOL
    return sum(len(os.listdir(pool_dir / fan)) for fan in os.listdir(pool_dir))


def bench_size(volume: glusterfs.GlusterVolume, writers: list[SharedTier], have: int, want: int, rows: list) -> None:
    rate = populate(writers, have, want)
    print(f"  {want - have} pages written at {rate:.0f} pages/s", flush=True)
    root_b = volume.b / "bench"
    start = time.monotonic()
    b = SharedTier(root_b, None)
    hits = [name(i) for i in range(0, want, max(1, want // 4096))][:4096]
    while not all(b.contains_many(hits[:: max(1, len(hits) // 256)])) or b.statistics()["sweep_cycles"] < 1:
        time.sleep(0.05)
    bootstrap = time.monotonic() - start
    stats = b.statistics()
    misses = [name(-1 - i) for i in range(4096)]
    rng = np.random.default_rng(want)

    def batch(source: list[str]) -> list[str]:
        return [source[i] for i in rng.integers(0, len(source), BATCH)]

    def mixed() -> list[str]:
        return batch(hits)[: BATCH // 2] + batch(misses)[: BATCH // 2]

    cases = {"misses": lambda: batch(misses), "hits": lambda: batch(hits), "mix": mixed}
    for label, make in cases.items():
        batches = [make() for _ in range(1000)]
        answers = [b.contains_many(names) for names in batches[:10]]
        expected = [[n not in set(misses) for n in names] for names in batches[:10]]
        assert answers == expected, f"contains_many gave wrong answers for {label}"
        it = iter(batches)
        p50, p99 = percentiles(time_calls(lambda: b.contains_many(next(it)), 1000))
        rows.append((f"contains_many x{BATCH}, {label} (kept: presence index)", want, p50, p99, ""))
    layout = Layout(root_b)
    paths = {label: [layout.page_path(place(n)) for n in make()] for label, make in cases.items()}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for label in ("misses", "hits"):
            serial = time_calls(lambda: stat_all(paths[label], None), 10)
            pooled = time_calls(lambda: stat_all(paths[label], pool), 10)
            rows.append((f"  option: stat per name, serial, {label}", want, *percentiles(serial), ""))
            rows.append((f"  option: stat per name, 8 threads, {label}", want, *percentiles(pooled), ""))
    listing = time_calls(lambda: list_pool(root_b), 3)
    rows.append(("  option: relist every fan-out dir (one refresh)", want, *percentiles(listing),
                 "the freshness a listing cache can offer"))
    sample = hits[:: max(1, len(hits) // 100)][:100]

    def find_read(n: str) -> None:
        found = b.find(n)
        assert found is not None and b.read_into(found, 0, memoryview(bytearray(found.size))) is ReadResult.OK

    tier_reads = time_calls(lambda it=iter(sample[:50]): find_read(next(it)), 50)
    plain = time_calls(lambda it=iter(sample[50:]): Path(layout.page_path(place(next(it)))).read_bytes(), 50)
    rows.append(("find + read_into, 4 KiB hit", want, *percentiles(tier_reads), ""))
    rows.append(("  plain open + read of a page file", want, *percentiles(plain), ""))
    rows.append(("first sweep of a fresh host (knows every page)", want, bootstrap, bootstrap,
                 f"{stats['sweep_directories_listed']} directories"))
    polls = time_calls(lambda: b._journal.poll(), 20)
    rows.append(("one journal poll (other hosts' news)", want, *percentiles(polls), ""))
    b.close()


def bench_write_behind(volume: glusterfs.GlusterVolume, rows: list) -> None:
    a = SharedTier(volume.a / "wb", None)
    b = SharedTier(volume.b / "wb", None)
    data = np.random.default_rng(1).integers(0, 256, MiB, dtype=np.uint8).tobytes()
    view = memoryview(data)
    offered = 0
    lags = []
    start = time.monotonic()
    while time.monotonic() - start < 5.0:
        a.offer(page(10**7 + offered, data), view, lambda: None)
        offered += 1
        lag = a.statistics()["last_lag_seconds"]
        if lag:
            lags.append(lag)
        time.sleep(0.001)
    while a.statistics()["queue_pages"] or a.statistics()["writing"]:
        time.sleep(0.01)
    took = time.monotonic() - start
    stats = a.statistics()
    rows.append(("write-behind burst, 1 MiB pages offered every ms", stats["written_behind"], *percentiles(lags),
                 f"publish-to-written lag; {stats['written_behind'] / took:.0f} pages/s, "
                 f"{stats['written_behind_bytes'] / took / 1e6:.0f} MB/s, {stats['dropped']} of {offered} dropped"))
    for per_second in (20, 50):
        visible, written_lag = [], []
        count = 3 * per_second
        for i in range(count):
            target = page(2 * 10**7 + per_second * 1000 + i, data)
            offered_at = time.monotonic()
            a.offer(target, view, lambda: None)
            while not b.contains_many([target.name])[0]:
                if time.monotonic() - offered_at > 10:
                    break
                time.sleep(0.002)
            visible.append(time.monotonic() - offered_at)
            written_lag.append(a.statistics()["last_lag_seconds"])
            time.sleep(max(0.0, 1 / per_second - (time.monotonic() - offered_at)))
        p50, p99 = percentiles(visible)
        rows.append((f"publish on A -> visible on B, 1 MiB at {per_second}/s", count, p50, p99,
                     f"max {max(visible):.3f} s; written on A p50 {statistics.median(written_lag):.3f} s"))
    a.close()
    b.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="10000,100000", help="tier sizes, comma-separated")
    parser.add_argument("--dir", type=Path, default=None, help="where the volume lives (a temporary dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sizes = sorted(int(size) for size in args.pages.split(","))
    work = Path(tempfile.mkdtemp(prefix="hicachefs-bench-shared.", dir=args.dir))
    rows: list = []
    with glusterfs.volume(work / "volume") as volume:
        print("write-behind", flush=True)
        bench_write_behind(volume, rows)
        writers = [SharedTier(volume.a / "bench", None, deadline_s=5.0), SharedTier(volume.b / "bench", None, deadline_s=5.0)]
        have = 0
        for size in sizes:
            print(f"shared tier of {size} pages", flush=True)
            bench_size(volume, writers, have, size, rows)
            have = size
        for writer in writers:
            writer.close()
        report(rows, sizes)  # before the volume goes: removing 100 k pages takes minutes
        print(f"\ntaking the volume down (removes {have} pages)", flush=True)
    os.rmdir(work)


def report(rows: list, sizes: list[int]) -> None:
    print()
    print(f"{'case':58} {'pages':>8} {'p50':>10} {'p99':>10}  note")
    for case, count, p50, p99, note in rows:
        print(f"{case:58} {count:>8} {p50 * 1e3:>8.3f}ms {p99 * 1e3:>8.3f}ms  {note}")
    print()
    by_case = {(case, count): p50 for case, count, p50, _, _ in rows}
    for size in sizes:
        kept = by_case[(f"contains_many x{BATCH}, misses (kept: presence index)", size)]
        pooled = by_case[("  option: stat per name, 8 threads, misses", size)]
        print(f"{size} pages: 128 misses answered {pooled / kept:.0f}x faster than a stat per name in 8 threads")
    if len(sizes) > 1:
        for label in ("misses", "hits", "mix"):
            case = f"contains_many x{BATCH}, {label} (kept: presence index)"
            first, last = by_case[(case, sizes[0])], by_case[(case, sizes[-1])]
            print(f"contains_many {label}: p50 at {sizes[-1]} pages / at {sizes[0]} pages = {last / first:.2f}")
        listing = "  option: relist every fan-out dir (one refresh)"
        print(f"listing refresh: at {sizes[-1]} pages / at {sizes[0]} pages = "
              f"{by_case[(listing, sizes[-1])] / by_case[(listing, sizes[0])]:.1f}")


if __name__ == "__main__":
    main()
