"""HiCacheFS method by method, on a plain directory and on a live mount."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest
import torch

from pages import wait_until
from storage_configs import storage_config
from hicachefs_client import HiCacheFS
from hicachefs_client.sglang_types import PoolHitPolicy, PoolName, PoolTransfer
from hicachefs_testing import mounting
from hicachefs_testing.host_pools import MHAHostPool, MLAHostPool, page_bytes

MODEL = "Qwen--Qwen2.5-0.5B-Instruct"


def key(*parts) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def make_pool(kind, layout, **kw):
    cls = MHAHostPool if kind == "mha" else MLAHostPool
    return cls(layout=layout, **kw)


def make_fs(root, pool=None, **cfg) -> HiCacheFS:
    fs = HiCacheFS(storage_config(root, **cfg), {})
    if pool is not None:
        fs.register_mem_pool_host(pool)
    return fs


def indices(pool, pages):
    return torch.cat([pool.page_indices(p) for p in pages])


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, fs in os.walk(root) for f in fs if ".hicachefs" not in d)


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_v1_round_trip(store_root, kind, layout):
    src = make_pool(kind, layout)
    fs = make_fs(store_root, src, mla=(kind == "mla"))
    keys = [key(kind, layout, i) for i in range(4)]
    src_pages = [2, 5, 1, 3]
    assert fs.batch_set_v1(keys, indices(src, src_pages)) == [True] * 4

    fmt = f"bfloat16-{layout}-16-{'9KiB' if kind == 'mla' else '8KiB'}"
    shard = "all" if kind == "mla" else "tp0of1"
    for k, page in zip(keys, src_pages):
        path = store_root / MODEL / fmt / shard / "kv" / k
        assert path.read_bytes() == page_bytes(src, page)
    assert fs._layout("kv").zero_copy == (layout != "layer_first")

    dst = make_pool(kind, layout)
    dst.zero()
    reader = make_fs(store_root, dst, mla=(kind == "mla"))
    dst_pages = [0, 7, 4, 6]
    assert reader.batch_get_v1(keys, indices(dst, dst_pages)) == [True] * 4
    for s, d in zip(src_pages, dst_pages):
        assert page_bytes(dst, d) == page_bytes(src, s)
    assert page_bytes(dst, 1) == bytes(len(page_bytes(dst, 1)))  # untouched pages stay zero
    stats = reader.statistics()
    assert stats["hits"] == 4 and stats["bytes_read"] == 4 * len(page_bytes(src, 0))
    assert fs.statistics()["pages_written"] == 4


def test_existing_pages_are_not_rewritten(store_root):
    pool = MHAHostPool()
    fs = make_fs(store_root, pool)
    keys = [key("skip", i) for i in range(3)]
    assert fs.batch_set_v1(keys[:2], indices(pool, [0, 1])) == [True, True]
    path = store_root / MODEL / "bfloat16-page_first-16-8KiB" / "tp0of1" / "kv" / keys[0]
    before = path.stat()
    pool.fill_random(seed=9)  # different bytes: must not replace the stored page
    assert fs.batch_set_v1(keys, indices(pool, [0, 1, 2])) == [True] * 3
    assert path.stat().st_ino == before.st_ino and path.stat().st_mtime_ns == before.st_mtime_ns
    # On a plain directory the client asks first and skips them; on a mount the daemon keeps
    # them as they are (its ingest file's KEEP_EXISTING), and the client counts them stored.
    stats = fs.statistics()
    assert stats["pages_written"] + stats["pages_skipped"] == 5 and stats["pages_written"] >= 3
    assert fs.set(keys[0], pool.get_data_page(0)) is True
    assert fs.statistics()["pages_skipped"] == stats["pages_skipped"] + 1


def test_misses_leave_the_pool_alone(store_root):
    pool = MHAHostPool()
    before = pool.kv_buffer.clone()
    fs = make_fs(store_root, pool)
    assert fs.batch_get_v1([key("none", 0), key("none", 1)], indices(pool, [0, 1])) == [False, False]
    assert torch.equal(pool.kv_buffer.view(torch.uint8), before.view(torch.uint8))
    assert fs.statistics()["misses"] == 2


def test_exists_and_longest_prefix(store_root):
    pool = MHAHostPool()
    fs = make_fs(store_root, pool)
    keys = [key("prefix", i) for i in range(5)]
    assert fs.batch_set_v1([keys[0], keys[1], keys[3]], indices(pool, [0, 1, 3])) == [True] * 3
    assert fs.batch_exists(keys) == 2
    assert fs.batch_exists(keys[:2]) == 2
    assert fs.batch_exists(keys[2:]) == 0
    assert fs.batch_exists([]) == 0
    assert fs.exists(keys[3]) and not fs.exists(keys[2])


def test_legacy_get_set(store_root):
    pool = MLAHostPool(layout="layer_first")
    fs = make_fs(store_root, pool, mla=True)
    k = [key("legacy", i) for i in range(3)]
    assert fs.set(k[0], pool.get_data_page(2 * pool.page_size, flat=True)) is True
    assert fs.batch_set(k[1:], [pool.get_data_page(i * pool.page_size) for i in (3, 4)]) is True
    out = fs.get(k[0], pool.get_dummy_flat_data_page())
    assert out is not None and torch.equal(out.view(torch.uint8), pool.get_data_page(2 * pool.page_size).view(torch.uint8))
    got = fs.batch_get(k + [key("legacy", "missing")],
                       [pool.get_dummy_flat_data_page() for _ in range(4)])
    assert got[3] is None
    assert torch.equal(got[2].view(torch.uint8), pool.get_data_page(4 * pool.page_size).view(torch.uint8))
    # A target without a pool-given location: a flat page is made for it.
    assert torch.equal(fs.get(k[1]).view(torch.uint8), pool.get_data_page(3 * pool.page_size).view(torch.uint8))
    # A non-contiguous target is filled through a staging copy.
    target = torch.zeros(2, pool.get_dummy_flat_data_page().numel(), dtype=pool.dtype)[:, 0::1][0]
    assert fs.get(k[1], target) is not None
    assert fs.get(k[0], torch.zeros(3, dtype=pool.dtype)) is None  # wrong size: a miss


def test_set_refuses_a_tensor_that_is_not_a_page_of_the_pool(store_root):
    """A tensor of another size than the pool's pages, stored, would answer exists for good,
    never be read (a miss at every size check), and keep the right page from being stored."""
    pool = MLAHostPool(layout="layer_first")
    fs = make_fs(store_root, pool, mla=True)
    page = pool.get_data_page(2 * pool.page_size, flat=True)
    assert fs.set(key("short"), page[:-1]) is False
    assert fs.batch_exists([key("short")]) == 0
    assert fs.set(key("short"), page) is True
    assert torch.equal(fs.get(key("short")).view(torch.uint8), page.view(torch.uint8))
    assert fs.statistics()["write_failures"] == 1


def test_v2_named_pools(store_root):
    kv = MHAHostPool()
    mamba = MLAHostPool(page_size=1, pages=32, layer_num=3, kv_cache_dim=40, dtype=torch.float32)
    fs = make_fs(store_root, kv)
    fs.register_mem_host_pool_v2(kv, PoolName.KV)
    fs.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    keys = [key("v2", i) for i in range(4)]
    transfers = [
        PoolTransfer(name=PoolName.KV, host_indices=indices(kv, [0, 1, 2, 3]), keys=keys),
        PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([7]), keys=keys[3:],
                     hit_policy=PoolHitPolicy.TRAILING_PAGES),
    ]
    assert fs.batch_set_v2(transfers) == {PoolName.KV: [True] * 4, PoolName.MAMBA: [True]}
    assert (store_root / MODEL / "float32-page_first-1-480B" / "tp0of1" / "mamba" / keys[3]).is_file()

    kv2, mamba2 = MHAHostPool(), MLAHostPool(page_size=1, pages=32, layer_num=3, kv_cache_dim=40,
                                             dtype=torch.float32)
    kv2.zero(), mamba2.zero()
    reader = make_fs(store_root)
    reader.register_mem_host_pool_v2(kv2, PoolName.KV)
    reader.register_mem_host_pool_v2(mamba2, PoolName.MAMBA)
    result = reader.batch_exists_v2(keys, [PoolTransfer(name=PoolName.MAMBA, keys=keys[3:],
                                                        hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert result.kv_hit_pages == 4 and result.restorable_prefix_pages == [4]
    got = reader.batch_get_v2([
        PoolTransfer(name=PoolName.KV, host_indices=indices(kv2, [4, 5, 6, 7]), keys=keys),
        PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([0]), keys=keys[3:]),
    ])
    assert got == {PoolName.KV: [True] * 4, PoolName.MAMBA: [True]}
    assert page_bytes(kv2, 6) == page_bytes(kv, 2)
    assert page_bytes(mamba2, 0) == page_bytes(mamba, 7)
    # Indices that do not cover the keys: every page fails, nothing raises.
    assert reader.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=torch.arange(5),
                                             keys=keys[:1])]) == {PoolName.KV: [False]}
    # A pool nobody registered.
    assert reader.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(16),
                                             keys=keys[:1])]) == {PoolName.SWA: [False]}


def test_clear_removes_only_own_shard(store_root):
    pool = MHAHostPool()
    rank0 = make_fs(store_root, pool, tp=(0, 2))
    rank1 = make_fs(store_root, pool, tp=(1, 2))
    keys = [key("clear", i) for i in range(2)]
    assert rank0.batch_set_v1(keys, indices(pool, [0, 1])) == [True, True]
    assert rank1.batch_set_v1(keys, indices(pool, [0, 1])) == [True, True]
    assert rank0.clear() is True
    assert not (store_root / MODEL / "bfloat16-page_first-16-8KiB" / "tp0of2").exists()
    assert rank0.batch_exists(keys) == 0 and rank1.batch_exists(keys) == 2
    # Directories come back on the next write.
    assert rank0.batch_set_v1(keys, indices(pool, [0, 1])) == [True, True]
    assert rank0.batch_exists(keys) == 2


def test_a_clear_during_which_a_page_is_stored_succeeds_and_keeps_only_that_page(store_root, monkeypatch):
    """SGLang's backup thread may store a page while ``clear`` runs: a page landing after the
    ``rm -r`` listed its pool kept the directory, and ``clear`` said it failed (ENOTEMPTY)."""
    pool = MHAHostPool()
    fs = make_fs(store_root, pool)
    old, late = [key("before", i) for i in range(3)], [key("during", 0)]
    assert fs.batch_set_v1(old, indices(pool, [0, 1, 2])) == [True] * 3
    real_rmdir, landed = os.rmdir, []

    def rmdir_after_a_backup(path, *args, **kwargs):
        if not landed:  # the first directory's last entry is gone: a backup lands now
            landed.append(fs.batch_set_v1(late, indices(pool, [3])))
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir_after_a_backup)
    assert fs.clear() is True
    monkeypatch.undo()
    assert landed == [[True]]
    assert fs.batch_exists(old) == 0 and fs.batch_exists(late) == 1
    dst = MHAHostPool()
    fs.register_mem_pool_host(dst)
    assert fs.batch_get_v1(late, indices(dst, [0])) == [True]
    assert page_bytes(dst, 0) == page_bytes(pool, 3)


def stored_on_another_host(mount_factory, tmp_path, tag: str):
    """Two hosts on one shared directory, host A having stored 4 pages: (host B, pool, names)."""
    shared = tmp_path / "shared"
    host_a = mount_factory("--memory", "64M", "--shared", str(shared))
    host_b = mount_factory("--memory", "64M", "--shared", str(shared))
    pool = MHAHostPool()
    names = [key(tag, i) for i in range(4)]
    assert make_fs(host_a.path, pool).batch_set_v1(names, indices(pool, range(4))) == [True] * 4
    return host_b, pool, names


def test_a_clear_that_leaves_pages_another_hosts_shared_tier_holds_says_so(mount_factory, tmp_path):
    """On a second host, pages only the shared tier holds are not listed, so the ``rm -r`` of
    ``clear`` cannot remove them and the pool's rmdir fails (ENOTEMPTY): False, the pages kept,
    not True as for a page stored while the clear ran (found by review)."""
    host_b, pool, names = stored_on_another_host(mount_factory, tmp_path, "elsewhere")
    on_b = make_fs(host_b.path, pool)
    seen_on_b = [host_b.path / MODEL / "bfloat16-page_first-16-8KiB" / "tp0of1" / "kv" / name for name in names]
    wait_until(lambda: all(path.exists() for path in seen_on_b))  # (by name: batch_exists fetches them here)
    assert on_b.clear() is False
    assert all(path.exists() for path in seen_on_b) and on_b.batch_exists(names) == 4


def test_pages_fetched_from_another_hosts_shared_tier_are_listed_and_cleared(mount_factory, tmp_path):
    """Pages another host wrote, found and read here (fetched into this host's RAM), came with no
    directory made above their pool: ``ls`` of the root, ``find`` and the ``rm -r`` of ``clear``
    saw none of them, and clear answered False with the pages kept (found by review)."""
    host_b, pool, names = stored_on_another_host(mount_factory, tmp_path, "fetched")
    on_b = make_fs(host_b.path, pool)
    wait_until(lambda: on_b.batch_exists(names) == 4)
    dst = MHAHostPool()
    on_b.register_mem_pool_host(dst)
    assert on_b.batch_get_v1(names, indices(dst, range(4))) == [True] * 4
    assert [page_bytes(dst, i) for i in range(4)] == [page_bytes(pool, i) for i in range(4)]
    assert os.listdir(host_b.path) == [MODEL]
    assert len(files_under(host_b.path)) == 4
    assert on_b.clear() is True
    # Gone here and from the shared tier (host A's own RAM copies stay: docs/shared-tier.md).
    assert files_under(host_b.path) == [] and on_b.batch_exists(names) == 0


def test_a_clear_of_a_mount_gone_says_so(mount_factory, tmp_path):
    """Unmounted, the mountpoint is bare: ``clear`` found nothing there and said True, and the
    pages were back at the next mount of the same disk (found by review)."""
    flags = ("--memory", "64M", "--disk", str(tmp_path / "disk"), "--disk-size", "64M")
    mount = mount_factory(*flags)
    pool = MHAHostPool()
    fs = make_fs(mount.path, pool)
    names = [key("gone", i) for i in range(4)]
    assert fs.batch_set_v1(names, indices(pool, range(4))) == [True] * 4
    fs.settle()
    mounting.stop(mount)
    assert fs.clear() is False
    mount_factory(*flags, path=mount.path)
    assert make_fs(mount.path, pool).batch_exists(names) == 4


def test_mla_pages_have_one_writer(store_root):
    pool = MLAHostPool()
    writer = make_fs(store_root, pool, mla=True, tp=(0, 2))
    other = make_fs(store_root, pool, mla=True, tp=(1, 2))
    keys = [key("mla", i) for i in range(2)]
    assert other.batch_set_v1(keys, indices(pool, [0, 1])) == [True, True]
    assert other.batch_exists(keys) == 0  # nothing written by a non-writer
    assert writer.batch_set_v1(keys, indices(pool, [0, 1])) == [True, True]
    assert other.batch_exists(keys) == 2  # the shared "all" shard
    assert other.clear() is True and other.batch_exists(keys) == 2  # not its shard to clear


def test_an_mha_draft_beside_an_mla_target_keeps_each_ranks_own_heads(store_root):
    """An MHA draft model's KV (EAGLE beside an MLA target) holds each TP rank's share of the
    heads: every rank stores its own, and a rank never loads another's as a hit."""
    ranks = []
    for rank in (0, 1):
        target, draft = MLAHostPool(), MHAHostPool(head_num=2)
        draft.fill_random(seed=100 + rank)
        fs = make_fs(store_root, target, mla=True, tp=(rank, 2))
        fs.register_mem_host_pool_v2(draft, PoolName.DRAFT)
        ranks.append((fs, draft))
    page = [key("draft", 0)]
    for fs, draft in ranks:
        stored = fs.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=indices(draft, [1]), keys=page)])
        assert stored == {PoolName.DRAFT: [True]}
        fs.settle()
    for fs, draft in ranks:
        own = page_bytes(draft, 1)
        got = fs.batch_get_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=indices(draft, [2]), keys=page)])
        assert got == {PoolName.DRAFT: [True]} and page_bytes(draft, 2) == own
    assert page_bytes(ranks[0][1], 1) != page_bytes(ranks[1][1], 1)
    draft_dirs = sorted({os.path.dirname(f) for f in files_under(store_root) if "/draft/" in f})
    assert [d.split("/")[-2] for d in draft_dirs] == ["tp0of2", "tp1of2"]


