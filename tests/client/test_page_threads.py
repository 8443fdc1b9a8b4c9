"""A batch's pages moved on several threads (extra_config ``read_threads``, ``write_threads``), in runs
of pages of at least ``MIN_CHUNK_BYTES`` each (``MIN_PLANE_CHUNK_BYTES`` through the data plane): the same bytes, failures per page (or per run, for an
unexpected exception), nothing raised into SGLang, safe from many SGLang threads at once."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hicachefs_client import HiCacheFS, backend, plane, plane_arena
from hicachefs_client.page_threads import PageThreads
from hicachefs_testing.host_pools import MHAHostPool, MLAHostPool, page_bytes
from storage_configs import storage_config
from pages import requests_of
from test_backend import indices, key, make_fs

THREADS = {"read_threads": 4, "write_threads": 3}
PAGES = 24


def pool_dir(fs: HiCacheFS):
    return fs.io.path(fs._dir_of("kv"))


@pytest.fixture
def small_runs(monkeypatch):
    """Runs of one page at least, so that a batch of the tests' small pages is spread over the
    threads as a batch of large pages is."""
    monkeypatch.setattr(backend, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(backend, "MIN_PLANE_CHUNK_BYTES", 1)


@pytest.mark.parametrize("kind, layout", [("mha", "page_first"), ("mla", "page_first"),
                                          ("mha", "layer_first")])  # zero copy, zero copy, copied
def test_batch_round_trip_on_several_threads(store_root, kind, layout, monkeypatch, small_runs):
    pool_class = MHAHostPool if kind == "mha" else MLAHostPool
    source = pool_class(pages=PAGES, layout=layout)
    writer = make_fs(store_root, source, mla=kind == "mla", extra=THREADS)
    keys = [key("threads", kind, layout, i) for i in range(PAGES)]
    order = list(reversed(range(PAGES)))  # host slots in another order than the keys
    assert writer.batch_set_v1(keys, indices(source, order)) == [True] * PAGES

    target = pool_class(pages=PAGES, layout=layout)
    target.zero()
    reader = make_fs(store_root, target, mla=kind == "mla", extra=THREADS)
    threads_used = set()
    spread = threading.Event()  # a second thread has taken a run
    read_pages = reader.io.read_pages

    def recording(*args, **kwargs):
        threads_used.add(threading.get_ident())
        if len(threads_used) > 1:
            spread.set()
        elif not spread.wait(10):  # the first run waits for another thread to take one
            spread.set()  # none came: the rest go on, and the test fails below
        return read_pages(*args, **kwargs)

    monkeypatch.setattr(reader.io, "read_pages", recording)
    assert reader.batch_get_v1(keys, indices(target, range(PAGES))) == [True] * PAGES
    for slot, page in enumerate(order):
        assert page_bytes(target, slot) == page_bytes(source, page)
    assert len(threads_used) > 1
    assert reader.statistics()["hits"] == PAGES


def test_failures_are_per_page(store_root):
    pool = MHAHostPool(pages=PAGES)
    fs = make_fs(store_root, pool, extra=THREADS)
    keys = [key("partial", i) for i in range(PAGES)]
    stored = [i for i in range(PAGES) if i % 3]
    assert fs.batch_set_v1([keys[i] for i in stored], indices(pool, stored)) == [True] * len(stored)
    # One stored page of the wrong size: a miss of its own, not of its neighbours.
    short = pool_dir(fs) + f"/{keys[4]}"
    tmp = pool_dir(fs) + "/.short"
    with open(tmp, "wb") as f:
        f.write(b"x" * 100)
    os.rename(tmp, short)

    target = MHAHostPool(pages=PAGES)
    target.zero()
    reader = make_fs(store_root, target, extra=THREADS)
    got = reader.batch_get_v1(keys, indices(target, range(PAGES)))
    assert got == [i % 3 != 0 and i != 4 for i in range(PAGES)]
    for i in range(PAGES):
        if got[i]:
            assert page_bytes(target, i) == page_bytes(pool, i)
    stats = reader.statistics()
    assert stats["hits"] == len(stored) - 1 and stats["misses"] == PAGES - len(stored) + 1


def test_an_unexpected_exception_fails_its_run_of_pages_only(store_root, monkeypatch, small_runs):
    pool = MHAHostPool(pages=PAGES)
    fs = make_fs(store_root, pool, extra=THREADS)  # 3 write threads: runs of 8 pages
    keys = [key("raising", i) for i in range(PAGES)]
    if fs.io.plane_attached():
        # Through the data plane a batch is one commit, its copies spread over the threads in
        # runs: a run that raises leaves its pages not copied yet to the other way.
        checksum, ninth = plane.page_checksum, page_bytes(pool, 9)[:64]

        def failing_checksum(buffers):
            if bytes(buffers[0][:64]) == ninth:
                raise RuntimeError("injected")
            return checksum(buffers)

        monkeypatch.setattr(plane, "page_checksum", failing_checksum)
        assert fs.batch_set_v1(keys, indices(pool, range(PAGES))) == [True] * PAGES
        monkeypatch.setattr(plane, "page_checksum", checksum)
    else:
        publish = fs.io.publish_pages

        def failing_publish(rel_dir, page_keys, *args):
            if keys[9] in page_keys:
                raise RuntimeError("injected")
            return publish(rel_dir, page_keys, *args)

        monkeypatch.setattr(fs.io, "publish_pages", failing_publish)
        assert fs.batch_set_v1(keys, indices(pool, range(PAGES))) == [not 8 <= i < 16 for i in range(PAGES)]

    read = fs.io.read_pages  # 4 read threads: runs of 6 pages

    def failing_read(rels, *args):
        if any(rel.endswith(keys[2]) for rel in rels):
            raise MemoryError("injected")
        return read(rels, *args)

    monkeypatch.setattr(fs.io, "read_pages", failing_read)
    got = fs.batch_get_v1(keys, indices(pool, range(PAGES)))
    assert got == [not ((8 <= i < 16 and not fs.io.plane_attached()) or i < 6) for i in range(PAGES)]
    errors = fs.statistics()["errors"]
    assert errors["INTERNAL_RuntimeError"] == 1 and errors["INTERNAL_MemoryError"] == 1


def test_many_sglang_threads_share_the_page_threads(store_root, small_runs):
    callers, rounds, per_batch = 6, 4, 8
    source = MHAHostPool(pages=callers * per_batch)
    target = MHAHostPool(pages=callers * per_batch)
    fs = make_fs(store_root, source, extra=THREADS)
    reader = make_fs(store_root, target, extra=THREADS)
    errors = []
    barrier = threading.Barrier(callers + 1)
    stop = threading.Event()

    def caller(c):
        try:
            barrier.wait()
            mine = list(range(c * per_batch, (c + 1) * per_batch))
            for r in range(rounds):
                keys = [key("share", c, r, i) for i in range(per_batch)]
                assert fs.batch_set_v1(keys, indices(source, mine)) == [True] * per_batch
                assert reader.batch_get_v1(keys, indices(target, mine)) == [True] * per_batch
                for slot in mine:
                    assert page_bytes(target, slot) == page_bytes(source, slot)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def closer():  # close() while batches run: later calls make new helpers
        barrier.wait()
        while not stop.is_set():
            reader.close()
            time.sleep(0.01)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    closing = threading.Thread(target=closer)
    for thread in threads + [closing]:
        thread.start()
    for thread in threads:
        thread.join(120)
    stop.set()
    closing.join(10)
    assert not any(thread.is_alive() for thread in threads + [closing])
    assert not errors, errors[0]


@pytest.mark.parametrize("key", ["read_threads", "write_threads"])
@pytest.mark.parametrize("value", [0, -1, 65, "four", "²", 2.5, True, None, [2]])
def test_bad_thread_count_is_a_clear_error(plain_root, key, value):
    with pytest.raises(ValueError, match=f"{key} must be an integer from 1 to 64") as info:
        HiCacheFS(storage_config(plain_root, extra={key: value}), {})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("extra, reads, writes", [({}, 4, 2), ({"read_threads": 1}, 1, 2),
                                                  ({"write_threads": "8"}, 4, 8),
                                                  ({"read_threads": 64, "write_threads": 1}, 64, 1)])
def test_thread_counts_from_extra_config(plain_root, extra, reads, writes):
    fs = HiCacheFS(storage_config(plain_root, extra=extra), {})
    assert (fs.read_threads.threads, fs.write_threads.threads) == (reads, writes)


def test_run_returns_only_when_every_page_is_done():
    """The caller's buffers are never touched after the batch returns, even when the helpers
    are slow to start or a page raises."""
    runner = PageThreads(4)
    before = set(threading.enumerate())
    late = []  # pages whose work began or ended after their run() had returned

    def batch(returned: threading.Event):
        def work(i):
            if returned.is_set():
                late.append(i)
            time.sleep(0.001 * (i % 5))
            if i == 3:
                raise RuntimeError("page 3")
            done.append(i)
            if returned.is_set():
                late.append(i)
            return True
        return work

    for _ in range(5):
        done = []
        returned = threading.Event()
        results = runner.run(batch(returned), 40)
        returned.set()
        assert sorted(done) == [i for i in range(40) if i != 3]
        assert results == [i != 3 for i in range(40)]
    helpers = set(threading.enumerate()) - before
    assert helpers, "the batches ran on the caller's thread alone"
    runner.close()
    for helper in helpers:  # once they have ended, nothing can run on
        helper.join(10)
    assert not any(helper.is_alive() for helper in helpers)
    assert late == []
    assert runner.run(lambda i: i % 2 == 0, 5) == [True, False, True, False, True]


def test_a_batch_of_one_run_runs_in_the_callers_thread_and_a_failure_is_false():
    runner = PageThreads(4)
    before = set(threading.enumerate())
    ran_on = []
    assert runner.run(lambda i: ran_on.append(threading.get_ident()) or True, 1) == [True]
    assert ran_on == [threading.get_ident()] and set(threading.enumerate()) == before  # no helper made

    def fails(i):
        raise RuntimeError("the only run")
    assert runner.run(fails, 1) == [False]
    runner.close()


def test_a_batch_copied_by_several_write_threads_is_one_commit(mounted, monkeypatch, small_runs):
    pool = MHAHostPool(pages=PAGES)
    fs = make_fs(mounted.path, pool, extra=THREADS)
    for batch in range(2):  # the first makes the pool, the second is the first commit into it
        assert fs.batch_set_v1([key("one commit", batch, i) for i in range(PAGES)], indices(pool, range(PAGES))) \
            == [True] * PAGES
    fs.settle()  # the second batch's commit, sent behind it, is not the next batch's cost
    copying = set()
    fill = plane_arena.ArenaMapping.write

    def recording(*args):
        copying.add(threading.get_ident())
        time.sleep(0.005)  # a copy of a large page, so that every thread gets a run
        return fill(*args)

    monkeypatch.setattr(plane_arena.ArenaMapping, "write", recording)
    keys = [key("one commit", 2, i) for i in range(PAGES)]
    cost, got = requests_of(mounted, lambda: (fs.batch_set_v1(keys, indices(pool, range(PAGES))), fs.settle())[0])
    assert got == [True] * PAGES and cost == {"write": 1}
    assert len(copying) > 1
    reader = make_fs(mounted.path, MHAHostPool(pages=PAGES))
    assert reader.batch_exists(keys) == PAGES
