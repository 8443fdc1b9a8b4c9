"""The data plane on a real mount (``client/plane.py``): reads and existence cost the daemon no
request, a batch written costs one, sent behind the call (which returns once the pages are in
the daemon's memory, this process seeing them at once), only the store's writers may use it, a
writer that dies mid-batch publishes nothing, and a daemon killed under the client is never
trusted again, while the same client serves from the next daemon within seconds."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import xxhash

import hicachefs_client.plane as plane_module
import hicachefs_client.plane_index as plane_index
import hicachefs_client.plane_reports as plane_reports
from hicachefs_client.page_io import PageIO
from hicachefs import mount_table
from hicachefs_client.plane import MIN_AHEAD_BYTES, Plane
from hicachefs_testing import mounting
from hicachefs_testing.host_pools import MHAHostPool, page_bytes
from forking import forked_while_held
from pages import as_nobody, requests_of, wait_until
from test_backend import indices, key, make_fs

PAGES = 8


def written(mounted, pages=PAGES, prefix="plane"):
    """A pool of pages written through a client, and their keys."""
    pool = MHAHostPool(pages=pages)
    writer = make_fs(mounted.path, pool)
    keys = [key(prefix, i) for i in range(pages)]
    assert writer.batch_set_v1(keys, indices(pool, range(pages))) == [True] * pages
    writer.close()
    return pool, keys


def hold_back_commits(monkeypatch) -> threading.Event:
    """Commits sent behind a write wait (the daemon's answer, delayed) until the event is set."""
    released = threading.Event()
    send = Plane._commit_behind

    def held_back(plane, *args):
        released.wait(10)
        return send(plane, *args)

    monkeypatch.setattr(Plane, "_commit_behind", held_back)
    return released


def stored_and_settled(path, pool: MHAHostPool, tag: str, pages: int):
    """A client of the mount at ``path`` that stored pages ``key(tag, 0..pages-1)`` from the
    pool's first slots, its commit answered (its first makes the pool): the client and the keys."""
    writer = make_fs(path, pool)
    first = [key(tag, i) for i in range(pages)]
    assert writer.batch_set_v1(first, indices(pool, range(pages))) == [True] * pages
    writer.settle()
    return writer, first


# Pages of small pieces (4 KiB: read with one preadv each) and of large ones (64 KiB: copied
# from the arena's mapping).
SHAPES = {"small pieces": {}, "large pieces": dict(head_num=8, head_dim=64)}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_reads_and_existence_ask_the_daemon_nothing(mounted, shape):
    source = MHAHostPool(pages=PAGES, **SHAPES[shape])
    keys = [key("plane", shape, i) for i in range(PAGES)]
    writer = make_fs(mounted.path, source)
    assert writer.batch_set_v1(keys, indices(source, range(PAGES))) == [True] * PAGES
    writer.close()
    target = MHAHostPool(pages=PAGES, **SHAPES[shape])
    reader = make_fs(mounted.path, target)  # registering its pool attached it, and asked the pool's number
    target.zero()
    cost, got = requests_of(mounted, lambda: (reader.batch_exists(keys),
                                              reader.batch_get_v1(keys, indices(target, range(PAGES)))))
    assert got == (PAGES, [True] * PAGES) and not cost  # its very first calls too
    assert all(page_bytes(target, i) == page_bytes(source, i) for i in range(PAGES))
    missing = [key("never", i) for i in range(3)]
    cost, got = requests_of(mounted, lambda: (reader.batch_exists(missing),
                                              reader.batch_get_v1(missing, indices(target, range(3)))))
    assert got == (0, [False] * 3) and not cost
    assert reader.statistics()["plane_reads"] == PAGES


def test_reads_are_reported_and_counted_by_the_daemon(mounted):
    _, keys = written(mounted)
    target = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, target)
    hits = mounted.stats()["hits"]
    for _ in range(3):
        assert reader.batch_get_v1(keys, indices(target, range(PAGES))) == [True] * PAGES
    reader.close()  # sends what is left to report
    assert mounted.stats()["hits"] == hits + 3 * PAGES
    assert os.getxattr(mounted.path / reader._dir_of("kv") / keys[0], "user.hicachefs.hits") == b"3"


def test_misses_are_reported_and_counted_by_the_daemon(mounted):
    """A read through the plane of a page the index does not hold (or holds in another size) is
    a miss to the daemon as it is to the client: its ``misses`` left them out, so the hit rate
    of ``top`` and the metrics counted only the reads that found their page."""
    _, keys = written(mounted)
    target = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, target)
    before = mounted.stats()
    missing = [key("never", i) for i in range(3)]
    assert reader.batch_get_v1(missing + keys[:2], indices(target, range(5))) == [False] * 3 + [True] * 2
    reader.close()  # sends what is left to report
    after = mounted.stats()
    assert reader.statistics()["misses"] == 3
    assert after["misses"] == before["misses"] + 3 and after["hits"] == before["hits"] + 2


def test_a_batch_written_costs_one_request_of_the_plane_file(mounted):
    pool = MHAHostPool(pages=3 * PAGES)
    writer = make_fs(mounted.path, pool)
    first = [key("batch", i) for i in range(PAGES)]
    assert writer.batch_set_v1(first, indices(pool, range(PAGES))) == [True] * PAGES  # its commit makes the pool
    second = [key("batch", i) for i in range(PAGES, 2 * PAGES)]
    assert writer.batch_set_v1(second, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
    writer.settle()  # its commit, sent behind it, is not the third batch's cost
    third = [key("batch", i) for i in range(2 * PAGES, 3 * PAGES)]
    cost, got = requests_of(mounted, lambda: (writer.batch_set_v1(third, indices(pool, range(2 * PAGES, 3 * PAGES))),
                                              writer.settle())[0])
    assert got == [True] * PAGES
    assert cost == {"write": 1}  # the commit; its answer is read from the handle's mailbox in the arena
    cost, got = requests_of(mounted, lambda: writer.batch_set_v1(third, indices(pool, range(2 * PAGES, 3 * PAGES))))
    assert got == [True] * PAGES and not cost  # pages the index holds are kept without asking
    target = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, target)
    assert reader.batch_get_v1(third, indices(target, range(PAGES))) == [True] * PAGES
    assert [page_bytes(target, i) for i in range(PAGES)] == [page_bytes(pool, 2 * PAGES + i) for i in range(PAGES)]
    assert writer.statistics()["plane_writes"] == 3 * PAGES


def _arena_mapping(inode: int) -> tuple:
    """(Size, Rss) in bytes of this process's mapping of the arena with ``inode``."""
    size = rss = 0
    mine = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                mine = fields[4] == str(inode) and "hicachefs-arena" in line
            elif mine and fields[0] in ("Size:", "Rss:"):
                if fields[0] == "Size:":
                    size += int(fields[1]) << 10
                else:
                    rss += int(fields[1]) << 10
    return size, rss


