"""Reliability scenarios shared by the tests and ``scripts/stress.py``.

Each scenario takes ``mount_fn(*flags, path=None) -> mounting.Mount`` (the ``mount_factory``
fixture, or the stress script's equivalent) and returns its figures; the caller asserts on
them (tests) or prints them (stress). Nothing here swallows a failure: a figure that must
be zero is returned for the caller to check, with examples of what went wrong.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs_testing import mounting
from hicachefs_testing.workload import (
    exists_query,
    exists_raw,
    find_all,
    flip_bytes,
    identify,
    labelled_content,
    page_files,
    publish,
    read_or_errno,
    serving,
    tier_counter,
)

MODEL = "crash-model"
FORMAT = "bfloat16-page_first-64"


def start_worker(cfg: dict, module: str = "hicachefs_testing.storm_worker") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, json.dumps(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reap(procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Wait for worker processes; any still running after ``timeout`` is killed by its PID."""
    outputs = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(worker {proc.pid} did not finish within {timeout:.0f} s; killed)"
        outputs.append((out, err))
    return outputs


def summed_counts(procs: list[subprocess.Popen], timeout: float, failed: str) -> dict:
    """Reap worker processes (``reap``) and add up the counts each printed as its last line (a
    JSON object with an ``examples`` list); a worker that printed none counts under ``failed``,
    with the end of its error output among the examples."""
    totals: dict = {"examples": []}
    for out, err in reap(procs, timeout):
        try:
            counts = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            totals["examples"].append(f"a worker gave no counts: {err.strip()[-300:]}")
            totals[failed] = totals.get(failed, 0) + 1
            continue
        totals["examples"] += counts.pop("examples")
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + value
    return totals


# ---- crash -------------------------------------------------------------------------


@dataclass
class CrashFigures:
    runs: int = 0
    kills: int = 0
    published: int = 0  # publishes whose rename returned, over all rounds
    pages_checked: int = 0  # pages read back and checked after the restarts
    promised_checked: int = 0  # of those, pages the mode promised to keep
    lost: int = 0  # promised pages missing or unreadable after a restart (must be 0)
    corrupt: int = 0  # pages served with bytes that are not their key's (must be 0)
    stale: int = 0  # a replaced page served in an older version than the one acknowledged
    temp_visible: int = 0  # temporary files listed or openable after a restart (must be 0)
    dropped: int = 0  # listed pages that answered EIO (dropped as corrupt: allowed)
    unusable: int = 0  # restarts after which publishing or querying failed (must be 0)
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)


