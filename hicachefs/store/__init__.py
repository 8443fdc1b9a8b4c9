"""The FUSE-free tiered page store: immutable pages under '/'-separated names, in a RAM arena and an SSD region log.

Never imports pyfuse3 or torch; the daemon in ``hicachefs.fs`` is one caller, the tests and
``scripts/bench_store.py`` are others.
"""

from hicachefs.store.config import StoreConfig
from hicachefs.store.errors import PageCorrupt, PageNotFound, PageTooLarge, StoreError, StoreFull
from hicachefs.store.store import Draft, PageInfo, PageReader, PageStore

__all__ = [
    "Draft",
    "PageCorrupt",
    "PageInfo",
    "PageNotFound",
    "PageReader",
    "PageStore",
    "PageTooLarge",
    "StoreConfig",
    "StoreError",
    "StoreFull",
]
