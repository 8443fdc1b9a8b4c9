"""What the namespace tells the kernel, without FUSE: a recorder stands in for the notifier."""

from __future__ import annotations

import pytest

from namespace_alone import alone


@pytest.fixture
def ns():
    made = alone()
    yield made
    made.store.close()


def test_publish_pushes_the_page_to_the_inode_the_kernel_knows(ns):
    inode = ns.publish(b"k", b"page bytes")
    assert ns.recorder.events == [("push", inode, b"page bytes")]  # nothing else to say
    assert ns.lookup(b"k").inode == inode


def test_an_open_of_an_inode_whose_page_was_replaced_bypasses_the_cache(ns):
    old = ns.publish(b"k", b"old")
    ns.lookup(b"k")
    ns.ns.forget(old, 0)  # the kernel still holds the old inode (an open racing the replace)
    ns.publish(b"k", b"new!")
    assert ("inode", old) in ns.recorder.events  # its cached data goes
    fh, cacheable = ns.open(old)
    assert not cacheable and ns.read(fh, 100) == b"new!"
    _, cacheable = ns.open(ns.lookup(b"k").inode)
    assert cacheable


def test_without_the_kernel_cache_nothing_is_pushed_and_nothing_is_cacheable():
    made = alone(kernel_cache=False)
    inode = made.publish(b"k", b"bytes")
    assert not any(e[0] == "push" for e in made.recorder.events)
    _, cacheable = made.open(inode)
    assert not cacheable
    made.store.close()


def test_a_page_the_store_drops_is_forgotten_by_name_and_inode(ns):
    inode = ns.publish(b"k", b"bytes")
    ns.ns.pages_gone(["m/f/tp0of1/kv/k", "m/f/tp0of1/other/x"])  # an unknown directory is fine
    assert ("entry", ns.pool, b"k") in ns.recorder.events
    assert ("inode", inode) in ns.recorder.events
    assert ns.ns.getattr(inode).nlink == 0  # a file still open keeps its attributes


def test_a_page_sent_through_the_ingest_file_replaces_the_name_the_kernel_knows(ns):
    old = ns.publish(b"k", b"old")
    draft = ns.ns.publishing.reserve_page("m/f/tp0of1/kv/k", 3)
    draft.write(0, b"new")
    ns.ns.publishing.publish_page("m/f/tp0of1/kv/k", draft)
    assert ("inode", old) in ns.recorder.events and ("entry", ns.pool, b"k") in ns.recorder.events
    fh, cacheable = ns.open(old)  # the old inode still leads to the name: never ENOENT
    assert ns.read(fh) == b"new" and not cacheable
