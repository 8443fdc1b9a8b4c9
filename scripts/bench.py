#!/usr/bin/env python3
"""hicachefs beside SGLang's own ``file`` backend (``HiCacheFile``), both as SGLang runs them.

Every process runs with one torch thread, as SGLang's ``ModelRunner`` sets on a GPU server.
Both backends get exactly the calls SGLang 0.5.23's cache controller makes for them, on a host
pool laid out as SGLang's MHA ``page_first`` pool (page-aligned, as SGLang's pinned pool is),
filled with random bytes and stamped so that every written page is unique
(``lib/bench_sglang.py``):
  - ``HiCacheFile`` with its defaults, on tmpfs (``/dev/shm``), its fastest home: the
    controller's generic path, the only one it gives the ``file`` backend. Write:
    ``get_data_page`` of every page, then ``batch_set``. Read: one ``get_dummy_flat_data_page``
    staging page per key, ``batch_get`` into them, then ``set_from_flat_data_page``.
  - hicachefs (``HiCacheFS`` on a mount this script makes and removes): the zero-copy v1 path
    the controller takes for a dynamic backend with ``interface_v1``: ``batch_set_v1`` /
    ``batch_get_v1`` with host indices, the client's defaults, so through its data plane: a
    read finds each page in the daemon's shared index and copies it from the RAM arena (or the
    disk tier's file) itself, asking the daemon nothing (the pages read are reported in one
    request every 0.5 s); a write batch reserves slots, pwritev-s into them and commits in one
    request.
  - in the RAM cases also ``memcpy`` (``lib/bench_memcpy.py``): one thread's numpy copy between
    the pool's page buffers and an array holding every page, the floor under any store, and the
    core of SGLang's ``fast_file`` backend (open PR #39880, not in 0.5.23), our own few lines
    (``lib/bench_fast_file.py``): pwritev/preadv between the pool's page buffers and tmpfs
    files, temporary file + rename, reads on 4 threads.

Pages (``bench_sglang.PAGES``): 128 and 256 KiB (Llama-3.2-1B at TP8, 32 and 64 tokens a
page: a small model or a high TP degree), 768 KiB (Qwen2.5-0.5B, 64 tokens of 24 layers, as
``sglang_calls.py``), 1 MiB (Llama-3.1-8B at TP8) and 8 MiB (at TP1). Reads are the first read
after the write and every read after that ("read again"): both through the plane.

Cases (the backends take turns call by call, the first one rotating, so that load from
elsewhere hits them alike):
  - RAM: hicachefs's RAM tier vs ``HiCacheFile``, the fast_file core and memcpy: 8 pages a call
    (what SGLang's controller gives a call) of 128 and 256 KiB, 32 of 768 KiB, and 128 pages a
    call (``STORAGE_BATCH_SIZE``, its largest) of 1 and 8 MiB: write, first read, read again.
    Per row the daemon's requests per page read (its reports of the reads shown apart), per
    write batch, and its CPU time per page.
  - ranks: 1 and 2 client processes at once (``--ranks``, e.g. 1,2,4,8 on a larger host; TP
    ranks of one server, each its own process, host pool and pages; ``bench_rank.py``), each
    phase at the same moment; 128 pages of 1 MiB a call, and 8 of 128 KiB; aggregate GB/s, the
    scaling from 1 rank of each backend, and memcpy in as many processes at once, same run.
  - existence: ``batch_exists`` of 128 stored keys with 100,000 pages stored (10,000 --quick).
  - SSD cold, 1 and 8 MiB (1 MiB with --quick): hicachefs with a 128 MiB RAM tier, so pages
    are demoted to ``--disk`` on the disk filesystem, vs ``HiCacheFile`` on the same
    filesystem; only batches wholly on the disk tier are read, after
    ``sync; echo 3 > /proc/sys/vm/drop_caches`` (the plane reads them from the disk tier's
    file, which the drop leaves cold: its residency is shown).
  - cross-host (only with ``--only cross-host``), 1 MiB: a throw-away GlusterFS volume
    (``scripts/glusterfs.sh``) mounted twice, as two hosts would: host A writes, host B reads,
    hicachefs with ``--shared`` on each view vs ``HiCacheFile`` on the same volume. Skipped,
    with a line saying why, where GlusterFS cannot start. Run it under
    ``flock /tmp/hicachefs-gluster.lock`` on a shared machine.
Every pass of writes starts with one untimed page per backend, left in place: a new pool's
directories are made by its first write. Sampled pages of every read call are checked byte for
byte.

Prints a table (GB/s, pages/s, p50/mean/p99 per call, each backend over HiCacheFile and over
memcpy of the same case, CPU seconds per GB), the ranks table, a table per operation and case
of the daemon's requests and CPU time per page, the pages per second one daemon core could
therefore publish beside 8 ranks of HiCacheFile ("host scale, on paper"), and issue 28's
targets with ok/MISS; writes a PNG chart (a panel per case). Needs root (FUSE, drop_caches).
See ``--quick`` for a run of under two minutes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
from tqdm import tqdm

from lib.bench_daemon import Daemon, config_line, print_log_tail
from lib.bench_fast_file import FastFileCore
from lib.bench_memcpy import MemcpyPeer
from lib.bench_rank import RankWorker
from lib.bench_report import (
    AGAIN,
    FAST_FILE,
    FILE,
    FIRST,
    HICACHEFS,
    MEMCPY,
    WRITE,
    Result,
    chart,
    table,
)
from lib.bench_sglang import (
    LLAMA_1B,
    MIB,
    PAGES,
    STORAGE_BATCH_SIZE,
    TORCH_THREADS,
    Pool,
    Shape,
    as_sglang_runs,
    found_then_read,
    keys_for,
    make_file,
    make_hicachefs,
    reader,
    timed_call,
    warm_up,
    writer,
)
from hicachefs_testing import mounting
from hicachefs_testing.glusterfs import GlusterVolume
from hicachefs_client import HiCacheFS
from hicachefs_client.backend import DEFAULT_THREADS as CLIENT_THREADS
from hicachefs_client.plane_reports import REPORT_INTERVAL_S
from hicachefs.cli.arguments import parse_size
from hicachefs.store.budget import SHARES

# The RAM cases: (page size, pages a call).
RAM_CASES = (("128 KiB", 8), ("256 KiB", 8), ("768 KiB", 32), ("1 MiB", 128), ("8 MiB", 128))
CASES = ("ram", "ranks", "exists", "ssd", "cross-host")
DEFAULT_CASES = ("ram", "ranks", "exists", "ssd")  # cross-host only when asked for


@dataclass
class Plan:
    """How much each case moves. Volumes are per backend (ranks: per rank)."""

    ram_memory: str                  # --memory of the RAM-tier mount
    ram_calls: Dict[tuple, int]      # RAM case -> calls written per round (kept for the reads)
    ram_write_rounds: int            # rounds of writes (all but the last are removed again)
    again_passes: int                # passes of reads again (after the first)
    ranks_calls: int                 # calls of 128 pages of 1 MiB per rank and phase (x128 of 8 small)
    ssd_calls: Dict[str, int]        # page size -> calls of 128 pages
    exists_pages: int
    exists_queries: int
    memcpy_bytes: int
    cross_host_calls: int            # calls of 128 pages of 1 MiB host A writes and host B reads


# Memory on a 24 GiB machine: each RAM case keeps at most 3 GiB per backend (hicachefs, two on
# tmpfs, memcpy's array); ranks 512 MiB per rank and backend plus a 128 MiB host pool per rank.
FULL = Plan("5G", dict(zip(RAM_CASES, (400, 400, 64, 16, 3))), 2, 2, 4, {"1 MiB": 16, "8 MiB": 4},
            100_000, 400, 1 << 30, 8)
QUICK = Plan("2560M", dict(zip(RAM_CASES, (100, 100, 16, 4, 2))), 1, 1, 2, {"1 MiB": 4},
             10_000, 100, 256 << 20, 3)
RANKS_PAGE = "1 MiB"
#: The existence case's pages: 64 bytes (one layer, one head of 16, one token), the smallest
#: page a pool can have, so that its hundred thousand keys take little room.
EXISTS_SHAPE = Shape(LLAMA_1B, 1, 1, 16, 1, 8)
#: The ranks cases: page size, pages a call, calls per rank and phase as a multiple of
#: ``ranks_calls``: SGLang's large batches of 1 MiB pages, and its controller's usual 8 pages a
#: call of 128 KiB (the same bytes: a phase of small calls lasts a few tenths of a second, not a
#: few hundredths, in which the ranks' start and the scheduler's noise bent its figure 30-50 %).
RANKS_SHAPES = ((RANKS_PAGE, STORAGE_BATCH_SIZE, 1), ("128 KiB", 8, 128))
RANKS_MEMORY_SLACK = 512 * MIB  # the ranks mount's RAM tier beyond the pages of the most ranks
#: Each process's buffers for memcpy in N processes at once (twice this: source and target).
TOGETHER_BYTES = 256 << 20
SSD_MEMORY, SSD_MAX_PAGE, SSD_DISK_SIZE = "128M", "16M", "8G"
HOST_MEMORY = "1G"  # each cross-host daemon's RAM tier
WRITE_BEHIND_WAIT_S = 60.0
FILL_THREADS = 4  # threads that store the existence case's pages


# ---------------------------------------------------------------------------- small facts


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


def memcpy_rate(size: int, repeats: int = 5, ready: Callable[[], None] = lambda: None) -> float:
    """GB/s of a numpy copy between two large buffers (bytes copied per second), median;
    ``ready()`` is called once both are filled, just before the copies."""
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault both in
    ready()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        rates.append(size / (time.perf_counter() - start) / 1e9)
    return float(np.median(rates))


def memcpy_rate_together(size: int, processes: int = 2) -> float:
    """GB/s in all of ``memcpy_rate`` in ``processes`` forked processes at once: how far this
    host's memory lets copies scale past one core (what ranks that each copy their own pages
    through the data plane can reach at best)."""
    context = multiprocessing.get_context("fork")
    start, rates = context.Barrier(processes), context.Queue()

    def copier() -> None:
        rates.put(memcpy_rate(size, ready=start.wait))  # every copier's buffers are ready: copy at once

    children = [context.Process(target=copier) for _ in range(processes)]
    for child in children:
        child.start()
    try:
        return sum(rates.get(timeout=120) for _ in children)
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join()


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


def timed(label: str, case: Callable, *args) -> None:
    start = time.perf_counter()
    case(*args)
    print(f"{label}: {time.perf_counter() - start:.0f} s ({load()})", file=sys.stderr)


def progress(items, label: str):
    return tqdm(items, desc=label, unit="call", leave=False, file=sys.stderr, dynamic_ncols=True)


def counts_list(text: str) -> List[int]:
    """``1,2,4`` -> [1, 2, 4]: positive integers, sorted, each once."""
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers, not {text!r}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"counts of at least 1, not {text!r}")
    return counts


# ---------------------------------------------------------------------------- one process


class Bench:
    """The RAM, SSD, existence and cross-host cases, in this process; the ranks case in rank
    workers (``ranks_case``)."""

    def __init__(self, plan: Plan, client: dict, fast_file: bool = True) -> None:
        self.plan, self.client, self.fast_file = plan, client, fast_file
        self.results: List[Result] = []

    def _recorded(self, case: str, op: str, backends, pool: Optional[Pool] = None,
                  **fields) -> Dict[str, Result]:
        """A result per backend for ``op`` in ``case``, already part of the report."""
        if pool is not None:
            fields.update(page_bytes=pool.page_bytes, batch=pool.batch)
        made = {name: Result(case, op, name, **fields) for name in backends}
        self.results.extend(made.values())
        return made

    def _pass(self, results: Dict[str, Result], pool: Pool, batches: Dict[str, List[str]],
              ops: Dict[str, Callable], write: bool, daemon: Daemon, fs: HiCacheFS, label: str,
              after_call: Callable[[], None] = lambda: None) -> None:
        """Each batch through every backend, the first one rotating call by call. The daemon's
        requests and CPU time over the pass are hicachefs's (the other backends cost it
        nothing); so are the client's plane requests in a read pass (its reports of the pages
        it read). A read pass ends with the client's report of its last reads and once the
        daemon has counted every page read. A write pass's steady figures (from its second
        batch on) count the daemon's CPU time during hicachefs's own calls only, each of which
        waits for its commit: an idle daemon's ticks while another backend's call of a GiB runs
        for seconds are not a cost of publishing (they made 8 MiB pages look 10x dearer)."""
        ours = results[HICACHEFS]
        mark, pages = daemon.mark(), ours.pages
        before = fs.statistics()
        names = list(ops)
        steady = None
        steady_cpu = 0.0
        for n, (tag, keys) in enumerate(progress(batches.items(), label)):
            for name in names[n % len(names):] + names[:n % len(names)]:
                started_cpu = daemon.cpu() if steady is not None and name == HICACHEFS else None
                results[name].add(timed_call(pool, tag, keys, ops[name], write))
                after_call()
                if started_cpu is not None:
                    steady_cpu += daemon.cpu() - started_cpu
            if n == 0 and write and len(batches) > 1:
                steady, steady_calls, steady_pages = daemon.mark(), ours.calls, ours.pages
        if steady is not None:  # a write pass's daemon cost from its second batch on
            requests, _ = daemon.since(steady)
            ours.steady_requests += sum(requests.values())
            ours.steady_evictions += daemon.stats()["evictions"] - steady.stats["evictions"]
            ours.steady_cpu += steady_cpu
            ours.steady_calls += ours.calls - steady_calls
            ours.steady_pages += ours.pages - steady_pages
        if not write:
            fs.report_reads()
            if not daemon.wait_for_hits(mark, ours.pages - pages):
                ours.note += "; the daemon did not count every read within 5 s"
        requests, cpu = daemon.since(mark)
        for op, count in requests.items():
            ours.requests[op] = ours.requests.get(op, 0) + count
        ours.daemon_cpu += cpu
        after = fs.statistics()
        if not write:
            ours.reports += after["plane_requests"] - before["plane_requests"]
        moved = "plane_writes" if write else "plane_reads"
        ours.plane_pages += after[moved] - before[moved]

    def ram_case(self, size: str, batch: int, daemon: Daemon, shm: Path) -> None:
        """Write, first read, reads again: hicachefs's RAM tier vs HiCacheFile, the fast_file
        core (on tmpfs) and memcpy."""
        pool = Pool(PAGES[size], batch)
        case = f"RAM {size} x{batch}"
        calls, rounds = self.plan.ram_calls[size, batch], self.plan.ram_write_rounds
        fs = make_hicachefs(daemon.mount.path, pool, client=self.client)
        backends = {HICACHEFS: fs, FILE: make_file(shm / "file", pool)}
        if self.fast_file:
            backends[FAST_FILE] = FastFileCore(shm / "fast_file", pool)
        backends[MEMCPY] = MemcpyPeer(pool, calls * batch + rounds)  # + each round's warm-up page
        writes = self._recorded(case, WRITE, backends, pool)
        batches: Dict[str, List[str]] = {}
        for r in range(rounds):
            batches = {f"{case}/r{r}/b{i}": keys_for(f"{case}/r{r}/b{i}", batch) for i in range(calls)}
            for backend in backends.values():
                warm_up(backend, pool, f"{case}/r{r}")
            self._pass(writes, pool, batches, {n: writer(b, pool) for n, b in backends.items()},
                       True, daemon, fs, f"{case} write {r + 1}/{rounds}")
            if r < rounds - 1:
                for backend in backends.values():
                    backend.clear()
        reads = {n: reader(b, pool) for n, b in backends.items()}
        # An untimed read of the last warm-up page, reported by the client's reporting thread:
        # that thread opens its handle on the plane file now, not in the first pass.
        reads[HICACHEFS](keys_for(f"{case}/r{rounds - 1}/warm-up", 1))
        time.sleep(REPORT_INTERVAL_S + 0.2)
        self._pass(self._recorded(case, FIRST, backends, pool), pool, batches, reads, False,
                   daemon, fs, f"{case} first read")
        again = self._recorded(case, AGAIN, backends, pool)
        for p in range(self.plan.again_passes):
            self._pass(again, pool, batches, reads, False, daemon, fs,
                       f"{case} read again {p + 1}/{self.plan.again_passes}")
        ours = [writes[HICACHEFS], *(r for r in self.results if r.case == case and r.backend == HICACHEFS
                                      and r.op in (FIRST, AGAIN))]
        for result in ours:
            if result.plane_pages < result.pages:
                result.note += (f"; only {result.plane_pages:,} of {result.pages:,} pages went "
                                "through the data plane")
        for backend in backends.values():
            backend.clear()
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        shutil.rmtree(shm / "file", ignore_errors=True)
        shutil.rmtree(shm / "fast_file", ignore_errors=True)

    def ssd_case(self, size: str, daemon: Daemon, file_dir: Path) -> None:
        """Write, then read cold: hicachefs's disk tier vs HiCacheFile on the same disk."""
        pool = Pool(PAGES[size])
        case = f"SSD cold {size} x{pool.batch}"
        mount = daemon.mount
        file_dir.mkdir(parents=True, exist_ok=True)
        fs = make_hicachefs(mount.path, pool, client=self.client)
        hf = make_file(file_dir, pool)
        backends = {HICACHEFS: fs, FILE: hf}
        writes = self._recorded(case, WRITE, backends, pool)
        batches = {f"{case}/b{i}": keys_for(f"{case}/b{i}") for i in range(self.plan.ssd_calls[size])}
        for backend in backends.values():
            warm_up(backend, pool, case)
        # os.sync between calls: the next writer does not pay for this one's writeback.
        self._pass(writes, pool, batches, {n: writer(b, pool) for n, b in backends.items()},
                   True, daemon, fs, f"{case} write", after_call=os.sync)

        # Only batches whose every page the daemon holds on disk: a cold read is a disk read.
        directory = Path(mount.path, fs._dir_of("kv"))
        on_disk = {tag: keys for tag, keys in batches.items()
                   if all(os.getxattr(directory / k, "user.hicachefs.tier") == b"disk"
                          for k in keys)}
        note = f"{len(on_disk)} of {len(batches)} batches wholly on the disk tier"
        for name, backend in backends.items():
            result = self._recorded(case, "cold read", [name], pool, note=note)[name]
            drop_caches()
            mark = daemon.mark()
            if name == HICACHEFS:
                result.note += "; " + self._arena_residency(mount)
            read = reader(backend, pool)
            plane_before = fs.statistics()["plane_reads"]
            for tag, keys in progress(on_disk.items(), f"{case} cold read {name}"):
                result.add(timed_call(pool, tag, keys, read, False))
            if name == HICACHEFS:
                fs.report_reads()
                after = daemon.stats()
                moved = {k: after[k] - mark.stats[k] for k in ("promotions", "demotions")}
                result.requests, result.daemon_cpu = daemon.since(mark)
                result.plane_pages = fs.statistics()["plane_reads"] - plane_before
                per_mib = result.requests.get("read", 0) / max(1, result.pages) * MIB / pool.page_bytes
                result.note += (f"; {result.plane_pages:,} of {result.pages:,} pages read through the "
                                "data plane from the disk tier's file (cold after the drop: see its "
                                f"residency); daemon READ requests per MiB read: {per_mib:.2f}; "
                                f"promotions {moved['promotions']}, demotions {moved['demotions']}")
                if result.pages and result.plane_pages < result.pages and per_mib < 1:
                    result.invalid = "(not cold: the kernel's cache served some pages)"
        fs.clear()
        fs.close()
        hf.clear()
        shutil.rmtree(file_dir, ignore_errors=True)

    @staticmethod
    def _arena_residency(mount: mounting.Mount) -> str:
        """How much of the disk arena is still in the page cache after dropping it."""
        config = json.loads((mount.path / ".hicachefs" / "config").read_text())
        files = [str(p) for p in Path(config["disk_dir"]).iterdir() if p.is_file()]
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", *files],
                             capture_output=True, text=True)
        resident = sum(int(x) for x in out.stdout.split() if x.isdigit())
        return f"disk arena resident in page cache after drop_caches: {resident / MIB:.0f} MiB"

    def exists_case(self, daemon: Daemon, file_dir: Path) -> None:
        """batch_exists of 128 stored keys with many pages stored: pages of 64 bytes
        (``EXISTS_SHAPE``), so that a hundred thousand fit; the query's cost is per key, not per
        byte, and a page counts as held only at its pool's page size."""
        pool = Pool(EXISTS_SHAPE)
        model = "bench/exists"
        count = self.plan.exists_pages
        keys = keys_for("exists", count)
        fs = make_hicachefs(daemon.mount.path, pool, client=self.client, model=model)
        file_dir.mkdir(parents=True, exist_ok=True)
        hf = make_file(file_dir, pool, model=model)

        # Stored with plain file I/O, on a few threads: only the query is timed.
        directory = Path(daemon.mount.path, fs._dir_of("kv"))
        directory.mkdir(parents=True, exist_ok=True)
        payload = b"\0" * pool.page_bytes

        def publish(key: str) -> None:
            tmp = directory / f".{secrets.token_hex(8)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.ftruncate(fd, len(payload))
            os.pwrite(fd, payload, 0)
            os.close(fd)
            os.rename(tmp, directory / key)

        def write_file(key: str) -> None:
            with open(file_dir / f"{hf._get_suffixed_key(key)}.bin", "wb") as f:
                f.write(payload)

        rates = {}
        for name, store in ((HICACHEFS, publish), (FILE, write_file)):
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(FILL_THREADS) as workers:
                for _ in tqdm(workers.map(store, keys), total=count, unit="page", leave=False,
                              desc=f"storing {count:,} small pages for {name}", file=sys.stderr,
                              dynamic_ncols=True, mininterval=0.5):
                    pass
            rates[name] = count / (time.perf_counter() - start)

        rng = np.random.default_rng(2)
        queries = [[keys[int(j)] for j in rng.choice(count, STORAGE_BATCH_SIZE, replace=False)]
                   for _ in range(self.plan.exists_queries)]
        results = self._recorded("exists", "exists", (HICACHEFS, FILE))
        for name, rate in rates.items():
            results[name].note = f"{count:,} pages stored ({rate:,.0f}/s to store them on {FILL_THREADS} threads)"
        mark = daemon.mark()
        for n, q in enumerate(progress(queries, "exists")):
            for name, backend in (((HICACHEFS, fs), (FILE, hf)) if n % 2 == 0
                                  else ((FILE, hf), (HICACHEFS, fs))):
                start = time.perf_counter()
                hits = backend.batch_exists(q)
                results[name].seconds.append(time.perf_counter() - start)
                results[name].pages += len(q)
                results[name].failed += len(q) - hits
        results[HICACHEFS].requests, results[HICACHEFS].daemon_cpu = daemon.since(mark)
        fs.clear()
        fs.close()
        shutil.rmtree(file_dir, ignore_errors=True)

    def cross_host_case(self, host_a: Daemon, host_b: Daemon, volume: GlusterVolume) -> None:
        """Host A writes, host B reads: hicachefs's shared tier vs HiCacheFile on one volume."""
        pool = Pool(PAGES["1 MiB"])
        case = f"cross-host 1 MiB x{pool.batch}"
        fs_a = make_hicachefs(host_a.mount.path, pool, client=self.client)
        fs_b = make_hicachefs(host_b.mount.path, pool, client=self.client)
        hf_a, hf_b = make_file(volume.a / "file", pool), make_file(volume.b / "file", pool)
        batches = {f"{case}/b{i}": keys_for(f"{case}/b{i}") for i in range(self.plan.cross_host_calls)}
        writes = self._recorded(case, "write on A", (HICACHEFS, FILE), pool)

        def write_behind_done() -> None:
            deadline = time.monotonic() + WRITE_BEHIND_WAIT_S
            while time.monotonic() < deadline:
                shared = host_a.stats()["tiers"]["shared"]
                if not (shared["queue_pages"] or shared["writing"]):
                    break
                time.sleep(0.02)

        warm_up(fs_a, pool, case)
        warm_up(hf_a, pool, case)
        self._pass(writes, pool, batches, {HICACHEFS: writer(fs_a, pool), FILE: writer(hf_a, pool)},
                   True, host_a, fs_a, f"{case} write on A", after_call=write_behind_done)
        # Another host's pages are announced within about a second: wait for the last one by a
        # lookup of its name on B (the exists query would fetch pages ahead, before the timing).
        last_key = batches[list(batches)[-1]][-1]
        last = host_b.mount.path / next(host_a.mount.path.rglob(last_key)).relative_to(host_a.mount.path)
        deadline = time.monotonic() + 10
        while not last.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        dropped = host_a.stats()["tiers"]["shared"]["dropped"]
        reads = self._recorded(case, "exists + read on B", (HICACHEFS, FILE), pool)
        self._pass(reads, pool, batches, {HICACHEFS: found_then_read(fs_b, pool),
                                          FILE: found_then_read(hf_b, pool)},
                   False, host_b, fs_b, f"{case} read on B")
        stats_b = host_b.stats()
        shared_b = {**stats_b["tiers"]["shared"], "fetched_ahead": stats_b["fetched_ahead"]}
        for name, result in reads.items():
            result.note = (f"host B read {result.pages} of the {len(batches) * pool.batch} pages host A "
                           "wrote" + (f" (host A's write-behind dropped {dropped}; host B's shared tier: "
                                      f"{shared_b['fetched_ahead']} fetched ahead, {shared_b['timeouts']} "
                                      f"timeouts, {shared_b['failures']} failures)" if name == HICACHEFS else ""))
        self._cross_host_misses(case, fs_b, hf_b)
        for backend in (fs_a, fs_b):
            backend.close()

    def _cross_host_misses(self, case: str, fs_b, hf_b) -> None:
        """batch_exists on B of 128 keys no host wrote: what most of SGLang's queries are."""
        misses = self._recorded(case, "exists", (HICACHEFS, FILE),
                                note="128 keys that no host wrote (all misses)")
        for n in range(self.plan.exists_queries // 4):
            keys = keys_for(f"{case}/missing{n}")
            for name, backend in (((HICACHEFS, fs_b), (FILE, hf_b)) if n % 2 == 0 else ((FILE, hf_b), (HICACHEFS, fs_b))):
                start = time.perf_counter()
                backend.batch_exists(keys)
                misses[name].seconds.append(time.perf_counter() - start)
                misses[name].pages += len(keys)


def cross_host(bench: Bench, work: Path, mount_options: List[str]) -> Optional[str]:
    """The cross-host case on a throw-away GlusterFS volume; why it was skipped, or None."""
    try:
        volume = GlusterVolume.up(work / "gluster")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        GlusterVolume.down(work / "gluster")
        return f"cross-host case skipped: GlusterFS did not start here ({str(exc).splitlines()[0]})"
    hosts = []
    try:
        for name, view in (("a", volume.a), ("b", volume.b)):
            hosts.append(mounting.start(work / f"host-{name}", work / f"host-{name}.log",
                                        ["--memory", HOST_MEMORY, "--shared", str(view / "hc"),
                                         *mount_options]))
        timed("cross-host 1 MiB", bench.cross_host_case, *(Daemon(h) for h in hosts), volume)
    except BaseException:
        for host in hosts:
            print_log_tail(host)
        raise
    finally:
        for host in hosts:
            mounting.stop(host)
        GlusterVolume.down(work / "gluster")
    return None


# ---------------------------------------------------------------------------- ranks


RANK_PHASES = (("write", WRITE), ("read", FIRST))


def ranks_case(bench: Bench, counts: List[int], daemon: Daemon, file_dir: Path,
               size: str, batch: int, calls: int) -> None:
    """1, then each larger count of ranks of each backend: all ranks of a backend run each
    phase at the same moment, ``calls`` calls of ``batch`` pages of ``size`` each; the backends
    take turns phase by phase."""
    plan = bench.plan
    shape = replace(PAGES[size], tp_size=max(8, counts[-1]))  # ranks of one TP8 server
    case = f"ranks {size} x{batch}"
    file_dir.mkdir(parents=True, exist_ok=True)
    roots = {HICACHEFS: daemon.mount.path, FILE: file_dir}
    workers: Dict[str, List[RankWorker]] = {name: [] for name in roots}
    phases = list(RANK_PHASES) + [("read", AGAIN)] * plan.again_passes
    try:
        for name, root in roots.items():
            for rank in range(counts[-1]):
                workers[name].append(RankWorker(name, root, shape, rank, calls, bench.client, batch))
        for worker in (w for group in workers.values() for w in group):
            if worker.receive() != "ready":
                raise RuntimeError(f"rank process {worker.proc.pid} did not start")
        for ranks in counts:
            made: Dict[tuple, Result] = {}
            for n, (command, op) in enumerate(progress(phases, f"{case} x{ranks}")):
                for name in (list(roots) if n % 2 == 0 else list(roots)[::-1]):
                    if (name, op) not in made:
                        made[name, op] = Result(case, op, name, ranks=ranks, wall=0.0, batch=batch)
                        bench.results.append(made[name, op])
                    rank_phase(made[name, op], workers[name][:ranks], command,
                               f"ranks{ranks}", daemon if name == HICACHEFS else None)
            for op in (WRITE, FIRST, AGAIN):
                ours = made.get((HICACHEFS, op))
                if ours is not None and ours.plane_pages < ours.pages:
                    ours.note += (f"; only {ours.plane_pages:,} of {ours.pages:,} pages went "
                                  "through the data plane")
            clear(w for group in workers.values() for w in group[:ranks])
    finally:
        for worker in (w for group in workers.values() for w in group):
            worker.stop()
    shutil.rmtree(file_dir, ignore_errors=True)


def clear(workers) -> None:
    """Each worker removes its pages, one after the other (HiCacheFile's ``clear`` empties its
    whole directory, which its ranks share): room for the next count's pages."""
    for worker in workers:
        worker.send("clear")
        worker.receive()


def rank_phase(result: Result, workers: List[RankWorker], phase: str, tag: str,
               daemon: Optional[Daemon]) -> None:
    """All ``workers`` run ``phase`` at once; ``daemon``: the one they cost (hicachefs)."""
    mark = daemon.mark() if daemon is not None else None
    for worker in workers:
        worker.send(phase, tag)
    answers = [worker.receive() for worker in workers]
    result.wall += max(a["end"] for a in answers) - min(a["start"] for a in answers)
    for a in answers:
        for call in a["calls"]:
            result.add(call)
        result.page_bytes = a["page_bytes"]
        result.plane_pages += a["plane_writes" if phase == "write" else "plane_reads"]
        if phase != "write":
            result.reports += a["plane_requests"]
    if daemon is not None:
        pages = sum(call.pages for a in answers for call in a["calls"])
        if phase != "write" and not daemon.wait_for_hits(mark, pages):
            result.note += "; the daemon did not count every read within 5 s"
        requests, cpu = daemon.since(mark)
        for op, n in requests.items():
            result.requests[op] = result.requests.get(op, 0) + n
        result.daemon_cpu += cpu


def ranks_cases(bench: Bench, counts: List[int], work: Path, shm: Path,
                mount_options: List[str], configs: List[str]) -> None:
    """The ranks cases on a mount of their own."""
    memory = counts[-1] * bench.plan.ranks_calls * STORAGE_BATCH_SIZE * PAGES[RANKS_PAGE].page_bytes \
        + RANKS_MEMORY_SLACK
    mount = mounting.start(work / "ranks", work / "ranks.log",
                           ["--memory", f"{memory // MIB}M", *mount_options])
    configs.append(f"ranks mount: {config_line(mount)}")
    try:
        for size, batch, times in RANKS_SHAPES:
            timed(f"ranks {size}", ranks_case, bench, counts, Daemon(mount), shm / "ranks",
                  size, batch, times * bench.plan.ranks_calls)
    except BaseException:
        print_log_tail(mount)
        raise
    finally:
        mounting.stop(mount)


# ---------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smaller volumes: under 2 minutes on a 2-core VM")
    parser.add_argument("--chart", type=Path, default=Path("bench.png"),
                        help="where the PNG chart goes (default: bench.png here)")
    parser.add_argument("--disk-dir", type=Path, default=Path("/var/tmp"),
                        help="a directory on the disk filesystem (not tmpfs) for the SSD case")
    parser.add_argument("--exists-pages", type=int, help="pages stored for the existence case")
    parser.add_argument("--client", type=json.loads, default={},
                        help="more extra_config keys for HiCacheFS, JSON (e.g. "
                             "'{\"read_threads\": 1}' or '{\"data_plane\": false}'); default: the "
                             "client's defaults")
    parser.add_argument("--mount-option", action="append", default=[], metavar="FLAG",
                        help="one more flag for every hicachefs mount, e.g. "
                             "--mount-option=--no-kernel-cache (repeatable)")
    parser.add_argument("--ranks", type=counts_list, default=[1, 2], metavar="N,N,...",
                        help="rank processes at once in the ranks case (default 1,2; e.g. 1,2,4,8 "
                             "on a 16-core host; 1 is always run: the scaling is from one rank)")
    parser.add_argument("--no-fast-file", dest="fast_file", action="store_false",
                        help="leave the fast_file core out of the RAM cases")
    parser.add_argument("--only", choices=CASES, action="append",
                        help="run only these cases (repeatable; default all but cross-host)")
    args = parser.parse_args()
    args.ranks = sorted({1, *args.ranks})
    return args


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        print("bench.py needs root (FUSE mounts and drop_caches)", file=sys.stderr)
        return 2
    cases = set(args.only or DEFAULT_CASES)
    plan = QUICK if args.quick else FULL
    if args.exists_pages:
        plan.exists_pages = args.exists_pages
    skipped = None
    logging.basicConfig(level=logging.ERROR)
    as_sglang_runs()

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
    bench = Bench(plan, args.client, args.fast_file)
    memcpy = memcpy_rate(plan.memcpy_bytes)
    together: Dict[int, float] = {}
    if "ranks" in cases:
        together = {n: memcpy_rate_together(min(plan.memcpy_bytes, TOGETHER_BYTES), n)
                    for n in args.ranks}
    kernel_copy = kernel_copy_rate(shm)
    configs: List[str] = []
    try:
        if cases & {"ram", "exists"}:
            mount = mounting.start(work / "ram", work / "ram.log",
                                   ["--memory", plan.ram_memory, *args.mount_option])
            configs.append(f"RAM mount: {config_line(mount)}")
            daemon = Daemon(mount)
            try:
                if "ram" in cases:
                    for size, batch in RAM_CASES:
                        timed(f"RAM {size} x{batch}", bench.ram_case, size, batch, daemon, shm)
                if "exists" in cases:
                    timed("exists", bench.exists_case, daemon, shm / "file-exists")
            except BaseException:
                print_log_tail(mount)
                raise
            finally:
                mounting.stop(mount)
        if "ranks" in cases:
            ranks_cases(bench, args.ranks, work, shm, args.mount_option, configs)
        if "ssd" in cases:
            (disk / "arena").mkdir()
            mount = mounting.start(work / "ssd", work / "ssd.log",
                                   ["--memory", SSD_MEMORY, "--max-page-size", SSD_MAX_PAGE,
                                    "--disk", str(disk / "arena"), "--disk-size", SSD_DISK_SIZE,
                                    *args.mount_option])
            configs.append(f"SSD mount: {config_line(mount)}")
            try:
                daemon = Daemon(mount)
                for size in plan.ssd_calls:
                    timed(f"SSD cold {size}", bench.ssd_case, size, daemon, disk / f"file-{size}")
            except BaseException:
                print_log_tail(mount)
                raise
            finally:
                mounting.stop(mount)
        if "cross-host" in cases:
            skipped = cross_host(bench, work, args.mount_option)
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
    print(f"As SGLang runs them: torch threads {TORCH_THREADS} in every process, glibc keeping freed "
          "memory (as CUDA's caching host allocator does for SGLang's staging pages); HiCacheFile "
          "through the cache controller's generic path (the one it takes for the file backend), "
          "defaults (no size cap, metadata cache off), on tmpfs; hicachefs through the zero-copy v1 "
          f"path (interface_v1), client extra_config {json.dumps(args.client)} over its default "
          f"threads {CLIENT_THREADS} (data plane on unless that says data_plane false)"
          + (f"; '{FAST_FILE}': {FastFileCore.label}, our own lines: pwritev/preadv between the "
             "pool's page buffers (get_page_buffer_meta) and tmpfs files, temporary file + rename, "
             "reads in runs of at least 1 MiB on 4 threads, writes one by one" if args.fast_file
             else f"; '{FAST_FILE}' left out (--no-fast-file)")
          + f"; '{MEMCPY}': {MemcpyPeer.label}")
    print("pages: " + "; ".join(f"{label} {shape.describe()}" for label, shape in PAGES.items()))
    print(f"RAM and ranks: hicachefs --memory {plan.ram_memory} (ranks: its own mount) vs "
          f"HiCacheFile on tmpfs; SSD cold: hicachefs --memory {SSD_MEMORY} --disk on {disk_fs} vs "
          f"HiCacheFile on {disk_fs}, page cache dropped before each backend's read pass")
    if "cross-host" in cases:
        print(f"cross-host: hicachefs --memory {HOST_MEMORY} --shared on each of a GlusterFS "
              "volume's two mounts vs HiCacheFile on the same mounts; host A writes, host B reads")
    for line in configs:
        print(line)
    if skipped:
        print(skipped)
    print(f"memcpy (numpy copy of {plan.memcpy_bytes >> 20} MiB): {memcpy:.2f} GB/s at the start, "
          f"{memcpy_end:.2f} GB/s at the end"
          + "".join(f", {rate:.2f} GB/s in all in {n} processes at once ({rate / together[1]:.2f}x "
                    f"one, {min(plan.memcpy_bytes, TOGETHER_BYTES) >> 20} MiB each)"
                    for n, rate in together.items() if n > 1)
          + f"; one kernel copy (preadv of a hot 8 MiB tmpfs file): {kernel_copy:.2f} GB/s")
    print()
    most = args.ranks[-1]
    print(table(bench.results, memcpy,
                f"ranks: each rank its own process, host pool and pages (TP ranks tp0..tp{most - 1} "
                f"of a model at TP{max(8, most)}), all at once, per rank and phase {plan.ranks_calls} "
                f"calls of {STORAGE_BATCH_SIZE} pages of 1 MiB (Llama-3.1-8B) and "
                f"{RANKS_SHAPES[1][2] * plan.ranks_calls} calls of 8 pages of 128 KiB (Llama-3.2-1B); "
                f"each rank's client copies a batch on up to {CLIENT_THREADS['read_threads']} threads "
                f"(reads) and {CLIENT_THREADS['write_threads']} (writes) in runs of at least 32 MiB, so "
                f"one rank of 1 MiB pages may already keep {os.cpu_count()} cores busy:",
                together, int(parse_size(plan.ram_memory) * SHARES["reserved_ahead"][0])))
    args.chart.parent.mkdir(parents=True, exist_ok=True)
    chart(bench.results, memcpy, args.chart,
          f"hicachefs (zero-copy v1, data plane) vs SGLang HiCacheFile (generic path), the fast_file "
          f"core and memcpy, torch threads {TORCH_THREADS}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print(f"\nchart: {args.chart.resolve()}")
    return 1 if any(r.failed or r.bad_pages or r.invalid for r in bench.results) else 0


if __name__ == "__main__":
    sys.exit(main())
