"""How a start shows the RAM tier being filled and the disk index being rebuilt, the daemon's
side: the log, and the pipe to the ``hicachefs mount`` that started the daemon and waits for the
mount meanwhile.

``Reporter`` is the store's recovery listener. It logs that a fill or a scan starts (for a scan,
why no snapshot served), its progress (the share done, the time left) every ``LOG_EVERY_S``, and
the outcome (a snapshot load is the outcome alone: one line, pages and seconds); and it writes
the same texts to a pipe that ``hicachefs mount`` handed down (its number is the daemon's second
argument), the progress every ``SEND_EVERY_S``. Each message is one JSON line,
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
    """One line for a report. The progress is short (for a scan: pages found, share done, time
    left), to fit a terminal's line after the line that said what runs and why."""
    if progress.method == "snapshot":
        return f"loaded the disk index from its snapshot: {progress.pages:,} pages in {progress.seconds:.2f} s"
    filling = progress.method == "fill"
    if progress.finished:
        return (f"filled the RAM tier's {_memory(progress)} of memory in {progress.seconds:.1f} s" if filling
                else f"scanned the disk arena: {progress.pages:,} pages in {progress.seconds:.1f} s")
    if progress.scanned_bytes == 0:
        return (f"filling the RAM tier's {_memory(progress)} of memory before the mount serves" if filling
                else f"rebuilding the disk index by scanning the arena: {progress.reason}")
    return (f"filling memory: {_how_far(progress)}" if filling
            else f"scanning: {progress.pages:,} pages found, {_how_far(progress)}")


def _memory(progress: RecoveryProgress) -> str:
    gib = progress.total_bytes / (1 << 30)
    return f"{gib:.1f} GiB" if gib >= 1 else f"{progress.total_bytes >> 20} MiB"


def _how_far(progress: RecoveryProgress) -> str:
    """The share done and the time left, at the pace so far."""
    share = progress.scanned_bytes / progress.total_bytes
    left = progress.seconds * (1 - share) / share
    if left < 60:
        return f"{share:.0%} done, about {left:.0f} s left"
    minutes, seconds = divmod(round(left), 60)
    return f"{share:.0%} done, about {minutes} min {seconds:02d} s left"


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
