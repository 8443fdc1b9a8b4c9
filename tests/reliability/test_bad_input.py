"""Bad input to every kind of request: bad names, offsets and sizes, misused control files,
a malformed 10 MB exists request, random names. The daemon answers each with an error (the
errno a user would expect where there is one) and keeps serving."""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs_testing import mounting
from hicachefs_testing.scenarios import fuzz_names
from hicachefs_testing.workload import (errno_of, exists_handle, exists_query, exists_raw, labelled_content, publish,
                                        read_whole, serving)

ANY_ERROR = "any error"  # the contract names no errno; any refusal but EIO (the daemon's "internal error")


def _create(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def _write_to(path, flags=os.O_WRONLY):
    fd = os.open(path, flags)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)


def _cases(root, pool, good, temp_fd, page_fd):
    ctl = root / ".hicachefs"
    model = root / "model"
    big = 1 << 62
    return [
        # names
        ("key of 201 bytes", _create, (pool / ("a" * 201),), {errno.ENAMETOOLONG}),
        ("key of 256 bytes", _create, (pool / ("b" * 256),), {errno.ENAMETOOLONG}),
        ("key not UTF-8", _create, (os.path.join(bytes(pool), b"\xff\xfe"),), {errno.EINVAL}),
        ("lookup of a key that is not UTF-8", os.lstat, (os.path.join(bytes(pool), b"k\xff"),), {errno.ENOENT}),
        ("temporary name of 250 bytes", _create, (pool / ("." + "t" * 249),), {errno.ENAMETOOLONG}),
        ("directory named .hidden", os.mkdir, (root / ".hidden",), {errno.EINVAL, errno.EPERM}),
        ("directory inside a pool", os.mkdir, (pool / "sub",), ANY_ERROR),
        ("page at the root", _create, (root / "page",), ANY_ERROR),
        ("page in a model directory", _create, (model / "page",), ANY_ERROR),
        ("rename page to a .name", os.rename, (good, pool / ".hidden"), ANY_ERROR),
        ("rename page out of the pool tree", os.rename, (good, model / "moved"), ANY_ERROR),
        ("rename a directory", os.rename, (model, root / "model2"), ANY_ERROR),
        ("rename a missing page", os.rename, (pool / "missing", pool / "other"), {errno.ENOENT}),
        ("rename onto a directory", os.rename, (good, root / "model" / "bfloat16-page_first-64"), ANY_ERROR),
        ("unlink a missing page", os.unlink, (pool / "missing",), {errno.ENOENT}),
        ("unlink a directory", os.unlink, (model,), {errno.EISDIR, errno.EPERM}),
        ("rmdir a non-empty pool", os.rmdir, (pool,), {errno.ENOTEMPTY}),
        ("rmdir a page", os.rmdir, (good,), {errno.ENOTDIR}),
        ("hard link to a page", os.link, (good, pool / "linked"), {errno.EPERM}),
        ("symlink in a pool", os.symlink, ("good", pool / "sym"), {errno.EPERM}),
        ("fifo in a pool", os.mkfifo, (pool / "fifo",), {errno.EPERM}),
        ("chmod a page writable", os.chmod, (good, 0o666), {errno.EPERM}),
        ("chown a page", os.chown, (good, 1234, 1234), {errno.EPERM}),
        ("setxattr on a page", os.setxattr, (good, "user.hicachefs.tier", b"disk"), {errno.ENOTSUP, errno.EPERM}),
        ("getxattr of an unknown attribute", os.getxattr, (good, "user.nope"), {errno.ENODATA}),
        ("open a page for writing", os.open, (good, os.O_WRONLY), {errno.EPERM}),
        ("truncate a page", os.truncate, (good, 0), {errno.EPERM}),
        ("create over a published key", os.open, (good, os.O_WRONLY | os.O_CREAT | os.O_EXCL), {errno.EEXIST}),
        ("read a directory as a file", lambda p: os.read(os.open(p, os.O_RDONLY), 1), (model,), {errno.EISDIR}),
        # offsets and sizes
        ("pwrite at 1 TiB into a temporary file", os.pwrite, (temp_fd, b"x", 1 << 40), {errno.EFBIG}),
        ("pwrite at 2^62 into a temporary file", os.pwrite, (temp_fd, b"x", big), {errno.EFBIG, errno.EINVAL}),
        ("pwrite at a negative offset", os.pwrite, (temp_fd, b"x", -1), {errno.EINVAL}),
        ("ftruncate a temporary file to 1 PiB", os.ftruncate, (temp_fd, 1 << 50), {errno.EFBIG}),
        ("ftruncate to a negative size", os.ftruncate, (temp_fd, -1), {errno.EINVAL}),
        ("pwrite through a read-only page handle", os.pwrite, (page_fd, b"x", 0), {errno.EBADF}),
        ("pread at a negative offset", os.pread, (page_fd, 10, -5), {errno.EINVAL}),
        # control files
        ("open stats for writing", os.open, (ctl / "stats", os.O_WRONLY), {errno.EACCES, errno.EPERM}),
        ("open config read-write", os.open, (ctl / "config", os.O_RDWR), {errno.EACCES, errno.EPERM}),
        ("write to metrics", _write_to, (ctl / "metrics",), {errno.EACCES, errno.EPERM}),
        ("truncate config", os.truncate, (ctl / "config", 0), ANY_ERROR),
        ("create in .hicachefs", _create, (ctl / "new",), ANY_ERROR),
        ("mkdir in .hicachefs", os.mkdir, (ctl / "d",), ANY_ERROR),
        ("unlink .hicachefs/stats", os.unlink, (ctl / "stats",), ANY_ERROR),
        ("rename .hicachefs/stats", os.rename, (ctl / "stats", ctl / "s2"), ANY_ERROR),
        ("rename a page into .hicachefs", os.rename, (good, ctl / "good"), ANY_ERROR),
        ("rmdir .hicachefs", os.rmdir, (ctl,), ANY_ERROR),
        ("rm -r .hicachefs", shutil.rmtree, (ctl,), ANY_ERROR),
        ("mkdir .hicachefs again", os.mkdir, (ctl,), {errno.EEXIST}),
        ("chmod .hicachefs/stats", os.chmod, (ctl / "stats", 0o666), ANY_ERROR),
        ("setxattr on .hicachefs/exists", os.setxattr, (ctl / "exists", "user.x", b"1"), ANY_ERROR),
    ]


