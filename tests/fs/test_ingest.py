"""Publishing many pages in one write through ``.hicachefs/ingest`` (DESIGN.md)."""

from __future__ import annotations

import errno
import gc
import os
import stat
import struct
import weakref

import pytest
import trio

from hicachefs.control.ingest import MAX_PAGES, PAGES_PER_TURN
from hicachefs.posix.errors import FsError
from hicachefs.store import PageStore, StoreConfig
from hicachefs_testing.workload import content, fill_writing_share
from namespace_alone import Alone, partial_requests_until_refused
from pages import as_nobody, ingest_batch, ingest_status, publish, read_page, requests_of, wait_until

POOL = "model/bfloat16-page_first-64/tp0of1/kv"
KEEP_EXISTING = 1


@pytest.fixture
def ingest(mounted):
    mounted.page_dir()
    fd = os.open(mounted.path / ".hicachefs" / "ingest", os.O_RDWR)
    yield fd
    os.close(fd)


def pages(count: int, size: int, seed: int = 0, prefix: str = "k") -> list[tuple[str, bytes]]:
    return [(f"{POOL}/{prefix}{i:04d}", content(seed + i, size)) for i in range(count)]


def test_a_batch_publishes_every_page_whole_in_few_requests(mounted, ingest):
    batch = pages(8, 128 << 10)
    cost, written = requests_of(mounted, lambda: ingest_batch(ingest, batch))
    assert written == 16 + sum(len(f"{len(d)} {p}\n") for p, d in batch) + 8 * (128 << 10)
    # 1 MiB of pages and their header: two WRITE requests (at most 1 MiB each), not 6 per page.
    assert +cost == {"write": 2}
    for path, data in batch:
        assert read_page(mounted.path / path) == data
        st = os.stat(mounted.path / path)
        assert stat.S_IMODE(st.st_mode) == 0o444 and st.st_size == len(data)
    assert sorted(os.listdir(mounted.path / POOL)) == [p.rsplit("/", 1)[1] for p, _ in batch]
    assert ingest_status(ingest) == (8, 0)


def test_a_page_cut_off_publishes_nothing_and_the_pages_before_it_stay(mounted, ingest):
    batch = pages(3, 64 << 10)
    header = b"".join(f"{len(d)} {p}\n".encode() for p, d in batch)
    prefix = struct.pack("<8sIHH", b"HCFSPUT1", len(header), 3, 0)
    stream = prefix + header + batch[0][1] + batch[1][1] + batch[2][1][:1000]
    assert os.pwrite(ingest, stream, 0) == len(stream)
    os.close(os.dup(ingest))  # a dup closing is not the handle's end
    assert ingest_status(ingest) == (2, 0)
    # A new batch at offset 0 ends the one in progress: the cut-off page is dropped.
    assert ingest_batch(ingest, pages(1, 10, prefix="other")) > 0
    assert read_page(mounted.path / batch[1][0]) == batch[1][1]
    assert not (mounted.path / batch[2][0]).exists()


def test_a_handle_closed_mid_page_publishes_nothing(mounted):
    mounted.page_dir()
    fd = os.open(mounted.path / ".hicachefs" / "ingest", os.O_WRONLY)
    (path, data), = pages(1, 256 << 10)
    header = f"{len(data)} {path}\n".encode()
    os.pwrite(fd, struct.pack("<8sIHH", b"HCFSPUT1", len(header), 1, 0) + header + data[:100_000], 0)
    os.close(fd)
    assert not (mounted.path / path).exists()
    assert mounted.stats()["pages"] == 0


@pytest.mark.parametrize("bad, err", [
    ("x/y/z/w/k", errno.ENOENT),                        # no such pool directory
    (f"{POOL}/.hidden", errno.EINVAL),                  # not a key
    ("model/bfloat16-page_first-64/tp0of1/k", errno.EPERM),  # not in a pool directory
])
def test_a_failing_page_stops_the_batch_where_it_is_and_says_why(mounted, ingest, bad, err):
    batch = pages(4, 32 << 10)
    batch[2] = (bad, batch[2][1])
    total = 16 + sum(len(f"{len(d)} {p}\n") for p, d in batch) + 4 * (32 << 10)
    written = ingest_batch(ingest, batch)
    assert written < total
    assert ingest_status(ingest) == (2, err)
    assert [(mounted.path / p).exists() for p, _ in batch] == [True, True, False, False]
    # The rest written again as a new batch: the failing page is its first, and says so.
    with pytest.raises(OSError) as info:
        ingest_batch(ingest, batch[2:])
    assert info.value.errno == err
    assert ingest_batch(ingest, batch[3:]) > 0 and (mounted.path / batch[3][0]).exists()


