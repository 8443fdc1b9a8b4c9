"""The SSD tier's on-disk format: a preallocated file of equal regions, written append-only
as a ring, of self-describing records (CacheLib Navy's block cache, simplified).

File layout: a 4 KiB superblock block, then ``regions`` regions of ``region_bytes``. The
superblock (magic, version, file size, region size, a random file id, an xxh3_64 of those) is
kept twice, at byte 0 and in the block's last sector (byte 3584); at byte 512 lies the clean
mark, at byte 1024 the sequence number limit, at byte 1536 the mark of a failed fsync (the next
start formats the arena anew): each field set in a sector of its own, so that
writing one cannot tear another. A start takes the first copy whose checksum holds and writes
it over a damaged one, so bits flipped in one copy, or a write of either torn, lose nothing (a
block that cannot be read is refused: both copies lie in it, the page cache reading it whole);
with both copies damaged the arena is formatted anew (its pages dropped, never served wrong: a
bit flipped in the file id would make every record foreign). An arena of version 1 (one copy, no checksum) is read
as it stands, its pages kept, and given the checksum and the second copy. A record is a
56-byte header, the page name (UTF-8), the payload; records start 64-byte aligned. The header
holds a magic (live, or dead: the live one with every bit flipped, or ``HCd1`` as written
before), the file id, a global sequence number, the payload length and
xxh3_64, the publish time, and an xxh32 over the header fields and the name (not the magic, so
that a delete can flip the magic in place and the region stays walkable). Opening takes an
empty file or one with the magic at the start of either copy of the superblock, or of both
with 2 bits flipped at most each, one holding a superblock's other fields (reinitialised if its
size or version differs, if neither copy holds, or if its regions are too small for the largest
record), and refuses any other, unchanged (``check_ours``): the magic is what says the bytes
are ours to drop.

Recovery needs no other database: regions are sorted by the sequence number of their first
record and walked; a region's walk ends where no record follows: at a header that does not
check, or whose file id differs (left over from an earlier file of another size), or whose
sequence number is not larger than the one before (left over from the region's previous use),
when no record of this file that checks lies further on in the region numbered above the last
one walked (looked for at the records' alignment, in one pass of numpy over the region). One
that does lies past damage: the walk goes on there, each span skipped counted as a corrupt
page, the bytes logged once for the region. So a torn last record, after which nothing newer
lies, ends the walk quietly, and a damaged one loses its page alone. A region whose first
header is damaged is dropped, counted and logged: the records after it cannot be told from
those of its previous use (which the erased first header keeps any scan from walking), as no
other region's numbers bound them once the ring has passed over a region; but for the record a
crash cut short, the first of a region, which is quiet as a torn last record is. A region
whose first sector reads as zeros (a reclaim erases the header alone) that writing may have
reached and that holds records of this file is such damage too (``_zeroed``). Live records
whose payload checks are reported; the others are counted as corrupt. The walk's rule needs every new record numbered
above every record in the file, also those no scan could walk (a region dropped so): writing
keeps a limit above the numbers it hands out in the superblock, raised durably a million at a
time, and a scan numbers new records from there.

The clean mark says that the arena has not changed since the last clean close, and names the
index snapshot that close wrote (a random token, see ``snapshot.py``): a start may then load
that snapshot instead of scanning. The mark is erased, durably, before the first write after
it (``append`` and ``invalidate`` do it themselves), so after a crash, or once anything was
written, no snapshot matches and the start scans. A session that only reads leaves it in place.

Writing appends to the current region; when it is full the next region in the ring (always
the oldest) is reclaimed: its records are handed to a callback so the index can drop them,
then it is overwritten from its start. One whose first header cannot be written (a bad block)
is passed over, its records kept, for the one after, and tried again a round later. A fence
(``fence``, for a clean close's write-down) stops the ring short of the region written when it
was set: what is written after it never takes the place of what was written first.

Blocking: every method does I/O on the tier's ``FileDevice`` (buffered: pwrite lands in the
page cache and survives a process kill; ``sync`` makes it survive a power loss), and raises
``OSError`` when the device fails; a failed append leaves the write position where it was, so
the next append overwrites whatever part was written. Not thread-safe for writers: the store
serialises append/invalidate. ``read_into`` may run concurrently with them; it checks
everything it reads, so a race with a reclaim shows as a mismatch, never as foreign bytes.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import xxhash

from hicachefs.store.ssd.device import ArenaRefused, FileDevice
from hicachefs.store.errors import StoreError
from hicachefs.store.pages import page_checksum
from hicachefs.store.tier import ReadResult

log = logging.getLogger(__name__)

_SUPER = struct.Struct("<8sIIQQQQ")  # magic, version, reserved, file bytes, region bytes, file id, xxh3_64 of them
_SUPER_MAGIC = b"HICACHE\x01"
_SUPER_BYTES = 4096
#: Version 3 is version 2's format, written by the code that keeps the list of dead records
#: (``hicachefs.doomed``) and the mark of a failed fsync: a hicachefs that knows neither reads
#: version 2 as its own and would serve what they kill, and formats version 3 anew (found by review).
_VERSION = 3
_BEFORE_THE_LIST = 2  # read as this version, and its superblock written again as this version's
_UNCHECKED = struct.Struct("<8sIIQQQ")  # version 1's: the same fields, no checksum, one copy
_UNCHECKED_VERSION = 1
_OURS = (_UNCHECKED_VERSION, _BEFORE_THE_LIST, _VERSION)
_COPY_AT = _SUPER_BYTES - 512  # the superblock's second copy: the block's last sector
_CLEAN = struct.Struct("<8s16sQ")  # magic, snapshot token, xxh3_64 of the two
_CLEAN_MAGIC = b"HCclean1"
_CLEAN_AT = 512  # a sector of its own: written alone, it cannot tear the superblock's fields
_LIMIT = struct.Struct("<8sQQ")  # magic, sequence number limit, xxh3_64 of the two
_LIMIT_MAGIC = b"HCseqlim"
_LIMIT_AT = 1024  # a sector of its own too
#: Written at the first failed fsync of the arena (``_fsync``): the next start formats it anew.
_DISTRUST_MAGIC = b"HCfsyncX"
_DISTRUST_AT = 1536  # a sector of its own, cleared by a format
#: How far past the next sequence number the limit is raised, each time writing reaches it.
_LIMIT_STEP = 1 << 20

HEADER = struct.Struct("<4sHHQQQQqI4x")  # magic, name len, reserved, file id, seq, size, checksum, mtime, hcheck
LIVE = b"HCr1"
#: A removed record's magic: the live one with every bit flipped, so that no few bits flipped in
#: it (a bad sector, a torn write) make it live again: ``HCd1``, written before, is 3 bits from
#: ``LIVE`` (found by review: a removed page came back). Read as dead still: an arena written
#: before holds it.
DEAD = bytes(byte ^ 0xFF for byte in LIVE)
_OLD_DEAD = b"HCd1"
_MAGICS = (LIVE, DEAD, _OLD_DEAD)
_MAGIC_WORDS = np.array([int.from_bytes(magic, "little") for magic in _MAGICS], np.uint32)
_ALIGN = 64
_SECTOR = 512
#: Candidate records the scan looks at in one step past a damaged header (``_next_record``).
_CANDIDATES = 256


def record_length(name_len: int, size: int) -> int:
    """Bytes a record takes in its region, padding included."""
    return (HEADER.size + name_len + size + _ALIGN - 1) & ~(_ALIGN - 1)


def payload_offset(location, name_len):
    """Where the payload of the record at ``location`` begins (its name is ``name_len`` bytes);
    elementwise on numpy arrays too."""
    return location + HEADER.size + name_len


def record_lengths(name_lens: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``record_length`` over arrays (int64)."""
    return (HEADER.size + name_lens.astype(np.int64) + sizes.astype(np.int64) + _ALIGN - 1) & ~(_ALIGN - 1)


