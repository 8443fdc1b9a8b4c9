"""``--metrics-listen HOST:PORT``: serve ``/metrics`` over HTTP for Prometheus to scrape.

A small HTTP/1.1 server, bounded whatever its clients do. One thread accepts connections and
reads their requests, all of them on one selector, and a fixed pool of ``SERVERS`` threads
answers the whole requests, one each (``Connection: close``). Each connection has
``CONNECTION_TIMEOUT_S`` from its accept for the whole exchange: a client that sends nothing, or
drips its request, is cut off then without an answer. So 1,000 idle connections cost no thread.

Nor do they keep a scraper out. At most ``READING`` connections are held while their request
comes, ``PER_ADDRESS`` of them from one client address; a new connection past either takes the
place of the one that has waited longest, from its own address, or, when all are held, from the
address that holds the most, which is answered ``503 Service Unavailable`` and closed. A
request that comes at once, as Prometheus's does, is then read before idle or slow clients can
take its place: held that way, 20 idle connections made every scrape answer 503 for 10 s,
whoever made them. At most ``SERVERS + WAITING`` whole requests are held for the server threads;
one more is answered 503 at once.

An answered connection (a 503 too) is shut for writing and waited on by the accept thread,
which drops what the client still sends and closes it once the client has closed, or its time
is up: closed at once, with bytes unread or still coming (a pipelined second request), the
kernel resets it, and the client loses the end of its answer. No thread waits on a client that
never closes: ``LINGERING`` such connections are held, past them one is closed
(``_to_close``).

The daemon's counters (the request and error counters, the namespace's files being written)
belong to the trio thread and are changed between awaits without a lock, so a scrape never
reads them from its own thread: it asks the trio loop to evaluate the statistics
(``trio.from_thread.run_sync``) and waits for the answer, a fresh dict that the scrape thread
then owns and renders as ``.hicachefs/metrics`` does (``metrics.render``). A scrape while the
loop is not running (before it starts, while it shuts down) gets an empty answer. An evaluation
costs the loop time in the tiers and pools, not the pages stored (the store counts them as they
come and go), and its rendering, pure Python, holds the interpreter the loop needs as long
(rendered for every scrape, a scraper in a loop took 73 % of it, and page reads on the mount
went from 0.11 to 1.01 ms). So scrapes back to back would keep the loop from FUSE's requests: a
scrape that comes sooner than ``SPACING`` times the last evaluation's cost, rendering included,
after it is sent that evaluation's rendered bytes. Evaluating and rendering then take at most a
tenth of the interpreter, whatever the clients do; each scrape beyond that costs only its
connection, its request's parsing and the sending of bytes already made.

Thread-safe as described; the constructor binds (may fail with OSError), ``close`` blocks for up
to half a second while the threads notice.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import logging
import queue
import selectors
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable

import trio
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

from .listen_address import bound_socket, parse_listen_address
from .metrics import render

log = logging.getLogger(__name__)

#: Connections answered at once. A scrape costs milliseconds, and one Prometheus server (two in
#: an HA pair) scrapes an endpoint once per interval: four leave room for a person's curl.
SERVERS = 4
#: Whole requests held beyond those being answered, each waiting for a server thread.
WAITING = 16
#: Connections held while their request comes (each a socket and its bytes so far, no thread) ...
READING = 16
#: ... of which from one client address: one address's idle connections take only its own places.
PER_ADDRESS = 4
#: From its accept to the last byte of the answer: Prometheus's default scrape timeout, after
#: which it has given up on the scrape anyway.
CONNECTION_TIMEOUT_S = 10.0
#: Answered connections whose client has not closed yet (each a socket, no thread or buffer):
#: past these, one is closed (``_to_close``).
LINGERING = 64
#: What the accept thread reads and drops from an answered connection before closing it anyway
#: (a pipelined request or two).
LINGER_BYTES = 65536
#: The request line and headers; a scrape sends a few hundred bytes.
MAX_REQUEST_HEAD = 8192
#: Connections the kernel holds for the accept thread, which accepts (or refuses) them at once.
#: Past it the kernel drops a connection's last handshake packet and lets the client retry for
#: seconds, so a burst of a thousand would see some connections accepted late, held, and cut off
#: without an answer instead of refused: 128 did that once in CI.
BACKLOG = 1024
#: A new evaluation of the statistics comes at least this many times its cost (rendering
#: included) after the last (they take at most 1 / (1 + SPACING) of the interpreter) ...
SPACING = 9
#: ... and an answer is shared for at most this long (Prometheus scrapes every 15 s or so).
MAX_SHARED_S = 2.0
_SHORT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class MetricsEndpoint:
    """The HTTP server, its threads, and the bridge from them to the trio loop."""

    def __init__(self, address: str, statistics: Callable[[], dict]):
        """Bind ``address`` and start serving; ``statistics`` is only ever called on the loop."""
        self._statistics = statistics
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._listener = bound_socket(*parse_listen_address(address))
        self._listener.listen(BACKLOG)
        self._closing = False
        self._evaluating = threading.Lock()  # one evaluation at a time; who waits shares it
        self._last: bytes | None = None  # the last evaluation, rendered
        self._fresh_until = 0.0  # time.monotonic() until which ``_last`` is the answer
        self._slots = threading.BoundedSemaphore(SERVERS + WAITING)
        self._incoming = _Incoming(self._listener)
        self._held: queue.SimpleQueue[tuple[socket.socket, bytes, float] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._accept, name="metrics-accept", daemon=True)]
        self._threads += [threading.Thread(target=self._serve, name=f"metrics-{i}", daemon=True) for i in range(SERVERS)]
        for thread in self._threads:
            thread.start()
        log.info("serving metrics at http://%s/metrics", address)

    def attach(self, trio_token: trio.lowlevel.TrioToken) -> None:
        """Call from the trio loop once it runs: scrapes are answered from then on."""
        self._trio_token = trio_token

    def _metrics_text(self) -> bytes:
        """The answer to a scrape: the last evaluation's rendered bytes while they are fresh,
        else a new evaluation on the loop, rendered here once for every scrape that shares it."""
        token = self._trio_token
        if token is None:
            return b""
        with self._evaluating:
            if self._last is not None and time.monotonic() < self._fresh_until:
                return self._last
            try:
                facts, cost = trio.from_thread.run_sync(self._timed_statistics, trio_token=token)
            except trio.RunFinishedError:
                return b""
            started = time.perf_counter()
            self._last = render(facts)
            cost += time.perf_counter() - started
            self._fresh_until = time.monotonic() + min(MAX_SHARED_S, SPACING * cost)
            return self._last

    def _timed_statistics(self) -> tuple[dict, float]:
        """On the loop: the statistics, and the seconds they took."""
        started = time.perf_counter()
        facts = self._statistics()
        return facts, time.perf_counter() - started

    def _accept(self) -> None:
        """Accept connections and read their requests until ``close``; each whole request goes
        to the server threads, or is answered 503 when ``SERVERS + WAITING`` are held."""
        incoming = self._incoming
        try:
            while not self._closing:
                for connection in incoming.wait():
                    if connection is None:
                        self._take(incoming)
                    elif (whole := incoming.read(connection)) is not None:
                        if self._slots.acquire(blocking=False):
                            self._held.put(whole)
                        else:
                            incoming.refuse(connection, whole[2])
        finally:
            incoming.close()
            self._close_unserved()

    def _close_unserved(self) -> None:
        """Close the connections whose request this thread put for the server threads after
        ``close`` had told them to stop (found by review: no thread took them, and their
        clients waited, with neither an answer nor a close, for the process to exit)."""
        stops = 0
        with contextlib.suppress(queue.Empty):
            while True:
                held = self._held.get_nowait()
                if held is None:
                    stops += 1
                else:
                    held[0].close()
                    self._slots.release()
        for _ in range(stops):  # for the server threads that have not taken theirs yet
            self._held.put(None)

    def _take(self, incoming: _Incoming) -> None:
        try:
            connection, address = self._listener.accept()
        except OSError as exc:
            if not self._closing and exc.errno in _SHORT_OF_RESOURCES:
                time.sleep(0.1)  # out of descriptors or memory: let closes catch up, do not spin
            return
        incoming.add(connection, address[0])

    def _serve(self) -> None:
        while (held := self._held.get()) is not None:
            connection, head, until = held
            try:
                self._answer(connection, head, until)
                connection.shutdown(socket.SHUT_WR)  # the client reads to the end of the answer
            except OSError:
                connection.close()  # timed out, reset or gone: the client's loss, nothing to tell
            else:
                self._incoming.linger(connection, until)
            finally:
                self._slots.release()

    def _answer(self, connection: socket.socket, head: bytes, until: float) -> None:
        request = head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(request) != 3:
            response = _response("400 Bad Request", b"not an HTTP request\n")
        elif request[1].split("?", 1)[0] != "/metrics":
            response = _response("404 Not Found", b"only /metrics is served here\n")
        elif request[0] not in ("GET", "HEAD"):
            response = _response("405 Method Not Allowed", b"GET or HEAD /metrics\n", ("Allow: GET, HEAD",))
        else:
            try:
                text = self._metrics_text()
            except Exception:  # a statistic's bug: this scrape fails, the server thread serves on
                log.exception("cannot evaluate the metrics")
                response = _response("500 Internal Server Error", b"the metrics could not be evaluated\n")
            else:
                response = _response("200 OK", text, content_type=CONTENT_TYPE_PLAIN_0_0_4,
                                     head_only=request[0] == "HEAD")
        remaining = until - time.monotonic()
        if remaining > 0:
            connection.settimeout(remaining)  # for the whole sendall (Python 3.5+)
            connection.sendall(response)

    def close(self) -> None:
        self._trio_token = None
        self._closing = True
        self._incoming.wake()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for _ in range(SERVERS):
            self._held.put(None)
        for thread in self._threads:
            thread.join(0.5 / len(self._threads))


class _Incoming:
    """The connections whose request is still coming, oldest first, those answered whose client
    has not closed yet, and the selector that waits for their bytes and for new connections:
    the accept thread's alone, but for ``linger``."""

    def __init__(self, listener: socket.socket) -> None:
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._held: dict[socket.socket, tuple[str, float, bytearray]] = {}  # address, until, bytes so far
        self._by_address: dict[str, int] = {}
        # Answered connections, answered first first: until, bytes dropped, the client's address.
        self._lingering: dict[socket.socket, tuple[float, int, str]] = {}
        self._answered: queue.SimpleQueue[tuple[socket.socket, float]] = queue.SimpleQueue()
        self._handing_over = threading.Lock()  # a hand-over (``linger``) and ``close`` in turn
        self._closed = False
        self._wake, self._waker = socket.socketpair()  # a server thread wakes the selector with a byte
        self._wake.setblocking(False)
        self._waker.setblocking(False)
        self._selector.register(self._wake, selectors.EVENT_READ, self._wake)

    def wait(self) -> list[socket.socket | None]:
        """The connections with a request's bytes to read (None: a new connection to accept),
        once there are any; meanwhile those whose time is up are cut off (without an answer if
        their request has not come), and the answered ones' bytes are dropped."""
        while True:
            now = time.monotonic()
            for connection, (_, until, _) in list(self._held.items()):
                if until > now:
                    break
                self._drop(connection)
            for connection in [c for c, (until, _, _) in self._lingering.items() if until <= now]:
                self._end(connection)
            ready = [key.data for key, _ in self._selector.select(self._timeout(now))]
            woken = self._wake in ready
            for connection in ready:
                if connection is self._wake:
                    self._take_answered()
                elif connection in self._lingering:
                    self._drain(connection)
            ready = [connection for connection in ready if connection is None or connection in self._held]
            if ready or woken:  # (woken: the endpoint may be closing)
                return ready

    def _timeout(self, now: float) -> float | None:
        """Until the first connection's time is up, held or lingering; None: none is held."""
        deadlines = [until for until, _, _ in self._lingering.values()]
        if first := next(iter(self._held.values()), None):
            deadlines.append(first[1])
        return min(deadlines) - now if deadlines else None

    def linger(self, connection: socket.socket, until: float) -> None:
        """From any thread: ``connection``, answered, its write side shut, is closed once its
        client has closed too, or its time (``until``) is up; what the client sends meanwhile
        is read and dropped. Closed at once, with bytes unread or still coming (a pipelined
        request), the kernel would reset it, and the client lose what of the answer it had not
        received. No thread waits on the client: the accept thread's selector does."""
        with self._handing_over:
            if self._closed:  # nobody would take it: the endpoint is closing
                connection.close()
                return
            self._answered.put((connection, until))
        self.wake()

    def wake(self) -> None:
        """From any thread: have ``wait`` return, with what is ready (a connection handed over,
        or the endpoint closing, which a closed listener may not wake it for)."""
        with contextlib.suppress(OSError):  # full: a wake is due anyway; closed: the endpoint is
            self._waker.send(b"\0")

    def _take_answered(self) -> None:
        """Wait on the answered connections handed over, closing one (``_to_close``) when
        ``LINGERING`` are waited on."""
        with contextlib.suppress(OSError):
            self._wake.recv(4096)  # before taking them: a connection handed over later wakes again
        with contextlib.suppress(queue.Empty):
            while True:
                self._wait_on(*self._answered.get_nowait())

    def _wait_on(self, connection: socket.socket, until: float) -> None:
        """Wait on ``connection`` with the others, then close one past ``LINGERING``: chosen
        among all, this one included, or a connection of a flood would close the one answered
        just before it (found by review: a scraper that came during a flood was cut each time)."""
        connection.setblocking(False)
        try:
            address = connection.getpeername()[0]
        except OSError:
            address = ""  # gone already
        self._lingering[connection] = (until, 0, address)
        self._selector.register(connection, selectors.EVENT_READ, connection)
        if len(self._lingering) > LINGERING:
            self._end(self._to_close())

    def _drain(self, connection: socket.socket) -> None:
        """Drop what an answered client sent; close once it has closed, or sent more than
        ``LINGER_BYTES``."""
        until, dropped, address = self._lingering[connection]
        try:
            dropped += len(chunk := connection.recv(LINGER_BYTES))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk or dropped > LINGER_BYTES:
            self._end(connection)
        else:
            self._lingering[connection] = (until, dropped, address)

    def _to_close(self) -> socket.socket:
        """The connection to close to make room: the one answered longest ago whose client has
        acknowledged its whole answer; else the one answered last from the address that holds
        the most. Closed with the end of its answer unsent, the kernel resets it on the client's
        next bytes (a pipelined request) and the rest is lost: 64 clients that kept their
        connections open did that to a large answer, and so did 64 that did not read theirs, the
        scraper answered first being the oldest, also when they came from its own address or
        each from its own (found by review): an answer long on its way outlasts a flood."""
        acknowledged = next((c for c in self._lingering if _acknowledged(c)), None)
        if acknowledged is not None:
            return acknowledged
        held = collections.Counter(address for _, _, address in self._lingering.values())
        most = max(held.values())
        return next(c for c, (_, _, address) in reversed(self._lingering.items()) if held[address] == most)

    def _end(self, connection: socket.socket) -> None:
        self._selector.unregister(connection)
        del self._lingering[connection]
        connection.close()

    def add(self, connection: socket.socket, address: str) -> None:
        """Hold ``connection`` until its request is whole, taking the place of the one held
        longest from its address when that holds ``PER_ADDRESS``, or, when ``READING`` are
        held, of the one held longest from the address that holds the most."""
        if self._by_address.get(address, 0) >= PER_ADDRESS:
            self._let_go(address)
        elif len(self._held) >= READING:
            most = max(self._by_address.values())
            self._let_go(next(held_from for held_from, _, _ in self._held.values()
                              if self._by_address[held_from] == most))
        connection.setblocking(False)
        self._held[connection] = (address, time.monotonic() + CONNECTION_TIMEOUT_S, bytearray())
        self._by_address[address] = self._by_address.get(address, 0) + 1
        self._selector.register(connection, selectors.EVENT_READ, connection)

    def read(self, connection: socket.socket) -> tuple[socket.socket, bytes, float] | None:
        """What came on ``connection``: once its request line and headers are whole, the
        connection, them and its deadline, no longer held here. A client that closes or sends
        more than ``MAX_REQUEST_HEAD`` is dropped without an answer; one let go since it was
        found ready (``add``) is no longer held."""
        if connection not in self._held:
            return None
        _, until, data = self._held[connection]
        try:
            chunk = connection.recv(MAX_REQUEST_HEAD)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        if not chunk or len(data) + len(chunk) > MAX_REQUEST_HEAD:
            self._drop(connection)
            return None
        data += chunk
        if b"\r\n\r\n" not in data and b"\n\n" not in data:
            return None
        self._forget(connection)
        return connection, bytes(data), until

    def _let_go(self, address: str) -> None:
        """Answer 503 to the connection held longest from ``address``, and close it."""
        oldest, until = next((c, until) for c, (held_from, until, _) in self._held.items() if held_from == address)
        self._forget(oldest)
        self.refuse(oldest, until)

    def refuse(self, connection: socket.socket, until: float) -> None:
        """Answer 503 without waiting for the client (it has a socket buffer's room), and
        close as an answered connection is (``linger``)."""
        with contextlib.suppress(OSError):
            connection.send(_BUSY)
            connection.shutdown(socket.SHUT_WR)
        self._wait_on(connection, until)

    def _drop(self, connection: socket.socket) -> None:
        self._forget(connection)
        connection.close()

    def _forget(self, connection: socket.socket) -> None:
        self._selector.unregister(connection)
        address = self._held.pop(connection)[0]
        left = self._by_address[address] - 1
        if left:
            self._by_address[address] = left
        else:
            del self._by_address[address]

    def close(self) -> None:
        for connection in list(self._held):
            self._drop(connection)
        with self._handing_over:  # a server thread that hands one over from now on closes it itself
            self._closed = True
        self._take_answered()
        for connection in list(self._lingering):
            self._end(connection)
        self._selector.close()
        self._wake.close()
        self._waker.close()


def _acknowledged(connection: socket.socket) -> bool:
    """Whether the client has acknowledged all that was sent on the connection, shut for writing
    (SIOCOUTQ: 1 then, its FIN may wait for a delayed ACK); not when that cannot be told."""
    try:
        return struct.unpack("i", fcntl.ioctl(connection.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0] <= 1
    except OSError:
        return False


def _response(status: str, body: bytes, extra: tuple[str, ...] = (), content_type: str = "text/plain; charset=utf-8",
              head_only: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}",
             "Connection: close", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head_only else body)


_BUSY = _response("503 Service Unavailable", b"busy: too many connections to the metrics endpoint\n",
                  (f"Retry-After: {CONNECTION_TIMEOUT_S:.0f}",))
