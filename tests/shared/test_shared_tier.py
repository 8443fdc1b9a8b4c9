"""The shared tier alone, two hosts on one local directory: write-behind, read-through, damaged
files, capacity and stale temporary files."""

import errno
import itertools
import os
import shutil
import threading
import time
import weakref
from pathlib import Path

import pytest
from held_calls import HOLD_TIMEOUT_S, HeldCall
from pages import wait_until
from shared_helpers import POOL, KiB, Releases, SlowJournal, make_page, page_name, read_page, wait_for_sweeps

from hicachefs_testing.faults import Fault, FaultyDevice
from hicachefs.store.pages import page_checksum
from hicachefs.store.shared import format as page_format
from hicachefs.store.shared.device import DirectoryDevice
from hicachefs.store.shared.journal import Journal
from hicachefs.store.shared.layout import JOURNAL_DIR, Layout, fanout_name, key_hash, place
from hicachefs.store.tier import ReadResult


def page_path(root, name):
    return Layout(root).page_path(place(name))


def publish(tier, pages, releases=None):
    releases = releases or Releases()
    for page, data in pages:
        assert tier.offer(page, memoryview(data), releases(page.name))
    return releases


def test_pages_offered_on_one_host_are_found_and_read_on_another(tmp_path, make_tier):
    a, b = make_tier(tmp_path / "shared"), make_tier(tmp_path / "shared")
    pages = [make_page(i, size) for i, size in enumerate([0, 1, 4 * KiB, 64 * KiB + 3, 1 << 20])]
    releases = publish(a, pages)
    names = [page.name for page, _ in pages]
    wait_until(lambda: all(b.contains_many(names)))
    for page, data in pages:
        assert b.find(page.name) == page
        assert read_page(b, page.name) == data
    assert releases.calls == {name: 1 for name in names}
    assert b.contains_many([page_name(100), names[0]]) == [False, True]
    assert b.statistics().hits == len(pages) and b.statistics().bytes_out == sum(p.size for p, _ in pages)
    with open(page_path(tmp_path / "shared", names[4]), "rb") as file:  # one file: header, then the page
        assert file.read()[page_format.header_length(names[4]) :] == pages[4][1]


def test_pages_already_there_are_found_by_the_sweep_without_any_journal(tmp_path, make_tier):
    root = tmp_path / "shared"
    a = make_tier(root)
    pages = [make_page(i) for i in range(50)]
    for page, data in pages:
        a.write(page, data)
    a.close()
    shutil.rmtree(root / JOURNAL_DIR)
    b = make_tier(root)
    names = [page.name for page, _ in pages]
    wait_until(lambda: all(b.contains_many(names)))
    assert b.statistics().pages == 50 and b.statistics().journal_received == 0


def test_a_page_removed_on_one_host_goes_from_the_others(tmp_path, make_tier):
    a, b = make_tier(tmp_path / "shared"), make_tier(tmp_path / "shared")
    page, data = make_page(1)
    a.write(page, data)
    wait_until(lambda: b.contains_many([page.name]) == [True])
    found = b.find(page.name)
    a.drop(page, 0)
    a.drop(page, 0)  # idempotent
    wait_until(lambda: b.contains_many([page.name]) == [False])
    assert b.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.MISMATCH
    assert b.find(page.name) is None and read_page(b, page.name) is None
    stats = b.statistics()
    assert stats.checksum_failures == 0 and stats.io_errors == 0


def test_a_page_removed_between_find_and_read_is_a_plain_miss(tmp_path, make_tier):
    a, b = make_tier(tmp_path / "shared"), make_tier(tmp_path / "shared")
    page, data = make_page(1)
    a.write(page, data)
    found = b.find(page.name)
    b.close()  # forget the file it opened: the read must open it again
    b = make_tier(tmp_path / "shared")
    os.unlink(page_path(tmp_path / "shared", page.name))
    assert b.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.MISMATCH
    stats = b.statistics()
    assert stats.checksum_failures == 0 and stats.io_errors == 0 and stats.misses == 1


def test_a_page_replaced_by_another_version_is_a_mismatch_not_corruption(tmp_path, make_tier):
    tier = make_tier(tmp_path / "shared")
    page, data = make_page(1)
    tier.write(page, data)
    found = tier.find(page.name)
    newer = page._replace(checksum=page_checksum(data[::-1]), mtime_ns=page.mtime_ns + 1)
    tier.write(newer, data[::-1])
    assert tier.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.OK  # the file it opened
    assert tier.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.MISMATCH
    assert read_page(tier, page.name) == data[::-1]
    assert tier.statistics().checksum_failures == 0


def _damage_payload(path):
    with open(path, "r+b") as file:
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
        file.seek(-1, os.SEEK_END)
        file.write(bytes([last[0] ^ 0x40]))


def _truncate(path):
    os.truncate(path, os.path.getsize(path) - 100)


def _damage_header(path):
    with open(path, "r+b") as file:
        file.seek(10)
        file.write(b"\xff\xff")


