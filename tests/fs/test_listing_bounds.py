"""Listing a big pool (issue 20, item 1; issue 29, item 10): a listing costs the daemon a bounded
amount per request and memory per handle that does not grow with the pool, so a plain user
listing a pool of 40,000 pages in a loop, or holding directory handles open, neither stalls other
clients nor bloats the daemon; and a listing read while pages come and go shows every page that
stayed exactly once."""

from __future__ import annotations

import ctypes
import os
import time

import pytest
import trio

from hicachefs.control.request_limits import OTHERS_PAUSE_S
from hicachefs.posix.listing import ENTRIES_PER_REQUEST
from hicachefs.posix.requests import Requests
from hicachefs.store import PageStore, StoreConfig
from hicachefs_testing import attacks
from hicachefs_testing.workload import content, publish
from namespace_alone import Alone, alone
from pages import requests_of

POOL_PAGES = 40_000
#: Another client's requests while a plain user lists in a loop: before item 1, each opendir held
#: the daemon 360-410 ms and the probe's median was some 200 ms; before issue 29, item 10, one
#: readdir request answered the reader's whole buffer (some 4,000 entries, 35 ms) and the probe's
#: p99 was 64-70 ms, its worst 150 ms (after: p99 5 ms, worst 8 ms, on the 2-core VM).
MEDIAN_LATENCY_S = 0.02
P99_LATENCY_S = 0.05
#: Before item 1, each handle on a pool of 40,000 pages held some 44 MiB of entries.
HANDLES = 20
GROWTH_BOUND = 40 << 20
#: getdents64's number on x86_64 and aarch64, and the least a readdirplus entry takes (the
#: entry's attributes and its dirent with a name of 8 bytes or less).
GETDENTS64 = {"x86_64": 217, "aarch64": 61}[os.uname().machine]
MIN_DIRENTPLUS = 128 + 24 + 8


@pytest.fixture
def big_pool(public_mount):
    """The public mount with ``POOL_PAGES`` pages in one pool (``big``) and 64 in another, which
    the latency probe reads."""
    small = public_mount.page_dir()
    for i in range(64):
        publish(small, f"{i:064x}", content(i, 4096))
    big = public_mount.page_dir("model", "bfloat16-page_first-64", "tp0of1", "big")
    attacks.fill_pool(public_mount.path, str(big.relative_to(public_mount.path)), POOL_PAGES)
    return public_mount, big


def test_a_plain_users_listing_loop_does_not_delay_other_clients(big_pool, tmp_path):
    mount, big = big_pool
    small = mount.page_dir()
    probe = attacks.start_probe(mount.path, str(small.relative_to(mount.path)), [f"{i:064x}" for i in range(64)],
                                tmp_path / "probe-stop")
    try:
        with attacks.start("listing-storm", big) as storm:
            started = time.monotonic()
            for _ in range(50):
                storm.wait_round()
            ended = time.monotonic()
            figures = storm.finish()
    finally:
        samples = probe.finish()
    assert figures["errors"] == {}
    took = attacks.during(samples, started, ended)
    assert len(took) >= 20, f"the other client made only {len(took)} requests during the listings"
    median, p99 = attacks.percentile(took, 0.5), attacks.percentile(took, 0.99)
    print(f"{len(took)} requests during {figures['rounds']} listings: median {median * 1e3:.2f} ms, "
          f"p99 {p99 * 1e3:.1f} ms, worst {max(took) * 1e3:.1f} ms")
    assert median < MEDIAN_LATENCY_S and p99 < P99_LATENCY_S, \
        f"other clients waited behind the listings: median {median * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"


def test_open_directory_handles_take_no_memory_that_grows_with_the_pool(big_pool):
    mount, big = big_pool
    with os.scandir(big) as entries:  # the first entries' inodes exist before measuring
        next(entries)
    before = attacks.rss(mount.pid)
    with attacks.start("held-listings", big, HANDLES) as held:
        holding = attacks.rss(mount.pid)
        figures = held.finish()
    assert figures["errors"] == {}
    growth = holding - before
    print(f"{HANDLES} handles on a pool of {POOL_PAGES} pages: the daemon grew by {growth / 2**20:.1f} MiB")
    assert growth < GROWTH_BOUND, f"{HANDLES} open listings took {growth >> 20} MiB"
    assert len(os.listdir(big)) == POOL_PAGES


