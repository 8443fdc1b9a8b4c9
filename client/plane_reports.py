"""Reads made through the data plane, reported to the daemon in batches by a thread of their own
(``plane.py``), so that hits and recency stay right: a report may lag, it is never dropped while
the mount works.

Thread-safe.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import List, Optional, Protocol, Tuple

from . import forks

Read = Tuple[int, int]  # a read as reported: the index row and its gen
#: The row of a read noted that found no page (a miss): the report carries their number.
MISSED = 0xFFFFFFFF
Noted = Tuple[bytes, int, int]  # a read as noted: the token of the daemon it was read from, row, gen
#: Reads are reported this often (seconds), or at this many.
REPORT_INTERVAL_S = 0.5
MAX_REPORT = 4096
#: At the interpreter's exit, what is left is sent for at most this long (a daemon that does
#: not answer must not hold the process).
EXIT_SEND_S = 2.0


class Reporter(Protocol):
    """What the reports go to: the plane."""

    def report(self, reads: List[Noted]) -> None: ...

    def let_go_if_gone(self) -> bool: ...


class Reports:
    """Reads made through the plane, gathered and sent to the daemon by a thread of its own.
    The thread also lets go of an attachment whose daemon is gone, so that an idle client does
    not keep its memory; it ends once there is neither an attachment nor a read to send."""

    def __init__(self, plane: Reporter) -> None:
        self.plane = plane
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._sending = threading.Lock()  # held from taking reads to their report: one sender at a time
        self._reads: List[Noted] = []
        self._thread: Optional[threading.Thread] = None
        self._asked = 0  # ``start`` calls: one made while the thread decides to end keeps it
        forks.renew_in_child(self)
        _ALL.add(self)  # the reporter thread dies with the interpreter: its exit sends the rest

    def forked(self) -> None:
        """In a forked child: the reads noted are the parent's to report, its thread stayed behind."""
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._sending = threading.Lock()
        self._reads, self._thread = [], None

    def note(self, token: bytes, reads: List[Read], misses: int = 0) -> None:
        """A batch's reads from the daemon of ``token``, and how many of its pages it found none
        for, to be reported (to that daemon only: the next one numbers its rows afresh)."""
        noted = [(token, row, gen) for row, gen in reads] + [(token, MISSED, 0)] * misses
        with self._lock:
            self._reads += noted
            self._running()  # a forked child's first reads, or the thread just ended
            if len(self._reads) >= MAX_REPORT:
                self._due.notify()

    def start(self) -> None:
        """The plane attached: the thread runs (to let go of the attachment once its daemon is
        gone, even with nothing to report)."""
        with self._lock:
            self._asked += 1
            self._running()

    def _running(self) -> None:
        """Start the thread if none runs (under the lock)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="hicachefs-plane", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._due.wait_for(lambda: len(self._reads) >= MAX_REPORT, REPORT_INTERVAL_S)
            with self._sending:
                with self._lock:
                    reads, self._reads = self._reads[:MAX_REPORT], self._reads[MAX_REPORT:]
                    asked = self._asked
                if reads:
                    self.plane.report(reads)
            held = self.plane.let_go_if_gone()
            with self._lock:
                # Ends with nothing to hold or send, unless the plane attached again meanwhile.
                if not held and not self._reads and self._asked == asked:
                    self._thread = None
                    return

    def send_now(self) -> None:
        """Send what was not sent yet, once the thread has sent what it took: ``close`` returns
        with every read noted before it reported, while the plane it closes still sends."""
        with self._sending:
            with self._lock:
                reads, self._reads = self._reads, []
            for start in range(0, len(reads), MAX_REPORT):
                self.plane.report(reads[start : start + MAX_REPORT])


#: Every live ``Reports``, sent at the interpreter's exit (a process that never calls ``close``).
_ALL: "weakref.WeakSet[Reports]" = weakref.WeakSet()


def _send_at_exit() -> None:
    """Send the reads left unreported: a process may end without ``close`` (SGLang's ranks do),
    and the reporter is a daemon thread, which dies with the interpreter. On a thread of its
    own, waited for at most ``EXIT_SEND_S``."""
    pending = [reports for reports in list(_ALL) if reports._reads]
    if not pending:
        return

    def send() -> None:
        for reports in pending:
            reports.send_now()

    sender = threading.Thread(target=send, name="hicachefs-plane-exit", daemon=True)
    try:
        sender.start()
    except RuntimeError:  # Python 3.12+ starts no thread at the interpreter's shutdown
        send()
        return
    sender.join(EXIT_SEND_S)


atexit.register(_send_at_exit)
