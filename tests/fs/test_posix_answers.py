"""What the mount answers the POSIX calls that shell tools and scripts make and decide on:
access(2) for a plain user, rmdir of the control directory, a rename of a file still being
written under its key, the link count of a removed file still open, the directories' mtime
after rm and mv (of a page and of a file being written), chmod and chown by a plain user, and a temporary name that is not UTF-8 in
the daemon's log; access(2) of the read-only control files for root, mknod of a regular file, an
open of a file dropped at its close; a rename onto a temporary name, a write after its file was removed."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import threading
import time

import pytest

from pages import as_nobody, publish, wait_until


def test_access_tells_a_plain_user_the_truth(public_mount):
    """No ``access`` handler and no ``default_permissions``: the kernel gets ENOSYS once and from
    then on answers every access(2) 'allowed', so ``test -w`` says a plain user may write a page,
    a pool, and open ``ingest`` (all of which then fail with EACCES)."""
    pool = public_mount.page_dir()
    page = publish(pool, "k", b"x" * 100)
    ingest = public_mount.path / ".hicachefs" / "ingest"
    for path in (page, pool):
        assert as_nobody("test", "-w", str(path)).returncode != 0, f"nobody: test -w {path} says writable"
    assert as_nobody("test", "-r", str(ingest)).returncode != 0, "nobody: test -r ingest says readable"
    # what the access answers promise indeed fails:
    assert as_nobody("touch", str(page)).returncode != 0
    assert as_nobody("cat", str(ingest)).returncode != 0


def test_rmdir_of_control_directory_is_not_enoent(mounted):
    control = mounted.path / ".hicachefs"
    assert control.is_dir()
    with pytest.raises(OSError) as info:
        os.rmdir(control)
    assert info.value.errno != errno.ENOENT, "rmdir says an existing directory does not exist"


def test_rename_of_a_key_named_file_being_written_does_not_cut_off_its_writer(mounted):
    """contract.md: a file created under its key 'follows POSIX: it is published at its last
    close for writing, with what was written'. A rename of it while open publishes it at once,
    short, and its writer's next writes fail with EPERM."""
    pool = mounted.page_dir()
    fd = os.open(pool / "k", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"abc")
        os.rename(pool / "k", pool / "k2")
        os.write(fd, b"def")  # EPERM here today
    finally:
        os.close(fd)
    assert (pool / "k2").read_bytes() == b"abcdef"


def test_unlinked_file_being_written_shows_no_links(mounted):
    """fstat of an open file being written, after rm (or a replace of its name): st_nlink
    stays 1, as if the name still led to it (pages show 0, as POSIX has it)."""
    pool = mounted.page_dir()
    fd = os.open(pool / ".t", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"abc")
        os.unlink(pool / ".t")
        assert not (pool / ".t").exists()
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)


