"""Files being written, and the rules that publish them (docs/contract.md, "Page files").

A file is a ``PendingFile`` until it is published: a temporary (``.``-prefixed) file by the
rename onto its key, a file created under a key name at its last writer's close, and a page sent
through the ingest file once its last byte arrived (``publish_page``: the ``ingest.Publisher``
side). A file with a failed write is never published (the rename fails with EIO, the close discards it),
and a temporary file nobody renamed is discarded ``temp_timeout_s`` after its last writer closed
it, even while others still read it (``PendingFile``).

Publishing under a name replaces what it held atomically: a file being written under that name
is discarded (its handles read EIO from then on, as after ``rm``), and an inode the kernel holds
for the old page is retired (``inodes``): it keeps the old page's attributes, so a reader that
has it open keeps its whole old content (or gets EIO), and the kernel is told to fetch them
again (its ``fstat`` shows ``st_nlink`` 0). An open racing the replace, on the old inode, gets
ESTALE, on which the kernel looks the name up again and opens what it finds: one of the two
pages, never none. The data of a page just published is pushed into the kernel's page cache
when the kernel knows its inode (the file it was written as), so its first read is a warm one.

Not thread-safe: the daemon's trio thread only; nothing here blocks beyond the store's
memory-speed calls.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Protocol

from .. import names
from ..store import Draft, PageNotFound, PageReader, PageStore, size_class
from .errors import FsError
from .handles import PendingHandle
from .inodes import InodeNumbers, PageNodes
from .nodes import Directory, PageNode, PendingFile
from .refusal_log import RefusalLog
from .tree import DirectoryTree
from .writing_budget import WritingBudget

log = logging.getLogger(__name__)


class KernelNotices(Protocol):
    """Where the namespace reports what the kernel must learn (see ``kernel_notifier``)."""

    def push(self, inode: int, reader: PageReader) -> bool: ...

    def forget_entry(self, parent_inode: int, name: bytes) -> None: ...

    def forget_inode(self, inode: int) -> None: ...

    def forget_attributes(self, inode: int) -> None: ...

    async def delivered(self) -> None:
        """Wait until the kernel has been told everything reported so far."""


class Publishing:
    """The files being written and their publication. See the module docstring."""

    def __init__(self, store: PageStore, tree: DirectoryTree, nodes: PageNodes, numbers: InodeNumbers,
                 notices: KernelNotices, temp_timeout_s: float, kernel_cache: bool) -> None:
        self.store = store
        self.tree = tree
        self.nodes = nodes
        self.numbers = numbers
        self.notices = notices
        self.temp_timeout_s = temp_timeout_s
        self.kernel_cache = kernel_cache
        self._pending: dict[int, PendingFile] = {}
        self._last_target: tuple[str, Directory, str] | None = None
        self.writing = WritingBudget(store.budget.share("writing"))
        #: The lines of files dropped unpublished, a few per kind: a client can make one per
        #: file it writes, as fast as it writes them (``refusal_log``).
        self.dropped = RefusalLog(log)

    # -- files being written ----------------------------------------------------------

    def get(self, inode: int) -> PendingFile | None:
        """The file being written of ``inode``; None once it is published (kept here only while a
        handle of its is open: the inode is the page's now, and asks of it are the page's)."""
        pending = self._pending.get(inode)
        return None if pending is None or pending.published is not None else pending

    def create(self, parent: Directory, text: str, visible: bool, uid: int | None = None) -> PendingFile:
        pending = PendingFile(self.numbers.new(), parent, text, visible, self.store, self.writing, uid=uid)
        pending.nlookup = 1
        parent.pending[text] = pending
        self._pending[pending.inode] = pending
        return pending

    def open(self, pending: PendingFile, writing: bool, bounded: bool = False) -> PendingHandle:
        """A handle on the file; ``writing``: opened for writing (see ``PendingFile``);
        ``bounded``: by a user who may not change the store (``PendingHandle``)."""
        if writing:
            pending.writers += 1
        else:
            pending.readers += 1
        return PendingHandle(pending, writing, self.closed, bounded)

    def closed(self, pending: PendingFile, writing: bool) -> None:
        """A handle on the file closed: a file created under a key is published at its last
        writer's close."""
        if not writing:
            pending.readers -= 1
            self._drop_if_unused(pending)
            return
        pending.writers -= 1
        pending.last_close = time.monotonic()
        if pending.writers == 0 and pending.visible and not pending.gone:
            if pending.failed:  # its writer got the error: nothing to publish
                self._dropped("write failed", logging.INFO, "not publishing %s: a write to it failed", pending)
                self.discard(pending)
                return
            try:
                self.publish(pending, pending.directory, pending.name)
            except Exception as exc:  # release cannot report errors: log and drop the file
                self._dropped("publish failed", logging.ERROR, "could not publish %s at close: %s", pending, exc)
                self.discard(pending)
        self._drop_if_unused(pending)

    def forget(self, inode: int, nlookup: int) -> bool:
        pending = self._pending.get(inode)
        if pending is None:
            return False
        pending.nlookup -= nlookup
        self._drop_if_unused(pending)
        return True

    def unlink(self, directory: Directory, name: str) -> None:
        """The file's name goes (``rm``, or a rename onto it): it is never published, and a
        writer that still has it open is refused its next write (EPERM)."""
        pending = directory.pending.pop(name)
        pending.gone = True
        pending.discard()
        self._drop_if_unused(pending)

    def discard(self, pending: PendingFile) -> None:
        pending.directory.pending.pop(pending.name, None)
        self.notices.forget_entry(pending.directory.inode, pending.name.encode("utf-8", "surrogateescape"))
        pending.gone = True
        pending.discard()
        self._drop_if_unused(pending)

    def reap_abandoned(self, now: float | None = None) -> int:
        """Discard temporary files their last writer closed longer than the timeout ago (it
        died), whoever still has them open for reading: those handles read EIO from then on."""
        now = time.monotonic() if now is None else now
        stale = [
            p for p in self._pending.values()
            if not p.gone and p.writers == 0 and now - p.last_close >= self.temp_timeout_s
        ]
        for pending in stale:
            self._dropped("abandoned", logging.INFO, "discarding abandoned temporary file %s", pending)
            self.discard(pending)
        return len(stale)

    def _dropped(self, kind: str, level: int, message: str, pending: PendingFile, *args) -> None:
        """Log that ``pending`` goes unpublished, throttled per ``kind`` (the refusal log escapes
        a newline in its path, which would otherwise start a forged line of its own)."""
        self.dropped.refused(kind, pending.uid, level, message, f"{pending.directory.path}/{pending.name}", *args)

    def count(self) -> int:
        return sum(1 for p in self._pending.values() if not p.gone)

    def _drop_if_unused(self, pending: PendingFile) -> None:
        if pending.gone and pending.opens <= 0 and pending.nlookup <= 0:
            self._pending.pop(pending.inode, None)

    # -- publishing -------------------------------------------------------------------

    def publish(self, pending: PendingFile, directory: Directory, key: str) -> None:
        """Publish a file being written under ``key`` of ``directory`` (a rename, a last close)."""
        if pending.failed:
            raise FsError(errno.EIO, "a write to this file failed; it is never published")
        draft = pending.filled_draft()
        try:
            info = self.store.publish(draft, directory.page_name(key), pending.mtime_ns)
        except Exception as exc:  # the store gave the draft back: the file's bytes are gone
            pending.failure = FsError(errno.EIO, f"publishing this file failed ({exc}); its bytes are gone")
            raise
        directory.last_page_size = draft.size
        pending.directory.pending.pop(pending.name, None)
        pending.gone = True
        pending.published = info
        self.displace(directory, key)
        self.retire_old(directory, key)
        node = PageNode(pending.inode, directory, key, info, pending.nlookup)
        if node.nlookup > 0:  # the kernel knows the file's inode: it is the page's now
            self.nodes.adopt(node)
            pending.node = node
            self._push(node.inode, info.name)
        pending.nlookup = 0
        self._drop_if_unused(pending)
        directory.mtime_ns = time.time_ns()

    def _push(self, inode: int, name: str) -> None:
        """Give the kernel the new page's bytes now, so that its first read is from memory."""
        if not self.kernel_cache:
            return
        try:
            reader = self.store.try_open(name, counted=False)
        except PageNotFound:  # not in RAM (too large for a slot): it is not pushed
            return
        self.notices.push(inode, reader)

    # -- the ingest file's pages (``ingest.Publisher``) ---------------------------------

    def has_page(self, path: str, size: int | None = None) -> bool:
        """Whether ``path`` names a stored page (of ``size`` bytes, when given)."""
        try:
            directory, key = self._target(path)
        except FsError:
            return False
        return self.store.holds(directory.page_name(key), size)

    def reserve_page(self, path: str, size: int) -> Draft:
        """Room for the page ``path`` will name, once the path is known to be publishable,
        counted against the files being written at its slot's size (ENOSPC past them) until it
        is published (``publish_reserved``) or abandoned (``abandon_page``)."""
        self._target(path)
        self.writing.change(size_class(size))
        try:
            return self.store.reserve(size)
        except BaseException:
            self.writing.change(-size_class(size))
            raise

    def _target(self, path: str) -> tuple[Directory, str]:
        """The pool directory and key of ``path``, checked (the last answer is kept: a page's
        path is asked for at its first byte and again at its last)."""
        if self._last_target is not None and self._last_target[0] == path and not self._last_target[1].removed:
            return self._last_target[1], self._last_target[2]
        directory, key = self.tree.pool_and_key(path)
        self._last_target = (path, directory, key)
        return directory, key

    def make_pool(self, path: str) -> None:
        """Make the pool directory of page ``path``, and what is missing above it, as mkdir
        would (each name checked, the kernel told): a plane writer's commit into a new pool
        makes it, where page files are preceded by mkdir."""
        parts = path.split("/")
        if len(parts) != names.POOL_DEPTH + 1:
            return  # not a page path: its publish says why
        known = self.tree.at(path.rpartition("/")[0])
        if known is not None and not known.removed:
            return  # the usual case, once per page of a commit: a dictionary lookup
        checked = [self.checked_name(part.encode("utf-8", "surrogateescape")) for part in parts[:-1]]  # all, first
        directory = self.tree.root
        for part in checked:
            child = self.tree.child(directory, part)
            if child is None:
                child = self.tree.add(directory, part)
                self.notices.forget_entry(directory.inode, part.encode("utf-8", "surrogateescape"))
            directory = child

    def abandon_page(self, draft: Draft) -> None:
        """Drop a draft of ``reserve_page``."""
        self.writing.change(-size_class(draft.size))
        self.store.abandon(draft)

    def publish_reserved(self, path: str, draft: Draft, keep_existing: bool = False) -> bool:
        """``publish_page`` for a draft of ``reserve_page``."""
        self.writing.change(-size_class(draft.size))
        return self.publish_page(path, draft, keep_existing)

    def publish_page(self, path: str, draft: Draft, keep_existing: bool = False) -> bool:
        """Publish a filled draft under ``path``, replacing what the name held, as a rename
        onto it would; the draft is consumed whatever happens. ``keep_existing``: a page of the
        draft's size the name holds is kept as it is instead (False is returned)."""
        try:
            directory, key = self._target(path)
        except BaseException:
            self.store.abandon(draft)
            raise
        if not self.store.publish_page(draft, directory.page_name(key), keep_existing=keep_existing):
            return False
        directory.last_page_size = draft.size
        directory.mtime_ns = time.time_ns()
        known = self.displace(directory, key)
        if self.retire_old(directory, key) or known:  # the kernel did not see this replace
            self.notices.forget_entry(directory.inode, key.encode("utf-8", "surrogateescape"))
        return True

    async def kernel_told(self) -> None:
        await self.notices.delivered()

    def displace(self, directory: Directory, key: str) -> bool:
        """A page was just published under ``key``: a file being written under that name is
        replaced, as a rename onto any file replaces it. Whether there was one."""
        if key not in directory.pending:
            return False
        self.unlink(directory, key)
        return True

    def retire_old(self, directory: Directory, key: str) -> bool:
        """The name now holds another page: the inode of the page it held is retired, and the
        kernel fetches that inode's attributes again. Whether there was one."""
        old = self.nodes.detach(directory, key)
        if old is not None:
            self.notices.forget_attributes(old.inode)
        return old is not None

    @staticmethod
    def checked_name(name: bytes, temporary: bool = False) -> str:
        try:
            return names.check_temporary(name) if temporary else names.check_component(name)
        except names.BadName as exc:
            raise FsError(exc.errno, str(exc)) from None
