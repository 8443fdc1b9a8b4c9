"""The tiers a configuration asks for, in the order pages fall through them: RAM, then the SSD
tier (``--disk``), then the shared tier (``--shared``). The one place that knows every kind of
tier; the engine takes the list it is given.
"""

from __future__ import annotations

from hicachefs.store.ram.arena import size_class
from hicachefs.store.budget import RamBudget
from hicachefs.store.config import StoreConfig
from hicachefs.store.ram.ram_tier import RamTier
from hicachefs.store.shared import SharedTier
from hicachefs.store.ssd.ssd_tier import SsdTier
from hicachefs.store.tier import Tier

_MiB = 1 << 20
#: Write-behind to the shared tier absorbs bursts of publishes up to this many seconds of writes
#: at the filesystem's pace (and the RAM budget's share for it, which the queued pages keep
#: pinned); beyond, pages are dropped and counted, never waited for.
WRITE_BEHIND_LAG_S = 4.0


def ram_slab_bytes(config: StoreConfig) -> int:
    """Slabs as large as the largest page, but at least 8 of them, so that a small RAM tier does
    not hold a single size class at a time; larger pages bypass RAM."""
    return min(config.memory_bytes,
               max(_MiB, min(size_class(config.max_page_size), config.memory_bytes // 8)))


def build_chain(config: StoreConfig, budget: RamBudget, *, disk_device=None, shared_device=None) -> list[Tier]:
    """The tiers of ``config``, RAM first; ``budget``: the RAM tier's shares (the shared tier's
    write-behind queue takes one). ``disk_device``/``shared_device``: the devices of the SSD and
    shared tiers (tests pass FaultyDevices); by default the arena file in ``config.disk_dir``
    and the plain files of ``config.shared_dir``. The shared tier keeps the removals it owes its
    volume in ``config.disk_dir`` too, where there is one."""
    tiers: list[Tier] = [RamTier(config.memory_bytes, ram_slab_bytes(config))]
    try:
        if config.disk_dir is not None:
            tiers.append(SsdTier(config.disk_dir, config.disk_bytes, config.max_page_size, device=disk_device))
        if config.shared_dir is not None:
            tiers.append(SharedTier(config.shared_dir, config.shared_bytes, device=shared_device,
                                    queue_bytes=budget.share("write_behind"), queue_pages=4096,
                                    queue_lag_s=WRITE_BEHIND_LAG_S, owed_dir=config.disk_dir))
    except BaseException:
        for tier in reversed(tiers):
            tier.close()
        raise
    return tiers
