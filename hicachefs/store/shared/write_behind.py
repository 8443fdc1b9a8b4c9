"""Write-behind: published pages are copied to the shared tier behind the client's back.

``offer`` is called on the daemon's event loop at publish and never blocks: it puts the page in
a queue bounded in pages and bytes, or drops it (counted) when the queue is full or the tier
cannot take writes now. The queue is also bounded in time: a page is admitted only while the
queue ahead of it would be written within ``max_lag_s`` at the pace writes have been taking
(a moving average), so a page that is taken reaches the shared tier within about that long of
its publish even when publishing outruns the filesystem; the rest are dropped, not delayed.
Worker threads take pages in order, copy each into a private buffer (reused for the next
page while it is at most twice that page's size; one past ``IDLE_BUFFER_BYTES`` is let go when
the worker waits for work, so one large page leaves no large buffer behind), call ``release``
(the engine keeps the page's RAM slot pinned until then), check the copy against the page's
checksum (the data plane's clients write RAM pages themselves: a page scribbled on in RAM is
dropped and counted, never spread to other hosts), and only then write the copy. So a write
stuck in a hung filesystem holds no engine memory, and the bytes it eventually writes can never
be those of a slot reused meanwhile. ``release`` is called exactly once per offered page,
whatever happens.

Versions of one name land in the order they were offered: a queued page whose name was offered
again is skipped (``superseded``, as is one another host's removal of its name overtook as it
landed), and one whose name another worker is writing waits for that write and is written next
by the same worker. Two workers writing two versions at once could otherwise leave the older on
the tier for good. A page offered and not written (dropped, failed)
is told to ``lost``: an older version of its name may still lie on the tier. Each offer is
numbered (``write`` and ``lost`` are told its number): of two versions of a name, the one offered
later has the higher number, whichever of them is dropped, fails or lands first.

Thread-safe. ``close`` waits for the queue to drain up to a deadline, then drops the rest.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hicachefs.store.budget import Share
from hicachefs.store.shared.guard import Overtaken
from hicachefs.store.pages import page_checksum
from hicachefs.store.pages import PageMeta
from hicachefs.typed_stats import level, total

_log = logging.getLogger(__name__)

WriteFn = Callable[[PageMeta, memoryview, int], None]
#: The largest copy buffer a worker keeps while it has nothing to write.
IDLE_BUFFER_BYTES = 1 << 20


class _Queued:
    __slots__ = ("page", "number", "payload", "release", "offered", "cancelled")

    def __init__(self, page: PageMeta, number: int, payload: memoryview, release: Callable[[], None]) -> None:
        self.page = page
        self.number = number  # the offer's: later offers have higher numbers
        self.payload = payload
        self.release = release
        self.offered = time.monotonic()
        self.cancelled = False  # the page was removed while it was being written


def _release(item: _Queued) -> None:
    item.payload = None
    item.release()


@dataclass(frozen=True)
class WriteBehindStatistics:
    queue_pages: int = level()
    queue_bytes: int = level()
    queue_max_pages: int = level()
    queue_max_bytes: int = level()
    writing: int = level()
    written_behind: int = total()
    written_behind_bytes: int = total()
    dropped: int = total()
    dropped_queue_full: int = total()
    dropped_unavailable: int = total()
    dropped_corrupt: int = total()
    superseded: int = total()
    write_seconds_avg: float = level(0.0)
    write_failures: int = total()
    lag_seconds: float = level(0.0)
    last_lag_seconds: float = level(0.0)
    buffer_bytes: int = level()  # the workers' copy buffers, kept between pages


class WriteBehind:
    def __init__(self, write: WriteFn, accepting: Callable[[], bool], workers: int = 2,
                 max_pages: int = 256, queued: Share | None = None, max_lag_s: float = 1.0,
                 lost: Callable[[PageMeta, int], None] | None = None,
                 removed: Callable[[PageMeta], None] | None = None) -> None:
        """``write(page, payload, number)`` writes one page, offer ``number`` (blocking, raising ``OSError``);
        ``accepting()`` says whether the tier takes writes now; ``queued``: the share of the RAM
        tier the queued pages may hold pinned (256 MiB by default); ``lost(page, number)``: told of each
        offered page that was not written (dropped or failed; not one a later offer of its name
        replaced), without this object's lock held; it must not block. ``removed(page)``: told
        of a page written although ``cancel`` removed its name while it was being written (the
        file just written must go), from the worker thread, without the lock held."""
        self._write = write
        self._lost = lost
        self._removed = removed
        self._accepting = accepting
        self.max_pages = max_pages
        self._bytes = queued or Share("write_behind", 256 << 20)
        self.max_lag_s = max_lag_s
        self._workers = workers
        self._write_s = 0.0  # moving average of one page's write time; 0 until one is written
        self._lock = threading.Condition()
        self._queue: collections.deque[_Queued] = collections.deque()
        self._in_progress = 0
        self._offers = 0  # offers numbered so far
        # The latest offer of each name queued or being written, the names being written, and
        # a later version of such a name waiting for that write (so versions land in order).
        self._latest: dict[str, _Queued] = {}
        self._writing: dict[str, _Queued] = {}
        self._deferred: dict[str, _Queued] = {}
        self.superseded = 0
        self._closed = False
        self.written = 0
        self.written_bytes = 0
        self.dropped_queue_full = 0
        self.dropped_unavailable = 0
        self.dropped_corrupt = 0
        self.failed = 0
        self.last_lag_s = 0.0
        self._buffer_bytes = [0] * workers  # each worker's copy buffer; under _lock
        self._threads = [threading.Thread(target=self._serve, args=(n,), name=f"hicachefs-shared-writer-{n}",
                                          daemon=True) for n in range(workers)]
        for thread in self._threads:
            thread.start()

    def offer(self, page: PageMeta, payload: memoryview, release: Callable[[], None]) -> bool:
        with self._lock:
            self._offers += 1
            item = _Queued(page, self._offers, payload, release)
            ahead = len(self._queue) + self._in_progress
            fits = (len(self._queue) < self.max_pages and ahead * self._write_s <= self.max_lag_s * self._workers
                    and self._bytes.take(page.size))  # last: it takes the bytes when the rest fits
            if not fits:
                self.dropped_queue_full += 1
            elif self._closed or not self._accepting():
                self._bytes.give_back(page.size)
                self.dropped_unavailable += 1
            else:
                self._queue.append(item)
                self._latest[page.name] = item
                self._lock.notify()
                return True
        _release(item)
        self._tell_lost(item)
        return False

    def pending(self, name: str) -> int | None:
        """The offer number of the latest version of ``name`` queued or being written, if any."""
        with self._lock:
            latest = self._latest.get(name)
            return None if latest is None else latest.number

    def cancel(self, name: str) -> None:
        """The page ``name`` was removed: no version of it offered so far may reach the tier.
        Queued versions are skipped, one waiting for a write of its name is dropped, and one
        being written is handed to ``removed`` once it is written. Never blocks."""
        with self._lock:
            self._latest.pop(name, None)  # queued versions: superseded when their turn comes
            deferred = self._deferred.pop(name, None)
            if deferred is not None:
                self._in_progress -= 1
                self.superseded += 1
            writing = self._writing.get(name)
            if writing is not None:
                writing.cancelled = True
            self._lock.notify_all()
        if deferred is not None:
            _release(deferred)

    def _tell_lost(self, item: _Queued) -> None:
        if self._lost is not None:
            try:
                self._lost(item.page, item.number)
            except Exception:
                _log.exception("write-behind: telling of %s's loss failed", item.page.name)

    def drop_queued(self) -> int:
        """Drop every queued page (the tier became unavailable); return how many."""
        with self._lock:
            items, self._queue = list(self._queue), collections.deque()
            self._bytes.give_back(sum(item.page.size for item in items))
            self.dropped_unavailable += len(items)
            for item in items:
                if self._latest.get(item.page.name) is item:
                    del self._latest[item.page.name]
        for item in items:
            _release(item)
            self._tell_lost(item)
        return len(items)

    def _serve(self, worker: int) -> None:
        buffer = bytearray()
        item = None
        while True:
            if item is None:
                if len(buffer) > IDLE_BUFFER_BYTES and self._idle(worker):
                    buffer = bytearray()  # not kept for pages that may never come
                item = self._next()
                if item is None:
                    return
            size = item.page.size
            started = time.monotonic()
            ok = corrupt = overtaken = False
            try:
                if not size <= len(buffer) <= 2 * size:  # a much larger one is not kept for small pages
                    buffer = bytearray()  # let go first: never both at once
                    buffer = bytearray(size)
                copy = memoryview(buffer)[:size]
                copy[:] = item.payload
                _release(item)
                if page_checksum(copy) != item.page.checksum:
                    corrupt = True
                    _log.warning("%s: its bytes in RAM fail its checksum; not written to the shared tier",
                                 item.page.name)
                else:
                    self._write(item.page, copy, item.number)
                    ok = True
            except Overtaken:  # another host removed the name as the page landed: a later change
                overtaken = True
            except OSError:
                buffer = bytearray()  # a write that timed out may still be reading it
            except Exception:  # a bug: keep the worker, lose the page, and say so
                buffer = bytearray()
                _log.exception("write-behind of %s failed", item.page.name)
            finally:
                copy = None  # a view keeps its buffer: the buffer let go while idle is freed
                if item.payload is not None:
                    _release(item)
            with self._lock:
                self._buffer_bytes[worker] = len(buffer)
                self._in_progress -= 1
                if corrupt:
                    self.dropped_corrupt += 1
                elif ok:
                    now = time.monotonic()
                    self.written += 1
                    self.written_bytes += size
                    self.last_lag_s = now - item.offered
                    took = now - started
                    self._write_s = took if not self._write_s else 0.8 * self._write_s + 0.2 * took
                elif overtaken:
                    self.superseded += 1
                else:
                    self.failed += 1
                name = item.page.name
                if self._latest.get(name) is item:
                    del self._latest[name]
                # A later version of the name waited for this write to end: it is written next,
                # by this worker, so that it lands after it (never the older version last).
                lost = None if ok or item.cancelled else item
                unwrite = item.page if ok and item.cancelled else None
                item = self._deferred.pop(name, None)
                if item is None:
                    self._writing.pop(name, None)
                else:
                    self._writing[name] = item
                self._lock.notify_all()
            if lost is not None:
                self._tell_lost(lost)
            if unwrite is not None and self._removed is not None:
                try:
                    self._removed(unwrite)
                except Exception:
                    _log.exception("write-behind: removing %s, removed while written, failed", unwrite.name)

    def _idle(self, worker: int) -> bool:
        """Whether nothing is queued; if so, ``worker``'s buffer is counted let go."""
        with self._lock:
            if self._queue:
                return False
            self._buffer_bytes[worker] = 0
            return True

    def _next(self) -> _Queued | None:
        """The next page to write, None when closed. A page that a later offer of its name
        replaced is skipped (released); one whose name another worker is writing waits for it."""
        superseded = []
        try:
            with self._lock:
                while True:
                    while not self._queue and not self._closed:
                        self._lock.wait()
                    if not self._queue:
                        return None
                    item = self._queue.popleft()
                    self._bytes.give_back(item.page.size)
                    name = item.page.name
                    if self._latest.get(name) is not item:
                        superseded.append(item)  # a newer version of it is queued
                        self.superseded += 1
                        continue
                    self._in_progress += 1
                    if name in self._writing:
                        earlier = self._deferred.get(name)
                        if earlier is not None:
                            self._in_progress -= 1
                            superseded.append(earlier)
                            self.superseded += 1
                        self._deferred[name] = item
                        continue
                    self._writing[name] = item
                    return item
        finally:
            for item in superseded:
                _release(item)

    def statistics(self) -> WriteBehindStatistics:
        with self._lock:
            oldest = self._queue[0].offered if self._queue else None
            return WriteBehindStatistics(
                queue_pages=len(self._queue), queue_bytes=self._bytes.held,
                queue_max_pages=self.max_pages, queue_max_bytes=self._bytes.limit, writing=self._in_progress,
                written_behind=self.written, written_behind_bytes=self.written_bytes,
                dropped=self.dropped_queue_full + self.dropped_unavailable + self.dropped_corrupt,
                dropped_queue_full=self.dropped_queue_full, dropped_unavailable=self.dropped_unavailable,
                dropped_corrupt=self.dropped_corrupt, superseded=self.superseded,
                write_seconds_avg=round(self._write_s, 4), write_failures=self.failed,
                lag_seconds=round(time.monotonic() - oldest, 3) if oldest is not None else 0.0,
                last_lag_seconds=round(self.last_lag_s, 3), buffer_bytes=sum(self._buffer_bytes))

    def close(self, deadline_s: float) -> None:
        """Let the workers write what is queued for up to ``deadline_s``, drop the rest, and
        stop them; a worker stuck in a write is left behind (daemon thread)."""
        end = time.monotonic() + deadline_s
        with self._lock:
            while (self._queue or self._in_progress) and time.monotonic() < end:
                self._lock.wait(max(0.0, end - time.monotonic()))
            self._closed = True
            self._lock.notify_all()
        self.drop_queued()
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