@pytest.mark.parametrize("damage", [_damage_payload, _truncate, _damage_header])
def test_damaged_files_are_caught_counted_and_removed(tmp_path, make_tier, damage):
    a, b = make_tier(tmp_path / "shared"), make_tier(tmp_path / "shared")
    page, data = make_page(1)
    a.write(page, data)
    path = page_path(tmp_path / "shared", page.name)
    damage(path)
    wait_until(lambda: b.contains_many([page.name]) == [True])
    found = b.find(page.name)
    if damage is _damage_header:
        assert found is None
    else:
        assert b.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.CORRUPT
    assert b.statistics().checksum_failures == 1
    assert not os.path.exists(path) and b.contains_many([page.name]) == [False]
    wait_until(lambda: a.contains_many([page.name]) == [False])  # announced to the other host


def test_another_versions_file_is_neither_served_nor_removed(tmp_path, make_tier):
    tier = make_tier(tmp_path / "shared")
    page, data = make_page(1)
    tier.write(page, data)
    path = page_path(tmp_path / "shared", page.name)
    with open(path, "r+b") as file:
        file.seek(4)
        file.write((page_format.VERSION + 1).to_bytes(2, "little"))
    assert tier.find(page.name) is None
    assert os.path.exists(path) and tier.statistics().checksum_failures == 0


def test_another_versions_file_is_not_counted_once_found_until_it_is_rewritten(tmp_path, make_tier):
    """A rolling upgrade: a page file another format version wrote answers no exists query
    once a read found it so (each would start a fetch that misses), sweeps or not; a write of
    the page in this version counts it again."""
    tier = make_tier(tmp_path / "shared")
    page, data = make_page(1)
    tier.write(page, data)
    with open(page_path(tmp_path / "shared", page.name), "r+b") as file:
        file.seek(4)
        file.write((page_format.VERSION + 1).to_bytes(2, "little"))
    assert tier.contains_many([page.name]) == [True]  # not known yet
    assert tier.find(page.name) is None
    wait_for_sweeps([tier])
    assert tier.contains_many([page.name]) == [False] and tier.statistics().pages == 0
    tier.write(page, data)
    assert tier.contains_many([page.name]) == [True] and read_page(tier, page.name) == data


def test_the_write_behind_queue_is_bounded_in_pages_and_bytes_and_counts_drops(tmp_path, make_tier):
    device = DirectoryDevice()
    write = HeldCall(device, "pwritev")  # the one writer is stuck in its first write; the queue fills
    tier = make_tier(tmp_path / "shared", device=device, writers=1, queue_pages=4, queue_bytes=10 * 64 * KiB)
    releases = Releases()
    pages = [make_page(i) for i in range(12)]
    accepted = [tier.offer(page, memoryview(data), releases(page.name)) for page, data in pages]
    stats = tier.statistics()
    assert stats.write_behind.queue_pages <= 4 and stats.write_behind.queue_bytes <= 4 * 64 * KiB
    assert accepted.count(True) in (4, 5) and stats.write_behind.dropped == accepted.count(False)  # 4 queued + 1 writing
    for (page, _), ok in zip(pages, accepted):
        if not ok:
            assert releases.calls[page.name] == 1  # a dropped page is released at once
    big, big_data = make_page(99, 11 * 64 * KiB)
    assert not tier.offer(big, memoryview(big_data), releases(big.name))  # more than the queue's bytes
    write.release()
    wait_until(lambda: tier.statistics().write_behind.written_behind == accepted.count(True))
    assert releases.calls == {page.name: 1 for page, _ in pages} | {big.name: 1}
    assert all(tier.contains_many([page.name for (page, _), ok in zip(pages, accepted) if ok]))
    assert tier.statistics().write_behind.lag_seconds == 0.0


def test_write_behind_admits_only_what_it_can_write_within_its_lag_bound(tmp_path, make_tier):
    device = FaultyDevice(DirectoryDevice())
    device.inject(Fault("pwritev", delay_s=0.2))  # a filesystem slower than publishing
    tier = make_tier(tmp_path / "shared", device=device, writers=1, queue_lag_s=0.5)
    first, first_data = make_page(0)
    tier.offer(first, memoryview(first_data), lambda: None)
    wait_until(lambda: tier.statistics().write_behind.written_behind == 1)  # the pace is known: ~0.2 s a page
    accepted = [tier.offer(page, memoryview(data), lambda: None) for page, data in map(make_page, range(1, 21))]
    assert 2 <= accepted.count(True) <= 4  # about 0.5 s of writes
    assert tier.statistics().write_behind.dropped_queue_full == accepted.count(False)
    wait_until(lambda: tier.statistics().write_behind.written_behind == 1 + accepted.count(True))


def test_write_behind_releases_the_payload_before_it_writes(tmp_path, make_tier):
    device = DirectoryDevice()
    write = HeldCall(device, "pwritev")
    tier = make_tier(tmp_path / "shared", device=device)
    page, data = make_page(1)
    payload = bytearray(data)
    released = threading.Event()
    tier.offer(page, memoryview(payload), released.set)
    assert write.entered.wait(HOLD_TIMEOUT_S) and released.wait(HOLD_TIMEOUT_S)  # while the write is held
    payload[:] = bytes(len(payload))  # the engine reuses its slot
    write.release()
    wait_until(lambda: tier.statistics().write_behind.written_behind == 1)
    assert not write.timed_out
    assert read_page(tier, page.name) == data


