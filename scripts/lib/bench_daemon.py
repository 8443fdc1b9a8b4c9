"""What ``bench.py`` measures of a hicachefs daemon: the FUSE requests it counted and the CPU time
it used over a stretch of the bench; not a benchmark by itself. With the data plane, a client's
reads ask the daemon nothing (their reports come in one request per batch, every 0.5 s) and a
batch of writes costs it one request: what the bench shows is what is left.

The requests come from ``.hicachefs/stats`` (``requests``), whose own read is a few requests
(an OPEN, two READs, a RELEASE, a GETATTR when the kernel's attributes have expired) and about
0.3 ms of the daemon's CPU time: what a read costs is measured at the start, and taken off again
for every read made here. The CPU time is the kernel's count for the daemon's process and the
processes it started (all their threads), to the nanosecond (``clock_gettime`` of each
process's CPU clock; ``/proc/PID/stat`` counts only in 10 ms ticks, coarser than a call of 8
small pages).

Not thread-safe: one bench thread uses it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

from hicachefs_testing import mounting

# Reads of the stats file whose cost (requests, CPU time) is measured at the start.
OWN_READS = 16
# How often, and for at most how long, the daemon's hit count is polled until it has counted
# every page of a read pass (plane reads are reported up to 0.5 s later, unless the bench asks
# the client to report them at once).
HITS_POLL_S, HITS_TIMEOUT_S = 0.1, 5.0


def request_delta(before: dict, after: dict) -> Dict[str, int]:
    b, a = before.get("requests", {}), after.get("requests", {})
    return {op: a[op] - b.get(op, 0) for op in a if a[op] - b.get(op, 0)}


def _cpu_clock(pid: int) -> int:
    """The clock id of a process's CPU time (Linux: CPUCLOCK_SCHED of the whole process)."""
    return (~pid << 3) | 2


@dataclass
class Mark:
    """Where the daemon's counters stood at the start of a stretch."""

    stats: dict
    cpu: float
    reads: int


class Daemon:
    """One mount's daemon, as the bench measures it. See the module docstring."""

    def __init__(self, mount: mounting.Mount) -> None:
        self.mount = mount
        self.reads = 0
        self.stats()  # the first read also looks the control files up
        cpu = self.cpu()
        reads = [self.stats() for _ in range(OWN_READS + 1)]
        self.own_cpu = (self.cpu() - cpu) / len(reads)
        deltas = [request_delta(a, b) for a, b in zip(reads, reads[1:])]
        # What every read costs (a GETATTR comes only when the kernel's attributes expire).
        self.own = {op: min(d.get(op, 0) for d in deltas) for op in deltas[0]}

    def stats(self) -> dict:
        self.reads += 1
        return self.mount.stats()

    def cpu(self) -> float:
        """CPU seconds used by the daemon and the processes it started, all threads."""
        return _cpu_seconds(self.mount.pid) + sum(_cpu_seconds(pid) for pid in self._children())

    def _children(self) -> list[int]:
        children = Path(f"/proc/{self.mount.pid}/task/{self.mount.pid}/children")
        try:
            return [int(p) for p in children.read_text().split()]
        except OSError:
            return []

    def mark(self) -> Mark:
        return Mark(self.stats(), self.cpu(), self.reads)

    def since(self, mark: Mark) -> Tuple[Dict[str, int], float]:
        """(requests by kind, CPU seconds) since ``mark``, less what the stats reads made here
        cost."""
        delta = request_delta(mark.stats, self.stats())
        reads = self.reads - mark.reads
        cpu = max(0.0, self.cpu() - mark.cpu - reads * self.own_cpu)
        for op, n in self.own.items():
            delta[op] = delta.get(op, 0) - n * reads
        return {op: n for op, n in delta.items() if n > 0}, cpu

    def wait_for_hits(self, mark: Mark, pages: int) -> bool:
        """Wait until the daemon has counted at least ``pages`` reads since ``mark`` (hits;
        the client reports its plane reads every half second): whether it did."""
        deadline = time.monotonic() + HITS_TIMEOUT_S
        while self.stats()["hits"] - mark.stats["hits"] < pages:
            if time.monotonic() > deadline:
                return False
            time.sleep(HITS_POLL_S)
        return True


def _cpu_seconds(pid: int) -> float:
    try:
        return time.clock_gettime(_cpu_clock(pid))
    except OSError:  # a child that has just ended
        return 0.0


def config_line(mount: mounting.Mount) -> str:
    """The mount's effective configuration, minus what only names this run's paths."""
    config = json.loads((mount.path / ".hicachefs" / "config").read_text())
    shown = {k: v for k, v in config.items()
             if k not in ("pid", "mountpoint", "log_file", "disk_dir")}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


def print_log_tail(mount: mounting.Mount, lines: int = 40) -> None:
    print(f"mount {mount.path}: {'mounted' if mounting.is_mounted(mount.path) else 'NOT mounted'}"
          f", daemon {mount.pid} {'alive' if mounting.alive(mount.pid) else 'gone'}; daemon log "
          f"{mount.log_file} (last {lines} lines):", file=sys.stderr)
    print("\n".join(mount.log_text().splitlines()[-lines:]), file=sys.stderr)
