"""``.hicachefs/plane``: the daemon's side of the data plane, the store's own writers' requests.

The data plane (docs/contract.md, "The data plane"): root and the daemon's user open the RAM
tier's arena, the shared index and the disk tier's file through the mount (``.hicachefs/arena``,
``index``, ``disk``: symbolic links to this process's descriptors, which only they may follow),
read pages themselves with no request at all, and copy the pages they write into reserved slots
of the arena themselves. What is left for the daemon goes through this file, a request a write
and its answer a read from offset 0:

    request  "HCPQ" op:u16 flags:u16 count:u32 body_bytes:u32 seq:u64, then the body
    answer   "HCPA" op:u16 0:u16 count:u32 body_bytes:u32 seq:u64, then the body

A request with flag ``IN_MAILBOX`` has its answer also written into the handle's mailbox (a slot
of the arena the handle holds, ``MAILBOX``), before the write is answered, so that the writer
reads it from the arena: a batch then costs the daemon one request (its WRITE), not two. The
answer's ``seq`` is its request's, so an answer that did not fit (and is only read) is never
taken for a later one.

- ``DIR``: body the path of a pool directory; answer ``<q``, the number the index hashes its keys
  with (a client asks once per directory and daemon).
- ``RESERVE``: body ``count`` sizes (``<I``); answer per page ``<q``: the offset of a slot in the
  arena that is this handle's until it commits it, releases it or closes, or ``-errno`` (no slot:
  the page goes another way).
- ``COMMIT``: body ``count`` entries ``<qQIH`` (slot offset, xxh3_64 of the page, size, path
  length) each followed by the page's path, then ``<I`` n and n sizes to reserve next (so that a
  batch costs one request; all handles' slots reserved ahead hold at most the RAM budget's
  ``reserved_ahead`` share, a sixteenth of the tier: such a slot made room in RAM one batch
  early, evicting or demoting as any write does); ``flags`` 1 (``KEEP_EXISTING``) leaves pages already stored at the size
  committed as they are (one of another size is replaced), 4 (``MAKE_POOLS``) makes a page's pool directory where it is missing, as mkdir would. Answer per page ``<i``: 0 published, 1 kept as it was, or ``-errno``; then per size to
  reserve ``<q`` as ``RESERVE`` answers.
- ``REPORT``: body ``count`` reads the client made (``<IQ``: the index row and its ``gen`` as it
  read it; at most ``MAX_REPORT``), counted as hits, then optionally ``<I`` the reads it found
  no page for (at most ``MAX_REPORT``), counted as misses; answer ``<I``, how many reads still
  stood for their page.
- ``RELEASE``: body ``count`` slot offsets (``<q``) given back; empty answer.
- ``MAILBOX``: a mailbox for this handle (``MAILBOX_BYTES``); answer ``<q16s``: its offset in
  the arena, or ``-errno``, and the store's token (as the shared index's header holds it), by
  which a client knows that a handle it opened by path reaches the daemon whose memory it maps
  (a handle opened just after a restart reaches the next daemon).

The rules of page files hold: a reservation stays its handle's until committed or released, and
the daemon never gives its slot to anyone else; closing the handle frees what was not committed,
so a writer that dies publishes nothing; a commit publishes each page atomically (replacing a
page of that name, as a rename would), with the writer's checksum, and a page that fails
publishes nothing. Reserved slots count as files being written (``WritingBudget``: at most half
of ``--memory``). A request sent in several writes is held, until whole, against its writer's
share of the request files' memory (``request_limits``): the piece that would go over fails with
ENOBUFS and ends the request. A commit is answered once the kernel knows what it replaced. A
malformed request fails its write with EINVAL.

Not thread-safe: the daemon's trio thread only. Nothing blocks beyond the store's memory-speed
calls.
"""

from __future__ import annotations

import errno
import struct
from typing import Protocol
from .. import names
from ..store import Draft, PageStore, StoreError, size_class
from ..store.budget import Share
from ..posix.errors import FsError, errno_of
from . import ingest
from .request_limits import Account
from ..posix.writing_budget import WritingBudget

