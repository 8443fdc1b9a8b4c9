"""The control files under ``.hicachefs/``: stats, metrics, config and the exists query.

Read-only files render a snapshot at open, so one ``cat`` sees one consistent state. The
``exists`` file is a per-handle request/answer stream (DESIGN.md, "Batch existence query").
No pyfuse3 here; not thread-safe (trio thread only).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable

from .. import metrics
from ..store import PageStore
from .errors import FsError
from .nodes import Stat

CONTROL_DIR_INODE = 2
_FILES = {b"stats": 3, b"metrics": 4, b"config": 5, b"exists": 6}
CONTROL_INODES = frozenset({CONTROL_DIR_INODE, *_FILES.values()})
#: The largest exists request one handle accepts (about 300,000 page paths).
MAX_EXISTS_REQUEST = 64 << 20


class SnapshotHandle:
    """A read-only control file's content, fixed when it was opened."""

    def __init__(self, content: bytes):
        self.content = content

    def read(self, offset: int, size: int) -> bytes:
        return self.content[offset : offset + size]

    def write(self, offset: int, data: bytes) -> int:
        raise FsError(errno.EACCES, "control file is read-only")

    def release(self) -> None:
        pass


class ExistsHandle:
    """One client's exists query: writes append to the request, the next read answers it.

    Offsets are ignored on purpose: the protocol is a stream, so ``write``/``read`` and
    ``pwrite``/``pread`` at any offset behave the same.
    """

    def __init__(self, store: PageStore):
        self.store = store
        self.request = bytearray()
        self.answer: bytes | None = None
        self.answered = 0

    def write(self, offset: int, data: bytes) -> int:
        if self.answer is not None:  # a write after a read starts a new request
            self.request.clear()
            self.answer = None
        if len(self.request) + len(data) > MAX_EXISTS_REQUEST:
            raise FsError(errno.EFBIG, f"exists request over {MAX_EXISTS_REQUEST} bytes")
        self.request += data
        return len(data)

    def read(self, offset: int, size: int) -> bytes:
        if self.answer is None:
            self.answer = self._answer()
            self.answered = 0
            self.request.clear()
        chunk = self.answer[self.answered : self.answered + size]
        self.answered += len(chunk)
        return chunk

    def release(self) -> None:
        pass

    def _answer(self) -> bytes:
        """One '1' or '0' per request line. No name checks are needed: the store holds only
        valid page names, so a line is '1' exactly when it decodes to one of them."""
        request = bytes(self.request)
        if not request:
            return b"\n"
        if request.endswith(b"\n"):
            request = request[:-1]
        try:
            lines = request.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            lines = [_decoded_or_empty(line) for line in request.split(b"\n")]
        found = self.store.exists_many(lines)
        return bytes(0x31 if hit else 0x30 for hit in found) + b"\n"


def _decoded_or_empty(line: bytes) -> str:
    """A request line as text; a line that is not UTF-8 names no page ('' is never one)."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return ""


class ControlFiles:
    """Serves ``.hicachefs/*`` from callables that produce the daemon's facts."""

    dir_inode = CONTROL_DIR_INODE

    def __init__(self, store: PageStore, statistics: Callable[[], dict], config: dict):
        self.store = store
        self.statistics = statistics
        self.config = config
        self.started_ns = time.time_ns()

    def lookup(self, name: bytes) -> int:
        inode = _FILES.get(name)
        if inode is None:
            raise FsError(errno.ENOENT, "no such control file")
        return inode

    def entries(self) -> list[tuple[bytes, int]]:
        return sorted(_FILES.items())

    def stat(self, inode: int) -> Stat:
        if inode == CONTROL_DIR_INODE:
            return Stat(inode, stat.S_IFDIR | 0o555, 0, 2, self.started_ns, self.started_ns)
        mode = 0o666 if inode == _FILES[b"exists"] else 0o444
        return Stat(inode, stat.S_IFREG | mode, 0, 1, self.started_ns, self.started_ns)

    def open(self, inode: int, flags: int):
        if inode == CONTROL_DIR_INODE:
            raise FsError(errno.EISDIR, "is a directory")
        if inode == _FILES[b"exists"]:
            return ExistsHandle(self.store)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            raise FsError(errno.EACCES, "control file is read-only")
        if inode == _FILES[b"stats"]:
            return SnapshotHandle(render_json(self.statistics()))
        if inode == _FILES[b"metrics"]:
            return SnapshotHandle(metrics.render(self.statistics()))
        return SnapshotHandle(render_json(self.config))


def render_json(facts: dict) -> bytes:
    return (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode()
