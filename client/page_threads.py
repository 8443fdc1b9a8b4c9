"""``PageThreads``: one batch's transfers on a few threads at once, so that the daemon always
has the next request queued while the client prepares or finishes another.

Thread-safe: any number of callers share the helper threads; each waits only for its own work.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, List, Optional

from . import forks


class _Batch:
    """The pages of one ``PageThreads.run`` call: which to take next, how many are in flight."""

    def __init__(self, work: Callable[[int], bool], count: int) -> None:
        self.work, self.count = work, count
        self.results = [False] * count
        self.taken = 0
        self.in_flight = 0
        self.stopped = False
        self.changed = threading.Condition()

    def take_pages(self) -> None:
        """Transfer pages until none is left to take."""
        while True:
            with self.changed:
                if self.stopped or self.taken >= self.count:
                    return
                i = self.taken
                self.taken += 1
                self.in_flight += 1
            try:
                self.results[i] = self.work(i)
            except Exception:  # work must not raise; one page never stops the others
                self.results[i] = False
            finally:
                with self.changed:
                    self.in_flight -= 1
                    self.changed.notify_all()

    def finish(self) -> None:
        """Start no more pages, and wait for those in flight: once this returns, no helper
        touches the caller's buffers again."""
        with self.changed:
            self.stopped = True
            self.changed.wait_for(lambda: self.in_flight == 0)


class PageThreads:
    """Transfers the pages of a batch on up to ``threads`` threads at once: the caller's own
    thread and ``threads - 1`` shared helper threads, made on first use.

    Thread-safe: any number of callers share the helpers; each caller waits only for its own
    pages. The caller takes pages too, so a batch finishes even when every helper is busy with
    other callers' pages (or was shut down by ``close``, or lost in a fork). ``run`` blocks
    until all its pages are done.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._lock = threading.Lock()
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        forks.renew_in_child(self)

    def forked(self) -> None:
        """In a forked child: the helper threads stayed behind."""
        self._lock, self._executor = threading.Lock(), None

    def run(self, work: Callable[[int], bool], count: int) -> List[bool]:
        """``[work(0), ..., work(count - 1)]``, computed concurrently; a page whose ``work``
        raises is False."""
        if count == 1:  # (SGLang's usual batch: one run, in the caller's thread, no bookkeeping)
            try:
                return [work(0)]
            except Exception:
                return [False]
        batch = _Batch(work, count)
        if self.threads > 1:  # (a batch of one run returned above)
            executor = self._helpers()
            for _ in range(min(self.threads, count) - 1):
                try:
                    executor.submit(batch.take_pages)
                except RuntimeError:  # shut down meanwhile: the caller takes the rest
                    break
        try:
            batch.take_pages()
        finally:
            batch.finish()
        return batch.results

    def _helpers(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.threads - 1, thread_name_prefix="hicachefs-io")
            return self._executor

    def close(self) -> None:
        """Let the helper threads end; a later ``run`` makes new ones."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
