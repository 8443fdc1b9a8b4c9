"""pyfuse3 Operations: translation between FUSE requests and the request layer, nothing more.

Every handler goes through ``_replying``: a handler may only raise ``FUSEError`` (any other
exception would stop pyfuse3's loop and leave a dead mount), so every failure is turned into its
errno by ``Requests.refused``, the one place that maps, counts and logs refusals.

The answers become pyfuse3's objects here (``entry``, ``looked_up``, ``statvfs``,
``file_info``). Kernel caching: attributes and entries are cached for five minutes, because they
change through requests the kernel itself sends (write, truncate, rename, unlink), after which it
drops or updates what it cached, and published pages never change; what the store changes on its
own (evictions) the namespace reports through the kernel notifier, and what may change elsewhere
(a page only another host's tier holds) is not cached. A lookup that finds nothing is cached as a
negative entry where the namespace allows it. Published pages' data is served through the
kernel's page cache where the handle says so (reads of a cached page never reach the daemon);
other files use direct I/O.
"""

from __future__ import annotations

import functools

import pyfuse3

from .. import names
from ..posix.namespace import Room
from ..posix.nodes import Stat
from ..posix.requests import Miss, Opened, Requests

#: Entries and attributes of pages and directories alike: five minutes (see the module docstring).
CACHE_TIMEOUT_S = 300.0
#: st_blksize: makes cp, cat and friends move 1 MiB per request, the FUSE maximum.
IO_BLOCK_SIZE = 1 << 20
#: Directory entries one readdir request answers at most (``listing.ENTRIES_PER_REQUEST``).
READDIR_BATCH = 256


def entry(st: Stat, uid: int, gid: int) -> pyfuse3.EntryAttributes:
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = st.inode
    attr.st_mode = st.mode
    attr.st_nlink = st.nlink
    attr.st_uid, attr.st_gid = uid, gid
    attr.st_size = st.size
    attr.st_blksize = IO_BLOCK_SIZE
    attr.st_blocks = ((st.size if st.allocated is None else st.allocated) + 511) // 512
    attr.st_mtime_ns = attr.st_ctime_ns = st.mtime_ns
    attr.st_atime_ns = st.atime_ns
    attr.entry_timeout = attr.attr_timeout = 0 if st.volatile else CACHE_TIMEOUT_S
    return attr


def looked_up(answer: Stat | Miss, uid: int, gid: int) -> pyfuse3.EntryAttributes:
    if isinstance(answer, Stat):
        return entry(answer, uid, gid)
    negative = pyfuse3.EntryAttributes()
    negative.st_ino = 0
    negative.entry_timeout = answer.timeout_s
    return negative


def statvfs(room: Room) -> pyfuse3.StatvfsData:
    block = 4096
    result = pyfuse3.StatvfsData()
    result.f_bsize = result.f_frsize = block
    result.f_blocks = room.capacity_bytes // block
    result.f_bfree = result.f_bavail = room.free_bytes // block
    result.f_files = room.pages + result.f_bfree
    result.f_ffree = result.f_favail = result.f_bfree
    result.f_namemax = names.MAX_NAME_BYTES  # the longest key or directory name
    return result


def file_info(opened: Opened) -> pyfuse3.FileInfo:
    return pyfuse3.FileInfo(fh=opened.fh, direct_io=not opened.cacheable, keep_cache=opened.cacheable)


def joined(pieces: list):
    """A read's pieces as the one buffer pyfuse3 replies with (a single piece is not copied)."""
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def setattr_fields(attr, fields) -> tuple:
    """(size, mode, uid, gid) a setattr changes, None for each it does not."""
    return (attr.st_size if fields.update_size else None, attr.st_mode if fields.update_mode else None,
            attr.st_uid if fields.update_uid else None, attr.st_gid if fields.update_gid else None)


def _replying(handler):
    """Run a handler; answer a failure with its errno (``Requests.refused``)."""

    op = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self, *args):
        self.requests.count(op)
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            raise pyfuse3.FUSEError(self.requests.refused(op, args, exc)) from None

    return wrapper


