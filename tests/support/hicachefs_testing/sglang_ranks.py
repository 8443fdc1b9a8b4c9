"""The TP ranks of one SGLang server over one store: each rank in its own process, with its own
device pool and its own ``SGLangCache``, all in one gloo group, serving the same requests.

This is what makes SGLang's own reductions across ranks run: the controller's prefetch thread
takes the MIN of every rank's storage hit count (``_sync_prefetch_hit_query``, over the gloo
groups it makes from the TP group), its sync thread the MIN of the pages each rank read, and the
cache the MIN of its queue lengths at every event drain, so that all ranks load the same prefix
even when their shards of the store differ. ``run_ranks`` starts the processes (a fresh
interpreter each, ``python -m hicachefs_testing.sglang_ranks``, as SGLang's scheduler
processes are), which meet through a rendezvous file, and collects one ``RankRun`` from each
(pickled files in a work directory; it waits on the processes' pidfds). It stops every process
it started by its PID, whatever happens; a rank that fails reports its traceback. Several
``RankCase``s are served one after the other by the same processes: SGLang's imports cost a
rank some 8 s of a core, once rather than per case.

``PageDrop`` removes pages from one rank's own shard before a phase, so that the ranks' hit
queries disagree and the reduction has something to decide.

Not thread-safe: one caller runs one group at a time.
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .sglang_store import remove_pages, stored_pages

#: How long a group may take in all before its processes are killed.
GROUP_TIMEOUT_S = 300.0
#: How long a collective may wait for the other ranks (gloo's timeout).
COLLECTIVE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PageDrop:
    """Before ``phase``, rank ``rank`` removes the pages ``keys`` of ``pool`` from its own shard."""

    rank: int
    phase: str
    pool: str
    keys: Tuple[str, ...]


@dataclass(frozen=True)
class RankCase:
    """One server over one store: its pools (a ``CacheSetup``), its backend, the requests every
    rank serves, and the pages dropped before a phase."""

    setup: object
    backend: object
    workload: object
    drops: Tuple[PageDrop, ...] = ()


@dataclass
class RankRun:
    """What one rank saw: per phase each request's (device, host, storage, prompt) pages and
    SGLang's prefetch outcomes; per storage method (calls, pages, hits, batch sizes); the
    checks of every byte; warnings; the client's errors."""

    rank: int
    hits: Dict[str, List[tuple]] = field(default_factory=dict)
    prefetch_outcomes: Dict[str, Dict[str, int]] = field(default_factory=dict)
    calls: Dict[str, tuple] = field(default_factory=dict)
    failures: List[str] = field(default_factory=list)
    wrong_handed_over: int = 0
    wrong_read: int = 0
    wrong_on_device: int = 0
    read_pages: int = 0
    stored_pages: int = 0  # pages of this rank's shard in the store after the run
    wrong_stored: int = 0  # of those, files without their bytes
    dropped: int = 0  # pages its PageDrops removed
    warnings: List[str] = field(default_factory=list)
    client_errors: Dict[str, int] = field(default_factory=dict)
    error: Optional[str] = None  # the traceback, if the rank failed


def run_ranks(cases: Sequence[RankCase], tp_size: int, workdir: Path) -> List[List[RankRun]]:
    """Serve ``run_phases`` of each case in turn on ``tp_size`` ranks (HiCacheFS on a mount
    every rank shares); per case, each rank's ``RankRun``, by rank. Raises with the traceback
    (or the end of the output) of a rank that failed."""
    spec = workdir / "ranks.pickle"
    spec.write_bytes(pickle.dumps((tuple(cases), tp_size)))
    processes: List[subprocess.Popen] = []
    pidfds: Dict[int, int] = {}  # pidfd -> rank
    runs: Dict[int, List[RankRun]] = {}
    try:
        for rank in range(tp_size):
            log = open(workdir / f"rank{rank}.log", "wb")
            with log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", __name__, str(spec), str(rank)], stdout=log, stderr=subprocess.STDOUT))
            pidfds[os.pidfd_open(processes[-1].pid)] = rank
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        while len(runs) < tp_size:
            waiting = [fd for fd, rank in pidfds.items() if rank not in runs]
            ended, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
            if not ended:
                raise TimeoutError(f"ranks {sorted(set(range(tp_size)) - set(runs))} did not finish "
                                   f"within {GROUP_TIMEOUT_S:.0f} s")
            for fd in ended:
                # A rank that fails ends at once; the others would wait for it in a collective.
                runs[pidfds[fd]] = _finished(pidfds[fd], processes[pidfds[fd]], workdir)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()  # by its PID
            process.wait()
        for fd in pidfds:
            os.close(fd)
    return [[runs[rank][case] for rank in range(tp_size)] for case in range(len(cases))]


