"""``hicachefs umount``: SIGTERM to the daemon, which unmounts and exits; a mount whose daemon is
gone is removed, and one whose daemon does not answer, answers its config read with an error,
or does not act has its FUSE connection aborted first. Blocks until the daemon is gone, for at
most ``UMOUNT_TIMEOUT_S``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import time
from pathlib import Path

from .. import deadline, mount_table
from .arguments import UsageError

UMOUNT_TIMEOUT_S = 60.0
#: After SIGTERM a daemon finishes the requests in flight and unmounts at once (writing the RAM
#: tier down comes after); a mount still there after this long has a daemon that cannot act.
UNMOUNT_AFTER_SIGTERM_S = 10.0


def command(args: argparse.Namespace) -> int:
    mountpoint = mount_table.resolve(args.mountpoint)
    fstype = mount_table.filesystem_type(mountpoint)
    if fstype is None:
        raise UsageError(f"{args.mountpoint} is not mounted")
    if fstype != mount_table.FSTYPE:
        raise UsageError(f"{args.mountpoint} is a {fstype} mount, not hicachefs")
    try:
        pid = json.loads(deadline.read_bytes(Path(mountpoint, ".hicachefs", "config")))["pid"]
    except deadline.NoAnswer as exc:
        return _abort_and_remove(mountpoint, exc.about(mountpoint))
    except OSError as exc:
        if exc.errno not in mount_table.DEAD_ERRNOS:  # a daemon that answers, but not as one should
            return _abort_and_remove(mountpoint, f"{mountpoint}: its daemon answered the read of its config "
                                                 f"with {errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})")
        return _remove(mountpoint, f"removed the dead mount at {mountpoint} (its daemon was gone)",
                       f"cannot remove the dead mount at {mountpoint}")
    try:
        os.kill(pid, signal.SIGTERM)
    except PermissionError:
        print(f"hicachefs: {mountpoint}: not permitted to stop its daemon (pid {pid}); "
              "only root and the daemon's user may", file=sys.stderr)
        return 1
    except ProcessLookupError:  # it ended since it answered; its mount goes with it, or is dead
        pass
    signalled = time.monotonic()
    while time.monotonic() < signalled + UMOUNT_TIMEOUT_S:
        mounted = mount_table.filesystem_type(mountpoint) is not None
        if not mounted and not _alive(pid):
            print(f"hicachefs: unmounted {mountpoint}")
            return 0
        if mounted and time.monotonic() > signalled + UNMOUNT_AFTER_SIGTERM_S:
            return _abort_and_remove(mountpoint, f"{mountpoint}: daemon {pid} did not unmount it within "
                                                 f"{UNMOUNT_AFTER_SIGTERM_S:g} s of SIGTERM")
        time.sleep(0.05)
    print(f"hicachefs: daemon {pid} did not finish within {UMOUNT_TIMEOUT_S:.0f} s", file=sys.stderr)
    return 1


def _abort_and_remove(mountpoint: str, why: str) -> int:
    """Abort the mount's FUSE connection, which fails every request waiting on its daemon, then
    unmount it; the daemon, if it ever runs again, finds its mount gone and exits."""
    return _remove(mountpoint, f"{why}; aborted its FUSE connection and removed the mount",
                   f"{why}; could not remove the mount", abort=True)


def _remove(mountpoint: str, removed: str, failed: str, abort: bool = False) -> int:
    """Remove the mount (aborting its FUSE connection first, with ``abort``); one line either way."""
    try:
        if abort:
            mount_table.abort(mountpoint)
        mount_table.remove(mountpoint)
    except OSError as exc:
        print(f"hicachefs: {failed}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"hicachefs: {removed}")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False
