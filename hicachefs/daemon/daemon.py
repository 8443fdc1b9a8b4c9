"""The daemon process: open the store, mount, serve until told to stop, shut down cleanly.

Run in the foreground by ``hicachefs mount --foreground``, or as ``python -m
hicachefs.daemon CONFIG_JSON [PROGRESS_FD]`` by the background form of the same command, which
shows on its terminal how rebuilding the disk index goes from what the daemon writes to
PROGRESS_FD (``recovery_reporter``). SIGTERM, SIGINT and SIGHUP end the loop after the requests
in flight (``fuse.session.stop``); then the mount is removed and the store closed, which writes
the RAM tier down to disk and the disk tier's index snapshot (further stop signals are ignored
meanwhile). An unmount from outside (``umount``,
``fusermount3 -u``) ends the loop the same way, and so does a lazy one (``umount -l``), which
the kernel does not tell the daemon of while files are open on the mount: it is looked for in
the mount table every second. Under systemd (``Type=notify``) the daemon
reports ready once the mount is live.

As root, the mount's readahead is raised once it is live, so that a page the kernel does not
hold yet is filled by 1 MiB requests in flight together rather than 128 KiB ones in turn.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import trio

from .. import mount_table
from ..control.files import ControlFiles
from ..fuse.kernel_notifier import KernelNotifier
from ..posix.namespace import Namespace
from ..fuse import session
from ..fuse.operations import Operations
from ..posix.requests import Requests
from ..store import Gone, PageStore, StoreError
from . import metrics
from .config import DaemonConfig
from .log_file import LogFile
from .metrics_endpoint import MetricsEndpoint
from .recovery_reporter import Reporter
from .sd_notify import notify
from .statistics import DaemonStatistics

log = logging.getLogger("hicachefs")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: The mount's readahead: whole pages of up to this size are read with requests in flight together.
READ_AHEAD_KB = 8192

def setup_logging(config: DaemonConfig) -> None:
    """Log to ``--log-file`` (``log_file``), to stderr without one."""
    handler = LogFile(config.log_file) if config.log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())


def raise_open_file_limit() -> None:
    """Take the hard limit of open files for the soft one, as a server does: the shared tier
    keeps up to 64 files open beside its writers, the disk tier and the control files, and the
    soft limit a shell or a unit gives (often 1,024, or less where someone lowered it) is no
    budget of this daemon's. Where it cannot be raised, the daemon runs with what it has."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)


def no_world_writable_files() -> None:
    """Mask the write bit for others in what the daemon makes (the shared tier's directories and
    files, the disk tier's snapshot and lists): started under ``umask 000``, it made them
    world-writable, and another user renamed a forged page file, checksums and all, over a
    shared page that the clients then served (found by review). Group write is the operator's
    to keep (hosts sharing a volume as one group)."""
    os.umask(os.umask(0) | 0o002)


def keep_freed_memory() -> None:
    """Make glibc keep freed memory for the next allocation instead of handing it back to the
    kernel. pyfuse3 copies every WRITE into a new ``bytes`` of up to 1 MiB; freed, glibc gave
    that back (it sat at the top of the heap, over the trim threshold) and the next WRITE faulted
    it in again: 256 page faults per MiB written, which on the development VM (whose kernel
    hands out memory it has not touched before slowly) made a 1 MiB WRITE cost 450 us of the
    daemon's CPU instead of under 200."""
    libc = ctypes.CDLL(None)  # the C library this process runs on (no ldconfig looked up)
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameters (malloc.h)
    libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum: blocks up to 32 MiB from the heap
    libc.mallopt(m_trim_threshold, (1 << 31) - 1)  # and never give the heap's top back


def keep_start_up_objects() -> None:
    """Leave what start-up made (modules, the store, the mount's objects) out of the garbage
    collector's full collections from now on: they live as long as the daemon, and scanning
    them paused every request in turn. While a plain user listed a pool of 20,000 pages in a
    loop (each listing makes an inode for each entry the kernel keeps), the full collections
    took 11-20 ms, of which some 39,000 objects from start-up; without those, 4-8 ms. Frozen
    objects are still freed when their last reference goes."""
    gc.collect()
    gc.freeze()


