"""Where a page's bytes live in an SGLang host pool.

A stored page holds exactly the bytes of ``host_pool.get_data_page(index, flat=True)``, in that
order (docs/contract.md: byte-compatible with SGLang's file backend). Two ways to reach them:

- zero copy, for page-first layouts: ``get_page_buffer_meta`` names the page's pieces (K then V
  for MHA, one piece for MLA) as pointers into the pool's tensors; each becomes a memoryview of
  the numpy view of that tensor's storage, and preadv/pwritev move bytes straight in and out.
  Once a batch's pieces show each piece's pointer moving by a fixed stride per host index, as
  SGLang's strided pools do, pages not seen yet are placed by that rule instead of asking. A
  pool whose pages move in its buffer (``stores_page_envelope``) is asked on every call.
  The piece order is checked once against ``get_data_page`` on a page whose bytes can tell the
  order apart (a pool without flat pages, SGLang's ``AsymmetricMHATokenToKVPoolHost``, has
  none to check against: its page is its pieces in that order, and zero copy alone serves it);
  a pool that fails the check (or whose pointers fall outside its tensors) uses:
- a copy, for every other layout (``layer_first`` interleaves layers, so one page is not a
  run of pieces in file order): ``get_data_page(flat=True)`` for writing, and a flat page
  buffer then ``set_from_flat_data_page`` for reading.

A pool whose pages hold no bytes (DeepSeek V4's logical anchor: its pages only say that a
prefix was stored, the bytes being in the group's other pools) keeps a marker page of one byte
per page, a page being one byte at least (docs/contract.md); reading one puts nothing into the
pool.

Thread-safe: the per-pool facts are computed once under a lock; page buffers are per call.

The calls SGLang makes per batch use no torch operation on the way: each lets go of the
interpreter lock, and under SGLang's other threads taking it back cost tens of microseconds a
time on average (a prefetch of 58 pages of 128 KiB asked 60 of them for its views).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import forks
from .paths import format_segment

logger = logging.getLogger(__name__)

# Layouts in which one page is a few contiguous runs whose concatenation is the flat page.
ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head")

# Host pages whose zero-copy views are kept (two memoryviews each for MHA).
_KEPT_PAGE_VIEWS = 16384

# Inconclusive order checks (pages whose pieces are all alike) before trusting the structure.
_MAX_INCONCLUSIVE_CHECKS = 32

# What a page of a pool whose pages hold no bytes is stored as.
MARKER = b"\x01"

# Attributes of SGLang host pools that hold their page storage.
_BUFFER_ATTRS = ("kv_buffer", "k_buffer", "v_buffer", "temporal_buffer", "conv_buffer",
                 "index_k_buffer", "index_k_scale_buffer")


def resolve_pool(pool: Any, name: Any = None) -> Any:
    """The concrete host pool: a HostPoolGroup resolves to its entry for ``name`` (or anchor)."""
    entry_map = getattr(pool, "entry_map", None)
    if isinstance(entry_map, dict):
        if name is not None and name in entry_map:
            return entry_map[name].host_pool
        anchor = getattr(pool, "anchor_entry", None)
        if anchor is not None:
            return anchor.host_pool
    return pool


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A flat byte view of a CPU tensor (a copy first if it is not contiguous)."""
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous().reshape(-1)
    if tensor.dtype != torch.uint8:
        tensor = tensor.view(torch.uint8)
    return memoryview(tensor.numpy()).cast("B")


class IndicesOutsidePool(ValueError):
    """A call's host indices are no pages of its host pool (``PageLayout._check_starts``)."""


@dataclass
class _Region:
    start: int
    end: int
    view: memoryview  # the whole storage, as bytes
    owner: Any  # keeps the storage alive


