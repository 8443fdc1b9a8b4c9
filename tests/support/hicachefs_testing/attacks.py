"""What a plain local user may try to stall or bloat a mount's daemon, each as a process of its
own (``plain_user``), and another client timing its small requests meanwhile (``latency_probe``).

The plain user's programs run as uid 65534 (``start``, ``run_script``) with the system's Python,
from a copy of ``plain_user.py`` in a directory of their own that any user can read: the
checkout's may not be (a clone in a 0700 directory), nor its ``.venv``. The tests and
``scripts/stress.py`` run them so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs_testing import plain_user
from hicachefs_testing.plain_user import COSTLY_LINE

NOBODY = 65534
#: The Python the plain user runs: the system's (standard library only, as ``plain_user`` needs).
SYSTEM_PYTHON = "/usr/bin/python3"


def fill_pool(root: Path, pool: str, count: int, size: int = 64) -> list[str]:
    """Publish ``count`` pages of ``size`` bytes in pool directory ``pool`` (relative to the
    root) through the ingest file, 4,096 a write; their keys."""
    keys = [f"{i:064x}" for i in range(count)]
    fd = os.open(root / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        for first in range(0, count, 4096):
            batch = keys[first : first + 4096]
            header = "".join(f"{size} {pool}/{key}\n" for key in batch).encode()
            prefix = struct.pack("<8sIHH", b"HCFSPUT1", len(header), len(batch), 0)
            payload = prefix + header + bytes(size * len(batch))
            if os.pwrite(fd, payload, 0) != len(payload):
                raise OSError(errno.EIO, f"the ingest file took part of a batch of {len(batch)} pages")
    finally:
        os.close(fd)
    return keys


@dataclass
class Attack:
    """A running attack process (``start``); ``finish`` stops it and returns its figures. As a
    context manager it is killed by its PID on the way out if it still runs (a test that
    failed before ``finish``)."""

    process: subprocess.Popen

    def __enter__(self) -> "Attack":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()

    def wait_round(self) -> None:
        """Until the process reports its next round (or its start)."""
        line = self.process.stdout.readline()
        if line.strip() not in ("started", "round"):
            raise RuntimeError(f"the attack ended early (exit {self.process.poll()}): {line!r}")

    def finish(self) -> dict:
        return _last_line_json(self.process, "the attack")  # closes its standard input


@contextlib.contextmanager
def _reachable_copy() -> Iterator[Path]:
    """A directory that any user can read holding a copy of ``plain_user.py``, removed after."""
    directory = Path(tempfile.mkdtemp(prefix="hicachefs-plain-user-"))
    try:
        directory.chmod(0o755)
        shutil.copyfile(plain_user.__file__, directory / "plain_user.py")
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def start(kind: str, *args, user: int = NOBODY, count: int = 1) -> Attack | list[Attack]:
    """Start an attack of ``plain_user`` as ``user`` and wait until it is under way; ``count`` >
    1: that many at once (a list), each under way. Once they are, their copy of the program goes
    (Python has read it)."""
    with _reachable_copy() as directory:
        command = [SYSTEM_PYTHON, "-I", str(directory / "plain_user.py"), kind, *map(str, args)]
        started = [Attack(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           user=user, group=user, cwd="/"))
                   for _ in range(count)]
        try:
            for attack in started:
                attack.wait_round()
        except BaseException:
            for attack in started:
                attack.process.kill()
                attack.process.communicate()
            raise
    return started[0] if count == 1 else started



def run_rounds(kind: str, *args, count: int = 1, rounds: int = 0) -> tuple[int, Counter]:
    """Start ``count`` attacks of ``kind``, let each make ``rounds`` rounds, and finish them:
    the rounds they made, and their refused requests by errno name."""
    made, refused = 0, Counter()
    with contextlib.ExitStack() as stack:
        running = start(kind, *args, count=count)
        running = [stack.enter_context(a) for a in (running if isinstance(running, list) else [running])]
        for _ in range(rounds):
            for attack in running:
                attack.wait_round()
        for attack in running:
            done = attack.finish()
            made += done["rounds"]
            refused.update(done["errors"])
    return made, refused

def run_script(script: str, *args: str, user: int = NOBODY, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run Python source as ``user`` with the system's Python, where it may ``import plain_user``
    (``args``: its ``sys.argv[1:]``)."""
    with _reachable_copy() as directory:
        return subprocess.run([SYSTEM_PYTHON, "-s", "-c", script, *args], env={"PYTHONPATH": str(directory)},
                              cwd="/", user=user, group=user, capture_output=True, text=True, timeout=timeout)


