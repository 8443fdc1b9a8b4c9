"""Deadlines for blocking filesystem calls, and the judgement of whether the filesystem is up.

A distributed filesystem can hang a call for minutes (a frozen server holds a ``stat`` until its
ping timeout). The shared tier therefore never makes a filesystem call in a caller's thread:
``CallGuard.call`` hands it to one of a fixed set of daemon threads and waits at most the
call's deadline. A caller past its deadline gets ``TimeoutError`` while the thread stays stuck
in the syscall; since the threads are fixed and the calls waiting for them are bounded, hung
calls never pile up: once every thread is stuck, new calls are refused at once.

Outcomes feed the availability verdict: a call that overran its deadline while running, or
``failures_to_mark`` failed calls in a row, mark the filesystem unavailable; from then on calls
are refused at once (``ENOTCONN``) except probes, and one successful probe marks it available
again. Errors a call site expects (a page another host removed: ENOENT, ESTALE; a full
filesystem: ENOSPC) say nothing about availability and do not count.

Thread-safe. ``call`` blocks its caller up to the deadline given.
"""

from __future__ import annotations

import collections
import errno
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from hicachefs.typed_stats import level, total


class Refused(OSError):
    """The call was not made: the filesystem is marked unavailable (ENOTCONN), the guard is
    closed, or every thread is taken (EBUSY)."""


class Overtaken(OSError):
    """The call's work was undone by another host's change that came in between (its removal of
    the name a page was being renamed onto): an outcome of sharing the volume, not a failure of
    the filesystem, so never counted against it."""


class _Call:
    __slots__ = ("fn", "args", "discard", "done", "result", "error", "started", "abandoned")

    def __init__(self, fn: Callable, args: tuple, discard: Callable | None) -> None:
        self.fn = fn
        self.args = args
        self.discard = discard
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self.started = False
        self.abandoned = False


@dataclass(frozen=True)
class GuardStatistics:
    available: bool = level(True)
    unavailable_seconds: float = level(0.0)
    last_error: str | None = None
    timeouts: int = total()
    failures: int = total()
    refused: int = total()
    availability_changes: int = total()
    io_threads_busy: int = level()
    io_calls_waiting: int = level()


class CallGuard:
    def __init__(self, threads: int = 4, max_waiting: int = 64, failures_to_mark: int = 3) -> None:
        self._threads = threads
        self._max_waiting = max_waiting
        self._failures_to_mark = failures_to_mark
        self._lock = threading.Condition()
        self._waiting: collections.deque[_Call] = collections.deque()
        self._running = 0
        self._closed = False
        self.available = True
        self._unavailable_since: float | None = None
        self._consecutive_failures = 0
        self._last_error = ""
        self._timeouts = 0
        self._failures = 0
        self._refused = 0
        self._changes = 0
        for number in range(threads):
            threading.Thread(target=self._serve, name=f"hicachefs-shared-io-{number}", daemon=True).start()

    def call(self, fn: Callable, *args, timeout: float, expected: tuple[int, ...] = (), probe: bool = False,
             discard: Callable | None = None):
        """Run ``fn(*args)`` on a guard thread; return its result or raise its exception.

        Raises ``TimeoutError`` when the call ran past ``timeout`` seconds (``discard``, if
        given, receives its result should it ever finish), and ``Refused`` when it was never
        made: the filesystem is marked unavailable (unless ``probe``), every thread is taken,
        or the deadline passed while it waited for a thread. Only ``OSError``s other than the
        ``expected`` errnos count as failures of the filesystem."""
        call = _Call(fn, args, discard)
        with self._lock:
            if self._closed or (not self.available and not probe):
                self._refused += 1
                raise Refused(errno.ENOTCONN, "shared tier unavailable")
            if len(self._waiting) + self._running >= self._threads + self._max_waiting:
                self._refused += 1
                raise Refused(errno.EBUSY, "shared tier: every I/O thread is taken")
            self._waiting.append(call)
            self._lock.notify()
        if not call.done.wait(timeout):
            with self._lock:
                if not call.done.is_set():
                    call.abandoned = True
                    if not call.started:  # stuck behind other calls, never made
                        self._refused += 1
                        raise Refused(errno.ETIMEDOUT, f"shared tier call waited {timeout:.3g} s for a thread")
                    self._timeouts += 1
                    self._mark_unavailable(f"{getattr(fn, '__name__', 'call')} exceeded {timeout:.3g} s")
                    raise TimeoutError(errno.ETIMEDOUT, f"shared tier call exceeded {timeout:.3g} s")
        if call.error is not None:
            error = call.error
            if not isinstance(error, OSError) or error.errno in expected or isinstance(error, (Refused, Overtaken)):
                raise error
            with self._lock:
                self._failures += 1
                self._consecutive_failures += 1
                self._last_error = f"{type(error).__name__}: {error}"
                if self._consecutive_failures >= self._failures_to_mark:
                    self._mark_unavailable(self._last_error)
            raise error
        with self._lock:
            self._consecutive_failures = 0
            if probe and not self.available:
                self.available = True
                self._unavailable_since = None
                self._changes += 1
        return call.result

    def mark_unavailable(self, reason: str) -> None:
        with self._lock:
            self._mark_unavailable(reason)

    def _mark_unavailable(self, reason: str) -> None:
        self._last_error = reason
        if self.available:
            self.available = False
            self._unavailable_since = time.monotonic()
            self._changes += 1

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._lock.wait()
                if self._closed and not self._waiting:
                    return
                call = self._waiting.popleft()
                if call.abandoned:
                    continue
                call.started = True
                self._running += 1
            try:
                call.result = call.fn(*call.args)
            except BaseException as error:  # handed to the caller, who decides
                call.error = error
            with self._lock:
                self._running -= 1
                call.done.set()
                late = call.abandoned and call.discard is not None and call.error is None
            if late:
                try:
                    call.discard(call.result)
                except Exception:
                    pass  # releasing what nobody waits for any more: nothing left to tell

    def statistics(self) -> GuardStatistics:
        with self._lock:
            since = self._unavailable_since
            return GuardStatistics(
                available=self.available,
                unavailable_seconds=round(time.monotonic() - since, 3) if since is not None else 0.0,
                last_error=self._last_error, timeouts=self._timeouts, failures=self._failures,
                refused=self._refused, availability_changes=self._changes,
                io_threads_busy=self._running, io_calls_waiting=len(self._waiting))

    def close(self) -> None:
        """Refuse new calls and let idle threads end; threads stuck in a call stay behind
        (daemon threads: they never hold up the process's exit)."""
        with self._lock:
            self._closed = True
            for call in self._waiting:
                call.abandoned = True
                call.error = Refused(errno.ENOTCONN, "shared tier closed")
                call.done.set()
            self._waiting.clear()
            self._lock.notify_all()