REQUEST = struct.Struct("<4sHHIIQ")
ANSWER = struct.Struct("<4sHHIIQ")
REQUEST_MAGIC, ANSWER_MAGIC = b"HCPQ", b"HCPA"
DIR, RESERVE, COMMIT, REPORT, RELEASE, MAILBOX = 1, 2, 3, 4, 5, 6
KEEP_EXISTING, IN_MAILBOX, MAKE_POOLS = 1, 2, 4
#: A mailbox holds the answer to a commit of 4,096 pages with 128 to reserve next.
MAILBOX_BYTES = 64 << 10
PUBLISHED, KEPT = 0, 1
_ENTRY = struct.Struct("<qQIH")
_SIZE = struct.Struct("<I")
_READ = struct.Struct("<IQ")
_OFFSET = struct.Struct("<q")
_MAILBOX = struct.Struct("<q16s")
#: Reads one report may hold (about 2 ms of the daemon's time to count).
MAX_REPORT = 4096
#: The largest request: a commit of 4,096 pages of the longest path, with as many sizes ahead.
MAX_REQUEST = 4096 * (_ENTRY.size + 5 * names.MAX_NAME_BYTES + 4 + _SIZE.size) + REQUEST.size + 4


def _bounded(count: int, what: str) -> None:
    """Pages one request may name (its work runs on the event loop, as a report's does)."""
    if count > MAX_REPORT:
        raise FsError(errno.EFBIG, f"{what} holds at most {MAX_REPORT} pages")


class Publisher(ingest.Publisher, Protocol):
    """The namespace's publish rules, and what the files being written may hold."""

    writing: WritingBudget

    def publish_page(self, path: str, draft: Draft, keep_existing: bool = False) -> bool: ...

    def make_pool(self, path: str) -> None: ...