def test_invalid_keys_are_refused(store_root, caplog):
    pool = MHAHostPool()
    fs = make_fs(store_root, pool)
    bad = ["", ".hidden", "..", "a/b", "nul\0", "k" * 201, "../../escape"]
    good = key("good")
    keys = bad + [good]
    with caplog.at_level(logging.WARNING, logger="hicachefs_client"):
        assert fs.batch_set_v1(keys, indices(pool, range(len(keys)))) == [False] * len(bad) + [True]
        assert fs.batch_get_v1(keys, indices(pool, range(len(keys)))) == [False] * len(bad) + [True]
        assert fs.batch_exists(keys) == 0
        assert fs.batch_exists([good, ""]) == 1
        assert not any(fs.exists(k) for k in bad)
        assert fs.set("a/b", pool.get_data_page(0)) is False
        assert fs.get(".x", pool.get_dummy_flat_data_page()) is None
        assert fs.batch_exists_v2(["", good]).kv_hit_pages == 0
    assert files_under(store_root) == [f"{MODEL}/bfloat16-page_first-16-8KiB/tp0of1/kv/{good}"]
    refusals = [r for r in caplog.records if "refused page key" in r.getMessage()]
    assert len(refusals) == 1  # logged once, counted always
    assert fs.statistics()["refused_keys"] >= 20


