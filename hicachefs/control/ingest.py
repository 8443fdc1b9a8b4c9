"""``.hicachefs/ingest``: many pages published by one stream of writes (docs/contract.md, "Publishing
many pages in one write").

Why: a publish by temporary file and rename is six FUSE requests per page (LOOKUP, CREATE,
WRITE, RELEASE, LOOKUP, RENAME), about 60 us each on the daemon's one thread; 8 pages of
128 KiB took 4.7 ms to publish that way. Here a batch is one ``pwritev``: the kernel cuts it
into WRITE requests of at most 1 MiB, so a page costs its bytes' share of those.

A batch, written from offset 0, each write continuing where the last one ended:
``HCFSPUT1``, the header's length (uint32 little-endian), the page count and the flags (uint16
each), the header (one ``<size> <path>\\n`` line per page), then the pages' bytes back to back.
With ``KEEP_EXISTING`` a page whose name is published already, at the size being written, is
left as it is (its bytes are passed over; one of another size is replaced): the writer need
not ask first which pages the store has. A page is reserved in the store when its first byte
arrives and published (``Publisher.publish_reserved``: the namespace's rules, as for a rename)
when its last one has. A page cut off by the end of the
handle or by a new batch publishes nothing.

A handle holds its batch's header, from its first byte to the batch's last page (gathered,
then parsed: its bytes and ``PARSED_LINE_BYTES`` a line), against its writer's share of the
request files' memory (``request_limits``): a writer's many handles each holding half a header
grew the daemon without bound. The write that would go over fails with ENOBUFS and stops the
batch, as a page that cannot be published does.

A page that cannot be published stops the batch: the write that reached it accepts only the
bytes before it, or fails with the page's errno when it is the batch's first page or none of
its bytes came before it (the kernel then reports the batch's earlier writes as a short one).
A read of the handle says how many of the batch's pages were published and the errno of the one
that failed: ``<published> <errno>\\n``.

Not thread-safe: the daemon's trio thread only. Nothing here blocks beyond the store's
memory-speed ``reserve`` and ``publish``, and a write lets other requests run every
``PAGES_PER_TURN`` pages it publishes.
"""

from __future__ import annotations

import errno
import struct
from typing import NamedTuple, Protocol

import trio

from .. import names
from ..store import Draft, StoreError
from ..posix.errors import FsError, errno_of
from .lines import PARSED_LINE_BYTES, size_and_path
from .request_limits import Account

MAGIC = b"HCFSPUT1"
_PREFIX = struct.Struct("<8sIHH")
#: Flag: leave pages already published as they are.
KEEP_EXISTING = 1
#: The most pages a batch holds, and the largest header: that many of the longest path (a batch
#: of SGLang's is 128 pages).
MAX_PAGES = 4096
MAX_HEADER_BYTES = MAX_PAGES * (5 * names.MAX_NAME_BYTES + 4 + 24)
#: Pages a write publishes before it lets other requests run (a few milliseconds of the daemon's
#: time, as a fetch's ``PAGES_PER_TURN``): a WRITE of 64-byte pages may publish a whole batch's
#: 4,096. Pages of SGLang's (64 KiB and more) never reach it.
PAGES_PER_TURN = 256


class Publisher(Protocol):
    """What the stream needs of the namespace: room for a page whose path it has checked, and
    its publish rules. A reserved page counts against the files being written until
    ``publish_reserved`` (which consumes the draft whatever happens) or ``abandon_page``."""

    def has_page(self, path: str, size: int | None = None) -> bool: ...

    def reserve_page(self, path: str, size: int) -> Draft: ...

    def abandon_page(self, draft: Draft) -> None: ...

    def publish_reserved(self, path: str, draft: Draft, keep_existing: bool = False) -> bool: ...

    async def kernel_told(self) -> None:
        """Wait until the kernel knows what the pages published so far replaced."""


class _Entry(NamedTuple):
    path: str
    size: int
    start: int  # stream offset of the page's first byte


def parse_header(header: bytes, count: int, payload_start: int) -> list[_Entry]:
    """The pages a header names, with their places in the stream; EINVAL when malformed."""
    lines = header.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    if len(lines) != count:
        raise FsError(errno.EINVAL, f"ingest header has {len(lines)} lines for {count} pages")
    entries, position = [], payload_start
    for line in lines:
        size, path = size_and_path(line, "an ingest header")
        try:
            text = path.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.EINVAL, "an ingest path is not UTF-8") from None
        entries.append(_Entry(text, size, position))
        position += size
    return entries


