"""Readers, direct writers and renames on a few shared keys (issue 20, items 6 and 7).

``run(root, workdir, seconds, seed)`` starts the worker processes (``python -m
hicachefs_testing.mixed_load CFG``) on the pool ``POOL`` of the mount at ``root`` and sums their
counts. Roles, by rank:

- direct writers, as ``cp`` writes a page: remove the key (when there is a page or a file under
  it), create a file directly under its name, write its labelled bytes in pieces, close (its
  last close publishes it);
- renamers, as the client publishes: write a temporary file named after its key, then rename it
  onto the key, replacing what the key holds;
- readers: open a key (a page, or a file still being written under it) or a temporary file
  being written, and read it in pieces, pausing now and then.

Every read must be the start of one write of its key (all of it for a page; what was written
so far for a file being written), never bytes of another write (``torn``), zeros where that
write has bytes (``zeros``), nor a write superseded before the open began (``stale``). What
supersedes what comes from the log the renamers and direct writers keep (``changes.log``,
appended once a rename or a removal has returned): such a change of a key that returned before
an open began supersedes every write of that key that began before the change did (a file being
written under a key is discarded by a rename onto it or its removal, docs/contract.md), and every
rename of it that returned before the change began. EIO is the contract's other answer to a
read; it is counted on its own.

Times are ``CLOCK_MONOTONIC`` nanoseconds, one clock for every process of the host.
"""

from __future__ import annotations

import errno
import json
import os
import random
import sys
import time
from pathlib import Path

from hicachefs_testing.workload import HEADER_BYTES, claimed, labelled_content

POOL = "mixed-model/bfloat16-page_first-64/tp0of1/kv"
KEYS = 6
SIZES = (16 << 10, 64 << 10, 200 << 10, (256 << 10) + 1)  # a replace changes the size too
PIECE = 16 << 10
ROLES = ("direct", "direct", "rename", "rename", "read", "read", "read")


def run(root: Path, workdir: Path, seconds: float, seed: int) -> dict:
    """Run the load for ``seconds``; the summed counts, with up to 5 ``examples`` of bad reads."""
    from hicachefs_testing.scenarios import start_worker, summed_counts

    (root / POOL).mkdir(parents=True, exist_ok=True)
    log = workdir / "changes.log"
    log.touch()
    roles = {rank: role for rank, role in enumerate(ROLES)}
    procs = [start_worker({"role": role, "rank": rank, "roles": roles, "seed": seed * 100 + rank, "root": str(root),
                           "log": str(log), "seconds": seconds}, module=__name__)
             for rank, role in roles.items()]
    return summed_counts(procs, seconds + 60, failed="workers failed")


def now() -> int:
    return time.monotonic_ns()


