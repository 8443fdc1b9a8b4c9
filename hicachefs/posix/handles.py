"""Open files by handle number, and the kinds of handle that are not published pages or
control files: a file being written, a directory being listed.

Every handle has the same face: ``read``/``write`` coroutines (a handle may wait for a worker
thread or pause between steps), ``release``, and ``cacheable`` (whether the kernel may keep its
data: only a published page's). Published pages' handles are in ``page_handle.py``, the control
files' in the ``control`` package. Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Callable, Iterator
from typing import Protocol

from .errors import FsError
from .listing import Entry
from .nodes import PendingFile
from .page_handle import find_version


class Handle(Protocol):
    cacheable: bool

    async def read(self, offset: int, size: int): ...

    async def write(self, offset: int, data: bytes) -> int: ...

    def release(self) -> None: ...


#: Files and directories a user other than the store's own clients (root, the daemon's user)
#: may hold open on the mount, and all of them together: each costs the daemon about a KiB
#: (19,000 fetch handles of a plain user took it from 108 to 128 MiB), which descriptors alone
#: bounded (a user may raise its own limit to the system's, and run many processes).
OPEN_BY_USER, OPEN_BY_OTHERS = 16384, 65536


class HandleTable:
    """Handle numbers (the FUSE ``fh``) to handles; a number is never used twice. ``writers``:
    the users whose open files are not counted (``OPEN_BY_USER``)."""

    def __init__(self, writers: frozenset[int] = frozenset()) -> None:
        self._serials = itertools.count(1)
        self._handles: dict[int, Handle] = {}
        self._openers: dict[int, int] = {}
        self._writers = writers
        self._open_by: dict[int, int] = {}  # uid -> handles, of users not among ``writers``
        self._open_by_others = 0

    def add(self, handle: Handle, uid: int | None = None) -> int:
        """The handle's number; ``uid``: who opened it (``opener``), where known. EMFILE, the
        handle released, when a user other than the writers holds too many."""
        counted = uid is not None and uid not in self._writers
        if counted:
            mine = self._open_by.get(uid, 0)
            if mine >= OPEN_BY_USER or self._open_by_others >= OPEN_BY_OTHERS:
                handle.release()
                raise FsError(errno.EMFILE, f"uid {uid} holds {mine:,} open files on the mount; a user other "
                              f"than root and the daemon's may hold {OPEN_BY_USER:,} (all of them {OPEN_BY_OTHERS:,})")
            self._open_by[uid] = mine + 1
            self._open_by_others += 1
        number = next(self._serials)
        self._handles[number] = handle
        if uid is not None:
            self._openers[number] = uid
        return number

    def opener(self, fh: int) -> int | None:
        """The uid that opened the handle, if known."""
        return self._openers.get(fh)

    def get(self, fh: int) -> Handle:
        handle = self._handles.get(fh)
        if handle is None:
            raise FsError(errno.EBADF, "unknown file handle")
        return handle

    def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        uid = self._openers.pop(fh, None)
        if uid is not None and uid not in self._writers:
            left = self._open_by[uid] - 1
            if left:
                self._open_by[uid] = left
            else:
                del self._open_by[uid]
            self._open_by_others -= 1
        if handle is not None:
            handle.release()

    def __len__(self) -> int:
        return len(self._handles)


class PendingHandle:
    """An open file that is (or was) being written. Once the file is published, its handles
    read the page it became; once it is discarded (removed, replaced by a rename onto its name,
    abandoned), they read nothing more: EIO, never zeros where its bytes were. ``writing``: the
    handle was opened for writing; a read-only one never writes. ``bounded``: opened by a user
    who may not change the store, whose copies of the published page read from a lower tier
    count against ``private_reads_of_others``, as its other reads' do."""

    cacheable = False

    def __init__(self, pending: PendingFile, writing: bool, closed: Callable[[PendingFile, bool], None],
                 bounded: bool = False):
        self.pending = pending
        self.writing = writing
        self.bounded = bounded
        self._closed = closed

    async def read(self, offset: int, size: int):
        pending = self.pending
        if not pending.gone:
            return pending.read(offset, size)
        if pending.published is None:
            raise FsError(errno.EIO, "the file was removed or replaced before it was published")
        published = pending.published
        name = published.name if pending.node is None else pending.node.current_name(published.name)
        with await find_version(pending.store, name, published.version, self.bounded) as reader:
            return bytes(reader.read(offset, size))  # a copy: the pin ends here

    async def write(self, offset: int, data: bytes) -> int:
        if not self.writing:
            raise FsError(errno.EBADF, "file opened read-only")
        if self.pending.gone:
            raise FsError(errno.EPERM, "the file was published, replaced, removed or discarded; pages are immutable")
        return self.pending.write(offset, data)

    def release(self) -> None:
        self._closed(self.pending, self.writing)


class DirectoryHandle:
    """A directory being listed: its entries are read from the listing at each readdir's offset
    (``listing.py``), so the handle holds no entries of its own."""

    cacheable = False

    def __init__(self, listing: Callable[[int], Iterator[tuple[int, Entry]]]):
        self.listing = listing

    async def read(self, offset: int, size: int):
        raise FsError(errno.EISDIR, "is a directory")

    async def write(self, offset: int, data: bytes) -> int:
        raise FsError(errno.EISDIR, "is a directory")

    def release(self) -> None:
        pass
