"""An open page stays readable after ``mv`` (contract.md, "An open page stays consistent"):
a rename moves the page and its inode, and a reader that reads on past its pin's lease finds
the same version under the page's new name. Only a replace or a removal of the name ends it."""

from __future__ import annotations

import os
import time

from pages import publish

PAGE = 4 << 20


def test_an_open_page_stays_readable_after_mv(mounted):
    """Before, a read past the 2 s pin lease looked the version up under the name the page was
    opened under, found nothing, and failed with EIO (the version still stored, fstat showing 1
    link)."""
    pool = mounted.page_dir()
    other = mounted.page_dir("model", "bfloat16-page_first-64", "tp0of1", "kv2")
    data = os.urandom(PAGE)
    publish(pool, "a", data)
    fd = os.open(pool / "a", os.O_RDONLY | os.O_DIRECT)  # reads reach the daemon, as without the cache
    try:
        os.rename(pool / "a", other / "b")
        time.sleep(2.5)  # past the pin lease
        assert os.fstat(fd).st_nlink == 1  # still the page's inode
        buf = bytearray(1 << 20)
        with memoryview(buf) as view:
            assert os.preadv(fd, [view], 1 << 20) == 1 << 20
        assert bytes(buf) == data[1 << 20 : 2 << 20]
    finally:
        os.close(fd)
    assert (other / "b").read_bytes() == data


def test_a_reader_of_a_copied_file_keeps_reading_after_mv(mounted):
    """A file created under its key (cp) and read by another process while written: once
    published, that handle reads the page it became, after an mv of the page too."""
    pool = mounted.page_dir()
    data = os.urandom(8192)
    writer = os.open(pool / "a", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    reader = os.open(pool / "a", os.O_RDONLY)
    try:
        os.write(writer, data)
        os.close(writer)  # published
        assert os.pread(reader, 100, 0) == data[:100]
        os.rename(pool / "a", pool / "b")
        assert os.pread(reader, 100, 100) == data[100:200]
    finally:
        os.close(reader)
