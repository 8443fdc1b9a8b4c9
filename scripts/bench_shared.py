#!/usr/bin/env python3
"""Benchmark the shared tier on each engine (GlusterFS, JuiceFS), in one run, each brought up
and down here (``scripts/glusterfs.sh``, ``scripts/juicefs.sh``; an engine that cannot start is
skipped with a line saying why).

    .venv/bin/python scripts/bench_shared.py [--engines glusterfs,juicefs] [--pages 10000,100000]
                                             [--calls 4] [--dir DIR]

Host A and host B are the volume's two FUSE mounts. On each engine:
- write-behind: A's tier is offered 1 MiB pages as fast as it can for a few seconds (throughput,
  drops), then at a steady rate, with the delay from ``offer`` on A to ``contains_many`` saying
  yes on B: the cross-host visibility (p50/p99; the target is 2 s);
- for each tier size (4 KiB pages written by A), on B: ``contains_many`` for 128 names (all
  misses, all hits, half and half), answered from the presence index, against the options it
  replaced, measured on the same volume (a ``stat`` per name, serial and on 8 threads; listing
  every fan-out directory of the pool); ``find`` + ``read_into`` of a 4 KiB page against a
  plain open+read; a fresh host's first sweep; one journal poll;
- cross-host, as SGLang's prefetch runs: two daemons, ``--shared`` on A's and on B's view; A
  writes ``--calls`` calls of 128 pages of 1 MiB (``batch_set_v1``, each call once A's
  write-behind has the last one), B asks (``batch_exists``) and reads what it found
  (``batch_get_v1``); against ``HiCacheFile`` (SGLang 0.5.23, its defaults, the controller's
  generic path, its only one) in a directory of the same volume: A writes through its view, B
  reads through its own, which is how SGLang users share pages across hosts today. The
  backends take turns call by call;
- while the engine is frozen (its processes SIGSTOPped for a few seconds), B's client calls:
  reads of 8 pages B holds itself, exists queries of 8 pages no host wrote, and exists + read of
  8 pages only the shared tier holds; each call's time (p50, p99, max) against the tier's
  deadline, beside the same calls while the engine runs.
Then one line per engine with the figures docs/performance.md's shared-tier table gives.

The machine is shared and has 2 cores: absolute figures are noisy; compare rows of one run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).parent))

from lib.bench_sglang import PAGES, Pool, as_sglang_runs, found_then_read, keys_for, make_file, make_hicachefs  # noqa: E402
from lib.bench_sglang import reader, timed_call, warm_up, writer  # noqa: E402

from hicachefs.store.shared import SharedTier  # noqa: E402
from hicachefs.store.shared.layout import Layout, place  # noqa: E402
from hicachefs.store.pages import PageMeta  # noqa: E402
from hicachefs.store.tier import ReadResult  # noqa: E402
from hicachefs_testing import mounting  # noqa: E402
from hicachefs_testing.engine import Engine, EngineDidNotStart  # noqa: E402
from hicachefs_testing.engines import ENGINES  # noqa: E402

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


def bench_size(volume: Engine, writers: list[SharedTier], have: int, want: int, rows: list) -> None:
    rate = populate(writers, have, want)
    print(f"  {want - have} pages written at {rate:.0f} pages/s", flush=True)
    root_b = volume.b / "bench"
    start = time.monotonic()
    b = SharedTier(root_b, None)
    hits = [name(i) for i in range(0, want, max(1, want // 4096))][:4096]
    while not all(b.contains_many(hits[:: max(1, len(hits) // 256)])) or b.statistics().sweep.sweep_cycles < 1:
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
                 f"{stats.sweep.sweep_directories_listed} directories"))
    polls = time_calls(lambda: b._journal.poll(), 20)
    rows.append(("one journal poll (other hosts' news)", want, *percentiles(polls), ""))
    b.close()


def bench_write_behind(volume: Engine, rows: list) -> None:
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
        lag = a.statistics().write_behind.last_lag_seconds
        if lag:
            lags.append(lag)
        time.sleep(0.001)
    while a.statistics().write_behind.queue_pages or a.statistics().write_behind.writing:
        time.sleep(0.01)
    took = time.monotonic() - start
    stats = a.statistics().write_behind
    rows.append(("write-behind burst, 1 MiB pages offered every ms", stats.written_behind, *percentiles(lags),
                 f"publish-to-written lag; {stats.written_behind / took:.0f} pages/s, "
                 f"{stats.written_behind_bytes / took / 1e6:.0f} MB/s, {stats.dropped} of {offered} dropped"))
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
            written_lag.append(a.statistics().write_behind.last_lag_seconds)
            time.sleep(max(0.0, 1 / per_second - (time.monotonic() - offered_at)))
        p50, p99 = percentiles(visible)
        rows.append((f"publish on A -> visible on B, 1 MiB at {per_second}/s", count, p50, p99,
                     f"max {max(visible):.3f} s; written on A p50 {statistics.median(written_lag):.3f} s"))
    a.close()
    b.close()


HOST_MEMORY = "1G"  # each daemon's RAM tier in the cross-host and frozen cases
DEADLINE_S = SharedTier.__init__.__kwdefaults__["deadline_s"]  # the daemon's, for its shared tier
FROZEN_S = 3.0
WRITE_BEHIND_WAIT_S = 60.0


def wait(condition, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def written_behind(host: mounting.Mount) -> bool:
    shared = host.stats()["tiers"]["shared"]
    return not (shared["queue_pages"] or shared["writing"])


def known_on(host_b: mounting.Mount, host_a: mounting.Mount, key: str) -> bool:
    """Whether B finds A's page ``key`` (a lookup: it fetches nothing)."""
    on_a = next(host_a.path.rglob(key))
    return wait(lambda: (host_b.path / on_a.relative_to(host_a.path)).exists(), 10.0)


