"""The publish rules of DESIGN.md ("Page files"), asked of the namespace alone, without FUSE."""

from __future__ import annotations

import errno
import os
import time

import pytest

from hicachefs.posix import blocking
from hicachefs.posix.errors import FsError
from hicachefs.posix.namespace import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INODE
from hicachefs.store import DeviceError, NeedsIO, PageStore, PrivateReadsFull, StoreConfig
from hicachefs.store.ssd.device import FileDevice
from hicachefs.store.ssd.ssd_tier import ARENA_NAME
from hicachefs_testing.faults import Fault, FaultyDevice
from namespace_alone import POOL, Alone, alone, settled


MiB = 1 << 20


@pytest.fixture
def ns():
    made = alone()
    yield made
    made.store.close()


def refused(call, *args) -> int:
    with pytest.raises(FsError) as info:
        settled(call(*args))
    return info.value.errno


def test_a_temporary_file_is_a_page_only_once_renamed_and_then_whole(ns):
    inode, fh = ns.create(b".tmp")
    ns.write(fh, b"first half ")
    ns.write(fh, b"second half", offset=11)
    assert ns.lookup(b"key") is None
    ns.close(fh)
    assert ns.lookup(b"key") is None  # closing does not publish a temporary file
    ns.ns.rename(ns.pool, b".tmp", ns.pool, b"key", 0)
    assert ns.contents(b"key") == b"first half second half"
    assert ns.lookup(b".tmp") is None


def test_a_file_created_under_a_key_is_published_at_its_last_close(ns):
    inode, fh = ns.create(b"key")
    second, _ = ns.open(inode, os.O_WRONLY)
    ns.write(fh, b"bytes")
    ns.close(fh)
    assert ns.store.info("m/f/tp0of1/kv/key") is None  # still open for writing elsewhere
    ns.close(second)
    assert ns.contents(b"key") == b"bytes"


def test_a_file_whose_write_failed_is_never_published(ns):
    inode, fh = ns.create(b".tmp")
    with pytest.raises(FsError) as info:
        ns.write(fh, b"x", offset=2 << 20)  # past the maximum page size (1 MiB here)
    assert info.value.errno == errno.EFBIG
    with pytest.raises(FsError):
        ns.write(fh, b"y")  # the same error again: the writer's retry must see why
    ns.close(fh)
    assert refused(ns.ns.rename, ns.pool, b".tmp", ns.pool, b"key", 0) == errno.EIO
    assert ns.lookup(b"key") is None and ns.store.statistics().pages == 0


def test_a_temporary_file_whose_publish_failed_is_never_published_with_other_bytes(tmp_path):
    """A rename whose publish fails in the store (a disk write under --write-through) loses the
    file's bytes with it: a second rename must fail too, not publish zeros."""
    device = FaultyDevice(FileDevice(tmp_path / ARENA_NAME))
    store = PageStore(StoreConfig(memory_bytes=16 << 20, disk_dir=tmp_path, disk_bytes=64 << 20,
                                  max_page_size=1 << 20, write_through=True), disk_device=device)
    ns = Alone(store)
    try:
        inode, fh = ns.create(b".tmp")
        data = os.urandom(64 << 10)
        ns.write(fh, data)
        ns.close(fh)
        device.inject(Fault("pwritev", errno=errno.EIO))
        with pytest.raises(DeviceError):
            ns.ns.rename(ns.pool, b".tmp", ns.pool, b"key", 0)
        device.clear()
        assert refused(ns.ns.rename, ns.pool, b".tmp", ns.pool, b"key", 0) == errno.EIO
        assert ns.lookup(b"key") is None
    finally:
        store.close()


def test_published_pages_are_immutable(ns):
    inode = ns.publish(b"key", b"page")
    assert refused(ns.ns.open, inode, os.O_WRONLY) == errno.EPERM
    assert refused(ns.ns.truncate, inode, 0) == errno.EPERM
    assert refused(ns.ns.create, ns.pool, b"key", os.O_WRONLY) == errno.EEXIST
    assert ns.contents(b"key") == b"page"


