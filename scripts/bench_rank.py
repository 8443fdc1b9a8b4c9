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

from bench_sglang import Pool, as_sglang_runs, keys_for, make_file, make_hicachefs, reader, writer

PHASE_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 60.0


def serve(conn: Connection, backend: str, root: str, rank: int, tp_size: int, page_mib: int,
          batches: int, client: dict) -> None:
    """The rank's process: build its pool and backend, say ``ready``, then run each
    ``(phase, tag)`` it is sent and answer with what it measured; ``None`` ends it."""
    logging.basicConfig(level=logging.ERROR)
    as_sglang_runs()
    pool = Pool(page_mib, tp_size=tp_size, seed=rank + 1)
    if backend == "hicachefs":
        store = make_hicachefs(Path(root), pool, rank, client)
    else:
        store = make_file(Path(root), pool, rank)
    write, read = writer(store, pool), reader(store, pool)
    conn.send("ready")
    while True:
        try:
            command = conn.recv()
        except EOFError:
            break
        if command is None:
            break
        phase, tag = command
        seconds, cpu, pages, failed, bad = [], 0.0, 0, 0, 0
        start = time.monotonic()  # system-wide: comparable across ranks
        for b in range(batches):
            batch_tag = f"{tag}/tp{rank}/b{b}"
            keys = keys_for(batch_tag)
            if phase == "write":
                pool.stamp(batch_tag)
            else:
                pool.scribble()
            began, began_cpu = time.perf_counter(), time.process_time()
            outcome = write(keys) if phase == "write" else read(keys)
            seconds.append(time.perf_counter() - began)
            cpu += time.process_time() - began_cpu
            if phase == "write":
                pages += len(keys)
                failed += 0 if outcome else len(keys)
            else:
                pages += outcome
                failed += len(keys) - outcome
                bad += pool.check(batch_tag, outcome)
        conn.send({"start": start, "end": time.monotonic(), "seconds": seconds, "cpu": cpu,
                   "pages": pages, "failed": failed, "bad": bad, "page_bytes": pool.page_bytes})
    close = getattr(store, "close", None)
    if close is not None:
        close()


_context: Optional[multiprocessing.context.ForkServerContext] = None


def _forkserver() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        # The fork server is a fresh interpreter that ignores our sys.path (Python 3.11) and
        # skips preloads it cannot import: it finds this module through PYTHONPATH.
        here = str(Path(__file__).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (here, os.environ.get("PYTHONPATH")) if p)
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["bench_rank"])
    return _context


class RankWorker:
    """One rank process: started here, stopped here by its PID."""

    def __init__(self, backend: str, root: Path, rank: int, tp_size: int, page_mib: int,
                 batches: int, client: dict) -> None:
        self.conn, child = _forkserver().Pipe()
        self.proc = _forkserver().Process(
            target=serve, args=(child, backend, str(root), rank, tp_size, page_mib, batches,
                                client), name=f"rank {rank} {backend}")
        self.proc.start()
        child.close()

    def send(self, phase: str, tag: str) -> None:
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