def test_one_large_page_leaves_no_large_buffer_in_the_writers(tmp_path, make_tier):
    """Each write-behind worker copies a page into a buffer of its own: one that wrote a 16 MiB
    page kept 16 MiB for the daemon's life, whatever it wrote next (two workers, 32 MiB no RAM
    share counts)."""
    tier = make_tier(tmp_path / "shared", queue_bytes=64 << 20, queue_lag_s=100.0)
    publish(tier, [make_page(0, 16 << 20)])
    wait_until(lambda: tier.statistics().write_behind.written_behind == 1)
    publish(tier, [make_page(i, 16 * KiB) for i in range(1, 41)])
    wait_until(lambda: tier.statistics().write_behind.written_behind == 41)
    wait_until(lambda: tier.statistics().write_behind.buffer_bytes <= 2 * 2 * 16 * KiB)


class _ViewsWritten(DirectoryDevice):
    """Notes (weakly) each payload view a page write is given."""

    def __init__(self) -> None:
        self.views = []

    def pwritev(self, buffers, fd, offset):
        self.views.extend(weakref.ref(buffer) for buffer in buffers if isinstance(buffer, memoryview))
        return super().pwritev(buffers, fd, offset)


def test_a_writer_waiting_for_pages_holds_no_view_of_its_large_buffer(tmp_path, make_tier):
    """A write-behind worker lets go of its large buffer while it waits: the view of it that it
    wrote from goes too (the view kept the buffer, so 64 MiB per writer stayed while idle, with
    write_behind.buffer_bytes at 0)."""
    device = _ViewsWritten()
    tier = make_tier(tmp_path / "shared", device=device, queue_bytes=64 << 20, queue_lag_s=100.0)
    publish(tier, [make_page(0, 16 << 20)])
    wait_until(lambda: tier.statistics().write_behind.written_behind == 1)
    wait_until(lambda: tier.statistics().write_behind.buffer_bytes == 0)
    assert device.views
    wait_until(lambda: all(view() is None for view in device.views))


def test_close_writes_what_is_queued(tmp_path, make_tier):
    a = make_tier(tmp_path / "shared")
    pages = [make_page(i) for i in range(20)]
    publish(a, pages)
    a.close()
    b = make_tier(tmp_path / "shared")
    assert all(read_page(b, page.name) == data for page, data in pages)


def _write_aged(tier, root, count, size, first_mtime_s):
    pages = []
    for i in range(count):
        page, data = make_page(i, size)
        tier.write(page, data)
        os.utime(page_path(root, page.name), (first_mtime_s + i, first_mtime_s + i))
        pages.append(page)
    return pages


def _present(root, pages):
    return [os.path.exists(page_path(root, page.name)) for page in pages]


def test_the_size_bound_holds_by_removing_the_oldest_pages(tmp_path, make_tier):
    root = tmp_path / "shared"
    file_size = page_format.header_length(page_name(0)) + 16 * KiB
    writer = make_tier(root)
    pages = _write_aged(writer, root, 60, 16 * KiB, time.time() - 1000)
    bounded = make_tier(root, capacity=20 * file_size)
    wait_until(lambda: sum(_present(root, pages)) <= 20)
    wait_for_sweeps([bounded])  # nothing more may go
    assert _present(root, pages) == [False] * 40 + [True] * 20  # the 40 oldest went
    assert bounded.statistics().used_bytes == 20 * file_size
    assert bounded.statistics().evictions == 40
    wait_until(lambda: writer.contains_many([pages[0].name, pages[-1].name]) == [False, True])


def test_a_host_never_counts_pages_it_evicted_again_from_another_hosts_older_announcements(tmp_path, make_tier):
    """Host A's announcements of its pages reach the journal after host B, bounded, has swept
    and evicted them: B must not count them again and evict real pages for those ghosts."""
    root = tmp_path / "shared"
    file_size = page_format.header_length(page_name(0)) + 16 * KiB
    writer = make_tier(root, tick_s=0.5)  # its journal is flushed half a second after the writes
    pages = _write_aged(writer, root, 30, 16 * KiB, time.time() - 1000)
    bounded = make_tier(root, capacity=10 * file_size)
    wait_until(lambda: sum(_present(root, pages)) <= 10)
    time.sleep(1.0)  # A's announcements are in the journal, and B has read them
    wait_for_sweeps([bounded])
    assert _present(root, pages) == [False] * 20 + [True] * 10
    assert bounded.statistics().evictions == 20


def test_a_third_host_never_counts_pages_written_on_one_host_and_removed_on_another(tmp_path, make_tier):
    """Host A writes pages, host B removes each once it sees it; host C reads both journals,
    B's first, every half second: it must count none of them (a page no file holds would take
    room from real ones until its next sweep)."""
    root = tmp_path / "shared"
    no_sweeps = dict(sweep_interval_s=60.0)  # after the first: what C counts comes from the journals
    x, y = make_tier(root, **no_sweeps), make_tier(root, **no_sweeps)
    a, b = (x, y) if x._journal.writer > y._journal.writer else (y, x)  # b's journal file sorts first
    c = make_tier(root, poll_s=0.5, **no_sweeps)
    wait_until(lambda: c.statistics().sweep.sweep_cycles >= 1)
    names = []
    for i in range(10):
        page, data = make_page(100 + i, size=4 * KiB)
        a.write(page, data)
        names.append(page.name)
        wait_until(lambda: b.contains_many([page.name]) == [True])
        assert b.remove(page.name)
    wait_until(lambda: c.statistics().journal_received >= 20)
    assert c.contains_many(names) == [False] * 10
    assert c.used_bytes == 0


