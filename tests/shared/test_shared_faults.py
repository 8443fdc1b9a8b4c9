"""The shared tier under a failing filesystem, injected through ``FaultyDevice``: answers stay
fast and are right or a miss, the tier is marked unavailable, and it recovers."""

import errno
import logging
import os
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest
from pages import wait_until
from shared_helpers import FAST
from shared_helpers import KiB, Releases, make_page, read_page

from hicachefs_testing.faults import Fault, FaultyDevice
from hicachefs.store.shared import engine_checks
from hicachefs.store.shared.device import DirectoryDevice
from hicachefs.store.shared.failure_log import FailureLog
from hicachefs.store.shared.layout import JOURNAL_DIR, Layout, place
from hicachefs.store.tier import ReadResult

OPS = [name for name in vars(DirectoryDevice) if not name.startswith("_")]
#: A call that hangs is abandoned at its deadline; "fast" is this, with room for a busy machine.
PROMPT_S = FAST["deadline_s"] + 0.5
HANG_S = 3.0


def faulty_tier(make_tier, root, **options):
    device = FaultyDevice(DirectoryDevice())
    return make_tier(root, device=device, **options), device


def _counting_another_hosts_pages(make_tier, root):
    """A tier that sweeps no more after its first, and counts 200 pages another host wrote: that
    host, the tier, its device, the pages."""
    writer = make_tier(root)
    tier, device = faulty_tier(make_tier, root, sweep_interval_s=600)
    pages = [make_page(i, 4096) for i in range(200)]
    for page, data in pages:
        writer.write(page, data)
    wait_until(lambda: tier.statistics().pages == len(pages))
    return writer, tier, device, pages


def _one_page_kept_one_gone(make_tier, root):
    """A tier that counts two pages after its first sweep (it sweeps no more), and whose second
    page's file was removed unannounced (a journal lost): the tier, its device, the page kept
    (with its bytes) and the page gone."""
    tier, device = faulty_tier(make_tier, root, sweep_interval_s=600)
    (kept, kept_data), (gone, gone_data) = make_page(1), make_page(2)
    tier.write(kept, kept_data)
    tier.write(gone, gone_data)
    wait_until(lambda: tier.statistics().sweep.sweep_cycles >= 1)
    os.unlink(Layout(root).page_path(place(gone.name)))
    return tier, device, (kept, kept_data), gone


def page_files(root):
    return sorted(name for _, _, names in os.walk(root) for name in names if not name.startswith("hicachefs"))


def assert_refuses_without_touching_the_filesystem(tier, device, page, data):
    """While unavailable: every answer is a miss or a refusal, and none calls the filesystem."""
    calls_before = sum(device.injected.values())
    assert tier.contains_many([page.name] * 128) == [False] * 128
    assert tier.find(page.name) is None
    assert tier.read_into(page, 0, memoryview(bytearray(page.size))) is ReadResult.MISMATCH
    released = threading.Event()
    assert not tier.offer(page, memoryview(data), released.set) and released.is_set()
    with pytest.raises(OSError):
        tier.write(page, data)
    assert sum(device.injected.values()) - calls_before <= 2  # at most the background probe


@pytest.mark.parametrize("code", [errno.ENOTCONN, errno.EIO, errno.ESTALE])
def test_a_failing_filesystem_marks_the_tier_unavailable_until_it_answers_again(tmp_path, make_tier, code):
    tier, device = faulty_tier(make_tier, tmp_path / "shared")
    page, data = make_page(1)
    tier.write(page, data)
    assert tier.contains_many([page.name]) == [True]
    for op in OPS:
        device.inject(Fault(op, errno=code))
    wait_until(lambda: not tier.statistics().guard.available, timeout=5)
    assert_refuses_without_touching_the_filesystem(tier, device, page, data)
    stats = tier.statistics()
    assert stats.io_errors > 0 and os.strerror(code) in stats.guard.last_error
    device.clear()
    wait_until(lambda: tier.statistics().guard.available, timeout=5)
    assert read_page(tier, page.name) == data
    later, later_data = make_page(2)
    assert tier.offer(later, memoryview(later_data), lambda: None)
    wait_until(lambda: tier.contains_many([later.name]) == [True])


def test_stale_handles_on_page_files_are_plain_misses(tmp_path, make_tier):
    tier, device = faulty_tier(make_tier, tmp_path / "shared")
    page, data = make_page(1)
    tier.write(page, data)
    found = tier.find(page.name)
    tier.close()  # forget what it opened
    tier, device = faulty_tier(make_tier, tmp_path / "shared")
    device.inject(Fault("open", errno=errno.ESTALE))  # another host replaced or removed it
    for _ in range(5):
        assert tier.find(page.name) is None
        assert tier.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.MISMATCH
    stats = tier.statistics()
    assert stats.guard.available and stats.io_errors == 0 and stats.checksum_failures == 0


def test_a_page_a_read_found_gone_stays_counted_until_looked_at_again_past_the_entry_cache(tmp_path, make_tier):
    """JuiceFS answers ENOENT for a name another host replaced by rename, for up to its 1 s entry
    cache, on a mount that looked it up before (found by review): that miss made the host forget
    the page, and answer absent until its next sweep (a minute) while the volume held the new
    version. A read that finds a page gone misses and keeps it counted; looked at again once the
    entry cache has expired, a page still there stays counted, one really gone is forgotten."""
    tier, device, (kept, kept_data), gone = _one_page_kept_one_gone(make_tier, tmp_path / "shared")
    device.inject(Fault("open", errno=errno.ENOENT, count=1))  # a stale entry for the page kept
    assert tier.find(kept.name) is None and tier.find(gone.name) is None
    assert tier.contains_many([kept.name, gone.name]) == [True, True]
    wait_until(lambda: tier.contains_many([gone.name]) == [False], timeout=5)  # looked at in order: kept first
    assert tier.contains_many([kept.name]) == [True]
    assert read_page(tier, kept.name) == kept_data


