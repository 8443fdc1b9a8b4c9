#!/usr/bin/env python3
"""The table of SGLang's storage calls (docs/performance.md): HiCacheFS on a mount vs SGLang's HiCacheFile.

SGLang 0.5.23's own radix cache and cache controller (``hicachefs_testing.sglang_cache``) serve
the same chat workload over each backend (``run_phases``: cold, warm after evicting device and
host, a burst); every call the controller makes is recorded with its batch size, hits and time.
HiCacheFS is loaded as a user loads it (``dynamic``, ``interface_v1``), with the client's
defaults, so through its data plane (the script says how many pages went through it);
HiCacheFile with its defaults on tmpfs (``/dev/shm``), its fastest home. One torch thread, as
SGLang's ``ModelRunner`` sets on a GPU server.

Shapes (``--shape``, default both):
  - ``128k``: Llama-3.2-1B at TP8 (16 layers, 1 KV head of 64), 32 tokens = 128 KiB a page, and
    turns of 96 + 192 tokens: SGLang's controller then asks about 9 pages a call, the shape
    issue 28 measured;
  - ``768k``: Qwen2.5-0.5B (24 layers, 2 KV heads of 64), 64 tokens = 768 KiB a page, turns of
    128 + 256 tokens, as in the demo.
The workload is served ``--runs`` times over each backend (default 4), the backends taking
turns and alternating which goes first, each run on a fresh mount and a fresh directory; the
table pools every call of every run (one run makes only 11 prefetches, too few for a p50 that
does not swing with one call's luck). Prints a Markdown table per shape: per method, the calls,
the batch sizes SGLang used, pages asked and hit, p50 and mean time per call of each backend,
and HiCacheFile's time over HiCacheFS's (above 1: HiCacheFS is faster). Run as root: it mounts
hicachefs in a temporary directory (``--memory``, default 512M) and removes it.

What a call's time holds: the backend method alone, as the controller calls it. So HiCacheFS's
``batch_get_v1``/``batch_set_v1`` include their copies into and out of the host pool, while
HiCacheFile's ``batch_get``/``batch_set`` leave out the generic path's own part, run by the
controller around them (the staging pages and ``set_from_flat_data_page`` of a prefetch, the
``get_data_page`` copies of a backup); and ``batch_set_v1`` returns before its commit is
answered (the client's commit-behind thread sends it), which ``bench.py`` times and this does not.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)

import torch  # noqa: E402

from hicachefs_testing import mounting  # noqa: E402
from hicachefs_testing.sglang_cache import Backend, CacheSetup, ModelShape, SGLangCache, WarningLog  # noqa: E402
from hicachefs_testing.sglang_recorder import CallStats  # noqa: E402
from hicachefs_testing.sglang_workload import ChatWorkload, run_phases  # noqa: E402

PAIRS = (("batch_exists", "batch_exists"), ("batch_get_v1", "batch_get"), ("batch_set_v1", "batch_set"))
WHAT = {"batch_exists": "batch_exists", "batch_get_v1": "batch_get_v1 (prefetch)",
        "batch_set_v1": "batch_set_v1 (backup)"}
TORCH_THREADS = 1

# name -> (what, cache setup, workload)
SHAPES = {
    "128k": ("Llama-3.2-1B at TP8, 32 tokens = 128 KiB a page",
             CacheSetup(ModelShape("meta-llama/Llama-3.2-1B-Instruct", 16, 1, 64), page_size=32,
                        device_pages=400, host_ratio=1.25),
             ChatWorkload(conversations=8, system_tokens=2048, user_tokens=96, reply_tokens=192)),
    "768k": ("Qwen2.5-0.5B, 64 tokens = 768 KiB a page",
             CacheSetup(ModelShape("Qwen/Qwen2.5-0.5B-Instruct", 24, 2, 64), page_size=64,
                        device_pages=200, host_ratio=1.25),
             ChatWorkload(conversations=8, system_tokens=2048, user_tokens=128, reply_tokens=256)),
}


def run(backend: Backend, setup: CacheSetup, workload: ChatWorkload):
    """The calls' statistics, and the client's own counters (HiCacheFS; else {})."""
    with WarningLog() as log:
        server = SGLangCache(setup, backend)
        try:
            run_phases(server, workload, cold_turns=3)
            statistics_of = getattr(server.backend, "statistics", None)
            counters = statistics_of() if backend.kind == "hicachefs" and statistics_of else {}
        finally:
            server.close()
    if server.recorder.failures or log.records or server.recorder.wrong_read or server.recorder.wrong_handed_over:
        sys.exit(f"{backend.kind}: {server.recorder.failures or log.records or 'wrong bytes'}")
    return server.recorder.stats, counters


def pooled(runs) -> dict:
    """The calls of several runs, per method, as one run's."""
    calls: dict = {}
    for stats in runs:
        for method, one in stats.items():
            calls.setdefault(method, CallStats()).merge(one)
    return calls


