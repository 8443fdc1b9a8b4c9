"""``hicachefs mount --foreground`` whose write-down of the RAM tier at close is slowed: each page
waits SECONDS before it is written down; with no disk tier, the store's close works SECONDS (on
the CPU, as freeing a large arena does). Run as ``python hicachefs_slow_write_down.py SECONDS
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


def slowed_close(self):
    if self.config.disk_dir is None:
        busy_until = time.monotonic() + delay
        while time.monotonic() < busy_until:
            pass
    return close(self)


close = PageStore.close
PageStore._write_below = slowed
PageStore.close = slowed_close
sys.exit(main(["mount", *sys.argv[2:], "--foreground"]))
