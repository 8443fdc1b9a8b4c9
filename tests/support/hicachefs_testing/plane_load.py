"""Four readers through the data plane while the pages they read change under them (issue 28's
stress mode): ``run(mount, seconds, seed)``.

Why: the plane's readers copy pages out of the daemon's memory without asking it, trusting a
per-row seqlock; what would break that shows only when rows change while copies run. So, all at
once, on a mount whose RAM tier is small enough that pages are demoted to its disk tier and
dropped from it:

- a replacer publishes new versions of the ``REPLACED`` pages (model ``plane-replaced``)
  through ``.hicachefs/ingest``, replacing, version after version;
- a remover writes the ``REMOVED`` pages (model ``plane-removed``) through its client (the
  plane's writes), then ``rm -r`` their pool directory through the mount, round after round;
- a filler writes fresh pages (model ``plane-filler``), never read, so that the others are
  demoted and evicted;
- 4 readers, each a client of its own (as SGLang's ranks are), ask ``batch_exists`` and
  ``batch_get_v1`` of a few of the replaced and removed pages into their host pools.

Every page a reader is told it read is judged by its bytes (``versions.verdict``): ``torn``,
``foreign`` (another key's or pool's), or ``stale`` (older than what was acknowledged, by a
replace or a removal, before its read began). Figures are counted; up to 5 examples kept.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from hicachefs_testing import stress_clients as sc
from hicachefs_testing.versions import VersionLog, verdict
from hicachefs_testing.workload import labelled_content
from hicachefs_client.ingest import encode_header

REPLACED, REMOVED, FILLER = "plane-replaced", "plane-removed", "plane-filler"
WRITERS = {REPLACED: 0, REMOVED: 1, FILLER: 2}  # the label's writer: which pool a page is of
REPLACED_PAGES, REMOVED_PAGES, FILLER_BATCH = 16, 64, 32
READERS, READ_BATCH = 4, 8
#: The mount's flags (besides the disk directory): RAM for a third of what is written a round.
FLAGS = ("--memory", "16M", "--disk-size", "64M")


def keys(model: str, count: int, first: int = 0) -> list[str]:
    return [f"{model}-{i:08d}" for i in range(first, first + count)]


class PlaneLoad:
    """The threads of one run and what they count. See the module docstring."""

    def __init__(self, mount, seconds: float, seed: int) -> None:
        self.mount = mount
        self.root = mount.path
        self.deadline = time.monotonic() + seconds
        self.rng = random.Random(seed)
        self.log = VersionLog()
        self.counts: Counter = Counter()
        self.examples: list[str] = []
        self.reads: list[tuple[str, str, int, int]] = []  # (model, key, began_ns, version) of each right page
        self._lock = threading.Lock()
        self.size = sc.page_size(sc.host_pool(1))

    def count(self, **amounts: int) -> None:
        with self._lock:
            self.counts.update(amounts)

    def example(self, text: str) -> None:
        with self._lock:
            if len(self.examples) < 5:
                self.examples.append(text)

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    # ---- writers -----------------------------------------------------------------------

    def _written(self, model: str, fs, pool, names: list[str], gen: int) -> list[bool]:
        for page, key in enumerate(names):
            sc.put(pool, page, labelled_content(key, self.size, WRITERS[model], gen))
        return fs.batch_set_v1(names, sc.indices(pool, range(len(names))))

    def replacer(self, directory: Path) -> None:
        names = keys(REPLACED, REPLACED_PAGES)
        rel = directory.relative_to(self.root)
        fd = os.open(self.root / ".hicachefs" / "ingest", os.O_RDWR)
        try:
            version = 1
            while self.running():
                pages = [labelled_content(key, self.size, WRITERS[REPLACED], version) for key in names]
                header = encode_header([f"{rel}/{key}" for key in names], [self.size] * len(names), flags=0)
                try:
                    done = os.pwritev(fd, [header, *pages], 0)
                except OSError as exc:
                    self.count(**{f"replaces refused ({exc.strerror})": 1})
                    continue
                acked = time.monotonic_ns()
                if done != len(header) + self.size * len(names):
                    self.count(**{"replaces cut short": 1})
                    continue  # which pages went is unknown: no version acknowledged
                for key in names:
                    self.log.acked(f"{REPLACED}/{key}", version, acked)
                self.count(replaces=len(names))
                version += 1
                time.sleep(0.002)
        finally:
            os.close(fd)

    def remover(self, fs, pool) -> None:
        names = keys(REMOVED, REMOVED_PAGES)
        round_ = 0
        while self.running():
            stored = self._written(REMOVED, fs, pool, names, round_)
            self.count(**{"removed pool's pages written": sum(stored)})
            time.sleep(0.1)
            directory = sc.pool_directory(self.root, REMOVED) if any(stored) else None
            if directory is not None:
                # -f: a page the filler's writes evict between rm's listing and its unlink is gone,
                # as rm wanted (without it rm says ENOENT and fails); any other failure still counts.
                done = subprocess.run(["rm", "-rf", str(directory)], capture_output=True, text=True)
                acked = time.monotonic_ns()
                if done.returncode != 0:
                    self.count(**{"rm -r failed": 1})
                    self.example(f"rm -r {directory}: {done.stderr.strip()[:200]}")
                else:
                    for key in names:
                        self.log.acked(f"{REMOVED}/{key}", round_ + 1, acked)
                    self.count(**{"pool directories removed": 1})
            round_ += 1

    def filler(self, fs, pool) -> None:
        first = 0
        while self.running():
            names = keys(FILLER, FILLER_BATCH, first)
            self.count(**{"filler pages written": sum(self._written(FILLER, fs, pool, names, 0))})
            first += FILLER_BATCH

    # ---- readers -----------------------------------------------------------------------

    def reader(self, number: int, clients: dict, pool) -> None:
        rng = random.Random(self.rng.random() + number)
        wanted = {REPLACED: keys(REPLACED, REPLACED_PAGES), REMOVED: keys(REMOVED, REMOVED_PAGES)}
        right = []
        while self.running():
            model = rng.choice((REPLACED, REMOVED))
            names = rng.sample(wanted[model], READ_BATCH)
            fs = clients[model]
            if rng.random() < 0.25:
                self.count(exists_calls=1, exists_pages=fs.batch_exists(names))
            pool.zero()  # a page reported read with no bytes shows as torn
            began = time.monotonic_ns()
            got = fs.batch_get_v1(names, sc.indices(pool, range(len(names))))
            self.count(reads=len(names), hits=sum(got))
            for page, (key, hit) in enumerate(zip(names, got)):
                if not hit:
                    continue
                data = sc.taken(pool, page)
                kind = verdict(data, key, WRITERS[model], -1)
                if kind is not None:
                    self.count(**{kind: 1})
                    self.example(f"reader {number}: {model}/{key} read {kind}: {data[:48]!r}")
                else:
                    right.append((model, key, began, int(data[:64].split(b"|")[2])))
        with self._lock:
            self.reads += right

    def judge(self) -> None:
        """The stale reads, now that every acknowledgement is in the log."""
        for model, key, began, version in self.reads:
            floor = self.log.floor(f"{model}/{key}", began)
            if version < floor:
                self.count(stale=1)
                self.example(f"{model}/{key}: version {version} read after {floor} was acknowledged")


def run(mount, seconds: float, seed: int) -> tuple[Counter, list[str]]:
    """The load for about ``seconds`` on ``mount`` (made with ``FLAGS`` and a disk tier); its
    counts (``reads``, ``hits``, ``torn``, ``foreign``, ``stale``, ``plane retries``...) and up
    to 5 examples of what went wrong."""
    load = PlaneLoad(mount, seconds, seed)
    before = mount.stats()
    writer_pool = sc.host_pool(max(REPLACED_PAGES, REMOVED_PAGES, FILLER_BATCH))
    first = sc.client(mount.path, REPLACED, writer_pool)
    names = keys(REPLACED, REPLACED_PAGES)
    version_zero = load._written(REPLACED, first, writer_pool, names, 0)
    acked = time.monotonic_ns()
    for key, stored in zip(names, version_zero):
        if stored:
            load.log.acked(f"{REPLACED}/{key}", 0, acked)
    directory = sc.pool_directory(mount.path, REPLACED)
    first.close()
    remover_pool, filler_pool = sc.host_pool(REMOVED_PAGES), sc.host_pool(FILLER_BATCH)
    remover_fs = sc.client(mount.path, REMOVED, remover_pool)
    filler_fs = sc.client(mount.path, FILLER, filler_pool)
    readers = []
    for _ in range(READERS):
        pool = sc.host_pool(READ_BATCH)
        readers.append(({REPLACED: sc.client(mount.path, REPLACED, pool), REMOVED: sc.client(mount.path, REMOVED, pool)},
                        pool))
    jobs = [(load.replacer, directory), (load.remover, remover_fs, remover_pool),
            (load.filler, filler_fs, filler_pool)]
    jobs += [(load.reader, n, *r) for n, r in enumerate(readers)]
    failed = []

    def guarded(target, *args):
        try:
            target(*args)
        except Exception as exc:  # a thread that died is a failure of the run, not a hidden one
            failed.append(f"{target.__name__}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=guarded, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load.judge()
    for clients, _ in readers:
        for fs in clients.values():
            stats = fs.statistics()
            load.count(**{"plane reads": stats["plane_reads"], "plane retries": stats["plane_retries"]})
            fs.close()
    remover_fs.close()
    filler_fs.close()
    after = mount.stats()
    for figure in ("demotions", "evictions", "promotions"):
        load.count(**{figure: after[figure] - before[figure]})
    load.count(**{"threads failed": len(failed)})
    return load.counts, failed[:5] + load.examples