def _finished(rank: int, process: subprocess.Popen, workdir: Path) -> List[RankRun]:
    """The ``RankRun`` of each case of a rank whose process ended; raises if it failed."""
    status = process.wait()
    result = workdir / f"rank{rank}.result"
    runs = pickle.loads(result.read_bytes()) if result.exists() else None
    failed = next((run.error for run in runs or () if run.error), None)
    if runs is not None and failed is None and status == 0:
        return runs
    why = failed or (workdir / f"rank{rank}.log").read_text(errors="replace")[-4000:]
    raise RuntimeError(f"rank {rank} failed (exit status {status}):\n{why}")


def _rank_main(spec: Path, rank: int) -> int:
    """One rank's process: join the gloo group, serve each case's phases, write its ``RankRun``s."""
    cases, tp_size = pickle.loads(spec.read_bytes())
    rendezvous = spec.parent / "gloo-rendezvous"
    runs: List[RankRun] = []
    try:
        import torch

        torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                                             world_size=tp_size,
                                             timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        try:
            group = torch.distributed.new_group(list(range(tp_size)), backend="gloo")
            for case in cases:
                runs.append(RankRun(rank))
                _serve(case, rank, tp_size, group, spec, runs)
        finally:
            torch.distributed.destroy_process_group()
    except BaseException:
        if not runs:
            runs.append(RankRun(rank))
        runs[-1].error = traceback.format_exc()
    _write_result(spec, rank, runs)
    return 0 if all(run.error is None for run in runs) else 1


def _serve(case: RankCase, rank: int, tp_size: int, group, spec: Path, runs: List[RankRun]) -> None:
    """Serve one case's phases on this rank, into the last of its ``runs``."""
    from .sglang_cache import SGLangCache, WarningLog
    from .sglang_workload import run_phases

    run, shard, backend = runs[-1], f"tp{rank}of{tp_size}", case.backend

    def before_phase(phase: str) -> None:
        for drop in case.drops:
            if drop.rank == rank and drop.phase == phase:
                run.dropped += remove_pages(Path(backend.path), drop.pool, drop.keys, shard)

    with WarningLog() as log:
        server = SGLangCache(case.setup, backend, tp_rank=rank, tp_size=tp_size, tp_group=group)
        try:
            phases = run_phases(server, case.workload, before_phase=before_phase)
        except BaseException:
            # The ranks are out of step: closing (it settles, a collective) would only meet
            # another rank's different collective. Report and end here.
            run.error = traceback.format_exc()
            _write_result(spec, rank, runs)
            os._exit(1)
        run.client_errors = dict(server.backend.statistics()["errors"])
        server.close()
    run.warnings = log.records
    recorder = server.recorder
    run.hits = {phase: phases.hits(phase) for phase in phases.requests}
    run.prefetch_outcomes = phases.prefetch_outcomes
    run.calls = {method: (s.calls, s.pages, s.hits, s.batch_sizes) for method, s in recorder.stats.items()}
    run.failures = recorder.failures
    run.wrong_handed_over, run.wrong_read = recorder.wrong_handed_over, recorder.wrong_read
    run.read_pages = recorder.read_pages
    run.wrong_on_device = sum(r.wrong_pages for results in phases.requests.values() for r in results)
    mine = {path: page for path, page in stored_pages(Path(backend.path)).items() if page.shard == shard}
    run.stored_pages = len(mine)
    run.wrong_stored = sum(path.read_bytes() != bytes(recorder.expected(page.pool, page.key).numpy())
                           for path, page in mine.items())


def _write_result(spec: Path, rank: int, runs: List[RankRun]) -> None:
    result = spec.parent / f"rank{rank}.result"
    partial = result.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(runs))
    partial.rename(result)  # whole, or not there


if __name__ == "__main__":
    # Through the module's own name, so that the RankRun it pickles is the one callers know.
    from hicachefs_testing import sglang_ranks

    sys.exit(sglang_ranks._rank_main(Path(sys.argv[1]), int(sys.argv[2])))
