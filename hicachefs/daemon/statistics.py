"""The daemon's statistics: the store's, and what only the daemon knows (FUSE requests answered
and refused, files being written, what it told the kernel), as one typed value.

``as_dict`` is ``.hicachefs/stats``; ``metrics.py`` exports the same value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..fuse.kernel_notifier import KernelCacheStatistics
from ..store import StoreStatistics
from ..typed_stats import as_dict


@dataclass(frozen=True)
class DaemonStatistics:
    """``errors``: requests refused, by errno name; ``errors_by_user``: the same by the uid of
    their sender and kind (``posix/refusal_log.py``); ``errors_not_logged``: refusals that made no
    log line (past the first of each kind and user, one line in 10 s at most); ``requests``:
    FUSE requests answered, by operation; ``pending_files``: files being written that are not
    published yet; ``page_inodes``: published pages the daemon holds an inode for (the kernel
    looked them up or listed them and has not forgotten them); ``daemon``: which daemon counted
    all this (its pid and the Unix time it started at), so that a reader comparing two reads
    (``hicachefs top``) knows whether its counters went on or started again from zero."""

    store: StoreStatistics
    errors: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    pending_files: int = 0
    kernel_cache: KernelCacheStatistics = field(default_factory=KernelCacheStatistics)
    errors_by_user: dict[str, dict[str, int]] = field(default_factory=dict)
    errors_not_logged: int = 0
    page_inodes: int = 0
    daemon: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {**self.store.as_dict(), "errors": dict(self.errors),
                "errors_by_user": {uid: dict(kinds) for uid, kinds in self.errors_by_user.items()},
                "errors_not_logged": self.errors_not_logged, "requests": dict(self.requests),
                "pending_files": self.pending_files, "page_inodes": self.page_inodes,
                "kernel_cache": as_dict(self.kernel_cache), "daemon": dict(self.daemon)}
