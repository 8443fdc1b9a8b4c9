"""How long other hosts' files stayed unchanged, by this host's own clock.

The tier removes the files of writers that died once they are old. Their mtimes are their
writers' wall clocks, or their servers', and this host's wall clock may be apart from those by
hours, or step: judged by it, a file written right now passed for an hour old on a host ahead
and was removed under its writer, and a dead writer's file stayed for the size of a backward
step. So a file's age is what this host saw of it: the time on its monotonic clock since the
look that last found the file's size or mtime changed, or first found the file. A file written
between two looks is never old; one left unchanged goes ``keep_s`` after this host first saw it
so, whatever the clocks say. One whose mtime is ``STALE_S`` (a day) behind this host's wall
clock is old once a second look finds it unchanged (a file seen changing is live, whatever its
writer's clock: found by review): daemons that each lived less than ``keep_s`` (per-job mounts,
a crash loop) never saw a file stay unchanged that long, and dead writers' files piled up, each
opened again at every poll (found by review). A day is past any clock's skew or step here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from hicachefs.store.shared.device import Entry

#: How far behind this host's wall clock a file's mtime makes it old at once, in seconds.
STALE_S = 86400.0


class Unchanged:
    """The files of one listing, each with when this host last saw it change."""

    def __init__(self, keep_s: float) -> None:
        self._keep_s = keep_s
        self._seen: dict[str, tuple[int, int, float]] = {}  # name -> size, mtime_ns, monotonic time of the change

    def old(self, entries: Iterable[Entry]) -> list[str]:
        """The names among ``entries`` (this look's listing) whose size and mtime stayed the
        same at every look for ``keep_s``, or since the last look with a stale mtime; a name
        not in the listing is forgotten."""
        now, stale_ns = time.monotonic(), time.time_ns() - int(STALE_S * 1e9)
        seen, self._seen = self._seen, {}
        old = []
        for entry in entries:
            size, mtime_ns, since = seen.get(entry.name, (entry.size, entry.mtime_ns, now))
            if (size, mtime_ns) != (entry.size, entry.mtime_ns):
                since = now
            self._seen[entry.name] = (entry.size, entry.mtime_ns, since)
            if now - since >= self._keep_s or (since < now and entry.mtime_ns < stale_ns):
                old.append(entry.name)
        return old
