"""Batches larger than one system call moves (the kernel's ``MAX_RW_COUNT``, 2 GiB less a page)
go through the ingest and fetch files whole: a call cut short by the kernel must not look like a
page refused or missing. The kernel's cap is stood in for by a small one here (3 pages), and the
client's runs are cut at ``MAX_IO_BYTES``, set below it as the real one (1 GiB) is."""

from __future__ import annotations

import os

import hicachefs_client.vectored as vectored
from hicachefs_client import fetch, ingest
from hicachefs_testing.workload import content

PAGES, SIZE = 8, 64 << 10


def capped(call, cap: int):
    """``os.preadv``/``os.pwritev`` moving at most ``cap`` bytes a call, as the kernel does."""
    def moved(fd, buffers, offset):
        kept, left = [], cap
        for buffer in buffers:
            if left <= 0:
                break
            kept.append(memoryview(buffer)[:left])
            left -= len(kept[-1])
        return call(fd, kept, offset)
    return moved


def test_a_batch_larger_than_one_call_moves_is_stored_and_read_whole(mounted, monkeypatch):
    monkeypatch.setattr(vectored, "MAX_IO_BYTES", 2 * SIZE, raising=False)
    monkeypatch.setattr(os, "pwritev", capped(os.pwritev, 3 * SIZE))
    monkeypatch.setattr(os, "preadv", capped(os.preadv, 3 * SIZE))
    pool = mounted.page_dir().relative_to(mounted.path)
    paths = [f"{pool}/{i:064x}" for i in range(PAGES)]
    pages = [content(i, SIZE) for i in range(PAGES)]
    handle = os.open(mounted.path / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        assert ingest.publish_batch(handle, paths, [[memoryview(p)] for p in pages], [SIZE] * PAGES) == [None] * PAGES
    finally:
        os.close(handle)
    buffers = [bytearray(SIZE) for _ in range(PAGES)]
    handle = os.open(mounted.path / ".hicachefs" / "fetch", os.O_RDWR)
    try:
        assert fetch.fetch_batch(handle, paths, [[memoryview(b)] for b in buffers], SIZE) == [True] * PAGES
    finally:
        os.close(handle)
    assert [bytes(b) for b in buffers] == pages


def test_a_write_reported_short_after_its_pages_arrived_skips_no_page(mounted, monkeypatch):
    """A batch's write that returns short although the daemon published every page of it (its
    status says so) goes on with the next page: it skipped that page and reported it stored."""
    monkeypatch.setattr(vectored, "MAX_IO_BYTES", 2 * SIZE, raising=False)  # batches of 2 pages
    pwritev, calls = os.pwritev, []

    def short_once(fd, buffers, offset):
        done = pwritev(fd, buffers, offset)
        calls.append(done)
        return done - 1 if len(calls) == 1 else done

    monkeypatch.setattr(os, "pwritev", short_once)
    pool = mounted.page_dir()
    paths = [f"{pool.relative_to(mounted.path)}/{i:064x}" for i in range(4)]
    pages = [content(i, SIZE) for i in range(4)]
    handle = os.open(mounted.path / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        outcome = ingest.publish_batch(handle, paths, [[memoryview(p)] for p in pages], [SIZE] * 4)
    finally:
        os.close(handle)
    stored = [(mounted.path / path).exists() and (mounted.path / path).read_bytes() == page
              for path, page in zip(paths, pages)]
    assert [error is None for error in outcome] == stored == [True] * 4