def test_a_clients_mapping_of_the_arena_is_filled_ahead_and_let_go_at_close(mounted):
    pool, keys = written(mounted)  # by a client closed since
    reader = make_fs(mounted.path, MHAHostPool(pages=PAGES))
    assert reader.batch_exists(keys) == PAGES  # attached
    arena = os.fstat(reader.io.plane.attached().arena_map.fd)
    # Mapped whole, once (the closed client's mapping is gone), all of it resident: a first copy
    # from or into the arena faults on nothing.
    wait_until(lambda: _arena_mapping(arena.st_ino) == (arena.st_size, arena.st_size), timeout=10)
    reader.close()
    wait_until(lambda: _arena_mapping(arena.st_ino) == (0, 0), timeout=10)


def test_a_client_keeps_its_arena_mapping_when_the_index_grows(mount_factory):
    mounted = mount_factory("--memory", "64M")  # an index of 1,024 rows at first (pages of 8 KiB here)
    pool = MHAHostPool(pages=64)
    client = make_fs(mounted.path, pool)
    assert client.batch_set_v1([key("grow", 0, i) for i in range(64)], indices(pool, range(64))) == [True] * 64
    attachment = client.io.plane.attached()
    arena = os.fstat(attachment.arena_map.fd)
    for batch in range(1, 20):  # past the index's first 1,024 rows: it moves to new memory
        keys = [key("grow", batch, i) for i in range(64)]
        assert client.batch_set_v1(keys, indices(pool, range(64))) == [True] * 64
    client.settle()
    assert client.batch_exists(keys) == 64
    again = client.io.plane.attached()
    assert again is not attachment  # attached to the index's new memory
    assert again.arena_map is attachment.arena_map  # and the same mapping of the arena, filled
    wait_until(lambda: _arena_mapping(arena.st_ino) == (arena.st_size, arena.st_size), timeout=10)


def test_only_the_stores_writers_may_open_the_arena_the_index_and_the_plane_file(public_mount):
    source, keys = written(public_mount)
    control = public_mount.path / ".hicachefs"
    page = public_mount.path / make_fs(public_mount.path, source)._dir_of("kv") / keys[0]
    script = f"""
import errno, os
for name, flags in (("arena", os.O_RDWR), ("index", os.O_RDONLY), ("disk", os.O_RDONLY), ("plane", os.O_RDWR)):
    try:
        os.close(os.open({str(control)!r} + "/" + name, flags))
        print(name, "opened")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
print("page", open({str(page)!r}, "rb").read() == bytes.fromhex({page_bytes(source, 0).hex()!r}))
fd = os.open({str(control / "fetch")!r}, os.O_RDWR)
os.write(fd, b"{len(page_bytes(source, 0))} {page.relative_to(public_mount.path)}\\n")
print("fetch", os.pread(fd, 1 << 20, 0) == bytes.fromhex({page_bytes(source, 0).hex()!r}))
"""
    done = as_nobody("/usr/bin/python3", "-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:6] == ["arena EACCES", "index EACCES", "disk ENOENT", "plane EACCES",
                                          "page True", "fetch True"]


_RESERVE_AND_HANG = """
import os, struct, sys, time
control = sys.argv[1]
plane = os.open(control + "/plane", os.O_RDWR)
arena = os.open(control + "/arena", os.O_RDWR)
sizes = [1 << 20] * 4
os.pwrite(plane, struct.pack("<4sHHIIQ", b"HCPQ", 2, 0, 4, 16, 1) + struct.pack("<4I", *sizes), 0)
offsets = struct.unpack_from("<4q", os.pread(plane, 56, 0), 24)
for offset in offsets:
    os.pwrite(arena, b"x" * (1 << 20), offset)  # the pages' bytes, never committed
print(" ".join(map(str, offsets)), flush=True)
time.sleep(60)
"""


def test_a_writer_killed_between_reserving_and_committing_publishes_nothing(mounted):
    before = mounted.stats()
    writer = subprocess.Popen([sys.executable, "-c", _RESERVE_AND_HANG, str(mounted.path / ".hicachefs")],
                              stdout=subprocess.PIPE, text=True)
    try:
        offsets = [int(o) for o in writer.stdout.readline().split()]
        assert len(offsets) == 4 and min(offsets) >= 0
        held = mounted.stats()["tiers"]["memory"]["used_bytes"]
        assert held >= before["tiers"]["memory"]["used_bytes"] + (4 << 20)  # reserved: the slots are its own
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    wait_until(lambda: mounted.stats()["tiers"]["memory"]["used_bytes"] == before["tiers"]["memory"]["used_bytes"],
               timeout=5)  # the dead writer's slots come back
    assert mounted.stats()["published"] == before["published"]


def test_a_daemon_killed_under_four_threads_is_never_trusted_and_the_client_comes_back(mount_factory):
    """Four threads of one client (one host pool, as a rank has) write their pages and read
    them back into other pages of the pool, before, while and after the daemon is killed and a
    new one mounted on the same path."""
    mount = mount_factory("--memory", "256M")
    pool = MHAHostPool(pages=4 * 2 * PAGES)
    client = make_fs(mount.path, pool)
    blank = pool.get_dummy_flat_data_page()
    wrong, served_after = [], []
    stop = threading.Event()
    remounted_at = []
    rounds = [0] * 4  # calls each thread has made

    def rank(thread: int) -> None:
        source = range(2 * PAGES * thread, 2 * PAGES * thread + PAGES)
        target = range(source.stop, source.stop + PAGES)
        keys = [key("rank", thread, i) for i in source]
        expected = [page_bytes(pool, i) for i in source]
        while not stop.is_set():
            client.batch_set_v1(keys, indices(pool, source))
            for page in target:
                pool.set_from_flat_data_page(page * pool.page_size, blank)
            got = client.batch_get_v1(keys, indices(pool, target))
            wrong.extend(i for i, ok in enumerate(got) if ok and page_bytes(pool, target[i]) != expected[i])
            if remounted_at and all(got):
                served_after.append(time.monotonic() - remounted_at[0])
            rounds[thread] += 1

    threads = [threading.Thread(target=rank, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: min(rounds) >= 2)  # every thread served by the first daemon
        mounting.kill(mount)
        killed_at = list(rounds)
        wait_until(lambda: all(now > then for now, then in zip(rounds, killed_at)))  # and met it dead
        mount_factory("--memory", "256M", path=mount.path)
        remounted_at.append(time.monotonic())
        wait_until(lambda: served_after, timeout=10)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    client.close()
    assert not wrong
    assert served_after and min(served_after) < 5.0
    assert client.statistics()["plane_reads"] > 0


def test_the_moment_its_daemon_is_killed_a_client_serves_nothing_from_the_memory_it_left(mount_factory):
    """The client still maps the dead daemon's index and arena, which still hold the pages; the
    next call must not take them for hits (the daemon's liveness word, which the kernel marked)."""
    mount = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=2 * PAGES)
    client = make_fs(mount.path, pool)
    keys = [key("dead", i) for i in range(PAGES)]
    target = indices(pool, range(PAGES, 2 * PAGES))
    assert client.batch_set_v1(keys, indices(pool, range(PAGES))) == [True] * PAGES
    assert client.batch_exists(keys) == PAGES
    assert client.batch_get_v1(keys, target) == [True] * PAGES
    read = client.statistics()["plane_reads"]
    mounting.kill(mount)
    assert client.batch_exists(keys) == 0
    assert client.batch_get_v1(keys, target) == [False] * PAGES
    assert client.statistics()["plane_reads"] == read
    client.close()


