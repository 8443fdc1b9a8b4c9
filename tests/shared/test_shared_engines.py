"""The shared tier on a real GlusterFS volume, as two hosts (its two mounts) see it: pages cross
hosts byte-exact, damaged files are caught, the size bound holds with two evictors, and a volume
that stops or freezes under a host leaves its answers fast misses until it is back."""

import os
import time

from pages import wait_until
from shared_helpers import FAST
from shared_helpers import KiB, make_page, read_page, wait_for_sweeps

from hicachefs.store.shared import format as page_format
from hicachefs.store.shared.layout import Layout, place
from hicachefs.store.tier import ReadResult

#: Real network round trips on a shared, busy machine: a longer deadline than the local tests'.
ON_GLUSTER = dict(FAST, deadline_s=1.0)
PROMPT_S = ON_GLUSTER["deadline_s"] + 1.0


def hosts(make_tier, engine_root, capacity=None):
    root_a, root_b = engine_root
    return make_tier(root_a, capacity, **ON_GLUSTER), make_tier(root_b, capacity, **ON_GLUSTER)


def test_pages_published_on_one_host_are_read_byte_exact_on_the_other(make_tier, engine_root):
    a, b = hosts(make_tier, engine_root)
    pages = [make_page(i, size) for i, size in enumerate([0, 1, 4 * KiB, 1 << 20] * 5)]
    for page, data in pages:
        assert a.offer(page, memoryview(data), lambda: None)
    names = [page.name for page, _ in pages]
    wait_until(lambda: all(b.contains_many(names)))
    assert [read_page(b, page.name) for page, _ in pages] == [data for _, data in pages]
    stats = b.statistics()
    assert stats.hits == len(pages) and stats.checksum_failures == 0 and stats.io_errors == 0
    assert a.statistics().write_behind.written_behind == len(pages) and b.statistics().journal_received == len(pages)


def test_a_damaged_file_on_the_volume_is_caught_and_removed(make_tier, engine_root):
    a, b = hosts(make_tier, engine_root)
    page, data = make_page(1, 64 * KiB)
    a.write(page, data)
    path_a = Layout(engine_root[0]).page_path(place(page.name))
    with open(path_a, "r+b") as file:
        file.seek(page_format.header_length(page.name) + 1000)
        file.write(b"\0\1\2\3")
    found = b.find(page.name)
    assert b.read_into(found, 0, memoryview(bytearray(page.size))) is ReadResult.CORRUPT
    path_b = Layout(engine_root[1]).page_path(place(page.name))
    assert b.statistics().checksum_failures == 1 and not os.path.exists(path_b)
    wait_until(lambda: not os.path.exists(path_a), 5.0)  # host A's kernel keeps the entry about 1 s
    wait_until(lambda: a.contains_many([page.name]) == [False])


def test_the_size_bound_holds_with_two_hosts_evicting(make_tier, engine_root):
    root_a, _ = engine_root
    file_size = page_format.header_length(make_page(0)[0].name) + 16 * KiB
    writer = make_tier(root_a, **ON_GLUSTER)
    pages = []
    for i in range(40):
        page, data = make_page(i, 16 * KiB)
        writer.write(page, data)
        os.utime(Layout(root_a).page_path(place(page.name)), (time.time() - 1000 + i,) * 2)
        pages.append(page)
    writer.close()
    a, b = hosts(make_tier, engine_root, capacity=15 * file_size)

    def left():
        return [os.path.exists(Layout(root_a).page_path(place(page.name))) for page in pages]

    wait_until(lambda: sum(left()) <= 15, timeout=20)
    wait_for_sweeps([a, b], timeout=20)  # nothing more may go
    assert left() == [False] * 25 + [True] * 15
    assert a.statistics().evictions + b.statistics().evictions == 25
    assert a.statistics().io_errors == b.statistics().io_errors == 0


def test_a_volume_stopped_under_a_host_gives_fast_misses_until_it_is_back(make_tier, engine, engine_root):
    a, b = hosts(make_tier, engine_root)
    pages = [make_page(i, 64 * KiB) for i in range(5)]
    for page, data in pages:
        a.write(page, data)
    names = [page.name for page, _ in pages]
    wait_until(lambda: all(b.contains_many(names)))
    engine.stop()
    try:
        wait_until(lambda: not b.statistics().guard.available, timeout=10)
        start = time.monotonic()
        assert b.contains_many(names * 25) == [False] * 125
        assert b.find(names[0]) is None and read_page(b, names[1]) is None
        released = []
        assert not b.offer(pages[0][0], memoryview(pages[0][1]), lambda: released.append(1)) and released == [1]
        assert time.monotonic() - start < PROMPT_S
        assert b.statistics().guard.last_error  # says why
    finally:
        engine.start()
    wait_until(lambda: b.statistics().guard.available and a.statistics().guard.available, timeout=30)
    assert [read_page(b, name) for name in names] == [data for _, data in pages]
    later, later_data = make_page(100, 64 * KiB)
    assert a.offer(later, memoryview(later_data), lambda: None)
    wait_until(lambda: b.contains_many([later.name]) == [True])
    assert read_page(b, later.name) == later_data


def test_a_frozen_brick_never_holds_a_caller_past_its_deadline(make_tier, engine, engine_root):
    a, b = hosts(make_tier, engine_root)
    pages = [make_page(i, 64 * KiB) for i in range(3)]
    for page, data in pages:
        a.write(page, data)
    names = [page.name for page, _ in pages]
    wait_until(lambda: all(b.contains_many(names)))
    with engine.frozen():  # every call on the volume now hangs
        start = time.monotonic()
        assert b.find(names[0]) is None
        assert time.monotonic() - start < PROMPT_S
        wait_until(lambda: not b.statistics().guard.available, timeout=10)
        start = time.monotonic()
        assert b.contains_many(names) == [False] * 3 and read_page(b, names[1]) is None
        assert time.monotonic() - start < PROMPT_S
        assert b.statistics().guard.io_threads_busy <= 4
    wait_until(lambda: b.statistics().guard.available, timeout=30)
    assert [read_page(b, name) for name in names] == [data for _, data in pages]
