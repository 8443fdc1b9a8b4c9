"""Fixtures for the client's tests: a store root that is a plain directory or a live mount."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402


@pytest.fixture(params=["plain", "mount"])
def store_root(request, tmp_path) -> Path:
    """Where pages go: a plain temporary directory, or a live hicachefs mount (256 MiB RAM)."""
    if request.param == "plain":
        root = tmp_path / "plain"
        root.mkdir()
        return root
    return request.getfixturevalue("hicachefs_mount")


@pytest.fixture
def plain_root(tmp_path) -> Path:
    root = tmp_path / "plain"
    root.mkdir()
    return root


def storage_config(mountpoint=None, *, model="Qwen/Qwen2.5-0.5B-Instruct", mla=False, tp=(0, 1),
                   pp=(0, 1), cp=(0, 1), metrics=False, extra=None, **more):
    extra_config = {"backend_name": "hicachefs", "module_path": "hicachefs_client",
                    "class_name": "HiCacheFS", "interface_v1": 1}
    if mountpoint is not None:
        extra_config["mountpoint"] = str(mountpoint)
    extra_config.update(extra or {})
    return HiCacheStorageConfig(
        tp_rank=tp[0], tp_size=tp[1], pp_rank=pp[0], pp_size=pp[1], attn_cp_rank=cp[0],
        attn_cp_size=cp[1], is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=True, model_name=model, extra_config=extra_config, **more)