def test_a_handle_that_reaches_the_next_daemon_is_not_used_with_the_last_ones_memory(mount_factory, monkeypatch):
    """A call checks its attachment, then the daemon restarts before the call opens its handle
    on the plane file (by path: the next daemon's). Slots reserved there must not be filled
    through the old daemon's arena: the page the call stores reads back as written."""
    mount = mount_factory("--memory", "64M")
    io = PageIO(str(mount.path))
    attachment = io.plane.attached()
    mounting.stop(mount)
    mount_factory("--memory", "64M", path=mount.path)
    monkeypatch.setattr(io.plane, "attached", lambda: attachment)  # its check passed just before
    size, page = 64 << 10, b"\x5a" * (64 << 10)
    assert io.publish_pages("m/f/tp0of1/kv", ["a" * 64], [[memoryview(page)]], size) == [True]
    assert (mount.path / "m/f/tp0of1/kv" / ("a" * 64)).read_bytes() == page
    assert io.failures.counts().get("ESTALE", 0) >= 1
    monkeypatch.undo()
    io.close()


@contextlib.contextmanager
def hung_and_taken_down(mount_factory, mount):
    """The mount's daemon hangs (stopped) and is taken down as ``hicachefs umount`` does (its FUSE
    connection aborted, the mount removed), and the next one is mounted at the path. The hung
    one still runs, so its liveness word and index say it serves; it is killed by its PID after."""
    os.kill(mount.pid, signal.SIGSTOP)
    try:
        mount_table.abort(mount.path)
        mount_table.remove(mount.path)
        yield mount_factory("--memory", "64M", path=mount.path)
    finally:
        os.kill(mount.pid, signal.SIGKILL)
        assert mounting.wait_gone(mount.pid, 10)


def test_a_client_lets_go_of_a_hung_daemon_taken_down_and_serves_the_next_ones_pages(mount_factory):
    """A hung daemon is taken down as ``hicachefs umount`` does (its FUSE connection aborted, the
    mount removed) and another mounted at the path. The hung one still runs, so its liveness word
    and index say it serves: the client read its pages as hits for good, and wrote into its
    memory, until its requests met the aborted connection."""
    mount = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=2 * PAGES)
    client = make_fs(mount.path, pool)
    before = [key("hung", i) for i in range(PAGES)]
    assert client.batch_set_v1(before, indices(pool, range(PAGES))) == [True] * PAGES
    client.settle()
    with hung_and_taken_down(mount_factory, mount):
        after = [key("next", i) for i in range(PAGES)]

        def served_by_the_next() -> bool:
            stored = client.batch_set_v1(after, indices(pool, range(PAGES, 2 * PAGES)))
            client.settle()
            return client.batch_exists(before) == 0 and stored == [True] * PAGES and client.batch_exists(after) == PAGES

        wait_until(served_by_the_next)
        fresh = make_fs(mount.path, MHAHostPool(pages=PAGES))
        assert fresh.batch_exists(after) == PAGES and fresh.batch_exists(before) == 0
        fresh.close()
    client.close()


def test_a_client_that_only_asks_whether_pages_exist_lets_go_of_a_hung_daemon_taken_down(mount_factory):
    """Such a client sends the hung daemon no request that would fail, and its liveness word does
    not change: it answered from the hung daemon's index for good, pages of the next daemon
    missing (so SGLang never read them; found by review)."""
    mount = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=PAGES)
    writer = make_fs(mount.path, pool)
    before, after = [key("before", i) for i in range(PAGES)], [key("after", i) for i in range(PAGES)]
    assert writer.batch_set_v1(before, indices(pool, range(PAGES))) == [True] * PAGES
    writer.close()
    asking = make_fs(mount.path, MHAHostPool(pages=PAGES))
    assert asking.batch_exists(before) == PAGES
    with hung_and_taken_down(mount_factory, mount):
        writer = make_fs(mount.path, pool)
        assert writer.batch_set_v1(after, indices(pool, range(PAGES))) == [True] * PAGES
        writer.close()
        wait_until(lambda: asking.batch_exists(after) == PAGES and asking.batch_exists(before) == 0)
    asking.close()


def test_handles_left_at_a_hung_daemon_do_not_make_the_client_let_go_of_the_next_one(mount_factory, monkeypatch):
    """After a hung daemon is taken down and the client serves from the next one, each other
    thread's plane handle still open at the hung daemon meets its aborted connection once: that
    says nothing of the next daemon, whose memory the client must keep (it let go of it and
    mapped it again, once per such thread; found by review)."""
    threads = 6
    mount = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=PAGES * threads)
    client = make_fs(mount.path, pool)
    go, first, done = threading.Event(), [], []

    def writer(t: int) -> None:  # a batch at the first daemon, the next at the next one
        mine = indices(pool, range(PAGES * t, PAGES * (t + 1)))
        first.append(client.batch_set_v1([key(f"first {t}", i) for i in range(PAGES)], mine))
        go.wait(60)
        done.append(client.batch_set_v1([key(f"next {t}", i) for i in range(PAGES)], mine))

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    wait_until(lambda: len(first) == threads)
    client.settle()
    assert first == [[True] * PAGES] * threads
    try:
        with hung_and_taken_down(mount_factory, mount):
            probe = [key("probe", i) for i in range(PAGES)]
            wait_until(lambda: client.batch_set_v1(probe, indices(pool, range(PAGES))) == [True] * PAGES
                       and client.settle() is None and client.batch_exists(probe) == PAGES)
            attached = []
            made = plane_index.Attachment
            monkeypatch.setattr(plane_module, "Attachment", lambda *args: attached.append(1) or made(*args))
            go.set()
            for worker in workers:
                worker.join(30)
            client.settle()
            assert done == [[True] * PAGES] * threads
            assert attached == []  # the next daemon's memory was kept
            assert client.batch_exists([key(f"next {t}", i) for t in range(threads) for i in range(PAGES)]) == threads * PAGES
    finally:
        go.set()
    client.close()


