"""The POSIX layer's errors: its one error type, and the errno every failure is answered with."""

from __future__ import annotations

import errno

from ..store import DeviceError, PageCorrupt, PageNotFound, PageTooLarge, PrivateReadsFull, StoreError, StoreFull

_STORE_ERRNO = {
    PageTooLarge: errno.EFBIG,
    StoreFull: errno.ENOSPC,
    PageCorrupt: errno.EIO,
    DeviceError: errno.EIO,
    PageNotFound: errno.ENOENT,
    PrivateReadsFull: errno.ENOBUFS,
}


class FsError(OSError):
    """A request the namespace refuses, carrying the errno the caller is to see."""

    def __init__(self, err: int, message: str):
        super().__init__(err, message)


def errno_of(exc: FsError | StoreError) -> int:
    """The errno a refused request answers with (EIO for a store error without its own)."""
    if isinstance(exc, FsError):
        return exc.errno
    return _STORE_ERRNO.get(type(exc), errno.EIO)