def run(config: DaemonConfig, progress_fd: int | None = None) -> int:
    """Serve the mount until a signal or unmount; returns the process exit code. How the disk
    index is rebuilt is logged, and sent to ``progress_fd`` (closed once the store is open)."""
    log.info("starting: %s", json.dumps(asdict(config)))
    no_world_writable_files()
    keep_freed_memory()
    raise_open_file_limit()
    reporter = Reporter(progress_fd)
    try:
        store = PageStore(config.store_config(), progress=reporter)
    except StoreError as exc:
        # An arena that is not ours or that another daemon holds, a disk that cannot be
        # allocated: one line, which ``hicachefs mount`` repeats, rather than a traceback.
        log.error("cannot open the store: %s", exc)
        return 1
    finally:
        reporter.close()
    requests = endpoint = None
    try:
        effective = {**asdict(config), "pid": os.getpid()}
        identity = {"pid": os.getpid(), "started_at": time.time()}
        notifier = KernelNotifier(store.budget.share("kernel_pushes"))

        def statistics() -> DaemonStatistics:  # wiring, read at every open of .hicachefs/stats
            refusals = requests.refusals.statistics()
            return DaemonStatistics(store.statistics(), dict(requests.errors), dict(requests.counts),
                                    namespace.pending_count(), notifier.statistics(), refusals.by_user,
                                    refusals.not_logged, namespace.page_inodes(), identity)

        control = ControlFiles(store, statistics, metrics.render, effective)
        namespace = Namespace(store, control, notifier, config.temp_timeout_s, config.kernel_cache)
        requests = Requests(namespace, control.request_limits.turn_of)
        operations = Operations(requests)
        if config.metrics_listen:  # bound before mounting: a port in use fails the start
            endpoint = MetricsEndpoint(config.metrics_listen, statistics)
        # A last look: another mount made at the path since the command's checks (by a daemon
        # started another way, or by mount(8)) would be hidden under this one, serving nobody.
        taken = mount_table.filesystem_type(config.mountpoint)
        if taken is not None:
            log.error("cannot mount: mountpoint %s is already a mount point (%s)", config.mountpoint, taken)
            return 1
        session.mount(operations, config.mountpoint, set(config.fuse_options))
        # From here on a stop signal never kills the process: one that comes before the loop
        # listens (the mount is live already) is kept for it, and one after it is swallowed (a
        # second one, as systemd sends a mount's processes after umount, must not cut short
        # the RAM tier's write-down below).
        early = _EarlyStop()
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, early)
        try:
            notifier.start()
            notify("READY=1")
            keep_start_up_objects()
            trio.run(_serve, namespace, store, endpoint, config.mountpoint, early, notifier)
        finally:
            notifier.stop()
            session.unmount()
        log.info("unmounted %s", config.mountpoint)
    finally:
        if endpoint is not None:
            endpoint.close()
        store.close()
        log.info("store closed")
    return 0


class _GoneHandOver:
    """Pages the store dropped on its own (any thread, the store's lock held), handed to the
    trio thread for the namespace: what piles up before that thread runs goes in one wake-up
    (a commit of 8 pages that evicts 8 made 8 wake-ups, each a write to trio's wake-up socket).
    Dropped by a call the trio thread made (a plane commit's reservations), they are handed
    over at once: a wake-up of its own thread was a twentieth of the daemon's work for a commit."""

    def __init__(self, token: trio.lowlevel.TrioToken, namespace: Namespace) -> None:
        self._token, self._namespace = token, namespace
        self._trio_thread = threading.get_ident()  # made on it
        self._lock = threading.Lock()
        self._names: list[Gone] = []

    def __call__(self, names: list[Gone]) -> None:
        if threading.get_ident() == self._trio_thread:
            self._namespace.pages_gone(names)
            return
        with self._lock:
            woken = bool(self._names)
            self._names += names
        if woken:
            return
        try:
            self._token.run_sync_soon(self._hand_over)
        except trio.RunFinishedError:
            pass  # shutting down: the kernel is about to forget everything anyway

    def _hand_over(self) -> None:
        with self._lock:
            names, self._names = self._names, []
        self._namespace.pages_gone(names)


