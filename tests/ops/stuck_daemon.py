"""A FUSE daemon that mounts as hicachefs and that SIGKILL cannot end: a thread of its own looks
a name up on its mount, and its loop reads that request and never answers it, so the thread waits
in the kernel for good and the process never exits (a real daemon's notification thread can wait
so on a lookup in flight). SIGTERM is ignored, as a daemon busy writing its RAM tier down would
take it. Prints "stuck" once its thread waits. Run as ``python stuck_daemon.py MOUNTPOINT``."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pyfuse3
import trio

from eio_daemon import AnswersEIO  # (beside this script: its directory is the first on sys.path)

NEVER_ANSWERED = b"never-answered"


class LooksUpForever(AnswersEIO):
    async def lookup(self, parent_inode, name, ctx=None):
        if name != NEVER_ANSWERED:
            return await super().lookup(parent_inode, name, ctx)
        print("stuck", flush=True)
        await trio.sleep_forever()


def _look_up(mountpoint: str) -> None:
    try:
        os.stat(os.path.join(mountpoint, NEVER_ANSWERED.decode()))
    except OSError:
        pass


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pyfuse3.init(LooksUpForever(), sys.argv[1], {"fsname=hicachefs", "subtype=hicachefs"})
    threading.Thread(target=_look_up, args=(sys.argv[1],), daemon=True).start()
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)
