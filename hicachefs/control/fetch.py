"""``.hicachefs/fetch``: many pages read through one handle (docs/contract.md, "Reading many pages in
one read").

Why: reading a page by its own file costs an OPEN and a RELEASE (and a LOOKUP when the kernel
has no entry), about 60 us each on the daemon's one thread, more than the bytes of a small page
cost to copy. Here a batch is one write (the request) and one ``preadv`` of all the pages, which
the kernel cuts into READ requests of at most 1 MiB.

The request is one ``<size> <path>\\n`` line per page; several writes append to it (their offsets
do not matter), and a write after a read starts a new one. The answer is read at its own offsets,
from 0 (``pread``/``preadv``, or a seek to 0 after writing). The answer is the pages back to back in request order, each
exactly its requested size. A page that is missing, of another size, or unreadable ends the
read short at the start of its range, so a page was read whole exactly when the read that
covered it returned all its bytes; reading on from the next page's offset continues the batch.
A page is pinned from the read that starts it to the read after the one that finishes it, so
its bytes stay put until they are sent, on a lease (``page_handle.Leases``) as an open page's:
the pins go ``PIN_LEASE_S`` after the handle's last read, and a plain user's handles hold at
most the leases' share of the RAM tier between them. A page that spans several reads is one
version: a read that goes on with a page whose pin went finds that version again, or ends there.

A handle holds its request against its user's share of the request files' memory
(``request_limits``), at its bytes and ``PARSED_LINE_BYTES`` a line (what its parsed form
costs); a write over the share fails with ENOBUFS. A request of ``PARSE_LINES`` lines or more is
parsed a step at a time, taking turns with other large requests, so it delays nobody else's; the
write that makes it that large fails with ENOBUFS when its user has as many large requests as its
share allows. A request over ``MAX_FETCH_REQUEST`` fails with EFBIG. A refused request fails as a
whole, as the exists file's does: its later writes fail with the same error, and so does the read
that follows, after which the handle takes a new request (``_fail``). A malformed request fails
its read with EINVAL and ends. Reads of one handle run one at a time (the kernel may send several
at once): each lets go of the pages the one before it held. The writes and reads of users other
than the store's own clients take turns with those of all such users, each followed by a pause
(``request_limits``), so that however many processes they run, another client's request waits
behind one of them at most.

Not thread-safe: the daemon's trio thread only; a page on a lower tier is read in a worker
thread.
"""

from __future__ import annotations

import bisect
import errno
import time

import trio

from ..store import DeviceError, NeedsIO, PageCorrupt, PageNotFound, PageReader, PageStore, PrivateReadsFull
from ..posix.blocking import in_thread
from ..posix.errors import FsError
from ..posix.page_handle import Leases
from .lines import PARSED_LINE_BYTES, size_and_path
from .request_limits import Account

#: The largest request one handle accepts: 4,096 lines of the longest page path.
MAX_FETCH_REQUEST = 4 << 20
#: Lines parsed in one step: about a millisecond of the daemon's time.
PARSE_LINES = 2048
#: Pages a read opens before it lets other requests run (a few milliseconds of the daemon's
#: time): a READ of 1 MiB of 64-byte pages opens 16,384 of them, and held the daemon's one
#: thread for 0.3 s. Pages of SGLang's (64 KiB and more) never reach it.
PAGES_PER_TURN = 256


