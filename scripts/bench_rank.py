"""One SGLang TP rank for ``bench.py``'s ranks case; not a benchmark by itself.

A process of its own, as each TP rank of an SGLang server is: one torch thread, its own host
pool, its own pages (its shard, ``tp{rank}of{size}``), one backend. It writes, then reads its
batches whenever the parent says so, so that all ranks run each phase at the same moment.

Protocol (lines): the worker prints ``ready``; then for each line ``write TAG`` or ``read TAG``
on stdin it runs that phase over its batches of that tag and prints one JSON line (start and end
on the system-wide monotonic clock, per-batch seconds, its CPU seconds, pages, failures, wrong
sampled pages); ``quit`` (or end of input) closes the backend and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from bench_sglang import Pool, as_sglang_runs, keys_for, make_file, make_hicachefs, reader, writer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("hicachefs", "HiCacheFile"), required=True)
    parser.add_argument("--root", type=Path, required=True, help="the mount, or HiCacheFile's dir")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--tp-size", type=int, default=2)
    parser.add_argument("--page-mib", type=int, choices=(1, 8), default=1)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--client", default="{}", help="hicachefs extra_config keys, JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    as_sglang_runs()

    pool = Pool(args.page_mib, tp_size=args.tp_size, seed=args.rank + 1)
    if args.backend == "hicachefs":
        backend = make_hicachefs(args.root, pool, args.rank, json.loads(args.client))
    else:
        backend = make_file(args.root, pool, args.rank)
    write, read = writer(backend, pool), reader(backend, pool)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2 or words[0] not in ("write", "read"):
            break
        phase, tag = words
        batches = {f"{tag}/tp{args.rank}/b{i}": keys_for(f"{tag}/tp{args.rank}/b{i}")
                   for i in range(args.batches)}
        seconds, cpu, pages, failed, bad = [], 0.0, 0, 0, 0
        start = time.monotonic()
        for batch_tag, keys in batches.items():
            if phase == "write":
                pool.stamp(batch_tag)
            else:
                pool.scribble()
            began, began_cpu = time.perf_counter(), time.process_time()
            outcome = write(keys) if phase == "write" else read(keys)
            seconds.append(time.perf_counter() - began)
            cpu += time.process_time() - began_cpu
            if phase == "write":
                pages += len(keys)
                failed += 0 if outcome else len(keys)
            else:
                pages += outcome
                failed += len(keys) - outcome
                bad += pool.check(batch_tag)
        end = time.monotonic()
        print(json.dumps({"start": start, "end": end, "seconds": seconds,
                          "cpu": cpu, "pages": pages, "failed": failed,
                          "bad": bad, "page_bytes": pool.page_bytes}), flush=True)
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
