"""Client objects made fresh in a forked child, for the parent's sake as much as the child's.

A child forked from a process using the client inherits its descriptors, but none of its
threads: a lock another thread held stays held, a commit that thread was sending never ends,
and a handle on a control file is the same open file at the daemon as the parent's, holding the
same reserved slots, which parent and child would then both write. So each such object is told
``forked()`` in the child before it runs anything else (``os.register_at_fork``), and lets go of
what was the parent's: it closes the child's copies of the descriptors (the parent's stay
open), makes new locks, and forgets threads and work under way.

Thread-safe.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class Renewed(Protocol):
    def forked(self) -> None: ...


_renewed: "weakref.WeakSet[Renewed]" = weakref.WeakSet()


def renew_in_child(thing: Renewed) -> None:
    """Call ``thing.forked()`` in every child forked from this process while it lives."""
    _renewed.add(thing)


def _after_fork_in_child() -> None:
    for thing in list(_renewed):
        thing.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
