"""Page files kept open between reads, so that a page read again costs the daemon nothing.

Published pages are immutable and the kernel keeps their bytes in its page cache, so a page
file kept open is read again with one ``preadv`` in the caller's own thread: no request reaches
the daemon (an open and a close of the file would cost it two, and that one daemon thread is
every rank's). Measured on the 2-core development VM, 1 MiB pages read again: 9-13 GB/s through
kept files against 4-5 GB/s with an open and close each, and 3.5 GB/s through the fetch file.

A page is kept once it is read a second time: reads go through the fetch file (one request per
MiB; opening every page would be three) until a page is read again, and then its file is
opened and read once by a thread of its own (``warm``), off the caller's path: that read fills
the kernel's page cache, and the file is kept for the reads after. Pages read through the
fetch file are remembered for that (a bounded set of path hashes).

Reads through kept files never reach the daemon, so it would not know those pages are hot and
could evict them first; they are reported to it in batches (``note_reads``: at most every half
second, through ``report``, from the same background thread), as reads it counts like its own.

A kept file is checked before each read with ``fstat``, which the kernel answers from its
cache: the daemon drops those cached attributes when what the name means changes (a replace,
an unlink, an eviction), and the next ``fstat`` then shows a changed page (unlinked, another
size or publish time) and the file is let go. At most ``capacity`` files are kept (least
recently read first out).

Thread-safe: any thread may read through any kept file; a file is closed only once no thread
is reading through it (closing it under a reader would let the descriptor number be reused).
"""

from __future__ import annotations

import collections
import os
import queue
import resource
import threading
import time
from typing import Callable, List, Optional, Sequence

from .vectored import read_into

# Files kept open at most: a quarter of the process's descriptor limit, and no more than this.
MAX_KEPT = 4096
# Pages waiting to be opened and kept; beyond, a page is left to the fetch file.
MAX_WAITING = 1024
# Reads through kept files are reported to the daemon this often (seconds), or at this many.
REPORT_INTERVAL_S = 0.5
MAX_REPORT = 1024


