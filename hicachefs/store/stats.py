"""Per-tier counters, rendered by ``PageStore.statistics``. Mutated under the store's lock."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TierCounters:
    """``evictions``: pages dropped from the store by this tier to make room (lost).
    ``demotions``: pages moved from this tier down to the next. ``promotions``: pages copied
    up into this tier. ``misses``: lookups this tier could not serve. ``bytes_in``/``bytes_out``:
    page bytes written into / read out of the tier. ``io_errors``: device calls that failed."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    demotions: int = 0
    promotions: int = 0
    checksum_failures: int = 0
    io_errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