def crash_rounds(mount_fn, workdir: Path, rounds: int, write_through: bool, writers: int = 3,
                 seed: int = 0, window: tuple[float, float] = (0.05, 1.5),
                 disk_size: int = 256 << 20, figures: CrashFigures | None = None) -> CrashFigures:
    """Write storms from ``writers`` processes, each ended by SIGKILL of the daemon at a random
    moment, then a remount on the same disk tier and a check: every page listed and every
    promise kept each time, the bytes of the pages this round wrote, and after the last round
    the bytes of every page (a page gone wrong stays wrong, so nothing escapes)."""
    rng = random.Random(seed)
    figures = figures or CrashFigures()
    disk, path = workdir / "disk", workdir / "mnt"
    flags = ["--memory", "16M", "--disk", str(disk), "--disk-size", str(disk_size), "--max-page-size", "1M"]
    if write_through:
        flags.append("--write-through")
    sizes = [4096, 65536, 65536, 200_000, 1000]
    avg = sum(sizes) / len(sizes) + 4096
    # Stay well inside the disk ring, so that nothing is evicted and every loss is a real one.
    budget = int(0.5 * disk_size / (rounds * writers * avg))
    pools = [f"{MODEL}/{FORMAT}/tp{r}of{writers}/kv" for r in range(writers)] + [f"{MODEL}/{FORMAT}/all/kv"]
    promised: dict[str, int] = {}  # relpath -> newest acknowledged generation
    attempted: dict[str, int] = {}  # relpath -> newest generation begun
    temps: list[str] = []
    lost: set[str] = set()
    def spawn(round_no: int) -> tuple[list[Path], list[subprocess.Popen]]:
        """A round's writers, started ahead: they wait for the round's ``go`` file."""
        logs = [workdir / f"round{round_no}-w{rank}.log" for rank in range(writers)]
        return logs, [start_worker({
            "mode": "publish", "root": str(path), "pools": pools, "rank": rank, "log": str(log),
            "seed": rng.getrandbits(32), "sizes": sizes, "prefix": f"k{round_no}", "max_pages": budget,
            "seconds": 30, "go": str(workdir / f"round{round_no}.go"),
        }) for rank, log in enumerate(logs)]

    upcoming = spawn(0)
    mount = mount_fn(*flags, path=path)
    for round_no in range(rounds):
        for pool in pools:
            (mount.path / pool).mkdir(parents=True, exist_ok=True)
        logs, procs = upcoming
        (workdir / f"round{round_no}.go").touch()
        _wait_started(logs, procs)
        time.sleep(rng.uniform(*window))
        mounting.kill(mount)
        figures.kills += 1
        for out, err in reap(procs, 30):
            if "Traceback" in err:
                figures.note(f"writer crashed: {err.strip()[-300:]}")
        fresh: set[str] = set()
        for log in logs:
            for line in log.read_text().splitlines() if log.exists() else []:
                parts = line.split()
                if len(parts) > 1:
                    fresh.add(parts[1])
                if parts[0] == "B":
                    attempted[parts[1]] = max(attempted.get(parts[1], -1), int(parts[2]))
                    temps.append(parts[1].rsplit("/", 1)[0] + "/" + parts[3])
                elif parts[0] == "P":
                    promised[parts[1]] = int(parts[2])
                    figures.published += 1
        last = round_no == rounds - 1
        if not last:
            upcoming = spawn(round_no + 1)  # their imports overlap with the restart and the check
        mount = mount_fn(*flags, path=path)
        figures.runs += 1
        _check_after_crash(mount, figures, promised, attempted, temps, write_through, None if last else fresh, lost)
    return figures


