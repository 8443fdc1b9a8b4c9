"""The device pools one SGLang rank builds for a model, on device ``cpu``: MHA, MLA, or a hybrid
model with a second pool beside the KV of its full attention layers: Mamba2 layers that keep a
recurrent state per request (Qwen3-Next, Nemotron-H), or sliding-window attention layers that
keep only the last tokens of a window (gpt-oss, Gemma 3).

The pools are SGLang's own classes, built as its ``ModelRunner`` builds them: for MHA and MLA a
``MHATokenToKVPool`` / ``MLATokenToKVPool`` and a ``ReqToTokenPool``; for Mamba a
``HybridReqToTokenPool`` (which owns the ``MambaPool`` and hands each request a state slot)
and a ``HybridLinearKVPool`` over the full attention layers, tree components FULL and MAMBA;
for a sliding window a ``SWAKVPool`` (a full and a window KV pool) with its
``SWATokenToKVPoolAllocator``, tree components FULL and SWA. Hybrid models run with pages of one
token: without SGLang's Mamba extra buffer (whose checkpoints at chunk boundaries the model's
forward pass records) a state exists only where a sequence ends, and SGLang then requires
``page_size == 1``; the window allocator's ``alloc`` (the one the harness's prefill takes) takes
only pages of one token too.

Not thread-safe; built once per rank, on the scheduler's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import sglang_cpu

sglang_cpu.install()

import torch  # noqa: E402
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import (HybridLinearKVPool, HybridReqToTokenPool,  # noqa: E402
                                              MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool)
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402

#: Requests a rank holds at once (the scheduler's running batch and waiting queue here).
MAX_REQUESTS = 64


@dataclass(frozen=True)
class MambaShape:
    """A hybrid model's Mamba2 layers: which layer ids, and the size of their state."""

    layers: Tuple[int, ...]
    heads: int = 2
    head_dim: int = 16
    state_size: int = 16
    conv_kernel: int = 4
    slots: int = 48  # device state slots: requests in flight plus states the tree keeps


@dataclass(frozen=True)
class SlidingWindow:
    """A hybrid model's sliding-window attention layers and the window, in tokens."""

    layers: Tuple[int, ...]
    window: int


@dataclass(frozen=True)
class ModelShape:
    """The KV of one rank: MHA (``kv_heads`` x ``head_dim`` per layer) or MLA (``latent``); a
    hybrid model also names its Mamba layers (``mamba``) or its sliding-window layers
    (``swa``), the others being full attention."""

    name: str
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    latent: int = 0  # kv_lora_rank + qk_rope_head_dim; MLA when set
    mamba: Optional[MambaShape] = None
    swa: Optional[SlidingWindow] = None

    @property
    def mla(self) -> bool:
        return self.latent > 0

    @property
    def full_attention_layers(self) -> Tuple[int, ...]:
        other = set(self.mamba.layers if self.mamba else ()) | set(self.swa.layers if self.swa else ())
        return tuple(i for i in range(self.layers) if i not in other)


@dataclass
class DevicePools:
    """What ``CacheInitParams`` takes from the model runner, and the pools the harness fills."""

    req_to_token_pool: Any
    allocator: Any  # TokenToKVPoolAllocator, or SWATokenToKVPoolAllocator
    kv_pool: Any  # the pool holding the full attention layers' KV (PageKV fills it)
    components: Tuple[ComponentType, ...]
    mamba_pool: Any = None  # a Mamba hybrid's MambaPool (StateKV fills it)
    window_pool: Any = None  # a sliding-window hybrid's window KV pool (PageKV fills it)
    sliding_window: Optional[int] = None


def build_device_pools(model: ModelShape, page_size: int, device_pages: int, max_context: int) -> DevicePools:
    """The device pools of one rank for ``model``, ``device_pages`` pages of KV."""
    tokens = device_pages * page_size
    if model.mamba is not None:
        return _hybrid_mamba_pools(model, page_size, tokens, max_context)
    req_to_token_pool = ReqToTokenPool(size=MAX_REQUESTS, max_context_len=max_context, device="cpu",
                                       enable_memory_saver=False)
    if model.swa is not None:
        pool = SWAKVPool(size=tokens, size_swa=tokens, page_size=page_size, dtype=torch.bfloat16,
                         head_num=model.kv_heads, head_dim=model.head_dim,
                         swa_attention_layer_ids=list(model.swa.layers),
                         full_attention_layer_ids=list(model.full_attention_layers), device="cpu")
        allocator = SWATokenToKVPoolAllocator(size=tokens, size_swa=tokens, page_size=page_size,
                                              dtype=torch.bfloat16, device="cpu", kvcache=pool, need_sort=False)
        return DevicePools(req_to_token_pool, allocator, pool.full_kv_pool, (ComponentType.FULL, ComponentType.SWA),
                           window_pool=pool.swa_kv_pool, sliding_window=model.swa.window)
    if model.mla:
        kv_pool = MLATokenToKVPool(
            size=tokens, page_size=page_size, dtype=torch.bfloat16, kv_lora_rank=model.latent - 64,
            qk_rope_head_dim=64, layer_num=model.layers, device="cpu", enable_memory_saver=False)
    else:
        kv_pool = MHATokenToKVPool(
            size=tokens, page_size=page_size, dtype=torch.bfloat16, head_num=model.kv_heads,
            head_dim=model.head_dim, layer_num=model.layers, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(size=tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv_pool,
                                       need_sort=False)
    return DevicePools(req_to_token_pool, allocator, kv_pool, (ComponentType.FULL,))


def _hybrid_mamba_pools(model: ModelShape, page_size: int, tokens: int, max_context: int) -> DevicePools:
    mamba = model.mamba
    # SGLang sizes the state's dtype from this variable when its cache params are made.
    with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = Mamba2StateShape.create(
            tp_world_size=1, intermediate_size=mamba.heads * mamba.head_dim, n_groups=1,
            num_heads=mamba.heads, head_dim=mamba.head_dim, state_size=mamba.state_size,
            conv_kernel=mamba.conv_kernel)
        cache_params = Mamba2CacheParams(shape=shape, layers=list(mamba.layers))
    req_to_token_pool = HybridReqToTokenPool(
        size=MAX_REQUESTS, mamba_size=mamba.slots, mamba_spec_state_size=MAX_REQUESTS,
        max_context_len=max_context, device="cpu", enable_memory_saver=False, cache_params=cache_params,
        mamba_layer_ids=list(mamba.layers), enable_mamba_extra_buffer=False)
    kv_pool = HybridLinearKVPool(
        size=tokens, dtype=torch.bfloat16, page_size=page_size, head_num=model.kv_heads,
        head_dim=model.head_dim, full_attention_layer_ids=list(model.full_attention_layers), device="cpu",
        enable_memory_saver=False, mamba_pool=req_to_token_pool.mamba_pool)
    allocator = TokenToKVPoolAllocator(size=tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv_pool,
                                       need_sort=False)
    return DevicePools(req_to_token_pool, allocator, kv_pool.full_kv_pool, (ComponentType.FULL, ComponentType.MAMBA),
                       mamba_pool=req_to_token_pool.mamba_pool)
