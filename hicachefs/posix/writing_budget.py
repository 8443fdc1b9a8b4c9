"""How much the files being written may hold, together: the RAM budget's ``writing`` share (half
of ``--memory``), whether their bytes are in a store draft (room in the RAM tier, made by evicting
published pages) or staged in the daemon's heap (a file whose size was not announced).

Why: before this bound, 1,500 temporary files closed but never renamed evicted all 500
published pages of a 64 MiB mount, and 300 files of no announced size took the daemon's heap
from 108 MiB to 1.3 GiB. A write or ``ftruncate`` that would take the total past the bound fails
at once with ENOSPC, so published pages keep at least the rest of the tier.

Why half: SGLang's writers have a batch of pages in flight at once (a few MiB per rank), far
below half of any useful ``--memory``; half leaves the other half to the pages being read, and
bounds the heap the daemon may take for staging to half of what the operator gave the store.

Not thread-safe: the daemon's trio thread only.
"""

from __future__ import annotations

import errno

from ..store.budget import Share
from .errors import FsError


class WritingBudget:
    """Bytes held by files being written (and the data plane's reservations), within the RAM
    budget's ``writing`` share (``store.budget``)."""

    def __init__(self, share: Share) -> None:
        self.share = share

    @property
    def limit(self) -> int:
        return self.share.limit

    @property
    def held(self) -> int:
        return self.share.held

    def change(self, delta: int) -> None:
        """Take (``delta`` > 0) or give back; FsError ENOSPC, taking nothing, past the limit."""
        if delta <= 0:
            self.share.give_back(-delta)
        elif not self.share.take(delta):
            raise FsError(errno.ENOSPC, f"files being written hold {self.held:,} bytes of the "
                                        f"{self.limit:,} they may (half of --memory)")
