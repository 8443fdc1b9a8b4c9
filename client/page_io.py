"""Plain file I/O against a hicachefs mount: read pages, publish pages, ask which pages exist.

Everything here follows docs/contract.md ("Page files", the control files, the data plane) and nothing
else, so it works against any daemon that keeps the contract, and, when asked to
(``plain_directory``), against a plain directory (no ``.hicachefs/``: existence is then answered
by ``stat``, pages are files). Otherwise a root that is no hicachefs mount yet is served nothing
(``served``) until the mount appears.
Batches go through the data plane where this user may (``plane.py``: the client moves the bytes
and reads the index itself), and what it cannot take through the control files: many pages
published by one write on ``ingest`` (``ingest.py``), read by one request on ``fetch``
(``fetch.py``), asked about by one request on ``exists``; single pages, and mounts without
those files, by a file per page (a temporary file renamed to its key, an open and ``preadv``).

Thread-safety: ``PageIO`` is safe to call from many threads at once; each thread keeps its own
control file handles (``control_handles.py``). A call that reaches the daemon blocks on it; a
daemon that stalls stalls the caller (the kernel gives no timeout), but not the plane's reads.

Failures never raise: a page that is missing, a daemon that is gone (``ENOTCONN``), ``ENOSPC``,
``EIO``, ``EFBIG``... make the call return a miss / ``False``. Each kind of failure is logged once
(until the mount works again, which is logged too) and counted in ``statistics()``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import fetch, forks, ingest
from .accounting import Counters, FailureLog, error_kind
from .control_handles import CONTROL_DIR, EXISTS_FILE, FETCH_FILE, INGEST_FILE, ControlHandles
from .plane import Plane, Spread
from .vectored import advance, read_into

#: What a handle fails with once its daemon is gone (or was restarted since it was opened).
HANDLE_LOST = frozenset({errno.ENOTCONN, errno.ECONNABORTED, errno.EBADF})

logger = logging.getLogger(__name__)

# The exists request is line-based; a path holding any character a reader might split lines on
# is asked with stat instead (such keys are valid names, just not expressible on a line).
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_OTHER_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")



def _one_per_line(paths: Sequence[str]) -> bool:
    """Whether the paths can be written one per line (the ingest and fetch requests' form);
    a key holding a newline is a valid name, and such a batch goes a file per page."""
    return not any("\n" in path for path in paths)


def _exists_request(rels: Sequence[str], sizes: Sequence[Optional[int]]) -> Tuple[bytes, List[int], int]:
    """The exists request for page paths ``rels`` (one per line), each counted only at its size
    in ``sizes`` (None: any): a ``.size`` line goes before each run of one size (the daemon
    answers it '0'). With where each path's answer is in the answer, and the request's lines."""
    lines: List[str] = []
    answer_at: List[int] = []
    current = 0  # what a request starts with: any size
    for rel, size in zip(rels, sizes):
        if (size or 0) != current:
            current = size or 0
            lines.append(f".size {current}")
        answer_at.append(len(lines))
        lines.append(rel)
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"), answer_at, len(lines)


# How often a client whose root is no hicachefs mount yet looks whether it is one now (seconds).
MOUNT_LOOK_INTERVAL_S = 1.0

# Kinds of failure that are not errno values.
WRONG_SIZE = "WRONG_SIZE"
BAD_ANSWER = "BAD_EXISTS_ANSWER"
MOUNT_GONE = "MOUNT_GONE"


class PageIO:
    """Reads, publishes and queries pages under one mount root. See the module docstring."""

    def __init__(self, mountpoint: str, failures: Optional[FailureLog] = None,
                 counters: Optional[Counters] = None, data_plane: bool = True,
                 verify_reads: Optional[bool] = None, commit_behind: bool = True,
                 plain_directory: bool = False) -> None:
        """``data_plane``: read and write pages through the daemon's shared memory where this
        user may (``plane.py``); ``verify_reads``: check each page read that way against its
        checksum (None: where the CPU needs it); ``commit_behind``: a write through it returns
        once its pages are in the daemon's memory, its commit sent by a thread of the client's;
        ``plain_directory``: serve a root that is no hicachefs mount as a plain directory."""
        self.root = os.path.abspath(mountpoint)
        self.failures = failures or FailureLog()
        self.counters = counters or Counters()
        self.handles = ControlHandles(self.root, self.failures)
        self.plane = Plane(self.root, self.failures, self.counters, verify_reads, commit_behind) if data_plane else None
        self.plain_directory = plain_directory
        self._look_lock = threading.Lock()
        self._look_again_at = 0.0
        forks.renew_in_child(self)
        if not self.handles.seen_daemon:
            if plain_directory:
                logger.info("hicachefs client: %s is served as a plain directory (plain_directory)", self.root)
            else:
                logger.warning(
                    "hicachefs client: %s is no hicachefs mount (it has no %s/): every page is a miss "
                    "and nothing is written there until it is mounted (extra_config plain_directory: "
                    "true serves a plain directory)", self.root, CONTROL_DIR)

    def forked(self) -> None:
        """In a forked child: a look for the mount another thread was making holds no lock here."""
        self._look_lock = threading.Lock()

    def served(self) -> bool:
        """Whether pages are read and written under the root: a hicachefs mount, once seen (a
        root unmounted later is refused where it would be written: ``_make_dirs``), or a plain
        directory by choice. Until then every call is a miss or False and writes nothing: pages
        written to the bare mountpoint would fill the disk below it, never evicted, and the
        mount made later would be refused (not empty). Looked at once a second."""
        if self.plain_directory or self.handles.seen_daemon:
            return True
        with self._look_lock:
            if self.handles.seen_daemon or time.monotonic() < self._look_again_at:
                return self.handles.seen_daemon
            self._look_again_at = time.monotonic() + MOUNT_LOOK_INTERVAL_S
            if not os.path.isdir(os.path.join(self.root, CONTROL_DIR)):
                return False
            self.handles.seen_daemon = True
        logger.warning("hicachefs client: %s is a hicachefs mount now; pages are read and written there",
                       self.root)
        return True

    # ---------------------------------------------------------------- paths

    def plane_attached(self) -> bool:
        """Whether pages go through the data plane now."""
        return self.plane is not None and self.plane.attached() is not None

    def prepare(self, rel_dir: str) -> None:
        """Get ready to serve pages of pool directory ``rel_dir`` (the data plane attached)."""
        if self.plane is not None and self.served():
            self.plane.prepare(rel_dir)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    # ---------------------------------------------------------------- reading

    def read_page(self, rel: str, buffers: Sequence[memoryview], size: int,
                  check_longer: bool = False) -> bool:
        """Fill ``buffers`` (``size`` bytes in all) with the page at ``rel``. False on a miss.

        On a miss the buffers may hold part of the page; callers must not use them.
        """
        if not self.served():
            self.counters.add(misses=1)
            return False
        path = self.path(rel)
        if self.plane is not None:
            self.plane.wait_for([rel])  # this process's commit of it under way: answered first
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
            done = read_into(fd, list(buffers) + ([memoryview(bytearray(1))] if check_longer else []))
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
        if not self.served():
            self.counters.add(write_failures=1)
            return False
        if self._mount_gone():
            self.counters.add(write_failures=1)
            return False
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
                    rest = advance(rest, n)
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

    def _ingest_batch(self, rel_dir: str, paths: List[str], buffers: Sequence[Sequence[memoryview]],
                      size: int) -> Optional[List[Optional[OSError]]]:
        """One try of ``_ingest``: per page None or its error; None when the ingest file cannot
        be used (none, or a path it cannot carry)."""
        with self.handles.using(INGEST_FILE) as handle:
            if handle is None or not _one_per_line(paths):
                return None
            outcome = ingest.publish_batch(handle.fd, paths, buffers, [size] * len(paths))
            missing = [i for i, error in enumerate(outcome) if error is not None and error.errno == errno.ENOENT]
            if missing and self._make_dirs(rel_dir):  # a new pool: make its directories, then again
                again = ingest.publish_batch(handle.fd, [paths[i] for i in missing],
                                             [buffers[i] for i in missing], [size] * len(missing))
                for i, error in zip(missing, again):
                    outcome[i] = error
            if any(isinstance(error, ingest.HandleLost) or (error is not None and error.errno in HANDLE_LOST)
                   for error in outcome):
                self.handles.drop(handle)
            return outcome

    def _mount_gone(self) -> bool:
        """Whether the mount seen here is gone (its root has no ``.hicachefs/``), logged: a page
        file written then would land on the disk below the mountpoint, in a pool directory left
        there, never evicted. Asked on the file-per-page path only, where a write touches the
        root's filesystem (the data plane and the ingest file reach the daemon or fail)."""
        if not self.handles.seen_daemon or os.path.isdir(os.path.join(self.root, CONTROL_DIR)):
            return False
        self.failures.failure(MOUNT_GONE, f"{self.root} is no longer a hicachefs mount")
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
        if self._mount_gone():
            return False
        try:
            os.makedirs(self.path(rel_dir), exist_ok=True)
        except OSError as exc:
            self.failures.failure(error_kind(exc), f"cannot make {rel_dir}: {exc.strerror or exc}")
            return False
        return True

    # ---------------------------------------------------------------- batches

    def read_pages(self, rels: Sequence[str], buffers: Sequence[Sequence[memoryview]],
                   size: int, alone: bool = False) -> List[bool]:
        """Fill ``buffers[i]`` with the page at ``rels[i]`` (``size`` bytes each); per page:
        read? Through the data plane where it can, the rest in one fetch request (a file per
        page where the mount has none). ``alone``: these are the whole batch, in one run."""
        if not self.served():
            self.counters.add(misses=len(rels))
            return [False] * len(rels)
        if self.plane is None:
            return self._fetch(rels, buffers, size)
        read = self.plane.read_pages(rels, buffers, size, alone)
        hits, misses = read.count(True), read.count(False)
        if hits or misses:
            self.failures.success()
            self.counters.add(hits=hits, misses=misses, bytes_read=hits * size, plane_reads=hits)
        todo = [i for i, done in enumerate(read) if done is None]
        if todo:
            for i, done in zip(todo, self._fetch([rels[i] for i in todo], [buffers[i] for i in todo], size)):
                read[i] = done
        return read  # type: ignore[return-value]

    def _publish_missing(self, rel_dir: str, keys: Sequence[str],
                         buffers: Sequence[Sequence[memoryview]], size: int) -> List[bool]:
        """Without the ingest file: ask which pages exist, publish the others one by one."""
        present = self.exists_in(rel_dir, keys, size)
        if any(present):
            self.counters.add(pages_skipped=sum(present))
        return [there or self.publish_page(rel_dir, key, page, size)
                for key, page, there in zip(keys, buffers, present)]

    def _fetch(self, rels: Sequence[str], buffers: Sequence[Sequence[memoryview]],
               size: int) -> List[bool]:
        """Read the pages through one fetch request (a file per page where the mount has no
        fetch file: a longer file is a miss there too, as the fetch file says). A handle lost
        with its daemon (one restarted since) is replaced once."""
        for attempt in (1, 2):
            with self.handles.using(FETCH_FILE) as handle:
                if handle is None or not _one_per_line(rels):
                    return [self.read_page(rel, page, size, check_longer=True) for rel, page in zip(rels, buffers)]
                try:
                    read = fetch.fetch_batch(handle.fd, rels, buffers, size)
                except OSError as exc:
                    self.handles.drop(handle)
                    if attempt == 1 and exc.errno in HANDLE_LOST:
                        continue
                    self.failures.failure(error_kind(exc), f"fetch of {len(rels)} pages failed: "
                                                           f"{exc.strerror or exc}")
                    self.counters.add(misses=len(rels))
                    return [False] * len(rels)
            break
        hits = sum(read)
        self.failures.success()
        self.counters.add(hits=hits, misses=len(rels) - hits, bytes_read=hits * size, batches_read=1)
        return read

    def publish_pages(self, rel_dir: str, keys: Sequence[str],
                      buffers: Sequence[Sequence[memoryview]], size: int,
                      spread: Optional[Spread] = None, runs: int = 1) -> List[bool]:
        """Publish page ``keys[i]`` of directory ``rel_dir`` from ``buffers[i]`` (``size`` bytes
        each) through the data plane (its copies spread over ``runs`` at once by ``spread``), or
        the ingest file, in as few writes as the kernel allows (a temporary file and rename per
        page where the mount has no ingest file); pages already stored are kept as they are.
        Per page: stored?"""
        if not self.served():
            self.counters.add(write_failures=len(keys))
            return [False] * len(keys)
        if self.plane is not None:
            outcome = self.plane.publish(rel_dir, keys, buffers, size, spread, runs)
            if True in outcome:
                self.failures.success()
            for key, result in zip(keys, outcome):
                if isinstance(result, OSError):
                    self.failures.failure(error_kind(result), f"cannot publish {rel_dir}/{key}: {result.strerror or result}")
                    self.counters.add(write_failures=1)
            todo = [i for i, result in enumerate(outcome) if result is None]
            if todo:
                # The plane's slots (this batch's among them) count against the files being
                # written until their commit is answered: the rest would find that share full.
                self.plane.settle()
                again = self._ingest(rel_dir, [keys[i] for i in todo], [buffers[i] for i in todo], size)
                for i, ok in zip(todo, again):
                    outcome[i] = ok
            return [result is True for result in outcome]
        return self._ingest(rel_dir, keys, buffers, size)

    def _ingest(self, rel_dir: str, keys: Sequence[str], buffers: Sequence[Sequence[memoryview]],
                size: int) -> List[bool]:
        """``publish_pages`` through the ingest file. A handle lost with its daemon (one
        restarted since) is replaced once, for the pages it did not publish."""
        paths = [f"{rel_dir}/{key}" for key in keys]
        outcome = self._ingest_batch(rel_dir, paths, buffers, size)
        if outcome is None:
            return self._publish_missing(rel_dir, keys, buffers, size)
        lost = [i for i, error in enumerate(outcome) if isinstance(error, ingest.HandleLost)]
        if lost:
            again = self._ingest_batch(rel_dir, [paths[i] for i in lost], [buffers[i] for i in lost], size)
            for i, error in zip(lost, again or []):
                outcome[i] = error
        published = 0
        for path, error in zip(paths, outcome):
            if error is None:
                published += 1
            else:
                self.failures.failure(error_kind(error), f"cannot publish {path}: {error.strerror or error}")
        if published:
            self.failures.success()
        self.counters.add(pages_written=published, bytes_written=published * size,
                          write_failures=len(keys) - published, batches_written=1)
        return [error is None for error in outcome]

    # ---------------------------------------------------------------- existence

    def exists(self, rels: Sequence[str], sizes: Optional[Sequence[Optional[int]]] = None) -> List[bool]:
        """For each relative page path: published and readable (as a page of ``sizes[i]``
        bytes, when given)? One request for all of them."""
        if not rels or not self.served():
            return [False] * len(rels)
        answers = self.plane.find(rels, sizes) if self.plane is not None else [None] * len(rels)
        return self._answered(answers, lambda i: rels[i], lambda i: None if sizes is None else sizes[i])

    def exists_in(self, rel_dir: str, keys: Sequence[str], size: Optional[int] = None) -> List[bool]:
        """``exists`` for pages of one pool directory, SGLang's usual ask."""
        if not keys or not self.served():
            return [False] * len(keys)
        answers = self.plane.find_in(rel_dir, keys, size) if self.plane is not None else [None] * len(keys)
        return self._answered(answers, lambda i: f"{rel_dir}/{keys[i]}", lambda i: size)

    def held_prefix(self, rel_dir: str, keys: Sequence[Any], valid_prefix: Callable[[Sequence[Any]], int],
                    size: Optional[int] = None) -> int:
        """How many of ``keys`` of one pool directory, from the first, are published and
        readable (as pages of ``size`` bytes, when given): the plane's answer, and the daemon's
        for the keys the plane cannot say.
        ``valid_prefix(keys)``: how many keys from the first are valid names (refusing the
        first that is not); the plane asks it only of the key it stopped at, the daemon is
        asked only of valid ones."""
        if not self.served():
            return 0
        held, sure = 0, False
        if self.plane is not None:
            held, sure = self.plane.held_prefix(rel_dir, keys, size)
        if held == len(keys):
            return held
        if sure:
            valid_prefix(keys[held : held + 1])
            return held
        rest = keys[held:]
        rest = rest[: valid_prefix(rest)]
        answers = self._exists_elsewhere([f"{rel_dir}/{key}" for key in rest], [size] * len(rest)) if rest else []
        return held + (answers.index(False) if False in answers else len(answers))

    def _answered(self, answers: List[Optional[bool]], rel_of: Callable[[int], str],
                  size_of: Callable[[int], Optional[int]]) -> List[bool]:
        """``answers`` with those the plane could not give (None) asked of the daemon; page
        ``i`` is at ``rel_of(i)``, of ``size_of(i)`` bytes (None: any size)."""
        if None not in answers:
            return answers  # type: ignore[return-value]
        asked = [i for i, answer in enumerate(answers) if answer is None]
        for i, answer in zip(asked, self._exists_elsewhere([rel_of(i) for i in asked], [size_of(i) for i in asked])):
            answers[i] = answer
        return answers  # type: ignore[return-value]

    def _exists_elsewhere(self, rels: Sequence[str], sizes: Sequence[Optional[int]]) -> List[bool]:
        """``exists`` through the daemon, a page counted only at its size in ``sizes`` (None:
        any): the exists file, ``stat`` where it cannot say."""
        answers: List[Optional[bool]] = [None] * len(rels)
        joined = "\n".join(rels)
        if joined.count("\n") == len(rels) - 1 and not _OTHER_LINE_BREAKS.search(joined):
            lines = list(range(len(rels)))  # the common case, checked in one pass
        else:
            lines = [i for i, rel in enumerate(rels) if not _LINE_BREAKS.search(rel)]
        if lines:
            got = self._query([rels[i] for i in lines], [sizes[i] for i in lines])
            if got is not None:
                for i, ok in zip(lines, got):
                    answers[i] = ok
        for i, answer in enumerate(answers):
            if answer is None:
                answers[i] = self._stat_exists(rels[i], sizes[i])
        return answers  # type: ignore[return-value]

    def _query(self, rels: Sequence[str], sizes: Sequence[Optional[int]]) -> Optional[List[bool]]:
        """Ask ``.hicachefs/exists``; None when it cannot answer (then stat answers)."""
        request, answer_at, lines = _exists_request(rels, sizes)
        expected = lines + 1
        with self.handles.using(EXISTS_FILE) as handle:
            if handle is None:
                return None
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
                self.handles.drop(handle)
                self.failures.failure(error_kind(exc), f"exists query failed: {exc.strerror or exc}")
                return None
            if len(answer) != expected or not answer.endswith(b"\n") or answer[:-1].strip(b"01"):
                self.handles.drop(handle)
                self.failures.failure(BAD_ANSWER, f"exists answered {bytes(answer[:40])!r}... "
                                                  f"for {len(rels)} paths")
                return None
        self.failures.success()
        self.counters.add(exists_queries=1, exists_paths=len(rels))
        return [answer[i] == 0x31 for i in answer_at]

    def _stat_exists(self, rel: str, size: Optional[int]) -> bool:
        self.counters.add(exists_stat_fallbacks=1)
        try:
            found = os.stat(self.path(rel))
            return stat.S_ISREG(found.st_mode) and (size is None or found.st_size == size)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                self.failures.failure(error_kind(exc), f"cannot stat {rel}: {exc.strerror or exc}")
            return False

    # ---------------------------------------------------------------- other

    def remove_tree(self, rel_dir: str) -> bool:
        """``rm -r`` of a directory below the root (evicts its pages). Missing is fine, and so
        is a directory that a page written meanwhile (another thread's backup) keeps, listed
        now: what the ``rm -r`` saw is gone, as the write could as well have come after it. One
        that lists nothing yet is not empty holds pages only another host's shared tier holds
        (``ls`` lists this host's): not cleared. False on a mount gone before or during it (the
        bare mountpoint is not the store). The plane's commits under way are waited for first:
        one answered after the ``rm -r`` would bring its pool back with its pages."""

        def on_error(function, path, info):
            if isinstance(info[1], FileNotFoundError):
                return
            if getattr(info[1], "errno", None) == errno.ENOTEMPTY and os.listdir(path):
                return
            raise info[1]

        if not self.served() or self._mount_gone():
            return False
        if self.plane is not None:
            self.plane.attached()  # (the mount's daemon met, if this client had not: its commits waited for)
            self.plane.settle()
        try:
            shutil.rmtree(self.path(rel_dir), onerror=on_error)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.failures.failure(error_kind(exc), f"cannot remove {rel_dir}: {exc.strerror or exc}")
            return False
        finally:
            if self.plane is not None:
                self.plane.forget_pools(rel_dir)
        return not self._mount_gone()

    def close(self) -> None:
        """Report the plane's reads not reported yet and close every thread's control file
        handles. Later calls still work (they open them again)."""
        if self.plane is not None:
            self.plane.close()
        self.handles.close()
