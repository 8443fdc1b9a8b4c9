"""The files under ``.hicachefs/`` (docs/contract.md, "Control files"): stats, metrics and
config (snapshots rendered at open, so one ``cat`` sees one consistent state), the request
streams (``exists.py``, ``ingest.py``, ``fetch.py``, ``plane.py``) and the data plane's links
(``arena``, ``index``, ``disk``: symbolic links to this process's descriptors).

Each request stream also answers to ``<name>.1`` ... ``<name>.63`` (``exists.1``,
``ingest.1``...), not listed: the same file under names that are files of their own to the
kernel (inodes of their own). The kernel lets one write at a time into a file opened for direct
I/O (it holds the inode's lock for the write; libfuse 3.14 cannot tell it that writes may run
in parallel), so clients whose requests all went through one name would send one WRITE at a
time. A client spreads its threads over the names.

The control files own the inodes below ``posix.inodes.FIRST_PAGE_INODE``. To add a control file:
a name and inode in ``_FILES`` (``_STREAMS`` too for a request stream), a handle class of its
own module, and a line in ``ControlFiles.open``; ``_WRITER_FILES`` or ``_REQUEST_FILES`` say who
may open it. Every handle's ``read`` and ``write`` are coroutines (a handle may pause between
steps of a large request, or wait for a worker thread). No pyfuse3 here; not thread-safe (trio
thread only).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable
from typing import Protocol

from ..posix.errors import FsError
from ..posix.inodes import CONTROL_DIR_INODE, FIRST_PAGE_INODE
from ..posix.nodes import Stat
from ..posix.page_handle import Leases
from ..posix.publishing import Publishing
from ..store import PageStore
from .exists import ExistsHandle
from .fetch import FetchHandle
from .ingest import IngestHandle
from .plane import PlaneHandle
from .request_limits import Account, RequestLimits

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
assert FIRST_PAGE_INODE > max(_FILE_OF), "the control files' inodes are below the pages'"
class SnapshotHandle:
    """A read-only control file's content, fixed when it was opened, held against its opener's
    share of the request files' memory (``request_limits``) until it closes: any user may open
    these, and 20,000 ``metrics`` handles held open by a plain user took the daemon from 110 to
    240 MiB, with no bound but the user's descriptors."""

    cacheable = False

    def __init__(self, content: bytes, account: Account):
        """ENOBUFS, holding nothing, when ``content`` does not fit the opener's share."""
        account.hold(len(content))
        self.content = content
        self.account = account

    async def read(self, offset: int, size: int) -> bytes:
        return self.content[offset : offset + size]

    async def write(self, offset: int, data: bytes) -> int:
        raise FsError(errno.EACCES, "control file is read-only")

    def release(self) -> None:
        self.account.hold(0)


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
        self.plane_ahead = store.budget.share("reserved_ahead")

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

    def read_only(self, inode: int) -> bool:
        """Whether no one may write ``inode``, root included (the snapshots, the directory)."""
        return self.file_of(inode) not in _WRITER_FILES | _REQUEST_FILES

    def is_request_file(self, inode: int) -> bool:
        """Whether any user may open ``inode`` for writing (its writes ask, they change nothing)."""
        return self.file_of(inode) in _REQUEST_FILES

    def open(self, inode: int, flags: int, publisher: Publishing, leases: Leases, uid: int = 0):
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
            return IngestHandle(publisher, self.store.config.max_page_size, self.request_limits.account(uid))
        if inode == _FILES[b"plane"]:
            return PlaneHandle(self.store, publisher, self.plane_ahead, self.request_limits.account(uid))
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            raise FsError(errno.EACCES, "control file is read-only")
        account = self.request_limits.account(uid)
        if inode == _FILES[b"stats"]:
            return SnapshotHandle(render_json(self.statistics().as_dict()), account)
        if inode == _FILES[b"metrics"]:
            return SnapshotHandle(self.render_metrics(self.statistics()), account)
        return SnapshotHandle(render_json(self.config), account)


def render_json(facts: dict) -> bytes:
    return (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode()
