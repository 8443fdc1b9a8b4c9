"""``--workers N``: N processes read the mount's FUSE requests; the daemon's own process, the
owner, keeps the store and everything else and answers what they forward (``fs/forwarding.py``).

One pyfuse3 process tops out at one core (``notes/fuse-measurements.md``, point 12); the
kernel hands each request to whichever reader asks first, so N readers of one session spread
the mount's requests (and the kernel's copies of their bytes, made in the replying process)
over N cores. How they start:

- The owner mounts and serves until FUSE_INIT is answered (``answer_init``): libfuse keeps
  "initialized" per process, so every worker inherits it.
- Then it forks the workers. Each opens ``/dev/fuse`` anew, clones the session onto it
  (``FUSE_DEV_IOC_CLONE``: replies must go back on the descriptor a request was read from, and
  each clone has its own) and puts the clone where libfuse reads and writes, then runs
  pyfuse3's loop over ``ForwardedRequests``, with up to ``IN_FLIGHT`` requests at once (more
  than one only while one waits long on the owner: ``fs/channel.py``, ``fs/stolen_reads.py``).
  The owner never reads FUSE again: a request it read would wait on its own workers.

How they end:

- An unmount from outside ends the session: every worker's read fails, it exits 0, and
  ``serve`` returns.
- ``stop`` (the owner's SIGTERM): SIGUSR1 to each worker, which finishes the requests it has,
  leaves its loop and exits 0 (the signal also breaks a read waiting for the next request).
  Stop signals a worker gets (systemd signals every process of a unit) go to the owner.
- A worker that dies (killed, crashed) may have taken requests that are never answered. The
  owner aborts the FUSE connection, so every client's request fails (ENOTCONN or ECONNABORTED)
  instead of hanging, stops the others and ``serve`` says the mount failed; the daemon then
  shuts the store down as always and exits non-zero, leaving a dead mount that the next
  ``hicachefs mount`` removes. A worker that leaves its loop while the mount is still there
  counts as dead too. An owner that dies takes its workers with it (``PR_SET_PDEATHSIG``).

Not thread-safe: the owner's trio thread, and ``start`` in its main thread before that.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import gc
import logging
import os
import signal
import socket
from dataclasses import dataclass

import pyfuse3
import trio

from .. import mount_table
from ..fs.channel import AsyncChannel, Channel
from ..fs.forwarding import IN_FLIGHT, ForwardedRequests, Windows, serve
from ..fs.operations import Operations
from ..fs.requests import Requests
from ..fs.stolen_reads import StolenReads

log = logging.getLogger(__name__)

#: _IOR(229, 0, uint32_t), from <linux/fuse.h>.
FUSE_DEV_IOC_CLONE = 0x8004E500
#: What the owner tells a worker to stop with.
STOP_SIGNAL = signal.SIGUSR1
#: Signals a worker passes on to the owner (see the module docstring).
_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
#: madvise: map every page of a range now (Linux 5.14); Python's mmap module does not name it.
_MADV_POPULATE_WRITE = 23


async def answer_init(operations: Operations) -> None:
    """Serve the mount until FUSE_INIT has been answered, then return without ending the
    session. A request that came right after it is answered first: the loop is let go only
    while it waits for the next one."""
    fd = session_fd()
    initialized = trio.Event()
    operations.initialized = initialized.set

    async def let_go() -> None:
        await initialized.wait()
        while True:  # wakes the loop's wait for a request with ClosedResourceError, which ends it
            trio.lowlevel.notify_closing(fd)
            await trio.sleep(0.001)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(let_go)
            await pyfuse3.main(1, 1)
            nursery.cancel_scope.cancel()
    finally:
        operations.initialized = None


def session_fd() -> int:
    """The descriptor libfuse serves the session on (pyfuse3 does not say): this process's one
    open ``/dev/fuse``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except OSError:
            pass
    if len(found) != 1:
        raise RuntimeError(f"expected one open /dev/fuse, found {len(found)}")
    return found[0]


@dataclass
class Worker:
    index: int  # 1..N, as the statistics name it
    pid: int
    pidfd: int
    channel: AsyncChannel
    status: int | None = None  # os.waitpid's, once it ended


