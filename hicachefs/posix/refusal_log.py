"""The log lines of refused requests, a few per kind and user, and the count of every one.

Why: every refusal logged a WARNING, so any user could grow the daemon's log without bound by
asking for what it may not have (a plain user's exists storms: a line for each of its ENOBUFS
writes). Here the first refusal of a kind (its errno, or a bug's) to one user is logged, and
then at most one line of that kind and user every ``INTERVAL_S``, which says how many like it
were not. Every refusal is counted all the same, by user and kind (``RefusalCounts``); so is
every line not logged.

Not thread-safe: the trio thread of the process holding the store only.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Seconds between two lines of one kind of refusal to one user.
INTERVAL_S = 10.0
#: The user of a request that does not say whose it is.
UNKNOWN_USER = "unknown"
#: What ``str.splitlines`` breaks a line at: C0 and C1 controls, the line and paragraph separators.
_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class RefusalCounts:
    """``by_user``: refusals by their sender's uid (``UNKNOWN_USER`` where the request does not
    say) and kind (the errno's name, or ``internal`` for a bug answered EIO); ``not_logged``:
    those of them that made no log line."""

    by_user: dict[str, dict[str, int]] = field(default_factory=dict)
    not_logged: int = 0


class RefusalLog:
    """Counts refusals and logs a few of them. See the module docstring."""

    def __init__(self, log: logging.Logger, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.interval_s = interval_s
        self.clock = clock
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._logged_at: dict[tuple[str, str], float] = {}
        self._held: collections.Counter[tuple[str, str]] = collections.Counter()  # since its last line
        self._not_logged = 0

    def refused(self, kind: str, uid: int | None, level: int, message: str, *args, **details) -> None:
        """Count a refusal of ``kind`` to ``uid``, and log ``message % args`` at ``level`` (with
        ``details``, such as ``exc_info``) if that kind and user may have a line now."""
        key = (kind, UNKNOWN_USER if uid is None else str(uid))
        self._counts[key] += 1
        now = self.clock()
        last = self._logged_at.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] += 1
            self._not_logged += 1
            return
        self._logged_at[key] = now
        args = tuple(_one_line(arg) for arg in args)
        held = self._held.pop(key, 0)
        if held:
            message += " [uid %s; %d more %s like it not logged in the last %.0f s]"
            args = (*args, key[1], held, kind, now - last)
        else:
            message += " [uid %s]"
            args = (*args, key[1])
        self.log.log(level, message, *args, **details)

    def statistics(self) -> RefusalCounts:
        by_user: dict[str, dict[str, int]] = {}
        for (kind, uid), count in sorted(self._counts.items()):
            by_user.setdefault(uid, {})[kind] = count
        return RefusalCounts(by_user, self._not_logged)


def _one_line(arg):
    """A text argument (or an error, by its text) with its control characters and line
    separators escaped (those ``str.splitlines`` breaks at, C1 and U+2028 too): a reason often
    names the page, and a name holding a newline started a forged line of its own (found by
    review)."""
    if not isinstance(arg, (str, BaseException)):
        return arg
    return _BREAKS.sub(lambda control: control[0].encode("unicode_escape").decode("ascii"), str(arg))