def test_every_bad_request_gets_an_error_and_the_daemon_keeps_serving(mounted):
    root = mounted.path
    pool = mounted.page_dir()
    data = labelled_content("good", 50_000)
    publish(pool, "good", data)
    good = pool / "good"
    temp_fd = os.open(pool / ".writing", os.O_RDWR | os.O_CREAT, 0o644)
    page_fd = os.open(good, os.O_RDONLY)
    wrong = []
    try:
        cases = _cases(root, pool, good, temp_fd, page_fd)
        for name, call, args, expected in cases:
            got = errno_of(call, *args)
            ok = got not in (0, errno.EIO) if expected is ANY_ERROR else got in expected
            if not ok:
                wrong.append(f"{name}: {errno.errorcode.get(got, 'success') if got else 'success'}, "
                             f"expected {expected if expected is ANY_ERROR else [errno.errorcode[e] for e in expected]}")
            assert mounting.alive(mounted.pid), f"the daemon died on: {name}"
        # reads past the end answer empty, whatever the offset
        assert os.pread(page_fd, 4096, len(data)) == b""
        assert os.pread(page_fd, 4096, 1 << 40) == b""
        assert os.pread(page_fd, 0, 0) == b""
        # the temporary file had failed writes: it will never be a page, its bytes are gone
        assert errno_of(os.pread, temp_fd, 10, 0) == errno.EIO
        assert errno_of(os.rename, pool / ".writing", pool / "from-a-failed-file") == errno.EIO
        fresh = os.open(pool / ".fresh", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            assert os.pread(fresh, 10, 1 << 40) == b""
        finally:
            os.close(fresh)
    finally:
        os.close(temp_fd)
        os.close(page_fd)
    assert not wrong, f"{len(wrong)} of {len(cases)} bad requests got the wrong answer:\n" + "\n".join(wrong)
    assert read_whole(good) == data and stat.S_IMODE(good.stat().st_mode) == 0o444
    assert sorted(os.listdir(pool)) == [".fresh", ".writing", "good"]
    assert serving(root)


def test_malformed_exists_requests_of_the_maximum_size_answer_zeros(mounted):
    root = mounted.path
    pool = mounted.page_dir()
    publish(pool, "present", labelled_content("present", 4096))
    present = str((pool / "present").relative_to(root))
    rng = random.Random(5)
    garbage = bytes(rng.getrandbits(8) for _ in range(1 << 16)) * (MAX_EXISTS_REQUEST >> 16)  # NULs, bad UTF-8
    requests = {
        "random bytes": garbage,
        "one line of the maximum size": b"a" * MAX_EXISTS_REQUEST,
        "the maximum size of newlines": b"\n" * MAX_EXISTS_REQUEST,
        "bad paths around a good one": b"../../etc/passwd\n\xff\xfe\n" + present.encode() + b"\n/" + present.encode()
        + b"\n" + present.encode() + b"/x\n.hicachefs/stats\n\0\n",
    }
    for name, request in requests.items():
        answer = exists_raw(root, request)
        lines = request.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        expected = b"".join(b"1" if line == present.encode() else b"0" for line in lines) + b"\n"
        assert answer == expected, f"{name}: {len(answer)} bytes answered, {answer[:40]!r}"
        assert mounting.alive(mounted.pid)
    assert exists_query(root, [present, present + "x"]) == "10"
    with exists_handle(root) as fd:
        assert os.read(fd, 100) == b"\n", "a read with no request answers an empty line"
    assert serving(root)


def test_random_names_never_break_the_daemon(mounted):
    tried, failures = fuzz_names(mounted.path, mounted.page_dir(), random.Random(11), 300)
    assert tried == 1200
    assert mounting.alive(mounted.pid)
    assert not failures, f"{len(failures)} of {tried} random names got EIO: {failures[:5]}"
    assert serving(mounted.path)
