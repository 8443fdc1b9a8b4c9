"""Plain file I/O against a hicachefs mount: read a page, publish a page, ask which pages exist.

Everything here follows DESIGN.md ("Page files", "Batch existence query") and nothing else, so it
works against any daemon that keeps the contract, and against a plain directory (no
``.hicachefs/exists``: existence is then answered by ``stat``, which the tests use).

Thread-safety: ``PageIO`` is safe to call from many threads at once. Each thread keeps its own
handle on ``.hicachefs/exists`` (one handle serves one request at a time). Every call blocks on
the daemon; a daemon that stalls stalls the caller (the kernel gives no timeout).

``PageThreads`` runs one batch's page transfers on a few threads at once, so that the daemon
always has the next request queued while the client prepares or finishes another.

Failures never raise: a page that is missing, a daemon that is gone (``ENOTCONN``), ``ENOSPC``,
``EIO``, ``EFBIG``... make the call return a miss / ``False``. Each kind of failure is logged once
(until the mount works again, which is logged too) and counted in ``statistics()``.
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

CONTROL_DIR = ".hicachefs"
EXISTS_FILE = f"{CONTROL_DIR}/exists"

# The exists request is line-based; a path holding any character a reader might split lines on
# is asked with stat instead (such keys are valid names, just not expressible on a line).
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_OTHER_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

# Retry opening a missing exists file at most this often (seconds).
_EXISTS_RETRY_INTERVAL = 1.0

# Kinds of failure that are not errno values.
WRONG_SIZE = "WRONG_SIZE"
BAD_ANSWER = "BAD_EXISTS_ANSWER"
NO_EXISTS_FILE = "NO_EXISTS_FILE"
MOUNT_GONE = "MOUNT_GONE"


def error_kind(exc: BaseException) -> str:
    """``ENOTCONN``, ``ENOSPC``... for an OSError, else the exception's class name."""
    code = getattr(exc, "errno", None)
    if code is not None:
        return errno.errorcode.get(code, f"errno{code}")
    return type(exc).__name__


class FailureLog:
    """Counts failures by kind and logs each kind once, until an operation succeeds again.

    Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = {}
        self._logged: set = set()
        self._sticky: set = set()
        self._failing = False

    def failure(self, kind: str, message: str, *, level: int = logging.WARNING,
                sticky: bool = False) -> None:
        """Count a failure; log it if its kind is new. A ``sticky`` kind is a lasting fact
        (no exists file, a page of the wrong size): logged once for good, never "recovered"."""
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            if sticky:
                first = kind not in self._sticky
                self._sticky.add(kind)
            else:
                self._failing = True
                first = kind not in self._logged
                self._logged.add(kind)
        if first:
            logger.log(level, "hicachefs client: %s (%s; further %s failures are counted, not logged)",
                       message, kind, kind)

    def success(self) -> None:
        if not self._failing:  # the common case: no lock
            return
        with self._lock:
            if not self._failing:
                return
            self._failing = False
            kinds = sorted(self._logged)
            self._logged.clear()
        logger.info("hicachefs client: the mount works again (after %s)", ", ".join(kinds))

    def counts(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Counters:
    """Monotonic counters of the client's traffic. Thread-safe."""

    FIELDS = (
        "hits", "misses", "bytes_read", "pages_written", "pages_skipped", "bytes_written",
        "write_failures", "exists_queries", "exists_paths", "exists_stat_fallbacks",
        "refused_keys",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._values)


class _QueryHandle:
    """One open handle on ``.hicachefs/exists``, owned by one thread."""

    __slots__ = ("fd", "__weakref__")

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:  # the owning thread ended
        self.close()


def _advance(buffers: Sequence[memoryview], done: int) -> List[memoryview]:
    """The buffers still to fill after the first ``done`` bytes."""
    rest = []
    for buf in buffers:
        if done >= len(buf):
            done -= len(buf)
            continue
        rest.append(buf[done:] if done else buf)
        done = 0
    return rest


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
        self._pid = os.getpid()

    def run(self, work: Callable[[int], bool], count: int) -> List[bool]:
        """``[work(0), ..., work(count - 1)]``, computed concurrently; a page whose ``work``
        raises is False."""
        batch = _Batch(work, count)
        if self.threads > 1 and count > 1:
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
        if self._pid != os.getpid():  # a forked child: the helper threads stayed behind
            self._lock, self._executor, self._pid = threading.Lock(), None, os.getpid()
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


