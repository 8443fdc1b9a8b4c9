"""How a start shows the disk index being rebuilt, the daemon's side: the log, and the pipe to
the ``hicachefs mount`` that started the daemon and waits for the mount meanwhile.

``Reporter`` is the store's recovery listener. It logs that a scan starts and why (why no
snapshot served), its progress (pages found, the time left) every ``LOG_EVERY_S``, and the
outcome (a snapshot load is the outcome alone: one line, pages and seconds); and it writes the
same texts to a pipe that ``hicachefs mount`` handed down (its number is the daemon's second
argument), a scan's progress every ``SEND_EVERY_S``. Each message is one JSON line,
``{"text": ..., "kind": "note" | "progress" | "done"}``; the command side
(``cli/recovery_display.py``) shows them.

The pipe is non-blocking on this side, so a command that stopped reading costs updates, not
start time, and a command that is gone (EPIPE) ends the reporting. Used from one thread.
"""

from __future__ import annotations

import json
import logging
import os
import time

from ..store.tier import RecoveryProgress

log = logging.getLogger(__name__)

LOG_EVERY_S = 5.0
SEND_EVERY_S = 0.25


def describe(progress: RecoveryProgress) -> str:
    """One line for a report. A scan's progress is short (pages found, share done, time left),
    to fit a terminal's line after the line that said why the arena is scanned."""
    if progress.method == "snapshot":
        return f"loaded the disk index from its snapshot: {progress.pages:,} pages in {progress.seconds:.2f} s"
    if progress.finished:
        return f"scanned the disk arena: {progress.pages:,} pages in {progress.seconds:.1f} s"
    if progress.scanned_bytes == 0:
        return f"rebuilding the disk index by scanning the arena: {progress.reason}"
    share = progress.scanned_bytes / progress.total_bytes
    left = progress.seconds * (1 - share) / share
    return f"scanning: {progress.pages:,} pages found, {share:.0%} done, about {_duration(left)} left"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s"


class Reporter:
    """The daemon's recovery listener: logs, and tells the waiting command through ``fd`` (or
    nobody, when None). ``close`` when the store is open."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        if fd is not None:
            os.set_blocking(fd, False)
        self._logged = self._sent = float("-inf")

    def __call__(self, progress: RecoveryProgress) -> None:
        text = describe(progress)
        now = time.monotonic()
        milestone = progress.finished or progress.scanned_bytes == 0
        # The start and the outcome always go out; in between, the first report of a scan's
        # progress at once, then one per interval.
        if milestone or now - self._logged >= LOG_EVERY_S:
            log.info("%s", text)
            if not milestone:
                self._logged = now
        if milestone or now - self._sent >= SEND_EVERY_S:
            kind = "done" if progress.finished else "note" if milestone else "progress"
            self._send({"text": text, "kind": kind})
            if not milestone:
                self._sent = now

    def _send(self, message: dict) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, (json.dumps(message) + "\n").encode())
        except BlockingIOError:
            pass  # the command is not reading right now: it gets the next one
        except OSError:  # the command is gone
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