def _header_check(header: bytes | bytearray | memoryview, name: bytes | memoryview) -> int:
    h = xxhash.xxh32(header[4 : HEADER.size - 8])
    h.update(name)
    return h.intdigest()


def check_ours(device: FileDevice) -> bytes:
    """The file's first 4 KiB; raise ArenaRefused unless ``device``'s file is empty or holds our
    superblock's magic (of any version or size: ours to reinitialise). Changes nothing. Both
    copies of the superblock lie in that block, which the page cache reads whole: when it
    cannot be read (a bad sector), no copy serves, and the refusal says what to do."""
    size = device.size()
    try:
        head = device.pread(_SUPER_BYTES, 0)
    except OSError as exc:
        raise ArenaRefused(f"{device.path}: its first 4 KiB, which hold the superblock, cannot be read "
                           f"({exc.strerror or exc}): remove it to start with an empty disk tier") from None
    if size == 0 or _has_our_magic(head):
        return head
    if head.strip(b"\0"):
        found = f"it starts with {head[:len(_SUPER_MAGIC)].hex(' ')}"
    else:
        found = "its first 4 KiB are zeros" if len(head) == _SUPER_BYTES else "it holds only zeros"
    raise ArenaRefused(f"{device.path} is not a hicachefs disk arena (a file of {size:,} bytes; {found}): "
                       "refusing to overwrite it")


def _has_our_magic(head: bytes) -> bool:
    """Whether a copy of the superblock in the file's first 4 KiB starts with our magic, or both
    start with it but for 2 bits each at most and one of them holds a superblock's other fields
    (``_superblock_like``): with both copies damaged, one flip in the first copy's magic must
    not make our arena foreign (refused, the daemon not starting until someone removes it).
    Near magics alone are not enough: text starting ``HICACHE `` is 2 bits from it, at both
    places in a file of fixed-width lines."""
    apart = [_bits_apart(head[at : at + len(_SUPER_MAGIC)], _SUPER_MAGIC) for at in (0, _COPY_AT)]
    if min(apart) == 0 or (max(apart) <= 2 and any(_superblock_like(head, at) for at in (0, _COPY_AT))):
        return True
    # A version 1 arena has one copy: a flip in its magic must not make it foreign either.
    return apart[0] <= 2 and _superblock_like(head, 0) and not head[_COPY_AT:].strip(b"\0")


def _superblock_like(head: bytes, at: int) -> bool:
    """Whether the copy at ``at`` holds a superblock's fields past its magic, as no text does: a
    version of ours, the reserved word zero, a region size of whole 4 KiB blocks."""
    if len(head) < at + _UNCHECKED.size:
        return False
    _, version, reserved, _, region_bytes, _ = _UNCHECKED.unpack_from(head, at)
    return version in _OURS and reserved == 0 and region_bytes and not region_bytes % 4096


def _version_1_at_head(head: bytes) -> bool:
    """Whether the file's first sector is a version 1 superblock (its magic exact)."""
    return head.startswith(_SUPER_MAGIC) and len(head) >= _UNCHECKED.size and \
        _UNCHECKED.unpack_from(head)[1] == _UNCHECKED_VERSION


def _bits_apart(a: bytes, b: bytes) -> int:
    if len(a) != len(b):
        return 8 * len(b)
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).bit_count()


class Superblock(NamedTuple):
    version: int
    file_bytes: int
    region_bytes: int
    file_id: int