class PageIO:
    """Reads, publishes and queries pages under one mount root. See the module docstring."""

    def __init__(self, mountpoint: str, failures: Optional[FailureLog] = None,
                 counters: Optional[Counters] = None) -> None:
        self.root = os.path.abspath(mountpoint)
        self.failures = failures or FailureLog()
        self.counters = counters or Counters()
        self._local = threading.local()
        self._handles: "weakref.WeakSet[_QueryHandle]" = weakref.WeakSet()
        self._handles_lock = threading.Lock()
        self._no_query_until = 0.0
        # Once a daemon has been seen here, a root without .hicachefs/ is a bare mountpoint.
        self._seen_daemon = os.path.isdir(os.path.join(self.root, CONTROL_DIR))
        if not self._seen_daemon:
            logger.warning(
                "hicachefs client: %s has no %s/ (not a live hicachefs mount yet); existence "
                "is checked with stat until it appears", self.root, CONTROL_DIR)

    # ---------------------------------------------------------------- paths

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    # ---------------------------------------------------------------- reading

    def read_page(self, rel: str, buffers: Sequence[memoryview], size: int,
                  check_longer: bool = False) -> bool:
        """Fill ``buffers`` (``size`` bytes in all) with the page at ``rel``. False on a miss.

        On a miss the buffers may hold part of the page; callers must not use them.
        """
        path = self.path(rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                self.counters.add(misses=1)
                return False
            return self._read_failed(exc, path)
        try:
            # The path's format segment (dtype, layout, tokens per page) fixes a pool page's
            # size, so the hot path reads exactly that and a short page is a miss. When the
            # caller chose the size (``check_longer``), one byte more into a scratch buffer
            # shows a longer file without an fstat round trip; it costs an extra request.
            done = 0
            rest = list(buffers) + ([memoryview(bytearray(1))] if check_longer else [])
            while rest:
                n = os.preadv(fd, rest, done)
                if n <= 0:
                    break
                done += n
                rest = _advance(rest, n)
            if done != size:
                self.failures.failure(WRONG_SIZE, f"{path} is not a page of {size} bytes "
                                      f"({'more' if done > size else done})", sticky=True)
                self.counters.add(misses=1)
                return False
        except OSError as exc:
            return self._read_failed(exc, path)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
        self.failures.success()
        self.counters.add(hits=1, bytes_read=size)
        return True

    def _read_failed(self, exc: OSError, path: str) -> bool:
        self.failures.failure(error_kind(exc), f"cannot read {path}: {exc.strerror or exc}")
        self.counters.add(misses=1)
        return False

    # ---------------------------------------------------------------- publishing

    def publish_page(self, rel_dir: str, key: str, buffers: Sequence[memoryview], size: int) -> bool:
        """Write ``buffers`` to a temporary file in ``rel_dir``, then rename it to ``key``.

        No ``ftruncate`` size hint: hicachefs places a page by the size of the last one
        published in its pool, which saves two round trips per page. Directories are made on
        ENOENT.
        """
        directory = self.path(rel_dir)
        tmp = None
        try:
            tmp = os.path.join(directory, "." + secrets.token_hex(12))
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            try:
                fd = os.open(tmp, flags, 0o644)
            except FileNotFoundError:
                if not self._make_dirs(rel_dir):
                    tmp = None
                    self.counters.add(write_failures=1)
                    return False
                fd = os.open(tmp, flags, 0o644)
            try:
                done = 0
                rest = list(buffers)
                while rest:
                    n = os.pwritev(fd, rest, done)
                    if n <= 0:
                        raise OSError(errno.EIO, "pwritev wrote nothing")
                    done += n
                    rest = _advance(rest, n)
            finally:
                os.close(fd)  # a FUSE close reports deferred write errors
            os.rename(tmp, os.path.join(directory, key))
            tmp = None
        except OSError as exc:
            if exc.errno == errno.ENOENT and exc.filename == tmp:
                tmp = None  # the temporary file was never made
            self.failures.failure(error_kind(exc),
                                  f"cannot publish {rel_dir}/{key}: {exc.strerror or exc}")
            self.counters.add(write_failures=1)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return False
        self.failures.success()
        self.counters.add(pages_written=1, bytes_written=size)
        return True

    def _make_dirs(self, rel_dir: str) -> bool:
        """Make ``rel_dir`` and its parents below the mount root. False if that must not be done.

        The mount root itself is never created: a missing root means no mount. After a daemon
        has been seen, a root without ``.hicachefs/`` is an unmounted mountpoint, and writing
        there would fill the disk below it.
        """
        if not os.path.isdir(self.root):
            self.failures.failure(MOUNT_GONE, f"mountpoint {self.root} does not exist")
            return False
        if self._seen_daemon and not os.path.isdir(os.path.join(self.root, CONTROL_DIR)):
            self.failures.failure(MOUNT_GONE, f"{self.root} is no longer a hicachefs mount")
            return False
        try:
            os.makedirs(self.path(rel_dir), exist_ok=True)
        except OSError as exc:
            self.failures.failure(error_kind(exc), f"cannot make {rel_dir}: {exc.strerror or exc}")
            return False
        return True

    # ---------------------------------------------------------------- existence

    def exists(self, rels: Sequence[str]) -> List[bool]:
        """For each relative page path: published and readable? One request for all of them."""
        if not rels:
            return []
        answers: List[Optional[bool]] = [None] * len(rels)
        joined = "\n".join(rels)
        if joined.count("\n") == len(rels) - 1 and not _OTHER_LINE_BREAKS.search(joined):
            lines = list(range(len(rels)))  # the common case, checked in one pass
        else:
            lines = [i for i, rel in enumerate(rels) if not _LINE_BREAKS.search(rel)]
        if lines:
            got = self._query([rels[i] for i in lines])
            if got is not None:
                for i, ok in zip(lines, got):
                    answers[i] = ok
        for i, answer in enumerate(answers):
            if answer is None:
                answers[i] = self._stat_exists(rels[i])
        return answers  # type: ignore[return-value]

    def _query(self, rels: Sequence[str]) -> Optional[List[bool]]:
        """Ask ``.hicachefs/exists``; None when it cannot answer (then stat answers)."""
        handle = self._query_handle()
        if handle is None:
            return None
        request = ("\n".join(rels) + "\n").encode("utf-8", "surrogateescape")
        expected = len(rels) + 1
        try:
            view = memoryview(request)
            while view:
                n = os.write(handle.fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, "write to the exists file wrote nothing")
                view = view[n:]
            answer = bytearray()
            while not answer.endswith(b"\n") and len(answer) <= expected:
                chunk = os.read(handle.fd, expected + 1 - len(answer))
                if not chunk:
                    break
                answer += chunk
        except OSError as exc:
            self._drop_handle(handle)
            self.failures.failure(error_kind(exc), f"exists query failed: {exc.strerror or exc}")
            return None
        if len(answer) != expected or not answer.endswith(b"\n") or \
                answer[:-1].strip(b"01"):
            self._drop_handle(handle)
            self.failures.failure(BAD_ANSWER, f"exists answered {bytes(answer[:40])!r}... "
                                              f"for {len(rels)} paths")
            return None
        self.failures.success()
        self.counters.add(exists_queries=1, exists_paths=len(rels))
        return [c == 0x31 for c in answer[:-1]]

    def _query_handle(self) -> Optional[_QueryHandle]:
        handle = getattr(self._local, "handle", None)
        if handle is not None and handle.fd >= 0:
            return handle
        if time.monotonic() < self._no_query_until:
            return None
        path = self.path(EXISTS_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            self._no_query_until = time.monotonic() + _EXISTS_RETRY_INTERVAL
            if exc.errno == errno.ENOENT:
                self.failures.failure(NO_EXISTS_FILE, f"{path} does not exist; using stat",
                                      level=logging.INFO, sticky=True)
            else:
                self.failures.failure(error_kind(exc), f"cannot open {path}: {exc.strerror or exc}")
            return None
        self._seen_daemon = True
        handle = _QueryHandle(fd)
        self._local.handle = handle
        with self._handles_lock:
            self._handles.add(handle)
        return handle

    def _drop_handle(self, handle: _QueryHandle) -> None:
        handle.close()
        if getattr(self._local, "handle", None) is handle:
            self._local.handle = None

    def _stat_exists(self, rel: str) -> bool:
        self.counters.add(exists_stat_fallbacks=1)
        try:
            return stat.S_ISREG(os.stat(self.path(rel)).st_mode)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                self.failures.failure(error_kind(exc), f"cannot stat {rel}: {exc.strerror or exc}")
            return False

    # ---------------------------------------------------------------- other

    def remove_tree(self, rel_dir: str) -> bool:
        """``rm -r`` of a directory below the root (evicts its pages). Missing is fine."""

        def on_error(function, path, info):
            if not isinstance(info[1], FileNotFoundError):
                raise info[1]

        try:
            shutil.rmtree(self.path(rel_dir), onerror=on_error)
        except FileNotFoundError:
            return True
        except OSError as exc:
            self.failures.failure(error_kind(exc), f"cannot remove {rel_dir}: {exc.strerror or exc}")
            return False
        return True

    def close(self) -> None:
        """Close every thread's exists handle. Later calls still work (handles reopen)."""
        with self._handles_lock:
            handles = list(self._handles)
        for handle in handles:
            handle.close()

