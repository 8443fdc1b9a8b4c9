"""The FUSE-free tiered page store: immutable pages under '/'-separated names, in tiers (a RAM
arena in ``ram/``, an SSD region log in ``ssd/``, a filesystem other hosts share in ``shared/``),
behind the one ``Tier`` interface (``tier.py``); ``store.py`` is the engine that moves pages
between them, ``budget.py`` the owner of the RAM tier's shares.

Never imports pyfuse3 or torch; the daemon (``hicachefs.posix``, ``hicachefs.control``) is one
caller, the tests and ``scripts/bench_store.py`` are others. What they may use is exported here;
the CLI checks a disk directory before mounting with ``check_disk_dir``.
"""

from hicachefs.store.config import StoreConfig
from hicachefs.store.errors import DeviceError, PageCorrupt, PageNotFound, PageTooLarge, StoreError, StoreFull
from hicachefs.store.pages import Draft, NeedsIO, PageInfo, PageReader, page_checksum
from hicachefs.store.ram.arena import size_class
from hicachefs.store.ssd.device import ArenaRefused
from hicachefs.store.ssd.ssd_tier import check_disk_dir
from hicachefs.store.statistics import StoreStatistics, TierStatistics
from hicachefs.store.store import PageStore

__all__ = [
    "ArenaRefused",
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
    "check_disk_dir",
    "page_checksum",
    "size_class",
]
