#!/usr/bin/env python3
"""hicachefs beside SGLang's own ``file`` backend (``HiCacheFile``), both as SGLang runs them.

Every process runs with one torch thread, as SGLang's ``ModelRunner`` sets on a GPU server.
Both backends get exactly the calls SGLang 0.5.23's cache controller makes for them, in batches
of 128 pages (``STORAGE_BATCH_SIZE``), on a host pool laid out as SGLang's MHA ``page_first``
pool (page-aligned, as SGLang's pinned pool is), filled with random bytes and stamped so that
every written page is unique (``bench_sglang.py``):
  - ``HiCacheFile`` with its defaults, on tmpfs (``/dev/shm``), its fastest home: the
    controller's generic path, the only one it gives the ``file`` backend. Write:
    ``get_data_page`` of every page, then ``batch_set``. Read: one ``get_dummy_flat_data_page``
    staging page per key, ``batch_get`` into them, then ``set_from_flat_data_page``.
  - hicachefs (``HiCacheFS`` on a mount this script makes and removes): the zero-copy v1 path
    the controller takes for a dynamic backend with ``interface_v1``: ``batch_set_v1`` /
    ``batch_get_v1`` with host indices.

Cases (the two backends alternate call by call, so that load from elsewhere hits both alike):
  - RAM: hicachefs's RAM tier vs ``HiCacheFile`` on tmpfs; pages of 1 MiB (Llama-3.1-8B at
    TP8) and 8 MiB (at TP1): write, first read after write, repeated read.
  - ranks: 1, then 2 client processes (TP ranks tp0of2 and tp1of2, each its own host pool
    and its own pages; ``bench_rank.py``) doing each phase at the same moment; aggregate GB/s
    and the scaling from 1 to 2 ranks of each backend. 1 MiB pages (and 8 MiB in a full run).
  - existence: ``batch_exists`` of 128 stored keys with 100,000 pages stored (10,000 --quick).
  - SSD cold, 1 and 8 MiB (1 MiB with --quick): hicachefs with a 128 MiB RAM tier, so pages
    are demoted to ``--disk`` on the disk filesystem, vs ``HiCacheFile`` on the same
    filesystem; only batches wholly on the disk tier are read, after
    ``sync; echo 3 > /proc/sys/vm/drop_caches`` (which also drops the kernel's cache of the
    mount's files: the daemon's READ count shows it).
  - cross-host, 1 MiB: a throw-away GlusterFS volume (``scripts/glusterfs.sh``) mounted twice,
    as two hosts would. Host A writes, host B reads what A wrote: hicachefs with ``--shared``
    on each host's view of the volume (B finds A's pages on the shared tier), vs
    ``HiCacheFile`` pointed at the same volume (A writes through its view, B reads through
    its own), which is how users share pages across hosts with SGLang today. A's calls are
    paced as prefill paces backups (each starts once A's write-behind has the last one on the
    volume), so no page is dropped; B's hits out of what it asked show whether B found every
    page A has. Then ``batch_exists`` on B of 128 keys no host wrote (most of SGLang's queries
    miss). Skipped, with a line saying why, where GlusterFS cannot start.
Sampled pages of every read call are checked byte for byte.

Prints a table (GB/s, pages/s, p50/p99 per call, ratio hicachefs/HiCacheFile, fraction of the
memcpy rate measured in the same run, CPU seconds per GB, FUSE requests per page, the daemon's
own CPU per GB, the issue's targets with ok/MISS) and writes a PNG chart. Needs root (FUSE, drop_caches). About 5 minutes; --quick about 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from bench_rank import RankWorker
from bench_report import FILE, HICACHEFS, Result, chart, table
from bench_sglang import (
    MIB,
    MODEL,
    STORAGE_BATCH_SIZE,
    TORCH_THREADS,
    Pool,
    as_sglang_runs,
    keys_for,
    make_file,
    found_then_read,
    make_hicachefs,
    reader,
    writer,
)
from hicachefs.testing import glusterfs, mounting
from hicachefs_client import paths as client_paths



@dataclass
class Plan:
    """How much each case moves. Volumes are per backend (ranks: per rank)."""

    ram_memory: str              # --memory of the RAM-tier mount
    ram_batches: Dict[int, int]  # page MiB -> batches written per round (kept for reads)
    ram_write_rounds: int        # rounds of writes (all but the last are removed again)
    ram_read_passes: int         # passes over the kept batches: the first, then repeated
    ranks_batches: Dict[int, int]  # page MiB -> batches per rank
    ranks_read_passes: int
    ssd_batches: Dict[int, int]
    exists_pages: int
    exists_queries: int
    memcpy_bytes: int
    cross_host_batches: int      # batches of 1 MiB pages host A writes and host B reads


# Memory: the RAM case keeps up to 4 GiB per backend, ranks at 8 MiB 2 GiB per backend plus 1 GiB
# of host pool per rank process: with the kernel's cache of the mount as a mirror, more would
# push pages out of it on a 24 GiB machine and turn repeated reads into first reads.
FULL = Plan("5G", {1: 16, 8: 4}, 2, 3, {1: 12, 8: 1}, 3, {1: 16, 8: 4}, 100_000, 400, 1 << 30, 8)
QUICK = Plan("2560M", {1: 8, 8: 2}, 1, 2, {1: 4}, 2, {1: 4}, 10_000, 100, 256 << 20, 3)
SSD_MEMORY, SSD_MAX_PAGE, SSD_DISK_SIZE = "128M", "16M", "8G"
HOST_MEMORY = "1G"  # each cross-host daemon's RAM tier
WRITE_BEHIND_WAIT_S = 60.0
RANKS = 2
FILL_THREADS = 4  # threads that store the existence case's pages
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
    return float(np.median(rates))


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


def request_delta(before: dict, after: dict) -> Dict[str, int]:
    b, a = before.get("requests", {}), after.get("requests", {})
    return {op: a[op] - b.get(op, 0) for op in a if a[op] - b.get(op, 0)}


def daemon_config(mount: mounting.Mount) -> str:
    """The mount's effective configuration, minus what only names this run's paths."""
    config = json.loads((mount.path / ".hicachefs" / "config").read_text())
    shown = {k: v for k, v in config.items()
             if k not in ("pid", "mountpoint", "log_file", "disk_dir")}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


def daemon_cpu(mount: mounting.Mount) -> float:
    """CPU seconds the daemon has used (all its threads; clock-tick resolution)."""
    fields = Path(f"/proc/{mount.pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def print_log_tail(mount: mounting.Mount, lines: int = 40) -> None:
    print(f"mount {mount.path}: {'mounted' if mounting.is_mounted(mount.path) else 'NOT mounted'}"
          f", daemon {mount.pid} {'alive' if mounting.alive(mount.pid) else 'gone'}; daemon log "
          f"{mount.log_file} (last {lines} lines):", file=sys.stderr)
    print("\n".join(mount.log_text().splitlines()[-lines:]), file=sys.stderr)


def timed(label: str, case: Callable, *args) -> None:
    start = time.perf_counter()
    case(*args)
    print(f"{label}: {time.perf_counter() - start:.0f} s ({load()})", file=sys.stderr)


def progress(items, label: str):
    return tqdm(items, desc=label, unit="call", leave=False, file=sys.stderr, dynamic_ncols=True)


# ---------------------------------------------------------------------------- one process


class Bench:
    """The RAM, SSD and existence cases, in this process; the ranks case in rank workers."""

    def __init__(self, plan: Plan, client: dict) -> None:
        self.plan, self.client = plan, client
        self.results: List[Result] = []
        self.pools: Dict[int, Pool] = {}

    def pool(self, page_mib: int) -> Pool:
        if page_mib not in self.pools:
            self.pools[page_mib] = Pool(page_mib)
        return self.pools[page_mib]

    def _recorded(self, case: str, op: str, **fields) -> Dict[str, Result]:
        """A result per backend for ``op`` in ``case``, already part of the report."""
        made = {name: Result(case, op, name, **fields) for name in (HICACHEFS, FILE)}
        self.results.extend(made.values())
        return made

    def _interleaved(self, results: Dict[str, Result], pool: Pool, batches: Dict[str, List[str]],
                     ops: Dict[str, Callable], write: bool, mount: mounting.Mount,
                     label: str, after_call: Callable[[], None] = lambda: None) -> None:
        """Each batch through every backend, alternating which goes first."""
        before = mount.stats()
        for n, (tag, keys) in enumerate(progress(batches.items(), label)):
            for name in (list(ops) if n % 2 == 0 else list(ops)[::-1]):
                self._call(results[name], pool, tag, keys, ops[name], write,
                           mount if name == HICACHEFS else None)
                after_call()
        for op, count in request_delta(before, mount.stats()).items():
            requests = results[HICACHEFS].requests
            requests[op] = requests.get(op, 0) + count

    @staticmethod
    def _call(result: Result, pool: Pool, tag: str, keys: List[str], op: Callable,
              write: bool, mount: Optional[mounting.Mount]) -> None:
        """One call of ``op``, timed; ``mount``: the daemon whose CPU time it costs too."""
        if write:
            pool.stamp(tag)
        else:
            pool.scribble()
        daemon_before = daemon_cpu(mount) if mount is not None else 0.0
        start, start_cpu = time.perf_counter(), time.process_time()
        outcome = op(keys)
        result.seconds.append(time.perf_counter() - start)
        result.cpu += time.process_time() - start_cpu
        if mount is not None:
            result.daemon_cpu += daemon_cpu(mount) - daemon_before
        if write:
            result.failed += 0 if outcome else len(keys)
            result.pages += len(keys)
        else:
            result.failed += len(keys) - outcome
            result.pages += outcome
            result.bad_pages += pool.check(tag, outcome)

    def ram_case(self, page_mib: int, mount: mounting.Mount, file_dir: Path) -> None:
        """Write, first read, repeated reads: hicachefs's RAM tier vs HiCacheFile on tmpfs."""
        pool = self.pool(page_mib)
        case = f"RAM {page_mib} MiB"
        file_dir.mkdir(parents=True, exist_ok=True)
        fs = make_hicachefs(mount.path, pool, client=self.client)
        hf = make_file(file_dir, pool)
        backends = {HICACHEFS: fs, FILE: hf}
        writes = self._recorded(case, "write", page_bytes=pool.page_bytes)
        batches: Dict[str, List[str]] = {}
        rounds = self.plan.ram_write_rounds
        for r in range(rounds):
            batches = {f"{case}/r{r}/b{i}": keys_for(f"{case}/r{r}/b{i}")
                       for i in range(self.plan.ram_batches[page_mib])}
            self._interleaved(writes, pool, batches,
                              {n: writer(b, pool) for n, b in backends.items()}, True, mount,
                              f"{case} write {r + 1}/{rounds}")
            if r < rounds - 1:
                fs.clear()
                hf.clear()
        reads = {n: reader(b, pool) for n, b in backends.items()}
        passes = self.plan.ram_read_passes
        self._interleaved(self._recorded(case, "first read", page_bytes=pool.page_bytes), pool, batches,
                          reads, False, mount, f"{case} first read")
        repeated = self._recorded(case, "repeated read", page_bytes=pool.page_bytes)
        for p in range(1, passes):
            self._interleaved(repeated, pool, batches, reads, False, mount,
                              f"{case} repeated read {p}/{passes - 1}")
        fs.clear()
        fs.close()
        hf.clear()
        shutil.rmtree(file_dir, ignore_errors=True)

    def ssd_case(self, page_mib: int, mount: mounting.Mount, file_dir: Path) -> None:
        """Write, then read cold: hicachefs's disk tier vs HiCacheFile on the same disk."""
        pool = self.pool(page_mib)
        case = f"SSD cold {page_mib} MiB"
        file_dir.mkdir(parents=True, exist_ok=True)
        fs = make_hicachefs(mount.path, pool, client=self.client)
        hf = make_file(file_dir, pool)
        backends = {HICACHEFS: fs, FILE: hf}
        writes = self._recorded(case, "write", page_bytes=pool.page_bytes)
        batches = {f"{case}/b{i}": keys_for(f"{case}/b{i}")
                   for i in range(self.plan.ssd_batches[page_mib])}
        # os.sync between calls: the next writer does not pay for this one's writeback.
        self._interleaved(writes, pool, batches, {n: writer(b, pool) for n, b in backends.items()},
                          True, mount, f"{case} write", after_call=os.sync)

        # Only batches whose every page the daemon holds on disk: a cold read is a disk read.
        directory = Path(mount.path, fs._dir_of("kv"))
        on_disk = {tag: keys for tag, keys in batches.items()
                   if all(os.getxattr(directory / k, "user.hicachefs.tier") == b"disk"
                          for k in keys)}
        note = f"{len(on_disk)} of {len(batches)} batches wholly on the disk tier"
        for name, backend in backends.items():
            result = Result(case, "cold read", name, page_bytes=pool.page_bytes, note=note)
            self.results.append(result)
            drop_caches()
            before = mount.stats()
            if name == HICACHEFS:
                result.note += "; " + self._arena_residency(mount)
            read = reader(backend, pool)
            for tag, keys in progress(on_disk.items(), f"{case} cold read {name}"):
                self._call(result, pool, tag, keys, read, False,
                           mount if name == HICACHEFS else None)
            if name == HICACHEFS:
                after = mount.stats()
                result.requests = request_delta(before, after)
                moved = {k: after[k] - before[k] for k in ("promotions", "demotions")}
                per_mib = result.requests.get("read", 0) / max(1, result.pages) / page_mib
                result.note += (f"; daemon READ requests per MiB read: {per_mib:.2f} (>= 1: none "
                                f"served from the kernel's cache); promotions "
                                f"{moved['promotions']}, demotions {moved['demotions']}")
                if result.pages and per_mib < 1:
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

    def exists_case(self, mount: mounting.Mount, file_dir: Path) -> None:
        """batch_exists of 128 stored keys with many pages stored."""
        pool = self.pool(1)
        model = "bench/exists"
        count = self.plan.exists_pages
        keys = keys_for("exists", count)
        fs = make_hicachefs(mount.path, pool, client=self.client, model=model)
        file_dir.mkdir(parents=True, exist_ok=True)
        hf = make_file(file_dir, pool, model=model)

        # Stored with plain file I/O (64-byte pages), on a few threads: only the query is timed.
        directory = Path(mount.path, fs._dir_of("kv"))
        directory.mkdir(parents=True, exist_ok=True)
        payload = b"\0" * 64

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
        results = self._recorded("exists", "exists")
        for name, rate in rates.items():
            results[name].note = f"{count:,} pages stored ({rate:,.0f}/s to store them on {FILL_THREADS} threads)"
        before = mount.stats()
        for n, q in enumerate(progress(queries, "exists")):
            for name, backend in (((HICACHEFS, fs), (FILE, hf)) if n % 2 == 0
                                  else ((FILE, hf), (HICACHEFS, fs))):
                start = time.perf_counter()
                hits = backend.batch_exists(q)
                results[name].seconds.append(time.perf_counter() - start)
                results[name].pages += len(q)
                results[name].failed += len(q) - hits
        results[HICACHEFS].requests = request_delta(before, mount.stats())
        fs.clear()
        fs.close()
        shutil.rmtree(file_dir, ignore_errors=True)


    def cross_host_case(self, host_a: mounting.Mount, host_b: mounting.Mount,
                        volume: glusterfs.GlusterVolume) -> None:
        """Host A writes, host B reads: hicachefs's shared tier vs HiCacheFile on one volume."""
        pool = self.pool(1)
        case = "cross-host 1 MiB"
        fs_a = make_hicachefs(host_a.path, pool, client=self.client)
        fs_b = make_hicachefs(host_b.path, pool, client=self.client)
        hf_a, hf_b = make_file(volume.a / "file", pool), make_file(volume.b / "file", pool)
        batches = {f"{case}/b{i}": keys_for(f"{case}/b{i}") for i in range(self.plan.cross_host_batches)}
        writes = self._recorded(case, "write on A", page_bytes=pool.page_bytes)

        def write_behind_done() -> None:
            deadline = time.monotonic() + WRITE_BEHIND_WAIT_S
            while (host_a.stats()["tiers"]["shared"]["queue_pages"] or
                   host_a.stats()["tiers"]["shared"]["writing"]) and time.monotonic() < deadline:
                time.sleep(0.02)

        self._interleaved(writes, pool, batches, {HICACHEFS: writer(fs_a, pool), FILE: writer(hf_a, pool)},
                          True, host_a, f"{case} write on A", after_call=write_behind_done)
        # Another host's pages are announced within about a second: wait for the last one by a
        # lookup of its name on B (the exists query would fetch pages ahead, before the timing).
        last_key = batches[list(batches)[-1]][-1]
        last = host_b.path / next(host_a.path.rglob(last_key)).relative_to(host_a.path)
        deadline = time.monotonic() + 10
        while not last.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        dropped = host_a.stats()["tiers"]["shared"]["dropped"]
        reads = self._recorded(case, "exists + read on B", page_bytes=pool.page_bytes)
        self._interleaved(reads, pool, batches, {HICACHEFS: found_then_read(fs_b, pool),
                                                 FILE: found_then_read(hf_b, pool)},
                          False, host_b, f"{case} read on B")
        shared_b = host_b.stats()["tiers"]["shared"]
        for name, result in reads.items():
            result.note = (f"host B read {result.pages} of the {len(batches) * STORAGE_BATCH_SIZE} pages host A "
                           "wrote" + (f" (host A's write-behind dropped {dropped}; host B's shared tier: "
                                      f"{shared_b['fetched_ahead']} fetched ahead, {shared_b['timeouts']} "
                                      f"timeouts, {shared_b['failures']} failures)" if name == HICACHEFS else ""))
        self._cross_host_misses(case, fs_b, hf_b)
        for backend in (fs_a, fs_b):
            backend.close()

    def _cross_host_misses(self, case: str, fs_b, hf_b) -> None:
        """batch_exists on B of 128 keys no host wrote: what most of SGLang's queries are."""
        misses = self._recorded(case, "exists", note="128 keys that no host wrote (all misses)")
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
        volume = glusterfs.up(work / "gluster")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        glusterfs.down(work / "gluster")
        return f"cross-host case skipped: GlusterFS did not start here ({str(exc).splitlines()[0]})"
    hosts = []
    try:
        for name, view in (("a", volume.a), ("b", volume.b)):
            hosts.append(mounting.start(work / f"host-{name}", work / f"host-{name}.log",
                                        ["--memory", HOST_MEMORY, "--shared", str(view / "hc"),
                                         *mount_options]))
        timed("cross-host 1 MiB", bench.cross_host_case, *hosts, volume)
    except BaseException:
        for host in hosts:
            print_log_tail(host)
        raise
    finally:
        for host in hosts:
            mounting.stop(host)
        glusterfs.down(work / "gluster")
    return None


