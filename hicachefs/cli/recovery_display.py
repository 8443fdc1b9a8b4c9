"""How a start shows the RAM tier being filled and the disk index being rebuilt, the command's
side: on the terminal of the ``hicachefs mount`` that waits for the mount.

``Display`` reads what the daemon's ``Reporter`` (``daemon/recovery_reporter.py``) writes to the
pipe, one JSON line a message, and is polled by ``hicachefs mount`` while it waits. The start
and the outcome are lines of their own; on a terminal the progress is one line redrawn in
place (a carriage return, cut to the terminal's width), elsewhere (a log, a pipe) a line every
``PRINT_EVERY_S``. It never waits on the daemon: its end of the pipe is non-blocking. Used from
one thread.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import TextIO

PRINT_EVERY_S = 5.0


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
        self.heard = time.monotonic()  # when the daemon last said how its start goes

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
            self.heard = time.monotonic()
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
