"""The wire between a worker process and the owner of the store: one message at a time each way,
over a Unix stream socket of their own.

A message is a Python value pickled with protocol 5, whose ``PickleBuffer``s (page bytes) travel
out of band, after the pickle, so that neither side copies them into or out of a pickle stream:

    <uint32 pickle length> <uint32 buffer count> <uint64 length of each buffer> <pickle> <buffers>

all little-endian. The receiver gets each buffer back as a memoryview of the message it read.

``Channel`` is the worker's side: blocking calls, one request and its answer at a time (a worker
serves one FUSE request at a time, so blocking there costs nothing and saves the event loop's
wakeups). ``AsyncChannel`` is the owner's side, one per worker, on the owner's trio loop. Neither
is thread-safe.
"""

from __future__ import annotations

import pickle
import socket
import struct

import trio

_HEAD = struct.Struct("<II")
_LENGTH = struct.Struct("<Q")
#: What one receive asks the kernel for at most when the message's size is not known yet: a
#: message of a few hundred bytes (most answers) then costs one system call.
_CHUNK = 64 << 10


class ChannelClosed(EOFError):
    """The other side closed its end (its process ended)."""


def encode(value) -> list:
    """The message for ``value``, as the pieces to send one after another."""
    buffers: list[memoryview] = []
    pickled = pickle.dumps(value, protocol=5, buffer_callback=lambda b: buffers.append(b.raw()))
    head = _HEAD.pack(len(pickled), len(buffers)) + b"".join(_LENGTH.pack(b.nbytes) for b in buffers)
    return [head, pickled, *buffers]


class _Framing:
    """What both sides share: a buffer of bytes read ahead, and the decoding of a message."""

    def __init__(self) -> None:
        self._pending = bytearray()

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

    def _decode(self, message: memoryview):
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
    """The worker's blocking side. See the module docstring."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        sock.setblocking(True)
        self.sock = sock

    def call(self, value):
        """Send ``value``, then wait for the answer and return it."""
        self.send(value)
        return self.receive()

    def send(self, value) -> None:
        pieces = encode(value)
        while pieces:
            sent = self.sock.sendmsg(pieces)
            pieces = _rest(pieces, sent)

    def receive(self):
        while (frame := self._frame()) is None:
            self._read(_CHUNK)
        length = frame[1]
        if len(self._pending) >= length:
            return self._decode(memoryview(self._take(length)))
        message = bytearray(length)  # a large message goes straight into a buffer of its own
        have = len(self._pending)
        message[:have] = self._pending
        self._pending.clear()
        view = memoryview(message)
        while have < length:
            got = self.sock.recv_into(view[have:])
            if not got:
                raise ChannelClosed("the owner of the store closed the channel")
            have += got
        return self._decode(view)

    def _read(self, size: int) -> None:
        data = self.sock.recv(size)
        if not data:
            raise ChannelClosed("the owner of the store closed the channel")
        self._pending += data


class AsyncChannel(_Framing):
    """The owner's side, on its trio loop. See the module docstring.

    It calls the socket itself and waits through trio only when the socket has nothing to read
    (or no room to write): trio's socket methods pass through its scheduler on every call, which
    cost the owner a few tens of microseconds a message, two messages a page."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        sock.setblocking(False)
        self.sock = sock

    async def receive(self):
        """The next message, or None when the worker closed its end (its process ended)."""
        while (frame := self._frame()) is None:
            data = await self._ready(self.sock.recv, _CHUNK)
            if not data:
                return None
            self._pending += data
        length = frame[1]
        if len(self._pending) >= length:
            return self._decode(memoryview(self._take(length)))
        message = bytearray(length)
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

    async def send(self, value) -> None:
        pieces = encode(value)
        while pieces:
            try:
                sent = self.sock.sendmsg(pieces)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)
                continue
            pieces = _rest(pieces, sent)

    async def _ready(self, call, argument):
        """``call(argument)``, once the socket has something to read."""
        while True:
            try:
                return call(argument)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.sock)

    def close(self) -> None:
        self.sock.close()


def _rest(pieces: list, sent: int) -> list:
    """What is left of ``pieces`` after ``sent`` bytes went out."""
    for i, piece in enumerate(pieces):
        size = memoryview(piece).nbytes
        if sent < size:
            return [memoryview(piece)[sent:], *pieces[i + 1 :]] if sent else pieces[i:]
        sent -= size
    return []
