"""The shared tier's removals owed to its volume (pages removed here while it was away, whose
files go once it is back: ``SharedTier.remove_later``), kept across a stop and a start where
there is a disk directory: held in memory alone, they were lost at the stop, and the next start's
sweep counted the removed pages again and served them (found by review).

One file in the disk directory (``--disk``), ``hicachefs.shared-removals``: a header (magic,
version, the entry count, the length of the shared directory's path), that path, per entry the
removal's time (ns since the epoch), the length of a page name and the name (UTF-8), then an
xxh3_64 of everything before. The time is what a file of the name must predate to go: a list
applied late (after a stop, a kill, a disk that refused the last save) leaves a file written
under the name since (found by review). Written whole
through ``durable_file.replace_durably`` by the tier's maintenance thread, at most once a second
while the list changed (a daemon killed loses a second of removals at most, not every one), and
at the close; removed once nothing is owed. A list written for another shared directory names
pages of no volume here: dropped, with a warning. Without a disk directory nothing is kept: the
close warns of what is dropped.

Blocking file I/O on the local disk; thread-safe.
"""

from __future__ import annotations

import logging
import struct
import threading
from pathlib import Path

import xxhash

from hicachefs.store.durable_file import remove_durably, replace_durably

_log = logging.getLogger(__name__)

OWED_NAME = "hicachefs.shared-removals"
_MAGIC = b"HCowed\0\1"
_VERSION = 2
_HEADER = struct.Struct("<8sIII")  # magic, version, entries, length of the shared directory's path
_ENTRY = struct.Struct("<QH")  # the removal's time (ns), a page name's length
_CHECK_BYTES = 8


class ListDamaged(Exception):
    """The list cannot be read, or is not one this version wrote whole."""


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def write(directory: Path, root: str, owed: tuple[tuple[str, int], ...]) -> None:
    """Make the list of ``owed`` removals (name, time) of the shared directory ``root`` durable;
    raises OSError."""
    body = _HEADER.pack(_MAGIC, _VERSION, len(owed), len(_encode(root))) + _encode(root)
    body += b"".join(_ENTRY.pack(at, len(name)) + name for name, at in ((_encode(n), at) for n, at in owed))
    replace_durably(directory, OWED_NAME, [body, xxhash.xxh3_64_intdigest(body).to_bytes(_CHECK_BYTES, "little")])


def read(directory: Path) -> tuple[str, list[tuple[str, int]]]:
    """The shared directory and the removals (name, time) of the list in ``directory``; ("", [])
    when there is none. Raises ListDamaged for one that cannot be read, or is truncated or
    damaged."""
    try:
        data = (directory / OWED_NAME).read_bytes()
    except FileNotFoundError:
        return "", []
    except OSError as exc:
        raise ListDamaged(f"it cannot be read ({exc.strerror or exc})") from None
    if len(data) < _HEADER.size + _CHECK_BYTES:
        raise ListDamaged("it is truncated")
    if xxhash.xxh3_64_intdigest(data[:-_CHECK_BYTES]) != int.from_bytes(data[-_CHECK_BYTES:], "little"):
        raise ListDamaged("it is damaged or truncated (checksum mismatch)")
    magic, version, count, root_length = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise ListDamaged("it is not one this version writes")
    body = memoryview(data)[: -_CHECK_BYTES]
    at = _HEADER.size + root_length
    root = bytes(body[_HEADER.size : at]).decode("utf-8", "surrogateescape")
    owed = []
    for _ in range(count):
        removed_at, length = _ENTRY.unpack_from(body, at)
        at += _ENTRY.size
        owed.append((bytes(body[at : at + length]).decode("utf-8", "surrogateescape"), removed_at))
        at += length
    if at != len(body):
        raise ListDamaged("its entries do not fill it")
    return root, owed


class OwedRemovals:
    """The list of one shared tier (its directory ``root``), kept in ``directory`` (None: no
    disk directory, nothing kept)."""

    def __init__(self, directory: Path | None, root: Path) -> None:
        self._directory = directory
        self._root = str(root)
        self._lock = threading.Lock()  # the maintenance thread's saves and the close's
        self._saved: tuple[tuple[str, int], ...] | None = ()  # what the file holds; None: not known (rewritten)
        self._failing = False

    def load(self) -> list[tuple[str, int]]:
        """The removals (name, time) owed since the last stop; a list that cannot be read, or is
        another shared directory's, is warned of and dropped (removed at the next save)."""
        if self._directory is None:
            return []
        try:
            root, owed = read(self._directory)
        except (ListDamaged, UnicodeDecodeError, struct.error) as exc:
            _log.warning("%s: %s; the pages it named may come back with the shared volume",
                         self._directory / OWED_NAME, exc)
            self._saved = None
            return []
        if owed and root != self._root:
            _log.warning("%s: %d removals owed to shared directory %s, not %s, dropped",
                         self._directory / OWED_NAME, len(owed), root, self._root)
            self._saved = None
            return []
        self._saved = tuple(owed)
        return owed

    def save(self, owed: tuple[tuple[str, int], ...]) -> None:
        """Make ``owed`` the list kept, if it changed since it was last written; the file goes
        when it is empty. A disk that fails it is warned of once, and tried again next time."""
        with self._lock:
            if self._directory is None or owed == self._saved:
                return
            try:
                if owed:
                    write(self._directory, self._root, owed)
                else:
                    remove_durably(self._directory, OWED_NAME)
            except OSError as exc:
                if not self._failing:
                    _log.warning("%s cannot be written (%s): the removals owed to the shared volume since "
                                 "it was last written are lost if the daemon stops now, and those it holds "
                                 "are applied at the next start, done or not (files written under their "
                                 "names since are left)", self._directory / OWED_NAME, exc.strerror or exc)
                self._failing = True
                return
            self._failing, self._saved = False, owed

    def close(self, owed: tuple[tuple[str, int], ...]) -> None:
        """The tier stops owing ``owed``: kept for the next start, or where there is no disk
        directory, warned of as dropped."""
        if self._directory is None:
            if owed:
                _log.warning("shared tier %s: %d removals owed to the volume (pages rm'ed while it was away) "
                             "are dropped at the stop, with no --disk to keep them: those pages may come back "
                             "with the volume", self._root, len(owed))
            return
        self.save(owed)
