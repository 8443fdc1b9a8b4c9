"""An open published page, and the leases that bound how long it keeps the page pinned.

A reader keeps the bytes it opened even when the page is evicted, replaced or unlinked
(docs/contract.md, "An open page stays consistent"), because its handle pins the page's RAM slot. A
pin is a lease, though: ``PIN_LEASE_S`` after its last read the handle lets the slot go and keeps
only the page's name and version. Its next read finds that version again (on whichever tier it
now is) and pins it anew, or, when the version is no longer stored, fails with EIO, which the
contract allows. So a descriptor kept open for the kernel's page cache (a program may keep a
page file open between reads, which then never reach the daemon) pins nothing in the store, and
no user can hold the RAM tier by holding files open.

Nor by reading them: reads that reach the daemon (``O_DIRECT`` ones do) renew a lease, so all
handles hold at most the RAM budget's ``pins`` share pinned between them, and those of users who
may not change the store (``bounded``) at most its ``pins_of_others``; past that, the ones read
least recently let their pins go at once, and the bounded ones all do when a writer finds no
RAM slot for want of them (``let_bounded_go``: a pinned slot keeps its whole slab from serving
another size, so a few small pins could hold every slab). Their
pages are then demoted or evicted as any (to the disk tier, when there is one, where their next
reads find them), and new pages find room in RAM.

Not thread-safe: the daemon's trio thread only; a page on a lower tier is read in a worker
thread.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import time
from collections import OrderedDict
from typing import Protocol

from ..store import DeviceError, NeedsIO, PageCorrupt, PageNotFound, PageReader, PageStore
from ..store.budget import Share
from .blocking import in_thread
from .errors import FsError
from .nodes import PageNode

#: Seconds a handle keeps its page pinned after its last read: far longer than any one reader
#: takes to read a page (a 64 MiB page reads in well under a second), short enough that
#: descriptors held open pin nothing for long.
PIN_LEASE_S = 2.0


class Leased(Protocol):
    """What holds pages pinned on a lease: an open page (``PageHandle``), or a fetch handle's
    pages of its last read (``fetch.FetchHandle``). ``size``: the bytes it holds pinned, fixed
    from ``Leases.hold`` to ``Leases.released``; ``unpin`` lets them go (and calls
    ``released``)."""

    size: int
    bounded: bool
    pinned_until: float
    queued: bool

    @property
    def holding(self) -> bool: ...

    def unpin(self) -> None: ...


class Leases:
    """The handles holding a pin, by when their leases end. A read renews a lease in place; the
    heap entry is corrected when its time comes, so a renewal costs nothing here. The handles
    holding a pin are also kept in the order of their last reads, for the RAM budget's shares
    (``store.budget``): ``pins`` of every reader, ``pins_of_others`` of the bounded ones (users
    who may not change the store); past either, the handles read least recently let go at once.
    No shares: no bound (tests)."""

    def __init__(self, lease_s: float = PIN_LEASE_S, pins: Share | None = None,
                 pins_of_others: Share | None = None) -> None:
        self.lease_s = lease_s
        self._heap: list[tuple[float, int, Leased]] = []
        self._order = itertools.count()
        self._all = _Holders(pins)
        self._bounded = _Holders(pins_of_others)

    def hold(self, handle: Leased) -> None:
        """Track a handle that has just pinned its page or renewed its lease."""
        if not handle.queued:
            handle.queued = True
            heapq.heappush(self._heap, (handle.pinned_until, next(self._order), handle))
        self._all.hold(handle)
        if handle.bounded:
            self._bounded.hold(handle)

    def released(self, handle: Leased) -> None:
        """The handle let its pin go."""
        self._all.released(handle)
        self._bounded.released(handle)

    def let_bounded_go(self) -> int:
        """Unpin every bounded handle (a writer needs the room their pins hold); how many. Their
        next reads find their versions again, as after a lease."""
        handles = list(self._bounded.handles())
        for handle in handles:
            handle.unpin()
        return len(handles)

    @property
    def bounded_held(self) -> int:
        """Bytes the bounded handles hold pinned now."""
        return self._bounded.held

    def expire(self, now: float | None = None) -> int:
        """Unpin every handle whose lease has ended; how many were unpinned."""
        now = time.monotonic() if now is None else now
        ended = 0
        while self._heap and self._heap[0][0] <= now:
            _, _, handle = heapq.heappop(self._heap)
            if handle.holding and handle.pinned_until > now:  # renewed meanwhile
                heapq.heappush(self._heap, (handle.pinned_until, next(self._order), handle))
                continue
            handle.queued = False
            if handle.holding:
                handle.unpin()
                ended += 1
        return ended

    def __len__(self) -> int:
        return len(self._heap)


class _Holders:
    """Handles holding pins against one share, in the order of their last reads."""

    def __init__(self, share: Share | None) -> None:
        self.share = share
        self._order: OrderedDict[Leased, None] = OrderedDict()
        self.held = 0

    def hold(self, handle: Leased) -> None:
        if handle in self._order:
            self._order.move_to_end(handle)
        else:
            self._order[handle] = None
            self._count(handle.size)
        while self.share is not None and self.share.over and next(iter(self._order)) is not handle:
            next(iter(self._order)).unpin()

    def released(self, handle: Leased) -> None:
        if self._order.pop(handle, False) is None:
            self._count(-handle.size)

    def handles(self):
        """The handles holding pins against the share (a view: not to be changed while iterated)."""
        return self._order.keys()

    def _count(self, size: int) -> None:
        self.held += size
        if self.share is not None:
            self.share.add(size)


class PageHandle:
    """An open published page. See the module docstring."""

    __slots__ = ("store", "leases", "reader", "name", "version", "size", "pinned_until", "queued", "cacheable",
                 "bounded", "node")

    def __init__(self, store: PageStore, leases: Leases, reader: PageReader, cacheable: bool = False,
                 bounded: bool = False, node: PageNode | None = None) -> None:
        """``cacheable``: whether the kernel may keep the page's data (see ``Namespace``);
        ``bounded``: its pins count against the leases' byte budget (see the module docstring);
        ``node``: the page's inode, which follows its renames (the version is found again
        under the name it has then, not the one it was opened under)."""
        self.store = store
        self.node = node
        self.cacheable = cacheable
        self.bounded = bounded
        self.leases = leases
        self.reader: PageReader | None = reader
        self.name = reader.info.name
        self.version = reader.info.version
        self.size = reader.size
        self.queued = False
        self.pinned_until = time.monotonic() + leases.lease_s
        leases.hold(self)
        if node is not None:
            node.opened.add(self)

    async def read(self, offset: int, size: int):
        if self.reader is None:
            reader = await self._find_again()
            if self.reader is None:
                self.reader = reader
            else:  # another read of this handle found it meanwhile (the kernel reads ahead)
                reader.close()
        self.pinned_until = time.monotonic() + self.leases.lease_s
        self.leases.hold(self)
        return self.reader.read(offset, size)

    async def write(self, offset: int, data: bytes) -> int:
        raise FsError(errno.EBADF, "page opened read-only")

    @property
    def holding(self) -> bool:
        return self.reader is not None

    def unpin(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.close()
            self.leases.released(self)

    def release(self) -> None:
        self.unpin()
        if self.node is not None:
            self.node.opened.discard(self)

    async def _find_again(self) -> PageReader:
        name = self.name if self.node is None else self.node.current_name(self.name)
        return await find_version(self.store, name, self.version, self.bounded)


async def find_version(store: PageStore, name: str, version: tuple[str, int], bounded: bool = False) -> PageReader:
    """That version of the page, pinned (read from whichever tier holds it); EIO when it is no
    longer stored. ``bounded``: for a user who may not change the store."""
    try:
        reader = store.try_open(name, bounded=bounded)
        if isinstance(reader, NeedsIO):  # on a lower tier: read and verify it off the event loop
            reader = await in_thread(reader.work)
    except (PageNotFound, PageCorrupt, DeviceError):
        reader = None
    if reader is not None and reader.info.version == version:
        return reader
    if reader is not None:
        reader.close()
    raise FsError(errno.EIO, "the page this file was opened on is no longer stored "
                             "(replaced, removed or evicted since)")
