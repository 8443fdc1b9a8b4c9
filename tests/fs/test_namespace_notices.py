"""What the namespace tells the kernel, without FUSE: a recorder stands in for the notifier."""

from __future__ import annotations

import errno
import os

import pytest
import trio

from hicachefs.posix.errors import FsError
from hicachefs.posix.racing_opens import SECOND_TRY_S
from namespace_alone import POOL, alone, settled


@pytest.fixture
def ns():
    made = alone()
    yield made
    made.store.close()


def test_publish_pushes_the_page_to_the_inode_the_kernel_knows(ns):
    inode = ns.publish(b"k", b"page bytes")
    assert ns.recorder.events == [("push", inode, b"page bytes")]  # nothing else to say
    assert ns.lookup(b"k").inode == inode


def test_an_inode_whose_page_was_replaced_keeps_its_attributes_and_an_open_of_it_is_stale(ns):
    old = ns.publish(b"k", b"the old page")
    ns.lookup(b"k")
    ns.ns.forget(old, 0)  # the kernel still holds the old inode (an open racing the replace)
    ns.publish(b"k", b"new")
    assert ("attributes", old) in ns.recorder.events  # fstat of its open files: nlink 0
    assert ("inode", old) not in ns.recorder.events  # its cached data is still its own page's
    st = ns.ns.getattr(old)
    assert (st.size, st.nlink) == (len(b"the old page"), 0)
    assert refused_open(ns, old) == errno.ESTALE  # the kernel then looks the name up again
    new = ns.lookup(b"k").inode
    assert new != old
    fh, cacheable = ns.open(new)
    assert cacheable and ns.read(fh) == b"new"


def test_the_second_try_of_an_open_that_raced_a_replace_opens_what_the_name_holds(ns):
    pid = 4242
    first = ns.publish(b"k", b"v1")
    ns.publish(b"k", b"v2")
    with pytest.raises(FsError) as info:
        ns.ns.open(first, os.O_RDONLY, pid=pid)
    assert info.value.errno == errno.ESTALE
    second = ns.lookup(b"k").inode  # the kernel's fresh lookup, then its open...
    ns.publish(b"k", b"v3!")  # ... which another replace races too
    handle = ns.ns.open(second, os.O_RDONLY, pid=pid)
    assert not handle.cacheable  # the inode's cached size and data are v2's
    assert bytes(trio.run(handle.read, 0, 100)) == b"v3!"
    handle.release()
    with pytest.raises(FsError) as info:  # only that one open: any other is stale as before
        ns.ns.open(second, os.O_RDONLY, pid=pid)
    assert info.value.errno == errno.ESTALE


def open_removed_page_stale(ns, pid: int) -> None:
    """An open by ``pid`` of a page removed since its lookup: ESTALE, and the kernel's second
    try is awaited."""
    gone = ns.publish(b"k", b"v1")
    ns.lookup(b"k")
    ns.ns.unlink(ns.pool, b"k")
    with pytest.raises(FsError) as info:
        ns.ns.open(gone, os.O_RDONLY, pid=pid)
    assert info.value.errno == errno.ESTALE


def open_of_replaced_inode(ns, pid: int) -> int:
    """The errno of an open by ``pid`` of a page's inode whose name was given another page since
    (0: it opened)."""
    ns.publish(b"k", b"v2")
    replaced = ns.lookup(b"k").inode
    ns.publish(b"k", b"v3!")
    try:
        settled(ns.ns.open(replaced, os.O_RDONLY, pid=pid)).release()
    except FsError as refused:
        return refused.errno
    return 0


def test_a_second_try_whose_lookup_finds_nothing_is_not_awaited_by_later_opens(ns):
    """The kernel's second try of an open answered ESTALE looks the name up again; when that
    finds nothing (the page was removed or evicted) no open follows. A later open of the name by
    the same thread was then taken for that second try: on a retired inode it was served past
    the kernel's cache, or failed with EIO when files open on the inode no longer pinned its page,
    where ESTALE (then the kernel's fresh lookup) was its answer. Found by review."""
    pid = 4242
    open_removed_page_stale(ns, pid)
    assert ns.ns.lookup(ns.pool, b"k", pid) is None  # the second try's lookup: gone, no open follows
    assert open_of_replaced_inode(ns, pid) == errno.ESTALE


