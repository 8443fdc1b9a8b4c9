"""HiCacheFS against SGLang itself: its backend factory, and its own file backend as reference."""

from __future__ import annotations

import itertools
import logging
import random
import subprocess
import sys

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheFile,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from storage_configs import storage_config
from hicachefs_client import HiCacheFS
from hicachefs_testing.host_pools import MHAHostPool, MLAHostPool
from test_backend import MODEL, indices, key


def file_backend(tmp_path, **cfg) -> HiCacheFile:
    return HiCacheFile(storage_config(None, extra={"file_storage_path": str(tmp_path / "hicache_file")},
                                      **cfg))


def test_the_contracts_encoders_load_without_torch():
    """A tool that only encodes the contract's requests (an ingest header) imports neither torch
    nor SGLang (some 4 s of a core). HiCacheFS loads when asked for, as SGLang's factory asks
    (the next test)."""
    script = ("import sys\nimport hicachefs_client.ingest\n"
              "print([m for m in ('torch', 'sglang') if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_factory_loads_it_through_dynamic(store_root):
    pool = MHAHostPool()
    config = storage_config(store_root)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    assert isinstance(backend, HiCacheFS)
    backend.register_mem_pool_host(pool)
    assert backend.batch_set_v1([key("factory")], indices(pool, [1])) == [True]
    assert backend.batch_exists([key("factory")]) == 1


@pytest.mark.parametrize("kind,layout", [
    ("mha", "page_first"), ("mha", "page_first_direct"), ("mha", "layer_first"),
    ("mla", "page_first"), ("mla", "layer_first"),
])
def test_pages_are_byte_identical_to_hicache_file(store_root, tmp_path, kind, layout):
    mla = kind == "mla"
    pool = MHAHostPool(layout=layout) if not mla else MLAHostPool(layout=layout)
    reference = file_backend(tmp_path, mla=mla)
    reference.register_mem_host_pool_v2(pool, PoolName.KV)
    ours = HiCacheFS(storage_config(store_root, mla=mla), {})
    ours.register_mem_pool_host(pool)
    keys = [key("identical", kind, layout, i) for i in range(3)]
    pages = [4, 0, 6]
    transfer = PoolTransfer(name=PoolName.KV, host_indices=indices(pool, pages), keys=keys)
    assert reference.batch_set_v2([transfer]) == {PoolName.KV: [True] * 3}
    assert ours.batch_set_v1(keys, indices(pool, pages)) == [True] * 3
    shard, size = ("all", "9KiB") if mla else ("tp0of1", "8KiB")
    for k in keys:
        theirs = (tmp_path / "hicache_file" / f"{reference._get_suffixed_key(k)}.bin").read_bytes()
        mine = (store_root / MODEL / f"bfloat16-{layout}-16-{size}" / shard / "kv" / k).read_bytes()
        assert mine == theirs
    # And what SGLang's backend wrote, HiCacheFS reads back (same bytes, same order).
    pool.zero()
    for k, page in zip(keys, [1, 2, 3]):
        reference.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=indices(pool, [page]),
                                             keys=[k])])
    expected = pool.kv_buffer.clone()
    pool.fill_random(seed=5)
    assert ours.batch_get_v1(keys, indices(pool, [1, 2, 3])) == [True] * 3
    for page in [1, 2, 3]:
        lo = page * pool.page_size
        assert torch.equal(pool.get_data_page(lo).view(torch.uint8),
                           _page_of(expected, pool, lo).view(torch.uint8))


def _page_of(buffer, pool, index):
    saved = pool.kv_buffer
    pool.kv_buffer = buffer
    try:
        return pool.get_data_page(index).clone()
    finally:
        pool.kv_buffer = saved


def _pools():
    kv = MHAHostPool(page_size=4, pages=8, layer_num=2, head_num=1, head_dim=8)
    mamba = MLAHostPool(page_size=1, pages=8, layer_num=2, kv_cache_dim=8, dtype=torch.float32)
    swa = MHAHostPool(page_size=4, pages=8, layer_num=1, head_num=1, head_dim=8)
    return {PoolName.KV: kv, PoolName.MAMBA: mamba, PoolName.SWA: swa}