def test_a_page_read_again_after_a_miss_is_not_forgotten_by_the_look_again(tmp_path, make_tier):
    """A page replaced twice on another host: a read here missed (a stale entry), the next read
    found the new version, and the look again a second after the miss met an entry cached by
    that read, stale in its turn: the page was forgotten until the next sweep while the volume
    held it (found by review). A read since the miss ends the wait."""
    root = tmp_path / "shared"
    tier, device = faulty_tier(make_tier, root, sweep_interval_s=600)  # no sweep after the first
    page, data = make_page(1)
    tier.write(page, data)
    wait_until(lambda: tier.statistics().sweep.sweep_cycles >= 1)
    device.inject(Fault("open", errno=errno.ENOENT, count=1))  # a stale entry: a miss
    assert tier.find(page.name) is None
    assert read_page(tier, page.name) == data  # read again, by a fresh entry
    file, stat = os.fspath(Layout(root).page_path(place(page.name))), device.stat

    def stale(path, *args, **kwargs):  # that entry stale in its turn (the file replaced again)
        if os.fspath(path) == file:
            raise OSError(errno.ENOENT, "a stale entry")
        return stat(path, *args, **kwargs)

    device.stat = stale
    time.sleep(engine_checks.MAX_CACHE_S + 1.0)  # past the entry cache, and a tick
    assert tier.contains_many([page.name]) == [True]


def test_names_looked_at_again_on_a_slow_volume_hold_up_no_announcement(tmp_path, make_tier):
    """A pool removed on another host, its announcements lost: every read here misses and its
    names wait to be looked at again. A tick looked at 64 of them one stat after another, and
    on a volume slow to answer (50 ms a stat) another host's new page reached this one 6 s late,
    against 0.1 s (found by review). The looks take 20 ms of a tick."""
    root = tmp_path / "shared"
    writer, tier, device, pages = _counting_another_hosts_pages(make_tier, root)
    shutil.rmtree(Path(Layout(root).page_path(place(pages[0][0].name))).parent.parent)  # the pool, unannounced
    assert [tier.find(page.name) for page, _ in pages] == [None] * len(pages)
    device.inject(Fault("stat", delay_s=0.1))  # a volume slow to answer for missing names
    time.sleep(engine_checks.MAX_CACHE_S)  # the names due
    for number in range(1000, 1004):
        new, data = make_page(number, 4096)
        writer.write(new, data)
        wait_until(lambda: tier.contains_many([new.name]) == [True], timeout=3)


def test_a_page_gone_is_forgotten_on_a_volume_whose_stats_take_most_of_a_deadline(tmp_path, make_tier):
    """The look at a name found gone stats the page and then the volume's root, within one
    deadline: with stats of 0.3 s against 0.5 s the look timed out, the tier went unavailable
    (every page a miss), came back, and the same name, first in line, did it again, for good
    (found by review: unavailable 30 % of the time, the gone page never forgotten)."""
    tier, device, (kept, _), gone = _one_page_kept_one_gone(make_tier, tmp_path / "shared")
    assert tier.find(gone.name) is None
    device.inject(Fault("stat", delay_s=0.6 * FAST["deadline_s"]))
    wait_until(lambda: tier.contains_many([gone.name]) == [False], timeout=10)
    stats = tier.statistics()
    assert stats.guard.available and stats.guard.timeouts == 0
    assert tier.contains_many([kept.name]) == [True]


def test_a_page_written_here_while_its_name_is_looked_at_again_stays_counted(tmp_path, make_tier):
    """A page a read found gone, written here while the tick looked at its name again: the look
    had found no file, and forgot the page after the write had counted it, so this host answered
    absent for a page it had just written, until the next sweep (found by review)."""
    root = tmp_path / "shared"
    tier, device = faulty_tier(make_tier, root, sweep_interval_s=600)  # no sweep after the first
    page, data = make_page(1)
    tier.write(page, data)
    wait_until(lambda: tier.statistics().sweep.sweep_cycles >= 1)
    file, stat = Layout(root).page_path(place(page.name)), device.stat
    os.unlink(file)  # removed unannounced (a journal lost)
    assert tier.find(page.name) is None
    looked = threading.Event()

    def gone_then_written(path, *args, **kwargs):  # the look finds no file, and the write comes
        if os.fspath(path) == os.fspath(file) and not looked.is_set():
            looked.set()
            writing = threading.Thread(target=tier.write, args=(page, data))
            writing.start()
            writing.join(5)
            raise OSError(errno.ENOENT, "gone when looked at")
        return stat(path, *args, **kwargs)

    device.stat = gone_then_written
    wait_until(looked.is_set, timeout=5)
    time.sleep(0.5)  # the look done, some ticks after
    assert os.path.exists(file) and tier.contains_many([page.name]) == [True]


