"""Reading many pages through one handle, ``.hicachefs/fetch`` (DESIGN.md)."""

from __future__ import annotations

import errno
import os

import pytest

from hicachefs_testing import attacks
from hicachefs_testing.workload import content
from hicachefs_client import fetch as fetch_request
from hicachefs_client.fetch import fetch_batch
from hicachefs_client.ingest import publish_batch
from pages import as_nobody, fetch_pages, publish, read_page, requests_of

POOL = "model/bfloat16-page_first-64/tp0of1/kv"


@pytest.fixture
def fetch(mounted):
    fd = os.open(mounted.path / ".hicachefs" / "fetch", os.O_RDWR)
    yield fd
    os.close(fd)


def stored(mount, count: int, size: int, seed: int = 0) -> list[tuple[str, bytes]]:
    pool = mount.page_dir()
    made = []
    for i in range(count):
        data = content(seed + i, size)
        publish(pool, f"p{i:04d}", data)
        made.append((f"{POOL}/p{i:04d}", data))
    return made


def test_a_batch_is_read_back_to_back_in_as_few_reads_as_its_bytes_need(mounted, fetch):
    pages = stored(mounted, 16, 64 << 10)
    cost, got = requests_of(mounted, lambda: fetch_pages(fetch, [(p, len(d)) for p, d in pages]))
    assert got == b"".join(d for _, d in pages)
    # One write for the request, one READ for its 1 MiB: no LOOKUP, OPEN or RELEASE.
    assert (cost["write"], cost["read"], cost["lookup"], cost["open"], cost["release"]) == (1, 1, 0, 0, 0)


def test_a_page_that_cannot_be_served_ends_the_read_at_its_start(mounted, fetch):
    pages = stored(mounted, 4, 8192)
    asked = [(pages[0][0], 8192), (f"{POOL}/missing", 8192), (pages[2][0], 8192), (pages[3][0], 4096)]
    assert fetch_pages(fetch, asked) == pages[0][1]  # short at the missing page
    # Reading on from the next page's offset continues the same request ...
    buffer = bytearray(8192)
    assert os.preadv(fetch, [buffer], 2 * 8192) == 8192 and bytes(buffer) == pages[2][1]
    # ... and a page of another size than asked is not served either.
    assert os.preadv(fetch, [buffer], 3 * 8192) == 0


