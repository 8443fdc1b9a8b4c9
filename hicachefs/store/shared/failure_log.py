"""The shared tier's warnings of failed writes: the first of a kind at once, then at most one a
minute, which says how many like it were not logged; those held back are said once their
minute is over (``flush_due``, from the tier's maintenance tick) and when the tier closes.

Why: a write of a page file or of the journal that failed was only counted. A daemon that could
not write a shared directory another host's daemon had made (another uid, 0755) wrote no page
and no journal line there, and its log said nothing: only the raw stats showed it. Logged at
every failure, a volume that stays broken would grow the log by a line per page.

Thread-safe: the writers and the maintenance thread call it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

#: Seconds between two lines of one kind of failure.
INTERVAL_S = 60.0


class FailureLog:
    """Logs failures at WARNING, a few of them. See the module docstring."""

    def __init__(self, log: logging.Logger, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._logged_at: dict[str, float] = {}
        self._held: dict[str, int] = {}  # failures of each kind since its last line

    def failed(self, kind: str, message: str, *args) -> None:
        """Log ``message % args`` if a failure of ``kind`` may have a line now; else count it
        for the next line of that kind."""
        with self._lock:
            now = self.clock()
            last = self._logged_at.get(kind)
            if last is not None and now - last < self.interval_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._logged_at[kind] = now
            held = self._held.pop(kind, 0)
        if held:
            message += " (%d more %s failures not logged in the last %.0f s)"
            args = (*args, held, kind, now - last)
        self.log.warning(message, *args)

    def flush_due(self) -> None:
        """Say how many failures of each kind were held back since their last line, where that
        line is a minute old: a storm that stopped had them said only at the close, days later
        (found by review)."""
        with self._lock:
            now = self.clock()
            due = {kind: count for kind, count in self._held.items()
                   if now - self._logged_at[kind] >= self.interval_s}
            for kind in due:  # (its minute not begun again: the next failure is said with its text)
                del self._held[kind]
        for kind, count in sorted(due.items()):
            self.log.warning("shared tier: %d more %s failures not logged in the last %.0f s", count, kind,
                             self.interval_s)

    def close(self) -> None:
        """Say how many failures of each kind were held back since their last line (a storm
        that stopped had them logged nowhere; found by review)."""
        with self._lock:
            held, self._held = self._held, {}
        for kind, count in sorted(held.items()):
            self.log.warning("shared tier: %d more %s failures not logged before the close", count, kind)
