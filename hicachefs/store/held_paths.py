"""Which directory paths have pages below them, asked in one dictionary lookup, and the
subdirectories of a path that do.

The namespace asks it for every name it does not know above the pool level (a lookup of a
missing name, any user's): a scan of every directory ever used cost each such lookup O(directories),
5-20 times slower after tens of thousands of pools had come and gone (found by review). So each
directory holding pages counts once for its own path and for each of its ancestors', and a path
is held while its count is not 0. A listing asks for the subdirectories: pages that came in by a
fetch or a promotion, not by a write through the namespace, have no directory made for them
until then (found by review: `ls`, `find` and `rm -r` of a model missed them). Not thread-safe:
its owner's lock guards it.
"""

from __future__ import annotations


class HeldPaths:
    """The paths of the directories holding pages, and of every one of their ancestors."""

    def __init__(self) -> None:
        self._below: dict[str, int] = {}  # path -> directories holding pages at or below it
        self._children: dict[str, set[str]] = {}  # path -> names of its subdirectories held
        self._directories: set[str] = set()  # the directories counted as holding pages

    def holds(self, path: str) -> bool:
        """Whether a directory holding pages is ``path`` or lies below it."""
        return path in self._below

    def children(self, path: str) -> list[str]:
        """The names of ``path``'s subdirectories that are held (``""``: the root's)."""
        return list(self._children.get(path, ()))

    def mark(self, directory: str, holds: bool) -> None:
        """``directory`` holds pages now or not, whatever it held before (``gained``/``lost`` for
        an owner that knows which it was)."""
        if holds != (directory in self._directories):
            (self.gained if holds else self.lost)(directory)

    def gained(self, directory: str) -> None:
        """``directory`` holds pages now (it held none)."""
        self._directories.add(directory)
        below = self._below
        for path in _ancestry(directory):
            count = below.get(path, 0)
            below[path] = count + 1
            if not count:
                parent, _, name = path.rpartition("/")
                self._children.setdefault(parent, set()).add(name)

    def lost(self, directory: str) -> None:
        """``directory`` holds no page now (it held some)."""
        self._directories.discard(directory)
        below = self._below
        for path in _ancestry(directory):
            left = below[path] - 1
            if left:
                below[path] = left
                continue
            del below[path]
            parent, _, name = path.rpartition("/")
            siblings = self._children[parent]
            siblings.discard(name)
            if not siblings:
                del self._children[parent]


def _ancestry(directory: str) -> list[str]:
    """``a/b/c`` -> ``a``, ``a/b``, ``a/b/c``."""
    parts = directory.split("/")
    return ["/".join(parts[: depth + 1]) for depth in range(len(parts))]
