"""Pages fetched from the shared tier ahead of their reads, on threads of their own.

SGLang asks which pages exist, then reads the ones it was told about right away. A page only
the shared tier holds costs network round trips to read, so the store starts fetching it as
soon as the exists query finds it; the read (or a ``stat``) that follows waits for that fetch
instead of starting its own. A page removed while it is being fetched is marked cancelled, so
that the fetch, when it ends, does not bring it back.

Thread-safe. The fetch function is called without this object's lock held; the store may call
``cancelled`` under its own lock (this lock is always taken last).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hicachefs.store.errors import StoreError
from hicachefs.typed_stats import level, total

log = logging.getLogger(__name__)

#: Threads that fetch, and pages fetched or waiting to be at once (more are not fetched ahead).
FETCHERS = 4
IN_FLIGHT = 256


@dataclass(frozen=True)
class FetchAheadStatistics:
    fetched_ahead: int = total()
    fetches_in_flight: int = level()


class FetchAhead:
    """Runs ``fetch(name) -> bool`` (whether it brought the page in) for names asked for; the
    store also runs its promotions of pages the data plane read twice from a lower tier on one."""

    def __init__(self, fetch: Callable[[str], bool], threads: int = FETCHERS, in_flight: int = IN_FLIGHT,
                 name: str = "hicachefs-shared-fetch") -> None:
        self._fetch = fetch
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Event] = {}
        self._cancelled: set[str] = set()
        self._fetched = 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)

    def start(self, names: Iterable[str]) -> None:
        """Fetch these pages in the background, as many as there is room for in flight; a name
        given twice is fetched once."""
        with self._lock:
            room = max(0, self._in_flight - len(self._fetching))
            todo = [name for name in dict.fromkeys(names) if name not in self._fetching][:room]
            for name in todo:
                self._fetching[name] = threading.Event()
        for name in todo:
            try:
                self._pool.submit(self._run, name)
            except RuntimeError:  # closing: nothing is fetched any more
                self._finish(name)

    def wait(self, name: str) -> bool:
        """Wait for the page's fetch if one is in flight; whether there was one."""
        with self._lock:
            fetching = self._fetching.get(name)
        if fetching is None:
            return False
        fetching.wait()
        return True

    def cancel(self, name: str) -> None:
        """The page was removed: a fetch in flight must not bring it back."""
        with self._lock:
            if name in self._fetching:
                self._cancelled.add(name)

    def cancelled(self, name: str) -> bool:
        with self._lock:
            return name in self._cancelled

    def statistics(self) -> FetchAheadStatistics:
        with self._lock:
            return FetchAheadStatistics(fetched_ahead=self._fetched, fetches_in_flight=len(self._fetching))

    def close(self) -> None:
        """Let running fetches end, drop the rest, and free anyone waiting on them."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            names = list(self._fetching)
        for name in names:
            self._finish(name)

    def _run(self, name: str) -> None:
        try:
            if self._fetch(name):
                with self._lock:
                    self._fetched += 1
        except StoreError:
            pass  # gone, damaged or unreachable: the read finds out again and says so
        except Exception:  # a bug: the reader waiting on this fetch must not wait forever
            log.exception("fetching %s from the shared tier failed", name)
        finally:
            self._finish(name)

    def _finish(self, name: str) -> None:
        with self._lock:
            self._cancelled.discard(name)
            fetching = self._fetching.pop(name, None)
        if fetching is not None:
            fetching.set()