# ---------------------------------------------------------------------------- ranks


def ranks_case(bench: Bench, page_mib: int, mount: mounting.Mount, file_dir: Path) -> None:
    """1 rank, then ``RANKS`` ranks of each backend. All ranks of a backend run each phase at
    the same moment; the backends take turns phase by phase."""
    plan = bench.plan
    case = f"ranks {page_mib} MiB"
    file_dir.mkdir(parents=True, exist_ok=True)
    roots = {HICACHEFS: mount.path, FILE: file_dir}
    workers: Dict[str, List[RankWorker]] = {name: [] for name in roots}
    phases = [("write", "write"), ("read", "first read")] + \
        [("read", "repeated read")] * (plan.ranks_read_passes - 1)
    try:
        for name, root in roots.items():
            for rank in range(RANKS):
                workers[name].append(RankWorker(name, root, rank, RANKS, page_mib,
                                                plan.ranks_batches[page_mib], bench.client))
        for worker in (w for group in workers.values() for w in group):
            if worker.receive() != "ready":
                raise RuntimeError(f"rank process {worker.proc.pid} did not start")
        for ranks in (1, RANKS):
            made: Dict[Tuple[str, str], Result] = {}
            for n, (command, op) in enumerate(progress(phases, f"{case} x{ranks}")):
                for name in (list(roots) if n % 2 == 0 else list(roots)[::-1]):
                    if (name, op) not in made:
                        made[name, op] = Result(case, op, name, ranks=ranks, wall=0.0)
                        bench.results.append(made[name, op])
                    _rank_phase(made[name, op], workers[name][:ranks], command,
                                f"ranks{page_mib}x{ranks}", mount if name == HICACHEFS else None)
            # Room for the next round's pages (the RAM tier holds one round).
            shutil.rmtree(mount.path / client_paths.model_segment(MODEL), ignore_errors=True)
            for path in file_dir.iterdir():
                path.unlink()
    finally:
        for worker in (w for group in workers.values() for w in group):
            worker.stop()
    shutil.rmtree(file_dir, ignore_errors=True)


