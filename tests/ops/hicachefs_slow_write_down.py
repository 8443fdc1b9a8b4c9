"""``hicachefs mount --foreground`` whose write-down of the RAM tier at close is slowed: each page
waits SECONDS before it is written down. Run as ``python hicachefs_slow_write_down.py SECONDS
MOUNTPOINT FLAGS...``; the daemon is this process."""

from __future__ import annotations

import sys
import time

from hicachefs.cli import main
from hicachefs.store.store import PageStore

delay = float(sys.argv[1])
write_below = PageStore._write_below


def slowed(self, *args, **kwargs):
    if self._closed:  # the write-down at close, not a demotion while serving
        time.sleep(delay)
    return write_below(self, *args, **kwargs)


PageStore._write_below = slowed
sys.exit(main(["mount", *sys.argv[2:], "--foreground"]))