def default_capacity() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(MAX_KEPT, (soft if soft != resource.RLIM_INFINITY else MAX_KEPT * 4) // 4))


class _Kept:
    __slots__ = ("fd", "identity", "users", "closing")

    def __init__(self, fd: int, identity: tuple) -> None:
        self.fd, self.identity = fd, identity
        self.users = 0
        self.closing = False


def _identity(st: os.stat_result) -> Optional[tuple]:
    """What tells the page a kept file holds from another version under its name; None when the
    file's page is no longer the name's (``st_nlink`` 0: replaced, removed or evicted)."""
    return (st.st_ino, st.st_size, st.st_mtime_ns) if st.st_nlink > 0 else None


class PageFiles:
    """The kept page files of one mount. See the module docstring."""

    def __init__(self, capacity: int, report: Callable[[List[str]], None]) -> None:
        """``report(names)``: tell the daemon about reads of these pages through kept files."""
        self.capacity = capacity
        self.report = report
        self._reads: List[str] = []
        self._lock = threading.Lock()
        self._kept: "collections.OrderedDict[str, _Kept]" = collections.OrderedDict()
        self._seen: "collections.OrderedDict[int, None]" = collections.OrderedDict()
        self._waiting: "queue.Queue[tuple[str, int]]" = queue.Queue(MAX_WAITING)
        self._keeping = 0  # pages queued to be kept, or being kept now
        self._warmer: Optional[threading.Thread] = None
        self._pid = os.getpid()

    def read(self, path: str, buffers: Sequence[memoryview], size: int) -> Optional[bool]:
        """Read the page through its kept file: True when read whole, None when no file is kept
        for it (or the kept one no longer holds that page: it is let go)."""
        if not self._kept:  # nothing kept (a plain read of the dict: no lock needed to see that)
            return None
        with self._lock:
            kept = self._kept.get(path)
            if kept is None:
                return None
            self._kept.move_to_end(path)
            kept.users += 1
        try:
            still = _identity(os.fstat(kept.fd)) == kept.identity  # never None: see keep
            if still:
                done = read_into(kept.fd, buffers)
                still = done == size
        except OSError:
            still = False
        finally:
            self._done_with(kept, drop=None)
        if not still:
            self.forget(path)
            return None
        return True

    def keep(self, path: str, fd: int, st: os.stat_result) -> bool:
        """Keep ``fd`` (the open page file at ``path``, with ``st`` its fstat) for later reads;
        False when it is not kept (the caller closes it): a file already kept for the path, or
        one whose page the name no longer leads to (its open raced a replace), which would
        otherwise match its own identity for good."""
        identity = _identity(st)
        with self._lock:
            if path in self._kept or identity is None:
                return False
            self._kept[path] = _Kept(fd, identity)
            excess = [self._kept.popitem(last=False)[1] for _ in range(len(self._kept) - self.capacity)]
        for old in excess:
            self._done_with(old, drop=True)
        return True

    def __len__(self) -> int:
        """How many page files are kept open."""
        return len(self._kept)

    def keeping(self) -> int:
        """How many pages are waiting to be opened and kept, or being kept now."""
        return self._keeping

    def forget(self, path: str) -> None:
        with self._lock:
            kept = self._kept.pop(path, None)
        if kept is not None:
            self._done_with(kept, drop=True)

    def forget_under(self, directory: str) -> None:
        """Let go of every kept file below ``directory`` (it is being removed)."""
        prefix = directory.rstrip("/") + "/"
        with self._lock:
            gone = [path for path in self._kept if path.startswith(prefix)]
        for path in gone:
            self.forget(path)

    def seen_before(self, paths: Sequence[str]) -> list[bool]:
        """Per path, whether it was read lately without being kept (a batch's first reads)."""
        with self._lock:
            return [hash(path) in self._seen for path in paths]

    def remember(self, paths: Sequence[str]) -> None:
        with self._lock:
            for path in paths:
                self._seen[hash(path)] = None
                self._seen.move_to_end(hash(path))
            while len(self._seen) > 4 * self.capacity:
                self._seen.popitem(last=False)

    def note_reads(self, names: Sequence[str]) -> None:
        """These pages were read through kept files: report them soon."""
        with self._lock:
            self._reads.extend(names)
            full = len(self._reads) >= MAX_REPORT
        self._start()
        if full:
            self._waiting.put(("", 0))  # wake the thread: a report is due

    def warm(self, paths: Sequence[str], size: int) -> None:
        """Open, read and keep these page files in the background (they were read before)."""
        for path in paths:
            with self._lock:
                self._keeping += 1  # before the thread can take it
            try:
                self._waiting.put_nowait((path, size))
            except queue.Full:
                with self._lock:
                    self._keeping -= 1
                break
        self._start()

    def _start(self) -> None:
        if self._warmer is None or not self._warmer.is_alive() or self._pid != os.getpid():
            with self._lock:
                if self._warmer is None or not self._warmer.is_alive() or self._pid != os.getpid():
                    self._pid = os.getpid()
                    self._warmer = threading.Thread(target=self._warm_pages, name="hicachefs-warm",
                                                    daemon=True)
                    self._warmer.start()

    def _warm_pages(self) -> None:
        scratch = bytearray(0)
        next_report = 0.0
        while True:
            try:
                path, size = self._waiting.get(timeout=REPORT_INTERVAL_S)
            except queue.Empty:
                path, size = "", 0
            if time.monotonic() >= next_report or len(self._reads) >= MAX_REPORT:
                with self._lock:
                    reads, self._reads = self._reads[:MAX_REPORT], self._reads[MAX_REPORT:]
                if reads:
                    self.report(reads)
                next_report = time.monotonic() + REPORT_INTERVAL_S
            if not path:
                continue
            if len(scratch) < size:
                scratch = bytearray(size)
            try:
                self._keep_one(path, memoryview(scratch)[:size])
            finally:
                with self._lock:
                    self._keeping -= 1

    def _keep_one(self, path: str, scratch: memoryview) -> None:
        """Open, read and keep one page file (the warming thread's work)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            done = read_into(fd, [scratch])
            # After the read: a read that reached the daemon makes the kernel ask for the
            # attributes again once, here rather than in the next caller's fstat.
            if done == len(scratch) and self.keep(path, fd, os.fstat(fd)):
                fd = -1
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        """Report the reads not reported yet, and let every kept file go (later reads open them
        again)."""
        with self._lock:
            reads, self._reads = self._reads, []
        for start in range(0, len(reads), MAX_REPORT):
            self.report(reads[start:start + MAX_REPORT])
        with self._lock:
            kept, self._kept = list(self._kept.values()), collections.OrderedDict()
        for entry in kept:
            self._done_with(entry, drop=True)

    def _done_with(self, kept: _Kept, drop: Optional[bool]) -> None:
        """A reader is done (``drop`` None) or the file leaves the set (``drop`` True): close
        it once both have happened."""
        with self._lock:
            if drop is None:
                kept.users -= 1
            else:
                kept.closing = True
            close = kept.closing and kept.users == 0 and kept.fd >= 0
            fd = kept.fd
            if close:
                kept.fd = -1
        if close:
            try:
                os.close(fd)
            except OSError:
                pass