def _rank_phase(result: Result, workers: List[RankWorker], phase: str, tag: str,
                mount: Optional[mounting.Mount]) -> None:
    """All ``workers`` run ``phase`` at once; ``mount``: the daemon they cost (hicachefs)."""
    before = mount.stats() if mount is not None else None
    daemon_before = daemon_cpu(mount) if mount is not None else 0.0
    for worker in workers:
        worker.send(phase, tag)
    answers = [worker.receive() for worker in workers]
    result.wall += max(a["end"] for a in answers) - min(a["start"] for a in answers)
    for a in answers:
        result.seconds += a["seconds"]
        result.cpu += a["cpu"]
        result.pages += a["pages"]
        result.failed += a["failed"]
        result.bad_pages += a["bad"]
        result.page_bytes = a["page_bytes"]
    if mount is not None:
        result.daemon_cpu += daemon_cpu(mount) - daemon_before
        for op, n in request_delta(before, mount.stats()).items():
            result.requests[op] = result.requests.get(op, 0) + n


# ---------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller volumes: about 1.5 min")
    parser.add_argument("--chart", type=Path, default=Path("bench.png"),
                        help="where the PNG chart goes (default: bench.png here)")
    parser.add_argument("--disk-dir", type=Path, default=Path("/var/tmp"),
                        help="a directory on the disk filesystem (not tmpfs) for the SSD case")
    parser.add_argument("--exists-pages", type=int, help="pages stored for the existence case")
    parser.add_argument("--client", type=json.loads, default={},
                        help="more extra_config keys for HiCacheFS, JSON (e.g. "
                             "'{\"read_threads\": 1}'); default: the client's defaults")
    parser.add_argument("--mount-option", action="append", default=[], metavar="FLAG",
                        help="one more flag for both hicachefs mounts, e.g. "
                             "--mount-option=--no-kernel-cache (repeatable)")
    parser.add_argument("--only", choices=("ram", "ranks", "exists", "ssd", "cross-host"), action="append",
                        help="run only these cases (repeatable; default all)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench.py needs root (FUSE mounts and drop_caches)", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    if args.exists_pages:
        plan.exists_pages = args.exists_pages
    cases = set(args.only or ("ram", "ranks", "exists", "ssd", "cross-host"))
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
    bench = Bench(plan, args.client)
    memcpy = memcpy_rate(plan.memcpy_bytes)
    kernel_copy = kernel_copy_rate(shm)
    configs = []
    try:
        if cases & {"ram", "ranks", "exists"}:
            mount = mounting.start(work / "ram", work / "ram.log",
                                   ["--memory", plan.ram_memory, *args.mount_option])
            configs.append(f"RAM mount: {daemon_config(mount)}")
            try:
                if "ram" in cases:
                    for page_mib in (1, 8):
                        timed(f"RAM {page_mib} MiB", bench.ram_case, page_mib, mount,
                              shm / f"file-{page_mib}")
                    bench.pools.clear()  # the rank processes have their own
                if "ranks" in cases:
                    for page_mib in plan.ranks_batches:
                        timed(f"ranks {page_mib} MiB", ranks_case, bench, page_mib, mount,
                              shm / f"ranks-{page_mib}")
                if "exists" in cases:
                    timed("exists", bench.exists_case, mount, shm / "file-exists")
            except BaseException:
                print_log_tail(mount)
                raise
            finally:
                mounting.stop(mount)
        if "ssd" in cases:
            (disk / "arena").mkdir()
            mount = mounting.start(work / "ssd", work / "ssd.log",
                                   ["--memory", SSD_MEMORY, "--max-page-size", SSD_MAX_PAGE,
                                    "--disk", str(disk / "arena"), "--disk-size", SSD_DISK_SIZE,
                                    *args.mount_option])
            configs.append(f"SSD mount: {daemon_config(mount)}")
            try:
                for page_mib in plan.ssd_batches:
                    timed(f"SSD cold {page_mib} MiB", bench.ssd_case, page_mib, mount,
                          disk / f"file-{page_mib}")
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
    print(f"As SGLang runs them: torch threads {TORCH_THREADS} in every process; HiCacheFile "
          "through the cache controller's generic path (the one it takes for the file backend), "
          "defaults (no size cap, metadata cache off); hicachefs through the zero-copy v1 path "
          f"(interface_v1), client extra_config {json.dumps(args.client) or '{}'}")
    print(f"RAM and ranks: hicachefs --memory {plan.ram_memory} vs HiCacheFile on tmpfs; SSD cold: "
          f"hicachefs --memory {SSD_MEMORY} --disk on {disk_fs} vs HiCacheFile on {disk_fs}, "
          "page cache dropped before each backend's read pass")
    print("cross-host: hicachefs --memory {0} --shared on each of a GlusterFS volume's two mounts vs "
          "HiCacheFile on the same mounts; host A writes, host B reads".format(HOST_MEMORY))
    for line in configs:
        print(line)
    if skipped:
        print(skipped)
    print(f"memcpy (numpy copy of {plan.memcpy_bytes >> 20} MiB): {memcpy:.2f} GB/s at the start, "
          f"{memcpy_end:.2f} GB/s at the end; one kernel copy (preadv of a hot 8 MiB tmpfs file): "
          f"{kernel_copy:.2f} GB/s")
    print()
    print(table(bench.results, memcpy,
                f"ranks: each rank its own process, host pool and pages ({RANKS} ranks: shards "
                f"tp0of{RANKS}..tp{RANKS - 1}of{RANKS}), all at once:", len(Pool.SAMPLE_SLOTS)))
    args.chart.parent.mkdir(parents=True, exist_ok=True)
    chart(bench.results, memcpy, args.chart,
          f"hicachefs (zero-copy v1) vs SGLang HiCacheFile (generic path), torch threads "
          f"{TORCH_THREADS}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print(f"\nchart: {args.chart.resolve()}")
    return 1 if any(r.failed or r.bad_pages or r.invalid for r in bench.results) else 0


if __name__ == "__main__":
    sys.exit(main())
