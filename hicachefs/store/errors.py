"""The exceptions the page store raises; the daemon maps each to one errno in one place."""

from __future__ import annotations

from collections.abc import Callable


class StoreError(Exception):
    """Base of every page-store error; also raised for an unusable SSD arena file."""


class PageTooLarge(StoreError):
    """Raised by reserve/put when the page is larger than ``max_page_size`` (EFBIG)."""


class StoreFull(StoreError):
    """Raised by reserve/put when no room can be made for the page in the RAM tier,
    because the page is larger than the tier's largest slot or everything left is pinned
    by readers and drafts (ENOSPC). The store stays usable."""


class PrivateReadsFull(StoreError):
    """Raised by open when the pages being read into readers' own memory fill their share
    (``private_reads``): ``room()`` says when a try again may find room, ``ended()`` that none
    is to come, the daemon stopping, so a read waiting for it is refused at once (ENOBUFS)."""

    def __init__(self, message: str, room: Callable[[], bool] = lambda: True,
                 ended: Callable[[], bool] = lambda: False) -> None:
        super().__init__(message)
        self.room = room
        self.ended = ended


class PageCorrupt(StoreError):
    """Raised by open when a page's bytes on the SSD tier fail their checksum. The page has
    already been dropped and the failure counted in statistics (EIO)."""


class DeviceError(StoreError):
    """Raised when a tier's device fails (EIO, ENOSPC, a short write) while a page is read or
    written at the caller's request. The tier has counted it in ``io_errors``; the store is as
    it was before the call (EIO)."""


class PageNotFound(StoreError):
    """Raised by open when no page has that name (ENOENT)."""
