"""The SSD tier after a SIGKILL, after bit flips, and with arena files it did not expect."""

import errno
import logging
import mmap
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xxhash
from store_helpers import KiB, MiB, crash_after, page_name, read_all, reopen

from hicachefs.store import PageCorrupt, PageStore, StoreConfig, StoreError
from hicachefs.store.ssd.device import ArenaRefused, FileDevice
from hicachefs_testing.faults import Fault, FaultyDevice
from hicachefs.store.ssd import doomed
from hicachefs.store.ssd.region_log import DEAD, record_length
from hicachefs.store.ssd.ssd_tier import ARENA_NAME
from hicachefs_testing.workload import content

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def _storm(disk_dir: Path, first: int, seed: int, lines: int) -> list[list[str]]:
    """Run the writer until it has printed ``lines`` lines, SIGKILL it, return all its lines
    (also those it printed between our count and the kill)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    log = disk_dir / f"writer-{first}.log"
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, str(HERE / "crash_writer.py"), str(disk_dir), str(first), str(seed)], stdout=out, env=env
        )
    try:
        deadline = time.monotonic() + 60
        while log.read_bytes().count(b"\n") < lines and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, "the writer died on its own"
    with open(log, encoding="ascii") as f:
        return [line.split() for line in f if line.endswith("\n")]


def test_sigkill_during_a_write_storm_loses_nothing_that_returned(tmp_path):
    config = StoreConfig(memory_bytes=2 * MiB, disk_dir=tmp_path, disk_bytes=256 * MiB, write_through=True, max_page_size=256 * KiB)
    rng = random.Random(3)
    settled: dict[str, tuple | None] = {}  # name -> (version, size) of its last returned put; None: deleted
    cut_short = 0
    for round_number in range(5):
        events = _storm(tmp_path, 1000 * round_number, round_number, rng.randrange(10, 300))
        ever: dict[str, set] = {}
        in_flight: dict[str, tuple | None] = {}
        for phase, op, name, *rest in events:
            version = (int(rest[0]), int(rest[1])) if op == "put" else None
            if phase == "begin":
                in_flight[name] = version
                if version:
                    ever.setdefault(name, set()).add(version)
            else:
                in_flight.pop(name)
                settled[name] = version
        cut_short += bool(in_flight)
        store = PageStore(config)
        try:
            for name, version in settled.items():
                allowed = {version}
                if name in in_flight:  # killed while replacing or deleting it: old or new
                    allowed.add(in_flight[name])
                info = store.info(name)
                if info is None:
                    assert None in allowed, f"{name}: a page whose put returned is gone"
                    continue
                data = read_all(store, name)
                assert any(v and data == content(*v) for v in allowed), f"{name}: wrong bytes"
            for name in set(in_flight) - set(settled):  # first put of a page cut short
                if store.info(name) is not None:
                    assert read_all(store, name) == content(*in_flight[name])
            for name, version in in_flight.items():
                if store.info(name) is not None:
                    settled[name] = next(v for v in ever.get(name, set()) | {settled.get(name)} if v and read_all(store, name) == content(*v))
                else:
                    settled[name] = None
        finally:
            store.close()
    assert cut_short >= 2, "the kills should land inside operations"


def _write_and_close(tmp_path: Path, pages: dict[str, bytes], crash: bool = False) -> StoreConfig:
    """Write the pages through to disk, then close the store (it leaves an index snapshot) or
    let its process die (the next start scans)."""
    config = StoreConfig(memory_bytes=4 * MiB, disk_dir=tmp_path, disk_bytes=32 * MiB, max_page_size=256 * KiB,
                         write_through=True)

    def write(store: PageStore) -> None:
        for name, data in pages.items():
            store.put(name, data)

    if crash:
        crash_after(config, write)
    else:
        store = PageStore(config)
        write(store)
        store.close()
    return config


def _flip(path: Path, needle: bytes, at: int) -> None:
    """Flip one byte ``at`` bytes after where ``needle`` starts in the file."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        where = m.find(needle)
        assert where >= 0
        m[where + at] ^= 0xFF


@pytest.mark.parametrize("crash", [True, False], ids=["scan after a crash", "snapshot after a clean close"])
def test_a_flipped_payload_byte_is_never_served(tmp_path, crash):
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages, crash)
    _flip(tmp_path / ARENA_NAME, pages[page_name(7)][:64], 1000)
    store, recovery = reopen(config)
    try:
        assert recovery.method == ("scan" if crash else "snapshot")
        if not crash:  # the snapshot lists it; its first read checks it
            assert store.info(page_name(7)) is not None
            with pytest.raises(PageCorrupt):
                store.open(page_name(7))
        assert store.info(page_name(7)) is None
        assert store.statistics().tier("disk").checksum_failures == 1
        for i in set(range(20)) - {7}:
            assert read_all(store, page_name(i)) == pages[page_name(i)]
    finally:
        store.close()


def test_a_flipped_byte_under_a_running_store_is_never_served(tmp_path):
    config = StoreConfig(memory_bytes=1 * MiB, disk_dir=tmp_path, disk_bytes=32 * MiB, max_page_size=64 * KiB)
    store = PageStore(config)
    try:
        pages = {page_name(i): content(i, 64 * KiB) for i in range(40)}
        for name, data in pages.items():
            store.put(name, data)
        victim = page_name(2)
        assert store.info(victim).tier == "disk"
        _flip(tmp_path / ARENA_NAME, pages[victim][:64], 5000)  # same page cache as the store's
        with pytest.raises(PageCorrupt):
            store.open(victim)
        assert store.info(victim) is None  # dropped
        assert store.statistics().tier("disk").checksum_failures == 1
        assert read_all(store, page_name(3)) == pages[page_name(3)]
    finally:
        store.close()
    store = PageStore(config)  # the dropped record stays dropped
    try:
        assert store.info(victim) is None and store.statistics().tier("disk").checksum_failures == 0
    finally:
        store.close()


@pytest.mark.parametrize("crash", [True, False], ids=["scan after a crash", "snapshot after a clean close"])
def test_a_flipped_header_byte_loses_pages_but_serves_no_wrong_bytes(tmp_path, crash):
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages, crash)
    name = page_name(5).encode()
    _flip(tmp_path / ARENA_NAME, name, -20)  # inside the header (its copy of the payload checksum)
    store, recovery = reopen(config)
    try:
        assert recovery.method == ("scan" if crash else "snapshot")
        if not crash:
            with pytest.raises(PageCorrupt):
                store.open(page_name(5))
        assert store.info(page_name(5)) is None
        for page, data in pages.items():
            if store.info(page) is not None:
                assert read_all(store, page) == data
    finally:
        store.close()