def test_pages_found_gone_leave_the_count_of_bytes_the_size_bound_measures(tmp_path, make_tier):
    """Pages another host removed before this one heard of it: the reads that find them gone
    take their bytes off what the tier counts (the size bound would evict real pages for them),
    once looked at again past the engine's entry cache (still gone: no stale entry answered)."""
    root = tmp_path / "shared"
    tier = make_tier(root, capacity=1 << 30, sweep_interval_s=60.0)
    wait_until(lambda: tier.statistics().sweep.sweep_cycles >= 1)
    pages = [make_page(i, size=64 * KiB) for i in range(20)]
    for page, data in pages:
        tier.write(page, data)
    assert tier.statistics().pages == 20 and tier.used_bytes > 20 * 64 * KiB
    for page, _ in pages:
        os.unlink(Layout(root).page_path(place(page.name)))  # removed behind this host's back
    assert [tier.find(page.name) for page, _ in pages] == [None] * 20
    wait_until(lambda: tier.statistics().pages == 0 and tier.used_bytes == 0, timeout=5)


def test_a_page_written_again_at_another_size_counts_the_bytes_its_file_holds_on_each_host(tmp_path, make_tier):
    """A page replaced by one of another size: the host that wrote it and the host that heard of
    it (an announcement of a name it already counted) count the bytes its file holds now; they
    kept the old size until the next sweep, so the size bound measured the wrong total (found by
    review). A removal then takes off what was counted, leaving nothing."""
    root = tmp_path / "shared"
    no_sweeps = dict(sweep_interval_s=60.0)  # after the first: what is counted comes from the writes and journals
    a, b = make_tier(root, **no_sweeps), make_tier(root, **no_sweeps)
    wait_until(lambda: min(a.statistics().sweep.sweep_cycles, b.statistics().sweep.sweep_cycles) >= 1)
    for written, size in enumerate((4 * KiB, 64 * KiB, 1 * KiB), 1):
        page, data = make_page(1, size=size)
        a.write(page, data)
        wait_until(lambda: b.statistics().journal_received == written)  # (counted as read, applied just after)
        on_volume = os.path.getsize(page_path(root, page.name))
        assert a.used_bytes == on_volume
        wait_until(lambda: b.used_bytes == on_volume, timeout=5)  # long before a sweep (60 s)
    a.drop(page, 0)
    wait_until(lambda: b.contains_many([page.name]) == [False])
    assert (a.used_bytes, b.used_bytes) == (0, 0)


def test_two_hosts_writing_one_name_at_two_sizes_at_once_count_the_bytes_its_file_holds(tmp_path, make_tier):
    """A writes a name at one size, B at another just after, before A's announcement reached B:
    the volume holds B's. A, told of B's, counted B's size; B, told of A's after its own write,
    counted A's size: the bytes it counted were off until the next sweep (found by review). An
    announcement of a name counted at another size is looked at on the volume (once the engine's
    entry cache has expired): both hosts count the bytes its file holds."""
    root = tmp_path / "shared"
    no_sweeps = dict(sweep_interval_s=600.0)  # after the first: what is counted comes from the writes and journals
    a, b = make_tier(root, device=SlowJournal(), **no_sweeps), make_tier(root, **no_sweeps)
    wait_until(lambda: min(a.statistics().sweep.sweep_cycles, b.statistics().sweep.sweep_cycles) >= 1)
    (small, small_data), (large, large_data) = make_page(1, size=4 * KiB), make_page(1, size=64 * KiB)
    a.write(small, small_data)
    b.write(large, large_data)  # lands last
    on_volume = os.path.getsize(page_path(root, large.name))
    wait_until(lambda: a.statistics().journal_received == b.statistics().journal_received == 1)
    wait_until(lambda: a.used_bytes == b.used_bytes == on_volume, timeout=5)  # long before a sweep (600 s)
    assert a.statistics().pages == b.statistics().pages == 1


class _SlowRenameReply(DirectoryDevice):
    """Once armed, the next page file's rename is done on the volume at once and its reply comes
    ``reply_s`` later: the writer counts its write well after its file landed."""

    def __init__(self, reply_s: float) -> None:
        super().__init__()
        self.armed, self.reply_s = False, reply_s

    def rename(self, source, target):
        super().rename(source, target)
        if self.armed and f"/{JOURNAL_DIR}" not in target:
            self.armed = False
            time.sleep(self.reply_s)


