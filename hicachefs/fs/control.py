"""The control files under ``.hicachefs/``: stats, metrics, config, and the request streams
(exists, ingest, fetch).

Read-only files render a snapshot at open, so one ``cat`` sees one consistent state. The
``exists`` file is a per-handle request/answer stream (DESIGN.md, "Batch existence query");
``ingest`` and ``fetch`` publish and read many pages per request (``ingest.py``, ``fetch.py``).

Each of those three streams also answers to ``<name>.1`` ... ``<name>.63`` (``exists.1``,
``ingest.1``...), not listed: the same file under names that are files of their own to the
kernel (inodes of their own). The kernel lets one write at a time into a file opened for direct
I/O (it holds the inode's lock for the write; libfuse 3.14 cannot tell it that writes may run
in parallel), so clients whose requests all go through one name send one WRITE at a time,
however many requests the daemon (its worker processes) could take at once. A client spreads
its threads over the names.

Every handle's ``read`` and ``write`` are coroutines: a handle may pause between steps of a
large request, or wait for a worker thread. No pyfuse3 here; not thread-safe (trio thread only).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable
from typing import Protocol

from .. import names
from ..store import PageStore
from .errors import FsError
from .fetch import FetchHandle
from .page_handle import Leases
from .ingest import IngestStream, Publisher
from .nodes import Stat
from .plane import AheadBudget, PlaneHandle
from .request_limits import Account, RequestLimits

CONTROL_DIR_INODE = 2
_FILES = {b"stats": 3, b"metrics": 4, b"config": 5, b"exists": 6, b"ingest": 7, b"fetch": 8, b"plane": 9}
#: The data plane's files, as symbolic links to this process's descriptors (``plane.py``).
_LINKS = {b"arena": 10, b"index": 11, b"disk": 12}
#: How many names each request stream answers to: its own and ``<name>.1`` ... (see above).
LANES = 64
_STREAMS = (b"exists", b"ingest", b"fetch", b"plane")


def _lanes() -> tuple[dict[bytes, int], dict[int, int]]:
    """The streams' other names with their inodes, and every file's inode (under any of its
    names) with the inode of the file it is."""
    names, file_of = {}, {inode: inode for inode in _FILES.values()}
    for name in _STREAMS:
        for lane in range(1, LANES):
            inode = max(_LINKS.values()) + 1 + len(names)
            names[b"%s.%d" % (name, lane)] = inode
            file_of[inode] = _FILES[name]
    return names, file_of


_LANE_NAMES, _FILE_OF = _lanes()
INGEST_INODE = _FILES[b"ingest"]
#: Files only root and the daemon's user may open, however: their writes change the store.
_WRITER_FILES = frozenset({INGEST_INODE, _FILES[b"plane"]})
#: Files any user may open for writing: their writes are requests, not changes to the store.
_REQUEST_FILES = frozenset({_FILES[b"exists"], _FILES[b"fetch"]})
CONTROL_INODES = frozenset({CONTROL_DIR_INODE, *_FILE_OF, *_LINKS.values()})
#: The largest exists request one handle accepts. SGLang asks about 128 pages at a time for
#: each of its pools (some 70 KB); this holds a whole long prompt asked in one request: 8,192
#: pages (half a million tokens at 64 a page) for 4 pools, at 256 bytes a path.
MAX_EXISTS_REQUEST = 8 << 20
#: Request lines answered in one step: about 1.3 ms of the daemon's time (2,048 took 2.6 ms on
#: the development VM), the longest a small request waits behind a large one (``StepLane``).
LINES_PER_STEP = 1024
_STEP_BYTES = LINES_PER_STEP * 512
#: The longest line that can name a page: five components of at most 200 bytes, four '/'.
_LONGEST_PATH = 5 * names.MAX_NAME_BYTES + 4
_DIGITS = bytes.maketrans(b"\x00\x01", b"01")


class SnapshotHandle:
    """A read-only control file's content, fixed when it was opened."""

    cacheable = False

    def __init__(self, content: bytes):
        self.content = content

    async def read(self, offset: int, size: int) -> bytes:
        return self.content[offset : offset + size]

    async def write(self, offset: int, data: bytes) -> int:
        raise FsError(errno.EACCES, "control file is read-only")

    def release(self) -> None:
        pass


class IngestHandle:
    """A handle on ``.hicachefs/ingest``: its writes are batches of pages, a read tells how the
    last one went (``ingest.py``)."""

    cacheable = False

    def __init__(self, publisher: Publisher, max_page_size: int):
        self.stream = IngestStream(publisher, max_page_size)

    async def read(self, offset: int, size: int) -> bytes:
        return self.stream.status()[offset : offset + size]

    async def write(self, offset: int, data: bytes) -> int:
        """Take the write; answer once the kernel knows of every page it replaced, so that a
        reader told of the replace by the writer never reads the old page from its cache."""
        try:
            return self.stream.write(offset, data)
        finally:
            await self.stream.publisher.kernel_told()

    def release(self) -> None:
        self.stream.close()


