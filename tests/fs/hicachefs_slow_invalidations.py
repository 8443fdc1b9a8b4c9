"""``hicachefs mount --foreground`` whose invalidations in the kernel's cache come late, as on a
loaded host where the notifier's threads get no CPU at once: each of a name waits NAMES_S
first, each of an inode INODES_S. Run as ``python hicachefs_slow_invalidations.py NAMES_S
INODES_S MOUNTPOINT FLAGS...``; the daemon is this process."""

from __future__ import annotations

import sys
import time

import pyfuse3

from hicachefs.cli import main


def slowed(invalidate, delay: float):
    def late(*args, **kwargs):
        time.sleep(delay)
        return invalidate(*args, **kwargs)

    return late


pyfuse3.invalidate_entry = slowed(pyfuse3.invalidate_entry, float(sys.argv[1]))
pyfuse3.invalidate_inode = slowed(pyfuse3.invalidate_inode, float(sys.argv[2]))
sys.exit(main(["mount", *sys.argv[3:], "--foreground"]))