class IngestStream:
    """One handle's batch in progress. See the module docstring."""

    def __init__(self, publisher: Publisher, max_page_size: int, account: Account) -> None:
        """``account``: what holds the batch's header (its opener's share of request memory)."""
        self.publisher = publisher
        self.max_page_size = max_page_size
        self.account = account
        self._reset()

    def _reset(self) -> None:
        self._position = 0  # stream bytes accepted
        self._prefix = bytearray()  # the prefix and header, until parsed
        self._entries: list[_Entry] | None = None
        self._next = 0  # index of the page being received: the batch's pages published so far
        self._draft: Draft | None = None
        self._keep_existing = False
        self._skipping = False  # the page being received is kept as it is: its bytes pass by
        self._failure: FsError | None = None

    async def write(self, offset: int, data: bytes) -> int:
        if offset == 0:
            self.close()
            self._reset()
        elif self._failure is not None:
            raise FsError(errno.EIO, "this batch stopped at a failed page; start a new one at offset 0")
        elif offset != self._position:
            raise FsError(errno.EINVAL, f"an ingest write at {offset} does not continue the batch "
                                        f"(at {self._position}); a batch starts at offset 0")
        view = memoryview(data)
        used, turn_ends = 0, self._next + PAGES_PER_TURN
        while used < len(view):
            rest = view[used:]
            try:
                taken = self._take_header(rest) if self._entries is None else self._take_payload(rest)
            except (FsError, StoreError) as exc:
                return self._stopped(exc, used)
            used += taken
            self._position += taken
            if self._next >= turn_ends and used < len(view):
                if not await self._let_others_run():
                    return used
                turn_ends = self._next + PAGES_PER_TURN
        return used

    async def _let_others_run(self) -> bool:
        """Let other requests run, between two pages (``PAGES_PER_TURN``); whether the batch is
        still this handle's after (a write at offset 0 meanwhile began another one, which the
        rest of this write must not go into)."""
        entries = self._entries
        await trio.sleep(0)
        return self._entries is entries

    def _stopped(self, exc: FsError | StoreError, used: int) -> int:
        """A page failed after ``used`` bytes of the write: accept those (a short write) when
        a page of the batch was published, else fail the write."""
        self.close()
        # A copy: the raised one's traceback holds the write's data (a MiB) for as long as the
        # handle keeps it, and a cycle through this stream beyond its close.
        self._failure = FsError(errno_of(exc), exc.strerror if isinstance(exc, FsError) else str(exc))
        if used and self._next:
            return used
        raise exc

    def _new_draft(self, entry: _Entry) -> Draft | None:
        """The draft of a page whose first byte comes now; None for a page kept as it is."""
        if self._keep_existing and self.publisher.has_page(entry.path, entry.size):
            return None
        return self.publisher.reserve_page(entry.path, entry.size)

    def status(self) -> bytes:
        """``<pages of the batch published> <errno of the failed page, or 0>\\n``."""
        return b"%d %d\n" % (self._next, 0 if self._failure is None else errno_of(self._failure))

    def close(self) -> None:
        """The handle closed, or the batch stopped or a new one began: a page not yet complete is
        dropped, and the header let go of."""
        draft, self._draft = self._draft, None
        if draft is not None:
            self.publisher.abandon_page(draft)
        self._let_go_of_header()

    def _let_go_of_header(self) -> None:
        """The batch needs its header no more (its last page came, or it ended): no page is left
        to take, and what the header held comes back."""
        self._prefix = bytearray()
        self._entries = []
        self.account.hold(0)

    def _take_header(self, data: memoryview) -> int:
        """Gather the prefix and header; parse them once whole. Returns the bytes used."""
        have = len(self._prefix)
        want = _PREFIX.size if have < _PREFIX.size else _PREFIX.size + self._header_length()
        take = min(want - have, len(data))
        self.account.hold(have + take)
        self._prefix += data[:take]
        if len(self._prefix) == _PREFIX.size:
            magic, length, count, flags = _PREFIX.unpack(self._prefix)
            if magic != MAGIC:
                raise FsError(errno.EINVAL, "not an ingest batch (bad magic)")
            if length > MAX_HEADER_BYTES:
                raise FsError(errno.EFBIG, f"ingest header over {MAX_HEADER_BYTES} bytes")
            if count > MAX_PAGES:  # (parsed in one go on the event loop)
                raise FsError(errno.EFBIG, f"an ingest batch holds at most {MAX_PAGES} pages")
            self._keep_existing = bool(flags & KEEP_EXISTING)
        if len(self._prefix) >= _PREFIX.size and len(self._prefix) == _PREFIX.size + self._header_length():
            _, length, count, _ = _PREFIX.unpack_from(self._prefix)
            self._entries = parse_header(bytes(self._prefix[_PREFIX.size:]), count, _PREFIX.size + length)
            self._prefix = bytearray()
            self.account.hold(length + PARSED_LINE_BYTES * count)  # its lines, until the last page
        return take

    def _header_length(self) -> int:
        return _PREFIX.unpack_from(self._prefix)[1]

    def _take_payload(self, data: memoryview) -> int:
        """Copy bytes into the page being received; publish it once whole."""
        if self._next >= len(self._entries):
            raise FsError(errno.EINVAL, "ingest write past the last page of the batch")
        entry = self._entries[self._next]
        written = self._position - entry.start
        if written == 0:
            if entry.size > self.max_page_size:  # it stops the batch here, as any page that cannot be published
                raise FsError(errno.EFBIG, f"a page of {entry.size} bytes is over the maximum page size")
            self._draft = self._new_draft(entry)
            self._skipping = self._draft is None
        take = min(entry.size - written, len(data))
        if not self._skipping:
            self._draft.write(written, data[:take])
        if written + take == entry.size:
            draft, self._draft = self._draft, None
            if not self._skipping:  # (a page stored meanwhile is kept too: asked again at publish)
                self.publisher.publish_reserved(entry.path, draft, self._keep_existing)
            self._next += 1
            if self._next == len(self._entries):
                self._let_go_of_header()
        return take


class IngestHandle:
    """A handle on ``.hicachefs/ingest``: its writes are batches of pages, a read tells how the
    last one went (``ingest.py``)."""

    cacheable = False

    def __init__(self, publisher: Publisher, max_page_size: int, account: Account):
        self.stream = IngestStream(publisher, max_page_size, account)

    async def read(self, offset: int, size: int) -> bytes:
        return self.stream.status()[offset : offset + size]

    async def write(self, offset: int, data: bytes) -> int:
        """Take the write; answer once the kernel knows of every page it replaced, so that a
        reader told of the replace by the writer never reads the old page from its cache."""
        try:
            return await self.stream.write(offset, data)
        finally:
            await self.stream.publisher.kernel_told()

    def release(self) -> None:
        self.stream.close()