@dataclass
class Probe:
    """``latency_probe`` running as another client; ``finish`` returns its samples, each
    (start, seconds, kind)."""

    process: subprocess.Popen
    stop: Path

    def finish(self) -> list[tuple[float, float, str]]:
        self.stop.touch()
        return [tuple(s) for s in _last_line_json(self.process, "the latency probe")]


def _last_line_json(process: subprocess.Popen, what: str):
    """What a helper process printed last, as JSON, once it has ended (killed by its PID if it
    does not end within 120 s); a helper that failed raises."""
    try:
        out, _ = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"{what} failed with exit status {process.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def start_probe(root: Path, pool: str, keys: list[str], stop: Path) -> Probe:
    """The probe asks about pages ``pool/key`` (they must exist) and waits until it is under way."""
    process = subprocess.Popen([sys.executable, "-m", "hicachefs_testing.latency_probe", str(root), pool,
                                ",".join(keys), str(stop)], stdout=subprocess.PIPE, text=True)
    if process.stdout.readline().strip() != "started":
        process.kill()
        process.communicate()
        raise RuntimeError("the latency probe did not start")
    return Probe(process, stop)


def rss(pid: int) -> int:
    """A process's resident memory in bytes (its VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def during(samples, start: float, end: float, kind: str | None = None) -> list[float]:
    """Durations of the samples (of ``kind``) that overlapped [start, end]."""
    return [took for began, took, k in samples
            if began <= end and began + took >= start and (kind is None or k == kind)]


#: Another client's request slower than this counts against the daemon (the issue's target).
SLOW_S = 0.1
TEMPORARY_PAGE = 64 << 10


def unrenamed_files(pool: Path, most: int) -> tuple[int, int | None]:
    """Temporary files of ``TEMPORARY_PAGE`` bytes (size announced), closed and never renamed,
    until one fails or ``most`` are written: how many, and the errno that stopped them."""
    for i in range(most):
        fd = os.open(pool / f".unrenamed-{i}", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, TEMPORARY_PAGE)
            os.write(fd, os.urandom(TEMPORARY_PAGE))
        except OSError as exc:
            return i + 1, exc.errno  # the failed one exists too
        finally:
            os.close(fd)
    return most, None


def plain_user_round(mount, memory_bytes: int, big_pages: int = 40_000) -> Counter:
    """Each attack in turn on a mount uid 65534 can reach, while another client (the latency
    probe) times its small requests: 2 listing storms over a pool of ``big_pages``, 4 exists
    storms of 8 MiB queries, 100 held 8 MiB requests, then (as root: a plain user cannot write
    pages) temporary files never renamed until ENOSPC. Figures: the probe's ``requests`` during
    the attacks and those ``slow`` (over ``SLOW_S``), its ``p99_us``; the attacks' ``rounds`` and
    ``refused``; ``files before ENOSPC``, and published pages the files ``evicted``."""
    from hicachefs_testing.workload import content, exists_query, publish

    figures: Counter = Counter()
    small = mount.page_dir()
    keys = [f"{i:064x}" for i in range(64)]
    for i, key in enumerate(keys):
        publish(small, key, content(i, 4096))
    big = mount.page_dir("model", "bfloat16-page_first-64", "tp0of1", "big")
    big_keys = fill_pool(mount.path, str(big.relative_to(mount.path)), big_pages)
    rel = str(small.relative_to(mount.path))
    probe = start_probe(mount.path, rel, keys, mount.path.parent / "probe-stop")
    started = time.monotonic()
    try:
        phases = [("listing-storm", (big,), 2, 50), ("exists-storm", (mount.path, MAX_EXISTS_REQUEST), 4, 1),
                  ("held-requests", (mount.path, 100, MAX_EXISTS_REQUEST - len(COSTLY_LINE)), 1, 0)]
        for kind, args, count, rounds in phases:
            made, refused = run_rounds(kind, *args, count=count, rounds=rounds)
            figures["rounds"] += made
            figures["refused"] += sum(refused.values())
        written, failure = unrenamed_files(small, 4 * memory_bytes // TEMPORARY_PAGE)
        figures["files before ENOSPC"] += written if failure == errno.ENOSPC else 0
        figures["files failed otherwise"] += failure not in (errno.ENOSPC, None)
        asked = [f"{rel}/{key}" for key in keys] + [f"{big.relative_to(mount.path)}/{k}" for k in big_keys[:4096]]
        figures["evicted"] += exists_query(mount.path, asked).count("0")
        for i in range(written):
            os.unlink(small / f".unrenamed-{i}")
        ended = time.monotonic()
    finally:
        samples = probe.finish()
    took = during(samples, started, ended)
    figures["requests"] += len(took)
    figures["slow"] += sum(t > SLOW_S for t in took)
    figures["p99_us"] = round(percentile(took, 0.99) * 1e6)
    return figures
