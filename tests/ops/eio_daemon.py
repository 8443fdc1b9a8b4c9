"""A FUSE daemon that mounts as hicachefs and answers every name under its root with EIO: one
that answers, but not as a daemon should. Run as ``python eio_daemon.py MOUNTPOINT``."""

from __future__ import annotations

import errno
import os
import stat
import sys

import pyfuse3
import trio


class AnswersEIO(pyfuse3.Operations):
    async def getattr(self, inode, ctx=None):
        if inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.EIO)
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.st_mode = stat.S_IFDIR | 0o755
        entry.st_nlink = 2
        entry.st_uid, entry.st_gid = os.getuid(), os.getgid()
        return entry

    async def lookup(self, parent_inode, name, ctx=None):
        raise pyfuse3.FUSEError(errno.EIO)

    async def opendir(self, inode, ctx):
        return inode

    async def releasedir(self, fh):
        pass


if __name__ == "__main__":
    pyfuse3.init(AnswersEIO(), sys.argv[1], {"fsname=hicachefs", "subtype=hicachefs"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)