def _packed_superblock(file_bytes: int, region_bytes: int, file_id: int) -> bytes:
    raw = bytearray(_SUPER.pack(_SUPER_MAGIC, _VERSION, 0, file_bytes, region_bytes, file_id, 0))
    _SUPER.pack_into(raw, 0, _SUPER_MAGIC, _VERSION, 0, file_bytes, region_bytes, file_id,
                     xxhash.xxh3_64_intdigest(raw[:-8]))
    return bytes(raw)


def _checked_copy(head: bytes, at: int) -> Superblock | None:
    """The copy of the superblock at ``at`` in the file's first 4 KiB, if its checksum holds."""
    raw = head[at : at + _SUPER.size]
    if len(raw) != _SUPER.size:
        return None
    magic, version, _, file_bytes, region_bytes, file_id, check = _SUPER.unpack(raw)
    if magic != _SUPER_MAGIC or check != xxhash.xxh3_64_intdigest(raw[:-8]):
        return None
    return Superblock(version, file_bytes, region_bytes, file_id)


def _read_superblock(head: bytes) -> tuple[Superblock | None, list[int]]:
    """The superblock in the file's first 4 KiB, and where the copies lie that do not hold it
    (to write again, the second copy first): the first copy whose checksum holds; that of a
    version 1 arena as it stands (its one copy has no checksum), whatever the block's last
    sector holds: version 1 never wrote it, and the upgrade's write there may be torn (the
    caller checks its sizes); None when neither holds (both damaged, or no arena yet)."""
    copies = [(at, _checked_copy(head, at)) for at in (0, _COPY_AT)]
    found = next((copy for _, copy in copies if copy is not None), None)
    if found is not None:
        return found, [at for at, copy in reversed(copies) if copy is None]
    if _version_1_at_head(head):
        _, version, _, file_bytes, region_bytes, file_id = _UNCHECKED.unpack_from(head)
        return Superblock(version, file_bytes, region_bytes, file_id), [_COPY_AT, 0]
    return None, []


class LogState(NamedTuple):
    """Where writing stands: what a scan works out, and what a snapshot saves instead."""

    region_live: np.ndarray  # int64 per region: bytes of live records
    used_bytes: int
    current: int  # the region being written
    tail: int  # file offset where the next record goes
    next_seq: int


class Record(NamedTuple):
    offset: int
    seq: int
    name: str
    size: int
    checksum: int
    mtime_ns: int


