"""pyfuse3 Operations: translation between FUSE requests and the namespace, nothing more.

Every handler goes through ``_replying``, the one place where errors become errno: a
handler may only raise ``FUSEError`` (any other exception would stop pyfuse3's loop and
leave a dead mount), so store and namespace errors are mapped here (``errors.errno_of``) and
anything unexpected is logged and answered with EIO. An answer the namespace can only give after
blocking I/O comes as ``NeedsIO``: its work runs in a worker thread (``_settled``), the loop
serving other requests meanwhile.

Kernel caching (see ``_entry``): attributes and entries are cached for five minutes, because
they change through requests the kernel itself sends (write, truncate, rename, unlink), after
which it drops or updates what it cached, and published pages never change; what the store
changes on its own (evictions) the namespace reports through the kernel notifier, and what may
change elsewhere (a page only another host's tier holds) is not cached. A lookup that
finds nothing is cached as a negative entry where the namespace allows it. Published pages'
data is served through the kernel's page cache where the namespace's handle says so (reads of a
cached page never reach the daemon); other files use direct I/O.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging

import pyfuse3
import trio

from .. import names
from ..store import NeedsIO, StoreError
from .errors import FsError, errno_of
from .namespace import Namespace
from .nodes import Stat

log = logging.getLogger(__name__)

#: Entries and attributes of pages and directories alike: five minutes (see the module docstring).
CACHE_TIMEOUT_S = 300.0
#: st_blksize: makes cp, cat and friends move 1 MiB per request, the FUSE maximum.
IO_BLOCK_SIZE = 1 << 20
#: Answers that are ordinary traffic, not problems worth a log line.
_QUIET = {errno.ENOENT, errno.EEXIST, errno.ENODATA}


def _replying(handler):
    """Run a handler; map every failure to one FUSEError and count it."""

    op = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self, *args):
        self.requests[op] += 1
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except (FsError, StoreError) as exc:
            err, why = errno_of(exc), exc.strerror if isinstance(exc, FsError) else str(exc)
        except Exception:
            log.exception("%s%r failed unexpectedly; answering EIO", op, args[:2])
            err, why = errno.EIO, "internal error"
        if err not in _QUIET:
            self.count_error(err)
            log.warning("%s%r: %s (%s)", op, args[:2], errno.errorcode.get(err, err), why)
        raise pyfuse3.FUSEError(err) from None

    return wrapper


async def _settled(answer):
    """The answer, after running in worker threads whatever blocking I/O it still needs."""
    while isinstance(answer, NeedsIO):
        answer = answer.finish(await trio.to_thread.run_sync(answer.work))
    return answer


class Operations(pyfuse3.Operations):
    """The FUSE face of a Namespace."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, namespace: Namespace):
        super().__init__()
        self.namespace = namespace
        self.errors: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()

    def count_error(self, err: int) -> None:
        """Count a refused request by errno name, for the stats' ``errors``."""
        self.errors[errno.errorcode.get(err, str(err))] += 1

    def _entry(self, st: Stat) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = st.inode
        attr.st_mode = st.mode
        attr.st_nlink = st.nlink
        attr.st_uid, attr.st_gid = self.namespace.uid, self.namespace.gid
        attr.st_size = st.size
        attr.st_blksize = IO_BLOCK_SIZE
        attr.st_blocks = (st.size + 511) // 512
        attr.st_mtime_ns = attr.st_ctime_ns = st.mtime_ns
        attr.st_atime_ns = st.atime_ns
        attr.entry_timeout = attr.attr_timeout = 0 if st.volatile else CACHE_TIMEOUT_S
        return attr

    # ---- attributes ----------------------------------------------------------------

    @_replying
    async def lookup(self, parent_inode, name, ctx=None):
        st = await _settled(self.namespace.lookup(parent_inode, name))
        if st is not None:
            return self._entry(st)
        negative = pyfuse3.EntryAttributes()
        negative.st_ino = 0
        negative.entry_timeout = CACHE_TIMEOUT_S if self.namespace.caches_misses(parent_inode) else 0
        return negative

    async def forget(self, inode_list):
        self.requests["forget"] += 1
        for inode, nlookup in inode_list:
            try:
                self.namespace.forget(inode, nlookup)
            except Exception:  # forget must never raise
                log.exception("forget(%s) failed", inode)

    @_replying
    async def getattr(self, inode, ctx=None):
        return self._entry(self.namespace.getattr(inode))

    @_replying
    async def setattr(self, inode, attr, fields, fh, ctx):
        self.namespace.check_writer(ctx.uid)
        return self._entry(self.namespace.setattr(
            inode, size=attr.st_size if fields.update_size else None,
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None, gid=attr.st_gid if fields.update_gid else None))

    @_replying
    async def statfs(self, ctx):
        room = self.namespace.room()
        block = 4096
        result = pyfuse3.StatvfsData()
        result.f_bsize = result.f_frsize = block
        result.f_blocks = room.capacity_bytes // block
        result.f_bfree = result.f_bavail = room.free_bytes // block
        result.f_files = room.pages + result.f_bfree
        result.f_ffree = result.f_favail = result.f_bfree
        result.f_namemax = names.MAX_NAME_BYTES  # the longest key or directory name
        return result

    # ---- directories ---------------------------------------------------------------

    @_replying
    async def mkdir(self, parent_inode, name, mode, ctx):
        self.namespace.check_writer(ctx.uid)
        return self._entry(self.namespace.mkdir(parent_inode, name))

    @_replying
    async def rmdir(self, parent_inode, name, ctx):
        self.namespace.check_writer(ctx.uid)
        self.namespace.rmdir(parent_inode, name)

    @_replying
    async def opendir(self, inode, ctx):
        return self.namespace.handles.add(self.namespace.opendir(inode))

    @_replying
    async def readdir(self, fh, start_id, token):
        for next_id, (name, describe) in self.namespace.handles.get(fh).listing(start_id):
            if not pyfuse3.readdir_reply(token, name, self._entry(describe(False)), next_id):
                return
            describe(True)

    @_replying
    async def releasedir(self, fh):
        self.namespace.handles.release(fh)

    # ---- files ---------------------------------------------------------------------

    @_replying
    async def create(self, parent_inode, name, mode, flags, ctx):
        self.namespace.check_writer(ctx.uid)
        st, handle = self.namespace.create(parent_inode, name, flags)
        return self._file_info(handle), self._entry(st)

    @_replying
    async def open(self, inode, flags, ctx):
        if self.namespace.needs_writer(inode, flags):
            self.namespace.check_writer(ctx.uid)
        return self._file_info(await _settled(self.namespace.open(inode, flags, ctx.uid)))

    def _file_info(self, handle) -> pyfuse3.FileInfo:
        fh = self.namespace.handles.add(handle)
        return pyfuse3.FileInfo(fh=fh, direct_io=not handle.cacheable, keep_cache=handle.cacheable)

    @_replying
    async def read(self, fh, off, size):
        return await self.namespace.handles.get(fh).read(off, size)

    @_replying
    async def write(self, fh, off, buf):
        return await self.namespace.handles.get(fh).write(off, buf)

    @_replying
    async def release(self, fh):
        self.namespace.handles.release(fh)

    @_replying
    async def unlink(self, parent_inode, name, ctx):
        self.namespace.check_writer(ctx.uid)
        await _settled(self.namespace.unlink(parent_inode, name))

    @_replying
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self.namespace.check_writer(ctx.uid)
        await _settled(self.namespace.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags))

    # ---- extended attributes -------------------------------------------------------

    @_replying
    async def getxattr(self, inode, name, ctx):
        facts = self.namespace.xattrs(inode)
        if name not in facts:
            raise FsError(errno.ENODATA, "no such attribute")
        return facts[name]

    @_replying
    async def listxattr(self, inode, ctx):
        return list(self.namespace.xattrs(inode))

    @_replying
    async def setxattr(self, inode, name, value, ctx):
        raise FsError(errno.ENOTSUP, "attributes are the store's")

    @_replying
    async def removexattr(self, inode, name, ctx):
        raise FsError(errno.ENOTSUP, "attributes are the store's")

