"""One process replaces the same pages over and over, by ingest and by temporary file and rename,
while readers read them through page files, the data plane and the fetch file (issue 29, items
1 and 2): ``run(mount, workdir, seconds, seed)``.

Why: a replace is acknowledged when its write (ingest) or its rename returns; from then on no
reader may get an older version, whichever way it reads: the kernel must have been told before
the acknowledgement, and the plane's readers must see the new row. The writer logs each
acknowledgement on ``CLOCK_MONOTONIC`` (``ACKS`` file: ``version ns key``, ``*`` for a whole
ingest batch); the readers note when each read began; the two are judged after the run
(``versions``). The readers go on for ``AFTER_S`` after the writer stopped, when every read
must give its last version.

The writer is ``python -m hicachefs_testing.replace_load MOUNT POOL_DIR KEYS SIZE SECONDS ACKS``
(POOL_DIR relative to the mount; versions from 1, ingest and rename in turn); it prints its
counts as JSON.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from hicachefs_testing.versions import VersionLog, verdict
from hicachefs_testing.workload import labelled_content, publish

MODEL = "replaces"
PAGES = 8
#: How long the readers go on after the writer's last replace was acknowledged.
AFTER_S = 1.0
#: Readers by way: the plane (a client), the fetch file (a client without the plane), page files.
READERS = ("plane", "plane", "fetch", "files", "files")


def ingest_header(paths: list[str], size: int) -> bytes:
    """An ingest batch's prefix and header (DESIGN.md), flags 0: the pages replace what is there.
    Written here, not taken from the client: importing the client costs the writer seconds."""
    lines = "".join(f"{size} {path}\n" for path in paths).encode()
    return struct.pack("<8sIHH", b"HCFSPUT1", len(lines), len(paths), 0) + lines


def writer(mount: Path, pool_dir: str, names: list[str], size: int, seconds: float, acks: Path) -> dict:
    """Replace ``names`` by ingest and by rename in turn until ``seconds`` are up."""
    counts: Counter = Counter()
    fd = os.open(mount / ".hicachefs" / "ingest", os.O_RDWR)
    deadline = time.monotonic() + seconds
    version = 1
    with open(acks, "w") as log:
        try:
            while time.monotonic() < deadline:
                pages = [labelled_content(key, size, 0, version) for key in names]
                if version % 2:
                    header = ingest_header([f"{pool_dir}/{k}" for k in names], size)
                    if os.pwritev(fd, [header, *pages], 0) != len(header) + size * len(names):
                        raise OSError("an ingest replace was cut short")
                    log.write(f"{version} {time.monotonic_ns()} *\n")
                    counts["ingest replaces"] += len(names)
                else:
                    for key, page in zip(names, pages):
                        publish(mount / pool_dir, key, page)
                        log.write(f"{version} {time.monotonic_ns()} {key}\n")
                    counts["rename replaces"] += len(names)
                version += 1
        finally:
            os.close(fd)
    counts["last version"] = version - 1
    return counts


def read_acks(acks: Path, names: list[str]) -> VersionLog:
    log = VersionLog()
    for line in acks.read_text().splitlines():
        version, at, key = line.split()
        for name in names if key == "*" else [key]:
            log.acked(name, int(version), int(at))
    return log


class Readers:
    """The readers of one run; each notes (way, key, began, version) of the pages it read right."""

    def __init__(self, mount, directory: Path, names: list[str], seed: int) -> None:
        self.mount, self.directory, self.names = mount, directory, names
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.counts: Counter = Counter()
        self.examples: list[str] = []
        self.reads: list[tuple[str, str, int, int]] = []
        self._lock = threading.Lock()

    def _judged(self, way: str, key: str, began: int, data: bytes, right: list) -> None:
        kind = verdict(data, key, 0, -1)
        if kind is None:
            right.append((way, key, began, int(data[:64].split(b"|")[2])))
            return
        with self._lock:
            self.counts[kind] += 1
            if len(self.examples) < 5:
                self.examples.append(f"{way}: {key} read {kind}: {data[:48]!r}")

    def client_reader(self, way: str) -> None:
        from hicachefs_testing import stress_clients as sc

        pool = sc.host_pool(PAGES)
        fs = sc.client(self.mount.path, MODEL, pool, data_plane=way == "plane")
        right, reads, hits = [], 0, 0
        try:
            while not self.stop.is_set():
                pool.zero()
                began = time.monotonic_ns()
                got = fs.batch_get_v1(self.names, sc.indices(pool, range(PAGES)))
                reads, hits = reads + PAGES, hits + sum(got)
                for page, (key, hit) in enumerate(zip(self.names, got)):
                    if hit:
                        self._judged(way, key, began, sc.taken(pool, page), right)
            stats = fs.statistics()
        finally:
            fs.close()
        with self._lock:
            self.reads += right
            self.counts.update({f"{way} reads": reads, f"{way} hits": hits, "plane retries": stats["plane_retries"]})

    def file_reader(self, way: str) -> None:
        from hicachefs_testing.workload import read_whole

        rng = random.Random(self.rng.random())
        right, reads, errors = [], 0, Counter()
        while not self.stop.is_set():
            key = rng.choice(self.names)
            began = time.monotonic_ns()
            try:
                data = read_whole(self.directory / key)
            except OSError as exc:  # between a removal and a rename's landing: none here, but say so
                errors[exc.strerror] += 1
                continue
            reads += 1
            self._judged(way, key, began, data, right)
        with self._lock:
            self.reads += right
            self.counts.update({"file reads": reads, **{f"file reads failed ({k})": v for k, v in errors.items()}})

    def guarded(self, way: str) -> None:
        """A reader of ``way``; one that blows up is counted (``readers failed``), not lost."""
        try:
            (self.file_reader if way == "files" else self.client_reader)(way)
        except Exception as exc:
            with self._lock:
                self.counts["readers failed"] += 1
                self.examples.append(f"{way} reader: {type(exc).__name__}: {exc}")

    def judge(self, log: VersionLog) -> None:
        for way, key, began, version in self.reads:
            floor = log.floor(key, began)
            if version < floor:
                self.counts["stale"] += 1
                self.counts[f"stale through {way}"] += 1
                if len(self.examples) < 5:
                    self.examples.append(f"{way}: {key} version {version} read after {floor} was acknowledged")


def run(mount, workdir: Path, seconds: float, seed: int) -> tuple[Counter, list[str]]:
    """The replaces for ``seconds``, the readers for ``AFTER_S`` more; counts and examples."""
    from hicachefs_testing import stress_clients as sc

    pool = sc.host_pool(PAGES)
    size = sc.page_size(pool)
    names = [f"{MODEL}-{seed % 1000:03d}-{i:04d}" for i in range(PAGES)]
    first = sc.client(mount.path, MODEL, pool)
    for page, key in enumerate(names):
        sc.put(pool, page, labelled_content(key, size, 0, 0))
    stored = first.batch_set_v1(names, sc.indices(pool, range(PAGES)))
    first.close()
    if not all(stored):
        raise RuntimeError(f"the first version was not stored: {stored}")
    directory = sc.pool_directory(mount.path, MODEL)
    acks = workdir / "acks.log"
    process = subprocess.Popen([sys.executable, "-m", __name__, str(mount.path), str(directory.relative_to(mount.path)),
                                ",".join(names), str(size), str(seconds), str(acks)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    readers = Readers(mount, directory, names, seed)
    threads = [threading.Thread(target=readers.guarded, args=(way,)) for way in READERS]
    for thread in threads:
        thread.start()
    try:
        out, err = process.communicate(timeout=seconds + 120)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    finally:
        time.sleep(AFTER_S)
        readers.stop.set()
        for thread in threads:
            thread.join()
    if process.returncode != 0:
        raise RuntimeError(f"the writer failed ({process.returncode}): {err.strip()[-300:]}")
    readers.counts.update(json.loads(out.strip().splitlines()[-1]))
    readers.judge(read_acks(acks, names))
    return readers.counts, readers.examples


def main(argv: list[str]) -> int:
    mount, pool_dir, names, size, seconds, acks = argv
    print(json.dumps(writer(Path(mount), pool_dir, names.split(","), int(size), float(seconds), Path(acks))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
