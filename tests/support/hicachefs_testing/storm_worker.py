"""One writer process of a reliability storm (as one TP rank would be). Plain file I/O only.

``python -m hicachefs_testing.storm_worker JSON``; JSON holds ``mode`` and its settings:

- ``publish``: publish pages until the mount goes away or ``seconds`` pass, replacing some
  of its own pages with a newer generation (after the file ``go`` exists, if one is named). It appends to ``log`` (unbuffered writes, so a
  line is in the file once ``os.write`` returns), one line per step::

      B <relpath> <gen> <tmpname>   before creating the temporary file
      P <relpath> <gen>             after the rename returned (the page is published)
      S                             started (imports done)
      X <errno>                     the mount failed a call: the writer stops

- ``contend``: for ``seconds``, write shared pages (every rank writes the same keys, its own
  labelled content) and its own pages, and read random ones back through one handle in pieces;
  every read is checked to be one whole write of its key. Prints one JSON line of counts.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from hicachefs_testing.workload import identify, labelled_content, publish


def _wait_for_go(cfg: dict) -> bool:
    """Started early (imports take a second), a worker waits for its ``go`` file, if any."""
    go = cfg.get("go")
    deadline = time.monotonic() + 120
    while go and not os.path.exists(go):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def publish_storm(cfg: dict) -> int:
    if not _wait_for_go(cfg):
        return 1
    root = Path(cfg["root"])
    rng = random.Random(cfg["seed"])
    log = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    deadline = time.monotonic() + cfg.get("seconds", 3600)
    mine: dict[str, tuple[int, int]] = {}  # relpath -> (gen, size)
    number = 0
    os.write(log, b"S\n")  # started: the storm is under way from here on
    try:
        while time.monotonic() < deadline and number < cfg.get("max_pages", 1 << 30):
            if mine and rng.random() < cfg.get("replace_share", 0.15):
                rel = rng.choice(list(mine))
                gen, size = mine[rel][0] + 1, mine[rel][1]
            else:
                pool = rng.choice(cfg["pools"])
                rel = f"{pool}/{cfg['prefix']}-r{cfg['rank']}-{number:06d}"
                gen, size = 0, rng.choice(cfg["sizes"])
                number += 1
            pool_rel, key = rel.rsplit("/", 1)
            tmp = f".{cfg['prefix']}-{cfg['rank']}-{os.urandom(6).hex()}"
            os.write(log, f"B {rel} {gen} {tmp}\n".encode())
            publish(root / pool_rel, key, labelled_content(key, size, cfg["rank"], gen), tmp)
            os.write(log, f"P {rel} {gen}\n".encode())
            mine[rel] = (gen, size)
    except OSError as exc:
        os.write(log, f"X {exc.errno}\n".encode())
    finally:
        os.close(log)
    return 0


def contend(cfg: dict) -> int:
    root, rank = Path(cfg["root"]), cfg["rank"]
    rng = random.Random(cfg["seed"])
    shared_pool = root / cfg["shared_pool"]
    own_pool = root / cfg["own_pool_pattern"].format(rank=rank)
    shared_keys = [f"shared-{i}" for i in range(cfg["shared_keys"])]
    own_keys = [f"own-{i}" for i in range(cfg["own_keys"])]
    counts = {"writes": 0, "reads": 0, "misses": 0, "bad": 0, "foreign_writer_reads": 0, "errors": 0}
    bad_examples: list[str] = []
    gen = 0
    deadline = time.monotonic() + cfg["seconds"]
    while time.monotonic() < deadline:
        gen += 1
        shared = rng.random() < 0.5
        pool, key = (shared_pool, rng.choice(shared_keys)) if shared else (own_pool, rng.choice(own_keys))
        if rng.random() < 0.4:
            size = cfg["size"] if shared else rng.choice([cfg["size"], cfg["size"] // 2])
            try:
                publish(pool, key, labelled_content(key, size, rank, gen))
                counts["writes"] += 1
            except OSError as exc:
                counts["errors"] += 1
                bad_examples.append(f"publish {key}: {exc}")
            continue
        try:
            fd = os.open(pool / key, os.O_RDONLY)
        except FileNotFoundError:
            counts["misses"] += 1
            continue
        try:
            parts, offset = [], 0
            while True:
                piece = os.pread(fd, rng.choice([4096, 65536, 131072]), offset)
                if not piece:
                    break
                parts.append(piece)
                offset += len(piece)
                if rng.random() < 0.05:
                    time.sleep(0.001)  # let a replace land in the middle of the read
            data = b"".join(parts)
        except OSError as exc:
            counts["errors"] += 1
            bad_examples.append(f"read {key}: {exc}")
            continue
        finally:
            os.close(fd)
        counts["reads"] += 1
        who = identify(data, key)
        if who is None:
            counts["bad"] += 1
            bad_examples.append(f"{pool.name}/{key}: {len(data)} bytes, header {data[:64]!r}")
        elif who.writer != rank:
            counts["foreign_writer_reads"] += 1
            if not shared:
                counts["bad"] += 1
                bad_examples.append(f"own page {key} of rank {rank} holds rank {who.writer}'s bytes")
    print(json.dumps({**counts, "examples": bad_examples[:5]}), flush=True)
    return 0


def main() -> int:
    cfg = json.loads(sys.argv[1])
    return {"publish": publish_storm, "contend": contend}[cfg["mode"]](cfg)


if __name__ == "__main__":
    sys.exit(main())