class FetchHandle:
    """One client's batch read. See the module docstring."""

    cacheable = False

    def __init__(self, store: PageStore, account: Account, leases: Leases) -> None:
        self.store = store
        self.account = account
        self.leases = leases
        self.bounded = not account.writer  # its pins count against the leases' budget
        self.size = 0  # bytes it holds pinned, while on a lease
        self.pinned_until = 0.0
        self.queued = False
        self._request = bytearray()
        self._lines = 0  # newlines in the request
        self._pages: list[tuple[str | None, int]] | None = None  # set by the first read
        self._read = False  # the request was read: a write starts a new one
        self._starts: list[int] = []
        self._parsed = 0  # request bytes parsed into _pages
        self._held: dict[int, PageReader] = {}  # page index -> its pinned reader
        self._versions: dict[int, tuple[str, int]] = {}  # page index -> the version its reads had
        self._failure: FsError | None = None  # a refused request, until its read (``_fail``)
        self._reading = trio.Lock()

    async def write(self, offset: int, data: bytes) -> int:
        if self.account.writer:
            return self._write(data)
        async with self.account.turn():  # another user's writes take turns (``request_limits``)
            return self._write(data)

    def _write(self, data: bytes) -> int:
        if self._failure is not None:
            raise FsError(self._failure.errno, f"{self._failure.strerror}; read to end the request")
        if self._read:  # a write after a read starts a new request
            self._new_request()
        lines = self._lines + data.count(b"\n")
        try:
            if len(self._request) + len(data) > MAX_FETCH_REQUEST:
                raise FsError(errno.EFBIG, f"fetch request over {MAX_FETCH_REQUEST} bytes")
            self.account.hold(len(self._request) + len(data) + PARSED_LINE_BYTES * (lines + 1),
                              large=lines >= PARSE_LINES)
        except FsError as exc:
            self._fail(exc)
            raise
        self._request += data
        self._lines = lines
        return len(data)

    def _fail(self, exc: FsError) -> None:
        """The request is refused as a whole: later writes fail too, and so does the read that
        follows, after which the handle takes a new request. Sticky because the kernel reports
        a write refused halfway as a short one, and the writer's retry of the rest must not
        become a request of its own (its answer would be another request's pages)."""
        self._new_request()
        self._failure = FsError(exc.errno, exc.strerror)  # a copy: the raised one holds the data

    async def read(self, offset: int, size: int) -> list:
        """The pages' bytes from ``offset``, as views of each page, or of several that lie end to
        end in RAM (the FUSE face joins them)."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise FsError(failure.errno, f"the fetch request failed: {failure.strerror}")
        async with self._reading:  # one read at a time: each lets go of the pages the last one held
            await self._parse()
            if self.account.writer:
                return await self._answer(offset, size)
            async with self.account.turn():  # another user's reads take turns (``request_limits``)
                return await self._answer(offset, size)

    async def _parse(self) -> None:
        """Parse the request at its first read (in steps, if it is large)."""
        if self._pages is None:
            pages = self._pages = []
            try:
                if not self.account.large:  # fewer than PARSE_LINES lines
                    self._parse_step()
                else:
                    await self.account.in_steps(lambda: self._pages is pages and self._parse_step())
            except FsError:
                self._new_request()  # a malformed request: the next write starts a new one
                raise
            if self._pages is not pages:  # another thread's write on this handle ended the request meanwhile
                raise FsError(errno.EINVAL, "the fetch request was ended by another write on its handle "
                                            "during this read")

    async def _answer(self, offset: int, size: int) -> list:
        if not self._read:  # the answer began: a write starts a new request
            self._read = True
            self._request = bytearray()
        pages, starts, versions = self._pages, self._starts, self._versions
        if not pages or offset >= starts[-1] + pages[-1][1]:
            return []
        index = bisect.bisect_right(starts, offset) - 1
        previous = self._taken()
        # What this read holds is its own until it is answered: off the lease (and out of the
        # shares' reach) while it waits on a lower tier, which may outlast the last lease.
        reading: dict[int, PageReader] = {}
        pieces = []
        position, end = offset, offset + size
        try:
            while position < end and index < len(pages):
                reader = previous.pop(index, None)
                if reader is None:
                    reader = self._open(*pages[index])
                    if isinstance(reader, NeedsIO):  # on a lower tier: read it off the event loop
                        reader = await self._open_slowly(reader, pages[index][1])
                start = starts[index]
                if reader is not None and position > start and reader.info.version != versions.get(index):
                    reader.close()  # goes on with a page whose pin went, and it changed meanwhile
                    reader = None
                if reader is None:
                    break
                reading[index] = reader
                versions[index] = reader.info.version
                take = min(end, start + reader.size) - position
                pieces.append(reader.read(position - start, take))
                position += take
                index += 1
                if len(reading) % PAGES_PER_TURN == 0:  # let other requests run (PAGES_PER_TURN)
                    await trio.sleep(0)
        finally:
            for reader in previous.values():
                reader.close()
            if pages is self._pages:
                self._held = reading
                self._lease()
            else:  # a write started a new request while this read waited: its pages are not that
                pieces[:] = [bytes(piece) for piece in pieces]  # one's to hold (this answer copied)
                for reader in reading.values():
                    reader.close()
        return self.store.merged(pieces)

    def _taken(self) -> dict[int, PageReader]:
        """The pages held, off the lease (a read takes them over, and holds what it reads)."""
        held, self._held = self._held, {}
        if held:
            self.leases.released(self)
        return held

    def _lease(self) -> None:
        """Hold what the last read pinned on a lease, renewed."""
        if self._held:
            self.size = sum(reader.size for reader in self._held.values())
            self.pinned_until = time.monotonic() + self.leases.lease_s
            self.leases.hold(self)

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def unpin(self) -> None:
        """The lease ended, or the budget needs the room: the pages held go."""
        for reader in self._taken().values():
            reader.close()

    def release(self) -> None:
        self._new_request()

    def _new_request(self) -> None:
        self.unpin()
        self._versions = {}
        self._pages, self._starts, self._parsed = None, [], 0
        self._request = bytearray()
        self._lines = 0
        self._read = False
        self.account.hold(0)

    def _parse_step(self) -> bool:
        """Parse up to ``PARSE_LINES`` more lines of the request into its pages; True while
        more remain."""
        request, start = self._request, self._parsed
        end = start
        for _ in range(PARSE_LINES):
            end = request.find(b"\n", end) + 1
            if end == 0:
                end = len(request)
                break
        pages, starts = self._pages, self._starts
        position = starts[-1] + pages[-1][1] if pages else 0
        for line in bytes(memoryview(request)[start:end]).split(b"\n"):
            if not line:
                continue
            size, path = size_and_path(line, "a fetch request")
            try:
                name = path.decode("utf-8")
            except UnicodeDecodeError:  # names no page (the store's names are text): a miss
                name = None
            starts.append(position)
            pages.append((name, size))
            position += size
        self._parsed = end
        return end < len(request)

    def _open(self, name: str | None, size: int) -> PageReader | None | NeedsIO:
        """The page pinned for reading from RAM; None if it cannot be served as asked (or
        ``name`` is None: its path was not UTF-8), a miss; ``NeedsIO`` when it is on a lower tier
        (``_open_slowly``)."""
        if name is None:
            self.store.count_misses()
            return None
        try:
            reader = self.store.try_open(name, size=size, bounded=self.bounded)
        except PageNotFound:
            return None
        return reader if isinstance(reader, NeedsIO) else self._checked(reader, size)

    async def _open_slowly(self, needs: NeedsIO, size: int) -> PageReader | None:
        try:
            reader = await in_thread(needs.work)
        except (PageNotFound, PageCorrupt, DeviceError, PrivateReadsFull):
            return None
        return self._checked(reader, size)

    @staticmethod
    def _checked(reader: PageReader, size: int) -> PageReader | None:
        if reader.size != size:
            reader.close()
            return None
        return reader