def _wait_started(logs: list[Path], procs, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(log.exists() and log.stat().st_size > 0 for log in logs):
            return
        if any(proc.poll() is not None for proc in procs):
            return
        time.sleep(0.01)


def _check_after_crash(mount, figures: CrashFigures, promised, attempted, temps, write_through,
                       read: set[str] | None, lost: set[str]) -> None:
    """Check a restarted mount; ``read``: the pages whose bytes to check (None: all); ``lost``:
    promised pages found missing so far (each is counted once)."""
    root = mount.path
    listing = page_files(root)
    present: set[str] = set()
    for rel, path in listing.items():
        key = rel.rsplit("/", 1)[-1]
        if key.startswith("."):
            figures.temp_visible += 1
            figures.note(f"temporary file listed after restart: {rel}")
            continue
        if read is not None and rel not in read:
            present.add(rel)  # listed; its bytes are checked after the last round
            continue
        got = read_or_errno(path)
        figures.pages_checked += 1
        if isinstance(got, int):
            if got == errno.EIO:
                figures.dropped += 1
            elif got != errno.ENOENT:
                figures.corrupt += 1
                figures.note(f"{rel}: read failed with {errno.errorcode.get(got, got)}")
            continue
        who = identify(got, key)
        if who is None or rel not in attempted or who.gen > attempted[rel]:
            figures.corrupt += 1
            figures.note(f"{rel}: {len(got)} bytes that are not a write of this key: {got[:64]!r}")
            continue
        present.add(rel)
        if rel in promised and who.gen < promised[rel]:
            figures.stale += 1
            figures.note(f"{rel}: generation {who.gen} served, {promised[rel]} was acknowledged")
    for tmp in temps:
        if os.path.lexists(root / tmp):
            figures.temp_visible += 1
            figures.note(f"temporary file {tmp} can be looked up after restart")
    if write_through:
        for rel in promised:
            figures.promised_checked += read is None or rel in read
            if rel not in present and rel not in lost:
                lost.add(rel)
                figures.lost += 1
                figures.note(f"{rel}: published (rename returned) in write-through mode, missing after restart")
        paths = sorted(promised)
        answer = exists_query(root, paths) if paths else ""
        missing = [p for p, bit in zip(paths, answer) if bit != "1"]
        if len(answer) != len(paths) or (missing and not figures.lost):
            figures.unusable += 1
            figures.note(f"exists query disagrees with the listing: {missing[:3]}")
    try:
        if not serving(root) or mount.stats().get("pending_files", 0):
            figures.unusable += 1
            figures.note("store not usable right after restart")
    except OSError as exc:
        figures.unusable += 1
        figures.note(f"store not usable right after restart: {exc}")


# ---- corruption --------------------------------------------------------------------


@dataclass
class CorruptionFigures:
    injected: int = 0  # pages whose bytes were flipped on the disk tier
    caught: int = 0  # of those, reads answered EIO or miss (never the wrong bytes)
    served_wrong: int = 0  # reads that returned bytes other than the page's (must be 0)
    counted: int = 0  # rise of the stats' checksum_failures over the scenario
    bystanders_lost: int = 0  # untouched pages unreadable afterwards (must be 0)
    pages_checked: int = 0
    examples: list[str] = field(default_factory=list)


def _arena(disk: Path) -> Path:
    arenas = sorted(disk.glob("*.arena"))
    assert arenas, f"no *.arena file in {disk}"
    return arenas[0]


def _flip_page(disk: Path, data: bytes, rng: random.Random) -> int:
    """Flip a few payload bytes of every copy of ``data`` in the arena; returns the copies hit."""
    probe_at = len(data) // 2
    needle = data[probe_at : probe_at + 64]
    hits = find_all(_arena(disk), needle)
    for at in hits:
        flip_bytes(_arena(disk), at + rng.randrange(0, 64), rng.choice([1, 1, 4]))
    return len(hits)


def corruption_unmounted(mount_fn, workdir: Path, seed: int = 0, victims: int = 3,
                         figures: CorruptionFigures | None = None) -> CorruptionFigures:
    """Publish, unmount cleanly (pages go down to disk), flip page bytes in the arena file,
    mount again: the flipped pages are dropped or fail with EIO and are counted."""
    rng = random.Random(seed)
    figures = figures or CorruptionFigures()
    disk = workdir / "disk-cold"
    flags = ["--memory", "64M", "--disk", str(disk), "--disk-size", "64M", "--max-page-size", "1M"]
    mount = mount_fn(*flags)
    pool = mount.page_dir()
    pages = {f"cold-{i}": labelled_content(f"cold-{i}", rng.choice([8192, 65536, 300_000])) for i in range(16)}
    for key, data in pages.items():
        publish(pool, key, data)
    mounting.stop(mount)
    chosen = rng.sample(sorted(pages), victims)
    for key in chosen:
        if _flip_page(disk, pages[key], rng) == 0:
            figures.examples.append(f"{key}: not found in the arena after a clean unmount")
            continue
        figures.injected += 1
    mount = mount_fn(*flags, path=mount.path)
    mount.expected_log_errors += ["checksum", "corrupt"]
    before = 0  # a fresh daemon: every failure it counts comes from this arena
    _read_back(mount.path / mount.page_dir().relative_to(mount.path), pages, set(chosen), figures)
    figures.counted += tier_counter(mount.stats(), "checksum_failures") - before
    return figures


def corruption_mounted(mount_fn, workdir: Path, seed: int = 0, victims: int = 3,
                       figures: CorruptionFigures | None = None) -> CorruptionFigures:
    """Flip bytes of pages that live only on the disk tier while the daemon runs: reading them
    gives EIO or a miss, never wrong bytes, and the failure is counted."""
    rng = random.Random(seed)
    figures = figures or CorruptionFigures()
    disk = workdir / "disk-hot"
    mount = mount_fn("--memory", "16M", "--disk", str(disk), "--disk-size", "128M", "--max-page-size", "1M")
    pool = mount.page_dir()
    pages = {f"hot-{i}": labelled_content(f"hot-{i}", 1 << 20, gen=seed) for i in range(40)}
    for key, data in pages.items():
        publish(pool, key, data)
    on_disk = [k for k in pages if os.getxattr(pool / k, "user.hicachefs.tier") == b"disk"]
    if len(on_disk) < victims:
        figures.examples.append(f"only {len(on_disk)} pages were demoted to disk")
        return figures
    before = tier_counter(mount.stats(), "checksum_failures")
    chosen = rng.sample(on_disk, victims)
    for key in chosen:
        if _flip_page(disk, pages[key], rng):
            figures.injected += 1
    _read_back(pool, pages, set(chosen), figures)
    figures.counted += tier_counter(mount.stats(), "checksum_failures") - before
    return figures


def _read_back(pool: Path, pages: dict[str, bytes], chosen: set[str], figures: CorruptionFigures) -> None:
    for key, data in pages.items():
        for attempt in range(2):  # the second read must not serve it either
            got = read_or_errno(pool / key)
            figures.pages_checked += 1
            if isinstance(got, bytes) and got != data:
                figures.served_wrong += 1
                figures.examples.append(f"{key}: wrong bytes served (attempt {attempt})")
            elif key in chosen:
                if got in (errno.EIO, errno.ENOENT) and attempt == 0:
                    figures.caught += 1
                elif isinstance(got, bytes):
                    figures.served_wrong += 1  # cannot be: flipped bytes never equal data
            elif not isinstance(got, bytes):
                figures.bystanders_lost += 1
                figures.examples.append(f"{key}: untouched page answered {errno.errorcode.get(got, got)}")


# ---- contention --------------------------------------------------------------------


def contention(root: Path, ranks: int = 8, seconds: float = 6.0, seed: int = 0, size: int = 256 << 10) -> dict:
    """``ranks`` processes writing shared (MLA-style ``all``) and per-rank pages and reading
    them back; returns the summed counts (``bad`` must be 0) and examples."""
    shared_pool = f"{MODEL}/{FORMAT}/all/kv"
    own_pattern = f"{MODEL}/{FORMAT}/tp{{rank}}of{ranks}/kv"
    (root / shared_pool).mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        (root / own_pattern.format(rank=rank)).mkdir(parents=True, exist_ok=True)
    procs = [start_worker({
        "mode": "contend", "root": str(root), "rank": rank, "seed": seed * 1000 + rank, "seconds": seconds,
        "shared_pool": shared_pool, "own_pool_pattern": own_pattern, "shared_keys": 6, "own_keys": 6,
        "size": size,
    }) for rank in range(ranks)]
    return {"workers": ranks, **summed_counts(procs, seconds + 60, failed="bad")}


# ---- bad input ---------------------------------------------------------------------


def fuzz_names(root: Path, pool: Path, rng: random.Random, count: int) -> tuple[int, list[str]]:
    """Random byte names through create, mkdir, lookup and rename; returns (inputs tried,
    answers that were EIO, the daemon's "internal error")."""
    alphabet = [bytes([b]) for b in range(1, 256) if b != ord("/")] + ["é".encode(), "键".encode(), b".", b".."]
    tried, failures = 0, []
    model_dir = pool.parent.parent.parent
    for _ in range(count):
        name = b"".join(rng.choice(alphabet) for _ in range(rng.choice([1, 2, 5, 40, 199, 200, 201, 255])))
        for op in ("create", "mkdir", "lookup", "rename"):
            tried += 1
            target = os.path.join(bytes(model_dir if op == "mkdir" else pool), name)
            try:
                if op == "create":
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                elif op == "mkdir":
                    os.mkdir(target)
                elif op == "lookup":
                    os.lstat(target)
                else:
                    publish(pool, "src", b"x")
                    os.rename(pool / "src", target)
            except OSError as exc:
                if exc.errno == errno.EIO:
                    failures.append(f"{op} {name[:40]!r}...: EIO")
    return tried, failures


def fuzz_exists(root: Path, rng: random.Random, count: int, size: int = MAX_EXISTS_REQUEST) -> tuple[int, list[str]]:
    """Malformed exists requests of ``size`` bytes; each must answer one '0' per line."""
    failures = []
    chunk = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    for i in range(count):
        request = (chunk * (size // len(chunk) + 1))[:size]
        try:
            answer = exists_raw(root, request)
        except OSError as exc:
            failures.append(f"exists request {i}: {exc}")
            continue
        lines = request.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        if answer != b"0" * len(lines) + b"\n":
            failures.append(f"exists request {i}: {len(answer)} bytes answered for {len(lines)} lines")
        chunk = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    return count, failures


# ---- a disk that dies under the daemon ---------------------------------------------


@dataclass
class DyingDiskFigures:
    ram_pages_checked: int = 0  # RAM pages read back after the disk died
    ram_pages_wrong: int = 0  # of those, not served or not exact (must be 0)
    disk_pages_failed: int = 0  # pages only on the dead disk whose read failed with EIO or missed
    disk_pages_served: int = 0  # ... or were still served whole (from the kernel's cache)
    wrong_bytes: int = 0  # reads that returned bytes other than the page's (must be 0)
    published_after: int = 0  # new pages published and read back after the disk died
    refused: int = 0  # publishes refused with EIO (write-through promises the disk copy)
    misanswered: int = 0  # publishes answered otherwise than the mode promises (must be 0)
    io_errors: int = 0  # the tiers' io_errors and checksum failures, from the stats
    eio_answers: int = 0  # EIO answers the daemon counted
    still_serving: bool = False
    examples: list[str] = field(default_factory=list)


def dying_disk(mount_fn, workdir: Path, write_through: bool, seed: int = 0) -> DyingDiskFigures:
    """Fill a mount whose disk tier is ext4 on a loop device, kill the device (every read and
    write fails, ext4 turns read-only), then check what the daemon serves. Needs root."""
    from hicachefs_testing.failing_disk import FailingDisk

    figures = DyingDiskFigures()
    with FailingDisk(Path(workdir) / "failing-disk") as disk:
        flags = ["--memory", "16M", "--disk", str(disk.path / "tier"), "--disk-size", "64M", "--max-page-size", "1M"]
        mount = mount_fn(*flags, *(["--write-through"] if write_through else []))
        try:
            pool = mount.page_dir()
            count = 12 if write_through else 40  # write-back: 40 MiB through 16 MiB of RAM
            pages = {f"p{i:03d}": labelled_content(f"p{i:03d}", 1 << 20, gen=seed) for i in range(count)}
            for key, data in pages.items():
                publish(pool, key, data)
            tiers = {key: os.getxattr(pool / key, "user.hicachefs.tier").decode() for key in pages}
            disk.fail()
            disk.drop_cache(next((disk.path / "tier").glob("*.arena")))
            for key, data in pages.items():
                got = read_or_errno(pool / key)
                if isinstance(got, bytes) and got != data:
                    figures.wrong_bytes += 1
                    figures.examples.append(f"{key}: wrong bytes after the disk died")
                elif tiers[key] == "memory":
                    figures.ram_pages_checked += 1
                    if got != data:
                        figures.ram_pages_wrong += 1
                        figures.examples.append(f"{key}: RAM page answered {got!r:.20} after the disk died")
                elif isinstance(got, bytes):
                    figures.disk_pages_served += 1
                else:
                    figures.disk_pages_failed += 1
            for i in range(32):
                key = f"n{i:03d}"
                data = labelled_content(key, 1 << 20, gen=seed + 1)
                try:
                    publish(pool, key, data)
                except OSError as exc:
                    if write_through and exc.errno == errno.EIO:
                        figures.refused += 1
                    else:
                        figures.misanswered += 1
                        figures.examples.append(f"publish {key}: {exc}")
                    continue
                if write_through:
                    figures.misanswered += 1
                    figures.examples.append(f"publish {key} succeeded in write-through mode with a dead disk")
                elif read_or_errno(pool / key) == data:
                    figures.published_after += 1
                else:
                    figures.wrong_bytes += 1
                    figures.examples.append(f"{key}: published after the disk died, not read back")
            stats = mount.stats()
            figures.io_errors = tier_counter(stats, "io_errors") + tier_counter(stats, "checksum_failures")
            figures.eio_answers = stats["errors"].get("EIO", 0)
            # Still there: the RAM pages (write-through), the newest pages (write-back: RAM
            # evicts what it cannot write down).
            there = [k for k in pages if tiers[k] == "memory"] if write_through else [f"n{i:03d}" for i in range(24, 32)]
            rel = pool.relative_to(mount.path)
            answers_right = exists_query(mount.path, [f"{rel}/{key}" for key in there]) == "1" * len(there)
            # Write-through cannot publish without its disk: a probe page would be refused.
            figures.still_serving = mounting.alive(mount.pid) and answers_right and (write_through or serving(mount.path))
        finally:
            mounting.stop(mount)  # before the device goes: the daemon's close meets the dead disk
    return figures
