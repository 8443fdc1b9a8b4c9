"""SGLang's storage types, or stand-ins with the same names and fields when SGLang is absent.

The client subclasses SGLang's ``HiCacheStorage`` so that SGLang's backend factory accepts it;
without SGLang (tools, tests of the client alone) the stand-ins below keep the same method set
and the same data shapes. Nothing here does I/O.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

logger = logging.getLogger(__name__)

try:  # pragma: no branch - which arm runs depends on the environment
    if os.environ.get("HICACHEFS_CLIENT_WITHOUT_SGLANG"):
        # Tools that never hand the backend to SGLang skip its import (seconds: it loads
        # transformers).
        raise ImportError("HICACHEFS_CLIENT_WITHOUT_SGLANG is set")
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )

    HAVE_SGLANG = True
except Exception as exc:  # ImportError, or a broken SGLang install
    HAVE_SGLANG = False
    logger.debug("SGLang's hicache_storage is not importable (%s); using stand-ins", exc)

    class PoolName(str, Enum):  # type: ignore[no-redef]
        """The pool names SGLang uses most; any other name is passed as a plain string."""

        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        AUXILIARY_SWA = "auxiliary_swa"
        INDEXER = "indexer"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, Enum):  # type: ignore[no-redef]
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"
        BLOCK_GROUPS = "block_groups"

    @dataclass
    class PoolTransfer:  # type: ignore[no-redef]
        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[List[str]] = None
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Any = None
        block_pages: int = 0
        group_pages: int = 0

    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        kv_hit_pages: int
        extra_pool_hit_pages: dict
        restorable_prefix_pages: Optional[List[int]] = None

        @classmethod
        def empty(cls) -> "PoolTransferResult":
            return cls(0, {})

    class HiCacheStorage:  # type: ignore[no-redef]
        """The method set SGLang's HiCacheStorage declares, for use without SGLang."""

        def register_mem_pool_host(self, mem_pool_host) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def on_host_pools_registered(self) -> None:
            pass

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None


def pool_name_str(name: Any) -> str:
    """The directory name of a pool: the ``PoolName`` value, or the string given."""
    value = getattr(name, "value", name)
    return str(value)


@dataclass
class ClientStorageMetrics:
    """What ``get_stats`` returns when SGLang's ``StorageMetrics`` is not importable.

    Same four lists as SGLang's ``StorageMetrics``, plus the client's counters.
    """

    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)
    counters: dict = field(default_factory=dict)


def storage_metrics_class():
    """SGLang's ``StorageMetrics`` (its metrics collector asserts that type), else the stand-in.
    Not remembered when SGLang's module cannot be imported: it may become importable later in
    the process (its import chain completed), and from then on SGLang asserts its own type."""
    if not HAVE_SGLANG:
        return ClientStorageMetrics
    try:
        from sglang.srt.observability.metrics_collector import StorageMetrics

        return StorageMetrics
    except Exception:  # not installed, or its import chain is incomplete here
        return ClientStorageMetrics