@pytest.mark.parametrize("reply_s", [0.3, 1.5], ids=["sooner than the entry cache", "later"])
def test_a_write_counted_after_another_hosts_announcement_counts_the_file_that_landed_last(
        tmp_path, make_tier, reply_s):
    """A's file lands, then B's; A counts its own write only after B's announcement reached it
    (a slow rename reply): A took its own write for the last one and counted its size until the
    next sweep (found by review). An announcement of a name being written here is looked at,
    after that write (a reply later than the engine's entry cache let the look count B's file
    first, and A's own count then stood: found by review)."""
    root = tmp_path / "shared"
    no_sweeps = dict(sweep_interval_s=600.0, deadline_s=1.0)  # the slow write within its deadline (4 x)
    slow = _SlowRenameReply(reply_s)
    a, b = make_tier(root, device=slow, **no_sweeps), make_tier(root, **no_sweeps)
    wait_until(lambda: min(a.statistics().sweep.sweep_cycles, b.statistics().sweep.sweep_cycles) >= 1)
    (small, small_data), (large, large_data) = make_page(1, size=4 * KiB), make_page(1, size=64 * KiB)
    path = page_path(root, small.name)
    slow.armed = True
    writing = threading.Thread(target=a.write, args=(small, small_data))
    writing.start()
    wait_until(lambda: os.path.exists(path), timeout=2)  # A's file landed; its rename's reply has not come
    b.write(large, large_data)  # lands last
    writing.join()
    on_volume = os.path.getsize(path)
    wait_until(lambda: a.statistics().journal_received == b.statistics().journal_received == 1)
    wait_until(lambda: a.used_bytes == b.used_bytes == on_volume, timeout=10)  # long before a sweep (600 s)


def test_three_hosts_writing_one_name_count_the_file_that_landed_last(tmp_path, make_tier):
    """B and D write a name at 64 KiB, A at 4 KiB just after, their announcements reaching A
    late: told of B's (another size than it counted), A waited to look at the file; told of D's
    (the size it counted now, B's), it looked no more, and counted 64 KiB against the 4 KiB file
    (found by review). A name waiting for its look waits on, whatever the next announcement."""
    root = tmp_path / "shared"
    no_sweeps = dict(sweep_interval_s=600.0)
    a = make_tier(root, **no_sweeps)
    b, d = (make_tier(root, device=SlowJournal(), **no_sweeps) for _ in range(2))
    wait_until(lambda: min(tier.statistics().sweep.sweep_cycles for tier in (a, b, d)) >= 1)
    (small, small_data), (large, large_data) = make_page(1, size=4 * KiB), make_page(1, size=64 * KiB)
    path, writers = page_path(root, large.name), []
    for tier in (b, d):  # B's file lands, then D's, each announced 0.1 s later
        landed = os.stat(path).st_ino if os.path.exists(path) else None
        writers.append(threading.Thread(target=tier.write, args=(large, large_data)))
        writers[-1].start()
        wait_until(lambda: os.path.exists(path) and os.stat(path).st_ino != landed, timeout=2)
    a.write(small, small_data)  # lands last, before A heard of either
    for writer in writers:
        writer.join()
    on_volume = os.path.getsize(path)
    assert on_volume < 64 * KiB
    wait_until(lambda: a.statistics().journal_received == 2)
    wait_until(lambda: a.used_bytes == on_volume, timeout=10)  # long before a sweep (600 s)


def test_a_host_whose_clock_is_ahead_leaves_the_other_hosts_journal_files_they_still_append_to(tmp_path, make_tier):
    """Host B's clock an hour behind host A's (its journal file's mtime an hour old by A's
    clock): A removed B's journal file at its start, B went on appending to the removed file,
    and A did not hear of B's new pages until a sweep (a minute) or B's next file."""
    root = tmp_path / "shared"
    no_sweeps = dict(sweep_interval_s=60.0)  # after the first: what A learns comes from the journals
    b = make_tier(root, **no_sweeps)
    first, second = make_page(1), make_page(2)
    b.write(*first)
    wait_until(lambda: b.statistics().journal_announced == 1)
    (journal,) = (root / JOURNAL_DIR).iterdir()
    os.utime(journal, (time.time() - 3600, time.time() - 3600))
    a = make_tier(root, **no_sweeps)
    wait_for_sweeps([a], cycles=1)  # its first tick, and the journals' expiry in it, are done
    b.write(*second)
    wait_until(lambda: a.contains_many([first[0].name, second[0].name]) == [True, True])
    assert journal.exists() and a.statistics().journal_received == 2


def test_a_journal_file_goes_once_it_stayed_unchanged_for_the_keep_time_whatever_its_mtime(tmp_path):
    """A dead writer's journal file goes ``keep_s`` after this host first saw it unchanged,
    though its mtime is an hour ahead (its writer's clock, or this host's after a step back);
    one appended to between two looks stays."""
    layout = Layout(tmp_path / "shared")
    os.makedirs(layout.journal)
    dead, live = (Path(layout.journal) / f"{host}-5eed1e55f00d.00000001" for host in ("dead", "live"))
    for path in (dead, live):
        path.write_bytes(b"+4096 m/a\n")
        os.utime(path, (time.time() + 3600, time.time() + 3600))
    journal = Journal(DirectoryDevice(), layout, "here-0123456789ab", keep_s=0.5)
    assert journal.expire() == 0  # first look
    time.sleep(0.6)
    with open(live, "ab") as file:
        file.write(b"+4096 m/b\n")
    assert journal.expire() == 1 and live.exists() and not dead.exists()
    time.sleep(0.6)
    assert journal.expire() == 1 and not live.exists()


