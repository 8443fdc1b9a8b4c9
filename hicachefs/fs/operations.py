"""pyfuse3 Operations: translation between FUSE requests and the namespace, nothing more.

Every handler goes through ``_replying``, the one place where errors become errno: a
handler may only raise ``FUSEError`` (any other exception would stop pyfuse3's loop and
leave a dead mount), so store and namespace errors are mapped here and anything
unexpected is logged and answered with EIO.

Kernel caching (see ``_entry``): attributes and entries are cached, for a minute for files
and five for directories, because they change through requests the kernel itself sends
(write, truncate, rename, unlink), after which it drops or updates what it cached; what the
store changes on its own (evictions) the namespace reports through the kernel notifier. A
lookup that finds nothing is cached as a negative entry, which is safe for the same reason:
every page is published by a create or rename that passes through the kernel. Published
pages are immutable, so their data is served through the kernel's page cache (reads of a
cached page never reach the daemon); files being written and control files use direct I/O.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import stat

import pyfuse3
import trio

from .. import names
from ..store import PageStore, StoreError
from .errors import FsError, errno_of
from .namespace import Namespace
from .nodes import Stat

log = logging.getLogger(__name__)

CACHE_TIMEOUT_S = 300.0
PAGE_TIMEOUT_S = 60.0
#: st_blksize: makes cp, cat and friends move 1 MiB per request, the FUSE maximum.
IO_BLOCK_SIZE = 1 << 20
XATTR_PREFIX = b"user.hicachefs."

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


class Operations(pyfuse3.Operations):
    """The FUSE face of a Namespace over a PageStore."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, namespace: Namespace, store: PageStore):
        super().__init__()
        self.namespace = namespace
        self.store = store
        self.errors: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()
        self.uid, self.gid = os.getuid(), os.getgid()
        self.has_shared_tier = store.tier("shared") is not None
        self._listings: dict[int, list] = {}

    def _require_writer(self, ctx) -> None:
        """Changes are for root and the daemon's own user; anyone may read.

        The mount runs without ``default_permissions``: with it the kernel re-fetches the pool
        directory's attributes after every create and rename to check permissions, two of the
        eight requests it takes to publish a page.
        """
        if ctx.uid not in (0, self.uid):
            raise FsError(errno.EACCES, "only root and the daemon's user may change the store")

    def count_error(self, err: int) -> None:
        """Count a refused request by errno name, for the stats' ``errors``."""
        self.errors[errno.errorcode.get(err, str(err))] += 1

    # ---- attributes ----------------------------------------------------------------

    def _entry(self, st: Stat) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = st.inode
        attr.st_mode = st.mode
        attr.st_nlink = st.nlink
        attr.st_uid, attr.st_gid = self.uid, self.gid
        attr.st_size = st.size
        attr.st_blksize = IO_BLOCK_SIZE
        attr.st_blocks = (st.size + 511) // 512
        attr.st_mtime_ns = attr.st_ctime_ns = st.mtime_ns
        attr.st_atime_ns = st.atime_ns
        timeout = PAGE_TIMEOUT_S if stat.S_ISREG(st.mode) else CACHE_TIMEOUT_S
        attr.entry_timeout = attr.attr_timeout = timeout
        return attr

    @_replying
    async def lookup(self, parent_inode, name, ctx=None):
        try:
            return self._entry(self.namespace.lookup(parent_inode, name))
        except FsError as exc:
            if exc.errno != errno.ENOENT:
                raise
        candidate = self.namespace.shared_candidate(parent_inode, name)
        if candidate is not None and await trio.to_thread.run_sync(self.store.find_shared, candidate):
            return self._entry(self.namespace.lookup(parent_inode, name))
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
        self._require_writer(ctx)
        if fields.update_size:
            return self._entry(self.namespace.truncate(inode, attr.st_size))
        current = self.namespace.getattr(inode)
        changes = (
            (fields.update_mode and stat.S_IMODE(attr.st_mode) != stat.S_IMODE(current.mode))
            or (fields.update_uid and attr.st_uid != self.uid)
            or (fields.update_gid and attr.st_gid != self.gid)
        )
        if changes and not self.namespace.is_pending(inode):
            # A chown or chmod to what is already there succeeds: tar x and cp -a restore both.
            raise FsError(errno.EPERM, "published pages and directories keep their owner and mode")
        # Times are the store's (publish, last read): setting them is accepted and changes nothing,
        # so that tar x and cp -p, which set them, succeed.
        return self._entry(current)

    @_replying
    async def statfs(self, ctx):
        facts = self.store.statistics()
        block = 4096
        result = pyfuse3.StatvfsData()
        result.f_bsize = result.f_frsize = block
        result.f_blocks = facts["capacity_bytes"] // block
        result.f_bfree = result.f_bavail = facts["free_bytes"] // block
        pages = facts.get("pages", 0)
        result.f_files = pages + result.f_bfree
        result.f_ffree = result.f_favail = result.f_bfree
        result.f_namemax = names.MAX_NAME_BYTES  # the longest key or directory name
        return result

    # ---- directories ---------------------------------------------------------------

    @_replying
    async def mkdir(self, parent_inode, name, mode, ctx):
        self._require_writer(ctx)
        return self._entry(self.namespace.mkdir(parent_inode, name))

    @_replying
    async def rmdir(self, parent_inode, name, ctx):
        self._require_writer(ctx)
        self.namespace.rmdir(parent_inode, name)

    @_replying
    async def opendir(self, inode, ctx):
        listing = self.namespace.list_dir(inode)
        fh = self.namespace.add_handle(None)
        self._listings[fh] = listing
        return fh

    @_replying
    async def readdir(self, fh, start_id, token):
        listing = self._listings.get(fh, [])
        for index in range(start_id, len(listing)):
            name, make_stat = listing[index]
            st = make_stat(counted=False)
            if not pyfuse3.readdir_reply(token, name, self._entry(st), index + 1):
                return
            make_stat(counted=True)

    @_replying
    async def releasedir(self, fh):
        self._listings.pop(fh, None)
        self.namespace.handles.pop(fh, None)

    # ---- files ---------------------------------------------------------------------

    @_replying
    async def create(self, parent_inode, name, mode, flags, ctx):
        self._require_writer(ctx)
        st, fh = self.namespace.create(parent_inode, name, flags)
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), self._entry(st)

    @_replying
    async def open(self, inode, flags, ctx):
        if self.namespace.needs_writer(inode, flags):
            self._require_writer(ctx)
        target = self.namespace.open(inode, flags)
        if isinstance(target, str):
            reader = self.namespace.open_reader(target, memory_only=True)
            if reader is None:  # on the disk tier: read and verify it off the event loop
                reader = await trio.to_thread.run_sync(self.namespace.open_reader, target)
            fh, cacheable = self.namespace.add_page_handle(inode, reader)
            return pyfuse3.FileInfo(fh=fh, direct_io=not cacheable, keep_cache=cacheable)
        return pyfuse3.FileInfo(fh=target, direct_io=True, keep_cache=False)

    @_replying
    async def read(self, fh, off, size):
        return await self._handle(fh).read(off, size)

    @_replying
    async def write(self, fh, off, buf):
        return await self._handle(fh).write(off, buf)

    @_replying
    async def release(self, fh):
        self.namespace.release(fh)

    @_replying
    async def unlink(self, parent_inode, name, ctx):
        self._require_writer(ctx)
        page = self.namespace.unlink(parent_inode, name)
        if page is not None and self.has_shared_tier:
            await trio.to_thread.run_sync(self.store.delete_shared, page)

    @_replying
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._require_writer(ctx)
        self.namespace.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    # ---- extended attributes -------------------------------------------------------

    @_replying
    async def getxattr(self, inode, name, ctx):
        facts = self._xattrs(inode)
        if name not in facts:
            raise FsError(errno.ENODATA, "no such attribute")
        return facts[name]

    @_replying
    async def listxattr(self, inode, ctx):
        return list(self._xattrs(inode))

    @_replying
    async def setxattr(self, inode, name, value, ctx):
        raise FsError(errno.ENOTSUP, "attributes are the store's")

    @_replying
    async def removexattr(self, inode, name, ctx):
        raise FsError(errno.ENOTSUP, "attributes are the store's")

    def _xattrs(self, inode: int) -> dict[bytes, bytes]:
        info = self.namespace.page_info(inode)
        if info is None:
            return {}
        return {
            XATTR_PREFIX + b"tier": info.tier.encode(),
            XATTR_PREFIX + b"checksum": info.checksum.encode(),
            XATTR_PREFIX + b"hits": str(info.hits).encode(),
        }

    def _handle(self, fh: int):
        handle = self.namespace.handles.get(fh)
        if handle is None:
            raise FsError(errno.EBADF, "unknown file handle")
        return handle