def test_reads_made_at_a_daemon_are_never_counted_by_the_next_one(mount_factory, monkeypatch):
    """Reads are reported as index rows, which the next daemon numbers afresh: reads still
    unreported when the daemon restarts must not count as hits of the next daemon's pages."""
    monkeypatch.setattr(plane_reports, "REPORT_INTERVAL_S", 60.0)  # the reads stay unreported
    mount = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=2 * PAGES)
    client = make_fs(mount.path, pool)
    keys = [key("before", i) for i in range(PAGES)]
    assert client.batch_set_v1(keys, indices(pool, range(PAGES))) == [True] * PAGES
    client.settle()
    assert client.batch_get_v1(keys, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
    mounting.kill(mount)
    mount_factory("--memory", "64M", path=mount.path)
    writer = make_fs(mount.path, MHAHostPool(pages=PAGES))
    others = [key("after", i) for i in range(PAGES)]  # in the rows the first daemon's pages had
    assert writer.batch_set_v1(others, indices(writer.mem_pool_host, range(PAGES))) == [True] * PAGES
    writer.close()
    wait_until(lambda: client.batch_exists(others) == PAGES)  # attached to the next daemon
    client.close()  # sends what it had not reported
    assert mount.stats()["hits"] == 0


def test_a_write_returns_before_its_commit_and_this_process_sees_its_pages_at_once(mounted, monkeypatch):
    pool = MHAHostPool(pages=2 * PAGES)
    writer = make_fs(mounted.path, pool)
    first = [key("behind", i) for i in range(PAGES)]
    assert writer.batch_set_v1(first, indices(pool, range(PAGES))) == [True] * PAGES  # its commit makes the pool
    writer.settle()
    released = hold_back_commits(monkeypatch)
    second = [key("behind", i) for i in range(PAGES, 2 * PAGES)]
    published = mounted.stats()["published"]
    assert writer.batch_set_v1(second, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
    page = mounted.path / writer._dir_of("kv") / second[0]
    assert not page.exists() and mounted.stats()["published"] == published  # not committed yet
    target = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, target)  # another client of this process
    got = []
    reading = threading.Thread(target=lambda: got.append(reader.batch_get_v1(second, indices(target, range(PAGES)))))
    reading.start()
    reading.join(0.3)
    assert reading.is_alive()  # waits for the commit under way: never a miss of a page written
    released.set()
    reading.join(10)
    assert got == [[True] * PAGES]
    assert [page_bytes(target, i) for i in range(PAGES)] == [page_bytes(pool, PAGES + i) for i in range(PAGES)]
    assert page.exists() and mounted.stats()["published"] == published + PAGES


def test_get_stats_answers_while_a_commit_is_under_way(mounted, monkeypatch):
    """SGLang calls get_stats on its scheduler thread every step (storage metrics on): it must not
    wait for the commits sent behind the backups; their pages are counted at a later call."""
    pool = MHAHostPool(pages=2 * PAGES)
    writer = make_fs(mounted.path, pool, metrics=True)
    assert writer.batch_set_v1([key("stats", i) for i in range(PAGES)], indices(pool, range(PAGES))) == [True] * PAGES
    writer.settle()
    released = hold_back_commits(monkeypatch)
    second = [key("stats", i) for i in range(PAGES, 2 * PAGES)]
    assert writer.batch_set_v1(second, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
    got = []
    asking = threading.Thread(target=lambda: got.append(writer.get_stats()))
    asking.start()
    asking.join(5)
    still_held = not released.is_set()
    released.set()
    asking.join(10)
    assert still_held and got and got[0].backup_pgs == [PAGES, PAGES]
    assert got[0].counters["plane_writes"] == PAGES  # the held commit's pages are not in yet
    writer.settle()
    assert writer.get_stats().counters["plane_writes"] == 2 * PAGES
    writer.close()


def test_a_batch_written_while_the_last_ones_commit_is_under_way_does_not_wait_for_it(mounted, monkeypatch):
    """SGLang's backups come back to back: the second goes through the thread's second handle."""
    pool = MHAHostPool(pages=3 * PAGES)
    writer = make_fs(mounted.path, pool)
    batches = [[key("back to back", b, i) for i in range(PAGES)] for b in range(3)]
    assert writer.batch_set_v1(batches[0], indices(pool, range(PAGES))) == [True] * PAGES  # makes the pool
    writer.settle()
    released = threading.Event()
    send = Plane._commit_behind

    def held_back(plane, attachment, handle, state, rels, *args):
        if rels[0].endswith(batches[1][0]):
            released.wait(30)  # the first batch's commit, under way until the second returned
        return send(plane, attachment, handle, state, rels, *args)

    monkeypatch.setattr(Plane, "_commit_behind", held_back)
    returned = []

    def backups() -> None:  # one thread, as SGLang's backup thread
        for b in (1, 2):
            returned.append(writer.batch_set_v1(batches[b], indices(pool, range(b * PAGES, (b + 1) * PAGES))))

    thread = threading.Thread(target=backups)
    thread.start()
    try:
        wait_until(lambda: len(returned) == 2, timeout=10)
        assert returned == [[True] * PAGES] * 2 and not released.is_set()
    finally:
        released.set()
        thread.join(30)
    reader = make_fs(mounted.path, MHAHostPool(pages=PAGES))
    assert [reader.batch_exists(keys) for keys in batches] == [PAGES] * 3  # once the commits are answered
    writer.close()


def test_pages_a_write_was_told_stored_while_close_ran_are_stored(mounted):
    """``close`` racing writes whose commits go behind them: close retired the writing thread's
    busy handle, which then gave its slots back unpublished while the commit waited to be sent,
    its call told True (a race: 2 pages of 56 lost within 20 rounds on the development VM). For
    3 s of rounds, every page a call was told stored is stored."""
    pool = MHAHostPool(pages=8)
    checker = make_fs(mounted.path, pool)
    told, rounds, deadline = [], 0, time.monotonic() + 3
    while time.monotonic() < deadline:
        rounds += 1
        fs = make_fs(mounted.path, pool)
        fs.batch_set_v1([key("close race", rounds)], indices(pool, [0]))  # a new pool's first commit: waited for
        stop = threading.Event()

        def write(round_number=rounds):
            for n in range(10_000):
                if stop.is_set():
                    return
                keys = [key("close race", round_number, n, i) for i in range(2)]
                told.extend(k for k, stored in zip(keys, fs.batch_set_v1(keys, indices(pool, range(2)))) if stored)

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.001 * (rounds % 10))
        fs.close()
        stop.set()
        writer.join()
        fs.settle()
    assert rounds > 10 and told
    assert [k for k in told if not checker.exists(k)] == []
    checker.close()


def test_with_commit_behind_off_a_write_is_committed_when_it_returns(mounted, monkeypatch):
    monkeypatch.setattr(Plane, "_commit_behind", None)  # never sent behind
    pool = MHAHostPool(pages=PAGES)
    writer = make_fs(mounted.path, pool, extra={"commit_behind": False})
    for batch in range(3):
        keys = [key("in step", batch, i) for i in range(PAGES)]
        assert writer.batch_set_v1(keys, indices(pool, range(PAGES))) == [True] * PAGES
        assert all((mounted.path / writer._dir_of("kv") / k).exists() for k in keys)
    assert writer.statistics()["plane_writes"] == 3 * PAGES


def test_a_new_pools_first_batch_makes_it_through_the_plane_and_so_does_a_batch_after_rm_r(mounted):
    pool = MHAHostPool(pages=PAGES)
    writer = make_fs(mounted.path, pool)
    batches = [[key("new pool", batch, i) for i in range(PAGES)] for batch in range(2)]
    cost, got = requests_of(mounted, lambda: (writer.batch_set_v1(batches[0], indices(pool, range(PAGES))),
                                              writer.settle())[0])
    assert got == [True] * PAGES and "mkdir" not in cost  # the commit made the pool's directories
    assert writer.statistics()["plane_writes"] == PAGES
    pool_dir = mounted.path / writer._dir_of("kv")
    assert sorted(os.listdir(pool_dir)) == sorted(batches[0])
    subprocess.run(["rm", "-r", str(pool_dir.parent.parent)], check=True)  # an operator clears the shard
    assert writer.batch_set_v1(batches[1], indices(pool, range(PAGES))) == [True] * PAGES
    writer.settle()
    assert sorted(os.listdir(pool_dir)) == sorted(batches[1])
    reader = make_fs(mounted.path, MHAHostPool(pages=PAGES))
    assert reader.batch_exists(batches[1]) == PAGES and reader.batch_exists(batches[0]) == 0
    assert writer.statistics()["plane_writes"] == 2 * PAGES


def test_a_clear_waits_for_commits_under_way_so_no_page_comes_back_after_it(mounted, monkeypatch):
    pool = MHAHostPool(pages=2 * PAGES)
    writer = make_fs(mounted.path, pool)
    first = [key("cleared", i) for i in range(PAGES)]
    assert writer.batch_set_v1(first, indices(pool, range(PAGES))) == [True] * PAGES  # makes the pool
    send = Plane._commit_behind

    def slow(plane, *args):  # a commit queued behind others on the client's sender threads
        time.sleep(0.3)
        return send(plane, *args)

    monkeypatch.setattr(Plane, "_commit_behind", slow)
    second = [key("cleared", i) for i in range(PAGES, 2 * PAGES)]
    assert writer.batch_set_v1(second, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
    assert writer.clear()
    writer.settle()
    assert not (mounted.path / writer._dir_of("kv")).exists()
    reader = make_fs(mounted.path, MHAHostPool(pages=PAGES))
    assert reader.batch_exists(first) == 0 and reader.batch_exists(second) == 0


def test_a_writer_whose_request_failed_copies_nothing_into_the_slots_the_daemon_took_back(mounted, monkeypatch):
    """Writer 1's reservation fails (its write is cut short), so its handle is dropped and the
    daemon takes back the slots it held ready; writer 2 gets them at once. Writer 1 must not
    copy its pages into them: writer 2's pages read back as writer 2 wrote them."""
    size, pool_dir = 128 << 10, "m/f/tp0of1/kv"
    first, second, reader = PageIO(str(mounted.path)), PageIO(str(mounted.path)), PageIO(str(mounted.path))

    def page(tag: int, i: int):
        return [memoryview(bytearray(bytes([tag, i % 256]) * (size // 2)))]

    ours = [f"{i:064x}" for i in range(80)]
    theirs = [f"{i + 1000:064x}" for i in range(64)]
    assert first.publish_pages(pool_dir, ours[:8], [page(1, i) for i in range(8)], size) == [True] * 8
    handle = first.plane.handles._mine()[plane_module.PLANE_FILE]
    assert handle.state.ready  # slots held ready for its next batch
    send = plane_module._pwrite_all

    def cut_short(fd, data):  # writer 1's next reservation is not taken whole
        if fd == handle.fd and struct.unpack_from("<H", data, 4)[0] == plane_module.RESERVE:
            monkeypatch.setattr(plane_module, "_pwrite_all", send)
            return 0
        return send(fd, data)

    monkeypatch.setattr(plane_module, "_pwrite_all", cut_short)
    drop = first.plane.handles.drop
    others = []

    def dropped(failed):  # the daemon takes the slots back; writer 2 publishes into them at once
        drop(failed)
        if not others:
            others.append(second.publish_pages(pool_dir, theirs, [page(2, i) for i in range(64)], size))
            second.plane.settle()

    monkeypatch.setattr(first.plane.handles, "drop", dropped)
    first.publish_pages(pool_dir, ours[8:], [page(1, i) for i in range(8, 80)], size)
    first.plane.settle()
    assert others == [[True] * 64]
    buffers = [bytearray(size) for _ in theirs]
    got = reader.plane.read_pages([f"{pool_dir}/{k}" for k in theirs], [[memoryview(b)] for b in buffers], size)
    assert got == [True] * 64
    assert [bytes(b) for b in buffers] == [bytes(page(2, i)[0]) for i in range(64)]
    for client in (first, second, reader):
        client.close()


def test_a_batch_whose_commit_cannot_be_sent_behind_is_committed_by_the_call(mounted):
    """The client's sender threads shut down (by a close on another thread, or at exit) just
    before a batch's commit is handed to them: the call commits it itself, nothing waits for
    a commit that never comes."""
    pool = MHAHostPool(pages=2 * PAGES)
    writer = make_fs(mounted.path, pool)
    first = [key("no sender", i) for i in range(PAGES)]
    assert writer.batch_set_v1(first, indices(pool, range(PAGES))) == [True] * PAGES  # makes the pool
    writer.io.plane._sender().shutdown(wait=True)
    second = [key("no sender", i) for i in range(PAGES, 2 * PAGES)]
    assert writer.batch_set_v1(second, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
    settled = threading.Thread(target=writer.settle, daemon=True)
    settled.start()
    settled.join(5)
    assert not settled.is_alive()
    reader = make_fs(mounted.path, MHAHostPool(pages=PAGES))
    assert reader.batch_exists(second) == PAGES
    writer.close()


def test_a_forked_child_and_its_parent_write_into_slots_of_their_own(mounted):
    """A child forked from a writer inherits its handle on the plane file, with the slots held
    ready for its next batch: both then write a batch, and each page reads back as its writer
    wrote it."""
    size, pool_dir = 64 << 10, "m/f/tp0of1/kv"
    io = PageIO(str(mounted.path))
    assert io.publish_pages(pool_dir, ["0" * 64], [[memoryview(b"\x01" * size)]], size) == [True]
    io.plane.settle()
    child_keys, parent_keys = [f"c{i:063x}" for i in range(4)], [f"p{i:063x}" for i in range(4)]
    child = os.fork()
    if child == 0:
        try:
            ok = io.publish_pages(pool_dir, child_keys, [[memoryview(b"\xcc" * size)]] * 4, size)
            io.plane.settle()
            os._exit(0 if ok == [True] * 4 else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 20
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the forked child did not finish its batch")
        time.sleep(0.05)
    assert io.publish_pages(pool_dir, parent_keys, [[memoryview(b"\xaa" * size)]] * 4, size) == [True] * 4
    io.plane.settle()
    reader = PageIO(str(mounted.path))
    buffers = [bytearray(size) for _ in range(8)]
    got = reader.plane.read_pages([f"{pool_dir}/{k}" for k in child_keys + parent_keys],
                                  [[memoryview(b)] for b in buffers], size)
    assert got == [True] * 8
    assert [bytes(b) for b in buffers] == [b"\xcc" * size] * 4 + [b"\xaa" * size] * 4
    reader.close()
    io.close()


def client_locks(client) -> list:
    """Every lock reachable from a client object through the client's own objects."""
    kinds = (type(threading.Lock()), type(threading.RLock()), threading.Condition)
    found, seen, todo = [], set(), [client]
    while todo:
        thing = todo.pop()
        if id(thing) in seen:
            continue
        seen.add(id(thing))
        if isinstance(thing, kinds):
            found.append(thing)
        elif isinstance(thing, dict):
            todo += list(thing.values())
        elif isinstance(thing, (list, tuple, set)):
            todo += list(thing)
        elif type(thing).__module__.startswith("hicachefs_client"):
            todo += list(getattr(thing, "__dict__", {}).values()) + list(vars(type(thing)).values())
    return found


def test_a_child_forked_while_another_thread_holds_the_clients_locks_can_use_the_client(mounted):
    """A lock that another thread holds at a fork stays held in the child: a child forked while
    a thread was inside a call hung at its first call (the layout's and the counters' locks)."""
    pool = MHAHostPool(pages=2 * PAGES)
    client = make_fs(mounted.path, pool)
    keys = [key("fork", i) for i in range(PAGES)]
    assert client.batch_set_v1(keys, indices(pool, range(PAGES))) == [True] * PAGES
    client.settle()
    locks = client_locks(client)
    assert len(locks) >= 6

    def calls() -> bool:
        more = [key("fork child", i) for i in range(PAGES)]
        return (client.batch_exists(keys) == PAGES
                and client.batch_get_v1(keys, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
                and client.batch_set_v1(more, indices(pool, range(PAGES))) == [True] * PAGES)

    assert forked_while_held(locks, calls) == 0, "the child's calls failed or hung"
    client.close()


def test_a_batch_whose_copy_raises_gives_its_slots_back(mounted):
    size, pool_dir = 64 << 10, "m/f/tp0of1/kv"
    io = PageIO(str(mounted.path))
    assert io.publish_pages(pool_dir, ["0" * 64], [[memoryview(b"\x01" * size)]], size) == [True]
    io.plane.settle()
    used = mounted.stats()["tiers"]["memory"]["used_bytes"]  # the page, its mailbox, slots held ready
    with pytest.raises(TypeError):
        io.publish_pages(pool_dir, ["a" * 64, "b" * 64], [[memoryview(b"\x02" * size)], [None]], size)
    assert mounted.stats()["tiers"]["memory"]["used_bytes"] == used - 2 * size  # the batch's two slots came back
    io.close()


def test_pages_whose_daemon_dies_before_their_commit_are_counted_and_nothing_hangs(mount_factory, monkeypatch):
    mount = mount_factory("--memory", "256M")
    pool = MHAHostPool(pages=PAGES)
    writer = make_fs(mount.path, pool)
    assert writer.batch_set_v1([key("dies", 0, i) for i in range(PAGES)], indices(pool, range(PAGES))) == [True] * PAGES
    writer.settle()
    released = hold_back_commits(monkeypatch)
    assert writer.batch_set_v1([key("dies", 1, i) for i in range(PAGES)], indices(pool, range(PAGES))) == [True] * PAGES
    mounting.kill(mount)
    released.set()
    stats = writer.statistics()  # once the commit failed: the pages were lost with the daemon's RAM
    assert stats["write_failures"] == PAGES and stats["plane_writes"] == PAGES
    writer.close()


def test_a_writer_whose_batches_shrink_holds_no_more_slots_than_it_reserves_ahead(mounted):
    big, small = 32, 1
    pool = MHAHostPool(pages=big, head_num=8, head_dim=64)  # pages of 128 KiB
    size = len(page_bytes(pool, 0))
    memory = lambda: mounted.stats()["tiers"]["memory"]["used_bytes"]  # noqa: E731
    before = memory()  # (a client gets ready for its pools when they are registered)
    writer = make_fs(mounted.path, pool)
    written = 0
    for cycle in range(6):
        for count in (big, small):
            keys = [key("shrink", cycle, count, i) for i in range(count)]
            assert writer.batch_set_v1(keys, indices(pool, range(count))) == [True] * count
            written += count
    writer.settle()
    held = memory() - before - written * size  # what the writer's handles hold beyond its pages
    # Its slots ahead and mailbox, on each of its two handles (a batch sent while the other's
    # commit is under way goes through the second).
    assert 0 < held <= 2 * (MIN_AHEAD_BYTES + big * size + (256 << 10))
    writer.close()
    wait_until(lambda: memory() - before == written * size, timeout=5)  # all given back


def test_a_commit_makes_only_pools_of_good_names(mounted):
    """A raw commit with MAKE_POOLS: a good path gets its pool made, a path with a reserved name
    or too few levels is refused, makes nothing and gives its slot back."""
    used = mounted.stats()["tiers"]["memory"]["used_bytes"]
    control = mounted.path / ".hicachefs"
    plane_fd = os.open(control / "plane", os.O_RDWR)
    arena = os.open(control / "arena", os.O_RDWR)
    try:
        def request(op, flags, count, body, answer_bytes):
            os.pwrite(plane_fd, struct.pack("<4sHHIIQ", b"HCPQ", op, flags, count, len(body), 1) + body, 0)
            return os.pread(plane_fd, 24 + answer_bytes, 0)[24:]

        outcomes = []
        for path in ("m/fmt/tp0of1/kv/" + "a" * 64, "m/.fmt/tp0of1/kv/" + "b" * 64, "m/fmt/kv/" + "c" * 64):
            slot = struct.unpack("<q", request(2, 0, 1, struct.pack("<I", 4096), 8))[0]
            os.pwrite(arena, b"x" * 4096, slot)
            entry = struct.pack("<qQIH", slot, xxhash.xxh3_64_intdigest(b"x" * 4096), 4096, len(path)) + path.encode()
            outcomes.append(struct.unpack("<i", request(3, 1 | 4, 1, entry + struct.pack("<I", 0), 4))[0])
    finally:
        os.close(plane_fd)
        os.close(arena)
    assert outcomes[0] == 0 and outcomes[1] == -errno.EINVAL and outcomes[2] < 0
    assert (mounted.path / "m/fmt/tp0of1/kv" / ("a" * 64)).read_bytes() == b"x" * 4096
    assert sorted(os.listdir(mounted.path / "m")) == ["fmt"] and os.listdir(mounted.path / "m/fmt") == ["tp0of1"]
    assert mounted.stats()["tiers"]["memory"]["used_bytes"] == used + 4096  # the published page only


def test_keys_that_are_no_strings_are_refused_by_existence_through_the_plane(mounted):
    """SGLang's keys are strings; a caller's None, number or bytes is a refused key, counted,
    and the valid keys before it still answer from the plane."""
    pool, keys = written(mounted, pages=2, prefix="typed")
    reader = make_fs(mounted.path, MHAHostPool(pages=2))
    assert reader.batch_exists([keys[0], None, keys[1]]) == 1
    assert reader.batch_exists([7, keys[0]]) == 0
    assert reader.batch_exists([keys[0], keys[1], keys[0].encode()]) == 2
    assert reader.batch_exists_v2([keys[0], None]).kv_hit_pages == 1
    assert reader.statistics()["refused_keys"] >= 4
    assert reader.batch_exists(keys) == 2


def test_a_batch_larger_than_the_writing_share_is_stored_whole(mount_factory, monkeypatch):
    """Of a batch of 128 MiB on a mount whose files being written may hold 64 MiB, the plane
    takes what it can reserve and the ingest file the rest: that waits for the plane's commit
    (held back here), whose slots hold the share until it is answered, instead of being refused
    ENOSPC."""
    mount = mount_factory("--memory", "128M")
    pages = 128
    pool = MHAHostPool(pages=pages, head_num=8, head_dim=256)  # pages of 1 MiB
    writer = make_fs(mount.path, pool)
    send = Plane._commit_behind

    def held_back(plane, *args):
        time.sleep(0.5)
        return send(plane, *args)

    assert writer.batch_set_v1([key("first")], indices(pool, range(1))) == [True]  # makes the pool (waited for)
    monkeypatch.setattr(Plane, "_commit_behind", held_back)
    keys = [key("larger", i) for i in range(pages)]
    assert writer.batch_set_v1(keys, indices(pool, range(pages))) == [True] * pages
    stats = writer.statistics()
    assert stats["write_failures"] == 0 and 1 < stats["plane_writes"] < pages + 1
    writer.close()


def test_a_page_a_write_batch_evicted_is_gone_from_the_kernel_when_the_batch_returns(mount_factory):
    mount = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=PAGES, head_num=8, head_dim=64)  # pages of 128 KiB
    writer = make_fs(mount.path, pool)
    directory = mount.path / writer._dir_of("kv")
    first = [key("first", i) for i in range(PAGES)]
    assert writer.batch_set_v1(first, indices(pool, range(PAGES))) == [True] * PAGES
    writer.settle()
    assert all(os.stat(directory / k).st_size == len(page_bytes(pool, 0)) for k in first)  # the kernel knows them
    for batch in range(64):  # 64 MiB more through a RAM tier of 64 MiB: the first pages go
        assert writer.batch_set_v1([key("more", batch, i) for i in range(PAGES)],
                                   indices(pool, range(PAGES))) == [True] * PAGES
        writer.settle()  # its commit answered
        evicted = [k for k in first if writer.batch_exists([k]) == 0]  # the index's word
        assert not [k for k in evicted if os.path.exists(directory / k)]  # none still seen
    assert mount.stats()["tiers"]["memory"]["evictions"] >= PAGES


def test_legacy_get_sees_a_page_whose_commit_is_under_way_in_this_process(mounted, monkeypatch):
    """Every client of the mount in the same process sees a written page at once (contract,
    "The commit is sent behind the call"), through ``get``/``batch_get`` too: SGLang's generic
    page path reads a page file, which did not wait for this process's commits under way (a
    miss for a page batch_set_v1 had just reported stored)."""
    pages = 4
    pool = MHAHostPool(pages=2 * pages)
    writer, _ = stored_and_settled(mounted.path, pool, "legacy", pages)
    released = hold_back_commits(monkeypatch)
    second = [key("legacy", i) for i in range(pages, 2 * pages)]
    assert writer.batch_set_v1(second, indices(pool, range(pages, 2 * pages))) == [True] * pages
    reader = make_fs(mounted.path, MHAHostPool(pages=pages))
    got = []
    target = reader.mem_pool_host.get_dummy_flat_data_page()
    reading = threading.Thread(target=lambda: got.append(reader.get(second[1], target)))
    reading.start()
    reading.join(0.3)
    released.set()
    reading.join(10)
    assert got and got[0] is not None  # a read waits for it, as exists and batch_get_v1 do
    assert got[0].view(torch.uint8).numpy().tobytes() == page_bytes(pool, pages + 1)
    writer.close()
    reader.close()


def test_a_client_naming_the_mount_through_a_symbolic_link_sees_a_page_whose_commit_is_under_way(
        mounted, monkeypatch, tmp_path):
    """The commits under way were kept per spelling of the mountpoint: a second client of the
    process given the mount through a symbolic link missed nearly every page the first had just
    reported stored (found by review: 6,368 of 6,400)."""
    pages = 4
    pool = MHAHostPool(pages=2 * pages)
    writer, first = stored_and_settled(mounted.path, pool, "link", pages)
    link = tmp_path / "link-to-mount"
    link.symlink_to(mounted.path)
    reader = make_fs(link, MHAHostPool(pages=pages))
    assert reader.batch_exists(first) == pages
    released = hold_back_commits(monkeypatch)
    second = [key("link", i) for i in range(pages, 2 * pages)]
    assert writer.batch_set_v1(second, indices(pool, range(pages, 2 * pages))) == [True] * pages
    found = []
    asking = threading.Thread(target=lambda: found.append(reader.batch_exists(second)))
    asking.start()
    asking.join(0.3)
    released.set()
    asking.join(10)
    assert found == [pages]  # it waited for the commit, as a client naming the mount alike does
    writer.close()
    reader.close()


def test_a_client_of_one_mount_waits_for_no_commit_to_another(mount_factory, monkeypatch):
    """The commits under way were kept in one record for the process (beb857d): while a commit
    to mount A was not answered (its daemon hung), a client of healthy mount B waited on it for
    pages of the same names, and at its close, for good (found by review)."""
    a, b = mount_factory("--memory", "64M"), mount_factory("--memory", "64M")
    pages = 4
    pool = MHAHostPool(pages=2 * pages)
    names = [key("two mounts", i) for i in range(2 * pages)]
    on_a, on_b = make_fs(a.path, pool), make_fs(b.path, pool)
    for client in (on_a, on_b):  # the pools made (a pool's first commit is waited for)
        assert client.batch_set_v1(names[:pages], indices(pool, range(pages))) == [True] * pages
        client.settle()
    released = hold_back_commits(monkeypatch)  # A's commit never answered meanwhile, as by a hung daemon
    try:
        assert on_a.batch_set_v1(names[pages:], indices(pool, range(pages, 2 * pages))) == [True] * pages
        reader = make_fs(b.path, MHAHostPool(pages=pages))
        answers = []
        asking = threading.Thread(target=lambda: answers.append((reader.batch_exists(names), on_b.close())))
        asking.start()
        asking.join(5)
        assert answers == [(pages, None)]  # B's own pages, at once; and B's writer closed
        reader.close()
    finally:
        released.set()
    on_a.close()


def test_a_clear_through_one_client_waits_for_another_clients_commits_to_the_mount(mounted, monkeypatch):
    """A clear waits for this process's commits under way to the mount, whichever client sent
    them: one answered after the rm -r brought its pages back (found by review of 75602af,
    which had a client wait only for the daemons it sent to itself)."""
    pages = 4
    pool = MHAHostPool(pages=2 * pages)
    names = [key("clear", i) for i in range(2 * pages)]
    writer, _ = stored_and_settled(mounted.path, pool, "clear", pages)
    released = hold_back_commits(monkeypatch)
    assert writer.batch_set_v1(names[pages:], indices(pool, range(pages, 2 * pages))) == [True] * pages
    other = make_fs(mounted.path, MHAHostPool(pages=pages))  # never wrote: sent no commit
    cleared = []
    clearing = threading.Thread(target=lambda: cleared.append(other.clear()))
    clearing.start()
    clearing.join(0.5)
    assert cleared == []  # waiting for the writer's commit
    released.set()
    clearing.join(10)
    writer.settle()
    assert cleared == [True]
    assert [other.exists(name) for name in names] == [False] * len(names)
    for client in (writer, other):
        client.close()


def test_a_client_closes_while_its_mounts_new_daemon_hangs(mount_factory):
    """A close waits for this process's commits under way, and touches nothing of the mount:
    its daemon restarted, and the new one hung, a close that looked for the mount's daemon
    (to wait for its commits) hung on it for good (found by review of d1d8832)."""
    mount = mount_factory("--memory", "64M")
    client, _ = stored_and_settled(mount.path, MHAHostPool(pages=4), "hung", 4)
    mounting.stop(mount)
    again = mount_factory("--memory", "64M", path=mount.path)
    os.kill(again.pid, signal.SIGSTOP)
    try:
        closing = threading.Thread(target=client.close, daemon=True)
        closing.start()
        closing.join(5)
        assert not closing.is_alive()
    finally:
        os.kill(again.pid, signal.SIGCONT)


def test_a_disk_page_the_plane_cannot_read_is_read_by_the_daemon_and_the_rest_of_the_run_by_the_plane(
        mount_factory, tmp_path, monkeypatch):
    """One page of the disk tier whose read fails in the client (EIO from the disk file) is
    asked of the daemon, and the other pages of its run are still the plane's: the error used to
    end the whole run, and every page of it was a miss."""
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "disk"), "--disk-size", "256M")
    shape = dict(head_num=8, head_dim=64)  # 128 KiB pages: 256 of them are twice the RAM tier
    source = MHAHostPool(pages=256, **shape)
    keys = [key("disk", i) for i in range(256)]
    writer = make_fs(mount.path, source)
    for first in range(0, 256, 32):
        assert writer.batch_set_v1(keys[first:first + 32], indices(source, range(first, first + 32))) == [True] * 32
    writer.close()
    directory = mount.path / writer._dir_of("kv")
    assert all(os.getxattr(directory / k, "user.hicachefs.tier") == b"disk" for k in keys[:8])
    target = MHAHostPool(pages=8, **shape)
    reader = make_fs(mount.path, target)
    read_into = plane_index.read_into
    failed = []

    def failing(fd, buffers, offset):
        if not failed:
            failed.append(offset)
            raise OSError(errno.EIO, "a bad block")
        return read_into(fd, buffers, offset)

    monkeypatch.setattr(plane_index, "read_into", failing)
    assert reader.batch_get_v1(keys[:8], indices(target, range(8))) == [True] * 8
    assert failed and all(page_bytes(target, i) == page_bytes(source, i) for i in range(8))
    assert reader.statistics()["plane_reads"] == 7
    reader.close()


def test_a_restart_is_not_logged_again_by_each_threads_first_request_on_its_old_plane_handle(
        mount_factory, caplog):
    """Each thread keeps its handle on the plane file. After the daemon was killed and a new one
    mounted, each thread's first request failed on its old handle with ENOTCONN, and was logged
    as a failure once per thread (a call of another thread worked in between), though a restart
    is expected and logged once already."""
    mount = mount_factory("--memory", "64M")
    io = PageIO(str(mount.path))
    size = 64 << 10
    threads = [ThreadPoolExecutor(1) for _ in range(4)]  # four threads that live through the restart

    def work(thread, round_):
        keys = [f"{thread:02x}{round_:02x}{i:060x}" for i in range(4)]
        pages = [[memoryview(bytearray([thread + 1]) * size)] for _ in keys]
        assert io.publish_pages("m/f/tp0of1/kv", keys, pages, size) == [True] * 4
        assert io.read_pages([f"m/f/tp0of1/kv/{k}" for k in keys], pages, size) == [True] * 4

    try:
        for thread, executor in enumerate(threads):
            executor.submit(work, thread, 0).result()
        with caplog.at_level(logging.INFO, logger="hicachefs_client"):
            os.kill(mount.pid, signal.SIGKILL)  # by its PID
            assert mounting.wait_gone(mount.pid, 10)
            mounting.unmount_path(mount.path)
            mount_factory("--memory", "64M", path=mount.path)
            for thread, executor in enumerate(threads):  # one after the other: each met its old handle
                executor.submit(work, thread, 1).result()
        lost = [r.getMessage() for r in caplog.records if "ENOTCONN" in r.getMessage()
                or "ECONNABORTED" in r.getMessage()]
        assert not lost
        assert [r for r in caplog.records if "went away" in r.getMessage()]  # the restart, logged once
    finally:
        for executor in threads:
            executor.shutdown()
        io.close()