def test_a_second_try_counts_only_right_after_its_stale_answer(ns):
    """A second try that never came (its thread killed in between, say)
    is forgotten within seconds: a later open of the name by that thread is a first try."""
    pid, now = 4242, [100.0]
    ns.ns.racing.clock = lambda: now[0]
    open_removed_page_stale(ns, pid)
    now[0] += SECOND_TRY_S + 1
    assert open_of_replaced_inode(ns, pid) == errno.ESTALE


def test_the_second_try_shares_the_page_an_open_file_read_from_the_disk_tier(tmp_path):
    """An open file whose page came from the disk tier holds a private copy of it: the second
    try of an open of its inode, once the page is replaced, shares that copy (it failed with an
    internal error: a private copy could not be shared)."""
    made = alone(tmp_path)
    try:
        old = made.publish(b"k", b"A" * (1 << 20))
        for i in range(20):  # the RAM tier (16 MiB) sends it down to the disk
            made.publish(b"f%d" % i, bytes(1 << 20))
        assert made.store.info("/".join(POOL) + "/k").tier == "disk"
        holder = settled(made.ns.open(old, os.O_RDONLY, pid=1))
        made.publish(b"k", b"B" * 4096)
        with pytest.raises(FsError) as info:
            made.ns.open(old, os.O_RDONLY, pid=2)
        assert info.value.errno == errno.ESTALE
        again = settled(made.ns.open(old, os.O_RDONLY, pid=2))  # the kernel's second try lands on it again
        assert bytes(trio.run(again.read, 0, 1 << 21)) == b"A" * (1 << 20)
        again.release()
        holder.release()
    finally:
        made.store.close()


def test_without_the_kernel_cache_nothing_is_pushed_and_nothing_is_cacheable():
    made = alone(kernel_cache=False)
    inode = made.publish(b"k", b"bytes")
    assert not any(e[0] == "push" for e in made.recorder.events)
    _, cacheable = made.open(inode)
    assert not cacheable
    made.store.close()


def test_a_page_the_store_drops_is_forgotten_by_name_and_inode(ns):
    inode = ns.publish(b"k", b"bytes")
    version = ns.ns.page_info(inode).version
    ns.ns.pages_gone([("m/f/tp0of1/kv/k", version), ("m/f/tp0of1/other/x", version)])  # an unknown directory is fine
    assert ("entry", ns.pool, b"k") in ns.recorder.events
    assert ("inode", inode) in ns.recorder.events
    assert ns.ns.getattr(inode).nlink == 0  # a file still open keeps its attributes


def test_a_page_sent_through_the_ingest_file_replaces_the_name_the_kernel_knows(ns):
    old = ns.publish(b"k", b"old")
    draft = ns.ns.publishing.reserve_page("m/f/tp0of1/kv/k", 3)
    draft.write(0, b"new")
    ns.ns.publishing.publish_page("m/f/tp0of1/kv/k", draft)
    assert ("attributes", old) in ns.recorder.events and ("entry", ns.pool, b"k") in ns.recorder.events
    assert refused_open(ns, old) == errno.ESTALE  # never ENOENT: the kernel looks the name up again
    fh, _ = ns.open(ns.lookup(b"k").inode)
    assert ns.read(fh) == b"new"


def refused_open(ns, inode) -> int:
    with pytest.raises(FsError) as info:
        ns.open(inode)
    return info.value.errno


def test_a_late_eviction_report_leaves_the_page_published_since(ns):
    """The store reports evictions from its own threads and the daemon hands them to the event
    loop later: a page published under the name in between was taken for the evicted one (its
    inode retired, 0 links, the kernel told to forget it). Found by a review helper."""
    v1 = ns.ns.page_info(ns.publish(b"k", b"v1")).version  # ... evicted by another thread, reported
    new = ns.publish(b"k", b"version 2")
    ns.recorder.events.clear()
    ns.ns.pages_gone([("m/f/tp0of1/kv/k", v1)])  # the report of v1's eviction arrives
    assert ns.ns.getattr(new).nlink == 1
    assert ns.recorder.events == []