@pytest.mark.parametrize("at", [-32, 2], ids=["its sequence number", "its name"])
def test_a_damaged_record_header_loses_its_page_alone_after_a_crash(tmp_path, caplog, at):
    """The scan walked a region up to a damaged header and stopped there: the pages after it in
    its region were lost too, uncounted and unlogged. It goes on at the next record that checks."""
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages, crash=True)
    with open(tmp_path / ARENA_NAME, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        where = m.find(page_name(5).encode()) + at  # 4 bytes of its header's or its name's
        m[where : where + 4] = bytes(b ^ 0xFF for b in m[where : where + 4])
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert store.info(page_name(5)) is None
        for i in set(range(20)) - {5}:
            assert read_all(store, page_name(i)) == pages[page_name(i)]
        assert store.statistics().tier("disk").checksum_failures == 1
        damage = [r.getMessage() for r in caplog.records if "past a damaged record header" in r.getMessage()]
        assert len(damage) == 1 and damage[0].startswith("region 0 of ")
    finally:
        store.close()


def _removed_after_write_through(tmp_path: Path, pages: dict[str, bytes], removed: str) -> StoreConfig:
    """Write the pages through to disk, remove one, and let the process die."""
    config = StoreConfig(memory_bytes=4 * MiB, disk_dir=tmp_path, disk_bytes=32 * MiB, max_page_size=256 * KiB,
                         write_through=True)

    def work(store: PageStore) -> None:
        for name, data in pages.items():
            store.put(name, data)
        assert store.remove(removed)

    crash_after(config, work)
    return config


@pytest.mark.parametrize("mask", [b"\0\0\x16\0", b"\x01\0\0\0", b"\x03\x03\x03\x03", b"\0\xff\0\0",
                                  b"\x80\0\x16\x41"],
                         ids=["the 3 bits from HCd1 to HCr1", "1 bit", "2 bits a byte", "a byte", "6 bits"])
def test_a_removed_page_whose_dead_mark_has_bits_flipped_is_not_back_after_a_crash(tmp_path, mask):
    """A removal marks the record dead in place, its magic outside the header's checksum. The
    dead magic was 3 bits from the live one: those 3 bits flipped (a bad sector, a torn write),
    the scan after a crash brought the removed page back (found by review)."""
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _removed_after_write_through(tmp_path, pages, page_name(5))
    with open(tmp_path / ARENA_NAME, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        where = m.find(page_name(5).encode()) - 56  # its header's magic
        m[where : where + 4] = bytes(a ^ b for a, b in zip(m[where : where + 4], mask))
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert store.info(page_name(5)) is None
        for i in set(range(20)) - {5}:
            assert read_all(store, page_name(i)) == pages[page_name(i)]
    finally:
        store.close()


@pytest.mark.parametrize("removed", [0, 5], ids=["a region's first record", "a later record"])
def test_a_record_marked_dead_before_the_dead_magic_changed_stays_dead(tmp_path, caplog, removed):
    """An arena written by a hicachefs of before marks a removed record dead with ``HCd1``: the
    scan after a crash takes it for dead still, not for damage."""
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages, crash=True)
    with open(tmp_path / ARENA_NAME, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        where = m.find(page_name(removed).encode()) - 56
        m[where : where + 4] = b"HCd1"  # its removal, as hicachefs wrote it before
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert store.info(page_name(removed)) is None
        for i in set(range(20)) - {removed}:
            assert read_all(store, page_name(i)) == pages[page_name(i)]
        assert store.statistics().tier("disk").checksum_failures == 0
        assert "damaged" not in caplog.text
    finally:
        store.close()


def _ring(tmp_path: Path) -> StoreConfig:
    """A disk tier of 8 regions of 1 MiB, each holding ten pages of ``_RING_PAGE`` bytes."""
    return StoreConfig(memory_bytes=64 * MiB, disk_dir=tmp_path, disk_bytes=8 * MiB + 4096,
                       max_page_size=512 * KiB, write_through=True)


_RING_PAGE, _REGION = 100 * KiB, 1 * MiB


def _put(numbers, version: int = 0):
    def work(store: PageStore) -> None:
        for i in numbers:
            store.put(page_name(i), content(i + version, _RING_PAGE))
    return work


def test_a_region_whose_first_header_is_damaged_loses_its_pages_counted_and_logged(tmp_path, caplog):
    """A region whose first record header is damaged is dropped: its records cannot be told
    from those of its previous use; the page is counted and the region logged, the other
    regions' pages come back."""
    config = _ring(tmp_path)
    crash_after(config, _put(range(25)))  # region 2 holds pages 20 to 24, the newest
    _flip_bit(tmp_path / ARENA_NAME, 4096 + 2 * _REGION + 16, 0xFF)  # page 20's sequence number
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert [i for i in range(20, 25) if store.info(page_name(i)) is not None] == []
        for i in range(20):
            assert read_all(store, page_name(i)) == content(i, _RING_PAGE)
        assert store.statistics().tier("disk").checksum_failures == 1
        assert "region 2 of " in caplog.text and "its first record header is damaged" in caplog.text
    finally:
        store.close()


def test_a_torn_first_record_of_the_region_being_written_is_no_damage(tmp_path, caplog):
    """The crash cut short the first record of the region after the newest (a long name's
    second sector not written): the last record written, as a torn one at a region's end is,
    and not logged or counted as damage (found by review)."""
    config = _ring(tmp_path)
    crash_after(config, _put(range(25)))  # region 2 holds pages 20 to 24, the newest
    newest = 4096 + 2 * _REGION + 4 * record_length(len(page_name(24).encode()), _RING_PAGE)
    with open(tmp_path / ARENA_NAME, "r+b") as f:
        f.seek(newest)
        header = bytearray(f.read(80))  # page 24's header and the start of its name
        struct.pack_into("<Q", header, 16, struct.unpack_from("<Q", header, 16)[0] + 1)  # the next number
        f.seek(4096 + 3 * _REGION)
        f.write(header)  # in region 3, the rest of its name not written
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        for i in range(25):
            assert read_all(store, page_name(i)) == content(i, _RING_PAGE)
        assert store.statistics().tier("disk").checksum_failures == 0
        assert "damaged" not in caplog.text
    finally:
        store.close()


@pytest.mark.parametrize("where, mask", [(64 + 2, 0xFF), (16 + 1, 0x04)], ids=["its name", "bit 10 of its number"])
def test_damage_to_the_oldest_regions_first_header_is_counted_and_logged(tmp_path, caplog, where, mask):
    """The ring wrapped: the region after the newest is the oldest. Its first header damaged,
    its pages are lost, and that is damage, counted and logged, not a record a crash cut short
    (found by review: taken for one, nothing said; a flipped number above the newest, too)."""
    config = _ring(tmp_path)
    crash_after(config, _put(range(85)))  # region 0 again holds pages 80 to 84; region 1, 10 to 19
    _flip_bit(tmp_path / ARENA_NAME, 4096 + _REGION + where, mask)  # page 10's header
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert [i for i in range(10, 20) if store.info(page_name(i)) is not None] == []
        assert store.statistics().tier("disk").checksum_failures == 1
        assert "region 1 of " in caplog.text and "its first record header is damaged" in caplog.text
    finally:
        store.close()


def _zero_first_block(path: Path, region: int, size: int = 4096) -> None:
    """A region's first ``size`` bytes read back as zeros (a bad sector remapped, a lost write)."""
    with open(path, "r+b") as f:
        f.seek(4096 + region * _REGION)
        f.write(bytes(size))


@pytest.mark.parametrize("count, region, lost, kept", [
    (35, 2, range(20, 30), [*range(20), *range(30, 35)]), (25, 2, range(20, 25), range(20)), (5, 0, range(5), []),
    (25, 1, range(10, 20), [*range(10), *range(20, 25)]), (155, 7, range(150, 155), range(140, 150)),
    (85, 1, range(10, 20), [*range(20, 30), *range(80, 85)])], ids=[
    "a full region", "the region being written", "region 0 being written", "the ring's first round",
    "the last region being written on the second round", "the oldest region"])
def test_a_region_whose_first_block_reads_as_zeros_loses_its_pages_counted_and_logged(
        tmp_path, caplog, count, region, lost, kept):
    """A region whose first 4 KiB read back as zeros (a bad sector) was taken for one never
    written: its pages vanished after a crash, nothing counted or logged (found by review).
    It is dropped as a region whose first header is damaged is: its pages lost, counted and
    logged, the other regions' pages back. (The region being written at the crash was missed by
    the first rule, which looked only at regions before one holding records: found by review.)"""
    config = _ring(tmp_path)
    crash_after(config, _put(range(count)))  # ten pages a region, the ring of 8 come round past 80
    _zero_first_block(tmp_path / ARENA_NAME, region)
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert [i for i in lost if store.info(page_name(i)) is not None] == []
        for i in kept:
            assert read_all(store, page_name(i)) == content(i, _RING_PAGE)
        assert store.statistics().tier("disk").checksum_failures == 1
        assert f"region {region} of " in caplog.text and "its first record header is damaged" in caplog.text
    finally:
        store.close()


def test_a_region_whose_first_block_reads_as_zeros_brings_back_no_page_of_its_previous_use(tmp_path, caplog):
    """The newest region, reused by the ring for one record, its first 4 KiB zeros: the records
    of its previous use, lying past the zeros, which its reclaim let go of, stay gone: counted
    and logged, not walked."""
    config = _ring(tmp_path)
    crash_after(config, _put(range(81)))  # region 0 holds page 80, then 1 to 9 of its previous use
    _zero_first_block(tmp_path / ARENA_NAME, 0)  # page 80's header and name
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert [i for i in [*range(10), 80] if store.info(page_name(i)) is not None] == []
        for i in range(10, 80):
            assert read_all(store, page_name(i)) == content(i, _RING_PAGE)
        assert store.statistics().tier("disk").checksum_failures == 1
        assert "region 0 of " in caplog.text and "its first record header is damaged" in caplog.text
    finally:
        store.close()


class _ErasesFail(FileDevice):
    """A disk whose blocks at ``bad`` cannot be written, once each, from when it is armed: the
    ring passes over their regions."""

    def __init__(self, path: Path, bad: list[int], armed: bool = True) -> None:
        super().__init__(path)
        self._armed = set(bad)
        self.bad = set(bad) if armed else set()

    def arm(self) -> None:
        self.bad = set(self._armed)

    def pwrite(self, data, offset: int) -> int:
        if offset in self.bad:
            self.bad.discard(offset)
            raise OSError(errno.EIO, "a bad block")
        return super().pwrite(data, offset)


@pytest.mark.parametrize("zeros", [False, True], ids=["its name flipped", "its first 4 KiB zeros"])
def test_a_region_after_one_passed_over_brings_back_no_page_of_its_previous_use(tmp_path, zeros):
    """The ring passed over region 1 (its erase failed: a bad block) and reclaimed region 2 for
    one new record, whose header then rotted. The scan placed region 2 by the next record that
    checked, one of its previous use, numbered above region 1's old first record: a page removed
    after the reclaim came back, with the rest of that use (found by review). So it would, walked
    past zeros from above region 1's first record."""
    config = _ring(tmp_path)
    devices = []  # (the child's)

    def device() -> _ErasesFail:
        devices.append(_ErasesFail(tmp_path / ARENA_NAME, [4096 + _REGION], armed=False))
        return devices[0]

    def work(store: PageStore) -> None:
        log = store._tiers[1].log
        laps, i = 0, 0
        while not (laps and log.tail + _RING_PAGE + 4096 > log.region_start(1)):  # a lap, then region 0 again
            before = log.current
            store.put(page_name(i), content(i, _RING_PAGE))
            laps += before == 7 and log.current == 0
            i += 1
        devices[0].arm()
        store.put(page_name(i), content(i, _RING_PAGE))  # region 1 passed over: region 2 reclaimed for it
        assert (log.current, log.passed_over) == (2, 1)
        assert store.remove(page_name(22))  # in RAM alone since the reclaim

    crash_after(config, work, device)
    if zeros:
        _zero_first_block(tmp_path / ARENA_NAME, 2)
    else:
        _flip_bit(tmp_path / ARENA_NAME, 4096 + 2 * _REGION + 64, 0xFF)  # the new record's name
    store, _ = reopen(config)
    try:
        assert store.info(page_name(22)) is None
        assert [i for i in range(20, 30) if store.info(page_name(i)) is not None] == []
    finally:
        store.close()


def test_a_torn_last_record_ends_the_scan_quietly_and_brings_back_no_reclaimed_page(tmp_path, caplog):
    """The newest record torn (its header never written), in a region the ring reused: the
    records of its previous use lying further on are numbered lower, and are not taken; no
    damage is logged or counted."""
    config = _ring(tmp_path)
    crash_after(config, _put(range(84)))  # the ring came round: region 0 holds pages 80 to 83, then 4 to 9
    crash_after(config, _put([84]))
    with open(tmp_path / ARENA_NAME, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        where = m.find(page_name(84).encode()) - 56
        assert 4096 < where < 4096 + _REGION
        m[where : where + 512] = bytes(512)
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert store.info(page_name(84)) is None
        assert [i for i in range(10) if store.info(page_name(i)) is not None] == []
        assert read_all(store, page_name(83)) == content(83, _RING_PAGE)
        assert store.statistics().tier("disk").checksum_failures == 0
        assert "damaged" not in caplog.text
    finally:
        store.close()


@pytest.mark.parametrize("at", [-32, 2], ids=["its sequence number", "its name"])
def test_a_damaged_record_header_read_from_a_snapshot_is_counted(tmp_path, at):
    """A clean start listed the page from its snapshot; its first read found its header or name
    damaged and failed (EIO), as it should, but checksum_failures stayed 0."""
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages)
    with open(tmp_path / ARENA_NAME, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        where = m.find(page_name(5).encode()) + at
        m[where : where + 4] = bytes(b ^ 0xFF for b in m[where : where + 4])
    store, recovery = reopen(config)
    try:
        assert recovery.method == "snapshot"
        with pytest.raises(PageCorrupt):
            store.open(page_name(5))
        assert store.info(page_name(5)) is None
        assert store.statistics().tier("disk").checksum_failures == 1
        assert read_all(store, page_name(6)) == pages[page_name(6)]
    finally:
        store.close()


def test_a_damaged_header_never_brings_back_an_older_version_after_the_next_crash(tmp_path):
    """The first header of the newest region is damaged: the scan walks that region from its
    next record. The page republished in the next session, and crashed again, must read as
    republished, not as the version lying in that region."""
    config = StoreConfig(memory_bytes=64 * MiB, disk_dir=tmp_path, disk_bytes=8 * MiB + 4096,
                         max_page_size=512 * KiB, write_through=True)
    size = 100 * KiB

    def first(store: PageStore) -> None:
        for i in range(25):
            store.put(page_name(i), content(i, size))

    crash_after(config, first)
    region_bytes = 1 * MiB  # (8 MiB of disk in 8 regions)
    with open(tmp_path / ARENA_NAME, "r+b") as arena:  # the magic of region 2's first record
        arena.seek(4096 + 2 * region_bytes)
        byte = arena.read(1)
        arena.seek(4096 + 2 * region_bytes)
        arena.write(bytes([byte[0] ^ 0xFF]))

    def second(store: PageStore) -> None:
        store.put(page_name(22), content(1022, size))
        assert read_all(store, page_name(22)) == content(1022, size)

    crash_after(config, second)
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert read_all(store, page_name(22)) == content(1022, size)
        for i in range(25):
            if store.info(page_name(i)) is not None and i != 22:
                assert read_all(store, page_name(i)) == content(i, size)
    finally:
        store.close()


def test_a_damaged_header_never_lets_a_later_scan_walk_records_of_an_earlier_session(tmp_path):
    """Each scan after a crash starts numbering records well above the newest it walked, so the
    numbers have gaps. Region 2 was filled over two sessions (a gap between them), then its first
    header went bad, and region 1's too (so that nothing tells region 2's records from those of
    its previous use): the next scan skips region 2, and numbered new records from above region
    1's newest only, below the second session's records still lying in region 2. Those were
    walked as live after the ring reused region 2 and the next crash: a replaced page came back
    as its old version, a version with a higher number than its replacement."""
    config = StoreConfig(memory_bytes=64 * MiB, disk_dir=tmp_path, disk_bytes=8 * MiB + 4096,
                         max_page_size=512 * KiB, write_through=True)
    size = 100 * KiB  # ten records a region (8 regions of 1 MiB)
    region_bytes = 1 * MiB
    victim = page_name(28)

    def puts(numbers):
        def work(store: PageStore) -> None:
            for i in numbers:
                store.put(page_name(i), content(i, size))
        return work

    crash_after(config, puts(range(0, 15)))  # region 0 full, region 1 half
    crash_after(config, puts(range(15, 23)))  # region 1 full, region 2: three records
    crash_after(config, puts(range(23, 30)))  # region 2 full (the victim 6th of these 7)
    for region in (1, 2):  # bit rot in the magic of regions 1 and 2's first records
        _flip_bit(tmp_path / ARENA_NAME, 4096 + region * region_bytes, 0xFF)

    def fourth(store: PageStore) -> None:
        assert store.info(victim) is None  # its region was skipped
        store.put(page_name(100), content(100, size))  # region 2 reused from its start
        store.put(victim, content(1028, size))  # the victim's new version
        store.put(page_name(101), content(101, size))
        assert read_all(store, victim) == content(1028, size)

    crash_after(config, fourth)
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert read_all(store, victim) == content(1028, size), "a replaced page came back as its old version"
        for i in range(30):
            if store.info(page_name(i)) is not None and page_name(i) != victim:
                assert i < 20, f"page {i} came back from a region the ring reused"
    finally:
        store.close()


def test_arena_of_another_size_is_reinitialised(tmp_path):
    config = _write_and_close(tmp_path, {"d/a": b"abc"})
    bigger = StoreConfig(memory_bytes=4 * MiB, disk_dir=tmp_path, disk_bytes=48 * MiB, max_page_size=256 * KiB)
    store = PageStore(bigger)
    try:
        assert store.info("d/a") is None and store.statistics().tier("disk").capacity_bytes > 32 * MiB
        store.put("d/b", b"b")
    finally:
        store.close()
    assert os.path.getsize(tmp_path / ARENA_NAME) == 48 * MiB
    assert config.disk_bytes == 32 * MiB


def test_an_arena_whose_regions_cannot_hold_the_new_largest_page_is_formatted_anew(tmp_path, caplog):
    """An arena keeps the regions of its first start: started again with a larger
    max_page_size, pages it allows were never written down (one that RAM could not take was
    refused, StoreFull), the disk left empty (found by review). Its regions cannot hold them:
    it is formatted anew, saying so, as for another disk size."""
    _write_and_close(tmp_path, {"d/a": b"abc"})  # pages of 256 KiB at most: regions of 4 MiB
    larger = StoreConfig(memory_bytes=4 * MiB, disk_dir=tmp_path, disk_bytes=32 * MiB, max_page_size=8 * MiB)
    store = PageStore(larger)
    try:
        assert store.info("d/a") is None
        assert "formatted anew: its regions of 4,190,208 bytes were made for smaller pages" in caplog.text
        store.put("d/b", content(2, 8 * MiB))  # larger than a RAM slab: to the disk tier only
        assert store.info("d/b").tier == "disk" and read_all(store, "d/b") == content(2, 8 * MiB)
    finally:
        store.close()


SUPERBLOCK_COPIES = {"first": 0, "second": 4096 - 512}  # the file's first sector, and its block's last
REGION_BYTES_AT, FILE_ID_AT = 24, 32  # in each copy: magic, version, reserved, file bytes; region bytes, file id


def _flip_bit(path: Path, at: int, mask: int = 0x10) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))


def _as_version_1(arena: Path, second_copy: bytes | None = b"") -> None:
    """Make the arena's superblock what version 1 wrote: one copy, no checksum; the block's last
    sector then holds ``second_copy`` (None: left as it is)."""
    with open(arena, "r+b") as f:
        fields = f.read(40)
        f.seek(0)
        f.write(fields[:8] + (1).to_bytes(4, "little") + fields[12:] + bytes(8))
        if second_copy is not None:
            f.seek(SUPERBLOCK_COPIES["second"])
            f.write(second_copy.ljust(512, b"\0"))


def _formatted_anew(config: StoreConfig, caplog) -> None:
    """The store opens on an arena whose superblock no copy holds: its page ``d/a`` is dropped,
    the log says why, and the arena formatted anew works."""
    store = PageStore(config)
    try:
        assert store.info("d/a") is None
        assert "formatted anew: its superblock is damaged (no copy of it holds)" in caplog.text
        store.put("d/b", b"b" * 100)
        assert read_all(store, "d/b") == b"b" * 100
    finally:
        store.close()


@pytest.mark.parametrize("crash", [True, False], ids=["scan after a crash", "snapshot after a clean close"])
@pytest.mark.parametrize("field", [FILE_ID_AT, REGION_BYTES_AT], ids=["file id", "region size"])
@pytest.mark.parametrize("copy", SUPERBLOCK_COPIES)
def test_a_bit_flipped_in_one_copy_of_the_superblock_loses_no_page(tmp_path, caplog, crash, field, copy):
    """A bit flipped in the superblock's file id made every record foreign, one in its region
    size cut the file into regions no writer made: the next start lost every page (none served
    wrong; found by review). The superblock is kept twice with a checksum: the copy that holds
    serves, and is written over the damaged one, so a later damage to the other copy loses
    nothing either."""
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages, crash)
    arena = tmp_path / ARENA_NAME
    _flip_bit(arena, SUPERBLOCK_COPIES[copy] + field + 2)
    _all_back(config, pages, "scan" if crash else "snapshot")
    other = next(name for name in SUPERBLOCK_COPIES if name != copy)
    _flip_bit(arena, SUPERBLOCK_COPIES[other] + field + 2)  # the first copy damaged was written again
    _all_back(config, pages, "snapshot")
    assert "formatted anew" not in caplog.text
    assert [f"a copy of its superblock is damaged (at byte {SUPERBLOCK_COPIES[name]})" in caplog.text
            for name in (copy, other)] == [True, True]


