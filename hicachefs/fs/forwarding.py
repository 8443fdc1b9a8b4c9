"""Requests that worker processes forward to the owner of the store (``--workers``).

A worker runs the same FUSE face as a single daemon (``operations.Operations``), over
``ForwardedRequests`` instead of ``Requests``: every request goes to the owner over the worker's
channel (``channel.py``), which answers it with ``serve``. The owner holds all state, so any
worker can answer any request, and counts each request by worker.

Page bytes cross as little as they can. The RAM tier's arena is mapped shared, so a read answer's
views of it cross as ``Span``s (offset, length) and the worker replies from its own mapping of the
same memory; other pieces (a page read from a lower tier, a control file) come inline. Reads of
the fetch file inside the window the owner pinned at the last forwarded one are not forwarded
at all (``fetch_windows.py``): ``serve`` shows each fetch handle's window when it answers a read
or a write (the request's first pages), and hides it before it answers a write or release. A write of
a handle whose writes can be staged (``requests.STAGED``: the ingest file) goes in two phases:
``plan`` (with the write's head when it begins a batch), the worker copies the rest where the plan
says (straight into the pages' drafts) and checksums the pages it completed, then ``filled``.
Other writes come inline.

``ForwardedRequests`` is the worker's side: each of the worker's tasks calls the owner as its
request needs (``channel.py``), not thread-safe. ``serve`` runs on the owner's trio loop,
``IN_FLIGHT`` tasks per worker.
"""

from __future__ import annotations

import contextvars
import errno
import logging
import os
import pickle
import types
from collections.abc import Callable
from typing import NamedTuple

import pyfuse3
import trio

from ..store import page_checksum
from .channel import AsyncChannel, Channel, ChannelClosed
from .fetch_windows import FetchWindows, Window
from .ingest_windows import MAX_AHEAD_PAGES, IngestWindow, IngestWindows
from .ingest import WritePlan
from .requests import STAGED, Requests
from .stolen_reads import StolenReads

log = logging.getLogger(__name__)

#: The most of a batch's first write sent with its plan: the ingest file's prefix and header of a
#: batch of SGLang's (128 pages: some 20 KB) and the start of its first page.
HEAD_BYTES = 64 << 10
#: Requests forwarded as they are: their arguments and answers are small.
_PLAIN = frozenset({
    "lookup", "getattr", "setattr", "statfs", "mkdir", "rmdir", "opendir", "readdir", "took",
    "releasedir", "create", "open", "release", "unlink", "rename", "getxattr", "listxattr",
    "setxattr", "removexattr",
})

#: The most requests a worker has in flight at once (pyfuse3's tasks in a worker; the owner's
#: tasks answering one worker): more than the large requests there may be at once (38:
#: ``request_limits.ANSWERING``), which wait for their turns, so small ones always find a task.
IN_FLIGHT = 64
#: The FUSE operation a worker's task began as, until its first call to the owner says so.
_COUNTED: contextvars.ContextVar[str | None] = contextvars.ContextVar("counted", default=None)

#: Requests that may change or make a handle's window (``Windows``).
_WINDOWED = frozenset({"read", "write", "release", "plan", "filled", "filled_at"})


class Span(NamedTuple):
    """Bytes of a read answer that lie in the store's shared memory."""

    offset: int
    length: int


