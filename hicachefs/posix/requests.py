"""The mount's FUSE requests as plain calls: plain arguments in, plain answers out, no pyfuse3.

``operations.Operations`` calls it. What each request means is the namespace's; here the blocking
I/O it may still need runs in a worker thread (``NeedsIO``), requests and refusals are counted,
and a refusal is given its errno and logged, a few lines per kind and user (``refused``, the one
place that does; ``refusal_log``).

Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import stat
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from ..store import StoreError
from .blocking import settled
from .errors import FsError, errno_of
from .listing import Describe
from .namespace import Namespace, Room
from .nodes import Stat
from .refusal_log import RefusalLog

log = logging.getLogger(__name__)

#: Answers that are ordinary traffic, not problems worth a log line (ESTALE: an open that raced
#: a replace, which the kernel retries with a fresh lookup).
_QUIET = {errno.ENOENT, errno.EEXIST, errno.ENODATA, errno.ESTALE}
#: Requests on an open handle: their first argument is its number, and their sender its opener.
_ON_HANDLES = frozenset({"read", "write", "release", "readdir", "releasedir"})
#: How long the kernel may remember a name that is missing, where the namespace lets it.
MISS_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Miss:
    """A lookup that found nothing; the kernel may remember that for ``timeout_s``."""

    timeout_s: float


@dataclass(frozen=True)
class Opened:
    """An open file: its handle number, and whether the kernel may keep its data."""

    fh: int
    cacheable: bool


class Requests:
    """Every FUSE request the mount answers, as a coroutine over the namespace."""

    def __init__(self, namespace: Namespace,
                 turn_of: Callable[[int | None], AbstractAsyncContextManager[None]] = lambda uid: contextlib.nullcontext()):
        """``turn_of(uid)``: what a request of ``uid`` that lists a directory waits for first (a
        turn in the lane of users other than the store's own clients: ``request_limits``)."""
        self.namespace = namespace
        self.turn_of = turn_of
        self.uid, self.gid = namespace.uid, namespace.gid  # who owns every file
        self.errors: collections.Counter[str] = collections.Counter()
        self.refusals = RefusalLog(log)
        #: Requests answered, by operation.
        self.counts: collections.Counter[str] = collections.Counter()
        #: The entries the last readdir of each directory handle offered, for ``took``: each
        #: one's ``Describe`` and inode.
        self._offered: dict[int, list[tuple[Describe, int]]] = {}

    def count(self, op: str) -> None:
        self.counts[op] += 1

    def refused(self, op: str, args: tuple, exc: BaseException) -> int:
        """The errno a failed request answers with, counted and (unless it is ordinary
        traffic) logged, a few lines per kind and user (``refusal_log``); anything that is not
        a refusal is a bug, logged as an error and answered EIO. ``args``: the request's, as the
        FUSE adapter got them (they say whose it is: ``_sender``)."""
        if not isinstance(exc, (FsError, StoreError)):
            self.errors["EIO"] += 1
            self.refusals.refused("internal", self._sender(op, args), logging.ERROR,
                                  "%s%r failed unexpectedly; answering EIO", op, args[:2], exc_info=exc)
            return errno.EIO
        err = errno_of(exc)
        if err not in _QUIET:
            name = errno.errorcode.get(err, str(err))
            self.errors[name] += 1
            why = exc.strerror if isinstance(exc, FsError) else str(exc)
            self.refusals.refused(name, self._sender(op, args), logging.WARNING, "%s%r: %s (%s)", op, args[:2],
                                  name, why)
        return err

    def _sender(self, op: str, args: tuple) -> int | None:
        """The uid a request came from: its context's (pyfuse3 hands most requests their
        sender's as their last argument), or, for a request on a handle, its opener's; None
        where neither says."""
        context = args[-1] if args else None
        if hasattr(context, "uid"):
            return context.uid
        if op in _ON_HANDLES and args:
            return self.namespace.handles.opener(args[0])
        return None

    # ---- attributes ----------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, pid: int = 0) -> Stat | Miss:
        st = await settled(self.namespace.lookup(parent_inode, name, pid))
        if st is not None:
            return st
        return Miss(MISS_TIMEOUT_S if self.namespace.caches_misses(parent_inode) else 0.0)

    async def forget(self, inode_list) -> None:
        for inode, nlookup in inode_list:
            try:
                self.namespace.forget(inode, nlookup)
            except Exception:  # forget must never raise
                log.exception("forget(%s) failed", inode)

    async def getattr(self, inode: int) -> Stat:
        return self.namespace.getattr(inode)

    async def setattr(self, inode: int, uid: int, size: int | None, mode: int | None,
                      owner: int | None, group: int | None) -> Stat:
        if not self.namespace.may_change(uid) and (mode, owner, group) != (None, None, None):
            raise FsError(errno.EPERM, "only root and the daemon's user may change the store")
        self.namespace.check_writer(uid)
        return self.namespace.setattr(inode, size=size, mode=mode, uid=owner, gid=group)

    async def access(self, inode: int, mode: int, uid: int) -> bool:
        return self.namespace.access(inode, mode, uid)

    async def statfs(self) -> Room:
        return self.namespace.room()

    # ---- directories ---------------------------------------------------------------

    async def mkdir(self, parent_inode: int, name: bytes, uid: int) -> Stat:
        self.namespace.check_writer(uid)
        return self.namespace.mkdir(parent_inode, name)

    async def rmdir(self, parent_inode: int, name: bytes, uid: int) -> None:
        self.namespace.check_writer(uid)
        self.namespace.rmdir(parent_inode, name)

    async def opendir(self, inode: int, uid: int | None = None) -> int:
        async with self.turn_of(uid):
            return self.namespace.handles.add(self.namespace.opendir(inode), uid)

    async def readdir(self, fh: int, start: int, limit: int) -> list[tuple[int, bytes, Stat]]:
        """Up to ``limit`` entries from position ``start``: (next position, name, attributes).
        The kernel may take fewer: ``took`` says how many, so that they count as lookups, and
        the rest are let go."""
        async with self.turn_of(self.namespace.handles.opener(fh)):
            return self._entries(fh, start, limit)

    def _entries(self, fh: int, start: int, limit: int) -> list[tuple[int, bytes, Stat]]:
        entries, offered = [], []
        for next_id, (name, describe) in self.handle(fh).listing(start):
            st = describe(False)
            entries.append((next_id, name, st))
            offered.append((describe, st.inode))
            if len(entries) >= limit:
                break
        self._offered[fh] = offered
        return entries

    async def took(self, fh: int, count: int) -> None:
        # The very entries offered, not a second listing: the store's other threads may have
        # changed it in between (a page reclaimed shifts it), which counted the wrong ones.
        offered = self._offered.pop(fh, [])
        for describe, _ in offered[:count]:
            describe(True)
        self.namespace.not_taken([inode for _, inode in offered[count:]])

    async def releasedir(self, fh: int) -> None:
        self._offered.pop(fh, None)
        self.namespace.handles.release(fh)

    # ---- files ---------------------------------------------------------------------

    async def create(self, parent_inode: int, name: bytes, flags: int, uid: int) -> tuple[Stat, Opened]:
        self.namespace.check_writer(uid)
        st, handle = self.namespace.create(parent_inode, name, flags, uid)
        return st, self._opened(handle, uid)

    async def open(self, inode: int, flags: int, uid: int, pid: int = 0) -> Opened:
        if self.namespace.needs_writer(inode, flags):
            self.namespace.check_writer(uid)
        return self._opened(await settled(self.namespace.open(inode, flags, uid, pid)), uid)

    def _opened(self, handle, uid: int) -> Opened:
        return Opened(self.namespace.handles.add(handle, uid), handle.cacheable)

    async def read(self, fh: int, offset: int, size: int) -> list:
        """The bytes asked for, as the pieces the handle serves them in (views of the store's
        memory where it can: a single piece is sent without a copy)."""
        answer = await self.handle(fh).read(offset, size)
        return answer if isinstance(answer, list) else [answer]

    async def write(self, fh: int, offset: int, data) -> int:
        return await self.handle(fh).write(offset, data)

    def handle(self, fh: int):
        return self.namespace.handles.get(fh)

    async def release(self, fh: int) -> None:
        self.namespace.handles.release(fh)

    async def unlink(self, parent_inode: int, name: bytes, uid: int) -> None:
        self.namespace.check_writer(uid)
        await settled(self.namespace.unlink(parent_inode, name))

    async def rename(self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int,
                     uid: int) -> None:
        self.namespace.check_writer(uid)
        await settled(self.namespace.rename(old_parent, old, new_parent, new, flags))

    async def mknod(self, parent_inode: int, name: bytes, mode: int, uid: int) -> Stat:
        """mknod(2) of a regular file makes a file being written, as ``create`` does without
        opening it (``tar --xattrs -x`` makes its members so); any other kind is refused."""
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG):
            await self.make_link_or_node("special file")
        self.namespace.check_writer(uid)
        return self.namespace.make_file(parent_inode, name, uid)

    async def make_link_or_node(self, what: str) -> None:
        """``ln``, ``ln -s``, ``mkfifo``, ``mknod``: only pages and directories live in the tree
        (a page is published whole under its one name), for anyone (it was ENOSYS, which ``ln``
        reported as 'Function not implemented')."""
        raise FsError(errno.EPERM, f"no {what} in a hicachefs mount: it holds pages and directories only")

    async def readlink(self, inode: int) -> bytes:
        return self.namespace.readlink(inode)

    # ---- extended attributes -------------------------------------------------------

    async def getxattr(self, inode: int, name: bytes) -> bytes:
        facts = self.namespace.xattrs(inode)
        if name not in facts:
            raise FsError(errno.ENODATA, "no such attribute")
        return facts[name]

    async def listxattr(self, inode: int) -> list[bytes]:
        return list(self.namespace.xattrs(inode))

    async def setxattr(self, inode: int, name: bytes, value: bytes) -> None:
        raise FsError(errno.ENOTSUP, "attributes are the store's")

    async def removexattr(self, inode: int, name: bytes) -> None:
        raise FsError(errno.ENOTSUP, "attributes are the store's")
