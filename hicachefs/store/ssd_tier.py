"""The SSD tier: one preallocated arena file in the disk directory, holding a RegionLog.

Chooses the region size: four of the largest records, so that the tail a region cannot use
(a record never straddles two) wastes at most a quarter and usually a few percent; at
least 16 MiB; and at least 8 regions, so that reclaiming one drops at most an eighth of the
tier (a small tier gets smaller regions, and pages too large for them stay in RAM only).
Also keeps the tier's counters.
Writes are serialised by the store's lock; ``read_into`` may run outside it (see RegionLog).
"""

from __future__ import annotations

from pathlib import Path

from hicachefs.store.region_log import RegionLog, record_length
from hicachefs.store.stats import TierCounters

ARENA_NAME = "hicachefs.arena"
_MiB = 1 << 20


def region_size(capacity: int, max_page_size: int) -> int:
    region = max(16 * _MiB, (4 * record_length(4096, max_page_size) + _MiB - 1) // _MiB * _MiB)
    if (capacity - 4096) // region < 8:
        region = max(4096, (capacity - 4096) // 8 // 4096 * 4096)
    return region


class SsdTier:
    def __init__(self, directory: Path, capacity: int, max_page_size: int) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.log = RegionLog(directory / ARENA_NAME, capacity, region_size(capacity, max_page_size))
        self.counters = TierCounters()

    @property
    def capacity(self) -> int:
        return self.log.capacity

    @property
    def used_bytes(self) -> int:
        return self.log.used_bytes

    def fits(self, name: bytes, size: int) -> bool:
        return self.log.fits(len(name), size)

    def fits_any_name(self, size: int) -> bool:
        """Whether a page of ``size`` bytes fits a region whatever its name (up to 4 KiB)."""
        return self.log.fits(4096, size)

    def write(self, name: bytes, payload, checksum: int, mtime_ns: int, reclaim) -> int:
        offset = self.log.append(name, payload, checksum, mtime_ns, reclaim)
        self.counters.bytes_in += len(payload)
        return offset

    def invalidate(self, offset: int, name: bytes, size: int) -> None:
        self.log.invalidate(offset, len(name), size)

    def close(self) -> None:
        self.log.close()
