"""The SSD tier's list of records let go of while live: replaced pages' older records whose dead
mark the disk refused (``SsdTier.supersede``), which a scan must take for dead.

Such a record is older than its name's newer copy, and a scan after a crash passes over it only
while it finds that copy: when the copy's region is dropped (its first header damaged, or its
first sector read as zeros), the older record was the name's only one, and served (found by
review). The list keeps them across a crash.

One file in the disk directory, ``hicachefs.doomed``: a header (magic, version, the arena's file
id, the entry count), per entry the record's offset and a sequence number above its own and at
or below that of every record written after it (the one writing handed out next when it was
listed: numbers are never reused, so a later record at the offset is never taken for it), then
an xxh3_64 of everything before. Written whole through ``durable_file.replace_durably``, and only
when a mark fails or an entry leaves (its mark written at last, or its region reclaimed): an
empty list in the normal case, no file I/O on the fast path. A list of another file id (an
arena formatted anew since) names records of no arena here: it is read as empty.

Blocking file I/O; no shared state.
"""

from __future__ import annotations

import struct
from pathlib import Path

import xxhash

from hicachefs.store.durable_file import replace_durably

DOOMED_NAME = "hicachefs.doomed"
_MAGIC = b"HCdoom\0\1"
_VERSION = 1
_HEADER = struct.Struct("<8sI4xQQ")  # magic, version, file id, entries
_ENTRY = struct.Struct("<QQ")  # the record's offset, a sequence number above its own
_CHECK_BYTES = 8


class ListDamaged(Exception):
    """The list cannot be read, or is not one this version wrote whole: which records it named is
    not known."""


def write(directory: Path, file_id: int, entries: dict[int, int]) -> None:
    """Make the list of ``entries`` (offset: sequence number bound) durable; raises OSError."""
    body = _HEADER.pack(_MAGIC, _VERSION, file_id, len(entries))
    body += b"".join(_ENTRY.pack(offset, bound) for offset, bound in sorted(entries.items()))
    replace_durably(directory, DOOMED_NAME, [body, xxhash.xxh3_64_intdigest(body).to_bytes(_CHECK_BYTES, "little")])


def read(directory: Path) -> tuple[int, dict[int, int]]:
    """The arena file id and the entries of the list in ``directory``; (0, {}) when there is none.
    Raises ListDamaged for one that cannot be read, or is truncated or damaged."""
    try:
        data = (directory / DOOMED_NAME).read_bytes()
    except FileNotFoundError:
        return 0, {}
    except OSError as exc:
        raise ListDamaged(f"it cannot be read ({exc.strerror or exc})") from None
    if len(data) < _HEADER.size + _CHECK_BYTES:
        raise ListDamaged("it is truncated")
    magic, version, file_id, count = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise ListDamaged("it is not one this version writes")
    if len(data) != _HEADER.size + count * _ENTRY.size + _CHECK_BYTES:
        raise ListDamaged("it is truncated, or too long")
    if xxhash.xxh3_64_intdigest(data[:-_CHECK_BYTES]) != int.from_bytes(data[-_CHECK_BYTES:], "little"):
        raise ListDamaged("it is damaged (checksum mismatch)")
    entries = dict(_ENTRY.iter_unpack(data[_HEADER.size : -_CHECK_BYTES]))
    return file_id, entries