def test_a_listing_shows_every_page_that_stays_once_while_pages_come_and_go(mounted):
    pool = mounted.page_dir()
    stays = {f"s{i:04d}" for i in range(1200)}
    goes = [f"g{i:04d}" for i in range(300)]
    for key in sorted(stays) + goes:
        publish(pool, key, content(key, 512))
    seen: list[str] = []
    added = 0
    with os.scandir(pool) as entries:
        for entry in entries:
            seen.append(entry.name)
            if len(seen) % 100 == 0 and goes:  # between readdir requests, now and then
                for key in (goes.pop(), goes.pop()):
                    os.unlink(pool / key)
                publish(pool, sorted(stays)[len(seen) % 1200], content("again", 512))  # a replace
                publish(pool, f"n{added:04d}", content(added, 512))
                added += 1
    assert len(seen) == len(set(seen)), f"listed twice: {sorted({n for n in seen if seen.count(n) > 1})[:5]}"
    assert stays <= set(seen), f"not listed: {sorted(stays - set(seen))[:5]}"
    assert sorted(os.listdir(pool)) == sorted(stays | set(goes) | {f"n{i:04d}" for i in range(added)})


def test_a_file_written_under_its_key_is_listed_once_when_published_mid_listing(mounted):
    """``cp`` into a pool while it is listed: the file is listed as a file being written, then
    published as a page; it must not show twice, nor be missed."""
    pool = mounted.page_dir()
    for i in range(600):
        publish(pool, f"p{i:03d}", content(i, 512))
    early = os.open(pool / "direct-early", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(early, b"early")
    with os.scandir(pool) as entries:
        seen = [next(entries).name]  # one readdir request: the files being written come first
        late = os.open(pool / "direct-late", os.O_WRONLY | os.O_CREAT, 0o644)  # made after it
        os.write(late, b"late")
        os.close(early)  # published now, in the middle of the listing
        os.close(late)
        seen += [entry.name for entry in entries]
    assert seen.count("direct-early") == 1, seen[:3]
    assert seen.count("direct-late") <= 1
    assert sorted(n for n in seen if n.startswith("p")) == [f"p{i:03d}" for i in range(600)]
    assert (pool / "direct-early").read_bytes() == b"early"


def test_a_long_listing_is_answered_a_bounded_batch_per_request(mounted):
    """The kernel asks for a reader's whole buffer at once (glibc's is st_blksize, 1 MiB: some
    4,000 entries, 35 ms of the daemon's time in one request); each request answers at most
    ``ENTRIES_PER_REQUEST`` and the kernel asks again, so other clients' requests come between."""
    pool = mounted.page_dir()
    pages = 10 * ENTRIES_PER_REQUEST
    attacks.fill_pool(mounted.path, str(pool.relative_to(mounted.path)), pages)
    requests, listed = requests_of(mounted, lambda: os.listdir(pool))
    assert len(listed) == pages
    print(f"{pages} entries in {requests['readdir']} readdir requests")
    assert requests["readdir"] >= pages // ENTRIES_PER_REQUEST, requests


def test_a_plain_users_listing_requests_take_turns_in_their_lane_and_the_writers_do_not(tmp_path):
    """Opening and listing a directory, a user other than the store's own clients waits for a
    turn in their lane (one at a time, the next after a pause); root never waits for it."""
    store = PageStore(StoreConfig(memory_bytes=8 << 20))
    try:
        alone = Alone(store)
        for i in range(8):
            alone.publish(f"{i:064x}".encode(), content(i, 4096))
        limits = alone.ns.control.request_limits
        requests = Requests(alone.ns, limits.turn_of)
        order, paced = [], []

        async def main():
            release = trio.Event()
            async with trio.open_nursery() as nursery:
                async def holder(task_status=trio.TASK_STATUS_IGNORED):
                    async with limits.others.turn():  # another plain user's turn, held
                        task_status.started()
                        await release.wait()

                await nursery.start(holder)
                fh = await requests.opendir(alone.pool, 0)
                order.append(("root", len(await requests.readdir(fh, 0, 100))))

                async def plain():
                    fh = await requests.opendir(alone.pool, 65534)
                    order.append(("plain", len(await requests.readdir(fh, 0, 100))))
                    started = time.monotonic()
                    for _ in range(3):
                        await requests.readdir(fh, 0, 100)
                    paced.append(time.monotonic() - started)

                nursery.start_soon(plain)
                await trio.sleep(0.05)
                order.append("released")
                release.set()

        trio.run(main)
        assert order == [("root", 8), "released", ("plain", 8)]
        assert paced[0] >= 3 * OTHERS_PAUSE_S - 1e-3  # each of its readdirs waited for the pause after the last
    finally:
        store.close()


def _getdents(fd: int, size: int) -> int:
    """One getdents64 of ``size`` bytes on directory ``fd``: the bytes of entries it returned."""
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(size)
    got = libc.syscall(GETDENTS64, fd, buffer, size)
    if got < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    return got


def test_a_listing_cut_short_holds_no_inodes_for_the_entries_the_kernel_did_not_take(mounted):
    """A reader with a small buffer (4 KiB: the kernel's readdir request is as large, some 20
    entries) takes a few of the entries a request answers; the daemon made an inode for each of
    the ``ENTRIES_PER_REQUEST`` it offered, and those the kernel did not take stayed held with
    no lookup, forgotten never (and kept after their pages went)."""
    pool = mounted.page_dir()
    attacks.fill_pool(mounted.path, str(pool.relative_to(mounted.path)), 2 * ENTRIES_PER_REQUEST)
    assert mounted.stats()["page_inodes"] == 0  # ingest makes no inodes
    fd = os.open(pool, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _getdents(fd, 4096) > 0
    finally:
        os.close(fd)
    held = mounted.stats()["page_inodes"]
    assert 0 < held <= 4096 // MIN_DIRENTPLUS, held


def test_readdir_counts_the_entries_the_kernel_took_even_when_the_store_changed_meanwhile():
    """The entries the kernel took count as lookups, and the rest are let go, even when the
    store's other threads change the listing between the reply and the count (a page
    reclaimed on the disk tier): counting a second listing counted the wrong entries, keeping
    one the kernel never took for good and leaving one it did take uncounted."""
    ns = alone()
    try:
        for i in range(4):
            ns.ns.forget(ns.publish(b"k%d" % i, b"page %d" % i), 1)  # the kernel forgot the files it wrote
        assert ns.ns.page_inodes() == 0
        requests = Requests(ns.ns)
        fh = trio.run(requests.opendir, ns.pool)
        entries = trio.run(requests.readdir, fh, 0, 256)
        assert [name for _, name, _ in entries] == [b"k0", b"k1", b"k2", b"k3"]
        taken = 3  # the kernel's buffer held three of them
        ns.store.remove("m/f/tp0of1/kv/k0")  # meanwhile, another thread of the store drops k0
        trio.run(requests.took, fh, taken)
        counts = {name: ns.ns.nodes.get(st.inode).nlookup if ns.ns.nodes.get(st.inode) else None
                  for _, name, st in entries}
        assert counts == {b"k0": 1, b"k1": 1, b"k2": 1, b"k3": None}, counts
    finally:
        ns.store.close()


def test_a_directory_handle_read_again_from_the_start_forgets_the_files_it_listed_before():
    """A handle remembers the files being written under key names that it listed, so that the
    page one becomes is not listed twice in the same listing. A listing read again from its
    start (``rewinddir``) lists every page whatever it remembers: what it remembered before is
    let go there. Kept, it grew with every such file ever listed, for as long as the handle
    (a plain user's, rewound in a loop while ``cp`` writes into the pool) stayed open."""
    ns = alone()
    try:
        requests = Requests(ns.ns)
        fh = trio.run(requests.opendir, ns.pool)
        for i in range(200):
            key = b"direct-%03d" % i
            inode, writer = ns.create(key)
            ns.write(writer, b"page %d" % i)
            entries = trio.run(requests.readdir, fh, 0, 256)  # rewound: read from the start
            assert key in [name for _, name, _ in entries]
            trio.run(requests.took, fh, len(entries))
            ns.close(writer)  # published
            ns.ns.unlink(ns.pool, key)
            ns.ns.forget(inode, 2)  # the kernel forgot the file and its listing entry
        listing = requests.handle(fh).listing.__self__
        assert len(listing._listed_files) <= 1, len(listing._listed_files)
    finally:
        ns.store.close()
