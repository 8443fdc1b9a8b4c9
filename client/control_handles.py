"""Each thread's own handles on the mount's control files (``.hicachefs/exists``, ``ingest``,
``fetch``).

A handle holds one request at a time, so every thread opens its own and keeps it for the next
call (and a second one where it asks for it: ``using(name, second=True)``); a thread that ends
closes its handles (they are only weakly kept here). ``close`` closes every thread's handles,
but a handle in use is closed by its thread when the call is done: closing it under the call
would let the descriptor number be reused, and the call go on writing to another file. A
control file that cannot be opened is not tried again for a second: the caller then answers its
own way (``stat``, a temporary file and rename, a file per page), which also serves a plain
directory or a daemon that predates the file.

Each thread opens each control file under a name of its own (``exists.1`` ... ``exists.63``,
and so for ``ingest`` and ``fetch``: each a file of its own to the kernel, which lets one write
at a time into one file): handles take the names in turn from a random start per process, so
that processes rarely share one. A daemon without those names is used through the plain ones.

Thread-safe.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import random
import threading
import time
import weakref
from typing import Dict, Iterator, Optional

from . import forks
from .accounting import FailureLog, error_kind

CONTROL_DIR = ".hicachefs"
EXISTS_FILE = f"{CONTROL_DIR}/exists"
INGEST_FILE = f"{CONTROL_DIR}/ingest"
FETCH_FILE = f"{CONTROL_DIR}/fetch"
# Each control file's other names: <name>.1 ... <name>.63 (see the module docstring).
OTHER_NAMES = 63
# Retry opening a control file that could not be opened at most this often (seconds).
RETRY_INTERVAL_S = 1.0


class ControlHandle:
    """One open control file, owned by one thread; ``state`` is its protocol's (what the
    handle holds at the daemon between calls). ``name`` is the file's, and ``#2`` after it for
    the thread's second handle on it."""

    __slots__ = ("name", "fd", "busy", "retired", "lock", "state", "__weakref__")

    def __init__(self, name: str, fd: int) -> None:
        self.name, self.fd = name, fd
        self.busy = 0  # calls using it now (its owner's, and one lent to another thread)
        self.retired = False
        self.lock = threading.Lock()
        self.state = None

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def retire(self) -> None:
        """Close now, or when the owning thread's call is done."""
        with self.lock:
            if self.busy:
                self.retired = True
            else:
                self.close()

    def __del__(self) -> None:  # the owning thread ended
        self.close()


class ControlHandles:
    """The calling thread's handle on each control file of one mount. See the module docstring."""

    def __init__(self, root: str, failures: FailureLog) -> None:
        self.root = root
        self.failures = failures
        self._local = threading.local()
        self._all: "weakref.WeakSet[ControlHandle]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._retry_at: Dict[str, float] = {}
        self._other_names = itertools.count(random.randrange(OTHER_NAMES))
        self._has_other_names = True  # until a daemon without them is seen
        # Once a daemon has been seen here, a root without .hicachefs/ is a bare mountpoint.
        self.seen_daemon = os.path.isdir(os.path.join(root, CONTROL_DIR))
        forks.renew_in_child(self)

    def forked(self) -> None:
        """In a forked child: the parent's handles are its own (the same open files at the
        daemon, with their reservations); the child opens its own."""
        self._lock = threading.Lock()
        self._local = threading.local()
        for handle in list(self._all):
            handle.lock = threading.Lock()
            handle.close()  # the child's copy of the descriptor
        self._all = weakref.WeakSet()

    @contextlib.contextmanager
    def using(self, name: str, second: bool = False) -> Iterator[Optional[ControlHandle]]:
        """This thread's open handle on control file ``name`` for one call (None if it cannot
        be had); a ``close`` meanwhile takes effect when the call is done. ``second``: the
        thread's second handle on it (opened the first time it is asked for)."""
        for _ in range(2):  # a handle another thread closed just now is opened again
            handle = self._get(f"{name}#2" if second else name)
            if handle is None:
                yield None
                return
            if self._hold(handle):
                break
        else:
            yield None
            return
        try:
            yield handle
        finally:
            self._let_go(handle)

    @contextlib.contextmanager
    def lent(self, handle: ControlHandle) -> Iterator[Optional[ControlHandle]]:
        """Another thread's handle, used here for one call while its owner waits for it (a
        commit sent behind its batch); None once it was closed."""
        held = self._hold(handle)
        try:
            yield handle if held else None
        finally:
            if held:
                self._let_go(handle)

    @staticmethod
    def _hold(handle: ControlHandle) -> bool:
        with handle.lock:
            if handle.fd < 0 or handle.retired:
                return False
            handle.busy += 1
            return True

    def _let_go(self, handle: ControlHandle) -> None:
        with handle.lock:
            handle.busy -= 1
            retired = handle.retired and not handle.busy
        if retired:
            self.drop(handle)

    def _get(self, key: str) -> Optional[ControlHandle]:
        mine: Dict[str, ControlHandle] = self._mine()
        handle = mine.get(key)
        if handle is not None and handle.fd >= 0:
            return handle
        name = key.partition("#")[0]
        if time.monotonic() < self._retry_at.get(name, 0.0):
            return None
        path = os.path.join(self.root, name)
        try:
            fd = self._open(path)
        except OSError as exc:
            self._retry_at[name] = time.monotonic() + RETRY_INTERVAL_S
            if exc.errno == errno.ENOENT:
                self.failures.failure(f"NO_{os.path.basename(name).upper()}_FILE",
                                      f"{path} does not exist; doing without it",
                                      level=logging.INFO, sticky=True)
            else:
                self.failures.failure(error_kind(exc), f"cannot open {path}: {exc.strerror or exc}")
            return None
        self.seen_daemon = True
        handle = mine[key] = ControlHandle(key, fd)
        with self._lock:
            self._all.add(handle)
        return handle

    def _open(self, path: str) -> int:
        if self._has_other_names:
            with self._lock:
                other = next(self._other_names) % OTHER_NAMES + 1
            try:
                return os.open(f"{path}.{other}", os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)  # no daemon at all: raises, lanes kept
                self._has_other_names = False  # a daemon that predates them
                return fd
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def drop(self, handle: ControlHandle) -> None:
        """Close a handle that failed; the thread's next ``get`` opens a new one."""
        handle.close()
        mine = self._mine()
        if mine.get(handle.name) is handle:
            del mine[handle.name]

    def close(self) -> None:
        """Close every thread's handles. Later calls still work (handles reopen)."""
        with self._lock:
            handles = list(self._all)
        for handle in handles:
            handle.retire()

    def _mine(self) -> Dict[str, ControlHandle]:
        mine = getattr(self._local, "handles", None)
        if mine is None:
            mine = self._local.handles = {}
        return mine
