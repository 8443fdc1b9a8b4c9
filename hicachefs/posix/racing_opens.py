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

A second try that never comes must not leave its mark: the retry's lookup may find the name gone
(the page evicted or removed), and no open follows. A later open of that name by the thread,
landing on a retired inode, would then be taken for a second try and fail with EIO, or be
served the name's page past the cache, where ESTALE was its answer. So a lookup of the name by
that thread that finds nothing forgets it, and a second try counts only within ``SECOND_TRY_S``
of its ESTALE (the kernel's follows within milliseconds; a loaded host may take longer).

Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import errno
import time
from collections import OrderedDict
from collections.abc import Callable

from .errors import FsError

#: Opens answered ESTALE whose second try has not come yet (a process killed in between never
#: sends it); past this many the oldest are forgotten.
MAX_WAITING = 1024
#: Seconds after its ESTALE that an open still counts as the kernel's second try.
SECOND_TRY_S = 5.0


class RacingOpens:
    """See the module docstring. ``pid`` is the opening thread's, as FUSE requests carry it."""

    def __init__(self, max_waiting: int = MAX_WAITING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_waiting = max_waiting
        self.clock = clock
        #: When each open waiting for its second try was answered ESTALE, oldest first.
        self._waiting: OrderedDict[tuple[int, int, str], float] = OrderedDict()

    def stale(self, pid: int, directory_inode: int, key: str) -> FsError:
        """The error for an open that raced a replace of ``key`` in that directory."""
        now = self.clock()
        self._waiting.pop((pid, directory_inode, key), None)
        self._waiting[(pid, directory_inode, key)] = now
        while self._waiting and (len(self._waiting) > self.max_waiting
                                 or next(iter(self._waiting.values())) < now - SECOND_TRY_S):
            self._waiting.popitem(last=False)
        return FsError(errno.ESTALE, "the page was replaced or removed since its name was looked up; "
                                     "the kernel looks the name up again")

    def second_try(self, pid: int, directory_inode: int, key: str) -> bool:
        """Whether this open is the kernel's second try of one answered ESTALE (asked once)."""
        answered = self._waiting.pop((pid, directory_inode, key), None)
        return answered is not None and self.clock() - answered <= SECOND_TRY_S

    def missed(self, pid: int, directory_inode: int, key: str) -> None:
        """A lookup of ``key`` by this thread found nothing: no second try of its open follows."""
        self._waiting.pop((pid, directory_inode, key), None)