class Worker:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.rank = cfg["rank"]
        self.rng = random.Random(cfg["seed"])
        self.pool = Path(cfg["root"]) / POOL
        self.keys = [f"key-{i}" for i in range(KEYS)]
        self.counts: dict[str, int] = {}
        self.examples: list[str] = []
        self.deadline = time.monotonic() + cfg["seconds"]

    def count(self, what: str, example: str | None = None) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        if example is not None and len(self.examples) < 5:
            self.examples.append(example)

    def log(self, line: str) -> None:
        fd = os.open(self.cfg["log"], os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode() + b"\n")  # one write: lines of writers never mix
        finally:
            os.close(fd)

    def pause(self) -> None:
        if self.rng.random() < 0.1:
            time.sleep(0.001)  # let a change of the name land in the middle

    def write_pieces(self, fd: int, data: bytes) -> None:
        for offset in range(0, len(data), PIECE):
            os.pwrite(fd, data[offset : offset + PIECE], offset)
            self.pause()

    def labelled(self, key: str, gen: int) -> bytes:
        return labelled_content(key, self.rng.choice(SIZES), self.rank, gen)

    # ---- roles ---------------------------------------------------------------------

    def direct(self) -> None:
        key = self.rng.choice(self.keys)
        start = now()
        try:
            os.unlink(self.pool / key)
            self.log(f"{key} {start} {now()}")
        except FileNotFoundError:
            pass
        try:
            fd = os.open(self.pool / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another writer got there first
            self.count("creates that found the key taken")
            return
        gen = now()  # after the create: a change begun before this began before the file was made
        try:
            self.write_pieces(fd, self.labelled(key, gen))
            self.count("direct writes")
        except OSError as exc:
            if exc.errno != errno.EPERM:  # EPERM: replaced or removed while written
                raise
            self.count("direct writes replaced while written")
        finally:
            os.close(fd)

    def rename(self) -> None:
        key = self.rng.choice(self.keys)
        gen = now()
        tmp = self.pool / f".{key}.{self.rank}.{gen}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self.write_pieces(fd, self.labelled(key, gen))
        finally:
            os.close(fd)
        start = now()
        os.rename(tmp, self.pool / key)
        self.log(f"{key} {start} {now()} {self.rank} {gen}")
        self.count("renames")

    def read(self) -> None:
        self.follow_log()
        names = [n for n in os.listdir(self.pool) if n.startswith(".")] if self.rng.random() < 0.3 else []
        name = self.rng.choice(names) if names else self.rng.choice(self.keys)
        key = name.split(".")[1] if name.startswith(".") else name
        superseding = self.superseding.get(key, -1)
        try:
            fd = os.open(self.pool / name, os.O_RDONLY)
        except FileNotFoundError:
            self.count("opens that found nothing")
            return
        parts: list[bytes] = []
        try:
            while piece := os.pread(fd, self.rng.choice((4096, 16384, 65536)), sum(map(len, parts))):
                parts.append(piece)
                self.pause()
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            self.count("reads answered EIO")
            return
        finally:
            os.close(fd)
        self.check(name, key, b"".join(parts), superseding)

    def check(self, name: str, key: str, data: bytes, superseding: int) -> None:
        if len(data) < HEADER_BYTES:  # too short to name its write (a file just begun)
            if data.count(0) == len(data) and data:
                self.count("zeros", f"{name}: {len(data)} zero bytes")
            return
        self.count("reads")
        who = claimed(data, key)
        if who is None:
            what = "zeros" if data[:HEADER_BYTES].count(0) == HEADER_BYTES else "torn"
            self.count(what, f"{name}: {len(data)} bytes, header {data[:HEADER_BYTES]!r}")
            return
        expected = labelled_content(key, who.size, who.writer, who.gen)
        if len(data) > who.size or data != expected[: len(data)]:
            first = next((i for i, (a, b) in enumerate(zip(data, expected)) if a != b), who.size)
            rest = data[first : first + 4096]
            what = "zeros" if rest.count(0) == len(rest) else "torn"
            self.count(what, f"{name}: {len(data)} bytes of writer {who.writer}'s {who.size}, differ at {first}")
            return
        if self.cfg["roles"][str(who.writer)] == "direct":
            stale = who.gen < superseding
        else:
            stale = self.renamed.get((who.writer, who.gen), superseding) < superseding
        if stale:
            self.count("stale", f"{name}: writer {who.writer}'s write of {who.gen} read after a change "
                                f"begun at {superseding}")

    def follow_log(self) -> None:
        """Read the changes logged since the last look."""
        with open(self.cfg["log"]) as log:
            log.seek(self.log_offset)
            lines = log.readlines()
        for line in lines:
            if not line.endswith("\n"):  # being appended: read it next time
                break
            self.log_offset += len(line)
            key, start, done, *renamed = line.split()
            self.superseding[key] = max(self.superseding.get(key, -1), int(start))
            if renamed:
                self.renamed[(int(renamed[0]), int(renamed[1]))] = int(done)

    def run(self) -> None:
        role = getattr(self, self.cfg["role"])
        self.log_offset, self.superseding, self.renamed = 0, {}, {}
        while time.monotonic() < self.deadline:
            try:
                role()
            except OSError as exc:
                self.count("unexpected errors", f"{self.cfg['role']}: {exc}")
        print(json.dumps({**self.counts, "examples": self.examples}), flush=True)


def main() -> int:
    Worker(json.loads(sys.argv[1])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