def test_removals_owed_on_a_slow_volume_hold_up_no_announcement(tmp_path, make_tier):
    """Pages removed here while the volume was away: their files go once it is back, 64 a tick,
    each a stat and an unlink; on a volume slow to unlink that held up the tick, and another
    host's new page reached this one seconds late. The removals take 20 ms of a tick."""
    root = tmp_path / "shared"
    writer, tier, device, pages = _counting_another_hosts_pages(make_tier, root)
    device.inject(Fault("stat", errno=errno.ENOTCONN))  # the volume away
    wait_until(lambda: not tier.statistics().guard.available)
    assert all(tier.remove_later(page.name) for page, _ in pages)  # removed here meanwhile
    device.clear()
    device.inject(Fault("unlink", delay_s=0.1))  # back, slow to unlink
    wait_until(lambda: tier.statistics().guard.available, timeout=10)
    for number in range(1000, 1004):
        new, data = make_page(number, 4096)
        writer.write(new, data)
        wait_until(lambda: tier.contains_many([new.name]) == [True], timeout=3)


def test_a_full_filesystem_pauses_writes_frees_room_and_keeps_reads(tmp_path, make_tier):
    root = tmp_path / "shared"
    tier, device = faulty_tier(make_tier, root)
    pages = [make_page(i) for i in range(10)]
    for number, (page, data) in enumerate(pages):
        tier.write(page, data)
        os.utime(Layout(root).page_path(place(page.name)), (time.time() - 100 + number,) * 2)
    wait_until(lambda: tier.statistics().sweep.eviction_candidates == 10)
    device.inject(Fault("pwritev", errno=errno.ENOSPC))
    new, new_data = make_page(100)
    with pytest.raises(OSError) as raised:
        tier.write(new, new_data)
    assert raised.value.errno == errno.ENOSPC
    stats = tier.statistics()
    assert stats.guard.available and not stats.writable
    assert not tier.offer(new, memoryview(new_data), lambda: None)  # dropped while full
    wait_until(lambda: tier.statistics().evictions == 4)  # room for four pages like it
    assert [read_page(tier, page.name) == data for page, data in pages] == [False] * 4 + [True] * 6
    assert not [name for name in page_files(root) if name.startswith(".")]  # no temporary file left
    device.clear()
    wait_until(lambda: tier.statistics().writable, timeout=5)
    tier.write(new, new_data)
    assert read_page(tier, new.name) == new_data


def test_a_hung_filesystem_never_holds_a_caller_past_its_deadline(tmp_path, make_tier):
    tier, device = faulty_tier(make_tier, tmp_path / "shared", io_threads=4)
    pages = [make_page(i) for i in range(3)]
    for page, data in pages:
        tier.write(page, data)
    for op in OPS:
        device.inject(Fault(op, delay_s=HANG_S))
    results, took = [], []

    def ask(page):
        start = time.monotonic()
        results.append(tier.find(page.name))
        took.append(time.monotonic() - start)

    threads = [threading.Thread(target=ask, args=(pages[i % 3][0],)) for i in range(24)]
    for thread in threads:
        thread.start()
    start = time.monotonic()
    answers = tier.contains_many([page.name for page, _ in pages] * 40)
    contains_took = time.monotonic() - start
    for thread in threads:
        thread.join()
    assert results == [None] * 24 and max(took) < PROMPT_S
    assert contains_took < PROMPT_S and set(answers) <= {True, False}
    stats = tier.statistics()
    assert not stats.guard.available and stats.guard.timeouts >= 1
    assert stats.guard.io_threads_busy <= 4  # stuck calls never pile up beyond the fixed threads
    assert tier.contains_many([pages[0][0].name]) == [False]
    start = time.monotonic()
    assert not tier.offer(pages[0][0], memoryview(pages[0][1]), lambda: None)
    assert time.monotonic() - start < PROMPT_S
    device.clear()
    wait_until(lambda: tier.statistics().guard.available, timeout=HANG_S + 5)
    assert [read_page(tier, page.name) for page, _ in pages] == [data for _, data in pages]


def test_closing_on_a_hung_filesystem_returns(tmp_path, make_tier):
    tier, device = faulty_tier(make_tier, tmp_path / "shared")
    pages = [make_page(i) for i in range(8)]
    for op in OPS:
        device.inject(Fault(op, delay_s=HANG_S))
    releases = Releases()
    for page, data in pages:
        tier.offer(page, memoryview(data), releases(page.name))
    start = time.monotonic()
    tier.close()
    assert time.monotonic() - start < HANG_S
    assert releases.calls == {page.name: 1 for page, _ in pages}  # every page released once


def test_a_short_write_never_becomes_a_page(tmp_path, make_tier):
    root = tmp_path / "shared"
    a, device = faulty_tier(make_tier, root)
    b = make_tier(root)
    device.inject(Fault("pwritev", short=True))
    page, data = make_page(1)
    with pytest.raises(OSError):
        a.write(page, data)
    assert a.offer(page, memoryview(data), lambda: None)
    wait_until(lambda: a.statistics().write_behind.write_failures == 1)
    assert page_files(root) == [] and b.find(page.name) is None
    assert a.contains_many([page.name]) == [False]


@pytest.mark.parametrize("op", ["pread", "preadv"])
def test_a_read_that_comes_back_flipped_is_caught(tmp_path, make_tier, op):
    root = tmp_path / "shared"
    a = make_tier(root)
    b, device = faulty_tier(make_tier, root)
    page, data = make_page(1, 256 * KiB)
    a.write(page, data)
    device.inject(Fault(op, flip=True, count=1))
    assert read_page(b, page.name) is None
    assert b.statistics().checksum_failures == 1 and device.injected[f"{op}:flip"] == 1
    assert b.find(page.name) is None  # a damaged copy is removed, not served later


