"""The FUSE session's life, as the daemon drives it: mount, serve, stop, unmount (pyfuse3's
module-level calls, in one place).

Not thread-safe: the daemon's main thread only (``serve`` runs on its trio loop).
"""

from __future__ import annotations

import os

import pyfuse3

from .operations import Operations


def mount(operations: Operations, mountpoint: str, options: set[str]) -> None:
    """Mount: from here on the mount is live, and requests queue until ``serve``. No
    ``default_permissions`` (pyfuse3's default): ``Operations`` checks who may change what; as
    root, other users may use the mount (``allow_other``)."""
    options = {"fsname=hicachefs", "subtype=hicachefs", *options}
    if os.getuid() == 0:
        options.add("allow_other")
    pyfuse3.init(operations, mountpoint, options)


async def serve() -> None:
    """Answer requests until ``stop`` or an unmount from outside."""
    await pyfuse3.main()


def stop() -> None:
    """End ``serve`` once the requests in flight are answered."""
    pyfuse3.terminate()


def unmount() -> None:
    pyfuse3.close(unmount=True)
