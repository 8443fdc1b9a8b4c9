"""Pages read again through files the client keeps open (``page_files.py``): no request reaches
the daemon, the bytes are right, a page replaced or removed is never read stale, and the daemon
still counts the reads."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hicachefs.testing.host_pools import MHAHostPool, page_bytes
from hicachefs.testing.workload import content
from hicachefs_client.page_files import MAX_WAITING, PageFiles
from pages import requests_of
from test_backend import indices, key, make_fs

PAGES = 8


def until(check, seconds: float = 5.0):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


def kept_reader(mounted, pages=PAGES):
    source = MHAHostPool(pages=pages)
    writer = make_fs(mounted.path, source)
    keys = [key("kept", i) for i in range(pages)]
    assert writer.batch_set_v1(keys, indices(source, range(pages))) == [True] * pages
    writer.close()
    target = MHAHostPool(pages=pages)
    reader = make_fs(mounted.path, target, extra={"data_plane": False})  # kept files are the other way
    for _ in range(2):  # read, then read again: from now on their files are kept
        assert reader.batch_get_v1(keys, indices(target, range(pages))) == [True] * pages
    until(lambda: reader.statistics()["keeping"] == 0)  # what a caller waits on
    assert reader.statistics()["kept_files"] == pages
    return source, target, reader, keys


def test_the_keep_is_done_once_each_page_its_queue_took_is_kept_or_given_up(tmp_path):
    files = PageFiles(16, lambda names: None)
    there = []
    for i in range(4):
        (tmp_path / f"page{i}").write_bytes(bytes([i]) * 4096)
        there.append(str(tmp_path / f"page{i}"))
    gone = [str(tmp_path / f"gone{i}") for i in range(MAX_WAITING + 50)]
    try:
        files.warm(there + gone, 4096)  # more than its queue takes: the rest is left to the fetch file
        until(lambda: files.keeping() == 0)
        assert len(files) == 4
    finally:
        files.close()  # the kept files' descriptors, even when it fails


def test_a_page_read_again_is_then_read_with_no_request_to_the_daemon(mounted):
    source, target, reader, keys = kept_reader(mounted)
    target.zero()
    cost, got = requests_of(mounted, lambda: reader.batch_get_v1(keys, indices(target, range(PAGES))))
    assert got == [True] * PAGES and not cost
    assert all(page_bytes(target, i) == page_bytes(source, i) for i in range(PAGES))
    assert reader.statistics()["kept_reads"] == PAGES


def test_reads_through_kept_files_are_counted_by_the_daemon(mounted):
    source, target, reader, keys = kept_reader(mounted)
    hits = mounted.stats()["hits"]
    reader.batch_get_v1(keys, indices(target, range(PAGES)))
    reader.close()  # reports what is left to report
    assert mounted.stats()["hits"] == hits + PAGES


@pytest.mark.parametrize("change", ["replace", "remove"])
def test_a_kept_page_replaced_or_removed_is_never_read_stale(mounted, change):
    source, target, reader, keys = kept_reader(mounted)
    directory = mounted.path / reader._dir_of("kv")
    kept = reader.io.files._kept
    old = next(file for path, file in kept.items() if path.endswith(keys[0]))
    if change == "replace":
        other = MHAHostPool(pages=PAGES)
        other.fill_random(seed=5)
        tmp = directory / ".new"
        tmp.write_bytes(page_bytes(other, 0))
        os.rename(tmp, directory / keys[0])
        until(lambda: reader.batch_get_v1(keys[:1], indices(target, [0])) == [True]
              and page_bytes(target, 0) == page_bytes(other, 0))
    else:
        os.unlink(directory / keys[0])
        assert reader.batch_get_v1(keys[:1], indices(target, [0])) == [False]
        assert keys[0] not in "".join(kept)
    # The old page's file is let go of (a new page read again may be kept in its place).
    assert all(file is not old for file in list(kept.values()))
    assert reader.batch_get_v1(keys[1:], indices(target, range(1, PAGES))) == [True] * (PAGES - 1)


def test_no_more_files_are_kept_than_the_capacity(mounted):
    source, target, reader, keys = kept_reader(mounted, pages=PAGES)
    reader.io.files.capacity = 3
    more = [key("more", i) for i in range(PAGES)]
    writer = make_fs(mounted.path, source)
    writer.batch_set_v1(more, indices(source, range(PAGES)))
    for _ in range(2):
        reader.batch_get_v1(more, indices(target, range(PAGES)))
    until(lambda: reader.io.files._waiting.empty())
    assert reader.statistics()["kept_files"] <= 3
    reader.close()
    assert reader.statistics()["kept_files"] == 0


@pytest.mark.parametrize("plane", [True, False], ids=["plane", "no-plane"])
@pytest.mark.parametrize("how", ["ingest", "rename"])
def test_pages_another_process_replaced_are_never_read_old_once_it_stopped(mounted, how, plane):
    """While another process replaces 8 pages over and over, reads race the replaces (through
    the data plane, or through page files the client keeps, whose keeping may open a version
    being replaced). Once the writer's last replace has been answered, every read gives that
    last version."""
    pool = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, pool, extra={"data_plane": plane})
    keys = [key("replaced", i) for i in range(PAGES)]
    size = reader._layout("kv").page_bytes
    directory = reader._dir_of("kv")
    (mounted.path / directory).mkdir(parents=True, exist_ok=True)
    writer = subprocess.Popen([sys.executable, "-m", "hicachefs.testing.replacer", str(mounted.path), directory,
                               ",".join(keys), str(size), "2", how], stdout=subprocess.PIPE, text=True)
    try:
        while writer.poll() is None:  # reads (and keeps) while the pages change under them
            reader.batch_get_v1(keys, indices(pool, range(PAGES)))
        last = int(writer.stdout.read())
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == 0
    newest = [content(last * PAGES + i, size) for i in range(PAGES)]
    old = reads = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        pool.zero()
        assert reader.batch_get_v1(keys, indices(pool, range(PAGES))) == [True] * PAGES
        old += sum(page_bytes(pool, i) != newest[i] for i in range(PAGES))
        reads += PAGES
    reader.close()
    assert old == 0, f"{old} of {reads} reads gave a version older than the last one published"
