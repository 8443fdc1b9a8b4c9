#!/usr/bin/env python3
"""Another client's latency while a plain user floods the mount, attack by attack, in one run.

    .venv/bin/python scripts/bench_plain_user.py [--seconds 8] [--pages 20000]

Mounts its own daemon (256 MiB RAM tier) in a directory uid 65534 can reach, fills one pool
with ``--pages`` pages, and runs the latency probe (``tests/support/hicachefs_testing/latency_probe.py``: a
missing stat, an open and read of a page, a read of the stats, a one-page exists query, in a
loop) as root, first alone, then during each attack of ``tests/support/hicachefs_testing/plain_user.py`` as
uid 65534 for ``--seconds``: a loop of opendir and a first readdir of the big pool, a loop of
whole listings of it, 4 processes of 8 MiB exists queries, 4 of 4 MiB fetch requests of stored
pages (whose answers they read), 4 of 1 MiB fetch requests of missing pages (parsed, then a
short read). Prints a table of the probe's requests: count, p50, p99 and worst, and the
attacks' rounds and refusals. Needs root (FUSE, and uid 65534).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs.control.fetch import MAX_FETCH_REQUEST
from hicachefs_testing import attacks, mounting
from hicachefs_testing.workload import content, publish

POOL = ("bench", "bfloat16-page_first-64", "tp0of1")
PROBE_PAGES = 64
FULL_LISTING = """
import os, sys, time
end = time.monotonic() + float(sys.argv[2])
rounds = 0
while time.monotonic() < end:
    os.listdir(sys.argv[1])
    rounds += 1
print(rounds)
"""


def attack_phase(kind: str, args: tuple, count: int, seconds: float) -> tuple[float, float, str]:
    """Run ``count`` attacks of ``kind`` for ``seconds``: when they ran, and what they did."""
    with contextlib.ExitStack() as stack:
        running = attacks.start(kind, *args, count=count)
        running = [stack.enter_context(a) for a in (running if isinstance(running, list) else [running])]
        started = time.monotonic()
        time.sleep(seconds)
        ended = time.monotonic()
        figures = [attack.finish() for attack in running]
    refused = sum(sum(f["errors"].values()) for f in figures)
    return started, ended, f"{sum(f['rounds'] for f in figures)} rounds, {refused} refused"


def full_listings(directory: Path, seconds: float) -> tuple[float, float, str]:
    started = time.monotonic()
    done = attacks.run_script(FULL_LISTING, str(directory), str(seconds), timeout=seconds + 120)
    ended = time.monotonic()
    if done.returncode != 0:
        raise RuntimeError(f"the listings failed: {done.stderr}")
    return started, ended, f"{done.stdout.strip()} whole listings"


def row(name: str, samples, started: float, ended: float, note: str) -> str:
    took = attacks.during(samples, started, ended)
    p = attacks.percentile
    return (f"{name:<34} {len(took):>7} {p(took, 0.5) * 1e3:>8.2f} {p(took, 0.99) * 1e3:>8.1f} "
            f"{max(took, default=0) * 1e3:>8.1f}   {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--pages", type=int, default=20_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hicachefs-bench-plain-user-"))
    base.chmod(0o755)
    mount = mounting.start(base / "mnt", base / "daemon.log", ["--memory", "256M"])
    try:
        small = mount.page_dir(*POOL, "kv")
        keys = [f"{i:064x}" for i in range(PROBE_PAGES)]
        for i, key in enumerate(keys):
            publish(small, key, content(i, 4096))
        big = mount.page_dir(*POOL, "big")
        attacks.fill_pool(mount.path, str(big.relative_to(mount.path)), args.pages)
        rel = str(small.relative_to(mount.path))
        stored_line = f"4096 {rel}/{keys[0]}"
        phases = [
            (f"opendir loop, {args.pages} pages", lambda: attack_phase("listing-storm", (big,), 1, args.seconds)),
            (f"whole listings, {args.pages} pages", lambda: full_listings(big, args.seconds)),
            ("4 exists storms, 8 MiB", lambda: attack_phase("exists-storm", (mount.path, MAX_EXISTS_REQUEST), 4,
                                                             args.seconds)),
            ("4 fetch storms, 4 MiB, stored", lambda: attack_phase(
                "fetch-storm", (mount.path, MAX_FETCH_REQUEST, stored_line), 4, args.seconds)),
            ("4 fetch storms, 1 MiB, missing", lambda: attack_phase(
                "fetch-storm", (mount.path, 1 << 20, "64 a/b/c/d/e"), 4, args.seconds)),
        ]
        probe = attacks.start_probe(mount.path, rel, keys, base / "probe-stop")
        rows = []
        try:
            started = time.monotonic()
            time.sleep(args.seconds)
            rows.append(("alone", started, time.monotonic(), ""))
            for name, phase in phases:
                rows.append((name, *phase()))
        finally:
            samples = probe.finish()
        print(f"{'the other client, during':<34} {'requests':>7} {'p50 ms':>8} {'p99 ms':>8} {'worst ms':>8}")
        for name, started, ended, note in rows:
            print(row(name, samples, started, ended, note))
    finally:
        mounting.stop(mount)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