class WorkerPool:
    """The worker processes of one mount. See the module docstring."""

    def __init__(self, count: int, operations: Operations, requests: Requests, mountpoint: str) -> None:
        self.count = count
        self.operations = operations
        self.requests = requests
        self.mountpoint = mountpoint
        self.workers: list[Worker] = []
        self.windows = Windows(count, len(requests.namespace.store.shared_memory()))
        self.failed = False
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def start(self) -> None:
        """Fork the workers (after ``answer_init``)."""
        fd = session_fd()
        shared = self.requests.namespace.store.shared_memory()
        # A worker hears STOP_SIGNAL only once its loop listens for it; until then it waits.
        signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})
        try:
            for index in range(1, self.count + 1):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                pid = os.fork()
                if pid == 0:
                    ours.close()
                    _run_worker(index, fd, theirs, self.operations, shared, self.windows)
                theirs.close()
                self.workers.append(Worker(index, pid, os.pidfd_open(pid), AsyncChannel(ours)))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
        log.info("serving with %d worker processes: %s", self.count, ", ".join(map(str, self.pids)))

    async def serve(self) -> None:
        """Answer the workers' requests until every worker has ended."""
        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                nursery.start_soon(self._serve_one, worker)

    def answered_alone(self) -> dict[int, int]:
        """Reads each worker answered without the owner (``fs/fetch_windows.py``)."""
        return self.windows.fetch.answered_alone()

    def stop(self) -> None:
        """Let every worker finish its request and end (``serve`` returns once all have)."""
        self._stopping = True
        for worker in self.workers:
            if worker.status is None:
                try:
                    signal.pidfd_send_signal(worker.pidfd, STOP_SIGNAL)
                except ProcessLookupError:
                    pass

    async def _serve_one(self, worker: Worker) -> None:
        try:
            await serve(self.requests, worker.channel, worker.index, self.windows)
        finally:
            worker.channel.close()
        await trio.lowlevel.wait_readable(worker.pidfd)
        worker.status = os.waitpid(worker.pid, 0)[1]
        os.close(worker.pidfd)
        if self._stopping or self.failed:
            return
        if os.waitstatus_to_exitcode(worker.status) == 0 and not self._still_mounted():
            return  # the session ended: unmounted
        self.failed = True
        log.error("worker %d (pid %d) %s while serving the mount: aborting its FUSE connection, "
                  "so clients get ENOTCONN instead of waiting on requests it took",
                  worker.index, worker.pid, _how_it_ended(worker.status))
        try:
            await trio.to_thread.run_sync(mount_table.abort, self.mountpoint)
        except OSError as exc:
            log.error("could not abort the FUSE connection of %s: %s", self.mountpoint, exc)
        self.stop()

    def _still_mounted(self) -> bool:
        return mount_table.filesystem_type(self.mountpoint) == mount_table.FSTYPE


def _how_it_ended(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}" if code else "left its loop"


def _run_worker(index: int, fd: int, sock: socket.socket, operations: Operations, shared: memoryview,
                windows: Windows) -> None:
    """A worker process's life (in the child of ``fork``): never returns."""
    code = 1
    try:
        owner = os.getppid()
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != owner:  # the owner died before the line above
            os._exit(1)
        gc.freeze()  # what the owner left here is never collected, so never closes its files
        _close_inherited({fd, sock.fileno()})
        clone = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        fcntl.ioctl(clone, FUSE_DEV_IOC_CLONE, fd.to_bytes(4, "little"))
        os.dup2(clone, fd)  # libfuse reads and replies on ``fd``: from now on, this clone
        os.close(clone)
        _map_in(shared)
        channel = Channel(sock)
        reads = StolenReads(fd, lambda: channel.in_flight > 0)
        reads.install()
        operations.requests = ForwardedRequests(channel, shared, operations.uid, operations.gid, index, windows,
                                                reads)
        trio.run(_serve_session, owner)
        code = 0
    except BaseException:
        log.exception("worker %d failed", index)
    finally:
        os._exit(code)


def _close_inherited(keep: set[int]) -> None:
    """Close what the owner had open (the disk arena and its lock, the metrics port...) but the
    session, the channel, the standard streams and the log."""
    keep |= {0, 1, 2}
    for handler in logging.getLogger().handlers:
        stream = getattr(handler, "stream", None)
        if stream is not None:
            keep.add(stream.fileno())
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the listing's own descriptor, closed already


def _map_in(shared: memoryview) -> None:
    """Map the whole shared arena into this process now: a first touch per 4 KiB page would
    otherwise cost a page fault in the middle of requests (256 per MiB)."""
    try:
        shared.obj.madvise(_MADV_POPULATE_WRITE)
    except OSError as exc:  # a kernel before 5.14: pages are mapped as they are first touched
        log.info("could not map the RAM arena in up front: %s", exc)


async def _serve_session(owner: int) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_listen_for_signals, owner)
        await pyfuse3.main(1, IN_FLIGHT)
        nursery.cancel_scope.cancel()


async def _listen_for_signals(owner: int) -> None:
    with trio.open_signal_receiver(STOP_SIGNAL, *_PASSED_ON) as signals:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
        async for signum in signals:
            if signum == STOP_SIGNAL:
                pyfuse3.terminate()
            else:
                os.kill(owner, signum)
