"""Replaces the same pages over and over, as another rank republishing them would: the writer of
the tests that check readers never get a replaced page once its replace was acknowledged.

``python -m hicachefs_testing.replacer MOUNT POOL_DIR KEYS PAGE_BYTES SECONDS HOW``: for
``SECONDS``, publish a new version of every page ``POOL_DIR/<key>`` (``KEYS``: comma-separated),
version after version, page ``i`` of version ``v`` holding ``content(v * len(keys) + i)``; ``HOW``
is ``ingest`` (one batch through ``.hicachefs/ingest``, replacing) or ``rename`` (a temporary
file renamed onto each key). Prints the last version, once every replace of it has been answered.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hicachefs_testing.workload import content, publish
from hicachefs_client.ingest import encode_header


def _ingest(fd: int, paths: list[str], pages: list[bytes]) -> None:
    header = encode_header(paths, [len(page) for page in pages], flags=0)  # replace, do not keep
    written = os.pwritev(fd, [header, *pages], 0)
    assert written == len(header) + sum(map(len, pages)), "an ingest batch stopped short"


def main(argv: list[str]) -> int:
    mount, pool_dir, keys, page_bytes, seconds, how = argv
    keys, page_bytes = keys.split(","), int(page_bytes)
    paths = [f"{pool_dir}/{key}" for key in keys]
    fd = os.open(Path(mount) / ".hicachefs" / "ingest", os.O_RDWR)
    deadline = time.monotonic() + float(seconds)
    version = 0
    try:
        while True:
            pages = [content(version * len(keys) + i, page_bytes) for i in range(len(keys))]
            if how == "ingest":
                _ingest(fd, paths, pages)
            else:
                for key, page in zip(keys, pages):
                    publish(Path(mount) / pool_dir, key, page)
            if time.monotonic() > deadline:
                break
            version += 1
    finally:
        os.close(fd)
    print(version, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
