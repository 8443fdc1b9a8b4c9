"""Which version of a page a reader may still get: the stress modes' judge of stale, torn and
foreign reads.

Why: a read that began after a replace (or a removal) was acknowledged must never give a
version older than that one; saying so needs the writers' acknowledgements and the readers'
start times on one clock (``CLOCK_MONOTONIC``, which every process of the host shares), judged
after the run, when both are complete. ``VersionLog`` keeps the acknowledgements, ``verdict``
says what a page read is.

Pages carry ``workload.labelled_content(key, size, writer, gen)``: ``gen`` is the version,
``writer`` the pool the page belongs to (so a page of another pool's key shows too).

Thread-safe: ``acked`` and ``floor`` may be called from any thread.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

from hicachefs_testing.workload import _MAGIC, claimed, identify

#: What a page read can be, besides right.
TORN, FOREIGN, STALE = "torn", "foreign", "stale"


class VersionLog:
    """Per key, the versions acknowledged and when. A removal is acknowledged as the version
    after the last one written: nothing older may be read once it returned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: dict[str, list[int]] = defaultdict(list)
        self._floors: dict[str, list[int]] = defaultdict(list)  # the newest acknowledged so far

    def acked(self, key: str, version: int, at_ns: int) -> None:
        """``version`` of ``key`` (or anything newer) is what reads begun after ``at_ns`` see."""
        with self._lock:
            times, floors = self._times[key], self._floors[key]
            at = bisect.bisect_right(times, at_ns)
            times.insert(at, at_ns)
            floors.insert(at, max(version, floors[at - 1] if at else -1))
            for later in range(at + 1, len(floors)):  # only when acknowledged out of order
                floors[later] = max(floors[later], floors[at])

    def floor(self, key: str, began_ns: int) -> int:
        """The oldest version a read of ``key`` begun at ``began_ns`` may give (-1: any)."""
        with self._lock:
            times = self._times.get(key, [])
            at = bisect.bisect_left(times, began_ns)
            return self._floors[key][at - 1] if at else -1


def verdict(data: bytes, key: str, writer: int, floor: int) -> str | None:
    """None when ``data`` is a whole write of ``key`` by ``writer`` no older than ``floor``;
    else ``FOREIGN`` (its label names another key or writer), ``STALE`` or ``TORN``."""
    who = identify(data, key)
    if who is not None:
        return FOREIGN if who.writer != writer else STALE if who.gen < floor else None
    if claimed(data, key) is None and data[:len(_MAGIC)] == _MAGIC:
        return FOREIGN  # a label, not this key's
    return TORN
