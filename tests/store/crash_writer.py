"""A write storm for the SIGKILL recovery test: puts, replaces and deletes pages in a
write-through store forever, printing each operation before it starts and after it returns.

Usage: python crash_writer.py DISK_DIR FIRST_NUMBER SEED
"""

import random
import sys
from pathlib import Path

from store_helpers import KiB, MiB, page_name

from hicachefs.store import PageStore, StoreConfig
from hicachefs_testing.workload import content


def main() -> None:
    disk_dir, first, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = PageStore(
        StoreConfig(memory_bytes=2 * MiB, disk_dir=disk_dir, disk_bytes=256 * MiB, write_through=True, max_page_size=256 * KiB)
    )
    rng = random.Random(seed)
    mine: list[str] = []
    number = first
    while True:
        op = rng.random()
        if op < 0.15 and mine:
            name = rng.choice(mine)
            mine.remove(name)
            print("begin del", name, flush=True)
            store.delete(name)
            print("done del", name, flush=True)
            continue
        if op < 0.3 and mine:
            name = rng.choice(mine)
        else:
            name = page_name(number)
            number += 1
            mine.append(name)
        version, size = rng.getrandbits(32), rng.choice([0, 1, 4 * KiB, rng.randrange(256 * KiB)])
        print("begin put", name, version, size, flush=True)
        store.put(name, content(version, size))
        print("done put", name, version, size, flush=True)


if __name__ == "__main__":
    main()