def cross_host(volume: Engine, hosts, calls: int, rows: list, summary: dict) -> None:
    """A writes, B asks and reads: hicachefs's shared tier vs HiCacheFile on the same volume."""
    host_a, host_b = hosts
    pool = Pool(PAGES["1 MiB"])
    fs_a, fs_b = make_hicachefs(host_a.path, pool), make_hicachefs(host_b.path, pool)
    file_a, file_b = make_file(volume.a / "file", pool), make_file(volume.b / "file", pool)
    batches = {f"cross/b{i}": keys_for(f"cross/b{i}") for i in range(calls)}
    backends = {"hicachefs": (fs_a, fs_b), "HiCacheFile": (file_a, file_b)}
    for name, (on_a, _) in backends.items():
        warm_up(on_a, pool, f"cross/{name}")
    seconds = {name: {"write": [], "read": []} for name in backends}
    pages, bad = dict.fromkeys(backends, 0), 0
    for n, (tag, keys) in enumerate(batches.items()):
        for name in list(backends)[n % 2:] + list(backends)[: n % 2]:
            seconds[name]["write"].append(timed_call(pool, tag, keys, writer(backends[name][0], pool), True).seconds)
            wait(lambda: written_behind(host_a), WRITE_BEHIND_WAIT_S)  # paced as prefill paces backups
    known_on(host_b, host_a, list(batches.values())[-1][-1])
    for n, (tag, keys) in enumerate(batches.items()):
        for name in list(backends)[n % 2:] + list(backends)[: n % 2]:
            call = timed_call(pool, tag, keys, found_then_read(backends[name][1], pool), False)
            seconds[name]["read"].append(call.seconds)
            pages[name] += call.pages
            bad += call.bad
    total = len(batches) * pool.batch
    rates = {}
    for name in backends:
        rates[name] = pages[name] * pool.page_bytes / sum(seconds[name]["read"]) / 1e9
        for op in ("write", "read"):
            p50, p99 = percentiles(seconds[name][op])
            what = "write on A" if op == "write" else "exists + read on B"
            note = (f"{pool.batch * len(batches) * pool.page_bytes / sum(seconds[name][op]) / 1e9:.2f} GB/s"
                    if op == "write" else f"{rates[name]:.2f} GB/s, {pages[name]} of {total} pages found and read")
            rows.append((f"cross-host 1 MiB x128, {name}: {what}", len(batches), p50, p99, note))
    summary["cross-host read GB/s"] = (rates["hicachefs"], rates["HiCacheFile"])
    summary["wrong bytes"] = bad
    for backend in (fs_a, fs_b):
        backend.close()


def frozen(volume: Engine, hosts, rows: list, summary: dict) -> None:
    """B's client calls while the engine runs, then while it is frozen: local reads, exists of
    pages nobody wrote, exists + read of pages only the shared tier holds."""
    host_a, host_b = hosts
    pool = Pool(PAGES["1 MiB"], 8)
    fs_a, fs_b = make_hicachefs(host_a.path, pool), make_hicachefs(host_b.path, pool)
    local, shared_only = keys_for("frozen/local", 8), keys_for("frozen/shared", 8)
    writer(fs_b, pool)(local)
    writer(fs_a, pool)(shared_only)
    wait(lambda: written_behind(host_a), WRITE_BEHIND_WAIT_S)
    known_on(host_b, host_a, shared_only[-1])
    read_local, read_found = reader(fs_b, pool), found_then_read(fs_b, pool)
    calls = {"read of B's own pages": lambda n: read_local(local),
             "exists of pages no host wrote": lambda n: fs_b.batch_exists(keys_for(f"frozen/none{n}", 8)),
             "exists + read of shared-only pages": lambda n: read_found(shared_only)}

    def run(seconds: float, shared: bool) -> dict:
        took = {label: [] for label in calls if shared or "shared-only" not in label}
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            for label in took:
                start = time.perf_counter()
                calls[label](n)
                took[label].append(time.perf_counter() - start)
            n += 1
        return took

    running = run(FROZEN_S, shared=False)
    with volume.frozen():
        stalled = run(FROZEN_S, shared=True)
    available = wait(lambda: host_b.stats()["tiers"]["shared"]["available"], 30.0)
    for state, took in (("engine running", running), ("engine frozen", stalled)):
        for label, samples in took.items():
            p50, p99 = percentiles(samples)
            rows.append((f"{state}: {label}", len(samples), p50, p99, f"max {max(samples) * 1e3:.1f} ms"))
    every = [sample for samples in stalled.values() for sample in samples]
    summary["frozen p99, max"] = (percentiles(every)[1], max(every))
    summary["back after thaw"] = available
    for backend in (fs_a, fs_b):
        backend.close()


