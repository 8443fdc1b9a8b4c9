"""Several SGLang threads (prefetch, I/O, backup) calling one HiCacheFS at once."""

from __future__ import annotations

import threading

import pytest

from hicachefs_testing.host_pools import MHAHostPool, page_bytes
from test_backend import indices, key, make_fs

THREADS = 8
ROUNDS = 6
PAGES_PER_BATCH = 4


def test_threads_share_one_client(store_root):
    source = MHAHostPool(pages=THREADS * PAGES_PER_BATCH)
    fs = make_fs(store_root, source)
    target = MHAHostPool(pages=THREADS * PAGES_PER_BATCH)
    reader = make_fs(store_root, target)
    errors = []
    barrier = threading.Barrier(THREADS)

    def work(t):
        try:
            barrier.wait()
            mine = list(range(t * PAGES_PER_BATCH, (t + 1) * PAGES_PER_BATCH))
            for r in range(ROUNDS):
                # Every thread also writes pages its neighbour writes: racing publishers.
                keys = [key("threads", r, (t * PAGES_PER_BATCH + i) % (THREADS * 2)) for i in range(PAGES_PER_BATCH)]
                pages = [(t * PAGES_PER_BATCH + i) % (THREADS * 2) for i in range(PAGES_PER_BATCH)]
                assert fs.batch_set_v1(keys, indices(source, pages)) == [True] * PAGES_PER_BATCH
                assert fs.batch_exists(keys) == PAGES_PER_BATCH
                assert reader.batch_get_v1(keys, indices(target, mine)) == [True] * PAGES_PER_BATCH
                for page, slot in zip(pages, mine):
                    assert page_bytes(target, slot) == page_bytes(source, page)
                assert reader.batch_get_v1([key("threads", "missing", t)], indices(target, mine[:1])) == [False]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors[0]
    stats = fs.statistics()
    # A plain directory has no control files.
    assert set(stats["errors"]) <= {"NO_EXISTS_FILE", "NO_INGEST_FILE", "NO_FETCH_FILE"}
    # Each distinct page was published at least once, and racing duplicates did not fail.
    assert stats["pages_written"] + stats["pages_skipped"] == THREADS * ROUNDS * PAGES_PER_BATCH
    # Every key ends up holding the page written under it, whichever racing writer won.
    distinct = THREADS * PAGES_PER_BATCH // 2
    check = MHAHostPool(pages=distinct)
    checker = make_fs(store_root, check)
    for r in range(ROUNDS):
        keys = [key("threads", r, page) for page in range(distinct)]
        assert checker.batch_get_v1(keys, indices(check, range(distinct))) == [True] * distinct
        for page in range(distinct):
            assert page_bytes(check, page) == page_bytes(source, page), f"round {r}, page {page}"


def test_open_during_republish_never_misses(hicachefs_mount):
    """A page renamed over (two writers of one key) stays openable throughout (DESIGN.md:
    "Renaming a new page onto an existing key replaces it atomically")."""
    import os

    directory = hicachefs_mount / "m" / "f" / "s" / "kv"
    directory.mkdir(parents=True)
    page = directory / "page"
    page.write_bytes(b"x" * 8192)
    stop = threading.Event()

    def republish():
        n = 0
        while not stop.is_set():
            tmp = directory / f".tmp{n}"
            tmp.write_bytes(bytes([n % 256]) * 8192)
            os.rename(tmp, page)
            n += 1

    writer = threading.Thread(target=republish)
    writer.start()
    misses = 0
    try:
        for _ in range(3000):
            try:
                fd = os.open(page, os.O_RDONLY)
            except FileNotFoundError:
                misses += 1
                continue
            data = os.pread(fd, 8192, 0)
            os.close(fd)
            assert len(data) == 8192 and data == data[:1] * 8192  # one whole page, never a mix
    finally:
        stop.set()
        writer.join(30)
    assert misses == 0, f"{misses} of 3000 opens got ENOENT while the page was being replaced"
