"""Another client of the mount, timing each of its requests (run as a separate process).

``python -m hicachefs_testing.latency_probe ROOT POOL_REL KEYS_CSV STOP_FILE``: until STOP_FILE exists, repeat:
stat a name never asked before (a lookup the daemon must answer), open and read a page (open
and release reach the daemon even when the kernel holds the data), read ``.hicachefs/stats``
and ask ``.hicachefs/exists`` about one page. Prints ``started`` once it has made each kind of
request, then, at the end, one JSON line: every request's start (CLOCK_MONOTONIC, shared with
the test process), duration and kind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hicachefs_testing.workload import exists_query


def main() -> int:
    root, pool, keys, stop = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), Path(sys.argv[4])
    samples: list[tuple[float, float, str]] = []

    def timed(kind, call, *args):
        start = time.monotonic()
        call(*args)
        samples.append((start, time.monotonic() - start, kind))

    def missing_stat(path):
        try:
            os.stat(path)
        except FileNotFoundError:
            pass

    def read_page(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 1 << 20)
        finally:
            os.close(fd)

    def exists(rel):
        assert exists_query(root, [rel]) == "1"

    number = 0
    deadline = time.monotonic() + 120
    while not stop.exists() and time.monotonic() < deadline:
        key = keys[number % len(keys)]
        timed("stat", missing_stat, root / pool / f"never-{os.getpid()}-{number}")
        timed("read", read_page, root / pool / key)
        timed("stats", (root / ".hicachefs" / "stats").read_bytes)
        timed("exists", exists, f"{pool}/{key}")
        if number == 0:
            print("started", flush=True)
        number += 1
    print(json.dumps(samples), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
