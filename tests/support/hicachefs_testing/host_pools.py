"""CPU host pools that behave like SGLang's MHA and MLA host pools, for the client's tests.

SGLang's own ``MHATokenToKVPoolHost``/``MLATokenToKVPoolHost`` cannot be built here (their
import chain needs CUDA builds of torchvision and kernels), so these doubles reproduce what the
storage backends see of them: ``page_size``, ``dtype``, ``layout``, ``kv_buffer`` shapes (one
padding page, as SGLang sizes them), ``get_page_buffer_meta`` (the same pointer arithmetic),
``get_data_page(flat=True)``, ``get_dummy_flat_data_page`` and ``set_from_flat_data_page``,
for the ``layer_first``, ``page_first`` and ``page_first_direct`` layouts; ``page_bytes``
is what a backend stores for one of their pages.
"""

from __future__ import annotations

import torch


def page_bytes(pool, page: int) -> bytes:
    """The bytes of page number ``page`` of a host pool (ours or SGLang's), as a backend stores
    them: ``get_data_page(flat=True)``."""
    return pool.get_data_page(page * pool.page_size, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


class _HostPool:
    def __init__(self, *, layer_num, page_size, pages, dtype, layout):
        self.layer_num = layer_num
        self.page_size = page_size
        self.dtype = dtype
        self.layout = layout
        self.page_num = pages + 1  # SGLang keeps one padding page
        self.size = self.page_num * self.page_size
        self.device = "cpu"
        self.pin_memory = False
        self.kv_buffer = torch.empty(self.dims(), dtype=dtype)
        self.fill_random(seed=0)

    @property
    def logical_page_size(self):
        return self.page_size

    def fill_random(self, seed):
        gen = torch.Generator().manual_seed(seed)
        raw = torch.randint(0, 256, (self.kv_buffer.numel() * self.kv_buffer.element_size(),),
                            dtype=torch.uint8, generator=gen)
        self.kv_buffer.view(-1).view(torch.uint8).copy_(raw)

    def zero(self):
        self.kv_buffer.zero_()

    def page_indices(self, page):
        """The host token indices of page number ``page`` (as SGLang's allocator hands out)."""
        return torch.arange(page * self.page_size, (page + 1) * self.page_size, dtype=torch.int64)


class MHAHostPool(_HostPool):
    """Like SGLang's MHATokenToKVPoolHost: K and V, ``head_num`` heads of ``head_dim``."""

    def __init__(self, *, layer_num=4, head_num=2, head_dim=16, page_size=16, pages=8,
                 dtype=torch.bfloat16, layout="page_first"):
        self.head_num = head_num
        self.head_dim = head_dim
        super().__init__(layer_num=layer_num, page_size=page_size, pages=pages, dtype=dtype,
                         layout=layout)

    def dims(self):
        if self.layout == "layer_first":
            return (2, self.layer_num, self.size, self.head_num, self.head_dim)
        if self.layout == "page_first":
            return (2, self.size, self.layer_num, self.head_num, self.head_dim)
        if self.layout == "page_first_direct":
            return (2, self.page_num, self.layer_num, self.page_size, self.head_num, self.head_dim)
        raise ValueError(self.layout)

    def get_data_page(self, index, flat=True):
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + self.page_size]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + self.page_size]
        else:
            page = self.kv_buffer[:, index // self.page_size:index // self.page_size + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                           dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index, data_page):
        if self.layout == "layer_first":
            self.kv_buffer[:, :, index:index + self.page_size] = data_page.reshape(
                2, self.layer_num, self.page_size, self.head_num, self.head_dim)
        elif self.layout == "page_first":
            self.kv_buffer[:, index:index + self.page_size] = data_page.reshape(
                2, self.page_size, self.layer_num, self.head_num, self.head_dim)
        else:
            p = index // self.page_size
            self.kv_buffer[:, p:p + 1] = data_page.reshape(
                2, 1, self.layer_num, self.page_size, self.head_num, self.head_dim)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        item = self.dtype.itemsize
        token = self.head_num * self.head_dim * item
        base = self.kv_buffer.data_ptr()
        v_offset = self.layer_num * self.size * token
        starts = indices.tolist()[::self.page_size]
        ptrs = []
        if self.layout == "layer_first":
            for start in starts:
                for layer in range(self.layer_num):
                    k = base + start * token + layer * self.size * token
                    ptrs += [k, k + v_offset]
            size = self.page_size * token
        else:
            for start in starts:
                k = base + start * self.layer_num * token
                ptrs += [k, k + v_offset]
            size = self.layer_num * self.page_size * token
        return ptrs, [size] * len(ptrs)


class MLAHostPool(_HostPool):
    """Like SGLang's MLATokenToKVPoolHost: one latent row of ``kv_cache_dim`` per token."""

    def __init__(self, *, layer_num=4, kv_cache_dim=72, page_size=16, pages=8,
                 dtype=torch.bfloat16, layout="page_first"):
        self.kv_cache_dim = kv_cache_dim
        super().__init__(layer_num=layer_num, page_size=page_size, pages=pages, dtype=dtype,
                         layout=layout)

    def dims(self):
        if self.layout == "layer_first":
            return (self.layer_num, self.size, 1, self.kv_cache_dim)
        if self.layout == "page_first":
            return (self.size, self.layer_num, 1, self.kv_cache_dim)
        if self.layout == "page_first_direct":
            return (self.page_num, self.layer_num, self.page_size, 1, self.kv_cache_dim)
        raise ValueError(self.layout)

    def get_data_page(self, index, flat=True):
        if self.layout == "layer_first":
            page = self.kv_buffer[:, index:index + self.page_size]
        elif self.layout == "page_first":
            page = self.kv_buffer[index:index + self.page_size]
        else:
            page = self.kv_buffer[index // self.page_size:index // self.page_size + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros((self.layer_num, self.page_size, 1, self.kv_cache_dim),
                           dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index, data_page):
        if self.layout == "layer_first":
            self.kv_buffer[:, index:index + self.page_size] = data_page.reshape(
                self.layer_num, self.page_size, 1, self.kv_cache_dim)
        elif self.layout == "page_first":
            self.kv_buffer[index:index + self.page_size] = data_page.reshape(
                self.page_size, self.layer_num, 1, self.kv_cache_dim)
        else:
            p = index // self.page_size
            self.kv_buffer[p:p + 1] = data_page.reshape(
                1, self.layer_num, self.page_size, 1, self.kv_cache_dim)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        row = self.kv_cache_dim * self.dtype.itemsize
        base = self.kv_buffer.data_ptr()
        starts = indices.tolist()[::self.page_size]
        ptrs = []
        if self.layout == "layer_first":
            for start in starts:
                for layer in range(self.layer_num):
                    ptrs.append(base + start * row + layer * self.size * row)
            size = self.page_size * row
        else:
            for start in starts:
                ptrs.append(base + start * self.layer_num * row)
            size = self.layer_num * self.page_size * row
        return ptrs, [size] * len(ptrs)