def test_renames_replace_atomically_and_refuse_what_they_cannot_do(ns):
    ns.publish(b"key", b"old")
    inode, fh = ns.create(b".new")
    ns.write(fh, b"new")
    ns.close(fh)
    assert refused(ns.ns.rename, ns.pool, b".new", ns.pool, b"key", RENAME_NOREPLACE) == errno.EEXIST
    assert refused(ns.ns.rename, ns.pool, b".new", ns.pool, b"key", RENAME_EXCHANGE) == errno.EINVAL
    assert ns.contents(b"key") == b"old"
    ns.ns.rename(ns.pool, b".new", ns.pool, b"key", 0)
    assert ns.contents(b"key") == b"new" and ns.store.statistics().pages == 1
    assert refused(ns.ns.rename, ROOT_INODE, b"m", ROOT_INODE, b"n", 0) == errno.EXDEV


def test_a_page_renamed_moves_with_the_inode_the_kernel_holds(ns):
    inode = ns.publish(b"old", b"payload")
    settled(ns.ns.rename(ns.pool, b"old", ns.pool, b"new", 0))
    assert ns.lookup(b"old") is None
    assert ns.lookup(b"new").inode == inode and ns.contents(b"new") == b"payload"


def test_unlink_removes_a_page_and_drops_a_file_being_written(ns):
    ns.publish(b"key", b"page")
    assert settled(ns.ns.unlink(ns.pool, b"key")) is None
    assert ns.lookup(b"key") is None
    assert refused(ns.ns.unlink, ns.pool, b"key") == errno.ENOENT
    inode, fh = ns.create(b"direct")
    ns.write(fh, b"never")
    ns.ns.unlink(ns.pool, b"direct")
    ns.close(fh)  # its last close publishes nothing: the name is gone
    assert ns.lookup(b"direct") is None


def test_temporary_files_nobody_renamed_are_discarded_after_the_timeout():
    made = alone(temp_timeout_s=10)
    inode, fh = made.create(b".abandoned")
    made.write(fh, b"x" * 100)
    made.close(fh)
    assert made.ns.reap_abandoned() == 0 and made.ns.pending_count() == 1
    assert made.ns.reap_abandoned(now=time.monotonic() + 11) == 1
    assert made.ns.pending_count() == 0 and made.store.statistics().tiers[0].used_bytes == 0
    made.store.close()


def test_only_writers_keep_a_file_being_written():
    """Read-only handles neither keep a temporary file from being discarded (they read EIO after)
    nor a file created under a key from being published (they read the page after), nor write."""
    made = alone(temp_timeout_s=10)
    inode, fh = made.create(b".abandoned")
    made.write(fh, b"x" * 100)
    reader, _ = made.open(inode)
    assert made.read(reader) == b"x" * 100
    with pytest.raises(FsError) as info:
        made.write(reader, b"y")
    assert info.value.errno == errno.EBADF
    made.close(fh)
    assert made.ns.reap_abandoned(now=time.monotonic() + 11) == 1
    with pytest.raises(FsError) as info:
        made.read(reader)
    assert info.value.errno == errno.EIO
    made.close(reader)
    inode, fh = made.create(b"direct")
    reader, _ = made.open(inode)
    made.write(fh, b"page")
    made.close(fh)
    assert made.contents(b"direct") == b"page" and made.read(reader) == b"page"
    made.close(reader)
    assert made.ns.pending_count() == 0 and made.store.statistics().pages == 1
    made.store.close()


def test_directories_keep_the_tree_shape(ns):
    assert refused(ns.ns.mkdir, ns.pool, b"deeper") == errno.EPERM  # pools hold pages
    assert refused(ns.ns.create, ROOT_INODE, b"page", os.O_WRONLY) == errno.EPERM
    ns.publish(b"key", b"page")
    shard = ns.lookup(b"..").inode
    assert refused(ns.ns.rmdir, shard, b"kv") == errno.ENOTEMPTY
    assert refused(ns.ns.mkdir, ns.pool, b".hidden") == errno.EINVAL


