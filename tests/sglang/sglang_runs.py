"""Shared by tests/sglang: SGLang's own radix cache and cache controller run one workload over HiCacheFS on a real mount
and over SGLang's HiCacheFile, each on a fresh store (hicachefs.testing.sglang_cache)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from hicachefs.testing.sglang_cache import Backend, CacheSetup, ModelShape, SGLangCache, WarningLog
from hicachefs.testing.sglang_recorder import RecordingBackend
from hicachefs.testing.sglang_workload import ChatWorkload, PhaseResults, run_phases

MHA = ModelShape("Qwen/Qwen2.5-0.5B-Instruct", layers=4, kv_heads=2, head_dim=16)
MLA = ModelShape("deepseek-ai/DeepSeek-V2-Lite", layers=3, latent=128)
#: Device pool 64 pages, host pool 80: the burst's four prefetches want more than the
#: controller's prefetch capacity (half the host pool), so SGLang rate-limits some.
SMALL_POOLS = dict(device_pages=64, host_ratio=1.25)


@dataclass
class BackendRun:
    """One backend's run: per-phase results, the recorded calls, warnings, client errors."""

    phases: PhaseResults
    recorder: RecordingBackend
    warnings: List[str]
    client_errors: Dict[str, int]
    store: Path  # the mount, or HiCacheFile's directory

    def stored_pages(self) -> Dict[Path, str]:
        """Every page file in the store, with its key (HiCacheFile: ``<key>_<suffix>.bin``)."""
        files = [p for p in self.store.rglob("*") if p.is_file() and not p.name.startswith(".")]
        return {p: p.name if p.suffix != ".bin" else p.name.split("_")[0] for p in files}


def run_backend(setup: CacheSetup, backend: Backend, workload: ChatWorkload) -> BackendRun:
    with WarningLog() as log:
        server = SGLangCache(setup, backend)
        try:
            phases = run_phases(server, workload)
            errors = dict(server.backend.statistics()["errors"]) if backend.kind == "hicachefs" else {}
        finally:
            server.close()
    return BackendRun(phases, server.recorder, log.records, errors, Path(backend.path))