def _patterns(n_keys, count, seed):
    """(present KV pages, present mamba pages, present swa pages) as sets of page numbers."""
    rng = random.Random(seed)
    fixed = [
        (set(range(n_keys)),) * 3,                     # everything
        (set(), set(range(n_keys)), set(range(n_keys))),  # no KV
        (set(range(n_keys)), set(), set()),            # only KV
        (set(range(n_keys)), {n_keys - 1}, set(range(n_keys))),  # only the last mamba page
        (set(range(4)), {1, 3}, {0, 1, 2}),            # holes everywhere
        (set(range(n_keys)) - {2}, {0, 1, 4, 5}, set(range(n_keys)) - {4}),
    ]
    randoms = [tuple({i for i in range(n_keys) if rng.random() < p} for p in (0.85, 0.6, 0.8))
               for _ in range(count)]
    return fixed + randoms


@pytest.mark.parametrize("policies", [
    (PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.ALL_PAGES),
    (PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES),
    (PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.TRAILING_PAGES),
])
def test_batch_exists_v2_matches_hicache_file(store_root, tmp_path, policies):
    pools = _pools()
    reference = file_backend(tmp_path)
    ours = HiCacheFS(storage_config(store_root), {})
    for name, pool in pools.items():
        reference.register_mem_host_pool_v2(pool, name)
        ours.register_mem_host_pool_v2(pool, name)
    n_keys = 6
    patterns = _patterns(n_keys, count=10 if "mnt" in str(store_root) else 30, seed=len(str(policies)))
    seen = set()
    for number, present in enumerate(patterns):
        keys = [key("v2", policies, number, i) for i in range(n_keys)]
        for (name, pool), pages in zip(pools.items(), present):
            chosen = sorted(pages)
            if not chosen:
                continue
            slots = indices(pool, range(len(chosen)))
            transfer = PoolTransfer(name=name, host_indices=slots, keys=[keys[i] for i in chosen])
            assert reference.batch_set_v2([transfer]) == {name: [True] * len(chosen)}
            assert ours.batch_set_v2([transfer]) == {name: [True] * len(chosen)}
        for window_mamba, window_swa in itertools.product([1, 2, 3], [1, 4]):
            transfers = [
                PoolTransfer(name=PoolName.MAMBA, keys=keys[-window_mamba:], hit_policy=policies[0]),
                PoolTransfer(name=PoolName.SWA, keys=keys[-window_swa:], hit_policy=policies[1]),
            ]
            for query in (keys, keys[:3], keys[1:]):
                expected = reference.batch_exists_v2(query, transfers)
                got = ours.batch_exists_v2(query, transfers)
                assert got == expected, (number, present, window_mamba, window_swa, query)
                seen.add((expected.kv_hit_pages, tuple(expected.restorable_prefix_pages)))
            expected = reference.batch_exists_v2(keys, None)
            assert ours.batch_exists_v2(keys, None) == expected
            assert ours.batch_exists(keys) == expected.kv_hit_pages
    assert len(seen) >= 6  # the patterns reach many different answers