def test_files_a_day_old_by_their_mtime_go_at_the_second_look_unless_they_changed(tmp_path):
    """Daemons that each lived less than the keep time (per-job mounts, a crash loop) never saw a
    dead writer's journal or temporary file stay unchanged that long: the files piled up, every
    journal file opened again at each poll (found by review). One a day behind this host's clock
    by its mtime goes once a second look finds it unchanged; one that grew between the looks is
    live, however far behind its writer's clock (a first cut removed it under its writer)."""
    layout = Layout(tmp_path / "shared")
    os.makedirs(layout.journal)
    stale, recent, live = (Path(layout.journal) / f"{host}-5eed1e55f00d.00000001" for host in ("stale", "recent", "live"))
    day_behind = time.time() - 2 * 86400
    for path, mtime in ((stale, day_behind), (recent, time.time() - 3600), (live, day_behind)):
        path.write_bytes(b"+4096 m/a\n")
        os.utime(path, (mtime, mtime))
    journal = Journal(DirectoryDevice(), layout, "here-0123456789ab", keep_s=600)
    assert journal.expire() == 0  # a first look
    with open(live, "ab") as file:
        file.write(b"+4096 m/b\n")
    os.utime(live, (day_behind + 60, day_behind + 60))  # its writer's clock, a day behind
    assert journal.expire() == 1 and not stale.exists() and recent.exists() and live.exists()


def test_a_writer_whose_journal_file_was_removed_under_it_starts_a_new_one(tmp_path):
    """A host whose clock is a day behind, idle for a minute: another host removed its journal
    file, and its next lines went into the removed file, heard by nobody until it rotated five
    minutes later (found by review). The writer starts a new file."""
    layout = Layout(tmp_path / "shared")
    writer = Journal(DirectoryDevice(), layout, "behind-0123456789ab", keep_s=600)
    reader = Journal(DirectoryDevice(), layout, "other-0123456789ab", keep_s=600)
    writer.announce(True, 4096, "m/f/tp0of1/kv/one")
    writer.flush()
    assert [a.name for a in reader.poll()] == ["m/f/tp0of1/kv/one"]
    for name in os.listdir(layout.journal):  # removed by a host that took it for stale
        os.unlink(os.path.join(layout.journal, name))
    writer.announce(True, 4096, "m/f/tp0of1/kv/two")
    writer.flush()
    assert [a.name for a in reader.poll()] == ["m/f/tp0of1/kv/two"]


def test_two_hosts_evicting_at_once_is_harmless(tmp_path, make_tier):
    root = tmp_path / "shared"
    file_size = page_format.header_length(page_name(0)) + 16 * KiB
    writer = make_tier(root)
    pages = _write_aged(writer, root, 80, 16 * KiB, time.time() - 1000)
    writer.close()
    a, b = make_tier(root, capacity=30 * file_size), make_tier(root, capacity=30 * file_size)
    wait_until(lambda: sum(_present(root, pages)) <= 30)
    wait_for_sweeps([a, b])  # nothing more may go
    assert _present(root, pages) == [False] * 50 + [True] * 30
    stats = [a.statistics(), b.statistics()]
    assert stats[0].evictions + stats[1].evictions == 50  # each page removed once
    assert all(s.io_errors == 0 and s.guard.available for s in stats)


def test_temporary_files_of_dead_writers_are_removed_whatever_their_mtimes(tmp_path, make_tier):
    """A temporary file goes once this host's sweeps found it unchanged for the keep time, its
    mtime an hour behind or an hour ahead (its writer's clock, or this host's after a step back:
    a file an hour ahead stayed an hour)."""
    root = tmp_path / "shared"
    tier = make_tier(root, temp_keep_s=0.5)
    page, data = make_page(1)
    tier.write(page, data)
    behind, ahead = (Layout(root).temp_path(place(page_name(i)), "5eed1e55f00d", 1) for i in (2, 3))
    for path, mtime in ((behind, time.time() - 3600), (ahead, time.time() + 3600)):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
        os.utime(path, (mtime, mtime))
    wait_until(lambda: not os.path.exists(behind) and not os.path.exists(ahead))
    assert tier.find(page.name) == page and tier.statistics().sweep.sweep_temp_removed == 2


def test_a_temporary_file_being_written_stays_whatever_its_writers_clock(tmp_path, make_tier):
    """Another host writing a page, its clock an hour behind this host's (its temporary file's
    mtime an hour old here): this host's sweep removed the file while it was written, the
    writer's rename failed (ENOENT) and the page never reached the tier."""
    root = tmp_path / "shared"
    tier = make_tier(root)
    page, data = make_page(1)
    temp = Layout(root).temp_path(place(page.name), "5eed1e55f00d", 1)
    os.makedirs(os.path.dirname(temp))
    with open(temp, "wb") as file:
        for _ in range(3):  # written in three pieces, a sweep between each two
            file.write(b"z" * KiB)
            file.flush()
            os.utime(file.fileno(), (time.time() - 3600, time.time() - 3600))
            wait_for_sweeps([tier], cycles=1)
    os.rename(temp, page_path(root, page.name))
    assert tier.statistics().sweep.sweep_temp_removed == 0


