"""The pages whose plane commits are under way in this process (``plane.py``: a write returns
before its commit is answered), so that the process's lookups of them wait for it: one record
per daemon (``of`` its store's token), whatever path each client names its mount by (a symbolic
link, a bind mount: the same daemon), and none shared by two mounts (a client of one must not
wait on commits to another's hung daemon).

Thread-safe.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Sequence

from . import forks


class CommitsUnderWay:
    """The pages whose commits to one daemon are under way in this process: every client of it
    in this process waits for them before it looks one up, so it sees what this process wrote
    as soon as the write returned."""

    _of: Dict[bytes, "CommitsUnderWay"] = {}
    _of_lock = threading.Lock()

    @classmethod
    def of(cls, token: bytes) -> "CommitsUnderWay":
        """The record of the daemon whose store's token is ``token`` (a few a process: one for
        each daemon its clients met)."""
        with cls._of_lock:
            return cls._of.setdefault(token, cls())

    def __init__(self) -> None:
        self._count: Dict[str, int] = {}  # page path -> commits of it under way
        self._changed = threading.Condition()
        forks.renew_in_child(self)

    def forked(self) -> None:
        """In a forked child: the commits under way are the parent's threads', which it lacks."""
        self._count, self._changed = {}, threading.Condition()

    def add(self, rels: Sequence[str]) -> None:
        with self._changed:
            for rel in rels:
                self._count[rel] = self._count.get(rel, 0) + 1

    def done(self, rels: Sequence[str]) -> None:
        with self._changed:
            for rel in rels:
                left = self._count.pop(rel) - 1
                if left:
                    self._count[rel] = left
            self._changed.notify_all()

    def wait(self, rels: Sequence[str]) -> None:
        """Until no commit of these pages is under way."""
        if self._count:  # read without the lock: the usual case, none under way, costs nothing
            with self._changed:
                self._changed.wait_for(lambda: not any(rel in self._count for rel in rels))

    def wait_in(self, directory: str, keys: Sequence[str]) -> None:
        """``wait`` for the pages ``keys`` of ``directory`` (their paths made only when needed)."""
        if self._count:
            self.wait([f"{directory}/{key}" for key in keys])

    def wait_all(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: not self._count)


def _renew_the_records_lock() -> None:
    """In a forked child: a thread of the parent's may have held it at the fork, in ``of``."""
    CommitsUnderWay._of_lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_the_records_lock)