class PageLayout:
    """Page geometry and page buffers of one host pool. See the module docstring."""

    def __init__(self, pool: Any, name: Any = None) -> None:
        self.pool = pool
        self.name = name
        self.page_size = int(pool.page_size)
        # The stride of a page in host indices: DCP pools index logical (widened) pages.
        self.index_step = int(getattr(pool, "logical_page_size", self.page_size) or self.page_size)
        can_zero_copy = str(pool.layout) in ZERO_COPY_LAYOUTS and hasattr(pool, "get_page_buffer_meta")
        page_bytes, dtype = self._page_bytes_and_dtype(can_zero_copy)
        # A pool without the flat-page calls (SGLang's AsymmetricMHATokenToKVPoolHost: K and V of
        # other head sizes) is served by zero copy alone, in the order of its page's pieces.
        self.flat_page = page_bytes is not None
        self.page_bytes = page_bytes if page_bytes is not None else self._meta_page_bytes()
        self.marker = self.page_bytes == 0  # its pages are stored as MARKER (module docstring)
        if self.marker:
            self.page_bytes = len(MARKER)
        self.format = format_segment(dtype, str(pool.layout), self.page_size, self.page_bytes,
                                     getattr(pool, "storage_format_tag", None))
        # An MHA pool (SGLang's have ``head_num``) holds this rank's share of the KV heads, even
        # in an MLA model (an MHA draft): never the bytes of every rank (``ShardIdentity``).
        self.rank_heads = hasattr(pool, "head_num")
        self._lock = threading.Lock()
        self._regions: Optional[List[_Region]] = None
        self._local = threading.local()
        self.zero_copy = not self.marker and can_zero_copy
        self._page_views: "collections.OrderedDict[int, List[memoryview]]" = collections.OrderedDict()
        # Per piece (pointer at host index 0, pointer stride per host index, size), once learnt.
        self._strided: Optional[List[Tuple[int, int, int]]] = None
        self._verified = not self.flat_page  # no flat page to check the order against
        self._inconclusive = 0
        # A pool whose host pages move in its buffer (SGLang's page-envelope pools: a table
        # places each page, and compaction changes it between calls) is asked every call.
        self._pages_move = bool(getattr(pool, "stores_page_envelope", False))
        forks.renew_in_child(self)

    def forked(self) -> None:
        """In a forked child: a thread of the parent's may have held the lock at the fork."""
        self._lock = threading.Lock()

    def _page_bytes_and_dtype(self, can_zero_copy: bool) -> Tuple[Optional[int], Any]:
        """A flat page's size and the pool's dtype; a size of None where the pool does not
        implement flat pages but names its page's pieces (``_meta_page_bytes`` then)."""
        try:
            dummy = self.pool.get_dummy_flat_data_page()
        except NotImplementedError:
            if not can_zero_copy:
                raise
            return None, self.pool.dtype
        return int(dummy.numel() * dummy.element_size()), getattr(self.pool, "dtype", dummy.dtype)

    def _meta_page_bytes(self) -> int:
        """A page's size as the sum of its pieces' (``get_page_buffer_meta`` of host page 0)."""
        _, sizes = self.pool.get_page_buffer_meta(torch.arange(0, self.index_step, dtype=torch.int64))
        return sum(int(size) for size in sizes)

    # ---------------------------------------------------------------- indices

    def page_starts(self, host_indices: Any, pages: int) -> Optional[List[int]]:
        """The host index of each page's first token; None if the indices do not fit."""
        if host_indices is None or pages <= 0:
            return [] if pages == 0 else None
        count = int(host_indices.numel()) if hasattr(host_indices, "numel") else len(host_indices)
        if count == pages * self.index_step:
            step = self.index_step
        elif count == pages * self.page_size:
            step = self.page_size
        else:
            return None
        if isinstance(host_indices, torch.Tensor):
            return _every(host_indices, step)
        return [int(i) for i in list(host_indices)[::step]]

    # ---------------------------------------------------------------- page buffers

    def zero_copy_buffers(self, starts: Sequence[int]) -> Optional[List[List[memoryview]]]:
        """Per page, memoryviews of its pieces in file order; None to use the copy path.
        A host page's pieces never move, so they are kept for the next call (the last
        ``_KEPT_PAGE_VIEWS`` pages'); a page not kept is placed by the pool's strides once they
        are known, else asked of the pool (with the batch's other pages not kept). A pool whose
        pages move (``_pages_move``) is asked for every page of every call. Raises
        ``IndicesOutsidePool`` for pages outside the pool (``_check_starts``)."""
        if not self.zero_copy or not starts:
            return None
        self._check_starts(starts)
        if self._pages_move:
            return self._ask_zero_copy_buffers(starts)
        with self._lock:
            kept = [self._page_views.get(start) for start in starts]
        missing = [start for start, views in zip(starts, kept) if views is None]
        if not missing:
            return kept  # type: ignore[return-value]
        found = self._placed(missing) or self._ask_zero_copy_buffers(missing)
        if found is None:
            return None
        with self._lock:
            for start, views in zip(missing, found):
                self._page_views[start] = views
            while len(self._page_views) > _KEPT_PAGE_VIEWS:
                self._page_views.popitem(last=False)
        placed = dict(zip(missing, found))
        return [views if views is not None else placed[start] for start, views in zip(starts, kept)]

    def _placed(self, starts: Sequence[int]) -> Optional[List[List[memoryview]]]:
        """The pages' pieces by the pool's strides; None while they are not known (or a piece
        would fall outside the pool's tensors: the pool is then asked)."""
        strided = self._strided
        if strided is None:
            return None
        pages = []
        for start in starts:
            views = [self._view(at_zero + start * stride, size) for at_zero, stride, size in strided]
            if any(view is None for view in views):
                return None
            pages.append(views)
        return pages  # type: ignore[return-value]

    def _ask_zero_copy_buffers(self, starts: Sequence[int]) -> Optional[List[List[memoryview]]]:
        """The pool's ``get_page_buffer_meta`` for these pages, as memoryviews (checked once
        against ``get_data_page``)."""
        try:
            indices = torch.cat([torch.arange(s, s + self.index_step, dtype=torch.int64)
                                 for s in starts])
            ptrs, sizes = self.pool.get_page_buffer_meta(indices)
        except Exception as exc:
            self._disable(f"get_page_buffer_meta failed: {exc!r}")
            return None
        if not ptrs or len(ptrs) != len(sizes) or len(ptrs) % len(starts):
            self._disable(f"get_page_buffer_meta gave {len(ptrs)} pieces for {len(starts)} pages")
            return None
        per_page = len(ptrs) // len(starts)
        ptrs, sizes = [int(ptr) for ptr in ptrs], [int(size) for size in sizes]
        pages = []
        for p in range(len(starts)):
            views = []
            for ptr, size in zip(ptrs[p * per_page:(p + 1) * per_page],
                                 sizes[p * per_page:(p + 1) * per_page]):
                view = self._view(ptr, size)
                if view is None:
                    self._disable(f"a page piece at {ptr:#x} (+{size}) lies outside the pool's tensors")
                    return None
                views.append(view)
            if sum(len(v) for v in views) != self.page_bytes:
                self._disable(f"page pieces hold {sum(len(v) for v in views)} bytes, a flat "
                              f"page {self.page_bytes}")
                return None
            pages.append(views)
        if not self._verified and not self._check_order(starts[0], pages[0]):
            return None
        if self._strided is None and not self._pages_move:
            self._strided = _strides(starts, ptrs, sizes, per_page)
        return pages

    def copy_write_buffers(self, start: int) -> List[memoryview]:
        """The page's bytes from ``get_data_page(flat=True)`` (a copy when not contiguous)."""
        if self.marker:
            return [memoryview(MARKER)]
        return [tensor_bytes(self.pool.get_data_page(start, flat=True))]

    def copy_read_buffers(self, count: int) -> Tuple[List[List[memoryview]], Callable[[int, int], None]]:
        """``count`` flat page buffers (this thread's own, per pool, kept for its next call) and
        the call ``store(j, start)`` that puts buffer ``j`` into the page at host index ``start``."""
        if self.marker:  # read to know it is there; nothing goes into the pool
            return [[memoryview(bytearray(len(MARKER)))] for _ in range(count)], lambda j, start: None
        pages = getattr(self._local, "pages", None)
        if pages is None:
            pages = self._local.pages = []
        while len(pages) < count:
            page = self.pool.get_dummy_flat_data_page()
            if page.device.type != "cpu" or not page.is_contiguous():
                page = page.cpu().contiguous()
            pages.append(page)
        views = [[memoryview(page.view(torch.uint8).numpy()).cast("B")] for page in pages[:count]]
        return views, lambda j, start: self.pool.set_from_flat_data_page(start, pages[j])

    # ---------------------------------------------------------------- internals

    def _check_starts(self, starts: Sequence[int]) -> None:
        """A page starting below 0, past the pool's slots (SGLang's ``logical_size``, else
        ``size``) or off a page's boundary is the call's fault, not the pool's: the call fails
        alone (``IndicesOutsidePool``). Checked before any piece is placed: placed by the pool's
        strides, such a page could land in another of its buffers, and be written from or read
        into that buffer's bytes (found by review)."""
        slots = getattr(self.pool, "logical_size", None) or getattr(self.pool, "size", None)
        step = self.index_step
        for start in starts:
            if start < 0 or start % step or (isinstance(slots, int) and start + step > slots):
                raise IndicesOutsidePool(f"host index {start} is no page of the pool's {slots} slots "
                                         f"({step} a page)")

    def _disable(self, why: str) -> None:
        if self.zero_copy:
            self.zero_copy = False
            logger.warning("hicachefs client: pool %s (%s): %s; copying pages instead of zero copy",
                           self.name, type(self.pool).__name__, why)

    def _check_order(self, start: int, views: List[memoryview]) -> bool:
        """Compare the pieces with ``get_data_page`` once; keeps checking while inconclusive."""
        try:
            expected = np.frombuffer(tensor_bytes(self.pool.get_data_page(start, flat=True)),
                                     dtype=np.uint8)
        except Exception as exc:
            self._disable(f"get_data_page failed: {exc!r}")
            return False
        pieces = [np.frombuffer(v, dtype=np.uint8) for v in views]
        if not np.array_equal(np.concatenate(pieces), expected):
            self._disable("get_page_buffer_meta's pieces are not the flat page in order")
            return False
        distinct = expected.size and expected.min() != expected.max() and all(
            a.size != b.size or not np.array_equal(a, b)
            for i, a in enumerate(pieces) for b in pieces[i + 1:])
        with self._lock:
            if distinct:
                self._verified = True
            else:
                self._inconclusive += 1
                self._verified = self._inconclusive >= _MAX_INCONCLUSIVE_CHECKS
        return True

    def _view(self, ptr: int, size: int) -> Optional[memoryview]:
        for region in self._storage_regions():
            if region.start <= ptr and ptr + size <= region.end:
                offset = ptr - region.start
                return region.view[offset:offset + size]
        return None

    def _storage_regions(self) -> List[_Region]:
        if self._regions is not None:
            return self._regions
        with self._lock:
            if self._regions is None:
                self._regions = self._find_regions()
        return self._regions

    def _find_regions(self) -> List[_Region]:
        tensors: List[torch.Tensor] = []

        def collect(obj: Any) -> None:
            if isinstance(obj, torch.Tensor):
                tensors.append(obj)
            elif isinstance(obj, (list, tuple)):
                for item in obj:
                    collect(item)

        for attr in _BUFFER_ATTRS:
            try:
                collect(getattr(self.pool, attr, None))
            except Exception:  # a property that does not apply to this pool
                pass
        getter = getattr(self.pool, "get_hybrid_pool_buffer", None)
        if callable(getter):
            try:
                collect(getter())
            except Exception:
                pass
        regions, seen = [], set()
        for tensor in tensors:
            if tensor.device.type != "cpu":
                continue
            storage = tensor.untyped_storage()
            start = storage.data_ptr()
            if start in seen or storage.nbytes() == 0:
                continue
            seen.add(start)
            whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
            regions.append(_Region(start, start + storage.nbytes(),
                                   memoryview(whole.numpy()).cast("B"), whole))
        return regions