def test_get_stats(store_root):
    pool = MHAHostPool()
    fs = make_fs(store_root, pool, metrics=True)
    keys = [key("stats", i) for i in range(3)]
    fs.batch_set_v1(keys, indices(pool, [0, 1, 2]))
    fs.batch_get_v1(keys + [key("stats", "missing")], indices(pool, [3, 4, 5, 6]))
    fs.settle()  # get_stats waits for no commit under way
    metrics = fs.get_stats()
    assert metrics.backup_pgs == [3] and metrics.prefetch_pgs == [3]
    assert len(metrics.backup_bandwidth) == 1 and metrics.prefetch_bandwidth[0] > 0
    counters = metrics.counters
    assert counters["hits"] == 3 and counters["misses"] == 1
    assert counters["bytes_written"] == counters["bytes_read"] == 3 * len(page_bytes(pool, 0))
    again = fs.get_stats()
    assert again.backup_pgs == [] and again.counters["hits"] == 3
    fs.close()
    assert fs.batch_exists(keys) == 3  # close() drops handles; later calls reopen them


def test_a_longer_page_is_a_miss_also_when_read_by_its_own_file(hicachefs_mount):
    """Without the plane, pages go through the fetch file, which answers a page of another size
    as a miss; a key a fetch line cannot carry is read by its own file, and a longer file there
    filled the buffers with its first bytes and was a hit."""
    pool = MHAHostPool(pages=8)
    fs = make_fs(hicachefs_mount, pool, extra={"data_plane": False})
    size = fs._layout("kv").page_bytes
    longer = os.urandom(size + 4096)  # not a page of this pool (set() refuses it: written as a file)
    plain, odd = key("long", 0), "long\npage"
    directory = hicachefs_mount / fs._dir_of("kv")
    directory.mkdir(parents=True, exist_ok=True)
    for name in (plain, odd):
        (directory / f".{name[:8]}").write_bytes(longer)
        os.rename(directory / f".{name[:8]}", directory / name)
    assert fs.batch_get_v1([plain], indices(pool, [0])) == [False]
    assert fs.batch_get_v1([odd], indices(pool, [1])) == [False]