def test_a_page_on_the_disk_tier_needs_io_to_open_and_may_be_cached_as_any_page(tmp_path):
    made = alone(tmp_path)
    made.publish(b"cold", b"c" * (1 << 20))
    for i in range(40):  # 40 MiB through a 16 MiB RAM tier: the first page goes down
        made.publish(f"p{i}".encode(), bytes(1 << 20))
    assert made.store.info("m/f/tp0of1/kv/cold").tier == "disk"
    answer = made.ns.open(made.lookup(b"cold").inode, os.O_RDONLY)
    assert isinstance(answer, NeedsIO)  # the namespace, not the adapter, says it blocks
    handle = settled(answer)
    assert handle.cacheable  # opened without direct I/O, so that mmap works on it too
    fh = made.ns.handles.add(handle)
    assert made.read(fh) == b"c" * (1 << 20)
    made.store.close()


def test_a_truncate_of_a_file_already_discarded_holds_no_memory_forever(ns):
    """A writer whose temporary file was removed (rm, or a rename onto a key-named file being
    written) still holds its descriptor; an ftruncate through it fails (EPERM, as a write does)
    and reserves no room that nothing would ever give back."""
    inode, fh = ns.create(b".tmp")
    ns.write(fh, b"x" * 4096)
    ns.ns.unlink(ns.pool, b".tmp")  # rm by someone else; the writer still has it open
    writing = ns.ns.publishing.writing
    assert writing.held == 0
    assert refused(lambda: ns.ns.setattr(inode, size=512 << 10)) == errno.EPERM
    ns.close(fh)
    ns.ns.forget(inode, 1)
    assert ns.ns.pending_count() == 0
    assert writing.held == 0, "the writing share keeps the bytes of a file that is gone"


def test_directories_made_and_removed_again_are_not_kept_forever(ns):
    """A client's clear() is an rm -r of its shard, and its next batch makes the pools again:
    the daemon does not keep every directory it ever had."""
    shard = ns.ns.lookup(ns.ns.lookup(ROOT_INODE, b"m").inode, b"f").inode
    before = len(ns.ns.tree._by_inode)
    for _ in range(100):
        made = ns.ns.mkdir(shard, b"tp1of2").inode
        ns.ns.mkdir(made, b"kv")
        ns.ns.rmdir(made, b"kv")
        ns.ns.rmdir(shard, b"tp1of2")
    assert len(ns.ns.tree._by_inode) == before, "removed directories stay in the daemon's memory"
    assert refused(ns.ns.getattr, made) == errno.ENOENT


def test_tiny_files_being_written_hold_no_more_of_the_ram_tier_than_their_share():
    """Files being written count at their slot's size (64 bytes at least), what their drafts
    take of the RAM tier: 49,151 files of one byte were counted 49,152 bytes of a 2 MiB share,
    held 3 MiB of slots, and evicted half the published pages, ENOSPC never coming."""
    store = PageStore(StoreConfig(memory_bytes=4 << 20, max_page_size=1 << 20))
    try:
        ns = Alone(store)
        for i in range(32):  # half the tier, the half the files being written leave
            ns.publish(b"%064x" % i, bytes([i]) * (64 << 10))
        writing = ns.ns.publishing.writing
        refused = 0
        for i in range(48 << 10):
            inode, fh = ns.create(b".tiny-%d" % i)
            try:
                ns.ns.truncate(inode, 1)
            except FsError as exc:
                refused = exc.errno
                break
            finally:
                ns.close(fh)
        assert refused == errno.ENOSPC and writing.held <= writing.limit
        assert all(store.info(f"m/f/tp0of1/kv/{i:064x}") is not None for i in range(32)), "published pages evicted"
    finally:
        store.close()


