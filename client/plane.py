"""The client's side of the data plane: pages copied between SGLang's host buffers and the
daemon's shared memory by the caller's own thread (docs/contract.md, "The data plane").

Root and the daemon's user (SGLang's ranks) may use it; anyone else, or a daemon without it,
gets ``None`` from every call here, and the caller goes the usual way (control files, page
files). What the plane does:

- **Reads and existence ask the daemon nothing.** The client finds a page in the shared index
  itself and copies it from its mapping of the arena (or the disk tier's file) straight into the
  host buffers (``plane_index``), a mapping whose page tables a thread fills ahead. A page that
  changes under the copy is looked up again, at most ``RETRIES`` times, then left to the daemon;
  never taken for read with foreign bytes. Only what the plane cannot say goes to the daemon: a
  page the index does not hold when a tier other hosts write exists (the daemon looks there, and
  fetches it ahead), an index being rebuilt, a page on no tier the plane reads.
- **Writes cost one request a batch.** Each thread's handle on ``.hicachefs/plane`` keeps a
  reservation ready (as many slots as its last batch had pages, 8 MiB at least); the client
  copies the pages into those slots (through its mapping of the arena), checksums them
  (xxh3_64), and commits the batch, which reserves the next batch's slots in the same request.
  Pages the index already holds are kept as they are without asking. A page without a slot (the
  daemon had none to give) goes another way.
- **The commit is sent behind the batch** (``commit_behind``, on by default): once a batch's
  pages are in their slots, in the daemon's RAM, they are as safe as a committed page of the
  RAM tier (both die with the daemon; until the commit reaches it, this process dying loses them
  too, its slots given back unpublished), so the call returns then and a thread of
  the client's sends the commit, which costs the daemon's round trip (0.3-1.3 ms) that the
  caller no longer waits for. This process sees its own pages at once: a lookup of a page whose
  commit is under way waits for it (``plane_commits``); others see them once the commit is
  answered. A handle's next request waits for it, so a batch that comes while the thread's
  last commit is still under way goes through a second handle of the thread's
  (``_writing_handle``): SGLang's backups come back to back, and waited a quarter of their time
  for the commit before. A commit makes a new pool's directories (``MAKE_POOLS``), and the first
  commit into a pool is waited for, so that a new pool is in the namespace, with its first
  pages, when the call returns. A page the daemon refuses after the call returned (it died
  meanwhile) is logged and counted a write failure, as lost as a committed RAM page would be.
- **Reads are reported** to the daemon in batches, from a thread of its own, every half second
  (``plane_reports``), so that hits and recency stay right; a report may lag, it is never
  dropped while the mount works (the rest is sent at ``close``).
- **A daemon that went away** (crash, restart, unmount) is noticed at once (``Attachment.live``):
  nothing it mapped is used again, and the plane attaches to the next daemon by itself, trying
  at most once a second.

Thread-safe: any thread may call; each uses its own handle on the plane file.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from . import forks
from .accounting import Counters, FailureLog, error_kind
from .control_handles import CONTROL_DIR, ControlHandle, ControlHandles
from .plane_arena import ArenaMapping
from .plane_commits import CommitsUnderWay
from .plane_index import ORDERED_LOADS, Attachment, Found, Unknown, page_checksum
from .plane_reports import MISSED, Noted, Read, Reports

logger = logging.getLogger(__name__)

PLANE_FILE = f"{CONTROL_DIR}/plane"
_REQUEST = struct.Struct("<4sHHIIQ")  # magic, op, flags, count, body bytes, seq (answers alike)
_REQUEST_MAGIC, _ANSWER_MAGIC = b"HCPQ", b"HCPA"
DIR, RESERVE, COMMIT, REPORT, RELEASE, MAILBOX = 1, 2, 3, 4, 5, 6
KEEP_EXISTING, IN_MAILBOX, MAKE_POOLS = 1, 2, 4
PUBLISHED, KEPT = 0, 1
_ENTRY = struct.Struct("<qQIH")
_MAILBOX = struct.Struct("<q16s")  # the mailbox's offset (or -errno), the daemon's token
#: Looks of a page that kept changing under its copies, before the daemon is asked instead.
RETRIES = 3
#: Attaching again after a failure at most this often (seconds).
RETRY_INTERVAL_S = 1.0
#: Pages a commit reserves for the next batch at most (a batch of SGLang's is 8 to 128).
MAX_AHEAD = 128
#: A commit reserves at least this many bytes for the next batch, so that a batch a little
#: larger than the last (SGLang's backups vary: 3 to 67 pages of 128 KiB) needs no request of
#: its own; the ``reserved_ahead`` share of the daemon's RAM bounds what all writers hold so.
MIN_AHEAD_BYTES = 8 << 20
#: Pages one commit request carries at most.
MAX_COMMIT = 1024
#: Threads sending commits behind their batches (a batch on ``write_threads`` is one commit each).
COMMIT_THREADS = 2
#: What a request fails with on a handle whose daemon is gone (or was restarted since it was opened).
_DAEMON_GONE = (errno.ENOTCONN, errno.ECONNABORTED)

Spread = Callable[[Callable[[int], bool], int], List[bool]]  # runs work(0..n-1) at once


@dataclass
class _HandleState:
    """What a thread's handle on the plane file holds at one daemon (``token``): whether that
    daemon answered it (``met``: the handle leads to it), its mailbox in the arena (-1: none;
    answers are then read from the handle), the slots it reserved for its next batch, the
    sequence number of its last request, and its commit still under way (and when it was sent,
    in this process's order of commits sent behind)."""

    token: bytes
    met: bool = False
    mailbox: int = -1
    ready_size: int = 0
    ready: List[int] = field(default_factory=list)
    seq: int = 0
    behind: Optional[Future] = None
    sent: int = 0


class Plane:
    """The data plane of one mount. See the module docstring."""

    def __init__(self, root: str, failures: FailureLog, counters: Counters,
                 verify_reads: Optional[bool] = None, commit_behind: bool = True) -> None:
        """``verify_reads``: check every page's checksum after its copy (by default only where
        the CPU may reorder loads, and for the disk tier's pages); ``commit_behind``: return
        once a batch is in its slots and send its commit from a thread of the client's."""
        self.root = root
        self.failures = failures
        self.counters = counters
        self.verify_reads = (not ORDERED_LOADS) if verify_reads is None else verify_reads
        self.commit_behind = commit_behind
        self._pools_made: set = set()  # (daemon token, directory) a commit of this client's published into
        self._senders: Optional[ThreadPoolExecutor] = None
        self._closed = False
        self._sent = itertools.count(1)  # commits sent behind, in order
        self._met: set = set()  # the tokens of the daemons this client attached to
        self.handles = ControlHandles(root, failures)
        self._lock = threading.Lock()
        self._attachment: Optional[Attachment] = None
        self._arena_map: Optional[ArenaMapping] = None  # the last attachment's, kept while its daemon runs
        self._retry_at = 0.0
        self._dirs: Dict[Tuple[bytes, str], int] = {}
        self._told: set = set()  # reasons for no plane, logged once
        self.reports = Reports(self)
        forks.renew_in_child(self)

    def forked(self) -> None:
        """In a forked child: the sender threads stayed behind, and so may have a holder of the lock."""
        self._lock = threading.Lock()
        self._senders = None

    # ---------------------------------------------------------------- attaching

    def attached(self) -> Optional[Attachment]:
        """The live daemon's attachment, made anew when the last one's daemon is gone; None
        when there is none to be had now."""
        attachment = self._attachment
        if attachment is not None and attachment.live:
            return attachment
        with self._lock:
            current = self._attachment
            if current is not None and current is not attachment and current.live:
                return current  # another thread attached meanwhile
            if current is not None:
                self._attachment = None
                self._forget_arena_if_gone()
            if time.monotonic() < self._retry_at:
                return None
            try:
                attachment = Attachment(self.root, self._arena_map)
            except (OSError, Unknown) as exc:
                self._retry_at = time.monotonic() + RETRY_INTERVAL_S
                self._say_why_not(exc)
                return None
            self._attachment, self._arena_map = attachment, attachment.arena_map
            self._met.add(attachment.token)
            if attachment.new_mapping:
                threading.Thread(target=attachment.arena_map.map_ahead, name="hicachefs-map-ahead",
                                 daemon=True).start()
        self.reports.start()  # which also lets go of the attachment once its daemon is gone
        return attachment

    def let_go_if_gone(self) -> bool:
        """Drop the attachment of a daemon that is gone, or that the mount's path no longer
        leads to (its memory is then no longer held here once no thread still copies); whether
        one is held."""
        with self._lock:
            if self._attachment is not None and not self._attachment.live:
                self._attachment = None
                self._forget_arena_if_gone()
            attachment = self._attachment
        if attachment is not None and not attachment.reached_by_path():
            self._let_go(attachment.arena_map)
        with self._lock:
            return self._attachment is not None

    def _let_go(self, arena: ArenaMapping) -> None:
        """The mount no longer leads to the daemon of ``arena``: its connection was aborted, or
        a handle opened by path met another daemon. That daemon may still run (stopped, hung,
        or finishing after a lazy unmount), so its liveness word and index say nothing: its
        memory is no longer trusted, and the next call attaches to the mount's daemon."""
        with self._lock:
            if self._attachment is not None and self._attachment.arena_map is arena:
                self._attachment = None
            if self._arena_map is arena:
                self._arena_map = None
                arena.stop()
                logger.info("hicachefs client: %s no longer leads to the daemon whose memory this client "
                            "mapped; the data plane waits for the next", self.root)

    def _forget_arena_if_gone(self) -> None:
        """Drop the arena's mapping once its daemon is gone; it is kept while only the index
        moved (it grew), for the next attachment to the same daemon. Called under the lock."""
        if self._arena_map is not None and not self._arena_map.daemon_runs():
            self._arena_map = None
            logger.info("hicachefs client: the daemon of %s went away; the data plane waits for the next", self.root)

    def _say_why_not(self, exc: BaseException) -> None:
        """Log once per reason why there is no plane (not a failure: pages go the other way; a
        mount that is gone is the other ways' to report)."""
        reason = error_kind(exc) if isinstance(exc, OSError) else type(exc).__name__
        if reason in self._told or getattr(exc, "errno", None) in _DAEMON_GONE:
            return
        self._told.add(reason)
        logger.info("hicachefs client: no data plane at %s (%s); pages go through the control files",
                    self.root, exc)

    def prepare(self, directory: str) -> None:
        """Attach, and learn ``directory``'s number, ahead of the first call that needs them
        (a few milliseconds: SGLang's first prefetch of a pool should not wait for them)."""
        attachment = self.attached()
        if attachment is not None:
            self._dir_id(attachment, directory)

    def _dir_id(self, attachment: Attachment, directory: str) -> Optional[int]:
        """The number the index hashes ``directory``'s keys with (asked once per daemon)."""
        known = self._dirs.get((attachment.token, directory))
        if known is not None:
            return known
        with self.handles.using(PLANE_FILE) as handle:
            if handle is None:
                return None
            answer = self._request(attachment.arena_map, handle, DIR, 0, 0,
                                   directory.encode("utf-8", "surrogateescape"), 8)
        if answer is None:
            return None
        number = struct.unpack("<q", answer)[0]
        self._dirs[(attachment.token, directory)] = number
        return number

    # ---------------------------------------------------------------- reading

    def find(self, rels: Sequence[str], sizes: Optional[Sequence[Optional[int]]] = None) -> List[Optional[bool]]:
        """Per page path: held (True), not held (False), or None when only the daemon can say;
        ``sizes``: per path, the only size a page held there may have (``Attachment.locate``)."""
        attachment = self.attached()
        if attachment is None:
            return [None] * len(rels)
        CommitsUnderWay.of(attachment.token).wait(rels)
        return self._locate(attachment, rels, rows=False, sizes=sizes)

    def find_in(self, directory: str, keys: Sequence[str], size: Optional[int] = None) -> List[Optional[bool]]:
        """``find`` for pages of one pool directory (SGLang's usual ask), with no page paths made;
        ``size``: only a page of that size is held (``Attachment.locate``)."""
        found = self._locate_in(directory, keys, prefix=False, size=size)
        return [None] * len(keys) if found is None else found  # type: ignore[return-value]

    def held_prefix(self, directory: str, keys: Sequence[str], size: Optional[int] = None) -> Tuple[int, bool]:
        """How many of ``keys`` of one pool directory, from the first, the index holds (of
        ``size`` bytes, when given), and whether that is all it can say (False: only the daemon
        can answer for the key after them). None probed past the first one missing."""
        found = self._locate_in(directory, keys, prefix=True, size=size)
        if found is None:
            return 0, False
        for held, row in enumerate(found):
            if row is not True:
                return held, row is False
        return len(keys), True

    def _locate_in(self, directory: str, keys: Sequence[str], prefix: bool,
                   size: Optional[int]) -> Optional[List[Optional[bool]]]:
        """``Attachment.locate`` of keys of one pool directory (held or not, no rows), once this
        process's commits of them are answered; None when the plane cannot look (no daemon, no
        directory number)."""
        attachment = self.attached()
        if attachment is None:
            return None
        CommitsUnderWay.of(attachment.token).wait_in(directory, keys)
        dir_id = self._dir_id(attachment, directory)
        if dir_id is None:
            return None
        return attachment.locate(dir_id, keys, prefix, rows=False, size=size)  # type: ignore[return-value]

    def read_pages(self, rels: Sequence[str], buffers: Sequence[Sequence[memoryview]],
                   size: int, alone: bool = False) -> List[Optional[bool]]:
        """Copy page ``rels[i]`` (``size`` bytes) into ``buffers[i]``; per page: read (True), not
        held as asked (False), or None when the daemon must serve it. A page that was not read
        may have left part of its bytes in its buffers. ``alone``: the batch is copied in this
        one run (``vectored.HOLD_LOCK_ALONE_BELOW``)."""
        attachment = self.attached()
        if attachment is None:
            return [None] * len(rels)
        CommitsUnderWay.of(attachment.token).wait(rels)
        read: List[Read] = []
        results = [self._read_one(attachment, rel, found, page, size, read, alone)
                   for rel, found, page in zip(rels, self._locate(attachment, rels), buffers)]
        misses = results.count(False)
        if read or misses:
            self.reports.note(attachment.token, read, misses)
        return results

    def _read_one(self, attachment: Attachment, rel: str, found, buffers: Sequence[memoryview],
                  size: int, read: List[Read], alone: bool) -> Optional[bool]:
        """Copy the page ``found`` at ``rel`` (located once already), looking it up again when
        it changed under the copy; a page read goes into ``read``, to be reported."""
        for _ in range(RETRIES):
            if not isinstance(found, Found):
                return found
            if found.size != size:
                return False
            try:
                if attachment.copy(found, buffers, size, self.verify_reads, alone):
                    read.append((found.row, found.gen))
                    return True
            except Unknown:
                return None
            except OSError:  # the disk file failed this read (a bad block): the daemon reads it
                return None
            self.counters.add(plane_retries=1)
            found = self._locate(attachment, [rel])[0]
        return None  # it kept changing under the copies, or its bytes failed their checksum

    def _locate(self, attachment: Attachment, rels: Sequence[str], rows: bool = True,
                sizes: Optional[Sequence[Optional[int]]] = None) -> List[Found | bool | None]:
        """Per page path: its row (``Found``; True instead when not ``rows``), False when the
        index does not hold it (of ``sizes[i]`` bytes, when given) and nobody else may, or None
        when only the daemon can say (``Attachment.locate``, once per pool directory and size
        of the batch)."""
        found: List[Found | bool | None] = [None] * len(rels)
        by_directory: Dict[Tuple[str, Optional[int]], List[int]] = {}
        keys = []
        for i, rel in enumerate(rels):
            directory, _, key = rel.rpartition("/")
            by_directory.setdefault((directory, None if sizes is None else sizes[i]), []).append(i)
            keys.append(key)
        for (directory, size), at in by_directory.items():
            dir_id = self._dir_id(attachment, directory)
            if dir_id is not None:
                for i, row in zip(at, attachment.locate(dir_id, [keys[i] for i in at], rows=rows, size=size)):
                    found[i] = row
        return found

    # ---------------------------------------------------------------- writing

    def publish(self, rel_dir: str, keys: Sequence[str], buffers: Sequence[Sequence[memoryview]],
                size: int, spread: Optional[Spread] = None, runs: int = 1) -> List[Optional[OSError | bool]]:
        """Publish page ``keys[i]`` of ``rel_dir`` from ``buffers[i]`` (``size`` bytes); pages
        the index holds already at that size are kept as they are. Per page: True (stored), an OSError
        (refused), or None when the plane could not take it (it goes another way). What was
        stored or kept is counted here. ``spread(copy, runs)``: copies the pages in ``runs``
        runs at once (the client's write threads), the batch still one commit."""
        results: List[Optional[OSError | bool]] = [None] * len(keys)
        attachment = self.attached()
        if attachment is None:
            return results
        rels = [f"{rel_dir}/{key}" for key in keys]
        todo = []
        for i, held in enumerate(self.find_in(rel_dir, keys, size)):
            if held:
                results[i] = True
            else:
                todo.append(i)
        self.counters.add(pages_skipped=len(keys) - len(todo))
        for start in range(0, len(todo), MAX_COMMIT):
            chunk = todo[start : start + MAX_COMMIT]
            with self._writing_handle() as handle:
                if handle is None:
                    break
                self._publish_chunk(attachment, handle, rel_dir, [rels[i] for i in chunk],
                                    [buffers[i] for i in chunk], size, chunk, results, spread, runs)
        return results

    @contextlib.contextmanager
    def _writing_handle(self) -> Iterator[Optional[ControlHandle]]:
        """The thread's handle on the plane file for a batch: its first, unless that one's last
        commit is still under way; then its second (opened the first time), unless that one's
        is too and was sent later. A batch right after another need not wait for its commit."""
        with self.handles.using(PLANE_FILE) as first:
            if first is None or _idle(first):
                yield first
                return
            with self.handles.using(PLANE_FILE, second=True) as second:
                if second is None or (not _idle(second) and second.state.sent > first.state.sent):
                    yield first
                else:
                    yield second

    def _publish_chunk(self, attachment: Attachment, handle: ControlHandle, rel_dir: str, rels: List[str],
                       buffers: Sequence[Sequence[memoryview]], size: int, where: List[int],
                       results: List[Optional[OSError | bool]], spread: Optional[Spread], runs: int) -> None:
        slots = self._slots(attachment, handle, size, len(rels))
        if handle.fd < 0:  # dropped: no slot is held, nothing is to commit; the pages go another way
            return
        copied: List[Optional[bytes]] = [None] * len(slots)  # per page copied, its commit entry
        runs = max(1, runs) if spread is not None else 1
        per_run = -(-len(slots) // runs)

        def copy(run: int) -> bool:
            for j in range(run * per_run, min((run + 1) * per_run, len(slots))):
                if slots[j] < 0:
                    continue  # no slot: the page goes another way
                try:
                    attachment.arena_map.write(slots[j], buffers[j], size, runs == 1)
                except OSError as exc:
                    results[where[j]] = exc
                    continue
                path = rels[j].encode("utf-8", "surrogateescape")
                copied[j] = _ENTRY.pack(slots[j], page_checksum(buffers[j]), size, len(path)) + path
            return True

        try:
            if runs > 1:
                spread(copy, runs)
            else:
                copy(0)
        except BaseException:  # (what a page's copy raises but OSError): its slots go back
            held = [offset for offset in slots if offset >= 0]
            if held:
                self._request(attachment.arena_map, handle, RELEASE, 0, len(held),
                              struct.pack(f"<{len(held)}q", *held), 0)
            raise
        placed = [j for j, entry in enumerate(copied) if entry is not None]
        entries = [copied[j] for j in placed]
        unused = [offset for offset, entry in zip(slots, copied) if offset >= 0 and entry is None]
        if unused:  # a slot whose page could not be copied goes back
            self._request(attachment.arena_map, handle, RELEASE, 0, len(unused),
                          struct.pack(f"<{len(unused)}q", *unused), 0)
        # Slots for the next batch: as many as this one had, or MIN_AHEAD_BYTES, less those left.
        wanted = min(max(len(rels), MIN_AHEAD_BYTES // size), MAX_AHEAD)
        ahead = max(0, wanted - len(self._state(attachment.arena_map, handle).ready))
        body = b"".join(entries) + struct.pack(f"<I{ahead}I", ahead, *([size] * ahead))
        placed_rels = [rels[j] for j in placed]
        first = (attachment.token, rel_dir) not in self._pools_made  # waited for: it makes the pool
        if placed and self.commit_behind and not first:
            sender = self._sender()
            if sender is not None:
                state = self._state(attachment.arena_map, handle)
                commits = CommitsUnderWay.of(attachment.token)
                commits.add(placed_rels)
                try:
                    state.behind = sender.submit(self._commit_behind, attachment, handle, state, placed_rels,
                                                 body, ahead, size)
                except RuntimeError:  # the senders were shut down meanwhile (close, exit): sent here
                    commits.done(placed_rels)
                else:
                    for j in placed:
                        results[where[j]] = True
                    state.sent = next(self._sent)
                    return
        outcomes = self._commit(attachment, handle, self._state(attachment.arena_map, handle), placed_rels, body,
                                ahead, size)
        if PUBLISHED in outcomes or KEPT in outcomes:
            self._pools_made.add((attachment.token, rel_dir))
        for j, outcome in zip(placed, outcomes):
            if outcome in (PUBLISHED, KEPT):
                results[where[j]] = True
            else:
                results[where[j]] = OSError(-outcome, f"{rels[j]}: {errno.errorcode.get(-outcome, -outcome)}")

    def _commit(self, attachment: Attachment, handle: ControlHandle, state: _HandleState, rels: List[str],
                body: bytes, ahead: int, size: int) -> Sequence[int]:
        """Send a batch's commit (``body``: its entries, then ``ahead`` sizes to reserve next;
        a new pool's directories are made by it) and take its answer; per page PUBLISHED, KEPT
        or -errno (-EIO for all when the request failed)."""
        answer = self._send(attachment.arena_map, handle, state, COMMIT, KEEP_EXISTING | MAKE_POOLS, len(rels), body,
                            4 * len(rels) + 8 * ahead)
        if answer is None:
            return [-errno.EIO] * len(rels)
        outcomes = struct.unpack_from(f"<{len(rels)}i", answer)
        published = outcomes.count(PUBLISHED)
        self.counters.add(pages_written=published, bytes_written=published * size, plane_writes=published,
                          pages_skipped=outcomes.count(KEPT), batches_written=1)
        state.ready_size = size
        state.ready += [o for o in struct.unpack_from(f"<{ahead}q", answer, 4 * len(rels)) if o >= 0]
        return outcomes

    def _commit_behind(self, attachment: Attachment, handle: ControlHandle, state: _HandleState,
                       rels: List[str], body: bytes, ahead: int, size: int) -> None:
        """``_commit`` on a sender thread, with the handle lent by its owner (which waits for
        this before its next request); what the daemon refused is logged and counted."""
        try:
            with self.handles.lent(handle) as lent:
                try:
                    outcomes = (self._commit(attachment, lent, state, rels, body, ahead, size)
                                if lent is not None else [-errno.EBADF] * len(rels))
                except struct.error:  # an answer cut short: nothing can be said of the pages
                    outcomes = [-errno.EPROTO] * len(rels)
            refused = [(rel, outcome) for rel, outcome in zip(rels, outcomes) if outcome not in (PUBLISHED, KEPT)]
            for rel, outcome in refused:
                self.failures.failure(errno.errorcode.get(-outcome, str(-outcome)),
                                      f"cannot publish {rel}: its commit was refused ({os.strerror(-outcome)})")
            self.counters.add(write_failures=len(refused))
        finally:
            CommitsUnderWay.of(attachment.token).done(rels)

    def _sender(self) -> Optional[ThreadPoolExecutor]:
        """The threads that send commits behind (made at first use, and anew in a forked
        child); None once closed."""
        with self._lock:
            if self._senders is None and not self._closed:
                self._senders = ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="hicachefs-commit")
            return self._senders

    def settle(self) -> None:
        """Wait until every commit sent behind its batch in this process to the daemons this
        client attached to has been answered: a clear through one client waits for another's
        (found by review: pages cleared came back). Nothing of the mount is touched: a close
        must not attach to a daemon that hangs (found by review)."""
        for token in list(self._met):
            CommitsUnderWay.of(token).wait_all()

    def wait_for(self, rels: Sequence[str]) -> None:
        """Until this process's commits of these pages under way to the mount's daemon are answered."""
        attachment = self.attached()
        if attachment is not None:
            CommitsUnderWay.of(attachment.token).wait(rels)

    def forget_pools(self, rel_dir: str) -> None:
        """The pools at and below ``rel_dir`` were removed: the next commit into one makes it
        again, and is waited for as a new pool's first."""
        below = rel_dir.rstrip("/") + "/"
        for made in list(self._pools_made):  # (a copy: writer threads add to it meanwhile)
            if made[1] == rel_dir or made[1].startswith(below):
                self._pools_made.discard(made)

    def _slots(self, attachment: Attachment, handle: ControlHandle, size: int, count: int) -> List[int]:
        """``count`` reserved slots for pages of ``size`` bytes: the handle's ready ones first,
        the rest reserved now (-errno where the daemon had none)."""
        state = self._state(attachment.arena_map, handle)
        ready, state.ready = state.ready, []
        if handle.fd < 0:  # dropped (the daemon took back what it held), or reaching another daemon
            return [-errno.EIO] * count
        if ready and state.ready_size != size:  # for pages of another size: no use now
            self._request(attachment.arena_map, handle, RELEASE, 0, len(ready),
                          struct.pack(f"<{len(ready)}q", *ready), 0)
            ready = []
        if len(ready) > count:
            state.ready = ready[count:]
            return ready[:count]
        missing = count - len(ready)
        if not missing:
            return ready
        answer = self._request(attachment.arena_map, handle, RESERVE, 0, missing,
                               struct.pack(f"<{missing}I", *([size] * missing)), 8 * missing)
        if answer is None:  # the handle was dropped, and the daemon took back the ready slots too
            return [-errno.EIO] * count
        return ready + list(struct.unpack(f"<{missing}q", answer))

    # ---------------------------------------------------------------- the plane file

    def _state(self, arena: ArenaMapping, handle: ControlHandle) -> _HandleState:
        """The handle's state at the daemon of ``arena``; a new one (with a mailbox asked for)
        once the handle meets another daemon than the one it held things at."""
        state = handle.state
        if state is not None and state.behind is not None:  # its commit under way: answered first
            behind, state.behind = state.behind, None
            behind.result()
            state = handle.state
        if state is None or state.token != arena.token:
            opened_now = state is None  # by path, for this request: it leads where the path does now
            state = handle.state = _HandleState(arena.token)
            answer = self._request(arena, handle, MAILBOX, 0, 0, b"", _MAILBOX.size)
            if answer is not None:
                mailbox, token = _MAILBOX.unpack(answer)
                if token == arena.token:
                    state.met, state.mailbox = True, mailbox
                else:  # opened after a restart: slots there are not in the memory mapped here
                    self.handles.drop(handle)
                    if opened_now:  # the path leads to another daemon than ``arena``'s
                        self._let_go(arena)
                    self.failures.failure("ESTALE", "a data plane handle reached another daemon than the "
                                          "one whose memory this client maps (it restarted); the pages go "
                                          "the other way")
        return state

    def _request(self, arena: ArenaMapping, handle: ControlHandle, op: int, flags: int, count: int,
                 body: bytes, answer_bytes: int) -> Optional[bytes]:
        """Send one request on the handle to the daemon of ``arena`` and take its answer's body:
        from the handle's mailbox in the arena when it has one (no request more), else read from
        the handle. None when the handle fails (it is dropped: the daemon then gives back what it
        held)."""
        state = self._state(arena, handle) if op != MAILBOX else None
        if handle.fd < 0:  # its first contact with this daemon failed (it was opened at one gone): dropped
            return None
        return self._send(arena, handle, state, op, flags, count, body, answer_bytes)

    def _send(self, arena: ArenaMapping, handle: ControlHandle, state: Optional[_HandleState], op: int,
              flags: int, count: int, body: bytes, answer_bytes: int) -> Optional[bytes]:
        """``_request`` on a handle whose state is ``state`` (None: none yet, no mailbox)."""
        try:
            seq = 0 if state is None else state.seq + 1
            mailbox = -1 if state is None else state.mailbox
            if state is not None:
                state.seq = seq
            request = _REQUEST.pack(_REQUEST_MAGIC, op, flags | (IN_MAILBOX if mailbox >= 0 else 0), count,
                                    len(body), seq) + body
            if handle.fd < 0 or _pwrite_all(handle.fd, request) != len(request):
                raise OSError(errno.EIO, "a plane request was not taken whole")
            expected = (_ANSWER_MAGIC, op, count, answer_bytes, seq)
            answer = bytes(arena.view[mailbox : mailbox + _REQUEST.size + answer_bytes]) if mailbox >= 0 else b""
            if _header(answer) != expected:  # no mailbox, or the answer did not fit in it
                answer = _pread_all(handle.fd, _REQUEST.size + answer_bytes)
                if _header(answer) != expected:
                    raise OSError(errno.EPROTO, f"a plane answer does not fit its request ({answer[:24]!r})")
        except (OSError, struct.error) as exc:
            self.handles.drop(handle)  # the daemon gives back what the handle held: no slot is ours now
            if state is not None:
                state.ready = []
            if getattr(exc, "errno", None) in _DAEMON_GONE and state is not None and state.met:
                self._let_go(arena)  # its connection is ``arena``'s daemon's (a handle of an older one's says nothing)
            self._request_failed(exc)
            return None
        self.counters.add(plane_requests=1)
        return answer[_REQUEST.size :]

    def _request_failed(self, exc: BaseException) -> None:
        """Count and log a failed request, unless its handle went with its daemon: each
        thread's handle meets that once after a restart, which is expected and logged once
        already (``_forget_arena_if_gone``), and a daemon gone for good is the other ways' to
        report (the pages go there)."""
        if getattr(exc, "errno", None) in _DAEMON_GONE:
            logger.debug("hicachefs client: a data plane handle went with its daemon: %s", exc)
            return
        self.failures.failure(error_kind(exc), f"a data plane request failed: {exc}")

    def report(self, reads: List[Noted]) -> None:
        """Tell the daemon of reads made through the plane, and of misses (``Reports``' thread);
        those of a daemon that is gone are let go. Sent through its arena, kept while it runs:
        an attachment let go as its index moved (it grew) leaves its reads still to send."""
        arena = self._arena_map
        if arena is None or not arena.daemon_runs():
            return
        mine = [(row, gen) for token, row, gen in reads if token == arena.token]
        found = [(row, gen) for row, gen in mine if row != MISSED]
        count, misses = len(found), len(mine) - len(found)
        body = b"".join(struct.pack("<IQ", row, gen) for row, gen in found)
        body += struct.pack("<I", misses) if misses else b""
        if not body:
            return
        for _ in range(2):  # a handle opened at a daemon that is gone fails before the report is sent
            with self.handles.using(PLANE_FILE) as handle:
                if handle is None:
                    return
                state = self._state(arena, handle)
                if handle.fd >= 0:
                    self._send(arena, handle, state, REPORT, 0, count, body, 4)
                    return

    def close(self) -> None:
        """Send what is under way, then let go of everything. The senders go first: a commit a
        batch handed them is sent before its handle is closed (closed first, with the batch's
        slots still its own, the handle gave them back unpublished, its call told True); a
        batch that finds them gone sends its own."""
        with self._lock:
            senders, self._senders, self._closed = self._senders, None, True
        if senders is not None:
            senders.shutdown(wait=True)
        self.settle()
        self.reports.send_now()
        self.handles.close()
        with self._lock:
            self._attachment = None
            arena_map, self._arena_map = self._arena_map, None
        if arena_map is not None:
            arena_map.stop()


def _idle(handle: ControlHandle) -> bool:
    """Whether no commit of the handle's is under way."""
    state = handle.state
    return state is None or state.behind is None or state.behind.done()


def _pwrite_all(fd: int, data: bytes) -> int:
    view, done = memoryview(data), 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], done)
        if n <= 0:
            break
        done += n
    return done


def _header(answer: bytes) -> Optional[tuple]:
    """What an answer says it answers: (magic, op, count, body bytes, seq)."""
    if len(answer) < _REQUEST.size:
        return None
    magic, op, _, count, length, seq = _REQUEST.unpack_from(answer)
    return magic, op, count, length, seq


def _pread_all(fd: int, size: int) -> bytes:
    answer = os.pread(fd, size, 0)
    while 0 < len(answer) < size:
        more = os.pread(fd, size - len(answer), len(answer))
        if not more:
            break
        answer += more
    return answer
