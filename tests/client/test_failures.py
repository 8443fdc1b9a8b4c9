"""The client never raises into SGLang: a dead daemon, a bare mountpoint, a full or strict store,
a bug of its own."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from hicachefs_testing import mounting

from hicachefs_client.accounting import FailureLog
from hicachefs_client.sglang_types import PoolName, PoolTransfer
from hicachefs_testing.host_pools import MHAHostPool, page_bytes
from hicachefs_testing.workload import fill_writing_share
from forking import forked_while_held
from pages import wait_until
from test_backend import files_under, indices, key, make_fs


def _messages(caplog, text):
    return [r for r in caplog.records if text in r.getMessage()]


def test_daemon_killed_then_remounted(mount_factory, caplog):
    first = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=16)
    fs = make_fs(first.path, pool)
    fs.register_mem_host_pool_v2(pool, PoolName.KV)
    old = [key("crash", "old", i) for i in range(4)]
    assert fs.batch_set_v1(old, indices(pool, range(4))) == [True] * 4

    os.kill(first.pid, signal.SIGKILL)  # the daemon dies; the mount answers ENOTCONN
    assert mounting.wait_gone(first.pid, 10)
    new = [key("crash", "new", i) for i in range(4)]
    with caplog.at_level(logging.INFO, logger="hicachefs_client"):
        for _ in range(3):
            assert fs.batch_get_v1(old, indices(pool, range(4, 8))) == [False] * 4
            assert fs.batch_exists(old) == 0
            assert fs.batch_set_v1(new, indices(pool, range(4))) == [False] * 4
            assert fs.batch_exists_v2(old, []).kv_hit_pages == 0
            assert fs.batch_get_v2([PoolTransfer(name=PoolName.KV, keys=old[:1],
                                                 host_indices=indices(pool, [9]))]) == {PoolName.KV: [False]}
            assert fs.exists(old[0]) is False
            assert fs.get(old[0], pool.get_dummy_flat_data_page()) is None
            assert fs.set(new[0], pool.get_data_page(0)) is False
            assert fs.clear() is False  # nothing can be removed: the daemon is gone
        assert len(_messages(caplog, "ENOTCONN")) == 1  # once per kind, not per page
        assert fs.statistics()["errors"]["ENOTCONN"] >= 20

        # Unmounted: the mountpoint is a bare directory now. Pages must not land on the disk below.
        mounting.unmount_path(first.path)
        assert fs.batch_set_v1(new, indices(pool, range(4))) == [False] * 4
        assert fs.batch_exists(new) == 0
        assert os.listdir(first.path) == []

        second = mount_factory("--memory", "64M", path=first.path)
        try:
            assert fs.batch_set_v1(new, indices(pool, range(4))) == [True] * 4
            assert fs.batch_exists(new) == 4
            assert fs.batch_get_v1(new, indices(pool, range(8, 12))) == [True] * 4
            assert page_bytes(pool, 8) == page_bytes(pool, 0)
            assert fs.batch_exists(old) == 0  # RAM only: the crash lost them, nothing corrupt
            assert _messages(caplog, "works again")
        finally:
            mounting.stop(second)
    assert fs.statistics()["errors"].get("MOUNT_GONE", 0) >= 1


def test_the_first_calls_after_a_quick_restart_are_served_without_the_plane(mount_factory):
    """Each thread keeps its handles on the control files; after a daemon was killed and
    remounted with no call in between, the first fetch and ingest of each thread went to the
    dead connection and their batches were lost (ECONNABORTED even kept the ingest handle for
    the next batch)."""
    first = mount_factory("--memory", "64M")
    pool = MHAHostPool(pages=64)
    fs = make_fs(first.path, pool, extra={"data_plane": False})
    keys = [key("quick", i) for i in range(8)]
    assert fs.batch_set_v1(keys, indices(pool, range(8))) == [True] * 8
    assert fs.batch_get_v1(keys, indices(pool, range(8, 16))) == [True] * 8
    os.kill(first.pid, signal.SIGKILL)
    assert mounting.wait_gone(first.pid, 10)
    mounting.unmount_path(first.path)
    mount_factory("--memory", "64M", path=first.path)
    assert fs.batch_set_v1(keys, indices(pool, range(8))) == [True] * 8
    assert fs.batch_get_v1(keys, indices(pool, range(16, 24))) == [True] * 8
    assert [page_bytes(pool, 16 + i) for i in range(8)] == [page_bytes(pool, i) for i in range(8)]


def test_a_client_made_before_the_mount_writes_nothing_there_and_serves_the_mount_once_it_comes(
        mount_factory, tmp_path, caplog):
    """SGLang started before ``hicachefs mount``: the client took the bare mountpoint for a store
    and wrote its pages there (on the disk below, never evicted), and the mount made then was
    refused, the directory not being empty."""
    root = tmp_path / "mnt"
    root.mkdir()
    pool = MHAHostPool(pages=16)
    caplog.set_level(logging.INFO, logger="hicachefs_client")
    fs = make_fs(root, pool, extra={"plain_directory": False})
    keys = [key("before the mount", i) for i in range(4)]
    assert fs.batch_set_v1(keys, indices(pool, range(4))) == [False] * 4
    assert fs.batch_exists(keys) == 0 and not fs.exists(keys[0])
    assert fs.batch_get_v1(keys, indices(pool, range(4, 8))) == [False] * 4
    assert not fs.set(keys[0], pool.get_data_page(0)) and fs.get(keys[0]) is None
    assert os.listdir(root) == []
    mount_factory("--memory", "64M", path=root)  # refused before: not empty
    wait_until(lambda: fs.batch_set_v1(keys, indices(pool, range(4))) == [True] * 4, timeout=5)
    assert fs.batch_exists(keys) == 4
    assert fs.batch_get_v1(keys, indices(pool, range(4, 8))) == [True] * 4
    assert [page_bytes(pool, 4 + i) for i in range(4)] == [page_bytes(pool, i) for i in range(4)]
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("is no hicachefs mount" in line for line in said) == 1
    assert sum("is a hicachefs mount now" in line for line in said) == 1
    fs.close()


def test_a_child_forked_while_a_thread_looks_for_the_mount_takes_the_mount_up(mount_factory, tmp_path):
    """The look for a mount not seen yet holds a lock: a child forked while another thread held
    it waited on it at every call, for good, never serving the mount."""
    root = tmp_path / "mnt"
    root.mkdir()
    pool = MHAHostPool(pages=8)
    fs = make_fs(root, pool, extra={"plain_directory": False})
    keys = [key("forked before the mount", i) for i in range(4)]
    assert fs.batch_exists(keys) == 0
    mount = mount_factory("--memory", "64M", path=root)

    def served() -> bool:
        wait_until(lambda: fs.batch_set_v1(keys, indices(pool, range(4))) == [True] * 4, timeout=10)
        return fs.batch_exists(keys) == 4

    # another thread inside the look for the mount at the fork
    assert forked_while_held([fs.io._look_lock], served) == 0, "the child's calls failed or hung"
    assert mount.stats()["pages"] >= 4
    fs.close()


def test_pages_are_not_written_below_a_mount_that_went_away(mount_factory, tmp_path):
    """A client that had seen the mount refused to write below it only where it had to make the
    pool's directories: with one left on the disk below (made by hand, or by an older client),
    its page files landed there, never evicted, and were served from there."""
    root = tmp_path / "mnt"
    root.mkdir()
    pool = MHAHostPool(pages=8)
    mount = mount_factory("--memory", "64M", path=root)
    fs = make_fs(root, pool, extra={"data_plane": False})
    keys = [key("gone", i) for i in range(2)]
    assert fs.batch_set_v1(keys, indices(pool, range(2))) == [True] * 2
    pool_dir = os.path.join(root, os.path.dirname(files_under(root)[0]))
    mounting.stop(mount)
    os.makedirs(pool_dir)  # left on the disk below the mountpoint
    more = [key("gone later", i) for i in range(2)]
    assert fs.batch_set_v1(more, indices(pool, range(2))) == [False] * 2
    assert not fs.set(more[0], pool.get_data_page(0))
    assert os.listdir(pool_dir) == []
    fs.close()


def test_control_files_of_their_own_are_used_once_the_mount_comes_up(mount_factory, tmp_path):
    """A client made before the mount (or called while it was down) took the missing
    ``.hicachefs/exists.N`` for a daemon without such files, and every thread queued on the one
    shared control file of each kind for the rest of the process."""
    root = tmp_path / "mnt"
    root.mkdir()
    pool = MHAHostPool(pages=16)
    fs = make_fs(root, pool, extra={"data_plane": False, "plain_directory": False})
    keys = [key("lane", i) for i in range(4)]
    assert fs.batch_exists(keys) == 0  # a bare directory
    mount_factory("--memory", "64M", path=root)
    time.sleep(1.1)  # past the client's retry interval
    assert fs.batch_set_v1(keys, indices(pool, range(4))) == [True] * 4
    assert fs.batch_exists(keys) == 4
    assert fs.batch_get_v1(keys, indices(pool, range(4, 8))) == [True] * 4
    control = [os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) for fd in os.listdir("/proc/self/fd")
               if _link(fd).startswith(f"{root}/.hicachefs/")]
    assert sorted(name.partition(".")[0] for name in control) == ["exists", "fetch", "ingest"]
    assert all("." in name for name in control), control


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_page_too_large_is_refused_once(mount_factory, caplog):
    mount = mount_factory("--memory", "64M", "--max-page-size", "4K")
    pool = MHAHostPool()  # 8 KiB pages
    fs = make_fs(mount.path, pool)
    keys = [key("big", i) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="hicachefs_client"):
        assert fs.batch_set_v1(keys, indices(pool, range(3))) == [False] * 3
    assert fs.batch_exists(keys) == 0
    assert fs.statistics()["errors"]["EFBIG"] == 3
    assert len(_messages(caplog, "EFBIG")) == 1
    # No temporary file is left behind.
    assert not [n for d, _, names in os.walk(mount.path) for n in names if n.startswith(".")
                and ".hicachefs" not in d]


def test_full_store_gives_false_not_exceptions(mount_factory, caplog):
    """Files being written hold all the RAM they may (half of ``--memory``): a backup then
    fails page by page with ENOSPC, answered False, the pages stored still read whole, and
    room comes back once those files are gone."""
    mount = mount_factory("--memory", "16M")
    pool = MHAHostPool(pages=96, layer_num=16, head_num=4, head_dim=64)  # 256 KiB pages
    # Stored by another writer: a client's plane holds slots reserved for its next batch.
    writer = make_fs(mount.path, pool)
    stored = [key("full", "stored", i) for i in range(12)]
    assert writer.batch_set_v1(stored, indices(pool, range(12))) == [True] * 12
    writer.close()
    page_size = os.stat(mount.path / files_under(mount.path)[0]).st_size
    held = fill_writing_share((mount.path / files_under(mount.path)[0]).parent, page_size)
    fs = make_fs(mount.path, pool)
    assert (len(held) - 1) * page_size <= 8 << 20
    new_keys = [key("full", "new", i) for i in range(12)]
    new_pages, spare = range(12, 24), range(24, 36)
    with caplog.at_level(logging.WARNING, logger="hicachefs_client"):
        assert fs.batch_set_v1(new_keys, indices(pool, new_pages)) == [False] * 12
    assert fs.statistics()["errors"] == {"ENOSPC": 12}
    assert len(_messages(caplog, "ENOSPC")) == 1
    assert fs.batch_exists(new_keys) == 0
    assert fs.batch_get_v1(stored, indices(pool, spare)) == [True] * 12
    assert [page_bytes(pool, p) for p in spare] == [page_bytes(pool, p) for p in range(12)]
    for path in held:
        os.unlink(path)
    # The files being written gone: there is room for new pages again.
    assert fs.batch_set_v1(new_keys, indices(pool, new_pages)) == [True] * 12
    assert fs.batch_get_v1(new_keys, indices(pool, spare)) == [True] * 12
    assert [page_bytes(pool, p) for p in spare] == [page_bytes(pool, p) for p in new_pages]


def _kv(keys, pool):
    return [PoolTransfer(name=PoolName.KV, keys=keys, host_indices=indices(pool, range(len(keys))))]


@pytest.mark.parametrize("call, answered", [
    (lambda fs, keys, pool: fs.batch_get_v1(keys, indices(pool, [0, 1])), [False, False]),
    (lambda fs, keys, pool: fs.batch_set_v1(keys=keys, host_indices=indices(pool, [0, 1])), [False, False]),
    (lambda fs, keys, pool: fs.batch_get_v2(_kv(keys, pool)), {PoolName.KV: [False, False]}),
    (lambda fs, keys, pool: fs.batch_set_v2(_kv(keys, pool)), {PoolName.KV: [False, False]}),
    (lambda fs, keys, pool: fs.exists(keys[0]), False),
    (lambda fs, keys, pool: fs.batch_exists(keys), 0),
    (lambda fs, keys, pool: (lambda r: (r.kv_hit_pages, r.extra_pool_hit_pages))(fs.batch_exists_v2(keys)), (0, {})),
    (lambda fs, keys, pool: fs.get(keys[0]), None),
    (lambda fs, keys, pool: fs.set(keys[0], pool.get_data_page(0)), False),
    (lambda fs, keys, pool: fs.clear(), False),
], ids=["batch_get_v1", "batch_set_v1", "batch_get_v2", "batch_set_v2", "exists", "batch_exists",
        "batch_exists_v2", "get", "set", "clear"])
def test_an_unexpected_exception_is_a_failure_counted_and_logged_never_raised(plain_root, caplog, call, answered):
    pool = MHAHostPool()
    fs = make_fs(plain_root, pool)

    def broken(name):
        raise RuntimeError("a bug in the client")

    fs._layout = broken  # every call above needs its pool's layout
    with caplog.at_level(logging.ERROR, logger="hicachefs_client"):
        assert call(fs, [key("bug", 0), key("bug", 1)], pool) == answered
    assert fs.statistics()["errors"] == {"INTERNAL_RuntimeError": 1}
    assert len(_messages(caplog, "a bug in the client")) == 1


def test_a_plain_user_s_refused_writes_are_logged_once(caplog):
    """Only root and the daemon's user may change the store: a plain user's every write fails
    with EACCES, a lasting fact. It was logged anew after each read that worked ("the mount works
    again"): a warning per batch written (some 1,000 in 15 s of SGLang-like traffic), and the
    ingest file opened again every second. (The client itself cannot run as a plain user here: a
    checkout in a 0700 directory, and its .venv, are out of that user's reach.)"""
    failures = FailureLog()
    with caplog.at_level(logging.INFO, logger="hicachefs_client.accounting"):
        for _ in range(6):  # a batch written (refused), then one read that works
            failures.failure("EACCES", "cannot publish a page: Permission denied")
            failures.success()
    assert failures.counts() == {"EACCES": 6}  # every refused write still counted
    assert [r.getMessage() for r in caplog.records if "EACCES" in r.getMessage()] == \
        ["hicachefs client: cannot publish a page: Permission denied (EACCES; further EACCES failures are counted, not logged)"]
    assert not [r for r in caplog.records if "works again" in r.getMessage()]