@pytest.mark.parametrize("data_plane", [True, False])
def test_a_pool_of_pages_without_bytes_is_stored_as_hicache_file_stores_it(store_root, tmp_path, data_plane):
    """DeepSeek V4's KV anchor is SGLang's ``LogicalHostPool``: its pages hold no bytes (the
    group's other pools hold them) and only say that a prefix was stored. HiCacheFile stores
    an empty file per page; a page here is one byte at least, so each is a one-byte marker.
    Before, every call failed (a division by its page size of 0): V4 never hit storage."""
    from hicachefs_testing import sglang_cpu

    sglang_cpu.install()  # (the import chain below reaches torchvision)
    from sglang.srt.mem_cache.memory_pool_host import LogicalHostPool

    pool = LogicalHostPool(64 * 8, 64)
    keys = [key("logical anchor", data_plane, i) for i in range(4)]
    host = pool.alloc(64 * 4)
    reference = file_backend(tmp_path, mla=True)
    reference.register_mem_host_pool_v2(pool, PoolName.KV)
    stored_by_sglang = PoolTransfer(name=PoolName.KV, host_indices=host[: 64 * 3], keys=keys[:3])
    assert reference.batch_set_v2([stored_by_sglang]) == {PoolName.KV: [True] * 3}
    fs = HiCacheFS(storage_config(store_root, mla=True, extra={"data_plane": data_plane}), {})
    fs.register_mem_pool_host(pool)
    assert fs.batch_exists(keys) == 0
    assert fs.batch_set_v1(keys[:2], host[: 64 * 2]) == [True] * 2
    third = PoolTransfer(name=PoolName.KV, host_indices=host[64 * 2 : 64 * 3], keys=keys[2:3])
    assert fs.batch_set_v2([third]) == {PoolName.KV: [True]}
    assert fs.batch_exists(keys) == 3
    assert fs.batch_get_v1(keys, host) == [True, True, True, False]
    fs.settle()
    stored = [p for p in store_root.rglob("*") if p.is_file() and p.name in keys]
    assert sorted(p.name for p in stored) == sorted(keys[:3]) and {p.stat().st_size for p in stored} == {1}
    reader = HiCacheFS(storage_config(store_root, mla=True, extra={"data_plane": data_plane}), {})
    reader.register_mem_pool_host(LogicalHostPool(64 * 8, 64))
    assert reader.batch_exists(keys) == 3


def asymmetric_pool(layout="page_first"):
    """SGLang's ``AsymmetricMHATokenToKVPoolHost`` (K and V of other head sizes, MiMo-V2), its
    buffers set as its ``init_kv_buffer`` makes them (its ``__init__`` needs a device pool)."""
    from hicachefs_testing import sglang_cpu

    sglang_cpu.install()  # (the import chain below reaches torchvision)
    from sglang.srt.mem_cache.pool_host.mha import AsymmetricMHATokenToKVPoolHost

    pool = object.__new__(AsymmetricMHATokenToKVPoolHost)
    pool.layout, pool.page_size, pool.layer_num, pool.head_num, pool.head_dim, pool.v_head_dim = \
        layout, 16, 2, 2, 16, 8
    pool.dtype, pool.device, pool.pin_memory, pool.size = torch.bfloat16, "cpu", False, 16 * 8
    pool.kv_buffer = [torch.randn(pool.size, 2, 2, 16).to(torch.bfloat16),
                      torch.randn(pool.size, 2, 2, 8).to(torch.bfloat16)]
    return pool


@pytest.mark.parametrize("data_plane", [True, False])
def test_a_pool_without_flat_pages_is_served_by_zero_copy(hicachefs_mount, caplog, data_plane):
    """SGLang's pool for K and V of other head sizes raises NotImplementedError for its flat
    page (``get_dummy_flat_data_page``, ``get_data_page``) but names its page's pieces; before,
    the layout asked the flat page for the page size and nothing was ever stored."""
    source, target = asymmetric_pool(), asymmetric_pool()
    keys = [key("asymmetric", data_plane, i) for i in range(3)]
    writer = HiCacheFS(storage_config(hicachefs_mount, extra={"data_plane": data_plane}), {})
    writer.register_mem_pool_host(source)
    assert writer.batch_set_v1(keys, torch.arange(16, 64)) == [True] * 3
    writer.settle()
    reader = HiCacheFS(storage_config(hicachefs_mount, extra={"data_plane": data_plane}), {})
    reader.register_mem_pool_host(target)
    assert reader.batch_exists(keys) == 3
    assert reader.batch_get_v1(keys, torch.arange(64, 112)) == [True] * 3
    for buffer in range(2):  # K, then V: each side's tokens as they were
        assert torch.equal(target.kv_buffer[buffer][64:112], source.kv_buffer[buffer][16:64])
    page = (16 * 2 * 2 * 16 + 16 * 2 * 2 * 8) * 2
    stored = [p for p in hicachefs_mount.rglob("*") if p.name in keys]
    assert len(stored) == 3 and {p.stat().st_size for p in stored} == {page}
    assert reader.statistics()["errors"] == {}
    with caplog.at_level(logging.ERROR, logger="hicachefs_client"):
        assert reader.get(keys[0]) is None and reader.get(keys[1]) is None  # a flat page it cannot make
    refusals = [r for r in caplog.records if "no flat pages" in r.getMessage()]
    assert len(refusals) == 1
