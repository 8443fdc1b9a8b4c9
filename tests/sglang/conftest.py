"""Fixtures for tests/sglang: one workload, SGLang's cache over HiCacheFS and over HiCacheFile."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hicachefs.testing.sglang_cache import Backend, CacheSetup  # noqa: E402
from hicachefs.testing.sglang_workload import ChatWorkload  # noqa: E402
from sglang_runs import BackendRun, run_backend  # noqa: E402


@pytest.fixture
def side_by_side(mount_factory, tmp_path):
    """``side_by_side(setup, workload)``: {"hicachefs": BackendRun, "file": BackendRun}."""

    def run(setup: CacheSetup, workload: ChatWorkload = ChatWorkload()) -> Dict[str, BackendRun]:
        mount = mount_factory("--memory", "256M")
        return {"hicachefs": run_backend(setup, Backend("hicachefs", str(mount.path)), workload),
                "file": run_backend(setup, Backend("file", str(tmp_path / "hicache_file")), workload)}

    return run
