"""What the third hardening round (issue 29, items 6 to 8) says a plain user must no longer do to
other clients, tried as uid 65534 (``attacks``, ``plain_user``): ``pins_round(mount, seed)``.

Why: a plain user may open the fetch file and any page, and see other writers' temporary files;
each of those once let it forge reads, pin the RAM tier, or keep the reaper from freeing room.
In turn, while another client times its small requests (``latency_probe``):

- report floods: ``0 <path>`` lines (refused with EINVAL since reads are reported through the data
  plane only) and lines of the wrong size for a page nobody reads, from several processes
  (``fetch-storm``): the page's ``user.hicachefs.hits`` must stay 0;
- many fetch handles each holding a page pinned (``held-fetches``), while root publishes twice
  the RAM tier (renames and ingest): none of root's writes may fail with ENOSPC (there is a
  disk tier below to demote to);
- a dead writer's temporary files (root's, closed, never renamed, until the cap on files being
  written refuses more), held open by the plain user (``held-files``): ``--temp-timeout`` later
  they are discarded all the same, and root's new temporary files are not refused;
- at the end, root's own page still reads back whole.

The mount must be reachable by uid 65534 and made with ``FLAGS`` and a disk tier.
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from pathlib import Path

from hicachefs_testing import attacks
from hicachefs_testing.workload import content, exists_query, publish, read_whole

FLAGS = ("--memory", "64M", "--disk-size", "512M", "--temp-timeout", "1")
MiB = 1 << 20
VICTIM_SIZE = 4096
PINNED_PAGES, PIN_HANDLES = 64, 256
DEAD_FILES_MOST = 128
#: How long after the temporary-file timeout the dead writer's files may still be pending.
REAP_GRACE_S = 1.5


def _ingest(root: Path, rel: str, pages: dict[str, bytes]) -> int:
    """Publish ``pages`` (key: bytes, all one size) through the ingest file, replacing; the
    errno that stopped the batch, or 0."""
    from hicachefs_testing.replace_load import ingest_header

    size = len(next(iter(pages.values())))
    header = ingest_header([f"{rel}/{key}" for key in pages], size)
    fd = os.open(root / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        done = os.pwritev(fd, [header, *pages.values()], 0)
        return 0 if done == len(header) + size * len(pages) else errno.EIO
    except OSError as exc:
        return exc.errno or errno.EIO
    finally:
        os.close(fd)


class PinsRound:
    def __init__(self, mount, seed: int) -> None:
        self.mount = mount
        self.root = mount.path
        self.seed = seed
        self.figures: Counter = Counter()
        self.examples: list[str] = []
        self.pool = mount.page_dir("model", "bfloat16-page_first-64", "tp0of1", "pins")
        self.rel = str(self.pool.relative_to(self.root))
        self.own_load: list[tuple[float, float]] = []  # when root itself wrote in bulk

    def note(self, what: str, example: str, amount: int = 1) -> None:
        self.figures[what] += amount
        if len(self.examples) < 5:
            self.examples.append(example)

    def _attack(self, kind: str, args: tuple, count: int, rounds: int) -> None:
        made, refused = attacks.run_rounds(kind, *args, count=count, rounds=rounds)
        self.figures["attack rounds"] += made
        for name, value in refused.items():
            self.figures[f"attack requests refused ({name})"] += value

    def floods(self, rounds: int) -> None:
        request = MiB
        victim = f"{self.rel}/victim"
        self._attack("fetch-storm", (self.root, request, f"0 {victim}"), 2, rounds)
        self._attack("fetch-storm", (self.root, request, f"{VICTIM_SIZE - 1} {victim}"), 1, rounds)
        self._attack("fetch-storm", (self.root, request, f"{VICTIM_SIZE + 1} {victim}"), 1, rounds)

    def root_writes(self, pages: int, tag: str) -> None:
        """Root publishes ``pages`` pages of a MiB, half by rename, half by ingest batches of 8
        (another client's requests meanwhile wait on root's load, not the plain user's: they are
        not timed)."""
        began = time.monotonic()
        for i in range(pages // 2):
            try:
                publish(self.pool, f"{tag}-rename-{i}", content(f"{tag}-{i}", MiB))
            except OSError as exc:
                self._root_write_failed(exc.errno, f"{tag}: rename publish {i}")
            self.figures["root's pages written"] += 1
        for first in range(0, pages - pages // 2, 8):
            batch = {f"{tag}-ingest-{first + j}": content(f"{tag}-i-{first + j}", MiB) for j in range(8)}
            failed = _ingest(self.root, self.rel, batch)
            if failed:
                self._root_write_failed(failed, f"{tag}: ingest batch at {first}")
            self.figures["root's pages written"] += len(batch)
        self.own_load.append((began, time.monotonic()))

    def _root_write_failed(self, code: int, what: str) -> None:
        if code == errno.ENOSPC:
            self.note("root's writes refused ENOSPC", f"{what}: ENOSPC while a disk tier had room")
        else:
            self.note("root's writes failed otherwise", f"{what}: {errno.errorcode.get(code, code)}")

    def pins(self) -> None:
        keys = [f"pinned-{i}" for i in range(PINNED_PAGES)]
        for key in keys:
            publish(self.pool, key, content(key, MiB))
        handles = ",".join(keys[i % len(keys)] for i in range(PIN_HANDLES))
        with attacks.start("held-fetches", self.root, self.rel, MiB, handles) as held:
            self.root_writes(128, "while-pinned")  # twice the RAM tier
            done = held.finish()
        self.figures["fetch handles held"] += PIN_HANDLES - sum(done["errors"].values())

    def dead_writer(self) -> None:
        """Root's temporary files, closed and never renamed, held open by the plain user."""
        written = 0
        for i in range(DEAD_FILES_MOST):
            fd = os.open(self.pool / f".dead-{i}", os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, MiB)
                os.write(fd, content(f"dead-{i}", MiB))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    self.note("dead writer's files failed otherwise", f".dead-{i}: {exc}")
                break
            finally:
                os.close(fd)
                written = i + 1
        self.figures["dead writer's temporary files"] += written
        closed = time.monotonic()
        with attacks.start("held-files", self.pool, ".dead-") as held:
            time.sleep(max(0.0, closed + self.mount_timeout() + REAP_GRACE_S - time.monotonic()))
            left = sum(1 for name in os.listdir(self.pool) if name.startswith(".dead-"))
            if left:
                self.note("dead writer's files pending past the timeout",
                          f"{left} of {written} held temporary files not discarded", left)
            self.root_temporary_files(16)
            done = held.finish()
        self.figures["held files read after their discard (EIO)"] += done["errors"].get("EIO", 0)

    def mount_timeout(self) -> float:
        flags = self.mount.flags
        return float(flags[flags.index("--temp-timeout") + 1]) if "--temp-timeout" in flags else 60.0

    def root_temporary_files(self, count: int) -> None:
        for i in range(count):
            try:
                publish(self.pool, f"after-dead-{i}", content(f"after-dead-{i}", MiB))
            except OSError as exc:
                self._root_write_failed(exc.errno, f"a temporary file after the dead writer's, {i}")
            self.figures["root's pages written"] += 1