def test_pools_of_another_page_size_keep_their_own_pages(hicachefs_mount):
    """Two servers of one model whose host pools differ only in their layers (one with
    speculative decoding: SGLang packs the draft's layers into the target's host pool) wrote
    pages of two sizes under one directory and the same keys: each took the other's page for
    missing (of the wrong size) and replaced it, so neither ever hit."""
    servers = []
    for layers in (4, 5):
        pool = MHAHostPool(layer_num=layers)
        pool.fill_random(seed=layers)
        servers.append((make_fs(hicachefs_mount, pool), pool))
    keys = [key("one prompt", i) for i in range(4)]
    for fs, pool in servers:
        assert fs.batch_exists(keys) == 0
        assert fs.batch_set_v1(keys, indices(pool, range(4))) == [True] * 4
        fs.settle()
    for fs, pool in servers:
        assert fs.batch_exists(keys) == 4
        want = [page_bytes(pool, p) for p in range(4)]
        pool.zero()
        assert fs.batch_get_v1(keys, indices(pool, range(4, 8))) == [True] * 4
        assert [page_bytes(pool, p) for p in range(4, 8)] == want
    assert [fs._dir_of("kv").split("/")[1] for fs, _ in servers] == \
        ["bfloat16-page_first-16-8KiB", "bfloat16-page_first-16-10KiB"]


