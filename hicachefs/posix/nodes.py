"""The objects behind inode numbers: directories, published pages, files being written.

Plain data holders with the little logic that belongs to each; the rules that tie them
together (publish by rename, immutability, depths) live in ``namespace``.
Not thread-safe: the daemon touches them from its trio thread only.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass, field

from ..store import Draft, PageInfo, PageStore, size_class
from .errors import FsError
from .writing_budget import WritingBudget


@dataclass(slots=True)
class Stat:
    """What ``stat`` shows for one inode (the FUSE adapter turns it into EntryAttributes).
    ``volatile``: it may change without a request of the kernel's (a page only another host's
    tier holds), so the kernel must not keep it. ``allocated``: the bytes it takes in its tier
    (a slot, a record: ``st_blocks``), None for its size."""

    inode: int
    mode: int
    size: int = 0
    nlink: int = 1
    mtime_ns: int = 0
    atime_ns: int = 0
    volatile: bool = False
    allocated: int | None = None


@dataclass(eq=False, slots=True)
class Directory:
    """A directory: its subdirectories by name; pages are looked up in the store by path."""

    inode: int
    path: str  # relative to the mount root, '' for the root
    depth: int
    parent: Directory | None
    children: dict[str, Directory] = field(default_factory=dict)
    pending: dict[str, PendingFile] = field(default_factory=dict)
    last_page_size: int = 0  # size of the last page published here: the likely next size
    mtime_ns: int = field(default_factory=time.time_ns)
    removed: bool = False

    def page_name(self, key: str) -> str:
        return f"{self.path}/{key}"


@dataclass(eq=False, slots=True)
class PageNode:
    """The kernel's handle on a published page; the page itself lives in the store.

    ``info`` is the one version of the page this inode stands for (``inodes``): the kernel may
    cache its data, and once the name no longer leads to that version, files still open keep
    these attributes, as an unlinked file does.
    """

    inode: int
    directory: Directory
    key: str
    info: PageInfo
    nlookup: int = 0
    retired: bool = False  # its name no longer leads to its version (unlinked, evicted, replaced)
    opened: set = field(default_factory=set)  # its open files (``PageHandle``s)

    @property
    def name(self) -> str | None:
        return None if self.retired else self.directory.page_name(self.key)

    def current_name(self, opened_as: str) -> str:
        """Where an open file of this page finds its version again: its name now (a rename moves
        the node), or the name it was opened under once the name no longer leads to it."""
        return self.name or opened_as


@dataclass(eq=False, slots=True)
class PendingFile:
    """A file being written: a ``.``-prefixed temporary, or a file created under a key.

    Its bytes go straight into a store draft once the size is known (``ftruncate`` before
    writing is the fast path), else into a growing staging buffer. Publishing hands them
    to the store; until then nothing of it is visible as a page. A draft counts against the
    files being written at its slot's size (``size_class``), what it takes of the RAM tier.

    A failed write or ``ftruncate`` (over the maximum page size, no room) makes the file
    ``failed``: it can never become a page, so its bytes go back to the store at once, and
    later writes fail with the same error (the kernel reports a write that failed halfway as a
    short one, and the writer's retry must see why). A failed ``ftruncate`` counts too: the
    file does not have the size its writer gave it (``cp`` of a sparse file sets its size so).

    Once published, ``published`` is the page it became, and ``node`` its inode, which follows
    the page's renames: handles still open on the file read that page, under its name of now.

    Its handles count apart: ``writers`` (opened for writing: create, ``O_WRONLY``, ``O_RDWR``)
    and ``readers`` (read-only: any user may open a file being written that ``ls`` shows).
    Only writers decide its fate: at their last close (``last_close``) it is published (one
    created under a key), or, a temporary one, discarded the reaper's timeout later, whoever
    still reads it. Before, any handle kept it: a plain user holding a dead writer's 32
    temporary files open for reading kept all of them (and what they held of the files being
    written's room, so root's new ones failed with ENOSPC) until it closed them.
    """

    inode: int
    directory: Directory
    name: str
    visible: bool  # created under a key name: listed, and published at its last writer's close
    store: PageStore
    budget: WritingBudget  # what the draft and the staging buffer hold counts against it
    draft: Draft | None = None
    staging: bytearray | None = None
    size: int = 0
    writers: int = 0
    readers: int = 0
    nlookup: int = 0
    last_close: float = field(default_factory=time.monotonic)  # its last writer's
    # Fixed at creation, not moved by writes: the kernel drops an inode's cached data when
    # its mtime changes, and the page this file becomes is pushed into that cache at publish.
    mtime_ns: int = field(default_factory=time.time_ns)
    gone: bool = False
    failure: Exception | None = None  # what made a write fail, raised again for later writes
    published: PageInfo | None = None
    node: PageNode | None = None  # the page's inode once published (if the kernel held the file's)
    charged: int = 0  # bytes held against the budget
    uid: int | None = None  # who made it, named in the line that says it went unpublished

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def opens(self) -> int:
        return self.writers + self.readers

    def truncate(self, size: int) -> None:
        self._changing(self._truncate, size)

    def write(self, offset: int, data: bytes) -> int:
        return self._changing(self._write, offset, data)

    def _changing(self, change, *args):
        """Make a change; one that fails fails the file (see the class docstring)."""
        if self.failure is not None:
            raise self.failure.with_traceback(None)
        if self.gone:  # published or discarded: what it held is given back, and stays so
            raise FsError(errno.EPERM, "the file was published, replaced, removed or discarded; pages are immutable")
        try:
            return change(*args)
        except Exception as exc:
            self.failure = exc
            self.discard()
            raise

    def _truncate(self, size: int) -> None:
        if size > self.store.config.max_page_size:
            raise FsError(errno.EFBIG, f"{size} bytes is over the maximum page size")
        self._charge(max(self.charged, size_class(size) if size else 0))  # first: ENOSPC here changes nothing
        if self.draft is None and self.staging is None and size > 0:
            self.draft = self._reserve(size)
        elif self.draft is not None and size != self.draft.size:
            self._to_staging()
        if self.staging is not None:
            if size < len(self.staging):
                del self.staging[size:]
            else:
                self.staging.extend(bytes(size - len(self.staging)))
        self._settle()
        self.size = size

    def _write(self, offset: int, data: bytes) -> int:
        end = offset + len(data)
        if end > self.store.config.max_page_size:
            raise FsError(errno.EFBIG, f"write to {end} bytes is over the maximum page size")
        guess = self.directory.last_page_size
        placing = self.draft is None and self.staging is None and offset == 0 and 0 < end <= guess
        self._charge(max(self.charged, size_class(guess) if placing else end))  # a failure discards the file
        if placing:
            # No size announced: pages of one pool are nearly always one size, so place the
            # page where the last one published here would go (copied out if it differs).
            self.draft = self.store.reserve(guess)
        if self.draft is not None and end <= self.draft.size:
            self.draft.write(offset, data)
        else:
            if self.staging is None:
                self._to_staging()
            if end > len(self.staging):
                self.staging.extend(bytes(end - len(self.staging)))
            self.staging[offset:end] = data
        self._settle()
        self.size = max(self.size, end)
        return len(data)

    def read(self, offset: int, size: int):
        if self.failure is not None:
            raise FsError(errno.EIO, "a write to this file failed; its bytes are gone")
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        return bytes(self._content()[offset:end])

    def filled_draft(self) -> Draft:
        """Hand over a draft holding exactly this file's bytes (copied if it is elsewhere)."""
        if self.draft is not None and self.draft.size == self.size:
            draft, self.draft = self.draft, None
            self._settle()
            return draft
        draft = self.store.reserve(self.size)
        draft.write(0, self._content()[: self.size])
        self.discard()
        return draft

    def _content(self) -> memoryview:
        if self.staging is not None:
            return memoryview(self.staging)
        if self.draft is not None:
            return self.draft.view()
        return memoryview(bytes(self.size))

    def discard(self) -> None:
        if self.draft is not None:
            self.store.abandon(self.draft)
            self.draft = None
        self.staging = None
        self._charge(0)

    def _charge(self, total: int) -> None:
        """Hold ``total`` bytes against the budget from now on (ENOSPC, holding what it held)."""
        self.budget.change(total - self.charged)
        self.charged = total

    def _settle(self) -> None:
        """Hold what the draft and the staging buffer hold now."""
        self._charge((size_class(self.draft.size) if self.draft is not None else 0)
                     + (len(self.staging) if self.staging is not None else 0))

    def _reserve(self, size: int) -> Draft:
        """A draft of ``size``, charged already; if the store has no room, the charge goes back."""
        try:
            return self.store.reserve(size)
        except BaseException:
            self._settle()
            raise

    def _to_staging(self) -> None:
        """Leave the draft: the file outgrew the size it announced, or shrank."""
        self.staging = bytearray(self.draft.view()[: self.size]) if self.draft else bytearray()
        if self.draft is not None:
            self.store.abandon(self.draft)
            self.draft = None