def test_a_page_over_the_maximum_or_a_full_store_is_refused_cleanly(mount_factory):
    mount = mount_factory("--memory", "16M", "--max-page-size", "1M")
    mount.page_dir()
    fd = os.open(mount.path / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        with pytest.raises(OSError) as info:
            ingest_batch(fd, [(f"{POOL}/big", bytes(2 << 20))])
        assert info.value.errno == errno.EFBIG
        # Past the first page it stops the batch there, as any page that cannot be published:
        # the pages before it are published (the whole batch was refused, the header read).
        before = pages(2, 4096, prefix="before")
        assert ingest_batch(fd, [*before, (f"{POOL}/big", bytes(2 << 20))]) < 2 << 20
        assert ingest_status(fd) == (2, errno.EFBIG)
        assert all(read_page(mount.path / p) == d for p, d in before) and not (mount.path / POOL / "big").exists()
        # Files being written hold all the RAM they may: the next page gets ENOSPC at once,
        # and nothing published is lost.
        first = pages(4, 1 << 20)
        ingest_batch(fd, first)
        held = fill_writing_share(mount.path / POOL, 1 << 20)
        with pytest.raises(OSError) as info:
            ingest_batch(fd, pages(2, 1 << 20, prefix="more"))
        assert info.value.errno == errno.ENOSPC and ingest_status(fd) == (0, errno.ENOSPC)
        assert all(read_page(mount.path / p) == d for p, d in first)
        for path in held:
            os.unlink(path)
        ingest_batch(fd, pages(2, 1 << 20, prefix="more"))
    finally:
        os.close(fd)


@pytest.mark.parametrize("prefix, header", [
    (struct.pack("<8sIHH", b"NOTMAGIC", 9, 1, 0), b"1 a/b/c/d/e\n"),
    (struct.pack("<8sIHH", b"HCFSPUT1", 12, 2, 0), b"1 a/b/c/d/e\n"),  # two pages announced, one line
    (struct.pack("<8sIHH", b"HCFSPUT1", 12, 1, 0), b"0 a/b/c/d/e\n"),  # an empty page
    (struct.pack("<8sIHH", b"HCFSPUT1", 12, 1, 0), b"x a/b/c/d/e\n"),  # no size
    # a size longer than int() takes (4,300 digits): EIO and a logged traceback, it was
    (struct.pack("<8sIHH", b"HCFSPUT1", 5011, 1, 0), b"9" * 5000 + b" a/b/c/d/e\n"),
])
def test_a_malformed_batch_is_refused_and_publishes_nothing(mounted, ingest, prefix, header):
    with pytest.raises(OSError) as info:
        os.pwrite(ingest, prefix + header + b"z", 0)
    assert info.value.errno == errno.EINVAL
    assert mounted.stats()["pages"] == 0


def test_a_batch_of_more_pages_than_a_header_may_hold_is_refused_and_publishes_nothing(mounted, ingest):
    """A header holds at most 4,096 pages (it is parsed in one go, on the daemon's loop): one of
    more, short paths well within the header's bytes, is refused with EFBIG."""
    lines = b"".join(b"1 %s/k%d\n" % (POOL.encode(), i) for i in range(MAX_PAGES + 1))
    with pytest.raises(OSError) as info:
        os.pwrite(ingest, struct.pack("<8sIHH", b"HCFSPUT1", len(lines), MAX_PAGES + 1, 0) + lines, 0)
    assert info.value.errno == errno.EFBIG
    assert mounted.stats()["pages"] == 0


def test_writes_must_continue_the_batch(mounted, ingest):
    (path, data), = pages(1, 4096)
    header = f"{len(data)} {path}\n".encode()
    os.pwrite(ingest, struct.pack("<8sIHH", b"HCFSPUT1", len(header), 1, 0) + header, 0)
    with pytest.raises(OSError) as info:
        os.pwrite(ingest, data, 10_000)
    assert info.value.errno == errno.EINVAL


def test_a_page_replaces_its_name_atomically_unless_kept(mounted, ingest):
    (path, old), = pages(1, 64 << 10, seed=1)
    publish(mounted.path / POOL, path.rsplit("/", 1)[1], old)
    assert read_page(mounted.path / path) == old  # the kernel now caches the old page
    before = os.stat(mounted.path / path)
    new = content(2, 64 << 10)
    ingest_batch(ingest, [(path, new)], flags=KEEP_EXISTING)
    assert read_page(mounted.path / path) == old and os.stat(mounted.path / path).st_mtime_ns == before.st_mtime_ns
    ingest_batch(ingest, [(path, new)])
    # The kernel is told its entry is stale; it forgets it at once, at the latest within a second.
    wait_until(lambda: read_page(mounted.path / path) == new, 2.0)
    assert mounted.stats()["pages"] == 1


def test_keep_existing_replaces_a_page_of_another_size(mounted, ingest):
    """A page file of another size (a copy cut off half-way) is no page this batch's readers
    could take: KEEP_EXISTING replaces it, as a batch without the flag would."""
    (path, page), = pages(1, 64 << 10, seed=5)
    publish(mounted.path / POOL, path.rsplit("/", 1)[1], page[: len(page) // 2])
    ingest_batch(ingest, [(path, page)], flags=KEEP_EXISTING)
    assert ingest_status(ingest) == (1, 0)
    wait_until(lambda: read_page(mounted.path / path) == page, 2.0)


def test_a_kept_page_is_kept_also_when_it_is_stored_while_the_batch_arrives(mounted, ingest):
    """KEEP_EXISTING: a page of the name published by another writer after the batch's page
    began to arrive, and before it ended, is kept too."""
    (path, ours), = pages(1, 64 << 10, seed=3)
    header = f"{len(ours)} {path}\n".encode()
    written = os.pwrite(ingest, struct.pack("<8sIHH", b"HCFSPUT1", len(header), 1, KEEP_EXISTING) + header, 0)
    written += os.pwrite(ingest, ours[: len(ours) // 2], written)  # the page's first half: not stored yet
    theirs = content(4, 64 << 10)
    publish(mounted.path / POOL, path.rsplit("/", 1)[1], theirs)  # another writer's, meanwhile
    os.pwrite(ingest, ours[len(ours) // 2 :], written)
    assert ingest_status(ingest) == (1, 0)
    assert read_page(mounted.path / path) == theirs


def test_only_writers_may_open_the_ingest_file(public_mount):
    mounted = public_mount
    result = as_nobody("/usr/bin/python3.11", "-c",
                       f"import os; os.open({str(mounted.path / '.hicachefs' / 'ingest')!r}, os.O_WRONLY)")
    assert result.returncode != 0 and "Permission denied" in result.stderr


class _Write(bytearray):
    """A write's bytes that can be watched for being let go (a weak reference)."""


def test_a_failed_batch_does_not_keep_the_write_that_failed():
    """A page that fails stops the batch; the handle keeps why (for its status read), not the
    failing write's bytes: it kept the raised error, whose traceback's frames held the write (a
    MiB a handle: 64 handles whose batch failed held 64 MiB of the daemon's memory)."""
    store = PageStore(StoreConfig(memory_bytes=16 << 20))
    stream = Alone(store).open_control(b"ingest").stream
    header = b"4096 m/f/tp0of1/missing/k\n"  # no such pool: ENOENT
    data = _Write(struct.pack("<8sIHH", b"HCFSPUT1", len(header), 1, 0) + header + bytes(4096))
    watched = weakref.ref(data)
    try:
        trio.run(stream.write, 0, data)
    except FsError as exc:
        assert exc.errno == errno.ENOENT
    else:
        pytest.fail("a page into a missing pool was taken")
    del data
    gc.collect()
    assert watched() is None, "the handle keeps the write that failed"
    assert stream.status() == b"0 %d\n" % errno.ENOENT


def test_a_write_of_many_small_pages_lets_other_requests_run():
    """A WRITE of a batch's most pages, 64 bytes each, publishes 4,096 of them: it did so without
    letting the daemon's one thread answer any other request meanwhile (a fetch lets them run
    every ``PAGES_PER_TURN`` pages)."""
    store = PageStore(StoreConfig(memory_bytes=64 << 20))
    handle = Alone(store).open_control(b"ingest")
    count = MAX_PAGES
    header = b"".join(b"64 m/f/tp0of1/kv/k%05d\n" % i for i in range(count))
    data = struct.pack("<8sIHH", b"HCFSPUT1", len(header), count, 0) + header + bytes(64 * count)
    published_when_another_ran = []

    async def another_request(written: trio.Event) -> None:
        while not written.is_set():
            published_when_another_ran.append(int(handle.stream.status().split()[0]))
            await trio.sleep(0)

    async def write_and_another() -> None:
        written = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(another_request, written)
            await trio.sleep(0)  # it runs first, then waits for its turn
            assert await handle.write(0, data) == len(data)
            written.set()

    trio.run(write_and_another)
    assert handle.stream.status() == b"%d 0\n" % count
    assert [n for n in published_when_another_ran if 0 < n < count]  # answered in the middle of the write


def test_a_batch_begun_while_a_write_lets_others_run_gets_none_of_that_writes_bytes():
    """The kernel lets one write at a time into the file; should a new batch begin anyway while a
    write lets other requests run, the rest of that write goes into none of its pages."""
    store = PageStore(StoreConfig(memory_bytes=64 << 20))
    stream = Alone(store).open_control(b"ingest").stream
    count = 4 * PAGES_PER_TURN
    header = b"".join(b"64 m/f/tp0of1/kv/k%05d\n" % i for i in range(count))
    data = struct.pack("<8sIHH", b"HCFSPUT1", len(header), count, 0) + header + b"\x01" * (64 * count)
    other = b"64 m/f/tp0of1/kv/other\n"
    accepted = []

    async def both() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _accepted(stream.write(0, data), accepted))
            while stream.status() == b"0 0\n":
                await trio.sleep(0)  # until the first write lets others run, after PAGES_PER_TURN pages
            other_batch = struct.pack("<8sIHH", b"HCFSPUT1", len(other), 1, 0) + other
            assert await stream.write(0, other_batch) == len(other_batch)

    trio.run(both)
    left = len(data) - accepted[0]  # a short write, at a turn's end: the pages before it stay
    assert 0 < left < 64 * count and left % (64 * PAGES_PER_TURN) == 0
    assert stream.status() == b"0 0\n"  # the new batch's page got none of the first write's bytes


async def _accepted(write, into: list) -> None:
    into.append(await write)


def test_headers_sent_in_pieces_are_held_against_the_writers_request_share():
    """A batch's header is gathered until whole (up to 4 MiB a handle), and its parsed lines are
    kept until the batch's last page: no share counted them, so a writer's many handles each
    holding half a header grew the daemon without bound. They are held against the writers'
    share of the request files' memory: the piece that would go over fails with ENOBUFS and
    stops its batch, and the share comes back when the batch's last page has come, and when
    its handle closes."""
    store = PageStore(StoreConfig(memory_bytes=16 << 20))
    alone = Alone(store)
    memory = alone.ns.control.request_limits.memory
    prefix = struct.pack("<8sIHH", b"HCFSPUT1", (4 << 20) + 1, 1, 0)  # a byte short when sent
    handles, refused = partial_requests_until_refused(alone, b"ingest", prefix)
    assert refused is not None and refused.errno == errno.ENOBUFS
    assert memory.held <= memory.limits.writers
    stopped = handles.pop()
    assert trio.run(stopped.read, 0, 64) == b"0 %d\n" % errno.ENOBUFS
    for handle in handles:
        handle.release()
    assert memory.held == 0
    header = b"64 m/f/tp0of1/kv/a\n64 m/f/tp0of1/kv/b\n"
    batch = struct.pack("<8sIHH", b"HCFSPUT1", len(header), 2, 0) + header
    trio.run(stopped.write, 0, batch)
    assert memory.held >= len(header)  # its lines, until its last page
    trio.run(stopped.write, len(batch), b"\x01" * 64)
    assert memory.held >= len(header)
    trio.run(stopped.write, len(batch) + 64, b"\x02" * 64)
    assert memory.held == 0 and trio.run(stopped.read, 0, 64) == b"2 0\n"
    trio.run(stopped.write, 0, batch)
    stopped.release()  # a batch cut off by its handle's close
    assert memory.held == 0
