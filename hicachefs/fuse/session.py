"""The FUSE session's life, as the daemon drives it: mount, serve, stop, unmount (pyfuse3's
module-level calls, in one place).

Not thread-safe: the daemon's main thread only (``serve`` runs on its trio loop).
"""

from __future__ import annotations

import os

import pyfuse3

from .. import mount_table
from .operations import Operations

#: The mount this session made (``major:minor``, as the mount table says), and where.
_mounted: tuple[str, str | None] | None = None


def mount(operations: Operations, mountpoint: str, options: set[str]) -> None:
    """Mount: from here on the mount is live, and requests queue until ``serve``. No
    ``default_permissions`` (pyfuse3's default): ``Operations`` checks who may change what; as
    root, other users may use the mount (``allow_other``)."""
    options = {"fsname=hicachefs", "subtype=hicachefs", *options}
    if os.getuid() == 0:
        options.add("allow_other")
    pyfuse3.init(operations, mountpoint, options)
    global _mounted
    _mounted = (mountpoint, mount_table.device(mountpoint))


def detached() -> bool:
    """Whether this session's mount is no longer in the mount table: unmounted lazily (``umount
    -l``) while files were open on it, which keeps the connection, and this daemon, serving a
    tree nobody can reach by path any more."""
    return _mounted is not None and _mounted[1] is not None and not mount_table.device_mounted(_mounted[1])


async def serve() -> None:
    """Answer requests until ``stop`` or an unmount from outside."""
    await pyfuse3.main()


def stop() -> None:
    """End ``serve`` once the requests in flight are answered."""
    pyfuse3.terminate()


def unmount() -> None:
    """End the session, and unmount its mount if it is still the one at its path: libfuse's
    unmount is a lazy ``umount2`` of the path, which after a lazy unmount from outside would
    take down whatever was mounted there since (the next daemon's mount)."""
    ours = _mounted is None or _mounted[1] is None or mount_table.device(_mounted[0]) == _mounted[1]
    pyfuse3.close(unmount=ours)
