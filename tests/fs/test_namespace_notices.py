"""What the namespace tells the kernel, without FUSE: a recorder stands in for the notifier."""

from __future__ import annotations

import os

import pytest
import trio

from hicachefs.fs.control import ControlFiles
from hicachefs.fs.namespace import ROOT_INODE, Namespace
from hicachefs.store import PageStore, StoreConfig

POOL = ("m", "f", "tp0of1", "kv")


class Recorder:
    def __init__(self):
        self.events = []

    def push(self, inode, reader):
        self.events.append(("push", inode, bytes(reader.view())))
        reader.close()
        return True

    def forget_entry(self, parent_inode, name):
        self.events.append(("entry", parent_inode, name))

    def forget_inode(self, inode):
        self.events.append(("inode", inode))


@pytest.fixture
def namespace():
    store = PageStore(StoreConfig(memory_bytes=16 << 20, max_page_size=1 << 20))
    recorder = Recorder()
    ns = Namespace(store, ControlFiles(store, dict, {}), recorder)
    ns.recorder = recorder
    parent = ROOT_INODE
    for part in POOL:
        parent = ns.mkdir(parent, part.encode()).inode
    ns.pool = parent
    yield ns
    store.close()


def publish(ns: Namespace, key: bytes, data: bytes) -> int:
    """create .tmp, write, release, rename: returns the page's inode."""
    st, fh = ns.create(ns.pool, b".tmp-" + key, os.O_WRONLY)
    trio.run(ns.handles[fh].write, 0, data)
    ns.release(fh)
    ns.rename(ns.pool, b".tmp-" + key, ns.pool, key, 0)
    return st.inode


def test_publish_pushes_the_page_to_the_inode_the_kernel_knows(namespace):
    inode = publish(namespace, b"k", b"page bytes")
    assert namespace.recorder.events == [("push", inode, b"page bytes")]  # nothing else to say
    assert namespace.lookup(namespace.pool, b"k").inode == inode


def test_an_open_of_an_inode_whose_page_was_replaced_bypasses_the_cache(namespace):
    old = publish(namespace, b"k", b"old")
    namespace.lookup(namespace.pool, b"k")
    namespace.forget(old, 0)  # the kernel still holds the old inode (an open racing the replace)
    publish(namespace, b"k", b"new!")
    assert ("inode", old) in namespace.recorder.events  # its cached data goes
    name = namespace.open(old, os.O_RDONLY)
    fh, cacheable = namespace.add_page_handle(old, namespace.open_reader(name))
    assert not cacheable and bytes(trio.run(namespace.handles[fh].read, 0, 100)) == b"new!"
    new = namespace.lookup(namespace.pool, b"k").inode
    fh, cacheable = namespace.add_page_handle(new, namespace.open_reader(namespace.open(new, os.O_RDONLY)))
    assert cacheable


def test_without_the_kernel_cache_nothing_is_pushed_and_nothing_is_cacheable(namespace):
    namespace.kernel_cache = False
    inode = publish(namespace, b"k", b"bytes")
    assert not any(e[0] == "push" for e in namespace.recorder.events)
    _, cacheable = namespace.add_page_handle(inode, namespace.open_reader(namespace.open(inode, os.O_RDONLY)))
    assert not cacheable


def test_a_page_the_store_drops_is_forgotten_by_name_and_inode(namespace):
    inode = publish(namespace, b"k", b"bytes")
    namespace.pages_gone(["m/f/tp0of1/kv/k", "m/f/tp0of1/other/x"])  # an unknown directory is fine
    assert ("entry", namespace.pool, b"k") in namespace.recorder.events
    assert ("inode", inode) in namespace.recorder.events
    assert namespace.getattr(inode).nlink == 0  # a file still open keeps its attributes
