"""SGLang TP ranks for the ranks cases of ``bench.py`` and ``bench_client_threads.py``; not a
benchmark by itself.

A rank is a process of its own, as each TP rank of an SGLang server is: one torch thread, its
own host pool, its own pages (its shard, ``tp{rank}of{size}``), one backend. Ranks are forked
from a fork server that has imported torch and SGLang once (importing them takes seconds per
process, and four at once on two cores took half a minute). Each is started and stopped here
by its PID, and runs a phase (write or read of its batches under a tag) when told, so that all
ranks run each phase at the same moment.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional

from . import bench_sglang as calls

PHASE_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 60.0
#: Calls of at least this many pages check every sampled page (``_checked_slots``).
SAMPLED_BATCH = 16


def serve(conn: Connection, backend: str, root: str, shape: calls.Shape, rank: int,
          batches: int, client: dict, batch: int) -> None:
    """The rank's process: build its pool (``batch`` pages, a call's) and backend, say
    ``ready``, then run each
    ``(phase, tag)`` it is sent and answer with what it measured; ``("clear", "")`` removes
    its pages, ``None`` ends it. Phases: ``write`` and ``read``."""
    logging.basicConfig(level=logging.ERROR)
    calls.as_sglang_runs()
    pool = calls.Pool(shape, batch=batch, tp_rank=rank, seed=rank + 1)
    if backend == "hicachefs":
        store = calls.make_hicachefs(Path(root), pool, client)
    else:
        store = calls.make_file(Path(root), pool)
    write, read = calls.writer(store, pool), calls.reader(store, pool)
    conn.send("ready")
    while True:
        try:
            command = conn.recv()
        except EOFError:
            break
        if command is None:
            break
        phase, tag = command
        if phase == "clear":
            store.clear()
            conn.send("cleared")
            continue
        conn.send(_phase(store, pool, write if phase == "write" else read, phase, tag, rank,
                         batches))
    close = getattr(store, "close", None)
    if close is not None:
        close()


def _phase(store, pool: calls.Pool, op, phase: str, tag: str, rank: int, batches: int) -> dict:
    if phase == "write":
        calls.warm_up(store, pool, f"{tag}/tp{rank}")
    before = _plane(store)
    start = time.monotonic()  # system-wide: comparable across ranks
    made = [calls.timed_call(pool, f"{tag}/tp{rank}/b{b}", calls.keys_for(f"{tag}/tp{rank}/b{b}", pool.batch),
                             op, phase == "write", _checked_slots(pool, b)) for b in range(batches)]
    end = time.monotonic()
    report = getattr(store, "report_reads", None)
    if report is not None and phase != "write":
        report()  # the reads' report now, not up to 0.5 s later: the daemon's counts are whole
    after = _plane(store)
    return {"start": start, "end": end, "calls": made, "page_bytes": pool.page_bytes,
            **{k: after[k] - before[k] for k in after}}


def _checked_slots(pool: calls.Pool, call: int):
    """The pages a read call checks: all sampled ones of a large call; one of a small call, a
    different one each call. The ranks run their calls back to back, and checking six of eight
    pages took as long as the call itself, which the ranks' aggregate counts."""
    if pool.batch >= SAMPLED_BATCH:
        return None
    return [pool.sample_slots[call % len(pool.sample_slots)]]


def _plane(store) -> dict:
    """The client's data plane counters (HiCacheFS; 0 for others): requests it sent on the
    plane file, pages it read and wrote through the plane."""
    statistics = getattr(store, "statistics", None)
    stats = statistics() if statistics is not None else {}
    return {k: stats.get(k, 0) for k in ("plane_requests", "plane_reads", "plane_writes")}


_context: Optional[multiprocessing.context.ForkServerContext] = None


def _forkserver() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        # The fork server is a fresh interpreter that ignores our sys.path (Python 3.11) and
        # skips preloads it cannot import: it finds this module through PYTHONPATH.
        scripts = str(Path(__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (scripts, os.environ.get("PYTHONPATH")) if p)
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["lib.bench_rank"])
    return _context


class RankWorker:
    """One rank process: started here, stopped here by its PID."""

    def __init__(self, backend: str, root: Path, shape: calls.Shape, rank: int, batches: int,
                 client: dict, batch: int = calls.STORAGE_BATCH_SIZE) -> None:
        self.conn, child = _forkserver().Pipe()
        self.proc = _forkserver().Process(
            target=serve, args=(child, backend, str(root), shape, rank, batches, client, batch),
            name=f"rank {rank} {backend}")
        self.proc.start()
        child.close()

    def send(self, phase: str, tag: str = "") -> None:
        self.conn.send((phase, tag))

    def receive(self, timeout: float = PHASE_TIMEOUT_S):
        if not self.conn.poll(timeout):
            raise RuntimeError(f"rank process {self.proc.pid} gave no answer in {timeout:.0f} s")
        try:
            return self.conn.recv()
        except EOFError:
            raise RuntimeError(f"rank process {self.proc.pid} ended "
                               f"({self.proc.exitcode}) before answering") from None

    def stop(self) -> None:
        """Ask it to end; SIGKILL by its PID if it does not."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(STOP_TIMEOUT_S)
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.join(10)
        self.conn.close()
