"""Reading a batch of pages through ``.hicachefs/fetch``: one write names them, one ``preadv``
fills them (docs/contract.md, "Reading many pages in one read").

Why: a page read through its own file costs the daemon an OPEN and a RELEASE (and a LOOKUP when
the kernel has no entry) before any byte moves; here the whole batch costs one WRITE and the
READs its bytes need, at most 1 MiB each. The answer holds the pages back to back, each at the
offset the sizes before it give; a page the daemon cannot serve as asked (missing, another
size) ends the read short at its start, so the pages the read covered whole are the ones read,
and reading on from the next page's offset continues the batch.

Pure functions over a file descriptor the caller owns; thread-safe as long as each thread uses
its own descriptor (one handle holds one request at a time).
"""

from __future__ import annotations

import errno
import os
from typing import List, Sequence

from . import vectored

# The largest request the daemon takes (docs/contract.md, the fetch file): a larger one is refused whole.
MAX_REQUEST = 4 << 20


def fetch_batch(fd: int, paths: Sequence[str], buffers: Sequence[Sequence[memoryview]],
                size: int) -> List[bool]:
    """Read page ``paths[i]`` (``size`` bytes) into ``buffers[i]``; per page, whether it was
    read whole. A page that was not may have left part of its bytes in its buffers. A batch whose
    request would be over ``MAX_REQUEST`` goes as several requests. OSError when the handle fails."""
    lines = [f"{size} {path}\n".encode("utf-8", "surrogateescape") for path in paths]
    read: List[bool] = []
    first = 0
    while first < len(paths):
        last, request_bytes = first, 0
        while last < len(paths) and request_bytes + len(lines[last]) <= MAX_REQUEST:
            request_bytes += len(lines[last])
            last += 1
        if last == first:
            raise OSError(errno.ENAMETOOLONG, "a fetch request line is longer than a whole request")
        _write_all(fd, b"".join(lines[first:last]))
        read += _read_answer(fd, buffers[first:last], size)
        first = last
    return read


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_answer(fd: int, buffers: Sequence[Sequence[memoryview]], size: int) -> List[bool]:
    """Read one request's answer into its pages' buffers, in preadvs of at most ``MAX_BUFFERS``
    buffers and ``MAX_IO_BYTES`` bytes."""
    read = [False] * len(buffers)
    first = 0
    while first < len(buffers):
        last, count = first, 0
        while last < len(buffers) and ((count + len(buffers[last]) <= vectored.MAX_BUFFERS
                                        and (last + 1 - first) * size <= vectored.MAX_IO_BYTES) or last == first):
            count += len(buffers[last])
            last += 1
        done = os.preadv(fd, [b for page in buffers[first:last] for b in page], first * size)
        whole = done // size
        read[first:first + whole] = [True] * whole
        first += whole if first + whole == last else whole + 1  # skip the page that stopped it
    return read