def test_a_page_on_the_disk_tier_is_read_and_checked(mount_factory, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = mount_factory("--memory", "16M", "--disk", str(disk), "--disk-size", "256M")
    pages = stored(mount, 40, 1 << 20)  # more than RAM: the first ones are demoted
    assert os.getxattr(mount.path / pages[0][0], "user.hicachefs.tier") == b"disk"
    fd = os.open(mount.path / ".hicachefs" / "fetch", os.O_RDWR)
    try:
        assert fetch_pages(fd, [(p, len(d)) for p, d in pages[:3]]) == b"".join(d for _, d in pages[:3])
    finally:
        os.close(fd)


def test_a_page_spanning_reads_is_one_version_even_when_replaced_between_them(mounted, fetch):
    (path, old), = stored(mounted, 1, 3 << 20)
    os.write(fetch, f"{len(old)} {path}\n".encode())
    first = os.pread(fetch, 1 << 20, 0)
    assert first == old[: 1 << 20]
    publish(mounted.page_dir(), path.rsplit("/", 1)[1], content(99, 3 << 20))
    rest = os.pread(fetch, 2 << 20, 1 << 20)
    assert rest == old[1 << 20 :]


def test_a_request_over_the_maximum_fails_whole_and_so_does_the_read_that_follows(mounted, fetch):
    (path, data), = stored(mounted, 1, 4096)
    line = f"4096 {POOL}/{'k' * 190}\n".encode()
    request = line * ((4 << 20) // len(line) + 2) + f"4096 {path}\n".encode()
    written = os.write(fetch, request)  # the kernel reports the WRITEs before the refused one
    assert written < len(request)
    with pytest.raises(OSError) as rest:  # the rest is no request of its own ...
        os.write(fetch, request[written:])
    assert rest.value.errno == errno.EFBIG
    with pytest.raises(OSError) as answer:  # ... and nothing is answered for any part of it
        os.pread(fetch, 4096, 0)
    assert answer.value.errno == errno.EFBIG
    assert fetch_pages(fetch, [(path, 4096)]) == data  # the handle takes a new request after


def test_the_client_splits_a_batch_whose_request_is_over_the_maximum(mounted, fetch):
    """A batch of 20,000 pages asked in one call, over the 4 MiB of lines a request holds, with
    pages missing here and there and on both sides of where it is split: every page is read
    with its own bytes, and every missing one is reported missing."""
    paths = [f"{POOL}/{'k' * 180}{i:08d}" for i in range(20_000)]
    split = fetch_request.MAX_REQUEST // len(f"64 {paths[0]}\n")  # the first request's pages
    assert split < len(paths)
    missing = set(range(0, len(paths), 1000)) | {split - 1, split + 1}
    stored_paths = [path for i, path in enumerate(paths) if i not in missing]
    data = {path: content(i, 64) for i, path in enumerate(paths)}
    mounted.page_dir()  # POOL
    handle = os.open(mounted.path / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        assert publish_batch(handle, stored_paths, [[memoryview(data[p])] for p in stored_paths],
                             [64] * len(stored_paths)) == [None] * len(stored_paths)
    finally:
        os.close(handle)
    buffers = [[memoryview(bytearray(64))] for _ in paths]
    read = fetch_batch(fetch, paths, buffers, 64)
    assert [i for i, whole in enumerate(read) if not whole] == sorted(missing)
    assert all(bytes(buffers[i][0]) == data[path] for i, path in enumerate(paths) if i not in missing)


def test_any_user_may_read_through_the_fetch_file(public_mount):
    mounted = public_mount
    (path, data), = stored(mounted, 1, 100)
    script = (f"import os; fd = os.open({str(mounted.path / '.hicachefs' / 'fetch')!r}, os.O_RDWR); "
              f"os.write(fd, b'100 {path}\\n'); print(os.pread(fd, 100, 0).hex())")
    result = as_nobody("/usr/bin/python3.11", "-c", script)
    assert result.returncode == 0, result.stderr
    assert bytes.fromhex(result.stdout.strip()) == data == read_page(mounted.path / path)


def test_a_plain_user_cannot_forge_reads(public_mount):
    """Issue 29, item 7: reads made elsewhere are reported only through the data plane's file,
    which only the store's writers may open; lines '0 <path>' on the fetch file (they once counted
    reads of any page for anyone) fail the read with EINVAL, and lines that name a page with a
    wrong size are misses that count no hit (they once counted one each)."""
    mounted = public_mount
    (path, data), = stored(mounted, 1, 100)
    script = (f"import errno, os\nfd = os.open({str(mounted.path / '.hicachefs' / 'fetch')!r}, os.O_RDWR)\n"
              f"for _ in range(20):\n    os.write(fd, b'0 {path}\\n' * 50)\n"
              f"    try:\n        os.pread(fd, 1, 0)\n    except OSError as exc:\n"
              f"        print(errno.errorcode[exc.errno])\n"
              f"for _ in range(20):\n    os.write(fd, b'4096 {path}\\n' * 8)\n    os.pread(fd, 1, 0)\n"
              f"try:\n    os.open({str(mounted.path / '.hicachefs' / 'plane')!r}, os.O_RDWR)\n"
              f"except PermissionError:\n    print('refused')\n")
    result = attacks.run_script(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["EINVAL"] * 20 + ["refused"]
    assert os.getxattr(mounted.path / path, "user.hicachefs.hits") == b"0"


def test_a_line_whose_path_is_not_utf8_is_a_missing_page_not_a_failed_read(mounted, fetch):
    """A path that is not UTF-8 names no page: the read ends short at its start, with the pages
    before it served (it failed whole with EIO, the daemon logging an unexpected error)."""
    pages = stored(mounted, 2, 4096)
    request = (f"4096 {pages[0][0]}\n".encode() + f"4096 {POOL}/".encode() + b"\xff\xfe\n"
               + f"4096 {pages[1][0]}\n".encode())
    os.write(fetch, request)
    assert os.pread(fetch, 3 * 4096, 0) == pages[0][1]  # short at the page that is none
    assert os.pread(fetch, 4096, 2 * 4096) == pages[1][1]  # and the batch goes on after it
    assert "unexpectedly" not in mounted.log_text()


@pytest.mark.parametrize("line", [f"4096 {POOL}/never-stored\n".encode(), f"100 {POOL}/p0000\n".encode(),
                                  f"4096 {POOL}/".encode() + b"\xff\xfe\n"],
                         ids=["missing", "of-another-size", "not-utf8"])
def test_each_page_a_batch_cannot_serve_is_one_miss(mounted, fetch, line):
    """Every kind of page a batch cannot serve counts one miss in stats (a path that is not UTF-8
    counted none, so stats said that batch missed nothing)."""
    stored(mounted, 1, 4096)
    before = mounted.stats()["misses"]
    os.write(fetch, line)
    assert os.pread(fetch, 4096, 0) == b""
    assert mounted.stats()["misses"] - before == 1


@pytest.mark.parametrize("large", [False, True], ids=["small", "parsed-in-steps"])
def test_a_size_of_too_many_digits_fails_the_read_with_einval_and_ends_the_request(mounted, fetch, large):
    """A size too long for int() (Python's 4,300 digits) is a malformed line like any other:
    EINVAL, and the request ends. It failed with EIO and a logged traceback, and the handle kept
    the lines parsed before it: the next read answered them as if they were a request."""
    (path, data), = stored(mounted, 1, 4096)
    good = f"4096 {path}\n".encode()
    os.write(fetch, good * (3000 if large else 1) + b"9" * 5000 + f" {path}\n".encode())
    with pytest.raises(OSError) as failed:
        os.pread(fetch, 4096, 0)
    assert failed.value.errno == errno.EINVAL
    assert os.pread(fetch, 4096, 0) == b""  # nothing of that request is answered
    assert fetch_pages(fetch, [(path, 4096)]) == data  # and the handle takes a new one
    assert "unexpectedly" not in mounted.log_text()
