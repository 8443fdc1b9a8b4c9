"""``.hicachefs/ingest``: many pages published by one stream of writes (DESIGN.md, "Publishing
many pages in one write").

Why: a publish by temporary file and rename is six FUSE requests per page (LOOKUP, CREATE,
WRITE, RELEASE, LOOKUP, RENAME), about 60 us each on the daemon's one thread; 8 pages of
128 KiB took 4.7 ms to publish that way. Here a batch is one ``pwritev``: the kernel cuts it
into WRITE requests of at most 1 MiB, so a page costs its bytes' share of those.

A batch, written from offset 0, each write continuing where the last one ended:
``HCFSPUT1``, the header's length (uint32 little-endian), the page count and the flags (uint16
each), the header (one ``<size> <path>\\n`` line per page), then the pages' bytes back to back.
With ``KEEP_EXISTING`` a page whose name is published already is left as it is (its bytes are
passed over): the writer need not ask first which pages the store has. A page is
reserved in the store when its first byte arrives and published (``Publisher.publish_page``:
the namespace's rules, as for a rename) when its last one has. A page cut off by the end of the
handle or by a new batch publishes nothing.

A page that cannot be published stops the batch: the write that reached it accepts only the
bytes before it, or fails with the page's errno when it is the batch's first page or none of
its bytes came before it (the kernel then reports the batch's earlier writes as a short one).
A read of the handle says how many of the batch's pages were published and the errno of the one
that failed: ``<published> <errno>\\n``.

With worker processes (``--workers``) a WRITE's page bytes need not pass through the owner of
the store: ``plan`` takes the write's head (the batch's first write sends the prefix and header,
and whatever payload follows them in its head; later writes send none) as any write, reserves
the pages the rest of the write reaches and says where their bytes go (a draft's place in the
memory the store shares with the workers, or inline when it has none; nowhere for a page kept as
it is); the worker copies them there and checksums the pages whose last byte it copied (all
their bytes are in that memory by then: a batch's writes come one after another), and
``filled`` publishes them with those checksums, with the same rules and answers as ``write``.
After a write the owner may also reserve the drafts of the pages that follow (``reserve_ahead``:
then a page is reserved before its first byte arrives, and ``KEEP_EXISTING`` asks whether its
name is published when it is reserved) and show them to the workers (``window``); a worker that
copied the next write by them sends ``filled_at``, which plans that write and fills it in one
(``ingest_windows.py``).

Not thread-safe: the daemon's trio thread only. Nothing here blocks beyond the store's
memory-speed ``reserve`` and ``publish``.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .. import names
from ..store import Draft, StoreError
from .errors import FsError, errno_of

MAGIC = b"HCFSPUT1"
_PREFIX = struct.Struct("<8sIHH")
#: Flag: leave pages already published as they are.
KEEP_EXISTING = 1
#: The largest header: 4,096 pages of the longest path (a batch of SGLang's is 128 pages).
MAX_HEADER_BYTES = 4096 * (5 * names.MAX_NAME_BYTES + 4 + 24)


class Publisher(Protocol):
    """What the stream needs of the namespace: room for a page whose path it has checked, and
    its publish rules. ``publish_page`` consumes the draft whatever happens."""

    def has_page(self, path: str) -> bool: ...

    def reserve_page(self, path: str, size: int) -> Draft: ...

    def abandon_page(self, draft: Draft) -> None: ...

    def publish_page(self, path: str, draft: Draft) -> None: ...

    async def kernel_told(self) -> None:
        """Wait until the kernel knows what the pages published so far replaced."""


class _Entry(NamedTuple):
    path: str
    size: int
    start: int  # stream offset of the page's first byte


def parse_header(header: bytes, count: int, payload_start: int, max_size: int) -> list[_Entry]:
    """The pages a header names, with their places in the stream; EINVAL when malformed."""
    lines = header.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    if len(lines) != count:
        raise FsError(errno.EINVAL, f"ingest header has {len(lines)} lines for {count} pages")
    entries, position = [], payload_start
    for line in lines:
        size_text, _, path = line.partition(b" ")
        if not size_text.isdigit() or not path:
            raise FsError(errno.EINVAL, "an ingest header line is not '<size> <path>'")
        size = int(size_text)
        if size == 0:
            raise FsError(errno.EINVAL, "an ingest page has at least one byte")
        if size > max_size:
            raise FsError(errno.EFBIG, f"a page of {size} bytes is over the maximum page size")
        try:
            text = path.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.EINVAL, "an ingest path is not UTF-8") from None
        entries.append(_Entry(text, size, position))
        position += size
    return entries


class _Step(NamedTuple):
    """A planned part of a write: ``take`` bytes of page ``index`` from its byte ``written``
    on, into ``draft`` (None: the page is kept as it is; index -1: the header goes on)."""

    index: int
    written: int
    take: int
    draft: Draft | None


@dataclass
class WritePlan:
    """Where the bytes of a write past its head go (see the module docstring): ``copies`` are
    (position in the write, length, offset in shared memory), ``inline`` the (position, length)
    ranges to send back with ``filled``, in order; ``checksummed`` the (offset in shared memory,
    size) of the pages the copies complete, whose checksums ``filled`` gets, in order."""

    copies: list[tuple[int, int, int]] = field(default_factory=list)
    inline: list[tuple[int, int]] = field(default_factory=list)
    checksummed: list[tuple[int, int]] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)
    taken: int = 0  # bytes of the write the head used
    failure: FsError | StoreError | None = None  # what stops the write after its steps
    reserved: list[Draft] = field(default_factory=list)  # drafts of pages the plan began

    def wire(self) -> tuple[list, list, list]:
        """What the worker needs of it: the copies, the inline ranges, the pages to checksum."""
        return self.copies, self.inline, self.checksummed


class IngestStream:
    """One handle's batch in progress. See the module docstring."""

    def __init__(self, publisher: Publisher, max_page_size: int) -> None:
        self.publisher = publisher
        self.max_page_size = max_page_size
        self._reset()

    def _reset(self) -> None:
        self._position = 0  # stream bytes accepted
        self._prefix = bytearray()  # the prefix and header, until parsed
        self._entries: list[_Entry] | None = None
        self._next = 0  # index of the page being received: the batch's pages published so far
        self._draft: Draft | None = None
        self._keep_existing = False
        self._skipping = False  # the page being received is kept as it is: its bytes pass by
        self._failure: FsError | StoreError | None = None
        self._plan: WritePlan | None = None  # planned, not filled yet
        self._ahead: dict[int, Draft | None] = {}  # page index -> its draft reserved ahead (None: kept)

    def write(self, offset: int, data: bytes) -> int:
        self._drop_plan()
        if offset == 0:
            self.close()
            self._reset()
        elif self._failure is not None:
            raise FsError(errno.EIO, "this batch stopped at a failed page; start a new one at offset 0")
        elif offset != self._position:
            raise FsError(errno.EINVAL, f"an ingest write at {offset} does not continue the batch "
                                        f"(at {self._position}); a batch starts at offset 0")
        view = memoryview(data)
        used = 0
        while used < len(view):
            rest = view[used:]
            try:
                taken = self._take_header(rest) if self._entries is None else self._take_payload(rest)
            except (FsError, StoreError) as exc:
                return self._stopped(exc, used)
            used += taken
            self._position += taken
        return used

    def _stopped(self, exc: FsError | StoreError, used: int) -> int:
        """A page failed after ``used`` bytes of the write: accept those (a short write) when
        a page of the batch was published, else fail the write."""
        self.close()
        self._failure = exc
        if used and self._next:
            return used
        raise exc

    def plan(self, offset: int, size: int, head) -> int | WritePlan:
        """Phase one of a ``size``-byte write at ``offset`` whose bytes past ``head`` another
        process copies: the bytes accepted when the head was the whole write or the write
        stopped in it, else the plan for the rest (``filled`` ends it)."""
        taken = self.write(offset, head)
        if taken < len(head) or taken == size:
            return taken
        plan = WritePlan(taken=taken)
        if self._entries is None:  # a header longer than the head: it all comes inline
            plan.inline.append((taken, size - taken))
            plan.steps.append(_Step(-1, 0, size - taken, None))
            self._plan = plan
            return plan
        at, index = taken, self._next
        written = self._position - self._entries[index].start if index < len(self._entries) else 0
        while at < size:
            if index >= len(self._entries):
                plan.failure = FsError(errno.EINVAL, "ingest write past the last page of the batch")
                break
            entry = self._entries[index]
            try:
                draft = self._planned_draft(plan, index, written, entry)
            except (FsError, StoreError) as exc:
                plan.failure = exc
                break
            take = min(entry.size - written, size - at)
            if draft is not None:
                if draft.shared_at is None:
                    plan.inline.append((at, take))
                else:
                    plan.copies.append((at, take, draft.shared_at + written))
                    if written + take == entry.size:
                        plan.checksummed.append((draft.shared_at, entry.size))
            plan.steps.append(_Step(index, written, take, draft))
            at += take
            index, written = index + 1, 0
        self._plan = plan
        return plan

    def _planned_draft(self, plan: WritePlan, index: int, written: int, entry: _Entry) -> Draft | None:
        """The draft a planned step goes into: the page in progress's, or a new one (None for a
        page kept as it is)."""
        if written:  # the page began in an earlier write
            return None if self._skipping else self._draft
        draft = self._new_draft(index, entry)
        if draft is not None:
            plan.reserved.append(draft)
        return draft

    def _new_draft(self, index: int, entry: _Entry) -> Draft | None:
        """The draft of a page whose first byte comes now: the one reserved ahead for it, or a
        new one; None for a page kept as it is."""
        if index in self._ahead:
            return self._ahead.pop(index)
        if self._keep_existing and self.publisher.has_page(entry.path):
            return None
        return self.publisher.reserve_page(entry.path, entry.size)

    def reserve_ahead(self, ahead: int, most: int) -> None:
        """Reserve the drafts of the pages that begin in the next ``ahead`` bytes of the stream
        (at most ``most`` pages held ahead), so that another process can copy their bytes with
        no ``plan`` (``window``). Stops quietly where the store has no room: the write that
        reaches that page asks for it again, and fails as it would have."""
        if self._entries is None or self._failure is not None or self._plan is not None:
            return
        entries, index = self._entries, self._next
        if index < len(entries) and self._position > entries[index].start:
            index += 1  # the page in progress has its draft
        while index < len(entries) and entries[index].start < self._position + ahead and len(self._ahead) < most:
            if index not in self._ahead:
                try:
                    self._ahead[index] = self._new_draft(index, entries[index])
                except (FsError, StoreError):
                    return
            index += 1

    def window(self) -> tuple[int, list[tuple[int, int, int | None]]]:
        """Where the stream stands, and the pages from there on whose drafts are ready, in
        order: (start in the stream, size, their draft's place in shared memory; None for a page
        kept as it is). Empty once the batch stopped, while a write is planned, or where the
        next page's draft is not in shared memory."""
        pages: list[tuple[int, int, int | None]] = []
        if self._entries is None or self._failure is not None or self._plan is not None:
            return self._position, pages
        entries, index = self._entries, self._next
        if index < len(entries) and self._position > entries[index].start:  # the page in progress
            if not self._skipping and (self._draft is None or self._draft.shared_at is None):
                return self._position, pages
            entry = entries[index]
            pages.append((entry.start, entry.size, None if self._skipping else self._draft.shared_at))
            index += 1
        while index in self._ahead:
            draft = self._ahead[index]
            if draft is not None and draft.shared_at is None:
                break
            pages.append((entries[index].start, entries[index].size, None if draft is None else draft.shared_at))
            index += 1
        return self._position, pages

    def filled_at(self, offset: int, size: int, copies: list[tuple[int, int, int]], checksums: list[int]) -> int:
        """A write another process copied by the ``window`` (``copies``: what it copied where,
        as a plan says it) and checksummed the pages it completed: ``plan`` and ``filled`` in one.
        EIO, and nothing published, if the plan is not what it copied by."""
        plan = self.plan(offset, size, b"")
        if isinstance(plan, int):
            return plan
        if plan.inline or plan.copies != [tuple(c) for c in copies]:
            self._drop_plan()
            raise FsError(errno.EIO, "an ingest write was copied by a window that no longer holds")
        return self.filled([], checksums)

    def filled(self, inline: list, checksums: list[int]) -> int:
        """Phase two: the worker copied the plan's bytes (``inline``: those it had nowhere to
        copy, in order) and checksummed the pages it completed (``checksums``, in the plan's
        order); publish those pages. Answers as ``write`` does."""
        plan, self._plan = self._plan, None
        if plan is None:
            raise FsError(errno.EINVAL, "no ingest write is waiting for its bytes")
        if len(checksums) != len(plan.checksummed):
            raise FsError(errno.EINVAL, f"{len(checksums)} checksums for {len(plan.checksummed)} pages")
        pieces, sums = iter(inline), iter(checksums)
        if plan.steps and plan.steps[0].index < 0:  # the whole rest came inline
            return plan.taken + self.write(self._position, next(pieces))
        used = plan.taken
        for n, step in enumerate(plan.steps):
            entry = self._entries[step.index]
            completes = step.written + step.take == entry.size
            self._draft, self._skipping = step.draft, step.draft is None
            if step.draft is not None:
                if step.draft.shared_at is None:
                    step.draft.write(step.written, next(pieces))
                else:
                    step.draft.mark_filled(next(sums) if completes else None)
            if completes:
                draft, self._draft = self._draft, None
                if draft is not None:
                    try:
                        self.publisher.publish_page(entry.path, draft)
                    except (FsError, StoreError) as exc:
                        self._abandon(plan.steps[n + 1 :], plan.reserved)
                        return self._stopped(exc, used)
                self._next += 1
            used += step.take
            self._position += step.take
        if plan.failure is not None:
            return self._stopped(plan.failure, used)
        return used

    def _drop_plan(self) -> None:
        """A plan that was never filled (a new write came first): its pages publish nothing."""
        plan, self._plan = self._plan, None
        if plan is not None:
            self._abandon(plan.steps, plan.reserved)

    def _abandon(self, steps: list[_Step], reserved: list[Draft]) -> None:
        """Give back the drafts the plan reserved for ``steps`` (the page in progress's is
        the stream's own: ``close`` gives it back)."""
        for step in steps:
            if step.draft is not None and step.draft is not self._draft and step.draft in reserved:
                self.publisher.abandon_page(step.draft)

    def status(self) -> bytes:
        """``<pages of the batch published> <errno of the failed page, or 0>\\n``."""
        return b"%d %d\n" % (self._next, 0 if self._failure is None else errno_of(self._failure))

    def close(self) -> None:
        """The handle closed, or a new batch began: a page not yet complete is dropped, and so
        are the drafts reserved ahead."""
        self._drop_plan()
        draft, self._draft = self._draft, None
        if draft is not None:
            self.publisher.abandon_page(draft)
        ahead, self._ahead = self._ahead, {}
        for draft in ahead.values():
            if draft is not None:
                self.publisher.abandon_page(draft)

    def _take_header(self, data: memoryview) -> int:
        """Gather the prefix and header; parse them once whole. Returns the bytes used."""
        have = len(self._prefix)
        want = _PREFIX.size if have < _PREFIX.size else _PREFIX.size + self._header_length()
        take = min(want - have, len(data))
        self._prefix += data[:take]
        if len(self._prefix) == _PREFIX.size:
            magic, length, _, flags = _PREFIX.unpack(self._prefix)
            if magic != MAGIC:
                raise FsError(errno.EINVAL, "not an ingest batch (bad magic)")
            if length > MAX_HEADER_BYTES:
                raise FsError(errno.EFBIG, f"ingest header over {MAX_HEADER_BYTES} bytes")
            self._keep_existing = bool(flags & KEEP_EXISTING)
        if len(self._prefix) >= _PREFIX.size and len(self._prefix) == _PREFIX.size + self._header_length():
            _, length, count, _ = _PREFIX.unpack_from(self._prefix)
            self._entries = parse_header(bytes(self._prefix[_PREFIX.size:]), count,
                                         _PREFIX.size + length, self.max_page_size)
            self._prefix = bytearray()
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
            self._draft = self._new_draft(self._next, entry)
            self._skipping = self._draft is None
        take = min(entry.size - written, len(data))
        if not self._skipping:
            self._draft.write(written, data[:take])
        if written + take == entry.size:
            draft, self._draft = self._draft, None
            if not self._skipping:
                self.publisher.publish_page(entry.path, draft)
            self._next += 1
        return take
