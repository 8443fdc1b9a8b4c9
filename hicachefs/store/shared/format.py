"""The shared tier's page file: a small header, the page name, then the payload.

One file per page, so that any host that mounts the shared directory can read it alone.
Header (40 bytes, little-endian): magic ``HCsp``, format version, name length, payload size,
payload xxh3_64, publish time (ns), a reserved word, and an xxh32 over the header fields and the
name. The name (UTF-8) follows, then the payload. A host reads a file only when its version is
its own: hosts running the same hicachefs version read each other's pages, and a file written by
another version is neither served nor removed (a rolling upgrade keeps the newer hosts' pages).
Nor is a file without the magic: it is no page file (the directory may hold other data), so
only a file that carries the magic is ever taken for a damaged page, or one shorter than the
magic, which lies where its name hashes to: a page file cut short, never counted otherwise.

Pure functions, thread-safe, no I/O.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import xxhash

from hicachefs.store.pages import PageMeta

MAGIC = b"HCsp"
VERSION = 1
_HEADER = struct.Struct("<4sHHQQqII")  # magic, version, name len, size, checksum, mtime, reserved, check
HEADER_BYTES = _HEADER.size


class Verdict(enum.Enum):
    OK = "ok"
    FOREIGN = "foreign"  # another format version: not ours to read or to remove
    STRANGER = "stranger"  # another magic: not a page file at all, not ours to read or to remove
    CORRUPT = "corrupt"  # a page file's torn or flipped header, or another page's file


class Decoded(NamedTuple):
    verdict: Verdict
    page: PageMeta | None  # set when OK
    payload_offset: int


def _check(fields: bytes, name: bytes) -> int:
    hasher = xxhash.xxh32(fields)
    hasher.update(name)
    return hasher.intdigest()


def encode_name(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def header_length(name: str) -> int:
    """Bytes before the payload in the file of page ``name``."""
    return HEADER_BYTES + len(encode_name(name))


def encode(page: PageMeta) -> bytes:
    """The bytes that precede the payload in ``page``'s file."""
    name = encode_name(page.name)
    fields = _HEADER.pack(MAGIC, VERSION, len(name), page.size, page.checksum, page.mtime_ns, 0, 0)
    check = _check(fields[4 : HEADER_BYTES - 4], name)
    return fields[: HEADER_BYTES - 4] + struct.pack("<I", check) + name


def may_be_page(data: bytes | memoryview) -> bool:
    """Whether ``data``, a file's first bytes, may be a page file's: they start with the magic,
    or are fewer than its bytes (a page file cut short, to be removed as damaged)."""
    return len(data) < len(MAGIC) or bytes(data[: len(MAGIC)]) == MAGIC


def decode(data: bytes | memoryview, expected_name: str) -> Decoded:
    """Check the first bytes of a page file that should hold page ``expected_name``."""
    name = encode_name(expected_name)
    if not may_be_page(data):
        return Decoded(Verdict.STRANGER, None, 0)
    if len(data) < HEADER_BYTES:
        return Decoded(Verdict.CORRUPT, None, 0)
    magic, version, name_len, size, checksum, mtime_ns, _, check = _HEADER.unpack_from(data)
    if version != VERSION:
        return Decoded(Verdict.FOREIGN, None, 0)
    end = HEADER_BYTES + name_len
    if name_len != len(name) or len(data) < end:
        return Decoded(Verdict.CORRUPT, None, 0)
    stored_name = bytes(data[HEADER_BYTES:end])
    if stored_name != name or check != _check(bytes(data[4 : HEADER_BYTES - 4]), stored_name):
        return Decoded(Verdict.CORRUPT, None, 0)
    return Decoded(Verdict.OK, PageMeta(expected_name, size, checksum, mtime_ns), end)
