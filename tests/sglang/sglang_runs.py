"""Shared by tests/sglang: SGLang's own radix cache and cache controller run one workload over HiCacheFS on a real mount
and over SGLang's HiCacheFile, each on a fresh store (hicachefs.testing.sglang_cache), and what a run must show."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from hicachefs.testing.sglang_cache import Backend, CacheSetup, ModelShape, SGLangCache, WarningLog
from hicachefs.testing.sglang_recorder import RecordingBackend
from hicachefs.testing.sglang_workload import ChatWorkload, PhaseResults, run_phases

MHA = ModelShape("Qwen/Qwen2.5-0.5B-Instruct", layers=4, kv_heads=2, head_dim=16)
MLA = ModelShape("deepseek-ai/DeepSeek-V2-Lite", layers=3, latent=128)
#: Device pool 64 pages, host pool 80: the burst's four prefetches want more than the
#: controller's prefetch capacity (half the host pool), so SGLang rate-limits some.
SMALL_POOLS = dict(device_pages=64, host_ratio=1.25)
PHASES = ("cold", "warm", "burst")
#: The zero-copy calls SGLang makes to HiCacheFS (interface_v1) and the generic ones it makes to
#: HiCacheFile for the same work; the others (exists, the v2 calls) are the same for both.
GENERIC = {"batch_get_v1": "batch_get", "batch_set_v1": "batch_set"}


@dataclass
class BackendRun:
    """One backend's run: per-phase results, the recorded calls, warnings, the client's counters."""

    phases: PhaseResults
    recorder: RecordingBackend
    warnings: List[str]
    client_stats: Dict[str, Any]  # HiCacheFS.statistics(); empty for HiCacheFile
    store: Path  # the mount, or HiCacheFile's directory

    def stored_pages(self) -> Dict[Path, Tuple[str, str]]:
        """Every page file in the store, with its (pool, key): HiCacheFS's
        ``<model>/<format>/<shard>/<pool>/<key>``, HiCacheFile's ``<key>[.<pool>]_<suffix>.bin``."""
        files = [p for p in self.store.rglob("*") if p.is_file() and not p.name.startswith(".")]
        if not files or files[0].suffix != ".bin":
            return {p: (p.parent.name, p.name) for p in files}
        pages = {}
        for p in files:
            key, _, pool = p.name.split("_")[0].partition(".")
            pages[p] = (pool or "kv", key)
        return pages


def run_backend(setup: CacheSetup, backend: Backend, workload: ChatWorkload,
                before_phase: Optional[Callable[[str], None]] = None) -> BackendRun:
    with WarningLog() as log:
        server = SGLangCache(setup, backend)
        try:
            phases = run_phases(server, workload, before_phase=before_phase)
            stats = server.backend.statistics() if backend.kind == "hicachefs" else {}
        finally:
            server.close()
    return BackendRun(phases, server.recorder, log.records, stats, Path(backend.path))


def remove_pages(backend: Backend, pool: str, keys: Iterable[str]) -> int:
    """Remove pages of ``pool`` from a store (``rm`` on the mount evicts them); how many."""
    root = Path(backend.path)
    removed = 0
    for key in keys:
        pattern = f"*/*/*/{pool}/{key}" if backend.kind == "hicachefs" else \
            f"{key}{'' if pool == 'kv' else '.' + pool}_*.bin"
        for path in root.glob(pattern):
            path.unlink()
            removed += 1
    return removed


def assert_clean(run: BackendRun) -> None:
    """No failed call, every byte exact at every step, nothing logged at WARNING, no client error."""
    recorder = run.recorder
    assert recorder.failures == []
    assert recorder.wrong_handed_over == 0 and recorder.wrong_read == 0
    assert recorder.stored_pages > 0 and recorder.read_pages > 0
    assert all(r.wrong_pages == 0 for phase in PHASES for r in run.phases.requests[phase])
    assert run.warnings == []
    assert run.client_stats.get("errors", {}) == {}
    # What the store holds is what SGLang handed over: each page file, byte for byte.
    stored = run.stored_pages()
    assert len(stored) > 0
    assert all(path.read_bytes() == bytes(recorder.expected(pool, key).numpy())
               for path, (pool, key) in stored.items())


def assert_same_decisions(ours: BackendRun, theirs: BackendRun) -> None:
    """Per phase the same hits for every request and the same prefetch outcomes; the controller
    asked both backends the same questions, in batches of the same sizes."""
    for phase in PHASES:
        assert ours.phases.hits(phase) == theirs.phases.hits(phase), phase
        assert ours.phases.prefetch_outcomes[phase] == theirs.phases.prefetch_outcomes[phase], phase
    assert {GENERIC.get(m, m) for m in ours.recorder.stats} == set(theirs.recorder.stats)
    for method, mine in ours.recorder.stats.items():
        its = theirs.recorder.stats[GENERIC.get(method, method)]
        assert (mine.calls, mine.pages, mine.hits, mine.batch_sizes) == \
            (its.calls, its.pages, its.hits, its.batch_sizes), method


def storage_hits(run: BackendRun, phase: str) -> int:
    return sum(r.storage_hit for r in run.phases.requests[phase])