class ForwardedRequests:
    """The request layer as a worker sees it: the same calls as ``Requests``, answered by the
    owner. A refusal comes back as its errno and is raised as ``FUSEError``. Requests of the
    worker's tasks go to the owner at once, each with the FUSE operation it began as (the owner
    counts requests by worker); ``reads`` hears when one was taken (``stolen_reads``)."""

    def __init__(self, channel: Channel, shared: memoryview, uid: int, gid: int, worker: int,
                 windows: Windows, reads: StolenReads) -> None:
        self.channel = channel
        self.shared = shared
        self.uid, self.gid = uid, gid
        self.worker = worker
        self.windows = windows
        self.reads = reads

    def count(self, op: str) -> None:
        """A request began (its handler's first step, right after it was read)."""
        self.reads.taken()
        _COUNTED.set(op)

    def refused(self, op: str, args: tuple, exc: BaseException) -> int:
        """A request the channel could not carry: the owner is gone or the wire broke."""
        log.error("%s%r: could not forward it to the owner of the store; answering EIO", op, args[:2],
                  exc_info=exc)
        return errno.EIO

    async def _call(self, op: str, *args):
        counted = _COUNTED.get()
        _COUNTED.set(None)
        try:
            err, value = await self.channel.call((op, args, counted))
        except (ChannelClosed, ConnectionError):
            # The owner died (a crash: its own stop ends the workers first). The kernel kills
            # this worker with it anyway (PR_SET_PDEATHSIG); answering EIO meanwhile would only
            # log an error per request still coming. The mount ends as a crashed daemon's does.
            log.info("the owner of the store is gone: this worker ends")
            os._exit(1)
        if err:
            raise pyfuse3.FUSEError(err)
        return value

    def __getattr__(self, op: str):
        if op not in _PLAIN:
            raise AttributeError(op)

        async def forwarded(*args):
            return await self._call(op, *args)

        return forwarded

    async def forget(self, inode_list) -> None:
        try:
            await self._call("forget", list(inode_list))
        except Exception:  # forget must never raise
            log.exception("forget of %d inodes could not be forwarded", len(inode_list))

    async def read(self, fh: int, offset: int, size: int) -> list:
        shared = self.shared
        pieces = self.windows.fetch.answer(fh, offset, size, shared)
        if pieces is not None:  # inside the fetch handle's window: the owner need not hear of it
            _COUNTED.set(None)
            self.windows.fetch.count(self.worker)
            return pieces
        return [shared[p.offset : p.offset + p.length] if isinstance(p, Span) else p
                for p in await self._call("read", fh, offset, size)]

    async def write(self, fh: int, offset: int, data) -> int:
        if not fh & STAGED or len(data) <= HEAD_BYTES:
            return await self._call("write", fh, offset, pickle.PickleBuffer(data))
        view = memoryview(data)
        planned = self.windows.ingest.plan(fh, offset, len(data))
        if planned is not None:  # inside the ingest handle's window: plan and fill in one
            copies, checksummed = planned
            return await self._call("filled_at", fh, offset, len(data), copies,
                                    self._copied(view, copies, checksummed))
        head = view[:HEAD_BYTES] if offset == 0 else view[:0]  # only a batch's start has a header
        plan = await self._call("plan", fh, offset, len(data), pickle.PickleBuffer(head))
        if isinstance(plan, int):
            return plan
        copies, inline, checksummed = plan
        checksums = self._copied(view, copies, checksummed)
        return await self._call("filled", fh, [pickle.PickleBuffer(view[at : at + length]) for at, length in inline],
                                checksums)

    def _copied(self, view: memoryview, copies: list, checksummed: list) -> list[int]:
        """Copy a write's bytes where its plan says; the checksums of the pages it completed."""
        shared = self.shared
        for at, length, target in copies:
            shared[target : target + length] = view[at : at + length]
        return [page_checksum(shared[at : at + length]) for at, length in checksummed]


class Windows:
    """What the owner shows every worker of the fetch and ingest handles it serves, so that a
    worker answers their reads alone (``fetch_windows``) and sends their writes in one message
    (``ingest_windows``). Made before the workers are forked; ``serve`` keeps them: ``before``
    a request hides what it may change, ``after`` shows what it left."""

    def __init__(self, workers: int, ram_bytes: int) -> None:
        self.fetch = FetchWindows(workers, ram_bytes)
        self.ingest = IngestWindows(ram_bytes)

    def before(self, requests: Requests, op: str, fh: int) -> None:
        if op in ("write", "release"):
            began = self.fetch.hide(fh)  # a worker answered from the window: the answer began
            if began and op == "write":
                requests.fetch_was_read(fh)  # so this write starts a new request
        if op == "release":
            self.ingest.closed(fh)
        elif op in ("write", "plan", "filled_at"):
            self.ingest.hide(fh)

    def after(self, requests: Requests, op: str, fh: int, offset_of) -> None:
        """Never raises: the request was answered, and a window that cannot be made is none
        (the handle's requests are then forwarded as they come)."""
        try:
            if op in ("read", "write"):  # after a write: the fetch request's first pages
                pinned = requests.fetch_window(fh, self.fetch.ahead_for(fh) if op == "write" else 0)
                if pinned is not None:
                    self.fetch.show(fh, Window.of(*pinned, offset_of))
            if op in ("write", "filled", "filled_at"):
                window = requests.ingest_window(fh, self.ingest.ahead_for(fh), MAX_AHEAD_PAGES)
                if window is not None:
                    self.ingest.show(fh, IngestWindow(*window))
        except Exception:
            log.exception("%s(%d): could not show its window to the workers", op, fh)
            self.fetch.hide(fh)
            self.ingest.hide(fh)