def test_a_second_try_refused_with_eio_lets_go_of_the_page_it_read(tmp_path):
    """The second try of an open that raced a replace reads the name's page (here from the disk
    tier, into private memory); when the inode's own version is no longer pinned by the files
    open on it, that open fails with EIO. The page it had read was never let go: its bytes stayed
    counted in ``private_reads`` for good, and once that share was full every first read of a
    disk page failed (found by review)."""
    made = alone(tmp_path)  # 16 MiB RAM, 1 MiB pages, a disk tier
    try:
        filler = 0
        for round_ in range(2):
            pid, key = 4242 + round_, b"k%d" % round_
            first = made.publish(key, b"1" * MiB)
            made.publish(key, b"2" * MiB)
            assert refused(made.ns.open, first, os.O_RDONLY, 0, pid) == errno.ESTALE  # raced the replace
            second = made.lookup(key).inode  # the kernel's fresh lookup
            other = settled(made.ns.open(second, os.O_RDONLY, pid=1))  # another process's file on it
            other.unpin()  # its lease ended
            for _ in range(24):  # the page goes down to the disk tier
                made.publish(b"f%d" % filler, bytes(MiB))
                filler += 1
            second_try = made.ns.open(second, os.O_RDONLY, pid=pid)  # a disk read, to come ...
            made.publish(key, b"3" * MiB)  # ... races another replace, whose page goes down too
            for _ in range(24):
                made.publish(b"f%d" % filler, bytes(MiB))
                filler += 1
            assert made.store.info("/".join(POOL) + "/" + key.decode()).tier == "disk"
            with pytest.raises(FsError) as refusal:
                settled(second_try)
            assert refusal.value.errno == errno.EIO
            other.release()
        assert made.store.statistics().ram_budget.shares["private_reads"].held_bytes == 0
    finally:
        made.store.close()


def test_a_plain_users_read_through_a_file_opened_while_written_counts_against_others_share(tmp_path, monkeypatch):
    """A plain user who opened a file while it was being written, and read it once it was
    published and gone down to the disk tier, had its copy counted in root's part of
    ``private_reads``, not in ``private_reads_of_others`` as every other read of such a user:
    plain users could take the room the store's own readers need (found by review). Such a read
    now waits for room in its user's share, and is refused when none comes."""
    monkeypatch.setattr(blocking, "PRIVATE_ROOM_WAIT_S", 0.2)
    made = alone(tmp_path)  # 16 MiB RAM, 1 MiB pages, a disk tier; others' share: one page
    plain = 12345
    try:
        inode, writer = made.create(b".tmp-k")
        made.write(writer, b"k" * MiB)
        readers = {uid: made.ns.handles.add(settled(made.ns.open(inode, os.O_RDONLY, uid=uid)), uid)
                   for uid in (plain, 0)}
        made.close(writer)
        made.ns.rename(made.pool, b".tmp-k", made.pool, b"k", 0)
        for i in range(24):  # the page goes down to the disk tier, and so does f0
            made.publish(b"f%d" % i, bytes(MiB))
        assert made.store.info("/".join(POOL) + "/k").tier == "disk"
        held = settled(made.ns.open(made.lookup(b"f0").inode, os.O_RDONLY, uid=plain))  # a copy of its own
        assert made.store.statistics().ram_budget.shares["private_reads_of_others"].held_bytes == MiB
        with pytest.raises(PrivateReadsFull):  # (ENOBUFS through FUSE)
            made.read(readers[plain])
        assert made.read(readers[0]) == b"k" * MiB  # root's read finds room in the store's share
        held.release()
        assert made.read(readers[plain]) == b"k" * MiB
        for fh in readers.values():
            made.close(fh)
    finally:
        made.store.close()


def test_a_retry_that_opens_another_file_being_written_leaves_no_second_try_behind(ns):
    """A thread's open of a gone file being written is answered ESTALE; the kernel's retry lands
    on a new file of that name, which opens. The mark the ESTALE left stayed, and a later open by
    that thread of the name's page, replaced since, counted as the kernel's second try and read
    the replaced version (found by review)."""
    thread = 4242

    def open_as(inode):
        try:
            handle = settled(ns.ns.open(inode, os.O_RDONLY, uid=os.getuid(), pid=thread))
        except FsError as exc:
            return exc.errno
        fh = ns.ns.handles.add(handle)
        try:
            return ns.read(fh)
        finally:
            ns.close(fh)

    first, first_writer = ns.create(b"k")
    ns.ns.unlink(ns.pool, b"k")
    second, second_writer = ns.create(b"k")
    assert open_as(first) == errno.ESTALE
    assert open_as(second) == b""  # the retry
    ns.write(second_writer, b"V1-" * 10)
    ns.close(second_writer)
    ns.close(first_writer)
    ns.lookup(b"k")
    pin, _ = ns.open(second)  # an open file keeps version 1 of the page
    ns.publish(b"k", b"V2-" * 10)
    assert open_as(second) == errno.ESTALE  # the kernel looks k up again: version 2
    ns.close(pin)