def test_read_errors_are_misses_and_counted(tmp_path, make_tier):
    tier, device = faulty_tier(make_tier, tmp_path / "shared")
    page, data = make_page(1)
    tier.write(page, data)
    device.inject(Fault("preadv", errno=errno.EIO, count=1))
    assert read_page(tier, page.name) is None
    stats = tier.statistics()
    assert stats.io_errors == 1 and stats.checksum_failures == 0 and stats.guard.available
    assert read_page(tier, page.name) == data  # the file was not touched


def test_a_read_announced_to_find_comes_with_the_header_and_is_checked(tmp_path, make_tier):
    root = tmp_path / "shared"
    a = make_tier(root)
    b, device = faulty_tier(make_tier, root)
    # The payload read along with the header is as long as the pool's last page read: equal,
    # longer and shorter than the page that follows, and nothing for the pool's first page.
    pages = [make_page(i, size) for i, size in enumerate([64 * KiB, 64 * KiB, 16 * KiB, 256 * KiB, 0, 1])]
    for page, data in pages:
        a.write(page, data)
    for page, data in pages:
        found = b.find(page.name, reading=True)
        out = bytearray(page.size)
        assert found == page and b.read_into(found, 0, memoryview(out)) is ReadResult.OK and out == data
    page, data = make_page(9, 1)
    a.write(page, data)
    device.inject(Fault("preadv", flip=True, count=1))  # the combined read's last byte: the payload
    found = b.find(page.name, reading=True)
    assert found == page and b.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.CORRUPT
    assert device.injected["preadv:flip"] == 1 and b.statistics().checksum_failures == 1
    assert b.find(page.name) is None and not os.path.exists(Layout(root).page_path(place(page.name)))


