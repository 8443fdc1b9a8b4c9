"""Inode numbers, and the published pages the kernel knows by one.

The store holds pages by name; the kernel holds inodes. A page gets a ``PageNode`` (an inode
number) when the kernel first learns its name (a lookup, a listing entry, the file it was
written as) and loses it when the kernel forgets it (``forget`` with its lookup count). Numbers
are never reused while the daemon runs.

An inode stands for one version of a page: once its name leads to another version (a replace)
or to none (unlink, eviction), the node is retired: it names nothing from then on, and a lookup
of the name gets a node of its own. So what the kernel caches for an inode (attributes, data)
is never another version's. Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import itertools

from ..store import PageInfo
from .nodes import Directory, PageNode

ROOT_INODE = 1
#: The control files' inodes (the directory ``.hicachefs`` and what is in it, ``control/``) are
#: from CONTROL_DIR_INODE up to FIRST_PAGE_INODE; directories and pages have the numbers above.
CONTROL_DIR_INODE = 2
FIRST_PAGE_INODE = 1024


def is_control(inode: int) -> bool:
    """Whether ``inode`` is one of the control files' (or their directory)."""
    return CONTROL_DIR_INODE <= inode < FIRST_PAGE_INODE


class InodeNumbers:
    """Hands out inode numbers after the root's and the control files'."""

    def __init__(self) -> None:
        self._next = itertools.count(FIRST_PAGE_INODE)

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
        """The node of the page version ``info`` under the name: the kernel's, or one made
        with a new inode (the name's old node, of another version, is retired)."""
        node = self._by_name.get((directory.inode, key))
        if node is not None and node.info.version != info.version:
            self.retire(node)
            node = None
        if node is None:
            node = PageNode(self.numbers.new(), directory, key, info)
            self._by_inode[node.inode] = node
            self._by_name[(directory.inode, key)] = node
        return node

    def adopt(self, node: PageNode) -> None:
        """A node made elsewhere (the file being written became this page) now names its page."""
        self._by_inode[node.inode] = node
        self._by_name[(node.directory.inode, node.key)] = node

    def detach(self, directory: Directory, key: str) -> PageNode | None:
        """The name no longer leads to the page the kernel holds a node for (unlinked, evicted,
        replaced): that node, if any, is retired. Returns it."""
        node = self._by_name.get((directory.inode, key))
        if node is not None:
            self.retire(node)
        return node

    def retire(self, node: PageNode) -> None:
        """The node names nothing from now on; files still open on it keep its attributes."""
        self._drop_name(node)
        node.retired = True

    def move(self, node: PageNode, directory: Directory, key: str) -> None:
        """The node's page is now at another name (a page renamed)."""
        self._drop_name(node)
        node.directory, node.key = directory, key
        self._by_name[(directory.inode, key)] = node

    def _drop_name(self, node: PageNode) -> None:
        if self._by_name.get((node.directory.inode, node.key)) is node:
            del self._by_name[(node.directory.inode, node.key)]

    def __len__(self) -> int:
        return len(self._by_inode)

    def not_taken(self, inode: int) -> None:
        """A listing offered the inode and the kernel did not take it: a node it holds no
        lookup of is let go (a listing cut short left one for each entry its last reply
        offered past the reader's buffer, until the page went and for good after)."""
        node = self._by_inode.get(inode)
        if node is not None and node.nlookup <= 0:
            del self._by_inode[inode]
            self._drop_name(node)

    def forget(self, inode: int, nlookup: int) -> bool:
        """The kernel dropped ``nlookup`` references; False if the inode is not a page's."""
        node = self._by_inode.get(inode)
        if node is None:
            return False
        node.nlookup -= nlookup
        if node.nlookup <= 0:
            del self._by_inode[inode]
            self._drop_name(node)
        return True