async def _serve(namespace: Namespace, store: PageStore, endpoint: MetricsEndpoint | None,
                 mountpoint: str, early: _EarlyStop, notifier: KernelNotifier) -> None:
    """Serve the mount and what runs beside it, until the session ends."""
    token = trio.lowlevel.current_trio_token()
    if endpoint is not None:
        endpoint.attach(token)

    store.on_gone(_GoneHandOver(token, namespace))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, session.stop, early, notifier, store)
        nursery.start_soon(_reap_abandoned, namespace)
        nursery.start_soon(_end_pin_leases, namespace)
        if os.getuid() == 0:
            # Abandoned on cancel: its stat is served by this very loop, which may be ending.
            nursery.start_soon(functools.partial(trio.to_thread.run_sync, _raise_readahead, mountpoint,
                                                 abandon_on_cancel=True))
        await session.serve()
        nursery.cancel_scope.cancel()


def _raise_readahead(mountpoint: str) -> None:
    """Set the mount's readahead (runs in a thread: the stat is served by this very daemon)."""
    try:
        device = os.stat(mountpoint).st_dev
        path = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
        path.write_text(f"{READ_AHEAD_KB}\n")
    except OSError as exc:
        log.warning("could not raise the mount's readahead: %s", exc)


class _EarlyStop:
    """The handler of stop signals outside the loop: keeps the first, for the loop to act on."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum


async def _stop_on_signal(stop, early: _EarlyStop, notifier: KernelNotifier, store: PageStore) -> None:
    """On a stop signal, or once the mount was unmounted lazily from outside (``_detached``),
    end the session: the kernel is told what it was to be told while requests are still read
    (``kernel_notifier``: after, a notification could hang the mount)."""
    with trio.open_signal_receiver(*HANDLED_SIGNALS) as signals:
        why = signal.Signals(early.signum).name if early.signum else None
        if why is None:
            async with trio.open_nursery() as waiting:
                async def on_signal() -> None:
                    nonlocal why
                    why = signal.Signals(await signals.__anext__()).name
                    waiting.cancel_scope.cancel()

                async def on_detach() -> None:
                    nonlocal why
                    await _detached()
                    why = "unmounted from outside while files were still open on it"
                    waiting.cancel_scope.cancel()

                waiting.start_soon(on_signal)
                waiting.start_soon(on_detach)
        log.info("%s: finishing requests in flight, then unmounting", why)
        store.stopping()
        notifier.close_session()
        await notifier.delivered()
        stop()
        await trio.sleep_forever()  # still listening, so later stop signals are swallowed


#: How often the daemon looks whether its mount was unmounted lazily (``session.detached``).
DETACH_CHECK_S = 1.0


async def _detached() -> None:
    """Return once the mount is no longer in the mount table while the session goes on: a lazy
    unmount (``umount -l``, ``fusermount3 -uz``) keeps the connection for as long as a file is
    open on it, and SGLang's ranks keep theirs open for good, so this daemon would serve a
    tree nobody reaches by path, its clients would store pages there, and it would hold the
    --disk arena against the next mount. A look that fails is tried again: out of file
    descriptors for a moment (a shared tier keeps files open), it ended the daemon and its mount."""
    failing = False
    while True:
        try:
            if session.detached():
                return
            failing = False
        except OSError as exc:  # the mount table unreadable for now (no descriptor to spare): look again
            if not failing:
                log.warning("cannot read the mount table to see whether the mount is still there: %s; "
                            "looking again every %.0f s", exc, DETACH_CHECK_S)
            failing = True
        await trio.sleep(DETACH_CHECK_S)


async def _reap_abandoned(namespace: Namespace) -> None:
    """Discard abandoned temporary files every few seconds. A round that fails is logged and the
    next one tries again: an exception out of this task would end the nursery, and the daemon."""
    while True:
        await trio.sleep(min(5.0, namespace.temp_timeout_s / 4))
        try:
            namespace.reap_abandoned()
        except Exception:
            log.exception("discarding abandoned temporary files failed; trying again in the next round")


async def _end_pin_leases(namespace: Namespace) -> None:
    """Let open pages whose pin lease ended go (``posix/page_handle.py``), twice a second."""
    while True:
        await trio.sleep(0.5)
        namespace.leases.expire()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the background daemon: the DaemonConfig as JSON, and optionally the file
    descriptor to report recovery progress to."""
    argv = sys.argv[1:] if argv is None else argv
    config = DaemonConfig(**json.loads(argv[0]))
    setup_logging(config)
    try:
        return run(config, int(argv[1]) if len(argv) > 1 else None)
    except Exception:
        log.exception("daemon failed")
        return 1

