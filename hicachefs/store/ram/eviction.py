"""Eviction policies: which RAM page leaves first. The RAM tier is given one.

Not thread-safe: the store's lock guards every call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator


class LruPolicy:
    """Least recently used first. Keys are index rows (ints). About 100 bytes per RAM page
    (an OrderedDict node); RAM pages are few next to disk pages, which carry no such cost."""

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def admit(self, row: int) -> None:
        """A page entered the tier: it is the most recent."""
        self._order[row] = None

    def touch(self, row: int) -> None:
        """A page was read: it becomes the most recent."""
        self._order.move_to_end(row)

    def forget(self, row: int) -> None:
        """A page left the tier."""
        self._order.pop(row, None)

    def in_order(self) -> Iterator[int]:
        """The pages, the next victim first (lazily: stop iterating before changing the policy)."""
        return iter(self._order)

    def oldest_first(self) -> Iterator[int]:
        """A snapshot of the pages, the next victim first."""
        return iter(list(self._order))