def _all_back(config: StoreConfig, pages: dict[str, bytes], method: str) -> None:
    """A start (by ``method``) serves every page as written."""
    store, recovery = reopen(config)
    try:
        assert recovery.method == method
        for name, data in pages.items():
            assert read_all(store, name) == data
    finally:
        store.close()


@pytest.mark.parametrize("field, value", [(REGION_BYTES_AT, 0), (REGION_BYTES_AT, 1 << 40), (FILE_ID_AT, 1)],
                         ids=["region size zero", "region size past the file", "file id"])
def test_a_superblock_damaged_in_both_copies_reinitialises_the_arena(tmp_path, caplog, field, value):
    """Both copies of the superblock went bad: an arena of ours is cache, so it is formatted
    anew, saying why, and the store starts and works (a damaged region size once killed the
    start with a ZeroDivisionError or a MemoryError)."""
    config = _write_and_close(tmp_path, {"d/a": b"abc"})
    with open(tmp_path / ARENA_NAME, "r+b") as arena:
        for at in SUPERBLOCK_COPIES.values():
            arena.seek(at + field)
            arena.write(value.to_bytes(8, "little"))
    _formatted_anew(config, caplog)
    store = PageStore(config)
    try:
        assert read_all(store, "d/b") == b"b" * 100
    finally:
        store.close()


