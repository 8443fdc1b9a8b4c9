"""Fixtures for tests/sglang: one workload, SGLang's cache over HiCacheFS and over HiCacheFile."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Dict, Optional

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hicachefs_testing.sglang_cache import Backend, CacheSetup  # noqa: E402
from hicachefs_testing.sglang_workload import ChatWorkload  # noqa: E402
from sglang_runs import BackendRun, run_backend  # noqa: E402


@pytest.fixture
def side_by_side(mount_factory, tmp_path):
    """``side_by_side(setup, workload, before_phase=None, extra=None)``: {"hicachefs": BackendRun,
    "file": BackendRun}; ``before_phase(name, backend)`` runs as each phase starts on each backend."""

    def run(setup: CacheSetup, workload: ChatWorkload = ChatWorkload(),
            before_phase: Optional[Callable[[str, Backend], None]] = None,
            extra: Optional[dict] = None) -> Dict[str, BackendRun]:
        """``extra``: HiCacheFS's extra_config beyond the mountpoint."""
        mount = mount_factory("--memory", "256M")
        runs = {}
        for backend in (Backend("hicachefs", str(mount.path), dict(extra or {})),
                        Backend("file", str(tmp_path / "hicache_file"))):
            hook = None if before_phase is None else (lambda phase, b=backend: before_phase(phase, b))
            runs[backend.kind] = run_backend(setup, backend, workload, hook)
        return runs

    return run
