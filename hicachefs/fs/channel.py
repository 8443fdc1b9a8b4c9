"""The wire between a worker process and the owner of the store, over a Unix stream socket of
their own: calls from any of the worker's tasks, each answered when it is done, in any order.

A message is a Python value pickled with protocol 5, whose ``PickleBuffer``s (page bytes) travel
out of band, after the pickle, so that neither side copies them into or out of a pickle stream:

    <uint32 pickle length> <uint32 buffer count> <uint64 length of each buffer> <pickle> <buffers>

all little-endian. The receiver gets each buffer back as a memoryview of the message it read. A
call is ``(number, value)`` and its answer ``(number, answer)``.

``Channel`` is the worker's side. A worker has several requests in flight only when one waits
long on the owner (``PATIENCE_S``): until then a call waits for its answer without passing
through the event loop, whose wakeups would cost more than most answers take. ``AsyncChannel``
is the owner's side, one per worker, read by several tasks in turn. Neither is thread-safe; both
run on a trio loop.
"""

from __future__ import annotations

import itertools
import pickle
import select
import socket
import struct
import time

import trio

_HEAD = struct.Struct("<II")
_LENGTH = struct.Struct("<Q")
#: What one receive asks the kernel for at most when the message's size is not known yet: a
#: message of a few hundred bytes (most answers) then costs one system call.
_CHUNK = 64 << 10
#: How long a worker's call waits for its answer with the worker's event loop held (no other
#: request of the worker moves meanwhile). Most answers take well under 1 ms; past this one the
#: worker lets its loop read further requests, so a slow request (a large exists query, a
#: listing storm) does not hold up the ones after it.
PATIENCE_S = 0.002
_MISSING = object()


class ChannelClosed(EOFError):
    """The other side closed its end (its process ended)."""


def encode(value) -> list:
    """The message for ``value``, as the pieces to send one after another."""
    buffers: list[memoryview] = []
    pickled = pickle.dumps(value, protocol=5, buffer_callback=lambda b: buffers.append(b.raw()))
    head = _HEAD.pack(len(pickled), len(buffers)) + b"".join(_LENGTH.pack(b.nbytes) for b in buffers)
    return [head, pickled, *buffers]