@pytest.mark.parametrize("other_at", ["file id", "magic"])
@pytest.mark.parametrize("mask", [0x10, 0x11], ids=["one bit", "two bits"])
@pytest.mark.parametrize("copy", SUPERBLOCK_COPIES)
def test_a_superblock_damaged_in_both_copies_one_in_its_magic_is_formatted_anew(tmp_path, caplog, copy, mask,
                                                                                other_at):
    """Both copies damaged, one of them in its magic: the start refused the arena as foreign
    (found by review) and the daemon would not start until someone removed the file. A magic
    within 2 bits of ours is ours: the arena is formatted anew, saying why, and works."""
    config = _write_and_close(tmp_path, {"d/a": b"abc"})
    arena = tmp_path / ARENA_NAME
    _flip_bit(arena, SUPERBLOCK_COPIES[copy] + 1, mask)
    other = next(name for name in SUPERBLOCK_COPIES if name != copy)
    _flip_bit(arena, SUPERBLOCK_COPIES[other] + (FILE_ID_AT if other_at == "file id" else 0) + 2)
    _formatted_anew(config, caplog)


@pytest.mark.parametrize("last_sector", ["zeros", "torn upgrade", "one bit", "upgrade cut short"])
@pytest.mark.parametrize("crash", [True, False], ids=["scan after a crash", "snapshot after a clean close"])
def test_an_arena_of_version_1_keeps_its_pages_and_gets_a_second_superblock(tmp_path, caplog, crash, last_sector):
    """Version 1 wrote one copy of the superblock, without a checksum (the rest of its sector
    and the block's last sector zeros): such an arena opens with its pages, and is given the
    checksum and the second copy, so a bit flipped in its file id later loses nothing. The
    upgrade's first write (the second copy) torn by a power loss, or a bit flipped in that
    sector version 1 never used, lost every page (found by review): they are kept too. An
    upgrade cut short after its first write (the second copy whole) is no damage, and the log
    says it is finished, not that a copy is damaged."""
    caplog.set_level(logging.INFO, logger="hicachefs")
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages, crash)
    arena = tmp_path / ARENA_NAME
    with open(arena, "rb") as f:
        torn = f.read(24)  # what a torn upgrade leaves of its first write: version 3's first fields
    _as_version_1(arena, {"zeros": b"", "torn upgrade": torn, "one bit": b"\x10", "upgrade cut short": None}[last_sector])
    _all_back(config, pages, "scan" if crash else "snapshot")
    assert "superblock is damaged" not in caplog.text
    assert ("the upgrade of its superblock to version 3, cut short, is finished" in caplog.text) == (
        last_sector == "upgrade cut short")
    _flip_bit(arena, FILE_ID_AT + 2)
    _all_back(config, pages, "snapshot")