def sizes(batch_sizes) -> str:
    ordered = sorted(batch_sizes)
    return f"{ordered[0]}-{ordered[-1]}" if len(ordered) > 1 else str(ordered[0])


def mean_size(stats) -> float:
    return sum(n * c for n, c in stats.batch_sizes.items()) / max(1, sum(stats.batch_sizes.values()))


def run_hicachefs(memory: str, extra: dict, setup: CacheSetup, workload: ChatWorkload):
    with tempfile.TemporaryDirectory() as tmp:
        mount = mounting.start(Path(tmp) / "mnt", Path(tmp) / "daemon.log", ["--memory", memory])
        try:
            return run(Backend("hicachefs", str(mount.path), extra), setup, workload)
        finally:
            mounting.stop(mount)


def run_file(setup: CacheSetup, workload: ChatWorkload, file_extra: dict):
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        return run(Backend("file", str(Path(shm) / "hicache_file"), file_extra), setup, workload)


def one_shape(name: str, memory: str, extra: dict, runs: int, file_extra: dict) -> None:
    what, setup, workload = SHAPES[name]
    ours, theirs, counters = [], [], {}
    for turn in range(runs):
        for backend in (("hicachefs", "file") if turn % 2 == 0 else ("file", "hicachefs")):
            gc.collect()  # the last run's server (its pools, hundreds of MB) is freed now, not in a call of this one
            if backend == "file":
                theirs.append(run_file(setup, workload, file_extra)[0])
                continue
            stats, got = run_hicachefs(memory, extra, setup, workload)
            ours.append(stats)
            for counter, value in got.items():
                if isinstance(value, int):
                    counters[counter] = counters.get(counter, 0) + value
    ours, theirs = pooled(ours), pooled(theirs)
    print(f"\n{what} ({name}), {runs} runs of each backend pooled; HiCacheFS extra_config {extra or '{}'} over the client's defaults; "
          f"HiCacheFile extra_config {file_extra or '{}'} over its defaults; "
          f"through the data plane: {counters.get('plane_reads', 0)} of {counters.get('hits', 0)} pages "
          f"read, {counters.get('plane_writes', 0)} of {counters.get('pages_written', 0)} written; "
          f"{os.cpu_count()} CPUs, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| call (HiCacheFS / HiCacheFile) | calls | pages a call (mean) | pages asked | hit | "
          "p50 ms: HiCacheFS / HiCacheFile | HiCacheFile / HiCacheFS, p50 | "
          "mean ms: HiCacheFS / HiCacheFile | HiCacheFile / HiCacheFS, mean |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mine, its in PAIRS:
        a, b = ours[mine], theirs[its]
        same = (a.calls, a.pages, a.hits, a.batch_sizes) == (b.calls, b.pages, b.hits, b.batch_sizes)
        p50 = [1e3 * statistics.median(x.seconds) for x in (a, b)]
        mean = [1e3 * statistics.mean(x.seconds) for x in (a, b)]
        print(f"| `{WHAT[mine]}` / `{its}` | {a.calls}{'' if same else f' / {b.calls}'} | "
              f"{sizes(a.batch_sizes)} ({mean_size(a):.1f}) | {a.pages} | "
              f"{a.hits}{'' if same else f' / {b.hits}'} | {p50[0]:.2f} / {p50[1]:.2f} | "
              f"**{p50[1] / p50[0]:.2f}** | {mean[0]:.2f} / {mean[1]:.2f} | **{mean[1] / mean[0]:.2f}** |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", default="512M")
    parser.add_argument("--shape", choices=(*SHAPES, "both"), default="both",
                        help="the page shape (default both: 128k, then 768k)")
    parser.add_argument("--runs", type=int, default=4, help="runs of each backend, pooled (default 4)")
    parser.add_argument("--no-plane", action="store_true",
                        help="HiCacheFS with extra_config data_plane false (the control files)")
    parser.add_argument("--file-extra", type=json.loads, default={},
                        help="more extra_config keys for HiCacheFile, JSON (e.g. "
                             "'{\"enable_metadata_cache\": true}'); default: its defaults")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("sglang_calls.py needs root (a FUSE mount)", file=sys.stderr)
        return 2
    torch.set_num_threads(TORCH_THREADS)
    extra = {"data_plane": False} if args.no_plane else {}
    print(f"SGLang's controller over HiCacheFS (a hicachefs mount, --memory {args.memory}) and "
          f"HiCacheFile (tmpfs), same run, torch threads {TORCH_THREADS}")
    for name in (SHAPES if args.shape == "both" else (args.shape,)):
        one_shape(name, args.memory, extra, args.runs, args.file_extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
