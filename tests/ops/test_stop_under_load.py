"""A daemon told to stop while pages are replaced and other processes look names up: it ends,
and its mount with it. The kernel notifier's thread, which tells the kernel of replaced pages,
could block for good in the kernel on a directory lock held by a lookup that the stopped loop
never answered; the daemon then hung unkillable, and so did every process that touched the
directory."""

from __future__ import annotations

import concurrent.futures
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyfuse3
import pytest
import trio

from hicachefs.fuse import kernel_notifier
from hicachefs.store.budget import Share
from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import ingest_batch, publish

POOL = "model/bfloat16-page_first-64/tp0of1/kv"
LOOKER = """
import os, random, sys, threading
pool = sys.argv[1]
def look():
    while True:
        try:
            os.stat(f"{pool}/k{random.randrange(64)}")
        except OSError:
            pass
for _ in range(6):
    threading.Thread(target=look, daemon=True).start()
threading.Event().wait()
"""


def _abort(connection: int) -> None:
    """Free a hung FUSE connection (only when the test failed), through fusectl, mounted for
    that and unmounted again if it was not."""
    connections = Path("/sys/fs/fuse/connections")
    mounted_here = not any(connections.iterdir()) and subprocess.run(
        ["mount", "-t", "fusectl", "none", str(connections)], capture_output=True).returncode == 0
    try:
        abort = connections / str(connection) / "abort"
        if abort.exists():
            abort.write_text("1")
    finally:
        if mounted_here:
            subprocess.run(["umount", str(connections)], capture_output=True)


def _stop_while_replacing(mount_factory) -> str | None:
    """Two ingest writers replacing 64 pages over and over, six threads looking them up, then
    SIGTERM: None if the daemon ended within 25 s, else why not."""
    mount = mount_factory("--memory", "16M")
    pool = mount.page_dir()
    connection = os.minor(os.stat(mount.path).st_dev)
    looker = subprocess.Popen([sys.executable, "-c", LOOKER, str(pool)])
    stop = threading.Event()

    def ingest() -> None:
        fd = os.open(mount.path / ".hicachefs" / "ingest", os.O_RDWR)
        version = 0
        try:
            while not stop.is_set():
                version += 1
                ingest_batch(fd, [(f"{POOL}/k{i}", content(version + i, 64 << 10)) for i in range(64)])
        except OSError:
            pass  # the mount went away under it
        finally:
            os.close(fd)

    writers = [threading.Thread(target=ingest, daemon=True) for _ in range(2)]
    for writer in writers:
        writer.start()
    time.sleep(1.5)
    pidfd = mounting.daemon_pidfd(mount)
    ended = False
    try:
        ended = mounting._signal(pidfd, signal.SIGTERM, 25)
    finally:
        os.close(pidfd)
        stop.set()
        log = mount.log_text()
        if not ended:
            _abort(connection)  # leave nothing hung behind
        looker.kill()
        looker.wait(10)
        for writer in writers:
            writer.join(10)
        mounting.unmount_path(mount.path)
    return None if ended else "the daemon did not end within 25 s of SIGTERM:\n" + log[-1500:]


def test_sigterm_while_pages_are_replaced_and_looked_up_ends_the_daemon(mount_factory):
    for _ in range(3):  # it hung at the first try before, in every run
        problem = _stop_while_replacing(mount_factory)
        assert problem is None, problem


class _Reader:
    def __init__(self, size: int) -> None:
        self.size, self.closed = size, False

    def view(self) -> memoryview:
        return memoryview(bytes(self.size))

    def close(self) -> None:
        self.closed = True


def test_what_is_queued_before_the_session_closes_is_sent_and_nothing_after(monkeypatch):
    sent = []
    monkeypatch.setattr(pyfuse3, "invalidate_entry", lambda inode, name: sent.append(name))
    share = Share("kernel_pushes", 1 << 20)
    notifier = kernel_notifier.KernelNotifier(share)
    notifier.start()
    try:
        notifier.forget_entry(1, b"before")
        notifier.close_session()
        notifier.forget_entry(1, b"after")
        late = _Reader(4096)
        notifier.push(5, late)
        trio.run(notifier.delivered)
        assert sent == [b"before"]
        assert late.closed and share.held == 0
    finally:
        notifier.stop()


def test_stop_gives_back_the_pushes_it_never_sent(monkeypatch):
    """The thread stuck in the kernel (as above): what ``stop`` drops gives its bytes back."""
    release = threading.Event()
    monkeypatch.setattr(pyfuse3, "invalidate_entry", lambda *args: release.wait(5))
    monkeypatch.setattr(pyfuse3, "notify_store", lambda *args: None)
    share = Share("kernel_pushes", 1 << 20)
    notifier = kernel_notifier.KernelNotifier(share)
    notifier.start()
    notifier.forget_entry(1, b"k")  # the thread blocks on this one
    reader = _Reader(4096)
    assert notifier.push(5, reader)
    notifier.stop(timeout=0.2)
    release.set()
    assert reader.closed and share.held == 0 and notifier.statistics().push_queue_bytes == 0


def test_a_read_waiting_for_room_for_its_copy_is_refused_when_the_daemon_stops(mount_factory, tmp_path):
    """A read of a disk page that found the ``private_reads`` share full waits for room, up to
    10 s, and a daemon told to stop answers the requests in flight before it exits: SIGTERM (or
    ``hicachefs umount``) while such a read waited kept the daemon up until the wait ended
    (found by review). A stopping daemon refuses such a read at once (ENOBUFS, as when no room
    comes), and exits, its mount gone."""
    mount = mount_factory("--memory", "32M", "--max-page-size", "1M", "--disk", str(tmp_path / "ssd"),
                          "--disk-size", "64M", "--no-kernel-cache")  # private_reads: 4 MiB, pins: more
    pool = mount.page_dir()
    for i in range(40):  # 1 MiB each: the oldest go down to the disk tier
        publish(pool, f"k{i}", content(i, 1 << 20))
    share = mount.stats()["ram_budget"]["shares"]["private_reads"]
    holding = share["limit_bytes"] >> 20
    held = [os.open(pool / f"k{i}", os.O_RDONLY) for i in range(holding)]  # each a copy of its own
    pidfd = mounting.daemon_pidfd(mount)
    try:
        assert mount.stats()["ram_budget"]["shares"]["private_reads"]["held_bytes"] == share["limit_bytes"]
        with concurrent.futures.ThreadPoolExecutor(1) as opener:
            waiting = opener.submit(os.open, pool / f"k{holding}", os.O_RDONLY)
            with pytest.raises(concurrent.futures.TimeoutError):
                waiting.result(timeout=0.3)  # waits for room (the copies are let go 2 s after their open)
            assert mounting._signal(pidfd, signal.SIGTERM, 5), "the daemon still runs"
            with pytest.raises(OSError) as refused:
                os.close(waiting.result(timeout=5))
        assert refused.value.errno == errno.ENOBUFS
    finally:
        os.close(pidfd)
        for fd in held:
            os.close(fd)
    assert not mounting.is_mounted(mount.path)