class ExistsHandle:
    """One client's exists query: writes append to the request, the next read answers it.

    The answer is worked out in steps of at most ``LINES_PER_STEP`` lines (``answer_step``): a
    request of one step is answered at once, a larger one's steps take turns with other large
    requests' (``request_limits``), so small requests go first. The handle holds its request
    and, at most, an answer byte per line of it, then the answer alone, against its user's
    share. A write that would make the request larger than ``MAX_EXISTS_REQUEST`` fails with
    EFBIG, one over the user's share with ENOBUFS, and so does the write that makes a request
    large (more than a step) when its user has as many large requests as its share allows;
    either fails the request: later writes fail too, and so does the read that follows, after
    which the handle takes a new request.

    Offsets are ignored on purpose: the protocol is a stream, so ``write``/``read`` and
    ``pwrite``/``pread`` at any offset behave the same.
    """

    cacheable = False

    def __init__(self, store: PageStore, account: Account):
        self.store = store
        self.account = account
        self._new_request()

    def _new_request(self) -> None:
        self._request = bytearray()
        self._lines = 0  # newlines in the request
        self._scanned = 0  # request bytes answered so far
        self._answer: bytearray | None = None  # set once answering began
        self._complete = False
        self._read = 0  # answer bytes read
        self._failure: FsError | None = None
        self.account.hold(0)

    async def write(self, offset: int, data: bytes) -> int:
        data = bytes(data)  # a worker's write arrives as a view of its message
        if self._failure is not None:
            raise FsError(self._failure.errno, f"{self._failure.strerror}; read to end the request")
        if self._answer is not None:  # a write after a read starts a new request
            self._new_request()
        size, lines = len(self._request) + len(data), self._lines + data.count(b"\n")
        try:
            if size > MAX_EXISTS_REQUEST:
                raise FsError(errno.EFBIG, f"exists request over {MAX_EXISTS_REQUEST} bytes")
            # the request, and its answer at the most
            self.account.hold(size + lines + 1, large=size > _STEP_BYTES or lines >= LINES_PER_STEP)
        except FsError as exc:
            self._new_request()
            # A copy: the raised error's traceback holds the write's data (a MiB) for as long as
            # the handle is kept, and 100 handles refused that way held 90 MiB.
            self._failure = FsError(exc.errno, exc.strerror)
            raise
        self._request += data
        self._lines = lines
        return len(data)

    def answer_step(self) -> bool:
        """Answer up to ``LINES_PER_STEP`` more lines; True while more steps remain."""
        if self._failure is not None or self._complete:
            return False
        if self._answer is None:
            self._answer = bytearray()
        request, start = self._request, self._scanned
        window = bytes(memoryview(request)[start : start + _STEP_BYTES])
        lines = window.split(b"\n", LINES_PER_STEP)
        if start + len(window) == len(request) and len(lines) <= LINES_PER_STEP:
            if lines[-1] == b"":  # the request's last newline ends its last line
                lines.pop()
            self._scanned = len(request)
        elif len(lines) == 1:  # a line longer than a step's bytes: it names no page
            end = request.find(b"\n", start + len(window))
            lines = [b""]
            self._scanned = len(request) if end < 0 else end + 1
        else:
            self._scanned = start + len(window) - len(lines.pop())  # the rest: next step
        self._answer += self._found(lines)
        if self._scanned >= len(request):
            self._answer += b"\n"
            self._complete = True
            self._request = bytearray()  # the answer is all this request still needs
            self.account.hold(len(self._answer))
        return not self._complete

    async def read(self, offset: int, size: int) -> bytes:
        """The answer: a small request's at once, a large one's a step at a time in the lane."""
        if self._failure is not None:
            failure = self._failure
            self._new_request()
            raise FsError(failure.errno, f"the exists request failed: {failure.strerror}")
        if not self.account.large:  # at most one step's lines and bytes
            self.answer_step()
        if not self._complete:
            await self.account.in_steps(self.answer_step)
        chunk = bytes(self._answer[self._read : self._read + size])
        self._read += len(chunk)
        return chunk

    def release(self) -> None:
        self._new_request()

    def _found(self, lines: list[bytes]) -> bytes:
        """'1' or '0' per line. No name checks are needed: the store holds only valid page
        names, so a line is '1' exactly when it decodes to one of them; lines that cannot be a
        page path (not five components, too long, not UTF-8) are not looked up at all."""
        candidates, where = [], []
        for i, line in enumerate(lines):
            if line.count(b"/") == 4 and len(line) <= _LONGEST_PATH:
                try:
                    candidates.append(line.decode("utf-8"))
                except UnicodeDecodeError:
                    continue
                where.append(i)
        found = bytearray(len(lines))
        if candidates:
            for i, hit in zip(where, self.store.exists_many(candidates)):
                found[i] = hit
        return found.translate(_DIGITS)


