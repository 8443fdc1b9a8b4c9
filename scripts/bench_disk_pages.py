#!/usr/bin/env python3
"""Reads of pages on the disk tier through their own files (open, one ``preadv``, close), as
``cat`` or a reader of its own reads them: GB/s of the first read of each and of the second,
and the daemon's READ requests per page.

    .venv/bin/python scripts/bench_disk_pages.py [--size 1M] [--cold] [--disk-dir /var/tmp]

Publishes 512 MiB of pages through a 64 MiB RAM tier, so most go down to the disk tier, then
drops the host's caches (the kernel's copies of the pages included) and reads back those on
the disk tier, twice. Without ``--cold`` the arena is read into the host's cache first, so the
reads cost what the mount adds, not the disk. Needs root (``drop_caches``); mounts and removes
its own daemon.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from hicachefs.cli.arguments import parse_size
from hicachefs_testing import mounting

TOTAL = 512 << 20


def aligned(size: int) -> np.ndarray:
    raw = np.empty(size + 4096, np.uint8)
    return raw[(-raw.ctypes.data) % 4096:][:size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=1 << 20, help="page size (default 1M)")
    parser.add_argument("--cold", action="store_true", help="read the arena from the disk, not the host's cache")
    parser.add_argument("--disk-dir", type=Path, default=Path("/var/tmp"), help="where the disk tier goes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hicachefs-bench-", dir=args.disk_dir) as tmp:
        work = Path(tmp)
        mount = mounting.start(work / "mnt", work / "daemon.log",
                               ["--memory", "64M", "--disk", str(work / "disk"), "--disk-size", "1G"])
        try:
            pool = mount.page_dir()
            page = aligned(args.size)
            page[:] = np.random.default_rng(0).integers(0, 256, args.size, dtype=np.uint8)
            for i in range(TOTAL // args.size):
                tmp_file = pool / f".w{i}"
                fd = os.open(tmp_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.ftruncate(fd, args.size)
                os.pwritev(fd, [memoryview(page)], 0)
                os.close(fd)
                os.rename(tmp_file, pool / f"p{i}")
            on_disk = [pool / f"p{i}" for i in range(TOTAL // args.size)
                       if os.getxattr(pool / f"p{i}", "user.hicachefs.tier") == b"disk"]
            subprocess.run(["sync"], check=True)
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            if not args.cold:
                subprocess.run(["cat", str(work / "disk" / "hicachefs.arena")], stdout=subprocess.DEVNULL, check=True)
            out = memoryview(aligned(args.size))
            for label in ("first read", "second read"):
                reads = mount.stats()["requests"].get("read", 0)
                start = time.perf_counter()
                for path in on_disk:
                    fd = os.open(path, os.O_RDONLY)
                    assert os.preadv(fd, [out], 0) == args.size
                    os.close(fd)
                seconds = time.perf_counter() - start
                reads = mount.stats()["requests"].get("read", 0) - reads
                print(f"{label:12} {len(on_disk)} pages of {args.size >> 10} KiB: "
                      f"{len(on_disk) * args.size / seconds / 1e9:.2f} GB/s, {reads / len(on_disk):.1f} READs a page")
        finally:
            mounting.stop(mount)


if __name__ == "__main__":
    main()
