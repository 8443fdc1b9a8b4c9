"""Shared by tests/sglang: SGLang's own radix cache and cache controller run one workload over HiCacheFS on a real mount
and over SGLang's HiCacheFile, each on a fresh store (hicachefs_testing.sglang_cache), and what a run must show."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from hicachefs_testing.sglang_cache import (Backend, CacheSetup, MambaShape, ModelShape, SGLangCache, SlidingWindow,
                                            WarningLog)
from hicachefs_testing.sglang_recorder import RecordingBackend
from hicachefs_testing.sglang_store import StoredPage, stored_pages
from hicachefs_testing.sglang_workload import ChatWorkload, PhaseResults, run_phases

MHA = ModelShape("Qwen/Qwen2.5-0.5B-Instruct", layers=4, kv_heads=2, head_dim=16)
MLA = ModelShape("deepseek-ai/DeepSeek-V2-Lite", layers=3, latent=128)
#: Device pool 64 pages, host pool 80: the burst's four prefetches want more than the
#: controller's prefetch capacity (half the host pool), so SGLang rate-limits some.
SMALL_POOLS = dict(device_pages=64, host_ratio=1.25)
#: Mamba2 layers beside full attention, as Qwen3-Next has them.
MAMBA_HYBRID = ModelShape("Qwen/Qwen3-Next-80B-A3B-Instruct", layers=4, kv_heads=2, head_dim=16,
                          mamba=MambaShape(layers=(0, 1, 2)))
#: Sliding-window layers (16 tokens) beside full attention, as gpt-oss has them.
SWA_HYBRID = ModelShape("openai/gpt-oss-20b", layers=4, kv_heads=2, head_dim=16,
                        swa=SlidingWindow(layers=(0, 1, 2), window=16))
#: Pages of one token (see hicachefs_testing.sglang_pools); device pool 400 tokens, host pool
#: 500: the burst still outgrows the controller's prefetch capacity.
HYBRID_POOLS = dict(page_size=1, device_pages=400, host_ratio=1.25)
HYBRID_WORKLOAD = ChatWorkload(conversations=4, system_tokens=48, user_tokens=12, reply_tokens=12)
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

    def stored_pages(self) -> Dict[Path, StoredPage]:
        """Every page file in the store, with whose page it is."""
        return stored_pages(self.store)


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
    assert all(path.read_bytes() == bytes(recorder.expected(page.pool, page.key).numpy())
               for path, page in stored.items())


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
