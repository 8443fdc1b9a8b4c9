"""The data plane on a real mount (``client/plane.py``): reads and existence cost the daemon no
request, a batch written costs one, only the store's writers may use it, a writer that dies
mid-batch publishes nothing, and a daemon killed under the client is never trusted again, while
the same client serves from the next daemon within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hicachefs_testing import mounting
from hicachefs_testing.host_pools import MHAHostPool, page_bytes
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


def test_reads_and_existence_ask_the_daemon_nothing(mounted):
    source, keys = written(mounted)
    target = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, target)
    assert reader.batch_exists(keys) == PAGES  # the first call asks the pool directory's number
    target.zero()
    cost, got = requests_of(mounted, lambda: (reader.batch_exists(keys),
                                              reader.batch_get_v1(keys, indices(target, range(PAGES)))))
    assert got == (PAGES, [True] * PAGES) and not cost
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


def test_a_batch_written_costs_one_request_of_the_plane_file(mounted):
    pool = MHAHostPool(pages=3 * PAGES)
    writer = make_fs(mounted.path, pool)
    first = [key("batch", i) for i in range(PAGES)]
    assert writer.batch_set_v1(first, indices(pool, range(PAGES))) == [True] * PAGES  # makes the pool
    second = [key("batch", i) for i in range(PAGES, 2 * PAGES)]
    assert writer.batch_set_v1(second, indices(pool, range(PAGES, 2 * PAGES))) == [True] * PAGES
    third = [key("batch", i) for i in range(2 * PAGES, 3 * PAGES)]
    cost, got = requests_of(mounted, lambda: writer.batch_set_v1(third, indices(pool, range(2 * PAGES, 3 * PAGES))))
    assert got == [True] * PAGES
    assert cost == {"write": 1}  # the commit; its answer is read from the handle's mailbox in the arena
    cost, got = requests_of(mounted, lambda: writer.batch_set_v1(third, indices(pool, range(2 * PAGES, 3 * PAGES))))
    assert got == [True] * PAGES and not cost  # pages the index holds are kept without asking
    target = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, target)
    assert reader.batch_get_v1(third, indices(target, range(PAGES))) == [True] * PAGES
    assert [page_bytes(target, i) for i in range(PAGES)] == [page_bytes(pool, 2 * PAGES + i) for i in range(PAGES)]
    assert writer.statistics()["plane_writes"] == 2 * PAGES


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
