"""The FUSE-free tiered page store: immutable pages under '/'-separated names, in tiers (a RAM
arena in ``ram/``, an SSD region log in ``ssd/``, a filesystem other hosts share in ``shared/``),
behind the one ``Tier`` interface (``tier.py``); ``store.py`` is the engine that moves pages
between them, ``budget.py`` the owner of the RAM tier's shares.

Never imports pyfuse3 or torch; the daemon (``hicachefs.posix``, ``hicachefs.control``) is one
caller, the tests and ``scripts/bench_store.py`` are others. What they may use is exported here;
the CLI checks a disk directory before mounting with ``check_disk_dir``, and its size with
``smallest_disk``.
"""

import importlib

#: Each name exported here, and the module that defines it. They are imported on first use
#: (PEP 562), so that a light caller (``hicachefs mount``'s checks: ``check_disk_dir``, the
#: configuration) does not pay for numpy and the tiers, some 0.15 s of a core a command.
_EXPORTS = {
    "ArenaRefused": "ssd.device",
    "DeviceError": "errors",
    "Gone": "store",
    "Draft": "pages",
    "NeedsIO": "pages",
    "PageCorrupt": "errors",
    "PageInfo": "pages",
    "PageNotFound": "errors",
    "PageReader": "pages",
    "PageStore": "store",
    "PageTooLarge": "errors",
    "PrivateReadsFull": "errors",
    "StoreConfig": "config",
    "StoreError": "errors",
    "StoreFull": "errors",
    "StoreStatistics": "statistics",
    "check_disk_dir": "ssd.ssd_tier",
    "size_class": "ram.arena",
    "smallest_disk": "ssd.ssd_tier",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [  # noqa: F822 (defined by __getattr__)
    "ArenaRefused",
    "DeviceError",
    "Gone",
    "Draft",
    "NeedsIO",
    "PageCorrupt",
    "PageInfo",
    "PageNotFound",
    "PageReader",
    "PageStore",
    "PageTooLarge",
    "PrivateReadsFull",
    "StoreConfig",
    "StoreError",
    "StoreFull",
    "StoreStatistics",
    "check_disk_dir",
    "size_class",
    "smallest_disk",
]