@pytest.mark.parametrize("code", [errno.ENOENT, errno.EEXIST, errno.ESTALE])
def test_directories_another_host_makes_at_once_are_made_again(tmp_path, monkeypatch, code):
    """GlusterFS, two hosts making one pool's directories at once: ENOENT for a parent both had
    just made, EEXIST for the directory while a stat of it still says ENOENT (FileExistsError
    from makedirs with exist_ok), or ESTALE for the parent (each once in a two-host test under
    load). The write goes on after a pause."""
    made = os.makedirs
    failures = [OSError(code, "racing host")]

    def racing(path, exist_ok=False):
        if failures:
            raise failures.pop()
        made(path, exist_ok=exist_ok)

    monkeypatch.setattr(os, "makedirs", racing)
    DirectoryDevice().makedirs(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir() and not failures


def test_a_page_file_opened_in_a_directory_another_host_made_at_once_is_opened_again(tmp_path, make_tier):
    """GlusterFS, two hosts writing into one new pool at once: the directory made (or found made
    by the other host), the open of the page's temporary file in it still answered ENOENT, and the
    write failed (once in 6 runs of the two-host test). It is opened again after a pause."""
    root = tmp_path / "shared"
    tier, device = faulty_tier(make_tier, root)
    device.inject(Fault("open", errno=errno.ENOENT, count=3))  # the first try, then twice after making them
    page, data = make_page(1)
    tier.write(page, data)
    assert device.injected["open:ENOENT"] == 3 and read_page(tier, page.name) == data


@pytest.mark.parametrize("fault", [Fault("unlink", errno=errno.EIO, count=1), Fault("unlink", delay_s=HANG_S, count=1)],
                         ids=["failed", "hung"])
def test_a_page_whose_removal_failed_does_not_come_back_with_the_next_sweep(tmp_path, make_tier, fault):
    """rm of a page while the volume fails or hangs its unlink: once the volume answers again,
    the file goes, and the page does not answer present again from the sweep."""
    root = tmp_path / "shared"
    tier, device = faulty_tier(make_tier, root)
    page, data = make_page(1)
    tier.write(page, data)
    found = tier.find(page.name)
    device.inject(fault)
    start = time.monotonic()
    tier.drop(found, 0)  # rm
    assert time.monotonic() - start < PROMPT_S
    wait_until(lambda: tier.statistics().guard.available, timeout=10)
    cycles = tier.statistics().sweep.sweep_cycles
    wait_until(lambda: tier.statistics().sweep.sweep_cycles >= cycles + 2, timeout=10)
    assert tier.contains_many([page.name]) == [False]
    wait_until(lambda: not os.path.exists(Layout(root).page_path(place(page.name))), timeout=5)
    assert read_page(tier, page.name) is None and tier.contains_many([page.name]) == [False]


def test_a_full_filesystem_does_not_make_a_journal_file_per_failed_append(tmp_path, make_tier):
    """While the volume is full, each flush of the journal fails with ENOSPC; the journal keeps
    its file for the next try instead of starting a new one every tick (thousands of empty
    files, each of which every other host lists and opens)."""
    root = tmp_path / "shared"
    tier, device = faulty_tier(make_tier, root)
    page, data = make_page(1)
    tier.write(page, data)
    wait_until(lambda: tier.statistics().journal_pending == 0)
    device.inject(Fault("write", errno=errno.ENOSPC))
    tier.drop(tier.find(page.name), 0)  # an announcement that cannot be appended
    time.sleep(1.0)  # some 50 ticks
    # The announcement waits for the next try: one, or two where the drop's unlink ran past its
    # deadline on a loaded machine and was made again once the volume answered (each announces).
    assert tier.statistics().journal_pending in (1, 2)
    assert len(os.listdir(Layout(root).journal)) <= 2
    device.clear()
    wait_until(lambda: tier.statistics().journal_pending == 0)


def test_a_sweep_asked_for_in_the_tick_that_finds_the_volume_gone_runs_once_it_is_back(make_tier, tmp_path):
    """A sweep asked for (after an ``rm`` the volume could not take, or the volume's return) in the
    maintenance tick whose earlier call then finds the volume gone has its first step refused: it
    must still run once the volume answers, not wait for the next interval (a minute by default),
    or a page removed meanwhile answers present until then."""
    tier, device = faulty_tier(make_tier, tmp_path / "shared", sweep_interval_s=60.0)
    wait_until(lambda: tier.statistics().sweep.sweep_cycles >= 1)
    cycles = tier.statistics().sweep.sweep_cycles
    device.inject(Fault("listdir", delay_s=HANG_S, count=1))  # the journal's next poll hangs
    wait_until(lambda: device.injected["listdir:delay"] >= 1)
    tier._sweep_wanted = True  # asked for while that poll hangs, in the tick that will find the volume gone
    wait_until(lambda: not tier.statistics().guard.available, timeout=5)
    wait_until(lambda: tier.statistics().guard.available, timeout=5)
    wait_until(lambda: tier.statistics().sweep.sweep_cycles > cycles, timeout=5)


class Mountpoint(DirectoryDevice):
    """A volume's directory seen through its mountpoint, which ``mounted = False`` unmounts: the
    mountpoint's paths then name the bare directory below it, on the mount of /. Each mount
    gives the volume a new st_dev, as FUSE does, and has a mount ID of its own."""

    VOLUME, LOCAL = "fuse.glusterfs server:/volume", "ext4 /dev/sda1"  # filesystems: type and source

    def __init__(self, volume: Path, mountpoint: Path, placeholder: bool = False, renumbered: bool = False) -> None:
        """``placeholder``: unmounted, the mountpoint shows a mount under the volume's (its
        directory then of that mount, ID 0, another filesystem), not the bare directory on the
        mount of /. ``renumbered``: each mount numbers the volume's directories anew (their
        inode numbers differ from one mount to the next)."""
        self.volume, self.mountpoint, self.mounted, self.mounts = str(volume), str(mountpoint), True, 1
        self.placeholder, self.renumbered = placeholder, renumbered

    def _path(self, path):
        if self.mounted and isinstance(path, str) and path.startswith(self.mountpoint):
            return self.volume + path[len(self.mountpoint):]
        return path

    def __getattribute__(self, name):
        method = super().__getattribute__(name)
        if name.startswith("_") or name in ("stat", "mount_of", "volume", "mountpoint", "mounted", "mounts",
                                            "placeholder", "renumbered", "VOLUME", "LOCAL"):
            return method
        return lambda *args: method(*(self._path(arg) for arg in args))

    def stat(self, path):
        real = os.stat(self._path(path))
        if self._path(path) == path:
            return real
        fields = list(real[:10])
        fields[2] = real.st_dev + self.mounts  # the volume's filesystem, as this mount numbers it
        if self.renumbered and stat.S_ISDIR(real.st_mode):
            fields[1] = real.st_ino + (self.mounts << 40)
        return os.stat_result(fields)

    def mount_of(self, path):
        if self._path(path) != path:
            return self.mountpoint, self.mounts, self.VOLUME
        return (self.mountpoint, 0, self.LOCAL) if self.placeholder else ("/", 0, self.LOCAL)


def test_a_volume_unmounted_under_the_tier_is_unavailable_and_nothing_lands_on_the_mountpoint(tmp_path, make_tier):
    """The shared volume unmounted under a running daemon, then mounted again: meanwhile the
    tier is unavailable, writes nothing on the bare mountpoint (no host would see it, and the
    local disk fills), makes no journal there (announcements would go to a file the remount
    hides), and keeps a removal made meanwhile, which it applies once the volume is back."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    device = Mountpoint(volume, mountpoint)
    a = make_tier(mountpoint / "hc", device=device)
    b = make_tier(volume / "hc", sweep_interval_s=60.0)  # another host: what it learns comes from the journals
    wait_until(lambda: b.statistics().sweep.sweep_cycles >= 1)
    removed, removed_data = make_page(0)
    a.write(removed, removed_data)
    wait_until(lambda: b.contains_many([removed.name]) == [True])
    device.mounted = False
    wait_until(lambda: not a.statistics().guard.available, timeout=5)
    page, data = make_page(1)
    with pytest.raises(OSError):
        a.write(page, data)
    assert a.remove(removed.name)  # rm while the volume is away
    time.sleep(0.5)  # some probes
    assert not a.statistics().guard.available and os.listdir(mountpoint) == []
    device.mounted, device.mounts = True, 2
    wait_until(lambda: a.statistics().guard.available, timeout=5)
    wait_until(lambda: b.contains_many([removed.name]) == [False])  # the removal, announced on the volume
    assert not os.path.exists(Layout(volume / "hc").page_path(place(removed.name)))
    later, later_data = make_page(2)
    a.write(later, later_data)
    wait_until(lambda: b.contains_many([later.name]) == [True])
    assert read_page(b, later.name) == later_data and os.listdir(mountpoint) == []


class UnmountedMidWrite(Mountpoint):
    """A volume unmounted in the middle of a page's write, at its ``when``: its temporary file's
    second open (in a directory made again after the first one's ENOENT), or its rename. Either
    answers ENOENT, as the volume's files are gone from the mountpoint's path."""

    def __init__(self, volume: Path, mountpoint: Path, when: str) -> None:
        super().__init__(volume, mountpoint)
        self._when, self._opens = when, 0  # (underscored: Mountpoint maps its other attributes' paths)

    def open(self, path, flags, mode=0o644):
        if flags & os.O_CREAT and "/." in path and self._when == "open":
            self._opens += 1
            if self._opens == 2:
                self.mounted = False
            if self._opens <= 2:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return super().open(path, flags, mode)

    def rename(self, source, target):
        if self._when == "rename":
            self.mounted = False
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        super().rename(source, target)


@pytest.mark.parametrize("when", ["open", "rename"])
def test_a_volume_unmounted_mid_write_fails_the_write_and_puts_nothing_on_the_mountpoint(tmp_path, make_tier, when):
    """Found by review: the open tried again after a pause made the pool's directories again on the
    bare mountpoint once the volume was unmounted meanwhile, and wrote the page there, counted
    written; a rename answered ENOENT for the same reason was taken for another host's removal,
    no failure of the volume. Both fail with ENOTCONN, a failure."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    device = UnmountedMidWrite(volume, mountpoint, when)
    tier = make_tier(mountpoint / "hc", device=device)
    page, data = make_page(1)
    with pytest.raises(OSError) as raised:
        tier.write(page, data)
    assert raised.value.errno == errno.ENOTCONN and os.listdir(mountpoint) == []
    assert tier.statistics().io_errors >= 1 and not tier.statistics().guard.available


def _unmounted_at_first_makedirs(tmp_path, monkeypatch, device: Mountpoint, picks) -> list[str]:
    """``os.makedirs`` as on a host racing another at making the directories ``picks`` takes: its
    first try of them answers ENOENT, and the volume is unmounted then (a later try's path leads
    to the bare mountpoint). Returns the list of their tries, filled as they come."""
    made, tries = os.makedirs, []

    def racing(path, exist_ok=False):
        if picks(path) and path.startswith(str(tmp_path)):  # (not another test's tier)
            tries.append(path)
            if len(tries) == 1:
                device.mounted = False
                raise FileNotFoundError(errno.ENOENT, "racing host")
            path = path.replace(device.volume, device.mountpoint, 1)
        made(path, exist_ok=exist_ok)

    monkeypatch.setattr(os, "makedirs", racing)
    return tries


def test_a_volume_unmounted_while_a_pools_directories_are_made_stops_their_making(tmp_path, make_tier, monkeypatch):
    """Found by review: making them was tried again after a pause (another host making them at
    once) with no look at the volume, and a volume unmounted meanwhile had the tree made on the
    bare mountpoint and the page written there, counted written."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    device = Mountpoint(volume, mountpoint)
    tier = make_tier(mountpoint / "hc", device=device)
    tries = _unmounted_at_first_makedirs(tmp_path, monkeypatch, device, lambda path: "/kv" in path)
    page, data = make_page(1)
    with pytest.raises(OSError) as raised:
        tier.write(page, data)
    assert raised.value.errno == errno.ENOTCONN and len(tries) == 1 and os.listdir(mountpoint) == []


def test_a_volume_unmounted_while_the_journal_directory_is_made_puts_no_journal_on_the_mountpoint(
        tmp_path, make_tier, monkeypatch):
    """Found by review: the journal's directory made again after a pause (another host making it
    at once), the volume unmounted meanwhile, was made on the bare mountpoint, and the page's
    announcement written there, which no other host reads and a remount hides."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    device = Mountpoint(volume, mountpoint)
    tier = make_tier(mountpoint / "hc", device=device)
    tries = _unmounted_at_first_makedirs(tmp_path, monkeypatch, device, lambda path: path.endswith(JOURNAL_DIR))
    page, data = make_page(1)
    try:
        tier.write(page, data)  # its announcement opens the journal's first file
    except OSError:
        pass
    wait_until(lambda: tries and not tier.statistics().guard.available, timeout=5)
    time.sleep(0.5)  # some ticks
    assert len(tries) == 1 and os.listdir(mountpoint) == []


def test_a_page_file_open_tried_again_gives_up_within_half_the_writes_deadline(tmp_path, make_tier):
    """Found by review: its pauses (1.3 s) outlasted a short write deadline, and the timeout
    marked the tier unavailable; the write fails with the open's ENOENT instead."""
    tier, device = faulty_tier(make_tier, tmp_path / "shared", deadline_s=0.1)  # a 64 KiB write: 0.4 s
    device.inject(Fault("open", errno=errno.ENOENT))
    page, data = make_page(1)
    with pytest.raises(FileNotFoundError):
        tier.write(page, data)
    assert tier.statistics().guard.timeouts == 0


def writes(tier, page, data) -> bool:
    """Whether ``tier`` took a write of ``page`` now."""
    try:
        tier.write(page, data)
    except OSError:
        return False
    return True


def test_a_tier_started_before_its_volume_is_mounted_takes_the_volume_up_once_it_is(tmp_path, make_tier):
    """The daemon came up before its volume was mounted (boot order): the tier started on the
    bare mountpoint, and once the volume is mounted over it, it works on the volume (it stayed
    unavailable until a restart: the directory it had noted was the bare mountpoint's)."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    device = Mountpoint(volume, mountpoint)
    device.mounted = False
    a = make_tier(mountpoint / "hc", device=device)
    b = make_tier(volume / "hc", sweep_interval_s=60.0)  # another host: what it learns comes from the journals
    wait_until(lambda: b.statistics().sweep.sweep_cycles >= 1)
    device.mounted = True
    page, data = make_page(1)
    wait_until(lambda: writes(a, page, data), timeout=5)
    wait_until(lambda: b.contains_many([page.name]) == [True])  # announced in the volume's journal
    assert read_page(b, page.name) == data and a.statistics().guard.available


def test_a_volume_mounted_again_whose_root_has_a_new_inode_number_is_taken_up(tmp_path, make_tier):
    """The volume unmounted and mounted again at its mountpoint by an engine that numbers
    inodes anew at each mount: the shared directory, with the tier's journal in it, has another
    inode number, and the tier stayed unavailable until a restart (found by review). It is taken
    up as the same filesystem (type and source) holding the journal; a placeholder directory the
    unmounted volume revealed meanwhile is not, though it holds a journal directory too (one a
    tier made there while the volume was not mounted)."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    (mountpoint / "hc" / JOURNAL_DIR).mkdir(parents=True)  # the placeholder's, under the volume
    device = Mountpoint(volume, mountpoint, placeholder=True, renumbered=True)
    a = make_tier(mountpoint / "hc", device=device)
    b = make_tier(volume / "hc", sweep_interval_s=60.0)  # another host: what it learns comes from the journals
    wait_until(lambda: b.statistics().sweep.sweep_cycles >= 1)
    device.mounted = False
    wait_until(lambda: not a.statistics().guard.available, timeout=5)
    time.sleep(0.5)  # some probes
    page, data = make_page(1)
    assert not writes(a, page, data) and not a.statistics().guard.available
    device.mounted, device.mounts = True, 2
    wait_until(lambda: writes(a, page, data), timeout=5)
    wait_until(lambda: b.contains_many([page.name]) == [True])  # announced in the volume's journal
    assert read_page(b, page.name) == data and os.listdir(mountpoint / "hc") == [JOURNAL_DIR]


def test_a_volume_taken_up_after_start_has_its_mount_settings_checked_as_at_start(tmp_path, make_tier, monkeypatch,
                                                                                  caplog):
    """The daemon came up before its volume was mounted: the start warned of the bare
    mountpoint's local filesystem, and the volume mounted later, with caches too long for the
    tier, was taken up without a word (found by review); unmounted and mounted again, the same.
    Each take-up checks the mount's settings, as the start does."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    device = Mountpoint(volume, mountpoint)
    device.mounted = False
    bare = engine_checks.Mount(str(tmp_path), "ext4", "/dev/sda1", {}, 0)
    monkeypatch.setattr(engine_checks, "local_mount", lambda path: None if device.mounted else bare)
    monkeypatch.setattr(engine_checks, "settings", lambda path: engine_checks.Settings("JuiceFS", {"attribute cache": 5.0}))
    caplog.set_level(logging.INFO, logger="hicachefs.store.shared.tier")

    def warnings():
        return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING
                and ("local filesystem" in record.getMessage() or "JuiceFS mount" in record.getMessage())]

    a = make_tier(mountpoint / "hc", device=device)
    assert len(warnings()) == 1 and "local filesystem" in warnings()[0]
    device.mounted = True
    page, data = make_page(1)
    wait_until(lambda: writes(a, page, data), timeout=5)
    wait_until(lambda: len(warnings()) == 2, timeout=5)
    assert "JuiceFS mount has attribute cache 5 s (at most 1 s)" in warnings()[1]
    device.mounted = False
    wait_until(lambda: not a.statistics().guard.available, timeout=5)
    device.mounted, device.mounts = True, 2
    wait_until(lambda: a.statistics().guard.available, timeout=5)
    wait_until(lambda: len(warnings()) == 3, timeout=5)
    assert "JuiceFS mount has attribute cache 5 s" in warnings()[2]
    time.sleep(0.3)  # some ticks: once a take-up
    assert len(warnings()) == 3


def test_the_shared_directory_made_again_under_a_running_tier_is_taken_up(tmp_path, make_tier):
    """An operator moves the shared directory away and makes it again: while it is missing the
    tier is unavailable and makes nothing; once it is there the tier works on it (it stayed
    unavailable until a restart, the directory not the one noted at start)."""
    root = tmp_path / "shared"
    a = make_tier(root)
    b = make_tier(root, sweep_interval_s=60.0)
    os.rename(root, tmp_path / "old")
    wait_until(lambda: not a.statistics().guard.available, timeout=5)
    time.sleep(0.5)  # some probes
    assert not root.exists()
    root.mkdir()
    page, data = make_page(1)
    wait_until(lambda: writes(a, page, data), timeout=5)
    assert os.path.exists(Layout(root).page_path(place(page.name)))
    wait_until(lambda: b.contains_many([page.name]) == [True])  # announced in the new directory's journal
    assert read_page(b, page.name) == data


def test_a_directory_the_unmounted_volume_reveals_at_its_mountpoint_is_not_taken_up(tmp_path, make_tier):
    """The volume was mounted over a placeholder that holds a directory of the shared
    directory's name: unmounted, the placeholder shows at the same mountpoint. The tier took that
    directory up and wrote its pages and journal there, where no other host sees them (found by
    review); it stays unavailable now, and takes the volume up again once it is back."""
    volume, mountpoint = tmp_path / "volume", tmp_path / "mnt"
    volume.mkdir(), mountpoint.mkdir()
    (mountpoint / "hc").mkdir()  # the placeholder's directory, under the volume
    device = Mountpoint(volume, mountpoint, placeholder=True)
    a = make_tier(mountpoint / "hc", device=device)
    page, data = make_page(0)
    wait_until(lambda: writes(a, page, data))
    device.mounted = False
    wait_until(lambda: not a.statistics().guard.available, timeout=5)
    time.sleep(0.5)  # some probes
    later, later_data = make_page(1)
    assert not writes(a, later, later_data)
    assert not a.statistics().guard.available and os.listdir(mountpoint / "hc") == []
    device.mounted, device.mounts = True, 2
    wait_until(lambda: a.statistics().guard.available, timeout=5)
    assert writes(a, later, later_data) and os.listdir(mountpoint / "hc") == []
    assert os.path.exists(Layout(volume / "hc").page_path(place(later.name)))


def _warnings(caplog, about: str) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and about in record.getMessage()]


def test_failed_page_writes_are_logged_at_once_then_a_minute_apart_saying_how_many(tmp_path, make_tier, caplog):
    """A daemon that could not write the shared directory (another uid's daemon had made its
    directories 0755) wrote no page there, and its log said nothing: only the stats counted it."""
    caplog.set_level(logging.WARNING, logger="hicachefs.store.shared.tier")
    tier, device = faulty_tier(make_tier, tmp_path / "shared")
    now = [1000.0]
    tier.failure_log.clock = lambda: now[0]
    device.inject(Fault("pwritev", errno=errno.EACCES))
    pages = [make_page(i) for i in range(4)]
    for page, data in pages[:3]:
        wait_until(lambda: tier.statistics().guard.available, timeout=5)  # three failures in a row mark it away
        with pytest.raises(PermissionError):
            tier.write(page, data)
    failed = f"[Errno 13] injected fault in pwritev: {os.strerror(errno.EACCES)}"
    assert _warnings(caplog, "writing page") == [f"shared tier: writing page {pages[0][0].name!r} failed: {failed}"]
    now[0] += 60  # the maintenance tick says the two held back
    wait_until(lambda: _warnings(caplog, "more page write") == [
        "shared tier: 2 more page write failures not logged in the last 60 s"], timeout=5)
    wait_until(lambda: tier.statistics().guard.available, timeout=5)
    with pytest.raises(PermissionError):
        tier.write(*pages[3])
    assert _warnings(caplog, "writing page")[1:] == [f"shared tier: writing page {pages[3][0].name!r} failed: {failed}"]


def test_a_journal_that_cannot_be_appended_to_is_logged(tmp_path, make_tier, caplog):
    """No other host learns of a page this host wrote within a second without its journal line:
    a journal file that could not be made (another uid's journal directory) was only counted."""
    caplog.set_level(logging.WARNING, logger="hicachefs.store.shared.tier")
    tier, device = faulty_tier(make_tier, tmp_path / "shared")
    device.inject(Fault("write", errno=errno.EACCES))  # the journal's appends (a page file's are pwritev)
    tier.failure_log.clock = lambda: 1000.0
    tier.write(*make_page(1))
    wait_until(lambda: tier.statistics().io_errors >= 3, timeout=5)  # a failed flush at every tick
    assert _warnings(caplog, "appending to the journal") == [
        f"shared tier: appending to the journal failed: [Errno 13] injected fault in write: {os.strerror(errno.EACCES)}"]


def test_failures_held_back_when_the_tier_closes_are_said_then(caplog):
    """A storm of failed writes that stopped had all but its first line logged nowhere: 1,000
    failures in 50 s, one line (found by review). The close says how many were held back."""
    failures = FailureLog(logging.getLogger("hicachefs.test"), clock=lambda: 1000.0)
    with caplog.at_level(logging.WARNING, logger="hicachefs.test"):
        for i in range(3):
            failures.failed("page write", "shared tier: writing page %r failed", f"p{i}")
        failures.close()
    assert [record.getMessage() for record in caplog.records] == [
        "shared tier: writing page 'p0' failed",
        "shared tier: 2 more page write failures not logged before the close"]


def test_failures_held_back_are_said_once_their_minute_is_over(caplog):
    """Said only at the close, a storm's count waited for days (found by review): the tier's
    maintenance tick says it once the minute after its last line is over."""
    now = [1000.0]
    failures = FailureLog(logging.getLogger("hicachefs.test"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="hicachefs.test"):
        for i in range(3):
            failures.failed("page write", "shared tier: writing page %r failed", f"p{i}")
        failures.flush_due()  # within the minute: nothing yet
        now[0] += 60
        failures.flush_due()
        failures.flush_due()  # said once
        failures.failed("page write", "shared tier: writing page %r failed", "p3")  # said with its text
    assert [record.getMessage() for record in caplog.records] == [
        "shared tier: writing page 'p0' failed",
        "shared tier: 2 more page write failures not logged in the last 60 s",
        "shared tier: writing page 'p3' failed"]
