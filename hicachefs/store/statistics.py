"""The store's statistics (typed: see ``hicachefs.typed_stats``): each tier's, and the store's
as a whole.

The counters a tier keeps as it works (``TierCounters``) are mutable and guarded by its owner's
lock; ``snapshot`` gives them as the keyword arguments of the frozen values handed out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hicachefs.typed_stats import as_dict, level, total

_TOTALS = ("hits", "misses", "evictions", "demotions", "promotions", "checksum_failures", "io_errors",
           "bytes_in", "bytes_out")


@dataclass
class TierCounters:
    """A tier's running totals, changed as it works (its owner's lock guards them); what each
    means is said at ``Totals``."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    demotions: int = 0
    promotions: int = 0
    checksum_failures: int = 0
    io_errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def snapshot(self) -> dict[str, int]:
        """The totals now, as keyword arguments of ``Totals``."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Totals:
    """Running totals, of a tier or summed over the store's. ``evictions``: pages dropped from
    the store to make room (lost). ``demotions``: pages moved down to the next tier.
    ``promotions``: pages copied up into a tier. ``misses``: lookups not served.
    ``bytes_in``/``bytes_out``: page bytes written in / read out. ``io_errors``: device calls
    that failed."""

    hits: int = total()
    misses: int = total()
    evictions: int = total()
    demotions: int = total()
    promotions: int = total()
    checksum_failures: int = total()
    io_errors: int = total()
    bytes_in: int = total()
    bytes_out: int = total()


@dataclass(frozen=True)
class TierStatistics(Totals):
    """One tier: its name, its room, the pages the engine knows it holds, and its totals.
    ``used_bytes``: what its pages take (slots or records); ``free_bytes``: what it can still
    take before it drops a page (``Tier.free_bytes``), which may be less than the rest."""

    name: str = field(default="", metadata={"hidden": True})
    capacity_bytes: int = level()
    used_bytes: int = level()
    free_bytes: int = level()
    pages: int = level()


@dataclass(frozen=True)
class StoreStatistics(Totals):
    """The store as a whole, what ``df`` shows: ``capacity_bytes`` and ``free_bytes`` are the
    local tiers' (``TierStatistics.free_bytes``: what can still be stored before a page is
    evicted), but RAM's with --write-through (a cache of the disk's pages there); ``used_bytes``
    is the rest, the room slabs and regions cannot use yet included. ``pages`` counts a page
    held by several tiers once, and ``page_bytes`` its size once (what ``du -b`` adds up).
    The totals are sums over the tiers of this host (``tiers``), but ``misses``, which
    counts names no tier held; ``published``: the pages published (one kept as it was is not)."""

    capacity_bytes: int = level()
    used_bytes: int = level()
    free_bytes: int = level()
    page_bytes: int = level()
    pages: int = level()
    published: int = total()
    tiers: tuple[TierStatistics, ...] = field(default=(), metadata={"hidden": True})

    def tier(self, name: str) -> TierStatistics | None:
        return next((t for t in self.tiers if t.name == name), None)

    def as_dict(self) -> dict:
        """The layout of ``.hicachefs/stats``: the store's facts at the top, ``tiers`` by name."""
        return {**as_dict(self), "tiers": {t.name: as_dict(t) for t in self.tiers}}


def summed(tiers: list[TierStatistics]) -> dict[str, int]:
    """Each total summed over ``tiers``."""
    return {name: sum(getattr(t, name) for t in tiers) for name in _TOTALS}