def _superblock_versions(arena: Path) -> list[int]:
    with open(arena, "rb") as f:
        head = f.read(4096)
    return [int.from_bytes(head[at + 8 : at + 12], "little") for at in SUPERBLOCK_COPIES.values()]


@pytest.mark.parametrize("crash", [True, False], ids=["scan after a crash", "snapshot after a clean close"])
def test_an_arena_of_version_2_keeps_its_pages_and_is_marked_for_this_code(tmp_path, caplog, crash):
    """Version 2 is the format of the code before the list of dead records and the fsync mark;
    that code, started on an arena this code used, read it as its own and served a page the list
    would have killed (found by review of a downgrade). This code writes version 3, which an older
    one formats anew; an arena of version 2 opens with its pages and is marked version 3."""
    caplog.set_level(logging.INFO, logger="hicachefs")
    pages = {page_name(i): content(i, 64 * KiB) for i in range(20)}
    config = _write_and_close(tmp_path, pages, crash)
    arena = tmp_path / ARENA_NAME
    assert _superblock_versions(arena) == [3, 3]
    _as_version_2(arena)
    _all_back(config, pages, "scan" if crash else "snapshot")
    assert _superblock_versions(arena) == [3, 3]
    assert "superblock is damaged" not in caplog.text and "formatted anew" not in caplog.text


def _as_version_2(arena: Path) -> None:
    """Make both copies of the superblock what the code before the list wrote: version 2."""
    with open(arena, "r+b") as f:
        for at in SUPERBLOCK_COPIES.values():
            f.seek(at)
            fields = bytearray(f.read(48))
            fields[8:12] = (2).to_bytes(4, "little")
            fields[40:48] = xxhash.xxh3_64_intdigest(bytes(fields[:40])).to_bytes(8, "little")
            f.seek(at)
            f.write(fields)


@pytest.mark.parametrize("older", [_as_version_1, _as_version_2], ids=["version 1", "version 2"])
def test_an_older_arena_that_cannot_be_marked_for_this_code_is_refused(tmp_path, older):
    """Where the superblock cannot be written as version 3 (a bad sector under it), the arena
    was used at its older version, and an older hicachefs started on it later served what this
    code's list of dead records kills (found by review, twice): the start is refused, the file
    unchanged."""
    config = _write_and_close(tmp_path, {"d/a": b"abc"})
    arena = tmp_path / ARENA_NAME
    older(arena)
    before = arena.read_bytes()[:4096]
    device = FaultyDevice(FileDevice(arena))
    device.inject(Fault("pwrite", errno=errno.EIO))
    with pytest.raises(ArenaRefused, match="cannot be written as version 3"):
        PageStore(config, disk_device=device)  # (which closes the device it refused)
    assert arena.read_bytes()[:4096] == before


def test_a_version_1_arena_with_a_bit_flipped_in_its_magic_is_formatted_anew(tmp_path, caplog):
    """Version 1 had one copy of the superblock: a bit flipped in its magic made the arena
    foreign, refused, and the daemon did not start until someone removed the file (found by
    review). It is formatted anew, saying so, as an arena of ours whose superblock no copy holds."""
    config = _write_and_close(tmp_path, {"d/a": b"abc"})
    arena = tmp_path / ARENA_NAME
    _as_version_1(arena)
    _flip_bit(arena, 3)
    _formatted_anew(config, caplog)


def test_foreign_file_is_refused_and_left_alone(tmp_path):
    (tmp_path / ARENA_NAME).write_bytes(b"precious data" * 1000)
    with pytest.raises(StoreError, match="not a hicachefs disk arena"):
        PageStore(StoreConfig(memory_bytes=4 * MiB, disk_dir=tmp_path, disk_bytes=32 * MiB, max_page_size=256 * KiB))
    assert (tmp_path / ARENA_NAME).read_bytes() == b"precious data" * 1000


def test_a_clean_close_keeps_a_promoted_page_whose_disk_copy_the_write_down_reclaims(tmp_path):
    """A page read back into RAM (promoted) keeps its copy in the oldest region; the write-down
    at a clean close wraps the ring onto that region, and the page, now in RAM only, was never
    written: gone after the restart, though the disk tier had room for all of RAM."""
    page = 256 * KiB
    config = StoreConfig(memory_bytes=4 * MiB, disk_dir=tmp_path / "disk", disk_bytes=8 * MiB + 4096,
                         max_page_size=page)
    store = PageStore(config)
    log = store._tiers[1].log
    hot = page_name(0)
    store.put(hot, content(0, page))
    i = 1
    while store.info(hot).tier != "disk":  # pushed down by newer pages
        store.put(page_name(i), content(i, page))
        i += 1
    assert log.current == 0
    read_all(store, hot)
    read_all(store, hot)  # the second read promotes it: in RAM, its copy still in region 0
    assert store.info(hot).tier == "memory"
    while log.current != log.regions - 1:  # the disk fills up to its last region; hot stays in RAM
        store.put(page_name(i), content(i, page))
        read_all(store, hot)
        i += 1
    ram = store.statistics().tier("memory")
    assert store._tiers[1].holds([(len(hot.encode()), page)] * ram.pages)  # room for all of RAM
    assert store.info(hot).tier == "memory"
    store.close()
    store = PageStore(config)
    try:
        assert store.info(hot) is not None, "a RAM page was lost at a clean close with room to spare"
        assert read_all(store, hot) == content(0, page)
    finally:
        store.close()


