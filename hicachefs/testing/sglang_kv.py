"""The KV bytes the harness's "prefill" computes, and the checks that every copy of them is exact.

A page's bytes are a function of its storage key (SGLang's chained SHA-256 of the tokens up to
it): a fixed random block XOR the key's digest, so every 32 bytes name the page, and a page
read into the wrong slot, or mixed from two pages, never passes. They are laid out in the
order SGLang's host pools give a page (``get_data_page(index, flat=True)``) in the
``layer_first`` and ``page_first_direct`` layouts: MHA ``[K|V, layer, token, head, dim]``, MLA
``[layer, token, 1, latent]``; that is also the order of the bytes a storage backend stores.

Thread-safe: the expected pages are computed, never cached in shared state.
"""

from __future__ import annotations

import hashlib
from typing import List, Sequence

import numpy as np
import torch


class PageKV:
    """Expected page contents for one device KV pool (MHA or MLA), and the checks."""

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
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self._block = np.random.Generator(np.random.PCG64(seed)).integers(
            0, 2**63, self.nbytes // 8, dtype=np.uint64).reshape(-1, 4)

    def expected(self, key: str) -> torch.Tensor:
        """The page of ``key`` as raw bytes, in storage order."""
        pattern = np.frombuffer(hashlib.sha256(key.encode()).digest(), dtype=np.uint64)
        return torch.from_numpy((self._block ^ pattern).reshape(-1)).view(torch.uint8)

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

    def holds(self, key: str, flat_page: torch.Tensor) -> bool:
        """Whether a flat page (a host pool's ``get_data_page``, a staging page) is ``key``'s."""
        raw = flat_page.contiguous().view(-1).view(torch.uint8)
        return raw.numel() == self.nbytes and torch.equal(raw, self.expected(key))
