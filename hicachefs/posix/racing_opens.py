"""Opens that raced a replace of their page's name, and the kernel's second try of each.

An inode stands for one version of a page (``inodes``). A process looks a name up, then opens
what it found; a replace of the name in between leaves it opening an inode that no longer stands
for the name's page. That open gets ESTALE, and the kernel then walks the path again with fresh
lookups (once: ``do_filp_open`` retries a path walk that met ESTALE with ``LOOKUP_REVAL``) and
opens the inode the name now leads to, so the process finds one of the two pages, cacheable as
any.

The second try can race another replace too (measured on the development VM with two readers
and a writer replacing one name every 3 ms: 6 % of second tries did, 0.6 % of all opens). So a
process answered ESTALE for a name is remembered, and its next open of that name still opens
when the name holds another version than the inode stands for: the inode's own version when
another open file of it still pins that (``Namespace._own_version``), else the name's page, read
past the kernel's cache (the inode's cached data and size are its own version's). Such an open
of the name's page cannot be mapped shared (FUSE maps only files opened without direct I/O);
every other open of a page can.

Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import errno
from collections import OrderedDict

from .errors import FsError

#: Opens answered ESTALE whose second try has not come yet (a process killed in between never
#: sends it); past this many the oldest are forgotten.
MAX_WAITING = 1024


class RacingOpens:
    """See the module docstring. ``pid`` is the opening thread's, as FUSE requests carry it."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self.max_waiting = max_waiting
        self._waiting: OrderedDict[tuple[int, int, str], None] = OrderedDict()

    def stale(self, pid: int, directory_inode: int, key: str) -> FsError:
        """The error for an open that raced a replace of ``key`` in that directory."""
        self._waiting[(pid, directory_inode, key)] = None
        while len(self._waiting) > self.max_waiting:
            self._waiting.popitem(last=False)
        return FsError(errno.ESTALE, "the page was replaced or removed since its name was looked up; "
                                     "the kernel looks the name up again")

    def second_try(self, pid: int, directory_inode: int, key: str) -> bool:
        """Whether this open is the kernel's second try of one answered ESTALE (asked once)."""
        return self._waiting.pop((pid, directory_inode, key), False) is None