def _every(indices: torch.Tensor, step: int) -> List[int]:
    """Every ``step``-th of a tensor of host indices, read where they lie when they are int64
    and contiguous (as SGLang's are), with no torch operation (see the module docstring)."""
    if indices.device.type == "cpu" and indices.dtype == torch.int64 and indices.is_contiguous():
        held = ctypes.string_at(indices.data_ptr(), 8 * indices.numel())  # (holds the lock)
        return memoryview(held).cast("q")[::step].tolist()
    return [int(i) for i in indices.reshape(-1)[::step].tolist()]


def _strides(starts: Sequence[int], ptrs: List[int], sizes: List[int],
             per_page: int) -> Optional[List[Tuple[int, int, int]]]:
    """Per piece (pointer at host index 0, stride per host index, size), when every page of
    ``starts`` (two different ones at least) has its pieces where that rule puts them."""
    first, other = starts[0], next((s for s in starts if s != starts[0]), None)
    if other is None:
        return None
    at = {start: p * per_page for p, start in enumerate(starts)}
    rule = []
    for piece in range(per_page):
        moved = ptrs[at[other] + piece] - ptrs[at[first] + piece]
        if moved % (other - first):
            return None
        stride = moved // (other - first)
        rule.append((ptrs[at[first] + piece] - first * stride, stride, sizes[at[first] + piece]))
    for p, start in enumerate(starts):
        for piece, (at_zero, stride, size) in enumerate(rule):
            if (ptrs[p * per_page + piece], sizes[p * per_page + piece]) != (at_zero + start * stride, size):
                return None
    return rule
