"""``.hicachefs/exists``: one client's batch existence query a handle (docs/contract.md, "Batch
existence query"): writes append to the request, the next read answers it.

The answer is worked out in steps (``answer_step``) so that a large request delays nobody
else's (``request_limits``). No pyfuse3 here; not thread-safe (trio thread only).
"""

from __future__ import annotations

import errno

from .. import names
from ..store import PageStore
from ..posix.errors import FsError
from .request_limits import Account

#: The largest exists request one handle accepts. SGLang asks about 128 pages at a time for
#: each of its pools (some 70 KB); this holds a whole long prompt asked in one request: 8,192
#: pages (half a million tokens at 64 a page) for 4 pools, at 256 bytes a path.
MAX_EXISTS_REQUEST = 8 << 20
#: Request lines answered in one step: about 1.3 ms of the daemon's time (2,048 took 2.6 ms on
#: the development VM), the longest a small request waits behind a large one (``StepLane``).
LINES_PER_STEP = 1024
_STEP_BYTES = LINES_PER_STEP * 512
#: The longest line that can name a page: five components of at most 200 bytes, four '/'.
_LONGEST_PATH = 5 * names.MAX_NAME_BYTES + 4
_DIGITS = bytes.maketrans(b"\x00\x01", b"01")
#: A request line ``.size N`` names no page (no page path starts with '.'; it is answered '0'):
#: the lines after it, up to the next such line, count a page only of N bytes (0: of any size).
#: So a client that reads pages of one size learns that a page of another size is not one.
SIZE_LINE = b".size "
#: Digits of the longest size a page may have (a page size fits in 32 bits); a ``.size`` line
#: of a larger one counts no page.
_SIZE_DIGITS = 10
_NO_PAGE_SIZE = 1 << 32


