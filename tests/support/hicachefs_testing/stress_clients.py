"""A ``HiCacheFS`` on a mount with a CPU host pool, as one of SGLang's ranks has it, and labelled
pages put into and taken out of that pool: what the stress modes that read through the client
share (``plane_load``, ``replace_load``, ``fetch_limits``).

Why: those modes judge every page the client reports read by its bytes, so they need pages
whose bytes say which write they are (``workload.labelled_content``) in the host pool's own
layout, and the pool directory the client keeps them in, found on the mount as any user would
(not asked of the client's internals).

Imports torch and SGLang's config class (a few seconds): only the modes that need them do.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

from hicachefs_testing.host_pools import MHAHostPool, page_bytes
from hicachefs_client import HiCacheFS

#: The stress pages' geometry: 4 layers, 2 heads of 64, 64 tokens a page, bfloat16: 128 KiB.
GEOMETRY = {"layer_num": 4, "head_num": 2, "head_dim": 64, "page_size": 64}


def host_pool(pages: int, **geometry) -> MHAHostPool:
    return MHAHostPool(pages=pages, **{**GEOMETRY, **geometry})


def client(mount: Path, model: str, pool: MHAHostPool, **extra) -> HiCacheFS:
    """A client of ``mount`` for ``model`` (one model's pages are one pool directory), zero copy
    (SGLang's ``interface_v1``); ``extra``: more of its extra_config (``data_plane``...)."""
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=model,
        extra_config={"backend_name": "hicachefs", "module_path": "hicachefs_client", "class_name": "HiCacheFS",
                      "interface_v1": 1, "mountpoint": str(mount), **extra})
    fs = HiCacheFS(config, {})
    fs.register_mem_pool_host(pool)
    return fs


def indices(pool: MHAHostPool, pages) -> torch.Tensor:
    """The host indices of pool pages ``pages``, as SGLang's allocator hands them to the backend."""
    return torch.cat([pool.page_indices(p) for p in pages])


def put(pool: MHAHostPool, page: int, data: bytes) -> None:
    """Make page ``page`` of the pool hold ``data`` as its stored bytes (``page_bytes``)."""
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(pool.dtype)
    pool.set_from_flat_data_page(page * pool.page_size, flat)


def taken(pool: MHAHostPool, page: int) -> bytes:
    return page_bytes(pool, page)


def page_size(pool: MHAHostPool) -> int:
    return len(page_bytes(pool, 0))


def pool_directory(mount: Path, model: str) -> Path:
    """The pool directory the client of ``model`` keeps its KV pages in (once it wrote one)."""
    for directory, _, files in os.walk(mount / model):
        if files and Path(directory).name == "kv":
            return Path(directory)
    raise FileNotFoundError(f"no pool directory of {model} under {mount}")
