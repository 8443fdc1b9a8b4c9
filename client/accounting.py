"""What the client counts and how it reports failures: once per kind, never per page.

Thread-safe: every method may be called from SGLang's several threads at once.
"""

from __future__ import annotations

import errno
import logging
import threading
from typing import Dict

from . import forks

logger = logging.getLogger(__name__)

# Kinds that are a lasting fact of this user, not of the mount's health: only root and the
# daemon's user may change the store (docs/contract.md), so a plain user's every write fails so.
LASTING_KINDS = frozenset({"EACCES", "EPERM"})


def error_kind(exc: BaseException) -> str:
    """``ENOTCONN``, ``ENOSPC``... for an OSError, else the exception's class name."""
    code = getattr(exc, "errno", None)
    if code is not None:
        return errno.errorcode.get(code, f"errno{code}")
    return type(exc).__name__


class FailureLog:
    """Counts failures by kind and logs each kind once, until an operation succeeds again.

    Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = {}
        self._logged: set = set()
        self._sticky: set = set()
        self._failing = False
        forks.renew_in_child(self)

    def forked(self) -> None:
        """In a forked child: a thread of the parent's may have held the lock at the fork."""
        self._lock = threading.Lock()

    def failure(self, kind: str, message: str, *, level: int = logging.WARNING,
                sticky: bool = False) -> None:
        """Count a failure; log it if its kind is new. A ``sticky`` kind is a lasting fact
        (no exists file, a page of the wrong size): logged once for good, never "recovered".
        ``LASTING_KINDS`` always are."""
        sticky = sticky or kind in LASTING_KINDS
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            if sticky:
                first = kind not in self._sticky
                self._sticky.add(kind)
            else:
                self._failing = True
                first = kind not in self._logged
                self._logged.add(kind)
        if first:
            logger.log(level, "hicachefs client: %s (%s; further %s failures are counted, not logged)",
                       message, kind, kind)

    def success(self) -> None:
        if not self._failing:  # the common case: no lock
            return
        with self._lock:
            if not self._failing:
                return
            self._failing = False
            kinds = sorted(self._logged)
            self._logged.clear()
        logger.info("hicachefs client: the mount works again (after %s)", ", ".join(kinds))

    def counts(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Counters:
    """Monotonic counters of the client's traffic. Thread-safe."""

    FIELDS = (
        "hits", "misses", "bytes_read", "pages_written", "pages_skipped", "bytes_written",
        "write_failures", "exists_queries", "exists_paths", "exists_stat_fallbacks",
        "refused_keys", "batches_written", "batches_read",
        "plane_reads", "plane_writes", "plane_retries", "plane_requests",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)
        forks.renew_in_child(self)

    def forked(self) -> None:
        """In a forked child: a thread of the parent's may have held the lock at the fork."""
        self._lock = threading.Lock()

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._values)
