"""The directory tree ``<model>/<format>/<shard>/<pool>``: made by ``mkdir``, by the pages the
store holds when the daemon starts, and found where other hosts put pages (a directory the store
knows of but this tree does not yet is made on its first lookup, as ``mkdir`` would).

Pages are not kept here: a pool directory's pages are the store's names under its path. Not
thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import errno
import stat
import time

from .. import names
from ..store import PageStore
from .errors import FsError
from .inodes import ROOT_INODE, InodeNumbers
from .nodes import Directory, Stat

DIR_MODE = stat.S_IFDIR | 0o755


class DirectoryTree:
    """The mount's directories by inode and by path. See the module docstring."""

    def __init__(self, store: PageStore, numbers: InodeNumbers) -> None:
        self.store = store
        self.numbers = numbers
        self.root = Directory(ROOT_INODE, "", 0, None)
        self._by_inode: dict[int, Directory] = {ROOT_INODE: self.root}
        self._by_path: dict[str, Directory] = {"": self.root}
        for path in store.directories():
            self.make_path(path)

    def get(self, inode: int) -> Directory | None:
        directory = self._by_inode.get(inode)
        return None if directory is None or directory.removed else directory

    def at(self, path: str) -> Directory | None:
        return self._by_path.get(path)

    def child(self, parent: Directory, name: str) -> Directory | None:
        """The subdirectory ``name``: one made here, or one the store holds pages under."""
        child = parent.children.get(name)
        if child is not None or parent.depth >= names.POOL_DEPTH:
            return child
        try:
            names.check_component(name.encode("utf-8", "surrogateescape"))
        except (names.BadName, UnicodeEncodeError):
            return None
        path = f"{parent.path}/{name}" if parent.path else name
        return self.add(parent, name) if self.store.has_directory(path) else None

    def add(self, parent: Directory, name: str) -> Directory:
        path = f"{parent.path}/{name}" if parent.path else name
        child = Directory(self.numbers.new(), path, parent.depth + 1, parent)
        parent.children[name] = child
        parent.mtime_ns = child.mtime_ns
        self._by_inode[child.inode] = child
        self._by_path[path] = child
        return child

    def remove(self, parent: Directory, child: Directory) -> None:
        del parent.children[child.path.rsplit("/", 1)[-1]]
        del self._by_path[child.path]
        del self._by_inode[child.inode]  # its number is never used again: asks of it find nothing
        child.removed = True
        parent.mtime_ns = time.time_ns()

    def adopt_held(self, directory: Directory) -> None:
        """Make the subdirectories of ``directory`` under which the store holds pages that came
        without a directory made (fetched from the shared tier, promoted): a listing shows them."""
        if directory.depth < names.POOL_DEPTH:
            for name in self.store.held_subdirectories(directory.path):
                if name not in directory.children:
                    self.add(directory, name)

    def make_path(self, path: str) -> None:
        directory = self.root
        for part in path.split("/"):
            directory = directory.children.get(part) or self.add(directory, part)

    def is_directory(self, inode: int) -> bool:
        return inode in self._by_inode

    @staticmethod
    def stat(directory: Directory) -> Stat:
        return Stat(directory.inode, DIR_MODE, 0, 2 + len(directory.children),
                    directory.mtime_ns, directory.mtime_ns)

    @staticmethod
    def page_name(directory: Directory, key: str) -> str | None:
        """The store's name for page ``key`` of a directory, or None if no page can have it."""
        if directory.depth != names.POOL_DEPTH:
            return None
        try:
            names.check_component(key.encode("utf-8"))
        except (names.BadName, UnicodeEncodeError):
            return None
        return directory.page_name(key)

    def pool_and_key(self, path: str) -> tuple[Directory, str]:
        """The pool directory and key of a page path; FsError when it cannot name a page."""
        dir_path, _, key = path.rpartition("/")
        directory = self._by_path.get(dir_path)
        if directory is None or directory.removed:
            raise FsError(errno.ENOENT, f"no directory {dir_path!r}")
        if directory.depth != names.POOL_DEPTH:
            raise FsError(errno.EPERM, "pages live in pool directories (model/format/shard/pool)")
        try:
            key = names.check_component(key.encode("utf-8", "surrogateescape"))
        except names.BadName as exc:
            raise FsError(exc.errno, str(exc)) from None
        if key in directory.children:
            raise FsError(errno.EISDIR, "a directory has that name")
        return directory, key