def test_a_clean_close_keeps_the_newest_write_through_pages_over_older_ram_only_ones(tmp_path):
    """With --write-through, pages published last are on the disk tier at once. RAM holds older
    pages as well whose disk copies the ring has since overwritten (RAM only). The write-down at
    a clean close writes those, newest first, as room allows: it must not wrap the ring onto
    the newer pages that were already there, and lose them for older ones (a restart after a
    clean stop then lacked pages that a SIGKILL would have kept)."""
    page = 64 * KiB
    config = StoreConfig(memory_bytes=16 * MiB, disk_dir=tmp_path / "disk", disk_bytes=8 * MiB + 4096,
                         max_page_size=page, write_through=True)
    store = PageStore(config)
    older = [page_name(i) for i in range(200)]
    newest = [page_name(i) for i in range(200, 224)]
    for i, name in enumerate(older + newest):
        store.put(name, content(i, page))
    ram_only = sum(store.info(name) is not None and store.info(name).tier == "memory" for name in older)
    assert not store._tiers[1].holds([(len(older[0].encode()), page)] * ram_only), "RAM holds too few RAM-only pages"
    store.close()
    store = PageStore(config)
    try:
        missing = [name for name in newest if store.info(name) is None]
        assert not missing, f"{len(missing)} of the {len(newest)} newest pages lost at a clean close"
        for i, name in enumerate(newest, 200):
            assert read_all(store, name) == content(i, page)
    finally:
        store.close()


def test_a_clean_close_keeps_the_newest_ram_pages_where_each_region_leaves_its_end_empty(tmp_path):
    """Pages of 600 KiB in 1 MiB regions: a region holds one, the rest of it left empty. The
    write-down at a clean close counted each page as its size and 4 KiB, so it wrote more than
    the ring holds and wrapped over the first pages it wrote (found by review: 11 written, 8
    back); a promoted page whose disk copy the wrap reclaimed was written again last, and came
    back while newer pages were lost. The tier counts the room as it packs the pages: those
    back after the restart are the newest in RAM, none older than one lost."""
    page = 600 * KiB
    config = StoreConfig(memory_bytes=16 * MiB, disk_dir=tmp_path / "disk", disk_bytes=8 * MiB + 4096,
                         max_page_size=page)
    store = PageStore(config)
    names = [page_name(i) for i in range(20)]
    for i, name in enumerate(names):
        store.put(name, content(i, page))
    promoted = [name for name in names if store.info(name).tier == "disk"][-1]
    read_all(store, promoted)
    read_all(store, promoted)  # the second read promotes it, the newest page in RAM
    assert store.info(promoted).tier == "memory"
    touched = names[-9:]  # nine newer pages, read from the oldest on: newer than the promoted one
    for name in touched:
        read_all(store, name)
    in_ram = [name for name in reversed(names) if store.info(name).tier == "memory"]
    newest_first = touched[::-1] + [promoted] + [name for name in in_ram if name not in touched + [promoted]]
    store.close()
    store = PageStore(config)
    try:
        back = [store.info(name) is not None for name in newest_first]
        kept = back.index(False) if False in back else len(back)
        assert kept and not any(back[kept:]), f"newest RAM pages first, back after the restart: {back}"
        for name in newest_first[:kept]:
            assert read_all(store, name) == content(names.index(name), page)
    finally:
        store.close()


def test_the_superblock_block_is_read_once_at_start(tmp_path, monkeypatch):
    """The start read the head block twice, the second read unguarded: a sector that failed only
    then (flaky, the page cache dropped in between) killed the daemon with a raw OSError after the
    first read had passed (found by review). One read serves both the ownership check and the
    superblock."""
    config = _write_and_close(tmp_path, {"d/a": b"abc"})
    reads = []
    real_pread = FileDevice.pread

    def flaky(device, size, offset):
        if offset == 0 and size == 4096:
            reads.append(offset)
            if len(reads) > 1:
                raise OSError(5, "Input/output error")
        return real_pread(device, size, offset)

    monkeypatch.setattr(FileDevice, "pread", flaky)
    store = PageStore(config)
    try:
        assert read_all(store, "d/a") == b"abc"
    finally:
        store.close()


@pytest.mark.parametrize("region, laps", [(5, 0), (7, 1)],
                         ids=["the ring's first round", "its second round, the last region"])
def test_a_region_read_as_zeros_at_one_start_brings_back_no_page_at_a_later_one(tmp_path, region, laps):
    """The region being written at a crash reads back with its first sector zeros. The start
    after took it for a region never written and went on writing in the region before it: a
    page of it written again there, another removed; then the ring passed over the zeroed region (its erase
    failed) and the daemon crashed again. The next start walked the zeroed region from above the
    first record of the region before it, and the replaced page came back in its older version,
    the removed one with it (found by review). Such a region is dropped, at every start."""
    config = _ring(tmp_path)
    replaced, removed = page_name(1000), page_name(1001)

    def first(store: PageStore) -> None:
        for i in range(80 * laps + region * 10 - 1):  # the regions before full, the one before it but a page
            store.put(page_name(i), content(i, _RING_PAGE))
        store.put(page_name(9999), content(9999, 2 * _RING_PAGE))  # too large for what is left: the next region's first
        store.put(replaced, content(1, _RING_PAGE))
        store.put(removed, content(2, _RING_PAGE))
        assert store._tiers[1].log.current == region

    crash_after(config, first)
    _zero_first_block(tmp_path / ARENA_NAME, region, 512)  # a bad sector
    devices = []  # (the child's)

    def device() -> _ErasesFail:
        devices.append(_ErasesFail(tmp_path / ARENA_NAME, [4096 + region * _REGION], armed=False))
        return devices[0]

    def second(store: PageStore) -> None:
        log = store._tiers[1].log
        assert (store.info(replaced), store.info(removed)) == (None, None)  # lost with the zeroed region
        store.put(replaced, content(3, 10 * KiB))  # lands in the region before the zeroed one
        store.remove(removed)  # (the user removes it: it is not there)
        devices[0].arm()
        i = 2000
        while log.current != (region + 1) % 8:  # the region before fills; the zeroed one is passed over
            store.put(page_name(i), content(i, _RING_PAGE))
            i += 1
        assert log.passed_over == 1

    crash_after(config, second, device)
    store, _ = reopen(config)
    try:
        assert store.info(removed) is None
        assert store.info(replaced) is None or read_all(store, replaced) == content(3, 10 * KiB)
    finally:
        store.close()


@pytest.mark.parametrize("passed_over, zeroed, lost_from", [((3,), (4,), 30), ((2, 4), (3, 5), 20)],
                         ids=["one passed over", "two"])
def test_regions_read_as_zeros_after_ones_passed_over_on_the_first_round_are_counted_and_logged(
        tmp_path, caplog, passed_over, zeroed, lost_from):
    """On the ring's first round a region's erase failed (a bad block): writing passed over it to
    the next, whose first sector then read back as zeros after a crash. Taken for a region never
    written (not before a region holding records, nor the one after the newest, the one passed
    over), its pages were lost with nothing counted or logged (found by review), and so were
    those of a region written after two such (found by review)."""
    config = _ring(tmp_path)

    def work(store: PageStore) -> None:
        for i in range(40):  # ten pages a region, past the ones passed over
            store.put(page_name(i), content(i, _RING_PAGE))
        assert store._tiers[1].log.passed_over == len(passed_over)

    crash_after(config, work, lambda: _ErasesFail(tmp_path / ARENA_NAME, [4096 + r * _REGION for r in passed_over]))
    for region in zeroed:  # their first sectors read as zeros
        _zero_first_block(tmp_path / ARENA_NAME, region, 512)
    store, _ = reopen(config)
    try:
        assert [i for i in range(lost_from, 40) if store.info(page_name(i)) is not None] == []
        for i in range(lost_from):
            assert read_all(store, page_name(i)) == content(i, _RING_PAGE)
        assert store.statistics().tier("disk").checksum_failures == len(zeroed)
        for region in zeroed:
            assert f"region {region} of " in caplog.text
    finally:
        store.close()


