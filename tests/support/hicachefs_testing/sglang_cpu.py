"""SGLang 0.5.23's radix cache and cache controller on a CPU: the stand-ins they need here.

``install()`` must run before SGLang's cache modules are imported. Every stand-in replaces GPU
plumbing, or a package this CPU-only venv cannot hold, and never a storage decision:

- **Streams and events.** SGLang's ``get_device_module()`` picks ``torch.cpu`` when there is no
  accelerator; its ``Stream``/``Event`` suffice. ``torch.cpu.Event`` cannot time, so SGLang logs
  one warning about L2 transfer timing (``EXPECTED_WARNINGS``); nothing else changes.
- **The direct I/O backend's three ``sgl_kernel.kvcacheio`` ops** (``transfer_kv_direct``,
  ``transfer_kv_per_layer_direct_pf_lf``, ``transfer_kv_all_layer_direct_lf_pf``). SGLang's host
  pools (MHA, MLA, and Mamba states, which use them with pages of one slot) import them only on
  CUDA and ROCm. sgl-kernel implements them in ATen as a slice and a ``copy_`` per run of
  pages, so the ports below (``direct_io``) move the same bytes between the same places.
  ``direct`` is the I/O backend SGLang pairs with ``page_first_direct`` itself.
- **Host pools with ``pin_memory=False``** (KV and Mamba states): pinning needs an
  accelerator (SGLang's Mamba host pool registers its buffers with ``cudaHostRegister``
  otherwise). SGLang's own unit tests build host pools this way.
- **torchvision.** Its wheels for torch 2.13 are CUDA builds, which do not load beside torch's
  CPU build. SGLang's model-config package imports two names from ``torchvision.transforms``
  when it is imported (for InternVL's image preprocessing), and the cache never calls them. So
  when torchvision cannot be imported, a stand-in package answers those imports with
  placeholders that raise if called. transformers is asked whether torchvision exists first,
  so it keeps the true answer (no) and never reaches for the stand-in.

The last stand-in, one TP rank stated with ``get_parallel().override(...)`` as SGLang's test kit
does, is in ``sglang_cache`` where the cache is built. Thread-safe once installed (it only
binds names).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Sequence

import torch

#: What SGLang logs at WARNING here because it runs on torch.cpu (see the module docstring).
EXPECTED_WARNINGS = ("Event does not support timing; L2 transfer timing is disabled",)

_installed = False


def install() -> None:
    """Put the stand-ins in place (once per process)."""
    global _installed
    if _installed:
        return
    _stand_in_for_torchvision()
    import sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler as assembler
    import sglang.srt.mem_cache.pool_host.mamba as mamba_host
    import sglang.srt.mem_cache.pool_host.mha as mha_host
    import sglang.srt.mem_cache.pool_host.mla as mla_host

    for module in (mha_host, mla_host, mamba_host):
        module.transfer_kv_direct = direct_io.transfer_kv_direct
        module.transfer_kv_per_layer_direct_pf_lf = direct_io.transfer_kv_per_layer_direct_pf_lf
        module.transfer_kv_all_layer_direct_lf_pf = direct_io.transfer_kv_all_layer_direct_lf_pf
    pick_mha_class = assembler.get_mha_host_pool_cls
    assembler.get_mha_host_pool_cls = lambda info: _unpinned(pick_mha_class(info))
    assembler.MLATokenToKVPoolHost = _unpinned(assembler.MLATokenToKVPoolHost)
    assembler.MambaPoolHost = _unpinned(assembler.MambaPoolHost)
    _installed = True


def _unpinned(host_pool_class):
    def build(*args, **kwargs):
        kwargs["pin_memory"] = False
        pool = host_pool_class(*args, **kwargs)
        _make_resident(pool)
        return pool
    return build


def _make_resident(pool) -> None:
    """Fault in every page of the pool's buffers, as pinning them does (SGLang registers a host
    pool with ``cudaHostRegister``, which locks it in memory when it is built): left to fault on
    first touch, the first copies into a host slot would time the kernel, not the copy. Each
    page is written with the byte it holds, so no value changes."""
    for value in vars(pool).values():
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            if (isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and tensor.is_contiguous()
                    and tensor.nbytes >= _RESIDENT_FROM):
                every_page = tensor.view(-1).view(torch.uint8)[::_PAGE]
                every_page.copy_(every_page.clone())


#: Host pool tensors this large are the KV buffers (smaller ones are bookkeeping); a memory page.
_RESIDENT_FROM, _PAGE = 1 << 20, 4096


class direct_io:  # noqa: N801 - a namespace named as sgl_kernel's module is
    """Python ports of the three direct-backend ops, with sgl-kernel's signatures.

    Pools hold tokens on dimension 0 (device layers, ``layer_first`` host layers) or, in
    ``page_first_direct``, ``[page, layer, token in page, ...]``. Indices are token indices,
    whole pages, one page per ``page_size`` of them.
    """

    @staticmethod
    def transfer_kv_direct(src_layers: Sequence[torch.Tensor], dst_layers: Sequence[torch.Tensor],
                           src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
        """Copy the tokens ``src_indices`` of every source layer to ``dst_indices`` of its
        destination, one copy per run of indices consecutive on both sides."""
        src, dst = src_indices.tolist(), dst_indices.tolist()
        assert len(src) == len(dst) and len(src) % page_size == 0
        run_start = 0
        for i in range(len(src)):
            if i + 1 < len(src) and src[i + 1] == src[i] + 1 and dst[i + 1] == dst[i] + 1:
                continue
            n, s, d = i + 1 - run_start, src[run_start], dst[run_start]
            for source, target in zip(src_layers, dst_layers):
                target[d:d + n].copy_(source[s:s + n])
            run_start = i + 1

    @staticmethod
    def transfer_kv_per_layer_direct_pf_lf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                           src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                           layer_id: int, page_size: int) -> None:
        """Host ``page_first_direct`` (K, V or the MLA latent) to the device layers ``dst_ptrs``
        (K layers then V layers), starting at host layer ``layer_id``."""
        layers = len(dst_ptrs) // len(src_ptrs)
        for s, d in zip(src_indices.tolist()[::page_size], dst_indices.tolist()[::page_size]):
            for part, host in enumerate(src_ptrs):
                for j in range(layers):
                    dst_ptrs[part * layers + j][d:d + page_size].copy_(host[s // page_size][layer_id + j])

    @staticmethod
    def transfer_kv_all_layer_direct_lf_pf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                           src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                           page_size: int) -> None:
        """Every device layer ``src_ptrs`` (K layers then V layers) to host
        ``page_first_direct`` ``dst_ptrs`` (K, V or the MLA latent)."""
        layers = len(src_ptrs) // len(dst_ptrs)
        for s, d in zip(src_indices.tolist()[::page_size], dst_indices.tolist()[::page_size]):
            for part, host in enumerate(dst_ptrs):
                for j in range(layers):
                    host[d // page_size][j].copy_(src_ptrs[part * layers + j][s:s + page_size])


class _Unavailable:
    """A torchvision name SGLang imports but the cache never uses: calling it fails loudly."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is not installed here (hicachefs_testing.sglang_cpu)")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def unavailable(attr: str, prefix: str = spec.name):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Unavailable(f"{prefix}.{attr}")

        module.__getattr__ = unavailable
        return module

    def exec_module(self, module) -> None:
        pass


def _stand_in_for_torchvision() -> None:
    try:
        import torchvision  # noqa: F401 - a working torchvision needs no stand-in
        return
    except Exception:  # absent, or a CUDA build that fails beside torch's CPU build
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    from transformers.utils import import_utils

    # A cached answer (lru_cache), taken while torchvision is truly absent; transformers'
    # other torchvision checks ask this one first.
    import_utils.is_torchvision_available()
    sys.meta_path.insert(0, _TorchvisionStandIn())