def test_a_rename_onto_a_temporary_name_is_not_permitted_and_keeps_the_page(mounted):
    """Temporary names (``.x``) are made by create only. A rename onto one failed with EINVAL,
    the bad name's errno, which ``mv`` reports as a move 'to a subdirectory of itself'."""
    pool = mounted.page_dir()
    page = publish(pool, "k", b"page bytes")
    moved = subprocess.run(["mv", str(page), str(pool / ".bak")], capture_output=True, text=True)
    assert moved.returncode != 0
    assert "not permitted" in moved.stderr and "subdirectory" not in moved.stderr, moved.stderr
    fd = os.open(pool / ".a", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    with pytest.raises(OSError) as info:
        os.rename(pool / ".a", pool / ".b")
    assert info.value.errno == errno.EPERM
    assert page.read_bytes() == b"page bytes" and not (pool / ".bak").exists()


def test_a_writer_whose_file_is_removed_is_told_at_its_next_write_and_nothing_is_published(mounted):
    """contract.md: a file being written whose name is removed (or replaced by a rename) is
    discarded; its writer's later writes fail with EPERM, and nothing appears under the name."""
    pool = mounted.page_dir()
    for name in ("k", ".t"):
        fd = os.open(pool / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"abc")
            os.unlink(pool / name)
            with pytest.raises(OSError) as info:
                os.write(fd, b"def")
            assert info.value.errno == errno.EPERM
        finally:
            os.close(fd)
        assert not (pool / name).exists()


def test_removing_or_moving_a_page_changes_its_directories_mtime(mounted):
    """Publishing a page moves its pool's mtime, rm and mv of a page do not (POSIX: unlink and
    rename update the parents' mtime; make, rsync and backup tools rely on it)."""
    pool, other = mounted.page_dir(), mounted.page_dir("model", "bfloat16-page_first-64", "tp0of1", "kv2")
    publish(pool, "a", b"1" * 10)
    publish(pool, "b", b"2" * 10)
    before, before_other = os.stat(pool).st_mtime_ns, os.stat(other).st_mtime_ns
    time.sleep(0.02)
    os.unlink(pool / "a")
    assert os.stat(pool).st_mtime_ns > before, "rm of a page left its directory's mtime"
    before = os.stat(pool).st_mtime_ns
    time.sleep(0.02)
    os.rename(pool / "b", other / "b")
    assert os.stat(pool).st_mtime_ns > before, "mv of a page out left the source directory's mtime"
    assert os.stat(other).st_mtime_ns > before_other, "mv of a page in left the target directory's mtime"


def test_moving_a_file_being_written_changes_its_directories_mtime(mounted):
    """As a page's: mv of a file still being written under its key, to another pool."""
    pool, other = mounted.page_dir(), mounted.page_dir("model", "bfloat16-page_first-64", "tp0of1", "kv2")
    fd = os.open(pool / "k", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"x" * 10)
        before, before_other = os.stat(pool).st_mtime_ns, os.stat(other).st_mtime_ns
        time.sleep(0.02)
        os.rename(pool / "k", other / "k")
        assert os.stat(pool).st_mtime_ns > before, "mv of a file being written left the source directory's mtime"
        assert os.stat(other).st_mtime_ns > before_other, "... and the target directory's"
    finally:
        os.close(fd)
    assert (other / "k").read_bytes() == b"x" * 10


def test_reaping_a_temporary_file_with_a_non_utf8_name_logs_no_traceback(mount_factory):
    """Temporary names may be any bytes (check_temporary); the reaper logs the name, a str
    with surrogates, which the log file's UTF-8 stream cannot encode: '--- Logging error ---'
    and a traceback land in the daemon log, and the line itself is lost."""
    mount = mount_factory("--memory", "64M", "--temp-timeout", "1")
    pool = mount.page_dir()
    name = os.fsencode(pool) + b"/.\xff\xfe"
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    wait_until(lambda: not os.path.exists(name), timeout=10)
    wait_until(lambda: "discarding abandoned" in mount.log_text() or "Logging error" in mount.log_text(), timeout=10)
    assert "Logging error" not in mount.log_text()


def test_plain_user_chmod_and_chown_fail_with_eperm(public_mount):
    """POSIX (and every local filesystem): chmod/chown by a user who does not own the file fail
    with EPERM, as the contract says for changes root may not make either; here EACCES."""
    pool = public_mount.page_dir()
    page = publish(pool, "k", b"x" * 10)
    for command in (("chmod", "444", str(page)), ("chown", "0", str(page)), ("chmod", "755", str(pool))):
        result = as_nobody(*command)
        assert result.returncode != 0
        assert "Operation not permitted" in result.stderr, (command, result.stderr)


def test_access_tells_root_the_read_only_control_files_are_not_writable(mounted):
    """access(2) answers what the call would do, for root too: ``test -w`` on ``stats``,
    ``config``, ``metrics`` or the control directory said yes, and the open for writing (or a
    file made there) then failed with EACCES. The request files root may write say yes."""
    control = mounted.path / ".hicachefs"
    for name in ("stats", "config", "metrics"):
        assert not os.access(control / name, os.W_OK), f"test -w .hicachefs/{name} says writable"
        with pytest.raises(PermissionError):
            os.open(control / name, os.O_WRONLY)
    assert not os.access(control, os.W_OK), "test -w .hicachefs says writable"
    with pytest.raises(OSError):
        os.open(control / "made", os.O_WRONLY | os.O_CREAT, 0o644)
    for name in ("exists", "fetch", "ingest"):
        assert os.access(control / name, os.R_OK | os.W_OK), f"root: test -w .hicachefs/{name} says no"


def test_mknod_of_a_regular_file_makes_a_file_published_at_its_writers_close(mounted):
    """mknod(2) of a regular file is how ``tar --xattrs -x`` makes each member (then opens it
    for writing): it was refused with EPERM, as special files are, so such an archive extracted
    nothing. A special file is still refused."""
    pool = mounted.page_dir()
    os.mknod(pool / "k", 0o644 | stat.S_IFREG)
    assert os.stat(pool / "k").st_size == 0
    with open(pool / "k", "wb") as writer:
        writer.write(b"made by mknod")
    assert (pool / "k").read_bytes() == b"made by mknod"
    assert os.stat(pool / "k").st_mode & 0o222 == 0, "not published: a page is read-only"
    with pytest.raises(FileExistsError):
        os.mknod(pool / "k", 0o644 | stat.S_IFREG)
    with pytest.raises(PermissionError):
        os.mknod(pool / "fifo", 0o644 | stat.S_IFIFO)


def test_tar_with_xattrs_extracts_into_a_pool_and_exits_0(mounted, tmp_path):
    """GNU tar makes a member that carries extended attributes with mknod, then writes it."""
    source = tmp_path / "kv"
    source.mkdir()
    (source / "page1").write_bytes(b"one" * 100)
    os.setxattr(source / "page1", "user.origin", b"host1")
    archive = tmp_path / "a.tar"
    subprocess.run(["tar", "--xattrs", "-C", str(tmp_path), "-cf", str(archive), "kv"], check=True)
    shard = mounted.page_dir().parent
    result = subprocess.run(["tar", "--xattrs", "-C", str(shard), "-xf", str(archive)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (shard / "kv" / "page1").read_bytes() == b"one" * 100


def test_a_file_made_with_mknod_and_never_written_is_not_published(mount_factory):
    """Nothing opens it for writing: it is discarded as an abandoned file being written, after
    the temporary files' timeout, and no empty page appears under its key."""
    mount = mount_factory("--memory", "64M", "--temp-timeout", "1")
    pool = mount.page_dir()
    os.mknod(pool / "k", 0o644 | stat.S_IFREG)
    wait_until(lambda: not (pool / "k").exists(), timeout=10)
    assert json.loads((mount.path / ".hicachefs" / "stats").read_text())["pages"] == 0


def test_a_file_dropped_at_its_close_is_not_opened_again(mounted):
    """A file under a key whose write failed (EFBIG) is dropped at its last close, which is
    answered before the kernel is told its name is gone: an open of the name meanwhile opened
    the dropped file, whose reads then failed with EIO. It is ENOENT, as for any name gone."""
    pool = mounted.page_dir()
    for i in range(30):
        path = pool / f"dropped{i}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"a" * 100)
        with pytest.raises(OSError) as refused:
            os.ftruncate(fd, 1 << 30)
        assert refused.value.errno == errno.EFBIG
        os.close(fd)
        try:
            with open(path, "rb") as reader:
                read = reader.read()
        except FileNotFoundError:
            continue
        pytest.fail(f"a dropped file opened again and read {len(read)} bytes")


def test_an_open_racing_the_replace_of_a_file_being_written_finds_one_of_the_two(mounted):
    """A name that holds a file being written, then the page renamed onto it: an open at that
    moment reaches the replaced file through the kernel's entry, and opens the page (or the file
    just before), never ENOENT (found by review of the answer above: a name never missing)."""
    pool = mounted.page_dir()
    outcomes: dict[str, int] = {}
    for i in range(100):
        key = pool / f"k{i}"
        writer = os.open(key, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(writer, b"old")
        stop = threading.Event()

        def open_again_and_again():
            while not stop.is_set():
                try:
                    os.close(os.open(key, os.O_RDONLY))
                    outcome = "opened"
                except OSError as exc:
                    outcome = errno.errorcode[exc.errno]
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

        opener = threading.Thread(target=open_again_and_again)
        opener.start()
        try:
            time.sleep(0.003)
            publish(pool, f"k{i}", b"N" * 100)
            time.sleep(0.003)
        finally:
            stop.set()
            opener.join()
            os.close(writer)
    assert set(outcomes) == {"opened"}, outcomes


@pytest.mark.parametrize("gone_by", ["unlink", "replace"])
def test_reopening_a_gone_file_being_written_through_proc_fd_is_enoent(mounted, gone_by):
    """/proc/self/fd/N of a file being written whose name was removed or given a page: the
    kernel's second try of the open reaches the same gone file, whose ESTALE then went to the
    user (found by review of the answer above)."""
    pool = mounted.page_dir()
    writer = os.open(pool / "k", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(writer, b"old")
        if gone_by == "unlink":
            os.unlink(pool / "k")
        else:
            publish(pool, "k", b"N" * 100)
        with pytest.raises(FileNotFoundError):
            os.open(f"/proc/self/fd/{writer}", os.O_RDONLY)
    finally:
        os.close(writer)