class ExistsHandle:
    """One client's exists query: writes append to the request, the next read answers it.

    The answer is worked out in steps of at most ``LINES_PER_STEP`` lines (``answer_step``): a
    request of one step is answered at once, a larger one's steps take turns with other large
    requests' (``request_limits``), so small requests go first. The handle holds its request
    and, at most, an answer byte per line of it, then the answer alone, against its user's
    share. A write that would make the request larger than ``MAX_EXISTS_REQUEST`` fails with
    EFBIG, one over the user's share with ENOBUFS, and so does the write that makes a request
    large (more than a step) when its user has as many large requests as its share allows;
    either fails the request: later writes fail too, and so does the read that follows, after
    which the handle takes a new request.

    Offsets are ignored on purpose: the protocol is a stream, so ``write``/``read`` and
    ``pwrite``/``pread`` at any offset behave the same.
    """

    cacheable = False

    def __init__(self, store: PageStore, account: Account):
        self.store = store
        self.account = account
        self._begun = 0
        self._new_request()

    def _new_request(self) -> None:
        self._begun += 1  # which request this is: a read waiting for its turn sees it change
        self._request = bytearray()
        self._lines = 0  # newlines in the request
        self._scanned = 0  # request bytes answered so far
        self._answer: bytearray | None = None  # set once answering began
        self._complete = False
        self._read = 0  # answer bytes read
        self._failure: FsError | None = None
        self._size: int | None = None  # the size of the last ``.size`` line, if any
        self.account.hold(0)

    async def write(self, offset: int, data: bytes) -> int:
        if self._failure is not None:
            raise FsError(self._failure.errno, f"{self._failure.strerror}; read to end the request")
        if self._answer is not None:  # a write after a read starts a new request
            self._new_request()
        size, lines = len(self._request) + len(data), self._lines + data.count(b"\n")
        try:
            if size > MAX_EXISTS_REQUEST:
                raise FsError(errno.EFBIG, f"exists request over {MAX_EXISTS_REQUEST} bytes")
            # the request, and its answer at the most
            self.account.hold(size + lines + 1, large=size > _STEP_BYTES or lines >= LINES_PER_STEP)
        except FsError as exc:
            self._new_request()
            # A copy: the raised error's traceback holds the write's data (a MiB) for as long as
            # the handle is kept, and 100 handles refused that way held 90 MiB.
            self._failure = FsError(exc.errno, exc.strerror)
            raise
        self._request += data
        self._lines = lines
        return len(data)

    def answer_step(self) -> bool:
        """Answer up to ``LINES_PER_STEP`` more lines; True while more steps remain."""
        if self._failure is not None or self._complete:
            return False
        if self._answer is None:
            self._answer = bytearray()
        request, start = self._request, self._scanned
        window = bytes(memoryview(request)[start : start + self._window_bytes()])
        lines = window.split(b"\n", LINES_PER_STEP)
        if start + len(window) == len(request) and len(lines) <= LINES_PER_STEP:
            if lines[-1] == b"":  # the request's last newline ends its last line
                lines.pop()
            self._scanned = len(request)
        elif len(lines) == 1:  # a line longer than a step's bytes: it names no page
            end = request.find(b"\n", start + len(window))
            lines = [b""]
            self._scanned = len(request) if end < 0 else end + 1
        else:
            self._scanned = start + len(window) - len(lines.pop())  # the rest: next step
        self._answer += self._found(lines)
        if self._scanned >= len(request):
            self._answer += b"\n"
            self._complete = True
            self._request = bytearray()  # the answer is all this request still needs
            self.account.hold(len(self._answer))
        return not self._complete

    def _window_bytes(self) -> int:
        """The request bytes a step looks at: about what ``LINES_PER_STEP`` of its lines take
        (its mean line, with room), at most ``_STEP_BYTES``. A step that finds fewer lines in
        them answers fewer; one of short lines no longer copies half a MiB to answer a few KiB
        (8 MiB of empty lines took 8,192 such copies)."""
        mean = len(self._request) / max(1, self._lines)
        return min(_STEP_BYTES, int(mean * LINES_PER_STEP * 1.5) + _LONGEST_PATH + 1)

    async def read(self, offset: int, size: int) -> bytes:
        """The answer: a small request's at once, a large one's a step at a time in the lane."""
        if self._failure is not None:
            failure = self._failure
            self._new_request()
            raise FsError(failure.errno, f"the exists request failed: {failure.strerror}")
        if not self.account.large:  # at most one step's lines and bytes
            self.answer_step()
        if not self._complete:
            begun = self._begun
            await self.account.in_steps(lambda: self._begun == begun and self.answer_step())
            if self._begun != begun:  # another thread's write on this handle ended the request meanwhile
                raise FsError(errno.EINVAL, "the exists request was ended by another write on its handle "
                                            "during this read")
        chunk = bytes(self._answer[self._read : self._read + size])
        self._read += len(chunk)
        return chunk

    def release(self) -> None:
        self._new_request()

    def _found(self, lines: list[bytes]) -> bytes:
        """'1' or '0' per line. No name checks are needed: the store holds only valid page
        names, so a line is '1' exactly when it decodes to one of them (of the size of the
        ``.size`` line before it, if any); lines that cannot be a page path (not five
        components, too long, not UTF-8) are not looked up at all."""
        runs: list[tuple[int | None, list[str], list[int]]] = [(self._size, [], [])]  # per size: names, lines
        for i, line in enumerate(lines):
            if line.startswith(SIZE_LINE):
                self._size = _size_of(line, self._size)
                runs.append((self._size, [], []))
            elif line.count(b"/") == 4 and len(line) <= _LONGEST_PATH:
                try:
                    runs[-1][1].append(line.decode("utf-8"))
                except UnicodeDecodeError:
                    continue
                runs[-1][2].append(i)
        found = bytearray(len(lines))
        for size, candidates, where in runs:
            if candidates:
                for i, hit in zip(where, self.store.exists_many(candidates, size)):
                    found[i] = hit
        return found.translate(_DIGITS)


def _size_of(line: bytes, before: int | None) -> int | None:
    """The size a ``.size`` line gives (None for 0: any size); ``before`` for a line that is no
    such line (it changes nothing)."""
    digits = line[len(SIZE_LINE):]
    if not digits.isdigit():
        return before
    digits = digits.lstrip(b"0")
    return _NO_PAGE_SIZE if len(digits) > _SIZE_DIGITS else int(digits or b"0") or None
