"""The SGLang storage config a client test gives ``HiCacheFS``, as SGLang would build it.

A module of its own, not the conftest: pytest loads several directories' conftests under the
one name ``conftest``, so a test that imported from it could get another directory's.

A mountpoint that is no live hicachefs mount when the config is made (the ``plain`` store roots,
a root not made yet) is served as a plain directory (``plain_directory``), as these tests of the
file-per-page path mean it; a test of a mount that comes later says ``plain_directory: False``."""

from __future__ import annotations

from pathlib import Path

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig


def storage_config(mountpoint=None, *, model="Qwen/Qwen2.5-0.5B-Instruct", mla=False, tp=(0, 1),
                   pp=(0, 1), cp=(0, 1), metrics=False, extra=None, **more):
    extra_config = {"backend_name": "hicachefs", "module_path": "hicachefs_client",
                    "class_name": "HiCacheFS", "interface_v1": 1}
    if mountpoint is not None:
        extra_config["mountpoint"] = str(mountpoint)
        if not (Path(mountpoint) / ".hicachefs").is_dir():
            extra_config["plain_directory"] = True
    extra_config.update(extra or {})
    return HiCacheStorageConfig(
        tp_rank=tp[0], tp_size=tp[1], pp_rank=pp[0], pp_size=pp[1], attn_cp_rank=cp[0],
        attn_cp_size=cp[1], is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=True, model_name=model, extra_config=extra_config, **more)
