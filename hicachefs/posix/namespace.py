"""The filesystem's POSIX meaning, without FUSE: what each request means for the store.

The tree is ``<model>/<format>/<shard>/<pool>/<key>``. Its parts, one job each: the directories
(``tree``), the inodes the kernel holds for pages (``inodes``), files being written and the rules
that publish them (``publishing``), open files (``handles``, ``page_handle``, ``control``). This
module ties them into the requests the FUSE adapter forwards, and decides what each answers: a
``Stat``, a handle, an error (``FsError``) — or, when only blocking I/O can answer (a page on the
disk tier, one on the shared tier), the store's ``NeedsIO``, which the adapter runs in a worker
thread and hands back.

Published pages may be cached by the kernel (entries, attributes, data): whatever changes what a
name means without a request from the kernel (a page the store evicts, a replace racing an open)
is reported to a ``KernelNotices`` object (``kernel_notifier``).

Not thread-safe: the daemon calls it from its trio thread only.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from .. import names
from ..store import NeedsIO, PageInfo, PageNotFound, PageReader, PageStore
from .errors import FsError
from .handles import DirectoryHandle, Handle, HandleTable
from .inodes import ROOT_INODE, InodeNumbers, PageNodes, is_control
from .listing import DirectoryListing, fixed_listing
from .nodes import Directory, PageNode, PendingFile, Stat
from .page_handle import Leases, PageHandle
from .publishing import KernelNotices, Publishing
from .racing_opens import RacingOpens
from .tree import DirectoryTree

#: renameat2 flags (the os module does not name them).
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
#: Pages and files being written alike: a file's attributes stay what the kernel cached
#: while it was written, so publishing it needs no round trip to refresh them (the
#: daemon, not the mode, decides who may write).
FILE_MODE = stat.S_IFREG | 0o444
XATTR_PREFIX = b"user.hicachefs."


class ControlFiles(Protocol):
    """The files under ``.hicachefs`` (``control/``), which own the inodes ``is_control`` says:
    the namespace routes their requests there."""

    dir_inode: int

    def lookup(self, name: bytes) -> int: ...

    def stat(self, inode: int) -> Stat: ...

    def entries(self) -> list[tuple[bytes, int]]: ...

    def readlink(self, inode: int) -> bytes: ...

    def is_request_file(self, inode: int) -> bool: ...

    def writers_only(self, inode: int) -> bool: ...

    def open(self, inode: int, flags: int, publisher: Publishing, leases: Leases, uid: int = 0) -> Handle: ...


@dataclass(frozen=True)
class Room:
    """What ``statfs`` shows: the store's capacity and free bytes, and its pages."""

    capacity_bytes: int
    free_bytes: int
    pages: int