class Statistics(Protocol):
    def as_dict(self) -> dict: ...


class ControlFiles:
    """Serves ``.hicachefs/*`` from callables that produce the daemon's facts: ``statistics()``
    (a value with ``as_dict``, which the stats file shows) and ``render_metrics`` (which makes
    the metrics file of it)."""

    dir_inode = CONTROL_DIR_INODE

    def __init__(self, store: PageStore, statistics: Callable[[], Statistics],
                 render_metrics: Callable[[Statistics], bytes], config: dict):
        self.store = store
        self.statistics = statistics
        self.render_metrics = render_metrics
        self.config = config
        self.started_ns = time.time_ns()
        self.request_limits = RequestLimits(writers=frozenset({0, os.getuid()}))
        self.plane_ahead = AheadBudget(store.config.memory_bytes)

    def lookup(self, name: bytes) -> int:
        inode = _FILES.get(name) or _LANE_NAMES.get(name) or _LINKS.get(name)
        if inode is None or (inode == _LINKS[b"disk"] and self.store.plane_files().disk is None):
            raise FsError(errno.ENOENT, "no such control file")
        return inode

    def readlink(self, inode: int) -> bytes:
        """Where a data-plane link leads: this process's descriptor of that file. The kernel lets
        only root and this process's user follow it (``/proc``'s ptrace check)."""
        files = self.store.plane_files()
        fd = {_LINKS[b"arena"]: files.arena, _LINKS[b"index"]: files.index, _LINKS[b"disk"]: files.disk}.get(inode)
        if fd is None:
            raise FsError(errno.EINVAL, "not a symbolic link")
        return f"/proc/{os.getpid()}/fd/{fd}".encode()

    def writers_only(self, inode: int) -> bool:
        """Whether only root and the daemon's user may open ``inode``, for reading too."""
        return self.file_of(inode) in _WRITER_FILES

    @staticmethod
    def file_of(inode: int) -> int:
        """The control file an inode is, under whichever of its names (see the module
        docstring)."""
        return _FILE_OF.get(inode, inode)

    def entries(self) -> list[tuple[bytes, int]]:
        links = {name: inode for name, inode in _LINKS.items() if name != b"disk" or self.store.plane_files().disk is not None}
        return sorted({**_FILES, **links}.items())

    def stat(self, inode: int) -> Stat:
        if inode == CONTROL_DIR_INODE:
            return Stat(inode, stat.S_IFDIR | 0o555, 0, 2, self.started_ns, self.started_ns)
        if inode in _LINKS.values():  # where it leads changes as the index grows: never cached
            return Stat(inode, stat.S_IFLNK | 0o777, len(self.readlink(inode)), 1, self.started_ns,
                        self.started_ns, volatile=True)
        file = self.file_of(inode)
        mode = 0o666 if file in _REQUEST_FILES else 0o644 if file in _WRITER_FILES else 0o444
        return Stat(inode, stat.S_IFREG | mode, 0, 1, self.started_ns, self.started_ns)

    def is_request_file(self, inode: int) -> bool:
        """Whether any user may open ``inode`` for writing (its writes ask, they change nothing)."""
        return self.file_of(inode) in _REQUEST_FILES

    def open(self, inode: int, flags: int, publisher: Publisher, leases: Leases, uid: int = 0):
        """A handle on a control file; ``leases``: what bounds a fetch handle's pins; ``uid``:
        who opens it (whose share a request file's requests take)."""
        if inode == CONTROL_DIR_INODE:
            raise FsError(errno.EISDIR, "is a directory")
        if inode in _LINKS.values():
            raise FsError(errno.ELOOP, "a symbolic link")
        inode = self.file_of(inode)
        if inode == _FILES[b"exists"]:
            return ExistsHandle(self.store, self.request_limits.account(uid))
        if inode == _FILES[b"fetch"]:
            return FetchHandle(self.store, self.request_limits.account(uid), leases)
        if inode == INGEST_INODE:
            return IngestHandle(publisher, self.store.config.max_page_size)
        if inode == _FILES[b"plane"]:
            return PlaneHandle(self.store, publisher, self.plane_ahead)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            raise FsError(errno.EACCES, "control file is read-only")
        if inode == _FILES[b"stats"]:
            return SnapshotHandle(render_json(self.statistics().as_dict()))
        if inode == _FILES[b"metrics"]:
            return SnapshotHandle(self.render_metrics(self.statistics()))
        return SnapshotHandle(render_json(self.config))


def render_json(facts: dict) -> bytes:
    return (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode()