def two_hosts(volume: Engine, work: Path, calls: int, rows: list, summary: dict) -> None:
    hosts = []
    try:
        for name, view in (("a", volume.a), ("b", volume.b)):
            hosts.append(mounting.start(work / f"host-{name}", work / f"host-{name}.log",
                                        ["--memory", HOST_MEMORY, "--shared", str(view / "hc")]))
        print("  cross-host", flush=True)
        cross_host(volume, hosts, calls, rows, summary)
        print("  frozen engine", flush=True)
        frozen(volume, hosts, rows, summary)
    finally:
        for host in hosts:
            mounting.stop(host)
        shutil.rmtree(work, ignore_errors=True)  # the hosts' mountpoints and logs


def bench_engine(kind: type[Engine], work: Path, sizes: list[int], calls: int) -> tuple[list, dict] | str:
    """Every case on one engine: its rows and summary, or why it did not start."""
    directory = work / kind.script.removesuffix(".sh")
    rows: list = []
    summary: dict = {}
    try:
        volume = kind.up(directory)
    except EngineDidNotStart as error:
        kind.down(directory)
        return f"{kind.name} skipped: it did not start here ({error})"
    try:
        print(f"{kind.name}: write-behind", flush=True)
        bench_write_behind(volume, rows)
        summary["visibility p50, p99"] = next((p50, p99) for case, _, p50, p99, _ in rows if "visible on B" in case)
        writers = [SharedTier(volume.a / "bench", None, deadline_s=5.0), SharedTier(volume.b / "bench", None, deadline_s=5.0)]
        have = 0
        for size in sizes:
            print(f"{kind.name}: shared tier of {size} pages", flush=True)
            bench_size(volume, writers, have, size, rows)
            have = size
        for tier in writers:
            tier.close()
        print(f"{kind.name}: two hosts' daemons", flush=True)
        two_hosts(volume, work / f"{directory.name}-hosts", calls, rows, summary)
    finally:
        print(f"{kind.name}: taking the volume down", flush=True)
        kind.down(directory)
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of " + ", ".join(ENGINES))
    parser.add_argument("--pages", default="10000", help="tier sizes for the presence rows, comma-separated")
    parser.add_argument("--calls", type=int, default=4, help="cross-host calls of 128 pages of 1 MiB")
    parser.add_argument("--dir", type=Path, default=None, help="where the volumes live (a temporary dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    as_sglang_runs()
    sizes = sorted(int(size) for size in args.pages.split(","))
    work = Path(tempfile.mkdtemp(prefix="hicachefs-bench-shared.", dir=args.dir))
    results = {}
    for engine in args.engines.split(","):
        kind = ENGINES[engine]
        results[kind.name] = bench_engine(kind, work, sizes, args.calls)
        if isinstance(results[kind.name], str):
            print(results[kind.name], flush=True)
        else:
            report(kind.name, *results[kind.name], sizes)
    summarize(results)
    os.rmdir(work)


def report(engine: str, rows: list, summary: dict, sizes: list[int]) -> None:
    print(f"\n== {engine}")
    print(f"{'case':62} {'n':>8} {'p50':>10} {'p99':>10}  note")
    for case, count, p50, p99, note in rows:
        print(f"{case:62} {count:>8} {p50 * 1e3:>8.3f}ms {p99 * 1e3:>8.3f}ms  {note}")
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


def summarize(results: dict) -> None:
    """One line per engine: what docs/performance.md's shared-tier table gives, against the targets."""
    print(f"\n{'engine':10} {'visible on B p50 / p99':>24} {'cross-host exists + read, GB/s':>38} "
          f"{'B while frozen: p99 / max':>28}")
    for engine, result in results.items():
        if isinstance(result, str):
            print(f"{engine:10} {result}")
            continue
        summary = result[1]
        p50, p99 = summary["visibility p50, p99"]
        ours, theirs = summary["cross-host read GB/s"]
        frozen_p99, frozen_max = summary["frozen p99, max"]
        print(f"{engine:10} {p50:>10.3f} s / {p99:.3f} s ({'ok' if p99 <= 2.0 else 'MISS'} <= 2 s) "
              f"{ours:>8.2f} vs HiCacheFile {theirs:.2f} ({ours / theirs:.2f}x, {'ok' if ours >= theirs else 'MISS'}) "
              f"{frozen_p99 * 1e3:>9.0f} / {frozen_max * 1e3:.0f} ms "
              f"({'ok' if frozen_p99 <= DEADLINE_S else 'MISS'} <= {DEADLINE_S * 1e3:.0f} ms deadline)"
              + (f"; {summary['wrong bytes']} pages with wrong bytes" if summary["wrong bytes"] else "")
              + ("" if summary["back after thaw"] else "; the shared tier did not come back within 30 s"))


if __name__ == "__main__":
    main()
