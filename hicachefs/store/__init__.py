"""The FUSE-free tiered page store: immutable pages under '/'-separated names, in tiers (a RAM arena, an SSD region log).

Never imports pyfuse3 or torch; the daemon in ``hicachefs.fs`` is one caller, the tests and
``scripts/bench_store.py`` are others.
"""

from hicachefs.store.config import StoreConfig
from hicachefs.store.errors import DeviceError, PageCorrupt, PageNotFound, PageTooLarge, StoreError, StoreFull
from hicachefs.store.pages import Draft, NeedsIO, PageInfo, PageReader, page_checksum
from hicachefs.store.statistics import StoreStatistics, TierStatistics
from hicachefs.store.store import PageStore

__all__ = [
    "DeviceError",
    "Draft",
    "NeedsIO",
    "PageCorrupt",
    "PageInfo",
    "PageNotFound",
    "PageReader",
    "PageStore",
    "PageTooLarge",
    "StoreConfig",
    "StoreError",
    "StoreFull",
    "StoreStatistics",
    "TierStatistics",
    "page_checksum",
]
