"""The ``<size> <path>`` line that the ingest header and the fetch request are made of
(docs/contract.md): one parser for both.

Pure functions; thread-safe.
"""

from __future__ import annotations

import errno

from ..posix.errors import FsError

#: A parsed line's memory beyond its bytes: its path's str, its size's int and its tuple, and
#: its start offset (about 230 bytes for a page of SGLang's).
PARSED_LINE_BYTES = 256
#: The most digits a size may have: 2**64 has 20 (no page is larger; ``int`` of a size with
#: more than Python's 4,300 digits raised ValueError, a read's or write's unexpected EIO).
_MOST_DIGITS = 20


def size_and_path(line: bytes, what: str) -> tuple[int, bytes]:
    """A line's page size and path (its bytes); EINVAL naming ``what`` when it is not a line of
    decimal digits, one space and a path of at least one byte, or its size is 0 (a page has at
    least one byte; fetch's ``0 <path>`` read reports are retired)."""
    size_text, _, path = line.partition(b" ")
    if not size_text.isdigit() or not path:
        raise FsError(errno.EINVAL, f"{what} line is not '<size> <path>'")
    if len(size_text) > _MOST_DIGITS:  # no page is that large, and int() refuses 4,300 digits
        raise FsError(errno.EINVAL, f"{what} line's size has more than {_MOST_DIGITS} digits")
    size = int(size_text)
    if size == 0:
        raise FsError(errno.EINVAL, f"{what} line asks for a page of 0 bytes")
    return size, path