class RegionLog:
    """One arena file on a device: format or reopen it, scan it, append to it, invalidate and
    read records. The device is the caller's, and closed by ``close``. ``largest_record``: the
    bytes of the largest record it must take (``record_length``): an arena whose regions are
    smaller is formatted anew, and so is any arena when ``anew`` says why (its pages dropped)."""

    def __init__(self, device: FileDevice, file_bytes: int, region_bytes: int, largest_record: int,
                 anew: str | None = None) -> None:
        if file_bytes < _SUPER_BYTES + region_bytes:
            raise StoreError(f"disk tier of {file_bytes} bytes is too small for one {region_bytes}-byte region")
        self.device = device
        self.path = device.path
        self.file_bytes = file_bytes
        self.formatted: str | None = None  # why this open made a new arena, if it did
        self._clean_token: bytes | None = None
        self._seq_limit = 0  # every record in the file has a lower sequence number (0: unknown)
        self.fsync_failed = False  # an fsync of the arena failed (``_fsync``)
        self._open_or_format(file_bytes, region_bytes, largest_record, anew)
        self.regions = (file_bytes - _SUPER_BYTES) // self.region_bytes
        self.capacity = self.regions * self.region_bytes
        self.region_live = [0] * self.regions  # live record bytes per region
        self.used_bytes = 0
        self.next_seq = 1
        self.current = 0
        self.tail = _SUPER_BYTES  # file offset where the next record goes
        self.passed_over = 0  # regions passed over so far, their first header not erased
        self._fence: int | None = None  # the region writing must not come back to (``fence``)

    def _open_or_format(self, file_bytes: int, region_bytes: int, largest_record: int, anew: str | None) -> None:
        """Reuse a matching arena; reinitialise an empty file or one of ours of another size or
        version, whose regions cannot hold ``largest_record`` (made for a smaller page size: such
        pages would never go down, found by review), or whose superblock is damaged in both
        copies, or that the caller cannot trust (``anew``) (its pages are cache, dropping them
        is safe); refuse any other file, unchanged."""
        head = check_ours(self.device)  # read once: a second read of a flaky sector could fail
        if anew is None and head[_DISTRUST_AT : _DISTRUST_AT + len(_DISTRUST_MAGIC)] == _DISTRUST_MAGIC:
            anew = ("an fsync of it failed while it was last in use: which of its writes reached the disk is "
                    "not known, and it could serve pages older than those written; what it held is dropped")
        found, damaged = _read_superblock(head)
        dropped = None  # why an arena of ours that held pages is formatted anew
        if found is not None and anew is None:
            version, old_bytes, old_region, file_id = found
            # (a region size that no start writes: a version 1 superblock damaged, and the regions with it)
            sane = old_region >= 4096 and old_region % 4096 == 0 and _SUPER_BYTES + old_region <= file_bytes
            ours = version in _OURS
            holds = old_region >= largest_record
            if ours and old_bytes == file_bytes and self.device.size() == file_bytes and sane and holds:
                self.region_bytes, self.file_id = old_region, file_id
                self._clean_token = self._read_clean_mark()
                self._seq_limit = self._read_seq_limit()
                if version != _VERSION:  # both copies become this version's, before anything is listed
                    self._mark_for_this_code()
                    return
                self._write_superblock_over(damaged, head)
                return
            if ours and not sane:
                dropped = (f"its superblock is damaged (a region size of {old_region:,} bytes): "
                           "what it held is dropped")
            elif not ours:
                dropped = f"the arena was written by another version of hicachefs ({version}): its pages are dropped"
            elif old_bytes != file_bytes:
                dropped = (f"the arena was made with --disk-size {old_bytes:,} bytes, not {file_bytes:,}: "
                       "its pages are dropped")
            elif not holds:
                dropped = (f"its regions of {old_region:,} bytes were made for smaller pages and cannot hold "
                           f"one of --max-page-size (a record of {largest_record:,} bytes): its pages are dropped")
            else:
                dropped = (f"the arena's file is {self.device.size():,} bytes, not the {file_bytes:,} its "
                       "superblock says (a start that died while making it, or a change by hand): what it "
                       "held is dropped")
        elif _has_our_magic(head):
            dropped = anew or "its superblock is damaged (no copy of it holds): what it held is dropped"
        # A new file id makes records of any earlier file invalid without wiping it. The
        # superblock is written before the file is sized, so that a start that dies meanwhile
        # leaves a file that the next start knows for ours (and reinitialises, its size being off).
        self.region_bytes, self.file_id = region_bytes, int.from_bytes(os.urandom(8), "little")
        block = bytearray(_SUPER_BYTES)  # no clean mark of an earlier file
        superblock = _packed_superblock(file_bytes, region_bytes, self.file_id)
        for at in (0, _COPY_AT):
            block[at : at + len(superblock)] = superblock
        self.device.pwrite(block, 0)
        self._fsync()
        try:
            self.device.allocate(file_bytes)
        except OSError as e:
            raise StoreError(f"cannot preallocate {file_bytes} bytes for {self.path}: {e}") from e
        self._fsync()
        self.formatted = dropped or "the arena is new"
        if dropped:
            log.warning("%s formatted anew: %s", self.path, dropped)

    def _mark_for_this_code(self) -> None:
        """Write the superblock of an arena of version 1 or 2 as version 3, both copies, the
        second first. Where that fails the arena is refused: used at an older version, what this
        code lists as dead, or marks as not to be trusted, an older hicachefs started on it later
        would serve (found by review, twice)."""
        log.info("%s: its superblock is written as version %d (an older hicachefs formats the arena "
                 "anew rather than miss its list of dead records)", self.path, _VERSION)
        try:
            self._write_superblock_at([_COPY_AT, 0])
        except OSError as exc:
            raise self._unmarkable(exc) from None

    def _write_superblock_at(self, offsets: list[int]) -> None:
        """This code's superblock over the copies at ``offsets``, in that order, each durable
        before the next is touched. Raises OSError."""
        superblock = _packed_superblock(self.file_bytes, self.region_bytes, self.file_id)
        for at in offsets:
            if self.device.pwrite(superblock, at) != len(superblock):
                raise OSError(errno.EIO, "short write")
            self._fsync()

    def _unmarkable(self, exc: OSError) -> ArenaRefused:
        return ArenaRefused(f"{self.path}: its superblock cannot be written as version {_VERSION} "
                            f"({exc.strerror or exc}): remove it to start with an empty disk tier")

    def _write_superblock_over(self, damaged: list[int], head: bytes) -> None:
        """Write the superblock over its copies at ``damaged``, one sector at a time, durably,
        the clean mark and the limit left as they are: the copy that holds stays untouched until
        the other holds too, so a write torn by a power loss leaves one that holds. An upgrade
        from version 1 cut short after its first write (the second copy) is no damage. A failed
        write leaves the arena as it was."""
        if not damaged:
            return
        finishing = damaged == [0] and _version_1_at_head(head)
        if finishing:
            log.info("%s: the upgrade of its superblock to version %d, cut short, is finished", self.path, _VERSION)
        else:
            log.warning("%s: a copy of its superblock is damaged (at byte %d): the other one serves, "
                        "and is written over it", self.path, damaged[0])
        try:
            self._write_superblock_at(damaged)
        except OSError as exc:
            if finishing:  # used so, its first copy would say version 1 to an older hicachefs (found by review)
                raise self._unmarkable(exc) from None
            log.warning("%s: its superblock could not be written again (%s): the copy that holds "
                        "serves", self.path, exc.strerror or exc)

    # -- the clean mark ----------------------------------------------------------------

    def _read_clean_mark(self) -> bytes | None:
        raw = self.device.pread(_CLEAN.size, _CLEAN_AT)
        if len(raw) != _CLEAN.size:
            return None
        magic, token, check = _CLEAN.unpack(raw)
        if magic != _CLEAN_MAGIC or check != xxhash.xxh3_64_intdigest(raw[:-8]):
            return None
        return token

    def _read_seq_limit(self) -> int:
        raw = self.device.pread(_LIMIT.size, _LIMIT_AT)
        if len(raw) != _LIMIT.size:
            return 0
        magic, limit, check = _LIMIT.unpack(raw)
        if magic != _LIMIT_MAGIC or check != xxhash.xxh3_64_intdigest(raw[:-8]):
            return 0
        return limit

    def _raise_seq_limit(self) -> None:
        """Record, durably, a sequence number above every one this log writes before it asks
        again: a scan numbers new records from there at least (see ``scan``)."""
        limit = self.next_seq + _LIMIT_STEP
        raw = bytearray(_LIMIT.pack(_LIMIT_MAGIC, limit, 0))
        _LIMIT.pack_into(raw, 0, _LIMIT_MAGIC, limit, xxhash.xxh3_64_intdigest(raw[:-8]))
        if self.device.pwrite(raw, _LIMIT_AT) != _LIMIT.size:
            raise OSError(errno.EIO, f"short write of the superblock of {self.path}")
        self._fsync()
        self._seq_limit = limit

    def clean_token(self) -> bytes | None:
        """The token of the snapshot the last clean close wrote, while nothing has been written
        since; None when the arena may have changed since a snapshot (or never had one)."""
        return self._clean_token

    def mark_clean(self, token: bytes) -> None:
        """Durably record that the snapshot with ``token`` describes the arena as it is now. The
        caller makes the records and the snapshot durable first; nothing may be written after."""
        mark = bytearray(_CLEAN.pack(_CLEAN_MAGIC, token, 0))
        _CLEAN.pack_into(mark, 0, _CLEAN_MAGIC, token, xxhash.xxh3_64_intdigest(mark[:-8]))
        self.device.pwrite(mark, _CLEAN_AT)
        self._fsync()
        self._clean_token = token

    def _mark_dirty(self) -> None:
        """Erase the clean mark, durably, before a write changes what the snapshot describes."""
        if self._clean_token is None:
            return
        if self.device.pwrite(bytes(_CLEAN.size), _CLEAN_AT) != _CLEAN.size:
            raise OSError(errno.EIO, f"short write of the superblock of {self.path}")
        self._fsync()
        self._clean_token = None

    def region_start(self, region: int) -> int:
        return _SUPER_BYTES + region * self.region_bytes

    def fits(self, name_len: int, size: int) -> bool:
        return record_length(name_len, size) <= self.region_bytes

    def fence(self, on: bool) -> None:
        """From now on (``on``) until ``fence(False)``, writing never comes back to the region
        written now: an append that would reclaim it raises ENOSPC, also when the ring passes
        over a region on its way there, and ``holds`` and ``reclaim_turn`` count up to it. A
        clean close's write-down: what it writes first, and the newest records before them,
        lie there."""
        self._fence = self.current if on else None

    def _regions_to_fence(self) -> int:
        """How many regions appending may still start before it reaches the fence (the region
        written now when there is none)."""
        fence = self.current if self._fence is None else self._fence
        return (fence - self.current - 1) % self.regions

    def holds(self, lengths: Iterable[int]) -> bool:
        """Whether records of these lengths (``record_length``), appended in this order, all fit
        before the ring comes back to the region written now, whose reclaim would drop the first
        of them, or to the fence (``fence``): a record that does not fit in what is left of a
        region starts the next one, the rest left empty. Then so do any of them appended in the
        same order (one left out never makes a later one start a region sooner)."""
        room = self.region_start(self.current) + self.region_bytes - self.tail
        regions_left = self._regions_to_fence()
        for length in lengths:
            if length > room:
                if not regions_left:
                    return False
                regions_left -= 1
                room = self.region_bytes
            room -= length
        return True

    @property
    def free_bytes(self) -> int:
        """What appending can still take before it reclaims a region that holds live records:
        the rest of the region written now and the empty regions after it, up to the fence.
        Not ``capacity - used_bytes``: the ring reclaims its oldest region whatever part of it
        is dead, and a region's tail too short for the next record stays empty (found by
        review: 10 % of a disk tier counted free while it evicted at every region)."""
        room = self.region_start(self.current) + self.region_bytes - self.tail
        for ahead in range(1, self._regions_to_fence() + 1):
            if self.region_live[(self.current + ahead) % self.regions]:
                break
            room += self.region_bytes
        return room

    def reclaim_turn(self, offset: int) -> int:
        """How many regions appending reclaims up to the one holding ``offset``, that one
        included; 0 for the region written now (reclaimed only once the ring comes back to it),
        and for the fence and the regions past it (not reclaimed while it stands)."""
        turn = ((offset - _SUPER_BYTES) // self.region_bytes - self.current) % self.regions
        return turn if turn <= self._regions_to_fence() else 0

    def state(self) -> LogState:
        return LogState(np.array(self.region_live, np.int64), self.used_bytes, self.current, self.tail, self.next_seq)

    def restore(self, state: LogState) -> None:
        """Take up writing where ``state`` says (from a snapshot that describes this arena)."""
        self.region_live = state.region_live.tolist()
        self.used_bytes, self.current = state.used_bytes, state.current
        self.tail, self.next_seq = state.tail, state.next_seq

    # -- recovery ----------------------------------------------------------------------

    def scan(
        self, on_corrupt: Callable[[], None], progress: Callable[[int, int, int], None] | None = None,
        dead: Mapping[int, int] = MappingProxyType({}),
    ) -> Iterator[Record]:
        """Yield every live, checking record in sequence order, and leave the write position
        after the newest one. ``on_corrupt`` is called per live record that fails its checksum,
        and per span skipped past a damaged header (a page lost at least);
        ``progress(scanned_bytes, total_bytes, records_found)`` after each region. ``dead``: per
        offset, a sequence number: a live record there numbered below it is taken for dead (its
        mark failed; ``SsdTier.supersede``)."""
        firsts, damaged = self._firsts()
        newest = 0  # the sequence number of the newest record walked
        total, done, found = len(firsts) * self.region_bytes, 0, 0
        buf = bytearray(self.region_bytes)
        view = memoryview(buf)
        for _, region in firsts:
            start = self.region_start(region)
            try:
                got = self.device.preadv([buf], start)
            except OSError as exc:
                self._unreadable(region, exc)
                got = 0  # written over in its turn, as a region whose first header is damaged
            ours = None  # where this file's records lie in the region past the first damage
            pos, seq, skipped = 0, 0, 0
            while pos + HEADER.size <= got:
                parsed = self._checked_header(view, pos, seq, got)
                if parsed is None or pos + record_length(parsed[1], parsed[2]) > got:
                    ours = ours if ours is not None else self._records_of_ours(buf, pos, got)
                    after = self._next_record(view, ours, pos + _ALIGN, seq, got)
                    if after < 0:
                        break  # the end of what the region's use wrote, a torn last record included
                    on_corrupt()  # damage, followed by good records: at least a page lost there
                    skipped, pos = skipped + after - pos, after
                    continue
                magic, name_len, size, seq, checksum, mtime = parsed
                name_at = pos + HEADER.size
                if magic == LIVE and not seq < dead.get(start + pos, 0):
                    payload = view[name_at + name_len : name_at + name_len + size]
                    if page_checksum(payload) == checksum:
                        length = record_length(name_len, size)
                        self.region_live[region] += length
                        self.used_bytes += length
                        found += 1
                        yield Record(start + pos, seq, bytes(view[name_at : name_at + name_len]).decode(),
                                     size, checksum, mtime)
                    else:
                        on_corrupt()
                pos += record_length(name_len, size)
            if skipped:
                log.warning("region %d of %s: %d bytes past a damaged record header were skipped (their "
                            "pages are lost); the scan went on at the next record that checks",
                            region, self.path, skipped)
            self.current, self.tail, self.next_seq = region, start + pos, max(self.next_seq, seq + 1)
            newest = max(newest, seq)
            done += self.region_bytes
            if progress is not None:
                progress(done, total, found)
        view.release()
        self._report_damaged(damaged, newest, on_corrupt)
        # A region skipped (its first header damaged, or unreadable): its records may carry any
        # sequence number written so far. New records start above them all, so that no later
        # scan walks on from a new record into one of them (taking it for newer than what
        # replaced it): above the limit that writing keeps ahead of itself in the superblock,
        # and (for an arena written before it was kept) above the last one walked by as many as
        # the arena holds.
        self.next_seq = max(self.next_seq + self.regions * (self.region_bytes // HEADER.size), self._seq_limit)

    def _firsts(self) -> tuple[list[tuple[int, int]], list[tuple[int, int | None]]]:
        """(sequence number, region) of each region whose first record checks, oldest first; and
        (region, the sequence number its header says, None when it reads as zeros) of each whose
        first header is damaged (``_damaged_ours``, ``_zeroed``). These are dropped: the records
        after such a header cannot be told from those of the region's previous use, which its
        reclaim let go of (their later removals and replaces never marked them), as no other
        region's numbers bound them once the ring passed over one (found by review: a removed
        page came back; walking a zeroed region from the first record of the region before it
        did so as well, once a start had left writing in that region)."""
        firsts, damaged, zeroed = [], [], []
        for region in range(self.regions):
            try:
                head = self._head_of(region)
            except OSError as exc:
                self._unreadable(region, exc)
                continue
            parsed = self._checked_header(head, 0, 0, len(head))
            if parsed is not None:
                firsts.append((parsed[3], region))
            elif not head[:_SECTOR].strip(b"\0"):
                zeroed.append(region)
            elif self._damaged_ours(head):
                damaged.append((region, HEADER.unpack_from(head)[4]))
        damaged += [(region, None) for region in self._dropped_zeroed(zeroed, firsts)]
        firsts.sort()
        return firsts, damaged

    def _dropped_zeroed(self, zeroed: list[int], firsts: list[tuple[int, int]]) -> list[int]:
        """The regions whose first sector reads as zeros to drop (``_zeroed``): those writing may
        have reached (``_reached``), and from the one after the newest region on, those that hold
        records of this file up to two never written in a row: on the ring's first round a region
        whose erase failed is passed over for the next one, one at a time (found by review: the
        region written after one or two such was lost silently)."""
        reached = self._reached(firsts)
        dropped = [region for region in zeroed if reached(region) and self._zeroed(region)]
        region, empty, zeroed_left = (max(firsts)[1] + 1) % self.regions if firsts else 0, 0, set(zeroed)
        while region in zeroed_left and empty < 2:
            zeroed_left.discard(region)  # (once round the ring at most)
            if region not in dropped and not reached(region) and self._zeroed(region):
                dropped.append(region)
            empty = 0 if region in dropped else empty + 1
            region = (region + 1) % self.regions
        return dropped

    def _reached(self, firsts: list[tuple[int, int]]) -> Callable[[int], bool]:
        """Whether writing reached a region whose first sector reads as zeros, from the regions
        whose first record checks (``firsts``): the ring's first round goes through the regions in
        order from region 0, so every one before a region holding records was reached, and every
        one is once the ring has come round (a region's first record numbered below that of one
        before it). Those after the newest are looked at by ``_dropped_zeroed``; others are not
        read: a new arena is zeros."""
        if not firsts:
            return lambda region: False
        by_region = [seq for _, seq in sorted((region, seq) for seq, region in firsts)]
        come_round = any(later < earlier for earlier, later in zip(by_region, by_region[1:]))
        highest = max(region for _, region in firsts)
        return lambda region: come_round or region < highest

    def _zeroed(self, region: int) -> bool:
        """Whether a region writing may have reached, whose first sector reads as zeros, holds a
        record of this file: no write or reclaim of ours leaves such a sector (a reclaim erases the
        header alone, the name after it stays), so it is damage (a bad sector read back as zeros),
        which was taken for a region never written, its pages lost with nothing counted or logged
        (found by review)."""
        buf = bytearray(self.region_bytes)
        try:
            got = self.device.preadv([buf], self.region_start(region))
        except OSError as exc:
            self._unreadable(region, exc)
            return False
        with memoryview(buf) as view:
            return self._next_record(view, self._records_of_ours(buf, 0, got), 0, 0, got) >= 0

    def _report_damaged(self, damaged: list[tuple[int, int | None]], newest: int,
                        on_corrupt: Callable[[], None]) -> None:
        """Count and log the regions dropped for a damaged first header, but for the record a
        crash cut short: the last one written, its header whole (one sector), so numbered
        ``newest`` + 1 (the newest record walked), with no record behind it numbered above
        ``newest`` (found by review: a torn record was logged as damage; a number read from a
        damaged header is trusted no further, so that bits flipped in it do not make damage
        pass for a torn record). The first record written after a start, numbered from the
        limit, torn, is logged as damage: a line too many, nothing lost. A first sector read as
        zeros (no number: ``_zeroed``) is damage."""
        for region, seq in damaged:
            if seq == newest + 1 and not self._newer_in(region, newest):
                continue
            on_corrupt()
            log.warning("region %d of %s: its first record header is damaged: its pages are lost (they "
                        "cannot be told from those of its previous use)", region, self.path)

    def _newer_in(self, region: int, seq: int) -> bool:
        """Whether the region holds a record of this file numbered above ``seq`` that checks."""
        buf = bytearray(self.region_bytes)
        try:
            got = self.device.preadv([buf], self.region_start(region))
        except OSError:
            return True  # (told as damage)
        with memoryview(buf) as view:
            return self._next_record(view, self._records_of_ours(buf, 0, got), _ALIGN, seq, got) >= 0

    def _head_of(self, region: int) -> bytes:
        """The region's first header and name (the first 4 KiB read: the cost of a sector)."""
        head = self.device.pread(min(4096, self.region_bytes), self.region_start(region))
        if len(head) >= HEADER.size and HEADER.size + HEADER.unpack_from(head)[1] > len(head):
            head = self.device.pread(HEADER.size + HEADER.unpack_from(head)[1], self.region_start(region))
        return head

    def _damaged_ours(self, head: bytes) -> bool:
        """Whether a first header that does not check is a record of this file damaged: its
        magic or its file id is ours (a few bytes flipped leave one of them). Zeros are a
        region reclaimed or never written, anything else (a whole record of another file id
        among it) bytes of an earlier file."""
        if len(head) < HEADER.size or not head[: HEADER.size].strip(b"\0"):
            return False
        magic, name_len, _, file_id, *_, hcheck = HEADER.unpack_from(head)
        if file_id == self.file_id:
            return True
        whole = _header_check(head[: HEADER.size], head[HEADER.size : HEADER.size + name_len]) == hcheck
        return magic in _MAGICS and not whole  # (whole: a record of an earlier file)

    def _unreadable(self, region: int, exc: OSError) -> None:
        """A region the scan cannot read (a bad block): its pages are lost, not the start."""
        log.warning("region %d of %s cannot be read (%s): its pages are lost", region, self.path,
                    exc.strerror or exc)

    def _checked_header(self, buf, pos: int, prev_seq: int, got: int):
        """(magic, name_len, size, seq, checksum, mtime) of the record at ``pos`` in ``buf``
        (``got`` bytes read), if its header and name check and it can follow sequence number
        ``prev_seq``; else None. Its payload may lie past ``got``."""
        if pos + HEADER.size > got:
            return None
        parsed = self._parse(buf[pos : pos + HEADER.size], prev_seq)
        if parsed is None or pos + HEADER.size + parsed[1] > got:
            return None
        name = buf[pos + HEADER.size : pos + HEADER.size + parsed[1]]
        if _header_check(buf[pos : pos + HEADER.size], name) != HEADER.unpack_from(buf, pos)[8]:
            return None
        return parsed

    def _records_of_ours(self, buf: bytearray, start: int, got: int) -> tuple[np.ndarray, np.ndarray]:
        """Where headers bearing a record magic and this file's id lie in a region read into
        ``buf``, from its aligned offset ``start`` on, and their sequence numbers: a pass of
        numpy, not a Python step per offset (regions are up to 256 MiB); from where the walk
        stopped, so that a full region's costs nothing."""
        rows = (got - start) // _ALIGN
        words = np.frombuffer(buf, np.uint64, rows * _ALIGN // 8, start).reshape(rows, _ALIGN // 8)
        magics = np.frombuffer(buf, np.uint32, rows * _ALIGN // 4, start)[:: _ALIGN // 4]
        ours = np.isin(magics, _MAGIC_WORDS)
        ours &= words[:, 1] == np.uint64(self.file_id)
        at = np.flatnonzero(ours)
        return start + at * _ALIGN, words[at, 2]

    def _next_record(self, view: memoryview, ours: tuple[np.ndarray, np.ndarray], start: int,
                     prev_seq: int, got: int) -> int:
        """Where the first record at or after ``start`` lies whose header and name check, with
        a sequence number above ``prev_seq`` (and below the limit, when the superblock keeps
        one): records of the region's previous use are numbered lower. -1 if none. Looks at
        the candidates a block at a time from ``start`` on, so that a region with many damaged
        headers costs a pass, not a pass per damaged header (found by review: 15 s for a 64 MiB
        region with every other header damaged)."""
        offsets, seqs = ours
        limit = self._seq_limit or (1 << 64) - 1
        for first in range(int(np.searchsorted(offsets, start)), len(offsets), _CANDIDATES):
            block = slice(first, first + _CANDIDATES)
            later = (seqs[block] > np.uint64(prev_seq)) & (seqs[block] < np.uint64(limit))
            for at in offsets[block][later].tolist():
                if self._checked_header(view, at, prev_seq, got) is not None:
                    return at
        return -1

    def _parse(self, header, prev_seq: int):
        """(magic, name_len, size, seq, checksum, mtime) if ``header`` can start a record after
        sequence number ``prev_seq`` (-1: any), else None. The xxh32 is checked by the caller."""
        if len(header) < HEADER.size:
            return None
        magic, name_len, _, file_id, seq, size, checksum, mtime, _ = HEADER.unpack_from(header)
        if magic not in _MAGICS or file_id != self.file_id or seq <= prev_seq:
            return None
        if record_length(name_len, size) > self.region_bytes:
            return None
        return magic, name_len, size, seq, checksum, mtime

    # -- writing -----------------------------------------------------------------------

    def append(
        self, name: bytes, payload, checksum: int, mtime_ns: int, reclaim: Callable[[int, int], None]
    ) -> int:
        """Write a live record and return its offset. When the current region is full, the next
        one is reclaimed first: ``reclaim(start, end)`` must forget every record in that range."""
        self._mark_dirty()
        if self.next_seq >= self._seq_limit:
            self._raise_seq_limit()
        size = len(payload)
        length = record_length(len(name), size)
        if self.tail + length > self.region_start(self.current) + self.region_bytes:
            self._reclaim_next(reclaim)
        fields = [LIVE, len(name), 0, self.file_id, self.next_seq, size, checksum, mtime_ns, 0]
        header = bytearray(HEADER.pack(*fields))
        fields[8] = _header_check(header, name)
        HEADER.pack_into(header, 0, *fields)
        offset = self.tail
        written = self.device.pwritev([header, name, payload], offset)
        if written != HEADER.size + len(name) + size:
            raise OSError(errno.EIO, f"short write to {self.path}: {written} of {HEADER.size + len(name) + size} bytes")
        self.next_seq += 1
        self.tail += length
        region = (offset - _SUPER_BYTES) // self.region_bytes
        self.region_live[region] += length
        self.used_bytes += length
        return offset

    def _reclaim_next(self, reclaim: Callable[[int, int], None]) -> None:
        """Move on to the next region of the ring (the oldest), its records forgotten (``reclaim``).
        One whose first header cannot be erased (a bad block) is passed over, its pages kept, for
        the one after: a bad block does not stop the ring, and that region, the oldest again a
        round later, is tried then. Raises OSError when the one after fails too, ENOSPC (nothing
        changed) when the region to reclaim is the fence's."""
        following = self._short_of_fence((self.current + 1) % self.regions)
        try:
            self._erase_first_header(following)
        except OSError:
            if self.regions < 3:  # the one after is the current region
                raise
            following = self._short_of_fence((following + 1) % self.regions)
            self._erase_first_header(following)
            self.passed_over += 1
        self.current = following
        self.tail = self.region_start(following)
        reclaim(self.tail, self.tail + self.region_bytes)
        self.used_bytes -= self.region_live[following]
        self.region_live[following] = 0

    def _short_of_fence(self, region: int) -> int:
        """``region``, to reclaim; ENOSPC, nothing changed, when it is the fence's (``fence``)."""
        if region == self._fence:
            raise OSError(errno.ENOSPC, f"{self.path}: the ring came back to the region a write-down began in")
        return region

    def _erase_first_header(self, region: int) -> None:
        """Erase the region's first header before its pages are forgotten: should a write after
        fail, no scan after a crash walks the old records of a reclaimed region (one of them may
        be a page removed or replaced since, while only RAM held it)."""
        if self.device.pwrite(bytes(HEADER.size), self.region_start(region)) != HEADER.size:
            raise OSError(errno.EIO, f"short write to {self.path} while reclaiming a region")

    def invalidate(self, offset: int, name_len: int, size: int) -> None:
        """Mark the record at ``offset`` dead in place and stop counting it. Raises ``OSError``
        when the mark cannot be written: the record is then live and counted as before."""
        self.mark_dead(offset)
        self.forget(offset, name_len, size)

    def mark_dead(self, offset: int) -> None:
        """Mark the record at ``offset`` dead in place, so that no scan brings it back; its
        bytes are counted as before. Raises ``OSError`` when the mark cannot be written."""
        self._mark_dirty()
        if self.device.pwrite(DEAD, offset) != len(DEAD):
            raise OSError(errno.EIO, f"short write to {self.path} while marking a record dead")

    def forget(self, offset: int, name_len: int, size: int) -> None:
        """Stop counting the record at ``offset`` as live: the index no longer holds it (a
        snapshot lists only what is counted)."""
        length = record_length(name_len, size)
        self.region_live[(offset - _SUPER_BYTES) // self.region_bytes] -= length
        self.used_bytes -= length

    # -- reading -----------------------------------------------------------------------

    def read_into(self, offset: int, name: bytes, checksum: int, out: memoryview) -> ReadResult:
        """Read the payload of the record expected at ``offset`` into ``out`` (its exact size) and
        check it is that record, whole."""
        header = bytearray(HEADER.size + len(name))
        got = self.device.preadv([header, out], offset)
        if got != len(header) + len(out):
            return ReadResult.MISMATCH
        magic, name_len, _, file_id, _, size, stored_sum, _, hcheck = HEADER.unpack_from(header)
        if (
            magic != LIVE
            or file_id != self.file_id
            or name_len != len(name)
            or size != len(out)
            or stored_sum != checksum
            or header[HEADER.size :] != name
            or _header_check(header, name) != hcheck
        ):
            return ReadResult.MISMATCH
        return ReadResult.OK if page_checksum(out) == checksum else ReadResult.CORRUPT

    def sync(self) -> None:
        self._fsync()

    def _fsync(self) -> None:
        """fsync the arena. A failure is remembered for good (``fsync_failed``): Linux may never
        write what a failed fsync did not, however later ones go, so which of the writes before
        it the disk holds is not known (found by review, twice): the arena is marked so that the
        next start formats it anew (a cache dropped is safe; older pages served are not), also
        after a clean close that marks it clean (found by review)."""
        try:
            self.device.fsync()
        except OSError:
            if not self.fsync_failed:
                self.fsync_failed = True
                try:
                    self.device.pwrite(_DISTRUST_MAGIC, _DISTRUST_AT)
                    self.device.fsync()  # a later fsync reports no error for the writes the failed one dropped
                except OSError:
                    log.warning("%s: an fsync failed, and the mark that has the next start format it anew "
                                "could not be written", self.path)
            raise

    def close(self) -> None:
        try:
            self._fsync()
        finally:
            self.device.close()
