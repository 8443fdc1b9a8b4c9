"""The KV bytes the harness's "prefill" computes, and the checks that every copy of them is exact.

A page's bytes are a function of its storage key (SGLang's chained SHA-256 of the tokens up to
it): a fixed random block XOR the key's digest, so every 32 bytes name the page, and a page
read into the wrong slot, or mixed from two pages, never passes. They are laid out in the
order SGLang's host pools give a page (``get_data_page(index, flat=True)``) in the
``layer_first`` and ``page_first_direct`` layouts: MHA ``[K|V, layer, token, head, dim]``, MLA
``[layer, token, 1, latent]``; that is also the order of the bytes a storage backend stores.

A sliding-window hybrid's window layers have pages as KV layers do (a ``PageKV`` over their
pool, with its own seed). A Mamba hybrid's Mamba layers keep one recurrent state per request
instead of KV per token; SGLang stores the state a prefix ends in under the key of that
prefix's last page (pool ``mamba``). ``StateKV`` makes those states the same way, in the order
of SGLang's Mamba host pool page (``[layer, 1, *temporal]`` then each conv state's
``[layer, 1, *conv]``).

Thread-safe: the expected pages are computed, never cached in shared state.
"""

from __future__ import annotations

import hashlib
from typing import List, Sequence

import numpy as np
import torch


class KeyedBytes:
    """``nbytes`` bytes per key: a random block (from ``seed``) XOR the key's SHA-256."""

    def __init__(self, nbytes: int, seed: int) -> None:
        self.nbytes = nbytes
        words = -(-nbytes // 32) * 4
        self._block = np.random.Generator(np.random.PCG64(seed)).integers(
            0, 2**63, words, dtype=np.uint64).reshape(-1, 4)

    def expected(self, key: str) -> torch.Tensor:
        """The bytes of ``key``, flat uint8."""
        pattern = np.frombuffer(hashlib.sha256(key.encode()).digest(), dtype=np.uint64)
        return torch.from_numpy((self._block ^ pattern).reshape(-1)).view(torch.uint8)[:self.nbytes]

    def holds(self, key: str, flat_page: torch.Tensor) -> bool:
        """Whether a flat page (a host pool's ``get_data_page``, a staging page) is ``key``'s."""
        raw = flat_page.contiguous().view(-1).view(torch.uint8)
        return raw.numel() == self.nbytes and torch.equal(raw, self.expected(key))


class PageKV(KeyedBytes):
    """Expected page contents for one device KV pool (MHA or MLA), and the checks.

    ``seed`` differs per TP rank: each rank holds its own slice of the heads, so a page one
    rank reads from another rank's shard fails the check."""

    def __init__(self, device_pool, page_size: int, seed: int = 0) -> None:
        self.pool = device_pool
        self.page_size = page_size
        self.mla = not hasattr(device_pool, "v_buffer")
        self.layers = device_pool.layer_num
        key0 = device_pool.get_key_buffer(device_pool.start_layer)
        self.row_shape = tuple(key0.shape[1:])  # per token: (heads, dim) or (1, latent)
        self.dtype = key0.dtype
        parts = 1 if self.mla else 2
        self.shape = (parts, self.layers, page_size, *self.row_shape)
        super().__init__(int(np.prod(self.shape)) * self.dtype.itemsize, seed)

    def _as_page(self, key: str) -> torch.Tensor:
        return self.expected(key).view(self.dtype).reshape(self.shape)

    def _layer_buffers(self, layer: int) -> List[torch.Tensor]:
        layer_id = self.pool.start_layer + layer
        if self.mla:
            return [self.pool.get_key_buffer(layer_id)]
        return [self.pool.get_key_buffer(layer_id), self.pool.get_value_buffer(layer_id)]

    def prefill(self, keys: Sequence[str], device_indices: torch.Tensor) -> None:
        """Write the pages ``keys`` at the device token slots ``device_indices`` (whole pages)."""
        for p, key in enumerate(keys):
            slots = device_indices[p * self.page_size:(p + 1) * self.page_size]
            page = self._as_page(key)
            for layer in range(self.layers):
                for part, buffer in enumerate(self._layer_buffers(layer)):
                    buffer[slots] = page[part, layer]

    def wrong_device_pages(self, keys: Sequence[str], device_indices: torch.Tensor) -> List[int]:
        """Which of the pages ``keys`` at ``device_indices`` do not hold their bytes."""
        wrong = []
        for p, key in enumerate(keys):
            slots = device_indices[p * self.page_size:(p + 1) * self.page_size]
            page = self._as_page(key)
            for layer in range(self.layers):
                if any(not torch.equal(buffer[slots].view(torch.uint8), page[part, layer].view(torch.uint8))
                       for part, buffer in enumerate(self._layer_buffers(layer))):
                    wrong.append(p)
                    break
        return wrong


class StateKV(KeyedBytes):
    """Expected Mamba states of one device ``MambaPool`` (one slot per state), and the checks."""

    def __init__(self, mamba_pool, seed: int = 0) -> None:
        cache = mamba_pool.mamba_cache
        # Device tensors are [layer, slot, *state]; a host page is each one's [layer, *state].
        self.tensors = [cache.temporal, *cache.conv]
        self.sizes = [int(np.prod((t.shape[0], *t.shape[2:]))) * t.element_size() for t in self.tensors]
        super().__init__(sum(self.sizes), seed)

    def _parts(self, key: str):
        start = 0
        for tensor, size in zip(self.tensors, self.sizes):
            part = self.expected(key)[start:start + size]
            start += size
            yield tensor, part.view(tensor.dtype).reshape(tensor.shape[0], *tensor.shape[2:])

    def prefill(self, key: str, slot: int) -> None:
        """Write the state a prefix ending in page ``key`` leaves, into device slot ``slot``."""
        for tensor, state in self._parts(key):
            tensor[:, slot] = state

    def wrong_device_state(self, key: str, slot: int) -> bool:
        """Whether device slot ``slot`` does not hold ``key``'s state."""
        return any(not torch.equal(tensor[:, slot].contiguous().view(torch.uint8), state.view(torch.uint8))
                   for tensor, state in self._parts(key))
