"""The SSD tier: one preallocated arena file in the disk directory, holding a RegionLog.

Chooses the region size: four of the largest records, so that the tail a region cannot use
(a record never straddles two) wastes at most a quarter and usually a few percent; at
least 16 MiB; and at least 8 regions, so that reclaiming one drops at most an eighth of the
tier (a small tier gets smaller regions, and pages too large for them stay in RAM only).

Making room is the tier's own business: when the ring wraps, the oldest region is reclaimed
and ``on_reclaim(start, end)`` tells the store which locations are about to be overwritten.
Writes are serialised by the store's lock; ``read_into`` may run outside it (see RegionLog).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from hicachefs.store.device import FileDevice
from hicachefs.store.region_log import Record, RegionLog, record_length
from hicachefs.store.stats import TierCounters
from hicachefs.store.tier import PageMeta, ReadResult, Tier

ARENA_NAME = "hicachefs.arena"
_MiB = 1 << 20


def region_size(capacity: int, max_page_size: int) -> int:
    region = max(16 * _MiB, (4 * record_length(4096, max_page_size) + _MiB - 1) // _MiB * _MiB)
    if (capacity - 4096) // region < 8:
        region = max(4096, (capacity - 4096) // 8 // 4096 * 4096)
    return region


class SsdTier(Tier):
    name = "disk"

    def __init__(self, directory: Path, capacity: int, max_page_size: int,
                 on_reclaim: Callable[[int, int], None], device: FileDevice | None = None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        device = device or FileDevice(directory / ARENA_NAME)
        try:
            self.log = RegionLog(device, capacity, region_size(capacity, max_page_size))
        except BaseException:
            device.close()
            raise
        self.counters = TierCounters()
        self._on_reclaim = on_reclaim

    @property
    def capacity_bytes(self) -> int:
        return self.log.capacity

    @property
    def used_bytes(self) -> int:
        return self.log.used_bytes

    def fits(self, name: bytes, size: int) -> bool:
        return self.log.fits(len(name), size)

    def retention_bytes(self) -> int:
        return self.log.capacity - self.log.region_bytes

    def recover(self, progress: Callable[[int, int], None] | None = None) -> Iterator[Record]:
        """The live records found by scanning the arena, oldest first (see RegionLog.scan)."""

        def corrupt() -> None:
            self.counters.checksum_failures += 1

        return self.log.scan(corrupt, progress)

    def write(self, page: PageMeta, payload) -> int:
        try:
            offset = self.log.append(page.name.encode(), payload, page.checksum, page.mtime_ns, self._on_reclaim)
        except OSError:
            self.counters.io_errors += 1
            raise
        self.counters.bytes_in += page.size
        return offset

    def read_into(self, page: PageMeta, location: int, out: memoryview) -> ReadResult:
        try:
            result = self.log.read_into(location, page.name.encode(), page.checksum, out)
        except OSError:
            self.counters.io_errors += 1
            raise
        if result is ReadResult.OK:
            self.counters.hits += 1
            self.counters.bytes_out += page.size
        return result

    def drop(self, page: PageMeta, location: int) -> None:
        try:
            self.log.invalidate(location, len(page.name.encode()), page.size)
        except OSError:
            # The record stays live on the device: a restart may bring the page back, never
            # wrong bytes (its checksum still holds). Counted; the store forgets it either way.
            self.counters.io_errors += 1

    def sync(self) -> None:
        self.log.sync()

    def drop_cache(self) -> None:
        """Evict the arena from the kernel's page cache, so the next reads are cold (benchmarks)."""
        self.log.device.drop_cache()

    def close(self) -> None:
        self.log.close()