class _MarksFail(FileDevice):
    """A disk whose sectors at ``bad`` cannot take a record's dead mark (bad sectors)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.bad: set[int] = set()

    def pwrite(self, data, offset: int) -> int:
        if offset in self.bad and bytes(data) == DEAD:
            raise OSError(errno.EIO, "a bad sector")
        return super().pwrite(data, offset)


_REPLACED = page_name(1000)


def _replace_leaving_the_old_record_live(store: PageStore, device: _MarksFail) -> int:
    """Page 1000 written in region 0, then replaced by a record in region 1; neither record can
    be marked dead: the publish goes through, the old one let go of while live. Its offset."""
    log = store._tiers[1].log
    store.put(page_name(0), content(0, _RING_PAGE))
    old = log.tail
    device.bad.add(old)
    store.put(_REPLACED, content("old", _RING_PAGE))
    i = 1
    while log.current != 1:  # region 0 full, region 1 begun
        store.put(page_name(i), content(i, _RING_PAGE))
        i += 1
    device.bad.add(log.tail)
    store.put(_REPLACED, content("new", _RING_PAGE))
    assert read_all(store, _REPLACED) == content("new", _RING_PAGE)
    return old


@pytest.mark.parametrize("damage", ["zeros", "flipped"], ids=["its first sector zeros", "its first header damaged"])
def test_a_replaced_pages_older_record_left_live_stays_dead_when_the_newer_ones_region_is_dropped(tmp_path, damage):
    """A replace whose old record and new one both fail their dead marks goes through, the old
    record let go of while live: the scan after a crash passed over it only while it found the
    new one. The crash then lost the new one's region (its first sector read as zeros, or its
    first header damaged: dropped), and the page was served in its older version (found by
    review). The old record is listed, durably, before the publish returns, and the scan takes
    it for dead: the page is a miss, never its older bytes."""
    config = _ring(tmp_path)
    crash_after(config, lambda store: _replace_leaving_the_old_record_live(store, store._tiers[1].log.device),
                lambda: _MarksFail(tmp_path / ARENA_NAME))
    if damage == "zeros":
        _zero_first_block(tmp_path / ARENA_NAME, 1, 512)
    else:
        _flip_bit(tmp_path / ARENA_NAME, 4096 + _REGION + 64, 0xFF)  # the name of region 1's first record
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert store.info(_REPLACED) is None or read_all(store, _REPLACED) == content("new", _RING_PAGE)
        assert read_all(store, page_name(0)) == content(0, _RING_PAGE)
    finally:
        store.close()


def test_a_record_left_live_leaves_the_list_when_its_region_is_reclaimed(tmp_path):
    """The list of records let go of while live names the old record until the ring reclaims
    its region; then it is empty again, and the page's new version comes back after a crash."""
    config = _ring(tmp_path)

    def work(store: PageStore) -> None:
        log = store._tiers[1].log
        old = _replace_leaving_the_old_record_live(store, log.device)
        assert list(doomed.read(tmp_path)[1]) == [old]
        i, laps = 2000, 0
        while not (laps and log.current == 0):  # round the ring to region 0 again
            before = log.current
            store.put(page_name(i), content(i, _RING_PAGE))
            laps += before == 7 and log.current == 0
            i += 1
        assert doomed.read(tmp_path) == (log.file_id, {})
        store.put(_REPLACED, content("newest", _RING_PAGE))

    crash_after(config, work, lambda: _MarksFail(tmp_path / ARENA_NAME))
    store, _ = reopen(config)
    try:
        assert read_all(store, _REPLACED) == content("newest", _RING_PAGE)
    finally:
        store.close()


