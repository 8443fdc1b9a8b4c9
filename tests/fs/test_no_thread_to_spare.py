"""A daemon at its limit of threads (a cgroup's pids.max, RLIMIT_NPROC) cannot start the worker
that a read from the shared tier, or a removal or a move there, needs: the request is refused
with EAGAIN, counted like any refusal and logged without a traceback (it answered EIO with a
traceback). A read or a rename changed nothing; an rm tried again once a thread can be had
removes the page everywhere."""

from __future__ import annotations

import errno
import logging
import os
import threading

import pytest
import trio
import trio._core._thread_cache as thread_cache
from namespace_alone import POOL, Alone
from pages import wait_until

from hicachefs.posix.errors import FsError
from hicachefs.posix.requests import Requests
from hicachefs.store import NeedsIO, PageStore, StoreConfig

KiB = 1 << 10


class NoThreadToSpare(threading.Thread):
    def start(self):
        raise RuntimeError("can't start new thread")  # what Thread.start says where clone fails


@pytest.fixture
def stores(tmp_path):
    """(A, B): two hosts on one shared directory; B under a namespace, A only writes there."""
    config = StoreConfig(memory_bytes=16 << 20, max_page_size=1 << 20, shared_dir=tmp_path / "shared")
    a, b = PageStore(config), PageStore(config)
    yield a, b
    a.close()
    b.close()


def refusal(requests: Requests, op: str, call) -> int:
    """The errno ``call`` (a request's coroutine function) is answered with."""
    with pytest.raises(FsError) as refused:
        trio.run(call)
    return requests.refused(op, (), refused.value)


def test_without_a_thread_to_spare_requests_are_refused_with_eagain(stores, monkeypatch, caplog):
    a, b = stores
    alone = Alone(b)
    pool = "/".join(POOL)
    alone.publish(b"here", b"h" * (64 * KiB))
    wait_until(lambda: b.statistics().tier("shared").pages >= 1)  # written behind to the shared tier too
    a.put(f"{pool}/there", b"t" * (64 * KiB))
    wait_until(lambda: isinstance(b.lookup(f"{pool}/there"), NeedsIO))  # on the shared tier alone
    there = alone.lookup(b"there").inode
    requests = Requests(alone.ns)
    monkeypatch.setattr(thread_cache, "THREAD_CACHE", thread_cache.ThreadCache())  # no idle worker
    monkeypatch.setattr(thread_cache, "Thread", NoThreadToSpare)
    with caplog.at_level(logging.WARNING):
        assert refusal(requests, "open", lambda: requests.open(there, os.O_RDONLY, 0)) == errno.EAGAIN
        assert refusal(requests, "rename", lambda: requests.rename(alone.pool, b"here", alone.pool, b"moved", 0, 0)) \
            == errno.EAGAIN
        here = b.info(f"{pool}/here")
        assert here is not None and here.tier == "memory" and alone.lookup(b"moved") is None  # as they were
        assert refusal(requests, "unlink", lambda: requests.unlink(alone.pool, b"here", 0)) == errno.EAGAIN
    assert requests.errors == {"EAGAIN": 3}
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    monkeypatch.undo()
    assert alone.contents(b"there") == b"t" * (64 * KiB)
    trio.run(requests.unlink, alone.pool, b"here", 0)  # tried again: gone from every tier
    assert b.lookup(f"{pool}/here") is None
    wait_until(lambda: a.lookup(f"{pool}/here") is None)  # the other host hears of it