class PlaneHandle:
    """One writer's handle on ``.hicachefs/plane``: its reservations and its last answer."""

    cacheable = False

    def __init__(self, store: PageStore, publisher: Publisher, ahead: Share, account: Account) -> None:
        """``ahead``: the RAM budget's share of slots reserved ahead of writers' next batches;
        ``account``: what holds a request sent in pieces (its opener's share of request memory)."""
        self.store = store
        self.publisher = publisher
        self.budget = publisher.writing
        self.ahead = ahead
        self.account = account
        self._reserved: dict[int, Draft] = {}  # arena offset -> the draft of a slot of this handle's
        self._ahead: set[int] = set()  # of those, the ones reserved ahead (``ahead``)
        self._mailbox: Draft | None = None
        self._request = bytearray()
        self._answer = b""

    async def write(self, offset: int, data) -> int:
        """Take a request's bytes (from offset 0, in order); run it once whole."""
        if offset == 0:
            self._drop_request()
        elif offset != len(self._request):
            raise FsError(errno.EINVAL, f"a plane request goes on at {len(self._request)}, not {offset}")
        if len(self._request) + len(data) > MAX_REQUEST:
            self._drop_request()
            raise FsError(errno.EFBIG, f"a plane request is at most {MAX_REQUEST} bytes")
        whole = offset == 0 and len(data) >= REQUEST.size  # the usual case: one write, one request
        if not whole:
            self._gather(data)
            if len(self._request) < REQUEST.size:
                return len(data)
        request = data if whole else self._request
        magic, op, flags, count, body_bytes, seq = REQUEST.unpack_from(request)
        if magic != REQUEST_MAGIC:
            self._drop_request()
            raise FsError(errno.EINVAL, "not a plane request (bad magic)")
        if len(request) < REQUEST.size + body_bytes:
            if whole:
                self._gather(data)
            return len(data)
        # A request that came whole is read where it lies (run before this returns, it is kept
        # nowhere); one that came in pieces is copied out of the buffer it was gathered in.
        body = memoryview(data if whole else bytes(self._request))[REQUEST.size : REQUEST.size + body_bytes]
        self._drop_request()
        try:
            answer = self._run(op, flags, count, body)
        except struct.error:
            raise FsError(errno.EINVAL, "a plane request's body does not hold what its header says") from None
        finally:
            if op == COMMIT:
                await self.publisher.kernel_told()
        self._answer = ANSWER.pack(ANSWER_MAGIC, op, 0, count, len(answer), seq) + answer
        if flags & IN_MAILBOX and self._mailbox is not None and len(self._answer) <= MAILBOX_BYTES:
            self._mailbox.buffer[: len(self._answer)] = self._answer
        return len(data)

    async def read(self, offset: int, size: int) -> bytes:
        return self._answer[offset : offset + size]

    def _gather(self, data) -> None:
        """Keep a piece of a request sent in pieces, held against the account: a writer's many
        handles each holding a partial request took the daemon's memory without bound. ENOBUFS,
        ending the request, when it would go over."""
        try:
            self.account.hold(len(self._request) + len(data))
        except FsError:
            self._drop_request()
            raise
        self._request += data

    def _drop_request(self) -> None:
        """Let go of the request gathered so far (whole, ended or cut off), and what it held."""
        self._request = bytearray()
        if self.account.held:  # (a request that came whole held nothing: the commit path's usual case)
            self.account.hold(0)

    def release(self) -> None:
        """The handle closed (its writer may have died): what it did not commit publishes nothing."""
        self._drop_request()
        for offset in list(self._reserved):
            self._give_back(self._take(offset))
        mailbox, self._mailbox = self._mailbox, None
        if mailbox is not None:
            self._give_back(mailbox)

    # -- the operations --------------------------------------------------------------------

    def _run(self, op: int, flags: int, count: int, body: memoryview) -> bytes:
        if op == DIR:
            return _OFFSET.pack(self.store.plane_dir(self._directory(bytes(body))))
        if op == RESERVE:
            _bounded(count, "a reserve")
            return self._reserve([_SIZE.unpack_from(body, 4 * i)[0] for i in range(count)])
        if op == COMMIT:
            return self._commit(flags, count, body)
        if op == REPORT:
            if count > MAX_REPORT:  # counted on the event loop: a few milliseconds at the most
                raise FsError(errno.EFBIG, f"a report holds at most {MAX_REPORT} reads")
            reads = [_READ.unpack_from(body, _READ.size * i) for i in range(count)]
            self._count_misses(body[_READ.size * count :])
            return _SIZE.pack(self.store.count_plane_reads(reads))
        if op == RELEASE:
            _bounded(count, "a release")
            for i in range(count):
                draft = self._take(_OFFSET.unpack_from(body, 8 * i)[0])
                if draft is not None:
                    self._give_back(draft)
            return b""
        if op == MAILBOX:
            return _MAILBOX.pack(self._open_mailbox(), self.store.plane_token)
        raise FsError(errno.EINVAL, f"no plane operation {op}")

    def _count_misses(self, rest: memoryview) -> None:
        """The misses a report carries after its reads (none when it ends there)."""
        if len(rest):
            misses = _SIZE.unpack(rest)[0]
            if misses > MAX_REPORT:
                raise FsError(errno.EFBIG, f"a report holds at most {MAX_REPORT} misses")
            self.store.count_misses(misses)

    def _open_mailbox(self) -> int:
        """The handle's mailbox (made at its first ask): its offset in the arena, or -errno."""
        if self._mailbox is None:
            offset = _OFFSET.unpack(self._reserve([MAILBOX_BYTES]))[0]
            if offset < 0:
                return offset
            self._mailbox = self._reserved.pop(offset)
        return self._mailbox.shared_at

    def _reserve(self, sizes: list[int], ahead: bool = False) -> bytes:
        """A slot for each size, or ``-errno`` where none can be had (past the writing budget,
        too large for RAM, RAM held by readers: the page then goes another way). ``ahead``: for
        the next batch, within the ``ahead`` share."""
        answers = []
        for size in sizes:
            cost = size_class(size)  # what the slot takes of the tier (64 bytes at least)
            if ahead and not self.ahead.take(cost):
                answers.append(-errno.ENOBUFS)
                continue
            try:
                self.budget.change(cost)
            except FsError as exc:
                answers.append(-exc.errno)
                continue
            try:
                draft = self.store.reserve(size)
            except StoreError as exc:
                self.budget.change(-cost)
                answers.append(-errno_of(exc))
                continue
            if draft.shared_at is None:  # private memory: no slot a client can reach
                self.store.abandon(draft)
                self.budget.change(-cost)
                answers.append(-errno.ENOSPC)
                continue
            self._reserved[draft.shared_at] = draft
            if ahead:
                self._ahead.add(draft.shared_at)
            answers.append(draft.shared_at)
        if ahead:  # what could not be had goes back to the ahead budget
            for size, answer in zip(sizes, answers):
                if answer < 0 and answer != -errno.ENOBUFS:
                    self.ahead.give_back(size_class(size))
        return struct.pack(f"<{len(answers)}q", *answers)

    def _take(self, offset: int) -> Draft | None:
        """The handle's slot at ``offset``, no longer reserved (None if it holds none there)."""
        draft = self._reserved.pop(offset, None)
        if draft is not None and offset in self._ahead:
            self._ahead.discard(offset)
            self.ahead.give_back(size_class(draft.size))
        return draft

    def _commit(self, flags: int, count: int, body: memoryview) -> bytes:
        _bounded(count, "a commit")
        entries = []
        unpack, entry_size, keep_existing = _ENTRY.unpack_from, _ENTRY.size, flags & KEEP_EXISTING
        make_pools = bool(flags & MAKE_POOLS)
        at = 0
        for _ in range(count):  # the whole request read before any page is published
            offset, checksum, size, length = unpack(body, at)
            start = at + entry_size
            at = start + length
            entries.append((offset, checksum, size, str(body[start:at], "utf-8", "surrogateescape")))
        ahead = _SIZE.unpack_from(body, at)[0]
        _bounded(ahead, "a commit's reservation ahead")
        sizes = list(struct.unpack_from(f"<{ahead}I", body, at + 4))
        outcomes = [self._publish(offset, checksum, size, path, keep_existing, make_pools)
                    for offset, checksum, size, path in entries]
        return struct.pack(f"<{count}i", *outcomes) + self._reserve(sizes, ahead=True)

    def _publish(self, offset: int, checksum: int, size: int, path: str, keep_existing: int,
                 make_pools: bool) -> int:
        """Publish the page its writer copied into the slot at ``offset``: PUBLISHED, KEPT or
        ``-errno``. The slot is used up whatever happens."""
        draft = self._take(offset)
        if draft is None:
            return -errno.EBADF  # not a slot of this handle's (never reserved, or used up)
        self.budget.change(-size_class(draft.size))
        if draft.size != size:
            self.store.abandon(draft)
            return -errno.EINVAL
        draft.mark_filled(checksum)
        if make_pools:
            try:
                self.publisher.make_pool(path)
            except (FsError, StoreError) as exc:
                self.store.abandon(draft)  # published nowhere: its slot comes back
                return -errno_of(exc)
        try:
            published = self.publisher.publish_page(path, draft, bool(keep_existing))  # consumes the draft
        except (FsError, StoreError) as exc:
            return -errno_of(exc)
        return PUBLISHED if published else KEPT

    def _give_back(self, draft: Draft) -> None:
        self.budget.change(-size_class(draft.size))
        self.store.abandon(draft)

    @staticmethod
    def _directory(raw: bytes) -> str:
        """A pool directory's path, checked (the index numbers no other)."""
        parts = raw.split(b"/")
        if len(parts) != names.POOL_DEPTH:
            raise FsError(errno.EINVAL, "a plane directory is a pool directory: model/format/shard/pool")
        try:
            return "/".join(names.check_component(part) for part in parts)
        except names.BadName as exc:
            raise FsError(exc.errno, str(exc)) from None
