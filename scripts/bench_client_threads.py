#!/usr/bin/env python3
"""How many threads should ``HiCacheFS`` give one batch's pages (extra_config ``read_threads``,
``write_threads``)?

Clients with different thread counts (the same for reads and writes) take turns call by call on one mount (each on its own
pages), so that load from elsewhere on the machine hits them alike; the same SGLang calls as
``bench.py`` (``batch_set_v1``/``batch_get_v1`` of 128 pages, torch threads 1):
  - one process: write, first read, reads again (all through the data plane) at 1 and 8 MiB
    pages;
  - ranks: 1 and 2 processes per client (TP ranks 0 and 1 of 8) running each phase at once.
Prints GB/s and CPU seconds per GB for each count and the ratio to the first one.
Needs root (FUSE). About 4 minutes; --quick about 2. Extra flags for the daemon (for example
``--mount-option=--no-kernel-cache``) show how the answer depends on the daemon's read path.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

from bench import RANK_PHASES, clear, load, progress, rank_phase
from lib.bench_daemon import Daemon, config_line, print_log_tail
from lib.bench_rank import RankWorker
from lib.bench_report import AGAIN, Result
from lib.bench_sglang import PAGES, Pool, as_sglang_runs, keys_for, make_hicachefs, reader, timed_call, writer
from hicachefs_testing import mounting

FULL = {"batches": {1: 8, 8: 2}, "later": 2, "ranks_batches": {1: 8, 8: 1}}
QUICK = {"batches": {1: 4, 8: 1}, "later": 1, "ranks_batches": {1: 4}}
RANKS = 2


def label(threads: int) -> str:
    return f"threads={threads}"


def client(threads: int) -> dict:
    return {"read_threads": threads, "write_threads": threads}


def rotated(items: list, n: int) -> list:
    return items[n % len(items):] + items[:n % len(items)]


def one_process(threads: List[int], plan: dict, page_mib: int, daemon: Daemon,
                results: List[Result]) -> None:
    pool = Pool(PAGES[f"{page_mib} MiB"])
    case = f"RAM {page_mib} MiB"
    clients = {label(t): make_hicachefs(daemon.mount.path, pool, client=client(t),
                                        model=f"threads/{t}") for t in threads}
    names = list(clients)
    batches = range(plan["batches"][page_mib])
    phases = list(RANK_PHASES) + [("read", AGAIN)] * plan["later"]
    made: Dict[tuple, Result] = {}
    for p, (command, op) in enumerate(phases):
        for b in progress(batches, f"{case} {op}"):
            for name in rotated(names, b + p):
                if (name, op) not in made:
                    made[name, op] = Result(case, op, name, page_bytes=pool.page_bytes)
                    results.append(made[name, op])
                tag = f"{case}/{name}/b{b}"
                write = command == "write"
                call = (writer if write else reader)(clients[name], pool)
                before = daemon.cpu()
                made[name, op].add(timed_call(pool, tag, keys_for(tag), call, write))
                made[name, op].daemon_cpu += daemon.cpu() - before
    for backend in clients.values():
        backend.clear()
        backend.close()


def ranks(threads: List[int], plan: dict, page_mib: int, daemon: Daemon,
          results: List[Result]) -> None:
    case = f"ranks {page_mib} MiB"
    names = [label(t) for t in threads]
    workers: Dict[str, List[RankWorker]] = {name: [] for name in names}
    phases = list(RANK_PHASES) + [("read", AGAIN)] * plan["later"]
    shape = PAGES[f"{page_mib} MiB"]
    shape = replace(shape, tp_size=max(RANKS, shape.tp_size))
    try:
        for t, name in zip(threads, names):
            for rank in range(RANKS):
                workers[name].append(RankWorker("hicachefs", daemon.mount.path, shape, rank,
                                                plan["ranks_batches"][page_mib], client(t)))
        for worker in (w for group in workers.values() for w in group):
            if worker.receive() != "ready":
                raise RuntimeError(f"rank process {worker.proc.pid} did not start")
        for count in (1, RANKS):
            made: Dict[tuple, Result] = {}
            for p, (command, op) in enumerate(progress(phases, f"{case} x{count}")):
                for name in rotated(names, p):
                    if (name, op) not in made:
                        made[name, op] = Result(case, op, name, ranks=count, wall=0.0)
                        results.append(made[name, op])
                    rank_phase(made[name, op], workers[name][:count], command,
                               f"{name}x{count}", daemon)
            clear(w for group in workers.values() for w in group[:count])
    finally:
        for worker in (w for group in workers.values() for w in group):
            worker.stop()


def table(results: List[Result], names: List[str]) -> str:
    base = names[0]
    head = f"{'case':<16}{'ranks':>6}  {'op':<14}" + "".join(
        f"{n:>18}" for n in names) + "".join(f"{'x ' + n.split('=')[1]:>8}" for n in names[1:])
    lines = [head, "-" * len(head), f"{'':<38}" + "".join(f"{'GB/s  CPU s/GB':>18}" for _ in names)]
    keys = []
    for r in results:
        if (r.case, r.ranks, r.op) not in keys:
            keys.append((r.case, r.ranks, r.op))
    for case, count, op in keys:
        found = {r.backend: r for r in results if (r.case, r.ranks, r.op) == (case, count, op)}
        cells = "".join(f"{found[n].gbps:>10.2f}{found[n].cpu_per_gb:>8.2f}" for n in names)
        ratios = "".join(f"{found[n].gbps / found[base].gbps:>7.2f}x" for n in names[1:])
        lines.append(f"{case:<16}{count:>6}  {op:<14}{cells}{ratios}")
    bad = [r for r in results if r.failed or r.bad_pages]
    lines.append("")
    lines += [f"PROBLEM {r.case} {r.op} {r.backend} ({r.ranks} ranks): {r.failed} pages failed, "
              f"{r.bad_pages} sampled pages wrong" for r in bad] or \
        ["Every call succeeded; sampled pages read back byte-exact."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2,4",
                        help="thread counts to compare, the first is the base (default 1,2,4)")
    parser.add_argument("--quick", action="store_true", help="smaller volumes, ranks at 1 MiB only")
    parser.add_argument("--mount-option", action="append", default=[], metavar="FLAG",
                        help="one more flag for the hicachefs mount (repeatable)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_client_threads.py needs root (FUSE mounts)", file=sys.stderr)
        return 2
    try:
        threads = [int(t) for t in args.threads.split(",")]
        if len(set(threads)) < 2 or not all(1 <= t <= 64 for t in threads):
            raise ValueError
    except ValueError:
        print(f"--threads: two or more different integers from 1 to 64, comma-separated, not "
              f"{args.threads!r}", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    logging.basicConfig(level=logging.ERROR)
    as_sglang_runs()
    per_variant = max(max(n * m for m, n in plan["batches"].items()),
                      max(RANKS * n * m for m, n in plan["ranks_batches"].items()))
    memory = f"{len(threads) * per_variant * 128 + 512}M"
    work = Path(tempfile.mkdtemp(prefix="hicachefs-bench-threads-"))
    started, load_start = time.perf_counter(), load()
    results: List[Result] = []
    mount = mounting.start(work / "mnt", work / "log", ["--memory", memory, *args.mount_option])
    try:
        config = config_line(mount)
        daemon = Daemon(mount)
        for page_mib in (1, 8):
            one_process(threads, plan, page_mib, daemon, results)
        for page_mib in plan["ranks_batches"]:
            ranks(threads, plan, page_mib, daemon, results)
    except BaseException:
        print_log_tail(mount)
        raise
    finally:
        mounting.stop(mount)
        shutil.rmtree(work, ignore_errors=True)
    print(f"HiCacheFS read_threads and write_threads compared, call by call on one mount{' (--quick)' * args.quick}: "
          f"{os.cpu_count()} CPUs; at start {load_start}, at end {load()}; "
          f"{(time.perf_counter() - started) / 60:.1f} min")
    print(f"mount: {config}")
    print("pages: " + "; ".join(f"{m} MiB {PAGES[f'{m} MiB'].describe()}" for m in plan["batches"])
          + "; 'ranks' are processes per client, each phase at once (GB/s aggregate)")
    print()
    print(table(results, [label(t) for t in threads]))
    return 1 if any(r.failed or r.bad_pages for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
