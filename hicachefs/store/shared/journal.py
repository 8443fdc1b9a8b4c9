"""Announcements: how a host learns within a second which pages other hosts added or removed.

Listing every fan-out directory again and again would cost O(pages in the tier) per refresh.
Instead each host appends one line per page it writes (``+<size> <name>``) or removes
(``-<size> <name>``) to its own journal file in ``<root>/.journal``, a batch per flush, and
reads the other hosts' journals from where it left off: the cost of a refresh is the number of
hosts plus the pages that changed. Listings (``sweep.Sweeper``) stay the ground truth for what
the journals do not say (pages older than the journals, removals by other means).

Only what POSIX and close-to-open consistency promise is relied on, since engines differ past
that: a writer's append reaches other hosts when it is flushed to the filesystem, and a reader
sees it when it opens the file after that. So each batch is fsync'd after its write (JuiceFS
keeps unsynced appends in the writer's buffer for about 2 s), and a reader opens each file anew
for every poll (a descriptor kept open sees the file's old size for the attribute cache's time:
about 1 s on JuiceFS even with O_DIRECT). Reads use O_DIRECT where the filesystem allows it: a
FUSE client caches a file's pages, and a buffered read would not see appended bytes until the
cache is dropped (measured on GlusterFS: ~1 s buffered, ~2 ms direct).

A writer starts a new file when its file passes ``rotate_bytes`` or half of ``keep_s`` in age;
any host removes journal files it saw unchanged for ``keep_s`` of its own time (``unchanged``;
by their mtimes, a host whose clock was ahead removed files their writers still appended to).
A file unchanged that long was last appended to ``keep_s`` ago at least: its writer's next flush
starts a new file. Removals are idempotent. A name holding a newline is not announced (the sweep
finds it). A torn or damaged line is skipped.

Methods that touch the filesystem block; the tier calls them through its ``CallGuard``. Each
side has its own lock; a call that finds the previous one still stuck in the filesystem returns
at once instead of queuing behind it.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from hicachefs.store.shared.device import GONE
from hicachefs.store.shared.layout import Layout
from hicachefs.store.shared.unchanged import Unchanged

_ALIGN = 4096
_CHUNK = 1 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT)


class _Unwritten(OSError):
    """An append the filesystem refused whole (full): the file is unchanged."""


class Announcement(NamedTuple):
    present: bool
    size: int
    name: str


class _Source:
    __slots__ = ("offset", "finished")

    def __init__(self) -> None:
        self.offset = 0
        self.finished = False  # a rotated-away file that was read to its end


def _file_name(writer: str, number: int) -> str:
    return f"{writer}.{number:08d}"


def _writer_of(file_name: str) -> tuple[str, int] | None:
    writer, _, number = file_name.rpartition(".")
    return (writer, int(number)) if writer and number.isdigit() else None


def parse(data: bytes) -> tuple[list[Announcement], int]:
    """The announcements in ``data`` and how many bytes they took (whole lines only)."""
    end = data.rfind(b"\n") + 1
    found = []
    for line in data[:end].split(b"\n")[:-1]:
        sign, _, rest = line.partition(b" ")
        if sign[:1] not in (b"+", b"-") or not sign[1:].isdigit() or not rest:
            continue  # damaged: the sweep will correct what it said
        found.append(Announcement(sign[:1] == b"+", int(sign[1:]), rest.decode("utf-8", "surrogateescape")))
    return found, end


class Journal:
    def __init__(self, device, layout: Layout, writer: str, rotate_bytes: int = 8 << 20,
                 keep_s: float = 600.0, poll_bytes: int = 1 << 20,
                 on_volume: Callable[[], object] = lambda: True) -> None:
        """``on_volume()``: raises ``OSError`` when the root is not the volume any more (its
        mountpoint bare): called before the journal directory is made, so that none is made there."""
        self._device = device
        self._on_volume = on_volume
        self._anew = False
        self._layout = layout
        self.writer = writer
        self._rotate_bytes = rotate_bytes
        self._keep_s = keep_s
        self._unchanged = Unchanged(keep_s)
        self._poll_bytes = poll_bytes
        self._pending: list[bytes] = []
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._fd: int | None = None
        self._number = 0
        self._written = 0
        self._opened_at = 0.0
        self._read_lock = threading.Lock()
        self._sources: dict[str, _Source] = {}
        self._buffer = mmap.mmap(-1, _CHUNK + _ALIGN)  # page-aligned, as O_DIRECT wants
        self.announced = 0
        self.received = 0

    # -- writing -------------------------------------------------------------------------

    def announce(self, present: bool, size: int, name: str) -> None:
        """Queue one line for the next ``flush``; never blocks."""
        if "\n" in name:
            return
        line = f"{'+' if present else '-'}{size} {name}\n".encode("utf-8", "surrogateescape")
        with self._pending_lock:
            self._pending.append(line)

    def pending(self) -> int:
        with self._pending_lock:
            return len(self._pending)

    def flush(self) -> None:
        """Append what was announced since the last flush, in one write. On failure the lines
        are kept for the next flush (unless there are too many: the sweep makes up for them)."""
        if not self._write_lock.acquire(blocking=False):
            return
        try:
            with self._pending_lock:
                lines, self._pending = self._pending, []
            if not lines:
                return
            data = b"".join(lines)
            try:
                fd = self._writable()
                try:
                    written = self._device.write(data, fd)
                except OSError as error:
                    if error.errno in _FULL:
                        # Nothing was appended: the file stays as it was, kept for the next
                        # try (a new file per failed try would leave thousands of them).
                        raise _Unwritten(error.errno, error.strerror) from error
                    raise
                if written != len(data):
                    raise OSError(errno.EIO, f"journal append wrote {written} of {len(data)} bytes")
                self._device.fsync(fd)  # what other hosts see of it (close-to-open)
            except OSError as error:
                if not isinstance(error, _Unwritten):
                    self._drop_file()
                with self._pending_lock:
                    if len(self._pending) + len(lines) <= 65536:
                        self._pending[:0] = lines
                raise
            self._written += written
            self.announced += len(lines)
        finally:
            self._write_lock.release()

    def _writable(self) -> int:
        if self._fd is not None and (self._anew or self._written >= self._rotate_bytes
                                     or time.monotonic() - self._opened_at > self._keep_s / 2
                                     or self._removed()):
            self._drop_file()
        self._anew = False
        if self._fd is None:
            self._on_volume()
            self._device.makedirs(self._layout.journal, self._on_volume)  # (looked at again after a pause)
            self._number += 1
            path = os.path.join(self._layout.journal, _file_name(self.writer, self._number))
            self._fd = self._device.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._written = 0
            self._opened_at = time.monotonic()
        return self._fd

    def _removed(self) -> bool:
        """Whether another host removed the file open now (its clock a day ahead of this
        one's, the file idle for a minute: found by review): appended to, its lines would reach
        nobody until it rotated."""
        try:
            return self._device.fstat(self._fd).st_nlink == 0
        except OSError:
            return True

    def start_anew(self) -> None:
        """Append to a new file from the next flush on: the volume came back, and the file
        open now may lie on a mount gone since, or hidden under the volume's mountpoint."""
        self._anew = True

    def _drop_file(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                self._device.close(fd)
            except OSError:
                pass  # the file is left as it is; readers take whole lines only

    # -- reading -------------------------------------------------------------------------

    def poll(self) -> list[Announcement]:
        """What other writers announced since the last poll (at most ``poll_bytes`` of it)."""
        if not self._read_lock.acquire(blocking=False):
            return []
        try:
            try:
                names = self._device.listdir(self._layout.journal)
            except FileNotFoundError:
                names = []
            latest: dict[str, int] = {}
            for name in names:
                parsed = _writer_of(name)
                if parsed is not None and parsed[0] != self.writer:
                    latest[parsed[0]] = max(latest.get(parsed[0], 0), parsed[1])
            for gone in set(self._sources) - set(names):
                del self._sources[gone]
            found: list[Announcement] = []
            budget = self._poll_bytes
            for name in sorted(names):
                parsed = _writer_of(name)
                if parsed is None or parsed[0] == self.writer or budget <= 0:
                    continue
                source = self._sources.setdefault(name, _Source())
                if source.finished:
                    continue
                budget -= self._read_new(name, source, found)
                if parsed[1] < latest[parsed[0]] and budget > 0:
                    source.finished = True  # rotated away: it never grows again
            self.received += len(found)
            return found
        finally:
            self._read_lock.release()

    def _open_direct(self, name: str) -> int:
        path = os.path.join(self._layout.journal, name)
        try:
            return self._device.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError as error:
            if error.errno != errno.EINVAL:  # a filesystem without O_DIRECT (tmpfs)
                raise
            return self._device.open(path, os.O_RDONLY)

    def _read_new(self, name: str, source: _Source, found: list[Announcement]) -> int:
        """Open ``name`` and read it from the source's offset to its end; return the bytes
        consumed (none when the file is gone: another host expired it)."""
        try:
            fd = self._open_direct(name)
        except OSError as error:
            if error.errno in GONE:
                self._sources.pop(name, None)
                return 0
            raise
        consumed = 0
        try:
            while True:
                start = source.offset - source.offset % _ALIGN
                skip = source.offset - start
                got = self._device.preadv([memoryview(self._buffer)[:_CHUNK]], fd, start)
                if got <= skip:
                    return consumed
                announcements, used = parse(self._buffer[skip:got])
                found.extend(announcements)
                source.offset += used
                consumed += used
                if got < _CHUNK or used == 0 or consumed >= self._poll_bytes:
                    return consumed
        except OSError as error:
            if error.errno in GONE:
                self._sources.pop(name, None)
                return consumed
            raise
        finally:
            try:
                self._device.close(fd)
            except OSError:
                pass  # nothing of it is kept

    def expire(self) -> int:
        """Remove every writer's journal files that stayed unchanged for ``keep_s`` since this
        host's first look at them; return how many."""
        try:
            entries = self._device.scandir(self._layout.journal)
        except FileNotFoundError:
            return 0
        files = [entry for entry in entries if not entry.is_dir and _writer_of(entry.name) is not None]
        removed = 0
        for name in self._unchanged.old(files):
            try:
                self._device.unlink(os.path.join(self._layout.journal, name))
                removed += 1
            except OSError as error:
                if error.errno not in GONE:
                    raise
        return removed

    def close(self) -> None:
        """Close the writer's file (no flush: the tier flushes through its guard first)."""
        self._drop_file()
