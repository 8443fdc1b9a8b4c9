#!/usr/bin/env python3
"""The README's table of SGLang's storage calls: HiCacheFS on a mount vs SGLang's HiCacheFile.

SGLang 0.5.23's own radix cache and cache controller (``hicachefs_testing.sglang_cache``) serve
the same chat workload over each backend (``run_phases``: cold, warm after evicting device and
host, a burst); every call the controller makes is recorded with its batch size, hits and time.
Prints a Markdown table: per method, the calls, the batch sizes SGLang used, pages asked and
hit, and the time per call. Run as root: it mounts hicachefs in a temporary directory
(``--memory``, default 512M) and removes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)

from hicachefs_testing import mounting  # noqa: E402
from hicachefs_testing.sglang_cache import Backend, CacheSetup, ModelShape, SGLangCache, WarningLog  # noqa: E402
from hicachefs_testing.sglang_workload import ChatWorkload, run_phases  # noqa: E402

PAIRS = (("batch_exists", "batch_exists"), ("batch_get_v1", "batch_get"), ("batch_set_v1", "batch_set"))


def run(backend: Backend, setup: CacheSetup, workload: ChatWorkload):
    with WarningLog() as log:
        server = SGLangCache(setup, backend)
        try:
            run_phases(server, workload, cold_turns=3)
        finally:
            server.close()
    if server.recorder.failures or log.records or server.recorder.wrong_read or server.recorder.wrong_handed_over:
        sys.exit(f"{backend.kind}: {server.recorder.failures or log.records or 'wrong bytes'}")
    return server.recorder.stats


def sizes(batch_sizes) -> str:
    ordered = sorted(batch_sizes)
    return f"{ordered[0]}-{ordered[-1]}" if len(ordered) > 1 else str(ordered[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", default="512M")
    args = parser.parse_args()
    # Qwen2.5-0.5B's KV (24 layers, 2 heads of 64): 64 tokens = 768 KiB a page, as in the demo.
    setup = CacheSetup(ModelShape("Qwen/Qwen2.5-0.5B-Instruct", 24, 2, 64), page_size=64, device_pages=200,
                       host_ratio=1.25)
    workload = ChatWorkload(conversations=8, system_tokens=2048, user_tokens=128, reply_tokens=256)
    with tempfile.TemporaryDirectory() as tmp:
        mount = mounting.start(Path(tmp) / "mnt", Path(tmp) / "daemon.log", ["--memory", args.memory])
        try:
            ours = run(Backend("hicachefs", str(mount.path)), setup, workload)
        finally:
            mounting.stop(mount)
        theirs = run(Backend("file", str(Path(tmp) / "hicache_file")), setup, workload)
    print("| call (HiCacheFS / HiCacheFile) | calls | pages a call | pages asked | hit | "
          "ms a call, p50 (HiCacheFS vs HiCacheFile) | mean |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mine, its in PAIRS:
        a, b = ours[mine], theirs[its]
        same = (a.calls, a.pages, a.hits, a.batch_sizes) == (b.calls, b.pages, b.hits, b.batch_sizes)
        print(f"| `{mine}` / `{its}` | {a.calls}{'' if same else f' / {b.calls}'} | {sizes(a.batch_sizes)} | "
              f"{a.pages} | {a.hits}{'' if same else f' / {b.hits}'} | "
              f"{1e3 * statistics.median(a.seconds):.2f} vs {1e3 * statistics.median(b.seconds):.2f} | "
              f"{1e3 * statistics.mean(a.seconds):.2f} vs {1e3 * statistics.mean(b.seconds):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