class Namespace:
    """The requests of the mount, answered by the POSIX rules of docs/contract.md."""

    def __init__(self, store: PageStore, control: ControlFiles, notices: KernelNotices,
                 temp_timeout_s: float = 60.0, kernel_cache: bool = True):
        """``kernel_cache``: the kernel may keep published pages' data (and is given new pages'
        bytes at publish); without it every read comes to the daemon. Everything belongs to the
        daemon's user (``uid``, ``gid``), who with root may change it."""
        self.store = store
        self.control = control
        self.notices = notices
        self.kernel_cache = kernel_cache
        self.uid, self.gid = os.getuid(), os.getgid()
        numbers = InodeNumbers()
        self.tree = DirectoryTree(store, numbers)
        self.nodes = PageNodes(numbers)
        self.publishing = Publishing(store, self.tree, self.nodes, numbers, notices, temp_timeout_s, kernel_cache)
        self.handles = HandleTable(writers=frozenset({0, self.uid}))
        # What pages held open (and fetch handles' pages) of users who may not change the store
        # keep pinned between them: a quarter of the RAM tier, so such a user can never keep new
        # pages out of RAM.
        self.leases = Leases(pins=store.budget.share("pins"), pins_of_others=store.budget.share("pins_of_others"))
        self._loop_thread = threading.get_ident()  # the one the leases live on
        store.on_pinned_full(self._pins_of_others_give_way)
        self.racing = RacingOpens()

    def _pins_of_others_give_way(self) -> bool:
        """The pins of users who may not change the store let go when a writer finds RAM pinned:
        a plain user reading one small page in each slab held them all, and no page of another
        size found a slot (ENOSPC with no disk tier) while it read. On the event loop only, where
        the leases live (a writer on another thread goes another way, as before)."""
        return threading.get_ident() == self._loop_thread and self.leases.let_bounded_go() > 0

    # ---- who may change what -----------------------------------------------------------

    def check_writer(self, uid: int) -> None:
        """Changes are for root and the daemon's user; anyone may read.

        The mount runs without ``default_permissions``: with it the kernel re-fetches the pool
        directory's attributes after every create and rename to check permissions, two of the
        eight requests it takes to publish a page.
        """
        if not self.may_change(uid):
            raise FsError(errno.EACCES, "only root and the daemon's user may change the store")

    def may_change(self, uid: int) -> bool:
        return uid in (0, self.uid)

    def needs_writer(self, inode: int, flags: int) -> bool:
        """Whether opening ``inode`` with ``flags`` changes the store: writing a file, or any
        open of the ingest file."""
        if is_control(inode):
            return not self.control.is_request_file(inode) and (
                self.control.writers_only(inode) or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC)))
        return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC))

    def access(self, inode: int, mode: int, uid: int) -> bool:
        """access(2): what an open or a change by ``uid`` would be allowed (no
        ``default_permissions``: the kernel asks here)."""
        st = self.getattr(inode)  # ENOENT for what is gone
        writer = self.may_change(uid)
        control = is_control(inode)
        if mode & os.X_OK and not stat.S_ISDIR(st.mode):
            return False
        if mode & os.W_OK and not writer and not (control and self.control.is_request_file(inode)):
            return False
        if mode & os.W_OK and control and self.control.read_only(inode):
            return False
        if control and not writer and self.control.writers_only(inode):
            return False
        return True

    def caches_misses(self, parent_inode: int) -> bool:
        """Whether the kernel may remember that a name is missing in this directory. Not in a
        pool directory, where pages appear through the ingest file without the kernel seeing a
        request, nor anywhere when other hosts' pages may appear."""
        directory = self.tree.get(parent_inode)
        return (not self.store.open_to_other_hosts and directory is not None
                and directory.depth < names.POOL_DEPTH)

    # ---- lookups -------------------------------------------------------------------

    def lookup(self, parent_inode: int, name: bytes, pid: int = 0) -> Stat | None | NeedsIO:
        """Resolve ``name`` in a directory: its Stat (counting a kernel reference on it), or None
        if there is nothing by that name. ``pid``: the looking thread's (a miss ends the wait
        for the second try of its open of the name: ``racing_opens``)."""
        if parent_inode == self.control.dir_inode:
            return self.control.stat(self.control.lookup(name))
        parent = self._dir(parent_inode)
        if parent is self.tree.root and name == names.CONTROL_DIR.encode():
            return self.control.stat(self.control.dir_inode)
        if name == b"..":
            return self.tree.stat(parent.parent or parent)
        if name == b".":
            return self.tree.stat(parent)
        text = name.decode("utf-8", "surrogateescape")
        child = self.tree.child(parent, text)
        if child is not None:
            return self.tree.stat(child)
        pending = parent.pending.get(text)
        if pending is not None:
            pending.nlookup += 1
            return self._pending_stat(pending)
        page = self.tree.page_name(parent, text)
        found = None if page is None else self.store.lookup(page)
        if isinstance(found, NeedsIO):
            return found.then(lambda info: self._found(parent, text, info, pid))
        return self._found(parent, text, found, pid)

    def _found(self, parent: Directory, key: str, info: PageInfo | None, pid: int) -> Stat | None:
        if info is None:
            self.racing.missed(pid, parent.inode, key)
            return None
        node = self.nodes.for_name(parent, key, info)
        node.nlookup += 1
        return self._page_stat(node.inode, info)

    def not_taken(self, inodes: list[int]) -> None:
        """A listing offered these inodes and the kernel did not take them."""
        for inode in inodes:
            self.nodes.not_taken(inode)

    def forget(self, inode: int, nlookup: int) -> None:
        if not self.nodes.forget(inode, nlookup):
            self.publishing.forget(inode, nlookup)

    def getattr(self, inode: int) -> Stat:
        if is_control(inode):
            return self.control.stat(inode)
        directory = self.tree.get(inode)
        if directory is not None:
            return self.tree.stat(directory)
        pending = self.publishing.get(inode)
        if pending is not None:
            return self._pending_stat(pending)
        info = self.page_info(inode)
        if info is not None:
            return self._page_stat(inode, info)
        node = self.nodes.get(inode)
        if node is None:
            raise FsError(errno.ENOENT, "page no longer stored")
        return self._page_stat(inode, node.info, nlink=0)  # open files keep what they had

    def setattr(self, inode: int, *, size: int | None = None, mode: int | None = None,
                uid: int | None = None, gid: int | None = None) -> Stat:
        """A truncate, or a chmod/chown/utime. Everything keeps the daemon's owner and its mode,
        and times are the store's (setting them is accepted and changes nothing). Directories
        and files being written take a change and stay as they are, so that tar x and cp -a of
        a tree another user owns, which restore both, exit 0; a published page, immutable,
        refuses one (EPERM), and takes only what it already is."""
        if size is not None:
            return self.truncate(inode, size)
        current = self.getattr(inode)
        changes = ((mode is not None and stat.S_IMODE(mode) != stat.S_IMODE(current.mode))
                   or (uid is not None and uid != self.uid) or (gid is not None and gid != self.gid))
        if changes and self.publishing.get(inode) is None and not self.tree.is_directory(inode):
            raise FsError(errno.EPERM, "published pages are immutable: they keep their owner and mode")
        return current

    def readlink(self, inode: int) -> bytes:
        if not is_control(inode):
            raise FsError(errno.EINVAL, "not a symbolic link")
        return self.control.readlink(inode)

    def page_info(self, inode: int) -> PageInfo | None:
        """The store's facts about the page an inode stands for, or None when its name no
        longer leads to that version."""
        node = self.nodes.get(inode)
        info = None if node is None or node.name is None else self.store.info(node.name)
        return info if info is not None and info.version == node.info.version else None

    def xattrs(self, inode: int) -> dict[bytes, bytes]:
        info = self.page_info(inode)
        if info is None:
            return {}
        return {
            XATTR_PREFIX + b"tier": info.tier.encode(),
            XATTR_PREFIX + b"checksum": info.checksum.encode(),
            XATTR_PREFIX + b"hits": str(info.hits).encode(),
        }

    def room(self) -> Room:
        facts = self.store.statistics()
        return Room(facts.capacity_bytes, facts.free_bytes, facts.pages)

    # ---- directories ---------------------------------------------------------------

    def mkdir(self, parent_inode: int, name: bytes) -> Stat:
        parent = self._writable_dir(parent_inode)
        text = self.publishing.checked_name(name)
        if parent.depth >= names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pool directories hold pages, not directories")
        if text in parent.children or text in parent.pending or self._has_page(parent, text):
            raise FsError(errno.EEXIST, "already exists")
        return self.tree.stat(self.tree.add(parent, text))

    def rmdir(self, parent_inode: int, name: bytes) -> None:
        parent = self._writable_dir(parent_inode)
        if parent is self.tree.root and name == names.CONTROL_DIR.encode():
            raise FsError(errno.EPERM, "the control directory cannot be removed")
        text = name.decode("utf-8", "surrogateescape")
        child = parent.children.get(text)
        if child is None:
            if self._has_page(parent, text):
                raise FsError(errno.ENOTDIR, "not a directory")
            raise FsError(errno.ENOENT, "no such directory")
        # Pages only a named tier holds here count: they answer by name, and would bring it back.
        if child.children or child.pending or self.store.has_directory(child.path):
            raise FsError(errno.ENOTEMPTY, "directory not empty")
        self.tree.remove(parent, child)

    def opendir(self, inode: int) -> DirectoryHandle:
        """A listing of the directory, read from each readdir's offset (``listing``). The
        control directory is reached by name and never listed in the root: find, du and tar c
        of the mount see pages only."""
        if inode == self.control.dir_inode:
            return DirectoryHandle(fixed_listing([(n, self._fixed(self.control.stat(i))) for n, i in self.control.entries()]))
        directory = self._dir(inode)
        self.tree.adopt_held(directory)
        return DirectoryHandle(DirectoryListing(directory, self.store, self).read)

    @staticmethod
    def _fixed(st: Stat):
        return lambda counted: st

    def of_directory(self, directory: Directory):
        return self._fixed(self.tree.stat(directory))

    def of_pending(self, pending: PendingFile):
        def describe(counted: bool) -> Stat:
            pending.nlookup += counted
            return self._pending_stat(pending)

        return describe

    def of_page(self, directory: Directory, key: str, info: PageInfo):
        def describe(counted: bool) -> Stat:
            node = self.nodes.for_name(directory, key, info)
            node.nlookup += counted
            return self._page_stat(node.inode, info)

        return describe

    # ---- files ---------------------------------------------------------------------

    def create(self, parent_inode: int, name: bytes, flags: int, uid: int | None = None) -> tuple[Stat, Handle]:
        """A new file: a temporary (``.``-prefixed) or one created under a key name, by ``uid``."""
        pending = self._new_file(parent_inode, name, uid)
        return self._pending_stat(pending), self.publishing.open(pending, writing=True)

    def make_file(self, parent_inode: int, name: bytes, uid: int | None = None) -> Stat:
        """``create`` without an open (mknod): published at the last close of a writer that opens
        it later; discarded as abandoned if none does within the temporary files' timeout."""
        return self._pending_stat(self._new_file(parent_inode, name, uid))

    def _new_file(self, parent_inode: int, name: bytes, uid: int | None) -> PendingFile:
        parent = self._writable_dir(parent_inode)
        if parent.depth != names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pages are created in pool directories (model/format/shard/pool)")
        visible = not names.is_temporary(name)
        text = self.publishing.checked_name(name, temporary=not visible)
        if text in parent.pending or text in parent.children:
            raise FsError(errno.EEXIST, "already exists")
        if visible and self._has_page(parent, text):
            raise FsError(errno.EEXIST, "page already published; pages are immutable")
        return self.publishing.create(parent, text, visible, uid)

    def open(self, inode: int, flags: int, uid: int = 0, pid: int = 0) -> Handle | NeedsIO:
        """Open a file: a control file's handle, a file being written, or a published page
        (``NeedsIO`` when the page must be read from a lower tier first). ``uid`` and ``pid``:
        the opening thread's (``uid`` decides what its requests may hold).

        An inode stands for one version of a page (``inodes``); an open of one whose name has
        since been given another version, or none, raced a replace or a removal after its
        lookup (``racing_opens`` says how it still finds one of the two pages)."""
        if is_control(inode):
            return self.control.open(inode, flags, publisher=self.publishing, leases=self.leases, uid=uid)
        pending = self.publishing.get(inode)
        if pending is not None:
            # (asked whatever the file: a mark left by a try that lands here would count a later
            # open of the name's retired page by this thread as a second try, and serve it)
            second_try = self.racing.second_try(pid, pending.directory.inode, pending.name)
            if pending.gone:  # reached through a name the kernel has not yet been told is gone or
                # replaced: its lookup again finds what the name holds now, or ENOENT (opening the
                # gone file gave a handle that read EIO; ENOENT here missed a page just put there).
                # The kernel's second try that reaches a gone file again (through /proc/PID/fd,
                # or a name replaced once more) is ENOENT: ESTALE went to the user.
                if second_try:
                    raise FsError(errno.ENOENT, "the file was removed or replaced before it was published")
                raise self.racing.stale(pid, pending.directory.inode, pending.name)
            if flags & os.O_TRUNC:
                pending.truncate(0)
            return self.publishing.open(pending, writing=bool(flags & (os.O_WRONLY | os.O_RDWR)),
                                        bounded=not self.may_change(uid))
        node = self.nodes.get(inode)
        if node is None:
            if self.tree.is_directory(inode):
                raise FsError(errno.EISDIR, "is a directory")
            raise FsError(errno.ENOENT, "page no longer stored")
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise FsError(errno.EPERM, "published pages are immutable")
        second_try = self.racing.second_try(pid, node.directory.inode, node.key)
        if node.retired and not second_try:
            raise self.racing.stale(pid, node.directory.inode, node.key)
        bounded = not self.may_change(uid)
        own = self._own_version(node) if node.retired else None
        if own is not None:
            return PageHandle(self.store, self.leases, own, self.kernel_cache, bounded, node)
        try:
            opened = self.store.try_open(node.directory.page_name(node.key), bounded=bounded)
        except PageNotFound:
            if second_try:
                raise FsError(errno.ENOENT, "page no longer stored") from None
            raise self.racing.stale(pid, node.directory.inode, node.key) from None
        if isinstance(opened, NeedsIO):
            return opened.then(lambda reader: self._page_handle(node, reader, pid, second_try, bounded))
        return self._page_handle(node, opened, pid, second_try, bounded)

    def _page_handle(self, node: PageNode, reader: PageReader, pid: int, second_try: bool,
                     bounded: bool) -> PageHandle:
        """The handle of an open page. The kernel may keep the data of every page (that is what
        makes ``mmap`` work on any page: FUSE maps only files opened without direct I/O), and
        an inode's data is always its own version's: an open that finds the name holding
        another version raced a replace (``racing_opens``)."""
        if not node.retired and reader.info.version == node.info.version:
            return PageHandle(self.store, self.leases, reader, self.kernel_cache, bounded, node)
        if not node.retired:
            self.nodes.retire(node)
            self.notices.forget_attributes(node.inode)
        if not second_try:
            reader.close()
            raise self.racing.stale(pid, node.directory.inode, node.key)
        try:
            own = self._own_version(node)
        except FsError:
            reader.close()  # a copy read from a lower tier held its bytes, and its share, for good
            raise
        if own is not None:
            reader.close()
            return PageHandle(self.store, self.leases, own, self.kernel_cache, bounded, node)
        return PageHandle(self.store, self.leases, reader, False, bounded)

    def _own_version(self, node: PageNode) -> PageReader | None:
        """The retired inode's own page, for the second try of an open that landed on it again
        (another replace raced the kernel's new lookup, or ``/proc/PID/fd/N``): another open
        file of the inode that still pins that version shares its pin. While files are open on
        the inode that no longer pin it (their reads come from the kernel's cache), the open
        fails with EIO, as their next read from the daemon would: that version is no longer
        stored under the name. Served the name's page instead, past the kernel's cache, the
        open's private mappings filled the inode's cache with that page, which those open files
        then read, and a shorter one cut the inode's size under them. None: no file is open on
        the inode (the open is then served the name's page, past the cache)."""
        open_on_it = False
        for handle in node.opened:  # (its own files only: any user may open many others')
            if handle.version == node.info.version:
                if handle.reader is not None:
                    return handle.reader.duplicate()
                open_on_it = True
        if open_on_it:
            raise FsError(errno.EIO, "the page the files open on it were opened on is no longer stored")
        return None

    def truncate(self, inode: int, size: int) -> Stat:
        pending = self.publishing.get(inode)
        if pending is None:
            if self.nodes.get(inode) is not None:
                raise FsError(errno.EPERM, "published pages are immutable")
            raise FsError(errno.EACCES, "cannot be truncated")
        pending.truncate(size)
        return self._pending_stat(pending)

    def unlink(self, parent_inode: int, name: bytes) -> None | NeedsIO:
        """Remove a file; a page goes from every tier (``NeedsIO`` for those that block)."""
        parent = self._writable_dir(parent_inode)
        text = name.decode("utf-8", "surrogateescape")
        if text in parent.children:
            raise FsError(errno.EISDIR, "is a directory")
        if text in parent.pending:
            self.publishing.unlink(parent, text)
            return None
        page = self.tree.page_name(parent, text)
        removed = False if page is None else self.store.remove(page)
        self.nodes.detach(parent, text)
        if isinstance(removed, NeedsIO):
            return removed.then(lambda gone: self._unlinked(parent, gone))
        return self._unlinked(parent, removed)

    @staticmethod
    def _unlinked(parent: Directory, removed: bool) -> None:
        if not removed:
            raise FsError(errno.ENOENT, "no such page")
        parent.mtime_ns = time.time_ns()

    def rename(self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int) -> None | NeedsIO:
        """Publish a temporary file under its key, move a file still being written under its key
        (it is published at its last close, as created), or move a page; directories are not moved."""
        source_dir = self._writable_dir(old_parent)
        target_dir = self._writable_dir(new_parent)
        old_text = old.decode("utf-8", "surrogateescape")
        if old_text in source_dir.children:
            raise FsError(errno.EXDEV, "directories are not renamed; copy instead")
        if target_dir.depth != names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pages live in pool directories (model/format/shard/pool)")
        if names.is_temporary(new):  # (EINVAL, a bad name's errno, is a move into itself to rename's callers)
            raise FsError(errno.EPERM, "a rename cannot give a temporary name: such files are made by create")
        new_text = self.publishing.checked_name(new)
        if new_text in target_dir.children:
            raise FsError(errno.EISDIR, "target is a directory")
        if flags & RENAME_EXCHANGE:
            raise FsError(errno.EINVAL, "exchanging pages is not supported")
        if flags & RENAME_NOREPLACE and (self._has_page(target_dir, new_text) or new_text in target_dir.pending):
            raise FsError(errno.EEXIST, "target exists")
        if source_dir is target_dir and old_text == new_text:
            return None  # onto itself: nothing changes (the kernel does not ask; a caller may)
        pending = source_dir.pending.get(old_text)
        if pending is not None:
            if pending.visible and pending.writers > 0:  # published at its last close, as created
                return self._move_pending(pending, target_dir, new_text)
            self.publishing.publish(pending, target_dir, new_text)
            return None
        source = self.tree.page_name(source_dir, old_text)
        if source is None or self.store.lookup(source) is None:
            raise FsError(errno.ENOENT, "no such page")
        moved = self.store.rename(source, target_dir.page_name(new_text))
        if isinstance(moved, NeedsIO):
            return moved.then(lambda info: self._moved(source_dir, old_text, target_dir, new_text))
        return self._moved(source_dir, old_text, target_dir, new_text)

    def _move_pending(self, pending: PendingFile, target: Directory, new: str) -> None | NeedsIO:
        """A file created under a key, still being written, takes another name: what that name
        held goes, and the file is published there at its last writer's close."""
        self.publishing.displace(target, new)
        page = self.tree.page_name(target, new)
        removed = self.store.remove(page) if self._has_page(target, new) else None
        self.publishing.retire_old(target, new)
        del pending.directory.pending[pending.name]
        pending.directory.mtime_ns = target.mtime_ns = time.time_ns()
        pending.directory, pending.name = target, new
        target.pending[new] = pending
        return removed.then(lambda gone: None) if isinstance(removed, NeedsIO) else None

    def _moved(self, source: Directory, old: str, target: Directory, new: str) -> None:
        """The page now lives under its new name (the same version): the kernel's inode for it
        follows it there, and what the name held before is replaced."""
        self.publishing.displace(target, new)
        self.nodes.detach(target, new)
        node = self.nodes.named(source, old)
        if node is not None:
            self.nodes.move(node, target, new)
        source.mtime_ns = target.mtime_ns = time.time_ns()

    def pages_gone(self, gone: list[tuple[str, tuple[str, int]]]) -> None:
        """The store dropped these pages (name, version) on its own (eviction, a failed
        checksum): the kernel forgets their names, and the inodes it knows for them stop naming
        pages. A report that comes after the name was given another page leaves that page's
        inode alone (reports made on the store's threads reach the event loop later). Called
        with the store's lock held: it must not call the store."""
        for name, version in gone:
            path, _, key = name.rpartition("/")
            directory = self.tree.at(path)
            node = None if directory is None else self.nodes.named(directory, key)
            if node is None or node.info.version != version:  # no inode for that version
                continue
            self.nodes.retire(node)
            self.notices.forget_entry(directory.inode, key.encode("utf-8", "surrogateescape"))
            self.notices.forget_inode(node.inode)

    @property
    def temp_timeout_s(self) -> float:
        """Seconds after its last writer's close that an unpublished temporary file is discarded."""
        return self.publishing.temp_timeout_s

    def reap_abandoned(self, now: float | None = None) -> int:
        return self.publishing.reap_abandoned(now)

    def pending_count(self) -> int:
        return self.publishing.count()

    def page_inodes(self) -> int:
        """Published pages the daemon holds an inode for."""
        return len(self.nodes)

    # ---- internals -----------------------------------------------------------------

    def _has_page(self, directory: Directory, key: str) -> bool:
        page = self.tree.page_name(directory, key)
        return page is not None and self.store.info(page) is not None

    def _dir(self, inode: int) -> Directory:
        directory = self.tree.get(inode)
        if directory is None:
            known = self.nodes.get(inode) is not None or self.publishing.get(inode) is not None
            raise FsError(errno.ENOTDIR if known else errno.ENOENT, "not a directory")
        return directory

    def _writable_dir(self, inode: int) -> Directory:
        if is_control(inode):
            raise FsError(errno.EPERM, "control files cannot be changed")
        return self._dir(inode)

    def _page_stat(self, inode: int, info: PageInfo, nlink: int = 1) -> Stat:
        return Stat(inode, FILE_MODE, info.size, nlink, info.mtime_ns, info.atime_ns, volatile=not info.held_here,
                    allocated=self.store.allocated(info))

    @staticmethod
    def _pending_stat(pending: PendingFile) -> Stat:
        return Stat(pending.inode, FILE_MODE, pending.size, 0 if pending.gone else 1, pending.mtime_ns, pending.mtime_ns)


__all__ = ["ROOT_INODE", "RENAME_EXCHANGE", "RENAME_NOREPLACE", "Namespace", "Room"]
