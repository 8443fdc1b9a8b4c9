"""Tells the kernel what changed behind its back, from a thread of its own.

The kernel caches entries, attributes and (for published pages) data. Most changes reach it
through the requests it sends itself, but a page the store evicts or drops, and the data of a
page just published, do not. pyfuse3's notifications for those can block, or deadlock when
sent from a request handler while the kernel holds a lock that handler's request needs, so
they are queued here and sent by one worker thread, in order:

- ``push``: a published page's bytes into the kernel's page cache (``notify_store``), so the
  first read of a new page is served from memory. Bounded by the bytes queued: past the
  budget a push is skipped (that page's first read fills the cache the usual way).
- ``forget_entry``: a name no longer names a page (``invalidate_entry``).
- ``forget_inode``: an inode's cached attributes and data are stale (``invalidate_inode``).
- ``forget_attributes``: only its attributes are (a replaced page's inode: its data is still
  that of the version it stands for, which readers that have it open go on reading).

A request that changed what a name means without the kernel seeing it (a page published through
the ingest file replacing another) is answered only once the kernel has been told (``delivered``):
a reader told "replaced" by the writer must never find the old page in the kernel's cache after.

A notification may wait for a lock of the kernel's that a request of another process holds (an
invalidation of a name waits for its directory, which a lookup in flight holds), so nothing is
sent once the daemon stops reading requests: that lookup would never be answered, the
notification never return, and the mount would hang for good, its daemon unkillable. The
session's end is announced first (``close_session``): what is queued then is still sent, while
requests are still read; what comes after is dropped (the unmount that follows makes the kernel
forget the mount's caches anyway); ``stop`` drops whatever is left unsent.

Thread-safe: any thread may queue; the kernel calls happen in the worker thread only;
``delivered`` is awaited on the trio thread.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
from collections import Counter
from dataclasses import dataclass

import pyfuse3
import trio

from ..store import PageReader
from ..store.budget import Share
from ..typed_stats import level, total

log = logging.getLogger(__name__)

_STOP = object()
#: Errors that only mean the kernel no longer knows what we tell it about.
_FORGOTTEN = {errno.ENOENT, errno.ENOTCONN, errno.EBADF}
#: The longest a request waits for the kernel to be told (``delivered``): the kernel answers a
#: notification within microseconds unless something is badly wrong, which is then logged.
DELIVERY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class KernelCacheStatistics:
    """What the kernel was told: pages pushed into its cache (and skipped, past the budget),
    names and inodes it was told to forget, notifications that failed; bytes queued to push."""

    pushes: int = total()
    pushes_skipped: int = total()
    entries_invalidated: int = total()
    inodes_invalidated: int = total()
    notify_failures: int = total()
    push_queue_bytes: int = level()


class KernelNotifier:
    """A queue of kernel cache notifications and the thread that sends them."""

    def __init__(self, pushes: Share) -> None:
        """``pushes``: the RAM budget's share the pages queued to be pushed may hold (they stay
        pinned in the RAM tier until pushed)."""
        self.pushes = pushes
        self.counters: Counter[str] = Counter()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # notifications queued, ever
        self._sent = 0  # of those, sent to the kernel (or given up on)
        self._waiters: list[tuple[int, trio.Event, trio.lowlevel.TrioToken]] = []
        self._closing = False  # the session is ending: nothing more is queued
        self._stopping = False  # requests are no longer read: nothing more is sent
        self._thread = threading.Thread(target=self._run, name="kernel-notifier", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close_session(self) -> None:
        """Requests will soon no longer be read: what is queued from now on is dropped. Await
        ``delivered`` then, while they still are, for what was queued before."""
        with self._lock:
            self._closing = True

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread, dropping what it has not sent (requests are no longer read: see the
        module docstring); it must run before the session closes."""
        with self._lock:
            self._closing = self._stopping = True
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the kernel notifier did not finish within %.0f s", timeout)
        while True:  # release what was never sent
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._drop(item)
        self._advance(sent=self._queued)  # nothing more will be sent: nobody waits for it

    async def delivered(self) -> None:
        """Wait until every notification queued so far has reached the kernel."""
        with self._lock:
            if self._sent >= self._queued:
                return
            event = trio.Event()
            self._waiters.append((self._queued, event, trio.lowlevel.current_trio_token()))
        with trio.move_on_after(DELIVERY_TIMEOUT_S) as waited:
            await event.wait()
        if waited.cancelled_caught:
            log.warning("the kernel was not told of a change within %.0f s; answering anyway",
                        DELIVERY_TIMEOUT_S)

    def _put(self, item: tuple) -> None:
        with self._lock:  # counted and queued in one step: the thread sends them in that order
            if not self._closing:
                self._queued += 1
                self._queue.put(item)
                return
        self._drop(item)

    def _drop(self, item: tuple) -> None:
        """A notification that will not be sent: a push gives its bytes back."""
        if item[0] == "push":
            with self._lock:
                self.pushes.give_back(item[2].size)
            item[2].close()

    def _advance(self, sent: int) -> None:
        """``sent`` notifications have reached the kernel: wake who waited for them."""
        with self._lock:
            self._sent = sent = max(self._sent, sent)  # (``stop`` may have counted all already)
            ready = [w for w in self._waiters if w[0] <= sent]
            self._waiters = [w for w in self._waiters if w[0] > sent]
        for _, event, token in ready:
            try:
                token.run_sync_soon(event.set)
            except trio.RunFinishedError:
                pass

    def push(self, inode: int, reader: PageReader) -> bool:
        """Queue the page's bytes for ``inode``'s page cache; the reader is closed once sent."""
        with self._lock:
            skip = not self.pushes.take(reader.size)
            if skip:
                self.counters["pushes_skipped"] += 1
        if skip:
            reader.close()
            return False
        self._put(("push", inode, reader))
        return True

    def forget_entry(self, parent_inode: int, name: bytes) -> None:
        self._put(("entry", parent_inode, name))

    def forget_inode(self, inode: int) -> None:
        self._put(("inode", inode, False))

    def forget_attributes(self, inode: int) -> None:
        self._put(("inode", inode, True))

    def statistics(self) -> KernelCacheStatistics:
        with self._lock:
            return KernelCacheStatistics(**self.counters, push_queue_bytes=self.pushes.held)

    def _run(self) -> None:
        sent = 0
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._stopping:
                self._drop(item)
            else:
                self._send(*item)
            sent += 1
            self._advance(sent)

    def _send(self, kind: str, inode: int, arg) -> None:
        """One notification to the kernel; a failure is counted, never raised."""
        try:
            if kind == "push":
                self._push(inode, arg)
            elif kind == "entry":
                pyfuse3.invalidate_entry(inode, arg)
                self._count("entries_invalidated")
            else:
                pyfuse3.invalidate_inode(inode, attr_only=arg)
                self._count("inodes_invalidated")
        except OSError as exc:
            if exc.errno not in _FORGOTTEN:
                log.warning("kernel notification %s(%s) failed: %s", kind, inode, exc)
                self._count("notify_failures")
        except Exception:  # never let the thread die: later notifications still matter
            log.exception("kernel notification %s(%s) failed", kind, inode)
            self._count("notify_failures")

    def _push(self, inode: int, reader: PageReader) -> None:
        try:
            pyfuse3.notify_store(inode, 0, reader.view())
            self._count("pushes")
        finally:
            with self._lock:
                self.pushes.give_back(reader.size)
            reader.close()

    def _count(self, what: str) -> None:
        with self._lock:
            self.counters[what] += 1
