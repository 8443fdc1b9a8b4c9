"""The filesystem's POSIX meaning, without FUSE: inodes, directories, publish by rename.

The tree is ``<model>/<format>/<shard>/<pool>/<key>``: directories are kept here, pages in
the store (looked up by path, so the namespace holds no per-page state except for the
pages the kernel currently knows by inode). Files being written are ``PendingFile``s
until a rename (or, for a file created under a key, its last close) publishes them; a file
with a failed write is never published (the rename fails with EIO, the close discards it).

Published pages may be cached by the kernel (entries, attributes, data): whatever changes
what a name means without a request from the kernel (a page the store evicts, a replace
racing an open) is reported to a ``KernelNotices`` object, and the data of a page just
published is pushed to the kernel's page cache, so that its first read is a warm one.

Not thread-safe: the daemon calls it from its trio thread only. Every method is
synchronous and never blocks on I/O, except ``open_reader`` which the caller may run in
a worker thread (it only calls the thread-safe store).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import stat
import time
from collections.abc import Callable
from typing import Protocol

from .. import names
from ..store import Draft, PageInfo, PageNotFound, PageReader, PageStore
from .control import CONTROL_INODES, INGEST_INODE, ControlFiles
from .errors import FsError
from .nodes import Directory, PageNode, PendingFile, Stat
from .page_handle import Leases, PageHandle

log = logging.getLogger(__name__)

ROOT_INODE = 1
#: renameat2 flags (the os module does not name them).
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

DIR_MODE = stat.S_IFDIR | 0o755
#: Pages and files being written alike: a file's attributes stay what the kernel cached
#: while it was written, so publishing it needs no round trip to refresh them (the
#: daemon, not the mode, decides who may write).
FILE_MODE = stat.S_IFREG | 0o444


def _version(info: PageInfo) -> tuple[str, int]:
    return info.checksum, info.mtime_ns


class KernelNotices(Protocol):
    """Where the namespace reports what the kernel must learn (see ``kernel_notifier``)."""

    def push(self, inode: int, reader: PageReader) -> bool: ...

    def forget_entry(self, parent_inode: int, name: bytes) -> None: ...

    def forget_inode(self, inode: int) -> None: ...


class PendingHandle:
    """An open file that is still being written."""

    def __init__(self, namespace: Namespace, pending: PendingFile):
        self.namespace = namespace
        self.pending = pending

    async def read(self, offset: int, size: int):
        return self.pending.read(offset, size)

    async def write(self, offset: int, data: bytes) -> int:
        if self.pending.gone:
            raise FsError(errno.EPERM, "the file was published or discarded; pages are immutable")
        return self.pending.write(offset, data)

    def release(self) -> None:
        self.namespace.close_pending(self.pending)


class Namespace:
    """Directories, inode numbers, open handles and the publish rules of DESIGN.md."""

    def __init__(self, store: PageStore, control: ControlFiles, notices: KernelNotices,
                 temp_timeout_s: float = 60.0, kernel_cache: bool = True):
        """``kernel_cache``: the kernel may keep published pages' data (and is given new
        pages' bytes at publish); without it every read comes to the daemon."""
        self.store = store
        self.control = control
        self.notices = notices
        self.temp_timeout_s = temp_timeout_s
        self.kernel_cache = kernel_cache
        self._shared_tier = store.tier("shared") is not None
        self.leases = Leases()
        self.root = Directory(ROOT_INODE, "", 0, None)
        self._inodes = itertools.count(max(CONTROL_INODES) + 1)
        self._handles_ids = itertools.count(1)
        self._dirs: dict[int, Directory] = {ROOT_INODE: self.root}
        self._dirs_by_path: dict[str, Directory] = {"": self.root}
        self._pages: dict[int, PageNode] = {}
        self._page_by_name: dict[tuple[int, str], PageNode] = {}
        self._pending: dict[int, PendingFile] = {}
        self.handles: dict[int, object] = {}
        for path in store.directories():
            self._make_dirs(path)

    # ---- lookups -------------------------------------------------------------------

    def lookup(self, parent_inode: int, name: bytes) -> Stat:
        """Resolve ``name`` in a directory; counts a kernel reference on the result."""
        if parent_inode == self.control.dir_inode:
            return self.control.stat(self.control.lookup(name))
        parent = self._dir(parent_inode)
        if parent is self.root and name == names.CONTROL_DIR.encode():
            return self.control.stat(self.control.dir_inode)
        if name == b"..":
            return self._dir_stat(parent.parent or parent)
        if name == b".":
            return self._dir_stat(parent)
        text = name.decode("utf-8", "surrogateescape")
        child = parent.children.get(text) or self._shared_directory(parent, text)
        if child is not None:
            return self._dir_stat(child)
        pending = parent.pending.get(text)
        if pending is not None:
            pending.nlookup += 1
            return self._pending_stat(pending)
        page = self._stored_name(parent, text)
        info = None if page is None else self.store.info(page)
        if info is None:
            raise FsError(errno.ENOENT, "no such page")
        node = self._page_node(parent, text, info)
        node.nlookup += 1
        return self._page_stat(node.inode, info)

    def _shared_directory(self, parent: Directory, name: str) -> Directory | None:
        """A directory that exists only on the shared tier (pages published by another host),
        made here on first lookup, as mkdir would."""
        if parent.depth >= names.POOL_DEPTH:
            return None
        try:
            names.check_component(name.encode("utf-8", "surrogateescape"))
        except (names.BadName, UnicodeEncodeError):
            return None
        path = f"{parent.path}/{name}" if parent.path else name
        return self._add_dir(parent, name) if self.store.shared_has_directory(path) else None

    def forget(self, inode: int, nlookup: int) -> None:
        node = self._pages.get(inode)
        if node is not None:
            node.nlookup -= nlookup
            if node.nlookup <= 0:
                del self._pages[inode]
                if node.directory is not None and self._page_by_name.get((node.directory.inode, node.key)) is node:
                    del self._page_by_name[(node.directory.inode, node.key)]
            return
        pending = self._pending.get(inode)
        if pending is not None:
            pending.nlookup -= nlookup
            self._drop_pending_if_unused(pending)

    def getattr(self, inode: int) -> Stat:
        if inode in CONTROL_INODES:
            return self.control.stat(inode)
        if inode in self._dirs:
            return self._dir_stat(self._dirs[inode])
        if inode in self._pending:
            return self._pending_stat(self._pending[inode])
        info = self.page_info(inode)
        if info is not None:
            return self._page_stat(inode, info)
        node = self._pages.get(inode)
        if node is None:
            raise FsError(errno.ENOENT, "page no longer stored")
        return self._page_stat(inode, node.info, nlink=0)  # open files keep what they had

    def page_info(self, inode: int) -> PageInfo | None:
        """The store's facts about the page an inode names, or None."""
        node = self._pages.get(inode)
        return None if node is None or node.name is None else self.store.info(node.name)

    # ---- directories ---------------------------------------------------------------

    def mkdir(self, parent_inode: int, name: bytes) -> Stat:
        parent = self._writable_dir(parent_inode)
        text = self._checked_name(name)
        if parent.depth >= names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pool directories hold pages, not directories")
        if text in parent.children or text in parent.pending or self._has_page(parent, text):
            raise FsError(errno.EEXIST, "already exists")
        child = self._add_dir(parent, text)
        return self._dir_stat(child)

    def rmdir(self, parent_inode: int, name: bytes) -> None:
        parent = self._writable_dir(parent_inode)
        child = parent.children.get(name.decode("utf-8", "surrogateescape"))
        if child is None:
            if self._has_page(parent, name.decode("utf-8", "surrogateescape")):
                raise FsError(errno.ENOTDIR, "not a directory")
            raise FsError(errno.ENOENT, "no such directory")
        if child.children or child.pending or self.store.list_dir(child.path):
            raise FsError(errno.ENOTEMPTY, "directory not empty")
        del parent.children[child.path.rsplit("/", 1)[-1]]
        del self._dirs_by_path[child.path]
        child.removed = True
        parent.mtime_ns = time.time_ns()

    def list_dir(self, inode: int) -> list[tuple[bytes, Callable[..., Stat]]]:
        """A directory's entries, each with a function giving its attributes.

        ``make_stat(counted=True)`` records that the kernel accepted the entry (a readdirplus
        entry counts as a lookup); ``counted=False`` only describes it.
        """
        if inode == self.control.dir_inode:
            return [(n, functools.partial(self._fixed, self.control.stat(i))) for n, i in self.control.entries()]
        directory = self._dir(inode)
        # The control directory is reached by name, never listed: find, du and tar c of the mount
        # see pages only.
        entries: list[tuple[bytes, Callable[..., Stat]]] = []
        for text, child in sorted(directory.children.items()):
            entries.append((text.encode("utf-8", "surrogateescape"),
                            functools.partial(self._fixed, self._dir_stat(child))))
        for text, pending in sorted(directory.pending.items()):
            entries.append((text.encode("utf-8", "surrogateescape"),
                            functools.partial(self._listed_pending, pending)))
        if directory.depth == names.POOL_DEPTH:
            for info in self.store.list_dir(directory.path):
                key = info.name.rsplit("/", 1)[-1]
                entries.append((key.encode("utf-8"), functools.partial(self._listed_page, directory, key, info)))
        return entries

    @staticmethod
    def _fixed(st: Stat, counted: bool) -> Stat:
        return st

    def _listed_pending(self, pending: PendingFile, counted: bool) -> Stat:
        pending.nlookup += counted
        return self._pending_stat(pending)

    def _listed_page(self, directory: Directory, key: str, info: PageInfo, counted: bool) -> Stat:
        node = self._page_node(directory, key, info)
        node.nlookup += counted
        return self._page_stat(node.inode, info)

    # ---- files ---------------------------------------------------------------------

    def create(self, parent_inode: int, name: bytes, flags: int) -> tuple[Stat, int]:
        """A new file: a temporary (``.``-prefixed) or one created under a key name."""
        parent = self._writable_dir(parent_inode)
        if parent.depth != names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pages are created in pool directories (model/format/shard/pool)")
        visible = not names.is_temporary(name)
        text = self._checked_name(name, temporary=not visible)
        if text in parent.pending or text in parent.children:
            raise FsError(errno.EEXIST, "already exists")
        if visible and self._has_page(parent, text):
            raise FsError(errno.EEXIST, "page already published; pages are immutable")
        pending = PendingFile(next(self._inodes), parent, text, visible, self.store)
        pending.nlookup = 1
        parent.pending[text] = pending
        self._pending[pending.inode] = pending
        return self._pending_stat(pending), self._open_pending(pending)

    def open(self, inode: int, flags: int) -> int | str:
        """Open a file: returns a handle id, or for a published page the page name to read.

        Pages are opened by the caller through ``open_reader`` (possibly in a thread, for
        the disk tier) and registered with ``add_handle``.
        """
        if inode in CONTROL_INODES:
            return self.add_handle(self.control.open(inode, flags, publisher=self))
        pending = self._pending.get(inode)
        if pending is not None:
            if flags & os.O_TRUNC:
                pending.truncate(0)
            return self._open_pending(pending)
        node = self._pages.get(inode)
        if node is None or node.name is None:
            if inode in self._dirs:
                raise FsError(errno.EISDIR, "is a directory")
            raise FsError(errno.ENOENT, "page no longer stored")
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise FsError(errno.EPERM, "published pages are immutable")
        return node.name

    def open_reader(self, name: str, memory_only: bool = False) -> PageReader | None:
        """Open a page in the store (thread-safe: may run in a worker thread)."""
        try:
            return self.store.open(name, memory_only=memory_only)
        except PageNotFound:
            raise FsError(errno.ENOENT, "page no longer stored") from None

    def add_page_handle(self, inode: int, reader: PageReader) -> tuple[int, bool]:
        """Register an open page: (handle id, whether the kernel may serve it from its cache).

        A page read from the disk tier is read past the kernel's cache: it is cold there too,
        and filling the cache on the way would cost a second copy of every byte (such a page
        is promoted to RAM on its second read, and cached from then on). The kernel may hold
        data of the version it first saw behind this inode; an open that finds another version
        there (it raced a replace) reads past the cache as well, and the stale data is dropped."""
        cacheable = self.kernel_cache and reader.info.tier == "memory"
        node = self._pages.get(inode)
        if node is not None and _version(node.info) != _version(reader.info):
            cacheable = False
            self.notices.forget_inode(inode)
        return self.add_handle(PageHandle(self.store, self.leases, reader)), cacheable

    def needs_writer(self, inode: int, flags: int) -> bool:
        """Whether opening ``inode`` with ``flags`` changes the store (root and the daemon's
        user only): writing a file, or any open of the ingest file."""
        if inode in CONTROL_INODES:
            return not self.control.is_request_file(inode) and (
                inode == INGEST_INODE or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC)))
        return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC))

    def caches_misses(self, parent_inode: int) -> bool:
        """Whether the kernel may remember that a name is missing in this directory. Not in a
        pool directory, where pages appear through the ingest file without the kernel seeing a
        request, nor anywhere with a shared tier, where another host's pages appear."""
        directory = self._dirs.get(parent_inode)
        return not self._shared_tier and directory is not None and directory.depth < names.POOL_DEPTH

    def is_pending(self, inode: int) -> bool:
        return inode in self._pending

    def add_handle(self, handle) -> int:
        fh = next(self._handles_ids)
        self.handles[fh] = handle
        return fh

    def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if handle is not None:
            handle.release()

    def truncate(self, inode: int, size: int) -> Stat:
        pending = self._pending.get(inode)
        if pending is None:
            if inode in self._pages:
                raise FsError(errno.EPERM, "published pages are immutable")
            raise FsError(errno.EACCES, "cannot be truncated")
        pending.truncate(size)
        return self._pending_stat(pending)

    def unlink(self, parent_inode: int, name: bytes) -> str | None:
        """Remove a file; for a page, return its name, whose copy on the shared tier the
        caller removes too (off the event loop), so that it does not come back from there."""
        parent = self._writable_dir(parent_inode)
        text = name.decode("utf-8", "surrogateescape")
        if text in parent.children:
            raise FsError(errno.EISDIR, "is a directory")
        if text in parent.pending:
            self._unlink_pending(parent, text)
            return None
        page = self._stored_name(parent, text)
        if page is None or not (self.store.delete(page) or self.store.may_be_shared(page)):
            raise FsError(errno.ENOENT, "no such page")
        self._detach_page(parent, text)
        return page

    def shared_candidate(self, parent_inode: int, name: bytes) -> str | None:
        """The page name ``name`` would have in this directory if the shared tier may hold
        it (asked from memory), else None. The caller then finds it there off the event loop
        (``PageStore.find_shared``), after which ``lookup`` resolves it."""
        directory = self._dirs.get(parent_inode)
        if directory is None or directory.removed:
            return None
        page = self._stored_name(directory, name.decode("utf-8", "surrogateescape"))
        return page if page is not None and self.store.may_be_shared(page) else None

    def rename(self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int) -> None:
        """Publish a temporary file under its key, or move a page; directories are not moved."""
        source_dir = self._writable_dir(old_parent)
        target_dir = self._writable_dir(new_parent)
        old_text = old.decode("utf-8", "surrogateescape")
        if old_text in source_dir.children:
            raise FsError(errno.EXDEV, "directories are not renamed; copy instead")
        if target_dir.depth != names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pages live in pool directories (model/format/shard/pool)")
        new_text = self._checked_name(new)
        if new_text in target_dir.children:
            raise FsError(errno.EISDIR, "target is a directory")
        if flags & RENAME_EXCHANGE:
            raise FsError(errno.EINVAL, "exchanging pages is not supported")
        if flags & RENAME_NOREPLACE and (
            self._has_page(target_dir, new_text) or new_text in target_dir.pending
        ):
            raise FsError(errno.EEXIST, "target exists")
        pending = source_dir.pending.get(old_text)
        if pending is not None:
            self._publish(pending, target_dir, new_text)
            return
        if source_dir.depth != names.POOL_DEPTH:
            raise FsError(errno.ENOENT, "no such file")
        self._move_page(source_dir, old_text, target_dir, new_text)

    # ---- publishing through the ingest file (``ingest.Publisher``) ---------------------

    def has_page(self, path: str) -> bool:
        try:
            directory, key = self._ingest_target(path)
        except FsError:
            return False
        return self._has_page(directory, key)

    def reserve_page(self, path: str, size: int) -> Draft:
        """Room for the page ``path`` will name, once the path is known to be publishable."""
        self._ingest_target(path)
        return self.store.reserve(size)

    def abandon_page(self, draft: Draft) -> None:
        self.store.abandon(draft)

    def publish_page(self, path: str, draft: Draft) -> None:
        """Publish a filled draft under ``path``, replacing what the name held, as a rename
        onto it would; the draft is consumed whatever happens."""
        try:
            directory, key = self._ingest_target(path)
        except BaseException:
            self.store.abandon(draft)
            raise
        self.store.publish(draft, directory.page_name(key))
        directory.last_page_size = draft.size
        directory.mtime_ns = time.time_ns()
        known = key in directory.pending
        if known:  # a file being written under the key is replaced, as by a rename
            self._unlink_pending(directory, key)
        # As for a rename onto it: an inode the kernel holds for the name keeps leading to it
        # (now to the new page, read past the cache), so an open racing the replace finds one
        # of the two pages, never none; the kernel is told to look the name up again.
        old = self._page_by_name.pop((directory.inode, key), None)
        if old is not None:
            self.notices.forget_inode(old.inode)
        if known or old is not None:
            self.notices.forget_entry(directory.inode, key.encode("utf-8", "surrogateescape"))

    def _ingest_target(self, path: str) -> tuple[Directory, str]:
        dir_path, _, key = path.rpartition("/")
        directory = self._dirs_by_path.get(dir_path)
        if directory is None or directory.removed:
            raise FsError(errno.ENOENT, f"no directory {dir_path!r}")
        if directory.depth != names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pages live in pool directories (model/format/shard/pool)")
        key = self._checked_name(key.encode("utf-8", "surrogateescape"))
        if key in directory.children:
            raise FsError(errno.EISDIR, "a directory has that name")
        return directory, key

    def close_pending(self, pending: PendingFile) -> None:
        pending.opens -= 1
        pending.last_close = time.monotonic()
        if pending.opens == 0 and pending.visible and not pending.gone:
            if pending.failed:  # its writer got the error: nothing to publish
                log.info("not publishing %s/%s: a write to it failed", pending.directory.path, pending.name)
                self._discard_pending(pending)
                return
            try:
                self._publish(pending, pending.directory, pending.name)
            except Exception as exc:  # release cannot report errors: log and drop the file
                log.error("could not publish %s at close: %s", pending.name, exc)
                self._discard_pending(pending)
        self._drop_pending_if_unused(pending)

    def reap_abandoned(self, now: float | None = None) -> int:
        """Discard temporary files closed longer than the timeout ago (their writer died)."""
        now = time.monotonic() if now is None else now
        stale = [
            p for p in self._pending.values()
            if not p.gone and p.opens == 0 and now - p.last_close >= self.temp_timeout_s
        ]
        for pending in stale:
            log.info("discarding abandoned temporary file %s/%s", pending.directory.path, pending.name)
            self._discard_pending(pending)
        return len(stale)

    def pending_count(self) -> int:
        return sum(1 for p in self._pending.values() if not p.gone)

    def pages_gone(self, names: list[str]) -> None:
        """The store dropped these pages on its own (eviction, a failed checksum): the kernel
        forgets their names, and the inodes it knows for them stop naming pages."""
        for name in names:
            path, _, key = name.rpartition("/")
            directory = self._dirs_by_path.get(path)
            if directory is None:
                continue
            self.notices.forget_entry(directory.inode, key.encode("utf-8", "surrogateescape"))
            node = self._page_by_name.pop((directory.inode, key), None)
            if node is not None:
                node.directory = None
                self.notices.forget_inode(node.inode)

    # ---- internals -----------------------------------------------------------------

    def _publish(self, pending: PendingFile, directory: Directory, key: str) -> None:
        if pending.failed:
            raise FsError(errno.EIO, "a write to this file failed; it is never published")
        draft = pending.filled_draft()
        info = self.store.publish(draft, directory.page_name(key), pending.mtime_ns)
        directory.last_page_size = draft.size
        pending.directory.pending.pop(pending.name, None)
        pending.gone = True
        # The kernel may have resolved the key to the old inode just before this rename; an
        # open of it then gets the new page (replaced atomically), so the old node keeps its
        # name, and its cached data, of the old page, goes.
        old = self._page_by_name.pop((directory.inode, key), None)
        if old is not None:
            self.notices.forget_inode(old.inode)
        node = PageNode(pending.inode, directory, key, info, pending.nlookup)
        if node.nlookup > 0:
            self._pages[node.inode] = node
            self._page_by_name[(directory.inode, key)] = node
            self._warm_kernel_cache(node.inode, info.name)
        pending.nlookup = 0
        self._drop_pending_if_unused(pending)
        directory.mtime_ns = time.time_ns()

    def _warm_kernel_cache(self, inode: int, name: str) -> None:
        """Give the kernel the new page's bytes now (the inode was the file being written), so
        that its first read is served from memory."""
        if not self.kernel_cache:
            return
        reader = self.store.open(name, memory_only=True, counted=False)  # too large for RAM: not pushed
        if reader is not None:
            self.notices.push(inode, reader)

    def _move_page(self, source: Directory, old: str, target: Directory, new: str) -> None:
        source_name = self._stored_name(source, old)
        try:
            if source_name is None:
                raise PageNotFound(old)
            reader = self.store.open(source_name)
        except PageNotFound:
            raise FsError(errno.ENOENT, "no such page") from None
        with reader:
            self.store.put(target.page_name(new), reader.read(0, reader.size))
        self.store.delete(source_name)
        node = self._page_by_name.pop((source.inode, old), None)
        self._detach_page(target, new)
        if node is not None:
            node.directory, node.key = target, new
            self._page_by_name[(target.inode, new)] = node

    def _unlink_pending(self, directory: Directory, name: str) -> None:
        pending = directory.pending.pop(name)
        pending.gone = True
        pending.discard()
        self._drop_pending_if_unused(pending)

    def _discard_pending(self, pending: PendingFile) -> None:
        pending.directory.pending.pop(pending.name, None)
        self.notices.forget_entry(pending.directory.inode, pending.name.encode("utf-8", "surrogateescape"))
        pending.gone = True
        pending.discard()
        self._drop_pending_if_unused(pending)

    def _drop_pending_if_unused(self, pending: PendingFile) -> None:
        if pending.gone and pending.opens <= 0 and pending.nlookup <= 0:
            self._pending.pop(pending.inode, None)

    def _open_pending(self, pending: PendingFile) -> int:
        pending.opens += 1
        return self.add_handle(PendingHandle(self, pending))

    def _detach_page(self, directory: Directory, key: str) -> None:
        """The kernel's inode for this name no longer names a page (unlinked or replaced)."""
        node = self._page_by_name.pop((directory.inode, key), None)
        if node is not None:
            node.directory = None

    def _page_node(self, directory: Directory, key: str, info: PageInfo) -> PageNode:
        node = self._page_by_name.get((directory.inode, key))
        if node is None:
            node = PageNode(next(self._inodes), directory, key, info)
            self._pages[node.inode] = node
            self._page_by_name[(directory.inode, key)] = node
        return node

    def _has_page(self, directory: Directory, key: str) -> bool:
        page = self._stored_name(directory, key)
        return page is not None and self.store.info(page) is not None

    @staticmethod
    def _stored_name(directory: Directory, key: str) -> str | None:
        """The store's name for page ``key`` of a directory, or None if no page can have it."""
        if directory.depth != names.POOL_DEPTH:
            return None
        try:
            names.check_component(key.encode("utf-8"))
        except (names.BadName, UnicodeEncodeError):
            return None
        return directory.page_name(key)

    def _dir(self, inode: int) -> Directory:
        directory = self._dirs.get(inode)
        if directory is None or directory.removed:
            raise FsError(errno.ENOTDIR if inode in self._pages or inode in self._pending else errno.ENOENT,
                          "not a directory")
        return directory

    def _writable_dir(self, inode: int) -> Directory:
        if inode in CONTROL_INODES:
            raise FsError(errno.EPERM, "control files cannot be changed")
        return self._dir(inode)

    @staticmethod
    def _checked_name(name: bytes, temporary: bool = False) -> str:
        try:
            return names.check_temporary(name) if temporary else names.check_component(name)
        except names.BadName as exc:
            raise FsError(exc.errno, str(exc)) from None

    def _add_dir(self, parent: Directory, name: str) -> Directory:
        path = f"{parent.path}/{name}" if parent.path else name
        child = Directory(next(self._inodes), path, parent.depth + 1, parent)
        parent.children[name] = child
        parent.mtime_ns = child.mtime_ns
        self._dirs[child.inode] = child
        self._dirs_by_path[path] = child
        return child

    def _make_dirs(self, path: str) -> None:
        directory = self.root
        for part in path.split("/"):
            directory = directory.children.get(part) or self._add_dir(directory, part)

    @staticmethod
    def _dir_stat(directory: Directory) -> Stat:
        return Stat(directory.inode, DIR_MODE, 0, 2 + len(directory.children),
                    directory.mtime_ns, directory.mtime_ns)

    @staticmethod
    def _page_stat(inode: int, info: PageInfo, nlink: int = 1) -> Stat:
        return Stat(inode, FILE_MODE, info.size, nlink, info.mtime_ns, info.atime_ns)

    @staticmethod
    def _pending_stat(pending: PendingFile) -> Stat:
        return Stat(pending.inode, FILE_MODE, pending.size, 1, pending.mtime_ns, pending.mtime_ns)

