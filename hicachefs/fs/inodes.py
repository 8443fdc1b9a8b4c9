"""Inode numbers, and the published pages the kernel knows by one.

The store holds pages by name; the kernel holds inodes. A page gets a ``PageNode`` (an inode
number) when the kernel first learns its name (a lookup, a listing entry, the file it was
written as) and loses it when the kernel forgets it (``forget`` with its lookup count). Numbers
are never reused while the daemon runs. Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import itertools

from ..store import PageInfo
from .control import CONTROL_INODES
from .nodes import Directory, PageNode

ROOT_INODE = 1


class InodeNumbers:
    """Hands out inode numbers after the root's and the control files'."""

    def __init__(self) -> None:
        self._next = itertools.count(max(CONTROL_INODES) + 1)

    def new(self) -> int:
        return next(self._next)


class PageNodes:
    """The published pages the kernel holds inodes for, by inode and by (directory, key)."""

    def __init__(self, numbers: InodeNumbers) -> None:
        self.numbers = numbers
        self._by_inode: dict[int, PageNode] = {}
        self._by_name: dict[tuple[int, str], PageNode] = {}

    def get(self, inode: int) -> PageNode | None:
        return self._by_inode.get(inode)

    def named(self, directory: Directory, key: str) -> PageNode | None:
        """The node the kernel reaches by this name, if it holds one."""
        return self._by_name.get((directory.inode, key))

    def for_name(self, directory: Directory, key: str, info: PageInfo) -> PageNode:
        """The name's node, made (with a new inode) if the kernel holds none."""
        node = self._by_name.get((directory.inode, key))
        if node is None:
            node = PageNode(self.numbers.new(), directory, key, info)
            self._by_inode[node.inode] = node
            self._by_name[(directory.inode, key)] = node
        return node

    def adopt(self, node: PageNode) -> None:
        """A node made elsewhere (the file being written became this page) now names its page."""
        self._by_inode[node.inode] = node
        self._by_name[(node.directory.inode, node.key)] = node

    def unname(self, directory: Directory, key: str) -> PageNode | None:
        """The name no longer leads to the node the kernel held for it (it was replaced, or the
        page moved); the node stays, reachable by inode. Returns it."""
        return self._by_name.pop((directory.inode, key), None)

    def detach(self, directory: Directory, key: str) -> PageNode | None:
        """The name no longer names a page (unlinked, evicted): its node, if any, names nothing
        from now on (files still open keep the attributes they had)."""
        node = self._by_name.pop((directory.inode, key), None)
        if node is not None:
            node.directory = None
        return node

    def move(self, node: PageNode, directory: Directory, key: str) -> None:
        """The node's page is now at another name (a page renamed)."""
        if node.directory is not None and self._by_name.get((node.directory.inode, node.key)) is node:
            del self._by_name[(node.directory.inode, node.key)]
        node.directory, node.key = directory, key
        self._by_name[(directory.inode, key)] = node

    def forget(self, inode: int, nlookup: int) -> bool:
        """The kernel dropped ``nlookup`` references; False if the inode is not a page's."""
        node = self._by_inode.get(inode)
        if node is None:
            return False
        node.nlookup -= nlookup
        if node.nlookup <= 0:
            del self._by_inode[inode]
            if node.directory is not None and self._by_name.get((node.directory.inode, node.key)) is node:
                del self._by_name[(node.directory.inode, node.key)]
        return True