async def serve(requests: Requests, channel: AsyncChannel, worker: int, windows: Windows) -> None:
    """Answer one worker's requests until its channel closes or breaks (its process ended): as
    many at once as it may have in flight, so a slow one holds up none of the others."""
    async with trio.open_nursery() as nursery:
        for _ in range(IN_FLIGHT):
            nursery.start_soon(_answer_calls, requests, channel, worker, windows)


async def _answer_calls(requests: Requests, channel: AsyncChannel, worker: int, windows: Windows) -> None:
    """One of the owner's tasks answering a worker: it reads the worker's next call while it has
    the channel's turn, and answers it at once. Only if the answer has to wait on something (a
    lower tier's page, a large request's turn) does the task let another read meanwhile: handing
    the turn over at every call cost a task switch a call, most of which wait on nothing."""
    offset_of = requests.namespace.store.arena_offset
    try:
        while (call := await channel.next_call()) is not None:
            await _eagerly(_answer(requests, channel, worker, windows, offset_of, call), channel.pass_turn)
    except (trio.BrokenResourceError, OSError):
        pass  # its end went away while we answered: it ended


async def _answer(requests: Requests, channel: AsyncChannel, worker: int, windows: Windows, offset_of,
                  call) -> None:
    number, (op, args, counted) = call
    if counted is not None:
        requests.count(counted, worker)
    try:
        if op in _WINDOWED:
            windows.before(requests, op, args[0])
        if op == "read":
            value = [_wire(piece, offset_of) for piece in await requests.read(*args, windows.fetch.ahead_for(args[0]))]
        elif op == "plan":
            value = await requests.plan(*args)
            if isinstance(value, WritePlan):
                value = value.wire()
        elif op in _PLAIN or op in ("write", "filled", "filled_at", "forget"):
            value = await getattr(requests, op)(*args)
        else:
            raise ValueError(f"a worker asked for {op!r}, which is no request")
        if op in _WINDOWED:
            windows.after(requests, op, args[0], offset_of)
        answer = (0, value)
    except Exception as exc:
        answer = (requests.refused(op, args, exc), None)
    await channel.answer(number, answer)


async def _eagerly(coroutine, waiting: Callable[[], None]):
    """``await coroutine``, calling ``waiting()`` first if it is about to wait (trio has no hook
    for "this task is about to suspend"): its first step runs here, and only the rest, if any,
    through the scheduler."""
    try:
        trap = coroutine.send(None)
    except StopIteration as done:
        return done.value
    waiting()
    return await _resumed(coroutine, trap)


@types.coroutine
def _resumed(coroutine, trap):
    """What ``await coroutine`` does from where it first suspended (``trap``, which trio gets)."""
    while True:
        try:
            sent = yield trap
        except BaseException as exc:  # trio throws into the task (a cancellation): pass it on
            try:
                trap = coroutine.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                trap = coroutine.send(sent)
            except StopIteration as done:
                return done.value


def _wire(piece, offset_of):
    """A piece of a read answer as it crosses: a span of shared memory, or its bytes."""
    offset = offset_of(piece)
    if offset is not None:
        return Span(offset, len(piece))
    return pickle.PickleBuffer(piece) if len(piece) > 4096 else bytes(piece)