class _Framing:
    """What both sides share: sending whole messages while other tasks send too, and reading
    messages from bytes read ahead. How a side waits for bytes to read is its own (``_ready``)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._pending = bytearray()
        self._sending = trio.Lock()

    async def send(self, value) -> None:
        pieces = encode(value)
        if self._sending.locked():  # another task's message is part way out
            await self._sending.acquire()
        else:
            self._sending.acquire_nowait()  # no scheduling: the common case sends at once
        try:
            while pieces:
                try:
                    pieces = _rest(pieces, self.sock.sendmsg(pieces))
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.sock)
        finally:
            self._sending.release()

    async def receive(self):
        """The next message, or None when the other side closed its end."""
        while (frame := self._frame()) is None:
            data = await self._ready(self.sock.recv, _CHUNK)
            if not data:
                return None
            self._pending += data
        length = frame[1]
        if len(self._pending) >= length:
            return self._decode(memoryview(self._take(length)))
        message = bytearray(length)  # a large message goes straight into a buffer of its own
        have = len(self._pending)
        message[:have] = self._pending
        self._pending.clear()
        view = memoryview(message)
        while have < length:
            got = await self._ready(self.sock.recv_into, view[have:])
            if not got:
                return None
            have += got
        return self._decode(view)

    async def _ready(self, call, argument):
        """``call(argument)``, once the socket has something to read."""
        while True:
            try:
                return call(argument)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.sock)

    def close(self) -> None:
        self.sock.close()

    def _frame(self) -> tuple[int, int] | None:
        """(head length, whole message length) once the head is here, else None."""
        if len(self._pending) < _HEAD.size:
            return None
        pickled, count = _HEAD.unpack_from(self._pending)
        head = _HEAD.size + count * _LENGTH.size
        if len(self._pending) < head:
            return None
        sizes = sum(_LENGTH.unpack_from(self._pending, _HEAD.size + i * _LENGTH.size)[0] for i in range(count))
        return head, head + pickled + sizes

    @staticmethod
    def _decode(message: memoryview):
        pickled, count = _HEAD.unpack_from(message)
        at = _HEAD.size + count * _LENGTH.size
        body = message[at : at + pickled]
        at += pickled
        buffers = []
        for i in range(count):
            size = _LENGTH.unpack_from(message, _HEAD.size + i * _LENGTH.size)[0]
            buffers.append(message[at : at + size])
            at += size
        return pickle.loads(body, buffers=buffers)

    def _take(self, length: int) -> bytearray:
        """The next ``length`` bytes read ahead, as a message buffer of their own."""
        message = self._pending[:length]
        del self._pending[:length]
        return message


class Channel(_Framing):
    """The worker's side. See the module docstring. One call at a time reads the socket; an
    answer it reads for another call is left for that call, which it wakes."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self._numbers = itertools.count()
        self._answers: dict[int, object] = {}
        self._waiting: dict[int, trio.Event] = {}
        self._reading = False
        self._calls = 0
        self._patient_until = 0.0
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    @property
    def in_flight(self) -> int:
        """Calls made that have not returned yet."""
        return self._calls

    async def call(self, value):
        """Send ``value``, then wait for its answer and return it."""
        number = next(self._numbers)
        self._calls += 1
        try:
            await self.send((number, value))
            if not self._reading:
                self._patient_until = time.monotonic() + PATIENCE_S
            while (answer := self._answers.pop(number, _MISSING)) is _MISSING:
                if self._reading:
                    self._waiting[number] = event = trio.Event()
                    await event.wait()
                    continue
                self._reading = True
                try:
                    message = await self.receive()
                finally:
                    self._reading = False
                    self._patient_until = 0.0  # a call that takes the reading over waits through trio
                if message is None:
                    raise ChannelClosed("the owner of the store closed the channel")
                theirs, answer = message
                if theirs == number:
                    return answer
                self._answers[theirs] = answer
                if (event := self._waiting.pop(theirs, None)) is not None:
                    event.set()
            return answer
        finally:
            self._calls -= 1
            self._waiting.pop(number, None)
            if not self._reading and self._waiting:  # someone must read for the calls still waiting
                self._waiting.pop(next(iter(self._waiting))).set()

    async def _ready(self, call, argument):
        while True:
            left = self._patient_until - time.monotonic()
            if left > 0 and not self._poll.poll(left * 1000):  # a patient call: wait here first
                left = self._patient_until = 0.0
            try:
                return call(argument)
            except BlockingIOError:
                if left <= 0:
                    self._patient_until = 0.0
                    await trio.lowlevel.wait_readable(self.sock)


class AsyncChannel(_Framing):
    """The owner's side, on its trio loop. See the module docstring. Several tasks answer one
    worker's calls; the one that has the turn reads the next (``next_call``) and keeps the turn
    until it passes it on (``pass_turn``).

    It calls the socket itself and waits through trio only when the socket has nothing to read
    (or no room to write): trio's socket methods pass through its scheduler on every call, which
    cost the owner a few tens of microseconds a message, two messages a page."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self._reader = None  # the task that has the turn
        self._turns = trio.lowlevel.ParkingLot()

    async def next_call(self):
        """(number, value) of the worker's next call, or None once the worker closed its end;
        the calling task has the turn after it (but after None)."""
        me = trio.lowlevel.current_task()
        while self._reader is not None and self._reader is not me:
            await self._turns.park()
        self._reader = me
        try:
            call = await self.receive()
        except BaseException:
            self.pass_turn()
            raise
        if call is None:
            self.pass_turn()  # so that every other task reads the end too
        return call

    def pass_turn(self) -> None:
        """The task that has the turn lets another read the next call."""
        if self._reader is trio.lowlevel.current_task():
            self._reader = None
            self._turns.unpark()

    async def answer(self, number: int, value) -> None:
        await self.send((number, value))


def _rest(pieces: list, sent: int) -> list:
    """What is left of ``pieces`` after ``sent`` bytes went out."""
    for i, piece in enumerate(pieces):
        size = memoryview(piece).nbytes
        if sent < size:
            return [memoryview(piece)[sent:], *pieces[i + 1 :]] if sent else pieces[i:]
        sent -= size
    return []
