"""Page naming: keys, model, format and shard segments (DESIGN.md, "Namespace")."""

import torch

from hicachefs_client import paths
from storage_configs import storage_config


def test_valid_keys():
    assert paths.key_problem("a" * 64) is None
    assert paths.key_problem("é" * 100) is None  # 200 bytes
    assert paths.key_problem("x.mamba") is None


def test_invalid_keys():
    for key in ["", ".hidden", ".", "..", "a/b", "a\0b", "é" * 101, "x" * 201, None, 5, b"abc"]:
        assert paths.key_problem(key) is not None, key


def test_model_segment():
    assert paths.model_segment("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama--Llama-3.1-8B-Instruct"
    assert paths.model_segment("") == "_"
    assert paths.model_segment(None) == "_"
    assert paths.key_problem(paths.model_segment(".x/y")) is None
    assert paths.key_problem(paths.model_segment("m" * 500)) is None
    odd = paths.model_segment("caf\udce9/model")  # a name from bytes that are not UTF-8
    assert odd.startswith("caf_--model-") and paths.key_problem(odd) is None
    assert len({odd, paths.model_segment("caf\udce8/model"), paths.model_segment("caf_/model")}) == 3


def test_format_segment():
    assert paths.format_segment(torch.bfloat16, "page_first", 64, 128 << 10) == "bfloat16-page_first-64-128KiB"
    assert paths.format_segment(torch.float8_e4m3fn, "layer_first", 1, 1000) == \
        "float8_e4m3fn-layer_first-1-1000B"
    assert paths.format_segment(torch.uint8, "page_first", 16, 3 << 20, "unified-token-major") == \
        "uint8-page_first-16-3072KiB-unified-token-major"


def shard(**kw):
    return paths.ShardIdentity.from_storage_config(storage_config("/m", **kw))


def test_shard_segments():
    assert shard(tp=(3, 8)).segment("kv") == "tp3of8"
    assert shard(tp=(3, 8), pp=(1, 2)).segment("kv") == "tp3of8.pp1of2"
    assert shard(tp=(0, 2), pp=(1, 2), cp=(1, 4)).segment("kv") == "tp0of2.pp1of2.cp1of4"
    assert shard(mla=True, tp=(5, 8)).segment("kv") == "all"
    assert shard(mla=True, tp=(5, 8), pp=(1, 2)).segment("kv") == "all.pp1of2"
    # Mamba state is TP-sharded even in an MLA model.
    assert shard(mla=True, tp=(5, 8)).segment("mamba") == "tp5of8"
    assert shard(mla=True, tp=(5, 8)).segment("draft", rank_heads=True) == "tp5of8"  # an MHA draft's heads


def test_dcp_shard_and_writer():
    s = shard(mla=True, tp=(1, 4), dcp_size=2, dcp_rank=1, logical_page_size=64)
    assert s.segment("kv") == "all.dcp1of2"
    assert s.is_storage_writer  # tp_rank == dcp_rank: the first DCP group writes
    s = shard(mla=True, tp=(3, 4), dcp_size=2, dcp_rank=1, logical_page_size=64)
    assert not s.is_storage_writer and not s.writes("kv") and s.writes("mamba")
    assert shard(tp=(3, 4)).writes("kv")
    assert not shard(mla=True, tp=(3, 4)).writes("kv")


def test_sglang_keys_are_recognised_at_once_and_anything_else_is_not():
    from hicachefs_client.paths import all_hex_keys, key_problem

    hex_keys = [f"{i:064x}" for i in range(128)]
    assert all_hex_keys(hex_keys)
    for odd in ("A" * 64, "a" * 63, "a" * 65, "g" * 64, "a" * 32 + "\n" + "a" * 31, "a" * 31 + " " + "a" * 32,
                "\u00e9" * 64, None, 7):
        mixed = hex_keys[:3] + [odd] + hex_keys[3:]
        assert not all_hex_keys(mixed), odd  # then every key is checked on its own
    assert not all_hex_keys([])
    assert all(key_problem(k) is None for k in hex_keys)