def pins_round(mount, seed: int, flood_rounds: int = 20) -> tuple[Counter, list[str]]:
    """The round (see the module docstring); figures and up to 5 examples. ``requests`` and
    ``slow`` (over ``attacks.SLOW_S``) are another client's, timed meanwhile (but while root
    itself writes in bulk); ``forged hits``,
    ``root's writes refused ENOSPC``, ``dead writer's files pending past the timeout`` and
    ``root's pages unreadable`` must be 0."""
    round_ = PinsRound(mount, seed)
    victim = content("victim", VICTIM_SIZE)
    mine = content(f"root-{seed}", 256 << 10)
    publish(round_.pool, "victim", victim)
    publish(round_.pool, "mine", mine)
    probe_keys = [f"probe-{i}" for i in range(16)]
    for key in probe_keys:
        publish(round_.pool, key, content(key, 4096))
    probe = attacks.start_probe(mount.path, round_.rel, probe_keys, mount.path.parent / f"probe-stop-{seed}")
    started = time.monotonic()
    try:
        round_.floods(flood_rounds)
        round_.pins()
        round_.dead_writer()
        ended = time.monotonic()
    finally:
        samples = probe.finish()
    figures = round_.figures
    forged = int(os.getxattr(round_.pool / "victim", "user.hicachefs.hits"))
    if forged:
        round_.note("forged hits", f"a page nobody read has {forged} hits", forged)
    if read_whole(round_.pool / "mine") != mine:
        round_.note("root's pages unreadable", "root's own page did not read back whole")
    if exists_query(mount.path, [f"{round_.rel}/victim"]) != "1":
        round_.note("root's pages unreadable", "the flooded page is gone")
    took = [t for began, t, _ in samples if began + t >= started and began <= ended
            and not any(began <= end and began + t >= start for start, end in round_.own_load)]
    figures["requests"] += len(took)
    figures["slow"] += sum(t > attacks.SLOW_S for t in took)
    figures["p99_us"] = round(attacks.percentile(took, 0.99) * 1e6)
    return figures, round_.examples