class Operations(pyfuse3.Operations):
    """The FUSE face of the request layer."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, requests: Requests):
        super().__init__()
        self.requests = requests
        self.uid, self.gid = requests.uid, requests.gid

    @_replying
    async def lookup(self, parent_inode, name, ctx=None):
        pid = ctx.pid if ctx is not None else 0
        return looked_up(await self.requests.lookup(parent_inode, name, pid), self.uid, self.gid)

    async def forget(self, inode_list):
        self.requests.count("forget")
        await self.requests.forget(inode_list)

    @_replying
    async def getattr(self, inode, ctx=None):
        return entry(await self.requests.getattr(inode), self.uid, self.gid)

    @_replying
    async def setattr(self, inode, attr, fields, fh, ctx):
        st = await self.requests.setattr(inode, ctx.uid, *setattr_fields(attr, fields))
        return entry(st, self.uid, self.gid)

    @_replying
    async def access(self, inode, mode, ctx):
        return await self.requests.access(inode, mode, ctx.uid)

    @_replying
    async def statfs(self, ctx):
        return statvfs(await self.requests.statfs())

    @_replying
    async def mkdir(self, parent_inode, name, mode, ctx):
        return entry(await self.requests.mkdir(parent_inode, name, ctx.uid), self.uid, self.gid)

    @_replying
    async def rmdir(self, parent_inode, name, ctx):
        await self.requests.rmdir(parent_inode, name, ctx.uid)

    @_replying
    async def opendir(self, inode, ctx):
        return await self.requests.opendir(inode, ctx.uid)

    @_replying
    async def readdir(self, fh, start_id, token):
        """One batch, however large the kernel's buffer: it asks again for the rest. Filling the
        buffer (a reader's st_blksize, 1 MiB: some 4,000 entries) held the daemon 35 ms a request,
        and a plain user opening a pool of 20,000 pages in a loop kept another client waiting
        up to 150 ms (p99 70 ms); a batch a request, up to 8 ms (p99 5 ms)."""
        entries = await self.requests.readdir(fh, start_id, READDIR_BATCH)
        taken = 0
        for next_id, name, st in entries:
            if not pyfuse3.readdir_reply(token, name, entry(st, self.uid, self.gid), next_id):
                break
            taken += 1
        await self.requests.took(fh, taken)

    @_replying
    async def releasedir(self, fh):
        await self.requests.releasedir(fh)

    @_replying
    async def create(self, parent_inode, name, mode, flags, ctx):
        st, opened = await self.requests.create(parent_inode, name, flags, ctx.uid)
        return file_info(opened), entry(st, self.uid, self.gid)

    @_replying
    async def open(self, inode, flags, ctx):
        return file_info(await self.requests.open(inode, flags, ctx.uid, ctx.pid))

    @_replying
    async def read(self, fh, off, size):
        return joined(await self.requests.read(fh, off, size))

    @_replying
    async def write(self, fh, off, buf):
        return await self.requests.write(fh, off, buf)

    @_replying
    async def release(self, fh):
        await self.requests.release(fh)

    @_replying
    async def unlink(self, parent_inode, name, ctx):
        await self.requests.unlink(parent_inode, name, ctx.uid)

    @_replying
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        await self.requests.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx.uid)

    @_replying
    async def link(self, inode, new_parent_inode, new_name, ctx):
        await self.requests.make_link_or_node("hard link")

    @_replying
    async def symlink(self, parent_inode, name, target, ctx):
        await self.requests.make_link_or_node("symbolic link")

    @_replying
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        return entry(await self.requests.mknod(parent_inode, name, mode, ctx.uid), self.uid, self.gid)

    @_replying
    async def readlink(self, inode, ctx):
        return await self.requests.readlink(inode)

    @_replying
    async def getxattr(self, inode, name, ctx):
        return await self.requests.getxattr(inode, name)

    @_replying
    async def listxattr(self, inode, ctx):
        return await self.requests.listxattr(inode)

    @_replying
    async def setxattr(self, inode, name, value, ctx):
        await self.requests.setxattr(inode, name, value)

    @_replying
    async def removexattr(self, inode, name, ctx):
        await self.requests.removexattr(inode, name)
