"""The SSD tier's index snapshot: what a clean close knew about the arena, so that the next start
loads it in one read instead of scanning every region.

One file in the disk directory, ``hicachefs.snapshot``: a header (magic, version, the token that
the arena's clean mark must name, the arena's file id and geometry, the region log's write
position and next sequence number, the page count), then the columns as little-endian arrays
(live bytes per region; per page its directory id, 32-byte key, size, checksum, mtime and
record offset), then the directory names and the odd keys as JSON, then an xxh3_64 of
everything before it. It is written under a temporary name, fsynced, renamed into place and
its directory fsynced; only then does the arena get its clean mark (``RegionLog.mark_clean``).

``read`` trusts a snapshot only if it describes the arena exactly: the arena carries a clean
mark naming this very snapshot's token (so not an older or newer one, nor one copied from
elsewhere, and nothing was written since), the file id and geometry match, the checksum holds,
the file has exactly the length its header implies, and its pages' records add up to the live
bytes it claims per region. Anything else raises ``SnapshotInvalid`` and the tier scans.

Blocking file I/O; no shared state (thread-safe as far as the caller's files are).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np
import xxhash

from hicachefs.store.index import PageColumns
from hicachefs.store.durable_file import replace_durably
from hicachefs.store.ssd.region_log import LogState, RegionLog, record_lengths

SNAPSHOT_NAME = "hicachefs.snapshot"
_MAGIC = b"HCsnap\0\1"
_VERSION = 1
# magic, version, token, file id, file bytes, region bytes, regions, current region, tail,
# next sequence number, used bytes, pages, JSON bytes
_HEADER = struct.Struct("<8sI4x16s10Q")
_REGION_LIVE = np.dtype("<i8")
# the per-page columns, in file order: (field of PageColumns, dtype, values per page)
_COLUMNS = (("dir", np.dtype("<i4"), 1), ("keys", np.dtype("<u8"), 4), ("size", np.dtype("<u4"), 1),
            ("checksum", np.dtype("<u8"), 1), ("mtime", np.dtype("<i8"), 1), ("location", np.dtype("<i8"), 1))
_PAGE_BYTES = sum(dtype.itemsize * per_page for _, dtype, per_page in _COLUMNS)
_CHECK_BYTES = 8


class SnapshotInvalid(Exception):
    """The snapshot is missing, unreadable, damaged, or does not describe this arena: scan."""


class Snapshot(NamedTuple):
    log: LogState
    pages: PageColumns


def write(directory: Path, token: bytes, log: RegionLog, pages: PageColumns) -> None:
    """Write the snapshot of ``log`` and ``pages`` durably under ``token``; raises OSError. The
    caller marks the arena clean afterwards."""
    state = log.state()
    text = json.dumps({"directories": pages.directories, "odd_keys": sorted(pages.odd_keys.items())}).encode()
    header = _HEADER.pack(_MAGIC, _VERSION, token, log.file_id, log.file_bytes,
                          log.region_bytes, log.regions, state.current, state.tail, state.next_seq,
                          state.used_bytes, len(pages.size), len(text))
    parts = [header, np.ascontiguousarray(state.region_live, _REGION_LIVE)]
    parts += [np.ascontiguousarray(getattr(pages, field), dtype) for field, dtype, _ in _COLUMNS]
    parts.append(text)
    check = xxhash.xxh3_64()
    for part in parts:
        check.update(part)
    parts.append(check.intdigest().to_bytes(_CHECK_BYTES, "little"))
    replace_durably(directory, SNAPSHOT_NAME, parts)


def read(directory: Path, log: RegionLog) -> Snapshot:
    """The snapshot in ``directory`` if it describes ``log``'s arena exactly (see the module
    docstring); else raises SnapshotInvalid saying why."""
    token = log.clean_token()
    if token is None:
        raise SnapshotInvalid("it was not unmounted cleanly")
    try:
        data = (directory / SNAPSHOT_NAME).read_bytes()
    except FileNotFoundError:
        raise SnapshotInvalid("its index snapshot is missing") from None
    except OSError as exc:
        raise SnapshotInvalid(f"its index snapshot cannot be read: {exc.strerror}") from None
    if len(data) < _HEADER.size + _CHECK_BYTES:
        raise SnapshotInvalid("its index snapshot is truncated")
    (magic, version, snapshot_token, file_id, file_bytes, region_bytes, regions, current, tail, next_seq,
     used_bytes, count, text_bytes) = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise SnapshotInvalid("its index snapshot is not one this version writes")
    expected = _HEADER.size + regions * _REGION_LIVE.itemsize + count * _PAGE_BYTES + text_bytes + _CHECK_BYTES
    if len(data) != expected:
        raise SnapshotInvalid(f"its index snapshot is {'truncated' if len(data) < expected else 'too long'}")
    view = memoryview(data)
    if xxhash.xxh3_64_intdigest(view[:-_CHECK_BYTES]) != int.from_bytes(view[-_CHECK_BYTES:], "little"):
        raise SnapshotInvalid("its index snapshot is damaged (checksum mismatch)")
    if snapshot_token != token:
        raise SnapshotInvalid("its index snapshot is from another unmount or another arena")
    if (file_id, file_bytes, region_bytes, regions) != (log.file_id, log.file_bytes, log.region_bytes, log.regions):
        raise SnapshotInvalid("its index snapshot describes another arena")
    at = _HEADER.size
    region_live = np.frombuffer(view, _REGION_LIVE, regions, at)
    at += region_live.nbytes
    columns = {}
    for field, dtype, per_page in _COLUMNS:
        array = np.frombuffer(view, dtype, count * per_page, at)
        columns[field] = array.reshape(count, 4) if per_page == 4 else array
        at += array.nbytes
    try:
        text = json.loads(bytes(view[at : at + text_bytes]))
        pages = PageColumns(directories=text["directories"], odd_keys=dict(text["odd_keys"]), **columns)
    except (ValueError, KeyError, TypeError):  # the checksum held: this is not our writer's output
        raise SnapshotInvalid("its index snapshot is not one this version writes") from None
    state = LogState(region_live, used_bytes, current, tail, next_seq)
    _check_agrees(log, state, pages)
    return Snapshot(state, pages)


def _check_agrees(log: RegionLog, state: LogState, pages: PageColumns) -> None:
    """The pages' records lie inside regions, and per region add up to its live bytes."""
    count = len(pages.size)
    if count and not (pages.dir.min() >= 0 and pages.dir.max() < len(pages.directories)):
        raise SnapshotInvalid("its index snapshot names directories it does not hold")
    if not (0 <= state.current < log.regions
            and log.region_start(state.current) <= state.tail <= log.region_start(state.current + 1)):
        raise SnapshotInvalid("its index snapshot has a write position outside the arena")
    lengths = record_lengths(pages.name_lengths(), pages.size)
    region = (pages.location - log.region_start(0)) // log.region_bytes
    inside = pages.location - log.region_start(0) - region * log.region_bytes + lengths <= log.region_bytes
    if count and (pages.location.min() < log.region_start(0) or region.max() >= log.regions or not inside.all()):
        raise SnapshotInvalid("its index snapshot has records outside the arena's regions")
    live = np.bincount(region, weights=lengths, minlength=log.regions)
    if not np.array_equal(live, state.region_live) or int(state.region_live.sum()) != state.used_bytes:
        raise SnapshotInvalid("its index snapshot's pages do not add up to its regions' live bytes")
