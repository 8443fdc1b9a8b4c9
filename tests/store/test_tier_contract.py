"""Each tier alone, through the Tier interface the store moves pages with."""

from __future__ import annotations

import pytest
from store_helpers import KiB, MiB

from hicachefs.store.ram.eviction import LruPolicy
from hicachefs.store.ram.ram_tier import RamTier
from hicachefs.store.pages import page_checksum
from hicachefs.store.ssd.ssd_tier import SsdTier
from hicachefs.store.pages import PageMeta
from hicachefs.store.tier import ReadResult
from hicachefs_testing.workload import content


def _ram(tmp_path, reclaimed):
    return RamTier(8 * MiB, 1 * MiB, LruPolicy())


class _Engine:
    """What a tier tells the engine it is bound to (``TierEvents``): here, written down. Each
    reclaimed page is said to have left the store (no other copy)."""

    def __init__(self, reclaimed):
        self.reclaimed = reclaimed

    def reclaiming(self, start: int, end: int) -> int:
        self.reclaimed.append((start, end))
        return 1


def _ssd(tmp_path, reclaimed):
    tier = SsdTier(tmp_path / "disk", 64 * MiB, 1 * MiB)
    tier.bind(_Engine(reclaimed))
    return tier


TIERS = {"memory": _ram, "disk": _ssd}


@pytest.fixture(params=sorted(TIERS))
def tier(request, tmp_path):
    made = TIERS[request.param](tmp_path, [])
    yield made
    made.close()


def _page(i: int, size: int) -> tuple[PageMeta, bytes]:
    data = content(i, size)
    return PageMeta(f"m/f/tp0of1/kv/{i:064x}", size, page_checksum(data), 1_000 + i), data


def test_a_written_page_reads_back_exactly_and_is_accounted(tier):
    pages = [_page(i, size) for i, size in enumerate([0, 1, 4 * KiB, 300 * KiB, 1 * MiB - 100])]
    locations = [tier.write(meta, data) for meta, data in pages]
    assert len(set(locations)) == len(locations)
    assert tier.used_bytes >= sum(meta.size for meta, _ in pages)
    for (meta, data), location in zip(pages, locations):
        out = memoryview(bytearray(meta.size))
        assert tier.read_into(meta, location, out) is ReadResult.OK
        assert bytes(out) == data
    assert tier.statistics().bytes_in == sum(meta.size for meta, _ in pages)


def test_a_dropped_page_frees_its_room(tier):
    meta, data = _page(1, 256 * KiB)
    before = tier.used_bytes
    location = tier.write(meta, data)
    assert tier.used_bytes > before
    tier.drop(meta, location)
    assert tier.used_bytes == before


def test_a_ram_write_whose_copy_fails_takes_no_slot(tmp_path):
    """A payload that cannot be copied into the slot (here: not the page's size) raises, and the
    slot it was given came back: it stayed used, held by no page, room lost until a restart."""
    tier = _ram(tmp_path, [])
    try:
        meta, _ = _page(1, 4 * KiB)
        with pytest.raises(ValueError):
            tier.write(meta, b"short")
        assert tier.used_bytes == 0
    finally:
        tier.close()


def test_fits_refuses_what_can_never_be_placed(tier):
    assert tier.fits(b"m/f/tp0of1/kv/k", 1 * MiB - 4096)
    assert not tier.fits(b"m/f/tp0of1/kv/k", 64 * MiB)


def test_the_disk_tier_tells_another_pages_bytes_from_the_expected_ones(tmp_path):
    ssd = _ssd(tmp_path, [])
    try:
        first, first_data = _page(1, 64 * KiB)
        second, _ = _page(2, 64 * KiB)
        location = ssd.write(first, first_data)
        out = memoryview(bytearray(second.size))
        assert ssd.read_into(second, location, out) is ReadResult.MISMATCH
        ssd.drop(first, location)
        assert ssd.read_into(first, location, memoryview(bytearray(first.size))) is ReadResult.MISMATCH
    finally:
        ssd.close()


def test_the_disk_tier_reclaims_its_oldest_region_and_says_which(tmp_path):
    reclaimed: list[tuple[int, int]] = []
    ssd = _ssd(tmp_path, reclaimed)
    try:
        meta, data = _page(1, 1 * MiB)
        first = ssd.write(meta, data)
        for i in range(2, 200):  # far more than the 64 MiB tier holds
            ssd.write(*_page(i, 1 * MiB))
        assert reclaimed and any(start <= first < end for start, end in reclaimed)
        assert ssd.used_bytes <= ssd.capacity_bytes
        assert ssd.statistics().evictions == len(reclaimed)  # the tier counts what left the store
    finally:
        ssd.close()
