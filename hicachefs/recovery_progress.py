"""How a start shows the disk index being rebuilt: in the daemon's log, and on the terminal of
the ``hicachefs mount`` that started the daemon and waits for the mount meanwhile.

The daemon side is ``Reporter``, the store's recovery listener. It logs that a scan starts and
why (why no snapshot served), its progress (pages found, the time left) every ``LOG_EVERY_S``,
and the outcome (a snapshot load is the outcome alone: one line, pages and seconds); and it
writes the same texts as JSON lines to a pipe that ``hicachefs mount`` handed down (its number
is the daemon's second argument), a scan's progress every ``SEND_EVERY_S``.

The command side is ``Display``, polled by ``hicachefs mount`` while it waits: the start and
the outcome are lines of their own; on a terminal a scan's progress is one line redrawn in place
(a carriage return, cut to the terminal's width), elsewhere (a log, a pipe) a line every
``PRINT_EVERY_S``.

Neither side ever waits on the other: the daemon's end of the pipe is non-blocking, so a
command that stopped reading costs updates, not start time, and a command that is gone
(EPIPE) ends the reporting. Both are used from one thread.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from typing import TextIO

from .store.ssd_tier import RecoveryProgress

log = logging.getLogger(__name__)

LOG_EVERY_S = 5.0
SEND_EVERY_S = 0.25
PRINT_EVERY_S = 5.0


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


class Display:
    """Shows what the daemon sends through ``fd`` on ``out``; ``poll`` often, ``close`` before
    printing anything else."""

    def __init__(self, fd: int, out: TextIO | None = None) -> None:
        self._fd: int | None = fd
        os.set_blocking(fd, False)
        self._out = out or sys.stdout
        self._terminal = self._out.isatty()
        self._pending = b""
        self._drawn = 0  # length of the progress line drawn in place, 0: none
        self._printed = time.monotonic()  # off a terminal, a scan shorter than the interval prints no progress

    def poll(self) -> None:
        while self._fd is not None:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:  # the daemon closed its end: the index is rebuilt, or it died
                os.close(self._fd)
                self._fd = None
                return
            *lines, self._pending = (self._pending + chunk).split(b"\n")
            for line in lines:
                message = json.loads(line)
                self._show(f"hicachefs: {message['text']}", message["kind"])

    def _show(self, line: str, kind: str) -> None:
        if kind != "progress":  # a line of its own, over the line drawn in place if any
            self._out.write("\r" + line.ljust(self._drawn) + "\n" if self._drawn else line + "\n")
            self._drawn = 0
        elif self._terminal:  # cut to the terminal's width: a wrapped line cannot be redrawn
            line = line[: shutil.get_terminal_size().columns - 1]
            self._out.write("\r" + line.ljust(self._drawn))
            self._drawn = len(line)
        elif time.monotonic() - self._printed >= PRINT_EVERY_S:
            self._out.write(line + "\n")
            self._printed = time.monotonic()
        self._out.flush()

    def close(self) -> None:
        """Show what is left to read, end a line drawn in place, and stop listening."""
        self.poll()
        if self._drawn:
            self._out.write("\n")
            self._drawn = 0
            self._out.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