def test_files_of_the_shared_directory_that_are_not_the_tiers_are_never_removed(tmp_path, make_tier):
    """The shared directory may be a volume's root with other data in it: old dot-files beside
    and below the tier's pages are not its abandoned temporary files, whatever their age."""
    root = tmp_path / "shared"
    page, data = make_page(1)
    fan = os.path.dirname(page_path(root, page.name))
    theirs = [root / "project" / ".env", root / "project" / "sub" / ".bashrc", Path(fan) / ".notes",
              Path(fan) / f".{page.name.rpartition('/')[2]}.backup.1"]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"theirs")
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    tier = make_tier(root)
    tier.write(page, data)
    wait_for_sweeps([tier])
    assert [path.read_bytes() for path in theirs] == [b"theirs"] * len(theirs)


def _file_hashed_to(directory: Path, stem: str) -> tuple[Path, str]:
    """An operator's old file in ``directory`` whose name hashes to it, as a page's would."""
    name = next(f"{stem}{i}.txt" for i in itertools.count() if fanout_name(key_hash(f"{stem}{i}.txt")) == directory.name)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"operator data, not a page\n" * 100)
    os.utime(directory / name, (time.time() - 86400, time.time() - 86400))
    return directory / name, name


def test_other_data_where_pages_would_be_is_neither_served_nor_removed(tmp_path, make_tier):
    """The shared directory may hold other data: a file in a directory named like a fan-out one
    below the namespace's depth is not counted; one in a pool's fan-out directory whose name
    hashes there is no page once a read or the evictor found it lacks the page magic, and
    neither removes it (both used to, as damaged or as the oldest page)."""
    root = tmp_path / "shared"
    backup, backup_name = _file_hashed_to(root / "backup" / "2a", "photo")
    stray, stray_name = _file_hashed_to(root / POOL / "00", "notes")
    tier = make_tier(root)
    wait_for_sweeps([tier])
    assert tier.contains_many([f"backup/{backup_name}"]) == [False]
    assert tier.find(f"{POOL}/{stray_name}") is None
    assert tier.contains_many([f"{POOL}/{stray_name}"]) == [False] and tier.statistics().checksum_failures == 0
    tier.close()
    file_size = page_format.header_length(page_name(0)) + 16 * KiB
    bounded = make_tier(root, capacity=2 * file_size)  # the stray, the oldest file, is what it evicts first
    pages = _write_aged(bounded, root, 4, 16 * KiB, time.time() - 1000)
    wait_until(lambda: sum(_present(root, pages)) <= 2)
    wait_for_sweeps([bounded])
    assert _present(root, pages) == [False, False, True, True]
    assert backup.exists() and stray.exists() and bounded.statistics().pages == 2


def test_a_page_file_cut_below_the_magic_is_removed_as_damaged(tmp_path, make_tier):
    """A page file shorter than the magic's 4 bytes is a damaged page, not another data's file:
    it was taken for one, never served, counted nor removed, and stayed for good."""
    root = tmp_path / "shared"
    tier = make_tier(root)
    file_size = page_format.header_length(page_name(0)) + 16 * KiB
    first = time.time() - 1000
    pages = _write_aged(tier, root, 4, 16 * KiB, first)
    os.truncate(page_path(root, pages[0].name), 2)
    assert tier.find(pages[0].name) is None
    assert not os.path.exists(page_path(root, pages[0].name)) and tier.statistics().checksum_failures == 1
    os.truncate(page_path(root, pages[1].name), 3)
    os.utime(page_path(root, pages[1].name), (first, first))  # the oldest left, which the evictor removes
    bounded = make_tier(root, capacity=2 * file_size)
    wait_until(lambda: not os.path.exists(page_path(root, pages[1].name)))
    wait_for_sweeps([bounded])
    assert _present(root, pages) == [False, False, True, True]


class _RenameOvertaken(DirectoryDevice):
    """While armed, a page file's rename answers ENOENT as GlusterFS answers one that another
    host's removal of the name overtook: the file was moved, then the name removed. ``moved``
    False: it fails so having moved nothing (the temporary file is still there)."""

    def __init__(self, moved: bool = True) -> None:
        super().__init__()
        self.armed, self.moved = False, moved

    def rename(self, source, target):
        if not self.armed or f"/{JOURNAL_DIR}" in target:
            return super().rename(source, target)
        if self.moved:
            super().rename(source, target)
            os.unlink(target)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")


def test_a_write_another_hosts_removal_overtook_is_no_failure_of_the_volume(tmp_path, make_tier, caplog):
    """Found by review: on GlusterFS such renames (119 of 3,643 in a race of writes and removals
    of one name by two hosts) were I/O errors with a warning each, and three in a row marked the
    shared tier unavailable, every page of it a miss. The page is absent, as after the write and
    then the removal; the write says so, and the tier serves on."""
    root = tmp_path / "shared"
    racing = _RenameOvertaken()
    tier = make_tier(root, device=racing)
    racing.armed = True
    for i in range(3):
        page, data = make_page(i)
        with pytest.raises(OSError) as raised:
            tier.write(page, data)
        assert raised.value.errno == errno.ENOENT and not os.path.exists(page_path(root, page.name))
    page, data = make_page(3)  # written behind: as if a later change superseded it
    assert tier.offer(page, memoryview(data), lambda: None)
    wait_until(lambda: tier.statistics().write_behind.superseded == 1)
    racing.armed = False
    facts = tier.statistics()
    assert facts.guard.available and facts.guard.failures == 0 and facts.io_errors == 0
    assert facts.write_behind.write_failures == 0 and "writing page" not in caplog.text
    page, data = make_page(9)
    tier.write(page, data)
    assert read_page(tier, page.name) == data