def test_a_model_name_that_is_not_utf8_stores_and_loads_pages(hicachefs_mount):
    """A served model name from bytes that are not UTF-8 holds a lone surrogate (Python's
    surrogateescape of argv): its directory name was no UTF-8, which the mount refuses, so every
    write failed (EINVAL) and every read missed. Two such names still name two directories."""
    pool = MHAHostPool(pages=8)
    pool.fill_random(seed=11)
    fs = make_fs(hicachefs_mount, pool, model="caf\udce9/model")
    other = make_fs(hicachefs_mount, pool, model="caf\udce8/model")
    assert fs._dir_of("kv") != other._dir_of("kv")
    k = key("not utf-8")
    assert fs.batch_set_v1([k], indices(pool, [0])) == [True]
    fs.settle()
    assert fs.batch_exists([k]) == 1 and other.batch_exists([k]) == 0
    want = page_bytes(pool, 0)
    pool.zero()
    assert fs.batch_get_v1([k], indices(pool, [1])) == [True]
    assert page_bytes(pool, 1) == want
    assert fs.statistics()["errors"] == {}


@pytest.mark.parametrize("data_plane", [True, False])
def test_a_page_file_of_another_size_does_not_block_its_key(store_root, data_plane):
    """A page file cut off half-way (a ``cp`` killed, written by plain file I/O as the contract
    permits) is no page of the pool: it is not counted, and the key's next write replaces it
    (KEEP_EXISTING kept it, exists counted it, and every read missed it, for good)."""
    pool = MHAHostPool(pages=8)
    fs = make_fs(store_root, pool, extra={"data_plane": data_plane})
    keys = [key("cut off", data_plane, i) for i in range(3)]
    directory = store_root / fs._dir_of("kv")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / keys[1]).write_bytes(page_bytes(pool, 1)[: fs._layout("kv").page_bytes // 2])
    assert fs.batch_exists(keys) == 0 and not fs.exists(keys[1])
    assert fs.batch_set_v1(keys, indices(pool, [0, 1, 2])) == [True] * 3
    fs.settle()
    assert fs.batch_exists(keys) == 3
    reader_pool = MHAHostPool(pages=8)
    reader_pool.zero()
    reader = make_fs(store_root, reader_pool, extra={"data_plane": data_plane})
    assert reader.batch_get_v1(keys, indices(reader_pool, [3, 4, 5])) == [True] * 3
    assert [page_bytes(reader_pool, p) for p in (3, 4, 5)] == [page_bytes(pool, p) for p in (0, 1, 2)]


def test_exists_file_is_used_on_a_mount_without_the_data_plane(hicachefs_mount):
    pool = MHAHostPool(pages=16)
    fs = make_fs(hicachefs_mount, pool, extra={"data_plane": False})
    keys = [key("query", i) for i in range(20)]
    assert fs.batch_set_v1(keys[:10], indices(pool, range(10))) == [True] * 10
    assert fs.batch_exists(keys) == 10
    stats = fs.statistics()
    assert stats["exists_queries"] >= 1 and stats["exists_stat_fallbacks"] == 0
    assert stats["errors"] == {}


def test_missing_mount_root(tmp_path):
    root = tmp_path / "gone"
    pool = MHAHostPool()
    fs = make_fs(root, pool)
    keys = [key("gone", i) for i in range(2)]
    assert fs.batch_set_v1(keys, indices(pool, [0, 1])) == [False, False]
    assert fs.batch_get_v1(keys, indices(pool, [0, 1])) == [False, False]
    assert fs.batch_exists(keys) == 0
    assert not root.exists()  # the client never makes the mount root
    root.mkdir()
    assert fs.batch_set_v1(keys, indices(pool, [0, 1])) == [True, True]
    assert fs.batch_exists(keys) == 2


def test_no_mountpoint_is_a_config_error(monkeypatch):
    monkeypatch.delenv("HICACHEFS_MOUNTPOINT", raising=False)
    with pytest.raises(ValueError):
        HiCacheFS(storage_config(None), {})
    monkeypatch.setenv("HICACHEFS_MOUNTPOINT", "/nonexistent/hicache")
    assert HiCacheFS(storage_config(None), {}).mountpoint == "/nonexistent/hicache"


@pytest.mark.parametrize("mountpoint", [5, 0, ["/mnt/hicache"], b"/mnt/hicache"])
def test_a_mountpoint_that_is_no_path_is_a_config_error(mountpoint):
    with pytest.raises(ValueError, match="the mountpoint must be a path"):
        HiCacheFS(storage_config(None, extra={"mountpoint": mountpoint}), {})


@pytest.mark.parametrize("mountpoint", ["/mnt/hi\0cache", " /mnt/hicache", "/mnt/hicache\n",
                                        "$HICACHE_ROOT_NOT_SET/hicache", "${HICACHE_ROOT_NOT_SET:-/mnt}/hicache",
                                        "~no-such-user-here/hicache"])
def test_a_mountpoint_that_names_no_directory_is_a_config_error(mountpoint, monkeypatch):
    """(Taken from the working directory, ``' /mnt/hicache'`` or ``$UNSET/hicache`` named a
    directory no one meant, and every page was a miss; a NUL byte failed every call inside.)"""
    monkeypatch.delenv("HICACHE_ROOT_NOT_SET", raising=False)
    with pytest.raises(ValueError, match="is not a usable path|names a variable that is not set"):
        HiCacheFS(storage_config(None, extra={"mountpoint": mountpoint}), {})


def test_a_mountpoint_is_expanded_as_a_shell_would(tmp_path, monkeypatch):
    """``~/hicache`` and ``$HOME/hicache`` were taken from the working directory, literally (found
    by review: nothing was stored); a ``pathlib.Path`` was refused."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for given in ("~/hicache", "$HOME/hicache", "${HOME}/hicache", tmp_path / "home" / "hicache"):
        assert HiCacheFS(storage_config(None, extra={"mountpoint": given}), {}).mountpoint == str(tmp_path / "home/hicache")


def test_a_relative_mountpoint_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    """(The demo names its mount ``mnt`` from the directory it runs in: refusing relative paths
    stopped the main job.)"""
    monkeypatch.chdir(tmp_path)
    assert HiCacheFS(storage_config(None, extra={"mountpoint": "mnt/hicache"}), {}).mountpoint == str(tmp_path / "mnt/hicache")


def test_an_unknown_extra_config_key_is_a_config_error(plain_root):
    with pytest.raises(ValueError, match="unknown extra_config key.*'read_thread'.*read_threads"):
        HiCacheFS(storage_config(plain_root, extra={"read_thread": 4}), {})
    sglang_keys = {"tp_lcm_size": 8, "prefetch_threshold": 256, "hicache_storage_pass_prefix_keys": True,
                   "file_storage_path": "/data/kv",  # SGLang's radix cache sets it from --file-storage-path
                   "allocator": "shm"}  # SGLang's host pools read it for dynamic backends
    assert HiCacheFS(storage_config(plain_root, extra=sglang_keys), {}).mountpoint == str(plain_root)


def test_key_with_a_line_break_is_asked_by_stat(store_root):
    pool = MHAHostPool()
    fs = make_fs(store_root, pool)
    odd = "line\nbreak"  # a valid name, but not expressible on an exists-request line
    keys = [key("nl", 0), odd, key("nl", 2)]
    assert fs.batch_set_v1(keys, indices(pool, [0, 1, 2])) == [True] * 3
    assert fs.batch_exists(keys) == 3
    assert fs.batch_get_v1(keys, indices(pool, [3, 4, 5])) == [True] * 3
    assert page_bytes(pool, 4) == page_bytes(pool, 1)


class _SwappedMeta(MHAHostPool):
    """A pool whose zero-copy pieces come V first: not the flat page's order."""

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = super().get_page_buffer_meta(indices)
        return [p for pair in zip(ptrs[1::2], ptrs[0::2]) for p in pair], sizes


def test_zero_copy_order_is_checked(store_root, caplog):
    pool = _SwappedMeta()
    fs = make_fs(store_root, pool)
    k = key("swapped")
    with caplog.at_level(logging.WARNING, logger="hicachefs_client"):
        assert fs.batch_set_v1([k], indices(pool, [2])) == [True]
    assert fs._layout("kv").zero_copy is False
    assert any("copying pages" in r.getMessage() for r in caplog.records)
    path = store_root / MODEL / "bfloat16-page_first-16-8KiB" / "tp0of1" / "kv" / k
    assert path.read_bytes() == page_bytes(pool, 2)
    assert fs.batch_get_v1([k], indices(pool, [5])) == [True]
    assert page_bytes(pool, 5) == page_bytes(pool, 2)


def test_host_indices_past_the_pool_fail_their_call_alone(store_root):
    """Host indices past the host pool in one call made the pool's pieces look wrong: zero copy
    went off for the pool until a restart, every later batch copied. That call fails; the
    pool's next batches are still zero copy, their bytes right."""
    pool = MHAHostPool(pages=8)
    pool.fill_random(seed=3)
    fs = make_fs(store_root, pool)
    keys = [key("past the pool", i) for i in range(4)]
    assert fs.batch_get_v1([key("past the pool", "x")], indices(pool, [40])) == [False]
    assert fs._layout("kv").zero_copy
    assert fs.batch_set_v1(keys, indices(pool, range(4))) == [True] * 4
    assert fs.batch_set_v1([key("past the pool", "y"), key("past the pool", "z")],
                           indices(pool, [3, 40])) == [False, False]
    assert fs._layout("kv").zero_copy
    want = [page_bytes(pool, p) for p in range(4)]
    pool.zero()
    assert fs.batch_get_v1(keys, indices(pool, [4, 5, 6, 7])) == [True] * 4
    assert fs._layout("kv").zero_copy
    assert [page_bytes(pool, p) for p in (4, 5, 6, 7)] == want
    assert fs.batch_exists([key("past the pool", "y")]) == 0



class _PoolInALargerBuffer(MHAHostPool):
    """A pool whose K and V lie in a buffer longer than its slots: a page past them still falls
    inside that buffer (as in SGLang's MLA pool, whose indexer buffer may lie right after)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        larger = torch.zeros((2, 2 * self.size, self.layer_num, self.head_num, self.head_dim), dtype=self.dtype)
        larger[:, : self.size] = self.kv_buffer
        larger[:, self.size :] = 7
        self.larger, self.kv_buffer = larger, larger[:, : self.size]

    def get_page_buffer_meta(self, indices):  # V lies a larger buffer's half after K
        token = self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize
        base, v_offset = self.kv_buffer.data_ptr(), self.kv_buffer.stride(0) * self.dtype.itemsize
        ptrs = []
        for start in indices.tolist()[:: self.page_size]:
            ptrs += [base + start * token, base + start * token + v_offset]
        return ptrs, [self.page_size * token] * len(ptrs)


def test_host_indices_outside_the_pool_never_move_another_buffers_bytes(store_root):
    """Placed by the pool's strides, a page past the pool's slots fell inside another of its
    buffers: its write stored that buffer's bytes, its read overwrote them; a start off a page's
    boundary was served straddling two pages (found by review). Such calls fail alone."""
    pool = _PoolInALargerBuffer(pages=8)
    fs = make_fs(store_root, pool)
    assert fs.batch_set_v1([key("inside", 0)], indices(pool, [0])) == [True]  # the strides are learnt
    past = pool.page_indices(pool.size // pool.page_size)
    assert fs.batch_set_v1([key("past", 0)], past) == [False]
    assert fs.batch_get_v1([key("inside", 0)], past) == [False]
    assert bool((pool.larger[:, pool.size :] == 7).all()), "a read went into the buffer past the pool"
    off_boundary = torch.arange(8, 8 + pool.page_size)
    assert fs.batch_set_v1([key("straddling", 0)], off_boundary) == [False]
    assert fs._layout("kv").zero_copy
    assert fs.batch_exists([key("past", 0)]) == 0 and fs.batch_exists([key("straddling", 0)]) == 0


def test_host_pool_group_resolves_to_its_kv_pool(store_root):
    from types import SimpleNamespace

    kv = MHAHostPool()
    group = SimpleNamespace(entry_map={PoolName.KV: SimpleNamespace(host_pool=kv)},
                            anchor_entry=SimpleNamespace(host_pool=kv), layout=kv.layout,
                            page_size=kv.page_size)
    fs = make_fs(store_root, group)
    assert fs.batch_set_v1([key("group")], indices(kv, [1])) == [True]
    assert (store_root / MODEL / "bfloat16-page_first-16-8KiB" / "tp0of1" / "kv" / key("group")).is_file()


class _CountingMeta(MHAHostPool):
    """A pool that counts the pages its zero-copy pieces were asked for."""

    asked = 0

    def get_page_buffer_meta(self, indices):
        self.asked += len(indices) // self.page_size
        return super().get_page_buffer_meta(indices)


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_pages_not_seen_yet_are_placed_by_the_pools_strides(store_root, layout):
    pool = _CountingMeta(layout=layout, pages=16)
    fs = make_fs(store_root, pool)
    keys = [key("strided", layout, i) for i in range(8)]
    assert fs.batch_set_v1(keys[:2], indices(pool, [0, 1])) == [True] * 2  # the pool is asked
    asked = pool.asked
    assert asked == 2
    assert fs.batch_set_v1(keys[2:], indices(pool, [3, 5, 7, 9, 11, 15])) == [True] * 6
    reader = make_fs(store_root, _CountingMeta(layout=layout, pages=16))
    target = reader._layout("kv").pool
    target.zero()
    assert reader.batch_get_v1(keys[:2], indices(target, [4, 2])) == [True] * 2
    assert reader.batch_get_v1(keys[2:], indices(target, [14, 13, 12, 10, 8, 6])) == [True] * 6
    assert pool.asked == asked and target.asked == 2  # each pool asked once, for its first batch
    for written, read in zip([0, 1, 3, 5, 7, 9, 11, 15], [4, 2, 14, 13, 12, 10, 8, 6]):
        assert page_bytes(target, read) == page_bytes(pool, written)


def test_a_strides_rule_is_taken_only_where_every_page_keeps_to_it():
    from hicachefs_client.layout import _strides

    # Two pieces a page (K and V), 16 host indices a page, 4 KiB a piece.
    ptrs = [1000 + 256 * s + piece * 10**6 for s in (0, 16, 48) for piece in (0, 1)]
    assert _strides([0, 16, 48], ptrs, [4096] * 6, 2) == [(1000, 256, 4096), (1000 + 10**6, 256, 4096)]
    moved = ptrs[:4] + [ptrs[4] + 4096, ptrs[5]]  # the third page's K piece elsewhere
    assert _strides([0, 16, 48], moved, [4096] * 6, 2) is None
    assert _strides([16, 16], ptrs[:2] * 2, [4096] * 4, 2) is None  # one page: no stride to learn
    assert _strides([0, 16, 48], ptrs, [4096] * 5 + [2048], 2) is None


@pytest.mark.parametrize("indices_of", [
    lambda: torch.arange(32, 96, dtype=torch.int64),  # SGLang's: read where they lie
    lambda: torch.arange(32, 96, dtype=torch.int32),
    lambda: torch.arange(32, 96, dtype=torch.int64).reshape(4, 16).t().contiguous().t(),  # not contiguous
    lambda: list(range(32, 96)),
])
def test_page_starts_are_every_pages_first_index(indices_of):
    pool = MHAHostPool(layout="page_first")
    from hicachefs_client.layout import PageLayout

    assert PageLayout(pool).page_starts(indices_of(), 4) == [32, 48, 64, 80]
    assert PageLayout(pool).page_starts(indices_of(), 3) is None  # 64 indices are not 3 pages


class _WrongSizePages(MHAHostPool):
    """A pool whose flat page at some host indices is not a whole page (half of one, or one
    and a half): what ``get_data_page`` gives must be checked against the page size."""

    wrong = {}

    def get_data_page(self, index, flat=True):
        page = super().get_data_page(index, flat)
        if index in self.wrong:
            return torch.cat([page, page])[: int(page.numel() * self.wrong[index])]
        return page


@pytest.mark.parametrize("data_plane", [True, False])
def test_a_flat_page_of_another_size_is_not_stored(store_root, data_plane):
    """A copied page (``layer_first``) whose flat page is short or long fails alone: before,
    the ingest file took the next page's bytes to fill a short page (a stored page with
    foreign bytes, reported stored), and a plain directory got a file no read accepts."""
    pool = _WrongSizePages(layout="layer_first", pages=8)
    pool.wrong = {1 * pool.page_size: 0.5, 3 * pool.page_size: 1.5}
    fs = make_fs(store_root, pool, extra={"data_plane": data_plane})
    keys = [key("wrong size", data_plane, i) for i in range(5)]
    assert fs.batch_set_v1(keys, indices(pool, range(5))) == [True, False, True, False, True]
    fs.settle()
    reader_pool = MHAHostPool(layout="layer_first", pages=8)
    reader_pool.zero()
    reader = make_fs(store_root, reader_pool, extra={"data_plane": data_plane})
    assert reader.batch_get_v1(keys, indices(reader_pool, range(5))) == [True, False, True, False, True]
    for page in (0, 2, 4):
        assert page_bytes(reader_pool, page) == page_bytes(pool, page)
    assert reader.batch_exists(keys) == 1
    assert fs.statistics()["write_failures"] == 2


class _MovingPages(MHAHostPool):
    """Like SGLang's ``UnifiedPageEnvelopeHostPool``: host indices name logical pages, which
    sit in physical pages of the buffer through a table (``physical``) that allocation orders
    as it goes and compaction changes between calls (``move``); ``stores_page_envelope``."""

    stores_page_envelope = True

    def __init__(self, physical):
        super().__init__(layout="page_first_direct", pages=len(physical))
        self.physical = list(physical)

    def _at(self, index):
        return self.physical[index // self.page_size] * self.page_size

    def get_data_page(self, index, flat=True):
        return super().get_data_page(self._at(index), flat)

    def set_from_flat_data_page(self, index, data_page):
        super().set_from_flat_data_page(self._at(index), data_page)

    def get_page_buffer_meta(self, indices):
        starts = indices.tolist()[::self.page_size]
        return super().get_page_buffer_meta(torch.cat([self.page_indices(self._at(s) // self.page_size)
                                                        for s in starts]))

    def move(self, physical):
        """Compaction: every logical page keeps its bytes in its new physical page; the pages
        left are zeroed."""
        pages = [self.get_data_page(p * self.page_size).clone() for p in range(len(self.physical))]
        self.kv_buffer.zero_()
        self.physical = list(physical)
        for p, page in enumerate(pages):
            self.set_from_flat_data_page(p * self.page_size, page)


def test_pages_that_move_in_their_pool_are_asked_for_every_call(store_root):
    """A pool whose logical pages sit where a table puts them (SGLang's unified page-envelope
    host pools) is asked where its pages are on every call: a stride learnt from two pages, or
    pieces kept from an earlier call (before a compaction moved the pages), pointed at other
    pages, whose bytes were then stored under these keys and read into them."""
    pool = _MovingPages([0, 1, 5, 2, 7, 3, 6, 4])
    fs = make_fs(store_root, pool)
    keys = [key("moving", i) for i in range(10)]
    stored = {}

    def store(which, pages):
        for k, page in zip(which, pages):
            stored[k] = page_bytes(pool, page)
        assert fs.batch_set_v1(which, indices(pool, pages)) == [True] * len(which)

    store(keys[:2], [0, 1])  # a stride to learn: logical 0, 1 in physical 0, 1
    store(keys[2:6], [2, 3, 4, 5])
    pool.move([8, 6, 0, 1, 2, 5, 7, 3])
    store(keys[6:10], [0, 1, 6, 7])
    fs.settle()
    assert fs._layout("kv").zero_copy  # straight into the pool's buffer, where it says

    target = _MovingPages([3, 0, 1, 2, 4, 5, 6, 7])
    target.zero()
    reader = make_fs(store_root, target)
    assert reader.batch_get_v1(keys[:2], indices(target, [1, 2])) == [True] * 2
    target.move([7, 1, 0, 3, 8, 2, 4, 6])
    assert reader.batch_get_v1(keys[2:], indices(target, [0, 1, 2, 3, 4, 5, 6, 7])) == [True] * 8
    for k, page in zip(keys[2:], range(8)):
        assert page_bytes(target, page) == stored[k], page
