"""A directory's entries for readdir, a batch at a time from the readdir offset.

Why: a listing built whole at ``opendir`` made the daemon's work and memory grow with the
directory. With 40,000 pages in one pool, one opendir blocked the daemon for 360-410 ms (another
client's requests waited up to 490 ms behind a loop of them), and 100 open directory handles took
it from 1.2 to 5.5 GiB. Here a handle holds where it is, and a readdir request costs the entries
it returns.

The offset the kernel hands back is the cursor, so a listing read on from any offset it was
given continues there: a directory lists its subdirectories and the files being written in it
first, in inode order (each one's offset is its inode number, and inode numbers only grow), then
its pages in the store's listing order (offset ``PAGES`` plus the page's cursor, which a page
keeps while its name has one). So every entry that stays throughout a listing is listed once,
and entries made or removed meanwhile may be listed or not, as POSIX allows.

A file created under its key (``cp``) that is published while the directory is listed moves from
the first part to the second: the page of a name this handle listed as a file being written is
left out when the kernel has taken that entry (the offset it asks from is past it), so the name
is listed once either way. For that a handle remembers the names of such files it listed since
the listing was last read from its start (which lists every page, so nothing from before is
needed there): its memory grows with the files being written under key names that one listing
met, never with the pages, nor with a handle rewound again and again.

Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Protocol

from .. import names
from ..store import PageInfo, PageStore
from .nodes import Directory, PendingFile, Stat

#: Offsets from here on are pages': inode numbers stay below it.
PAGES = 1 << 62
#: Entries produced at a time.
BATCH = 64
#: Entries one readdir request returns at most. The kernel asks with a buffer as large as the
#: reader's (glibc's is st_blksize, 1 MiB here: about 4,000 entries, some 35 ms of the daemon's
#: time); a reply of 256 costs it about 2 ms, and the kernel asks again for the rest.
ENTRIES_PER_REQUEST = 256

#: Gives an entry's attributes; ``counted``: the kernel took the entry (a readdirplus entry
#: counts as a lookup).
Describe = Callable[[bool], Stat]
#: One entry of a listing: its name and its ``Describe``.
Entry = tuple[bytes, Describe]


class Entries(Protocol):
    """How the namespace describes what a listing finds."""

    def of_directory(self, directory: Directory) -> Describe: ...

    def of_pending(self, pending: PendingFile) -> Describe: ...

    def of_page(self, directory: Directory, key: str, info: PageInfo) -> Describe: ...


def _encoded(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class DirectoryListing:
    """The entries of one directory for one open handle. See the module docstring."""

    def __init__(self, directory: Directory, store: PageStore, entries: Entries) -> None:
        self.directory = directory
        self.store = store
        self.entries = entries
        self._listed_files: dict[str, int] = {}  # files being written under keys: name -> inode

    def read(self, start: int) -> Iterator[tuple[int, Entry]]:
        """The entries that follow offset ``start``, each with its own offset, for one readdir
        request: made a batch at a time, as the reply takes them, and at most
        ``ENTRIES_PER_REQUEST`` (the kernel asks again for more)."""
        if start == 0:  # read from the start (again): no entry of this listing taken yet
            self._listed_files.clear()
        return itertools.islice(self._following(start), ENTRIES_PER_REQUEST)

    def _following(self, start: int) -> Iterator[tuple[int, Entry]]:
        named_start = start
        while named_start < PAGES:
            named = self._named_after(named_start)
            if not named:
                break
            yield from named
            named_start = named[-1][0]
        if self.directory.depth != names.POOL_DEPTH:
            return
        taken = start if start < PAGES else math.inf  # the kernel has taken every entry up to here
        after = max(0, start - PAGES)
        while pages := self.store.list_dir(self.directory.path, after, BATCH):
            for cursor, info in pages:
                key = info.name.rpartition("/")[2]
                as_file = self._listed_files.get(key)
                if as_file is None or as_file > taken:  # else listed as the file it was written as
                    yield PAGES + cursor, (_encoded(key), self.entries.of_page(self.directory, key, info))
            after = pages[-1][0]

    def _named_after(self, start: int) -> list[tuple[int, Entry]]:
        """Subdirectories and files being written whose inode follows ``start``, in inode order."""
        directory = self.directory
        candidates = [(child.inode, name, child) for name, child in directory.children.items() if child.inode > start]
        candidates += [(pending.inode, name, pending) for name, pending in directory.pending.items()
                       if pending.inode > start]
        batch = []
        for inode, name, node in heapq.nsmallest(BATCH, candidates):
            if isinstance(node, Directory):
                describe = self.entries.of_directory(node)
            else:
                describe = self.entries.of_pending(node)
                if node.visible:
                    describe = self._remembered(name, inode, describe)
            batch.append((inode, (_encoded(name), describe)))
        return batch

    def _remembered(self, name: str, inode: int, describe: Describe) -> Describe:
        def remembering(counted: bool) -> Stat:
            if counted:
                self._listed_files[name] = inode
            return describe(counted)

        return remembering


def fixed_listing(entries: list[Entry]) -> Callable[[int], Iterator[tuple[int, Entry]]]:
    """A listing of a few entries that never change (the control directory): offsets 1, 2..."""
    return lambda start: ((i + 1, entry) for i, entry in enumerate(entries[start:], start))