class _PowerLost(_MarksFail):
    """``_MarksFail`` whose writes since its last fsync can be undone, as a power loss would; and
    whose next fsync fails (``fail_next_fsync``), the writes before it never to reach the disk."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._unsynced: list[tuple[int, bytes]] = []
        self._lost: list[tuple[int, bytes]] = []
        self.fail_next_fsync = False

    def pwrite(self, data, offset: int) -> int:
        before = os.pread(self.fd, len(data), offset)
        written = super().pwrite(data, offset)
        self._unsynced.append((offset, before))
        return written

    def pwritev(self, buffers, offset: int) -> int:
        self._unsynced.append((offset, os.pread(self.fd, sum(len(buffer) for buffer in buffers), offset)))
        return super().pwritev(buffers, offset)

    def fsync(self) -> None:
        if self.fail_next_fsync:  # as Linux may: what it did not write stays unwritten, however later fsyncs go
            self.fail_next_fsync = False
            self._lost += self._unsynced
            self._unsynced = []
            raise OSError(errno.EIO, "a writeback error")
        super().fsync()
        self._unsynced.clear()

    def lose_power(self) -> None:
        for offset, before in reversed(self._lost + self._unsynced):
            os.pwrite(self.fd, before, offset)


@pytest.mark.parametrize("how", ["marked", "reclaimed"], ids=["its mark written at last", "its region reclaimed"])
def test_a_record_leaves_the_list_only_once_what_kills_it_is_durable(tmp_path, how):
    """A record left live left the list as soon as its dead mark, or its region's erase, was
    written, before the arena was fsynced: a power loss then undid the mark or the erase and kept
    the list, and with the newer record's region lost too, the page's older version was served
    (found by review). The arena is fsynced before the list lets go of a record."""
    config = _ring(tmp_path)

    def work(store: PageStore) -> None:
        log = store._tiers[1].log
        old = _replace_leaving_the_old_record_live(store, log.device)
        store.sync()  # the new record durable: what follows may be lost with the power
        if how == "marked":
            log.device.bad.discard(old)  # its sector takes a mark now: the next reclaim writes it
        stop_at = 2 if how == "marked" else 0
        i = 2000
        while log.current != stop_at:
            store.put(page_name(i), content(i, _RING_PAGE))
            i += 1
        assert doomed.read(tmp_path)[1] == {}
        log.device.lose_power()

    crash_after(config, work, lambda: _PowerLost(tmp_path / ARENA_NAME))
    _zero_first_block(tmp_path / ARENA_NAME, 1, 512)  # and the new record's region is lost
    store, _ = reopen(config)
    try:
        assert store.info(_REPLACED) is None or read_all(store, _REPLACED) == content("new", _RING_PAGE)
    finally:
        store.close()


@pytest.mark.parametrize("fsync_fails", ["none", "its own", "an earlier"],
                         ids=["fsynced", "its fsync failed", "an earlier fsync failed"])
def test_a_record_is_listed_only_once_it_is_durable_where_the_list_names_it(tmp_path, fsync_fails):
    """The list named an offset (and a bound on its record's number) before the arena was
    fsynced: a power loss brought back there the record written before it, page P's newest copy,
    numbered below the bound, so the scan took it for dead and served P's older copy, whose
    dead mark the power loss had undone as well (found by review). The arena is fsynced before
    a record is listed; and after a failed fsync none is (found by review, twice: a record whose
    own fsync failed was listed at the list's next change, and one written before another
    page's listing fsync failed was listed after a later one that succeeded): the writes a
    failed fsync did not make may never reach the disk."""
    config = _ring(tmp_path)
    other, third = page_name(2000), page_name(3000)

    def work(store: PageStore) -> None:
        log = store._tiers[1].log
        device = log.device
        length = record_length(len(_REPLACED), _RING_PAGE)
        store.put(_REPLACED, content("v0", _RING_PAGE))
        v0, v1 = log.tail - length, log.tail
        device.bad |= {v0, v1}
        store.put(_REPLACED, content("v1", _RING_PAGE))  # v0 let go of while live, listed
        device.bad.discard(v1)
        i = 0
        while log.current != 1:  # region 0 full, region 1 begun
            store.put(page_name(i), content(i, _RING_PAGE))
            i += 1
        device.bad.discard(v0)
        store.put(_REPLACED, content("v2", _RING_PAGE))  # v0 marked (and fsynced), then v1 (not)
        at = log.tail - length
        while not (log.current == 0 and log.tail + length > log.region_start(1)):
            store.put(page_name(i), content(i, _RING_PAGE))  # round the ring to region 1 again
            i += 1
        store.put(page_name(i), content(i, _RING_PAGE))
        store.put(other, content("q1", _RING_PAGE))  # over v2's place
        assert log.tail - length == at
        if fsync_fails == "an earlier":  # another page's record let go of while live, its listing fsync failing
            store.put(third, content("r0", _RING_PAGE))
            device.bad |= {log.tail - length, log.tail}
            device.fail_next_fsync = True
            store.put(third, content("r1", _RING_PAGE))
        device.bad |= {at, log.tail}
        device.fail_next_fsync = fsync_fails == "its own"
        store.put(other, content("q2", _RING_PAGE))  # q1 let go of while live: listed if the arena is durable
        store.put(third, content("r2", _RING_PAGE))
        device.bad |= {log.tail - length, log.tail}
        store.put(third, content("r3", _RING_PAGE))  # r2 let go of while live: the list written again
        assert (at in doomed.read(tmp_path)[1]) is (fsync_fails == "none")
        device.lose_power()

    crash_after(config, work, lambda: _PowerLost(tmp_path / ARENA_NAME))
    store, _ = reopen(config)
    try:
        assert store.info(_REPLACED) is None or read_all(store, _REPLACED) == content("v2", _RING_PAGE)
    finally:
        store.close()


def test_an_arena_whose_fsync_failed_is_formatted_anew_at_the_next_start(tmp_path, caplog):
    """Linux may never write what a failed fsync did not, however later fsyncs go: a page
    replaced just before, its dead mark and new record among those writes, came back in its
    older version at a start after a clean close and a crash (found by review). A failed fsync
    marks the arena, and the next start formats it anew (its pages dropped, with a warning), once."""
    config = _ring(tmp_path)
    store = PageStore(config, disk_device=_PowerLost(tmp_path / ARENA_NAME))
    store.put(_REPLACED, content("v1", _RING_PAGE))
    store.sync()
    store.put(_REPLACED, content("v2", _RING_PAGE))
    store._tiers[1].log.device.fail_next_fsync = True
    with pytest.raises(OSError):
        store.sync()
    store.close()  # a clean close: its own fsyncs succeed
    store, recovery = reopen(config)
    try:
        assert store.info(_REPLACED) is None
        assert "an fsync of it failed" in caplog.text
        store.put(_REPLACED, content("v3", _RING_PAGE))
    finally:
        store.close()
    store, recovery = reopen(config)
    try:
        assert recovery.method == "snapshot" and read_all(store, _REPLACED) == content("v3", _RING_PAGE)
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_list_of_records_left_live_drops_the_arenas_pages_and_the_start_goes_on(tmp_path, caplog, damage):
    """Which records the list named is not known once it is damaged, and any of them would serve
    a replaced page's older version: the arena is formatted anew, with a warning, its pages
    dropped (a cache's safe loss), and the daemon starts."""
    config = _ring(tmp_path)
    crash_after(config, lambda store: _replace_leaving_the_old_record_live(store, store._tiers[1].log.device),
                lambda: _MarksFail(tmp_path / ARENA_NAME))
    _zero_first_block(tmp_path / ARENA_NAME, 1, 512)
    listed = tmp_path / doomed.DOOMED_NAME
    if damage == "truncated":
        listed.write_bytes(listed.read_bytes()[:-4])
    else:
        _flip_bit(listed, 40)  # its entry
    store, recovery = reopen(config)
    try:
        assert store.info(_REPLACED) is None and store.info(page_name(0)) is None
        assert "formatted anew" in caplog.text and doomed.DOOMED_NAME in caplog.text
        store.put(_REPLACED, content("newest", _RING_PAGE))
    finally:
        store.close()
    store, recovery = reopen(config)  # the list written anew: the next start keeps the pages
    try:
        assert recovery.method == "snapshot"
        assert read_all(store, _REPLACED) == content("newest", _RING_PAGE)
    finally:
        store.close()


def test_a_list_of_records_left_live_names_none_of_an_arena_formatted_anew(tmp_path):
    """The list names records of one arena (its file id): once that arena is formatted anew
    (another --disk-size), its entries name nothing, and records written since at their
    offsets are pages like any other."""
    config = _ring(tmp_path)
    crash_after(config, lambda store: _replace_leaving_the_old_record_live(store, store._tiers[1].log.device),
                lambda: _MarksFail(tmp_path / ARENA_NAME))
    assert len(doomed.read(tmp_path)[1]) == 1
    (tmp_path / ARENA_NAME).unlink()  # (the same geometry, another file id)
    crash_after(config, lambda store: [store.put(page_name(i), content(i, _RING_PAGE)) for i in range(10)])
    store, _ = reopen(config)
    try:
        for i in range(10):
            assert read_all(store, page_name(i)) == content(i, _RING_PAGE)
    finally:
        store.close()


def test_a_record_left_live_stays_dead_across_a_start_from_the_snapshot(tmp_path):
    """The list outlives the starts: a crash, a start that scans (the old record's sector still
    bad), a clean stop (its snapshot names the page's newer copy only), a start from that
    snapshot and a crash, then the newer copy's region lost: the next scan still takes the older
    record for dead."""
    config = _ring(tmp_path)
    crash_after(config, lambda store: _replace_leaving_the_old_record_live(store, store._tiers[1].log.device),
                lambda: _MarksFail(tmp_path / ARENA_NAME))

    def bad_sector() -> _MarksFail:
        device = _MarksFail(tmp_path / ARENA_NAME)
        device.bad.add(4096 + record_length(len(_REPLACED.encode()), _RING_PAGE))  # the old record's
        return device

    store = PageStore(config, disk_device=bad_sector())
    assert read_all(store, _REPLACED) == content("new", _RING_PAGE)
    store.close()

    def from_the_snapshot(store: PageStore) -> None:
        assert store._tiers[1].log.clean_token() is not None  # started from the snapshot
        store.put(page_name(500), content(500, _RING_PAGE))  # (a session that only reads leaves the snapshot valid)

    crash_after(config, from_the_snapshot, bad_sector)
    _zero_first_block(tmp_path / ARENA_NAME, 1, 512)
    store, recovery = reopen(config)
    try:
        assert recovery.method == "scan"
        assert store.info(_REPLACED) is None
    finally:
        store.close()


def test_a_list_of_records_left_live_that_cannot_be_written_is_counted_and_logged(tmp_path, caplog, monkeypatch):
    """A third failure: the list cannot be written either (a read-only directory). The publish
    still goes through, the new version served; the tier counts an io error and logs that a
    crash losing the new copy would bring the old one back."""
    def refused(*_) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(doomed, "replace_durably", refused)
    store = PageStore(_ring(tmp_path), disk_device=_MarksFail(tmp_path / ARENA_NAME))
    try:
        errors = store.statistics().tier("disk").io_errors
        _replace_leaving_the_old_record_live(store, store._tiers[1].log.device)
        assert store.statistics().tier("disk").io_errors == errors + 4  # three marks, then the list
        assert "could not be listed either" in caplog.text
    finally:
        store.close()


class _FirstSectorUnwritable:
    """An arena device whose first sector (the superblock's first copy) takes no write."""

    def __init__(self, device: FileDevice) -> None:
        self._device = device

    def __getattr__(self, name):
        return getattr(self._device, name)

    def pwrite(self, data, offset: int) -> int:
        if offset < 512:
            raise OSError(errno.EIO, "Input/output error")
        return self._device.pwrite(data, offset)


def test_a_version_1_arena_whose_first_copy_cannot_be_marked_is_refused_at_every_start(tmp_path):
    """Its second copy took version 3 before the first copy's write failed: the next start found
    that copy, took the first for an upgrade cut short, warned that it could not be written, and
    used the arena, whose first copy said version 1 to an older hicachefs (found by review)."""
    config = _write_and_close(tmp_path, {"d/a": b"abc"})
    arena = tmp_path / ARENA_NAME
    _as_version_1(arena)
    for start in range(2):
        with pytest.raises(ArenaRefused, match="cannot be written as version 3"):
            PageStore(config, disk_device=_FirstSectorUnwritable(FileDevice(arena)))