def test_a_page_rename_that_fails_with_its_file_still_there_is_a_failure_of_the_volume(tmp_path, make_tier, caplog):
    racing = _RenameOvertaken(moved=False)
    tier = make_tier(tmp_path / "shared", device=racing)
    racing.armed = True
    page, data = make_page(1)
    with pytest.raises(OSError):
        tier.write(page, data)
    facts = tier.statistics()
    assert facts.guard.failures == 1 and facts.io_errors == 1 and "writing page" in caplog.text


class _Unreadable(DirectoryDevice):
    """A volume on which one file's data cannot be read (a GlusterFS split-brain, a JuiceFS block
    whose object is lost): its open and unlink work, its reads fail with EIO."""

    def __init__(self, path: Path) -> None:
        self.path, self.fds = str(path), set()

    def open(self, path, flags, mode=0o644):
        fd = super().open(path, flags, mode)
        if path == self.path:
            self.fds.add(fd)
        return fd

    def close(self, fd):
        self.fds.discard(fd)
        super().close(fd)

    def pread(self, fd, size, offset):
        if fd in self.fds:
            raise OSError(errno.EIO, "Input/output error")
        return super().pread(fd, size, offset)


def test_an_oldest_page_that_cannot_be_read_is_evicted_and_eviction_goes_on(tmp_path, make_tier):
    """The evictor checks a candidate's magic before it removes it: one whose read fails is
    removed unchecked, as before that check (it was put back first in line and ended every
    eviction round, so the tier grew past its bound for good)."""
    root = tmp_path / "shared"
    file_size = page_format.header_length(page_name(0)) + 16 * KiB
    pages = _write_aged(make_tier(root), root, 30, 16 * KiB, time.time() - 1000)
    bounded = make_tier(root, capacity=20 * file_size, device=_Unreadable(page_path(root, pages[0].name)))
    wait_until(lambda: sum(_present(root, pages)) <= 20)
    wait_for_sweeps([bounded])
    assert _present(root, pages) == [False] * 10 + [True] * 20
    assert bounded.statistics().evictions == 10


def test_removing_a_page_another_host_removed_already_forgets_it(tmp_path, make_tier):
    a = make_tier(tmp_path / "shared")
    page, data = make_page(1)
    a.write(page, data)
    os.unlink(Layout(tmp_path / "shared").page_path(place(page.name)))  # another host's rm, not heard of yet
    assert a.contains_many([page.name]) == [True]
    assert not a.remove(page.name)
    assert a.contains_many([page.name]) == [False]


def test_a_directory_whose_last_page_was_removed_is_no_longer_said_to_hold_pages(tmp_path, make_tier):
    """rm -r of a model's pages: the tier stops answering that it holds pages under it (else the
    mount shows the removed directory again until the next sweep)."""
    a = make_tier(tmp_path / "shared", sweep_interval_s=600)
    b = make_tier(tmp_path / "shared", sweep_interval_s=600)
    pages = [make_page(i) for i in range(3)]
    for page, data in pages:
        a.write(page, data)
    wait_until(lambda: b.has_directory("m"))
    assert a.has_directory("m") and a.has_directory("m/bf16-page_first-64")
    for page, _ in pages:
        a.drop(a.find(page.name), 0)
    assert not a.has_directory("m") and not a.has_directory("m/bf16-page_first-64")
    wait_until(lambda: not b.has_directory("m"))



def test_a_sweep_while_a_removal_is_under_way_does_not_bring_the_page_back(tmp_path, make_tier):
    """rm of a page while a sweep lists its directory: the listing still sees the file (its
    unlink is under way), but the page is removed here; it must not answer present again once
    the removal is done (it did until the next sweep, a minute later by default: exists said 1
    for a removed page, and `ls` showed its emptied directory)."""
    device = DirectoryDevice()
    tier = make_tier(tmp_path / "shared", device=device, deadline_s=5.0, sweep_interval_s=1.0)
    page, data = make_page(1)
    tier.write(page, data)
    found = tier.find(page.name)
    unlink = HeldCall(device, "unlink")
    dropping = threading.Thread(target=tier.drop, args=(found, 0))
    dropping.start()
    try:
        assert unlink.entered.wait(HOLD_TIMEOUT_S)
        cycles = tier.statistics().sweep.sweep_cycles
        wait_until(lambda: tier.statistics().sweep.sweep_cycles > cycles, timeout=10)  # listed meanwhile
    finally:
        unlink.release()
        dropping.join(HOLD_TIMEOUT_S)
    assert not unlink.timed_out
    assert tier.contains_many([page.name]) == [False] and not tier.has_directory("m")
