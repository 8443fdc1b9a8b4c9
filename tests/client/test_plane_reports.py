"""Reads made through the data plane reach the daemon's counts (hits, recency) while the mount
works: after a restart whose new daemon the reporter's old handle never met, when a reader
attaches just as the reporter thread ends, and in a forked child (``client/plane_reports.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import hicachefs_client.plane_reports as plane_reports
from hicachefs_client.page_io import PageIO
from hicachefs_testing import mounting
from pages import wait_until

SIZE = 64 << 10
POOL = "m/f/tp0of1/kv"


def _pages(io, tag, count=8):
    keys = [f"{tag:02x}{i:062x}" for i in range(count)]
    pages = [[memoryview(bytes([tag + i]) * SIZE)] for i in range(count)]
    assert io.publish_pages(POOL, keys, pages, SIZE) == [True] * count
    io.plane.settle()
    return [f"{POOL}/{k}" for k in keys]


def test_reads_at_the_next_daemon_are_reported_by_a_reporter_that_lived_through_the_restart(
        mount_factory, monkeypatch):
    """The reporter thread keeps its handle on .hicachefs/plane across a restart (a reader
    renewed the attachment meanwhile): its first report to the next daemon went down the dead
    daemon's handle and was lost (up to 4,096 reads), though the mount worked."""
    monkeypatch.setattr(plane_reports, "REPORT_INTERVAL_S", 0.05)
    mount = mount_factory("--memory", "64M")
    io = PageIO(str(mount.path))
    rels = _pages(io, 1)
    buffers = [[memoryview(bytearray(SIZE))] for _ in rels]
    assert io.read_pages(rels, buffers, SIZE) == [True] * 8
    wait_until(lambda: mount.stats()["hits"] == 8, timeout=5)  # reported: the reporter's handle is open
    monkeypatch.setattr(plane_reports, "REPORT_INTERVAL_S", 60.0)
    time.sleep(0.3)  # the reporter now waits 60 s, or for MAX_REPORT reads
    mounting.stop(mount)
    mount = mount_factory("--memory", "64M", path=mount.path)
    rels = _pages(io, 2)  # the client attaches to the next daemon
    assert io.plane_attached()
    reads = plane_reports.MAX_REPORT // len(rels)
    try:
        assert io.read_pages(rels * reads, buffers * reads, SIZE) == [True] * (reads * len(rels))
        wait_until(lambda: mount.stats()["hits"] == reads * len(rels), timeout=5)
    finally:
        io.close()


def test_reads_are_reported_when_a_reader_attaches_as_the_reporter_thread_ends(mount_factory, monkeypatch):
    """The reporter thread ends once it holds no attachment (the index moved as it grew). A reader
    that attached just then found the thread still alive and started none; its later reads took
    the fast path, which starts none either: they were never reported."""
    monkeypatch.setattr(plane_reports, "REPORT_INTERVAL_S", 0.05)
    mount = mount_factory("--memory", "64M")
    reader, writer = PageIO(str(mount.path)), PageIO(str(mount.path))
    rels = _pages(reader, 1)
    buffers = [[memoryview(bytearray(SIZE))] for _ in rels]
    assert reader.read_pages(rels, buffers, SIZE) == [True] * 8
    wait_until(lambda: mount.stats()["hits"] == 8, timeout=5)
    plane = reader.plane
    let_go = plane.let_go_if_gone
    raced = []

    def let_go_while_a_reader_attaches():
        held = let_go()
        if not held and not raced:  # the index moved: a reader attaches right now, on its own thread
            other = threading.Thread(target=lambda: raced.append(plane.attached()))
            other.start()
            other.join()
        return held

    monkeypatch.setattr(plane, "let_go_if_gone", let_go_while_a_reader_attaches)
    try:
        for batch in range(24):  # another client's writes grow the index past its first rows: it moves
            keys = [f"{0x80 + batch:02x}{i:062x}" for i in range(64)]
            assert writer.publish_pages("m/f/tp0of1/other", keys, [[memoryview(bytes(8192))]] * 64, 8192) == [True] * 64
        writer.close()
        wait_until(lambda: raced, timeout=5)
        assert raced[0] is not None  # the reader attached to the index's new memory
        time.sleep(0.2)
        assert reader.plane.attached() is raced[0]  # the fast path from now on
        assert reader.read_pages(rels, buffers, SIZE) == [True] * 8  # through the plane
        wait_until(lambda: mount.stats()["hits"] == 16, timeout=3)
    finally:
        reader.close()


def test_reads_of_a_forked_child_are_reported_while_it_runs(mounted, monkeypatch):
    """A child forked from an attached client reads through the plane (the attachment's fast
    path). It forgets the parent's reporter thread, and only a new attachment started one: the
    child's reads went unreported for as long as it ran."""
    monkeypatch.setattr(plane_reports, "REPORT_INTERVAL_S", 0.05)
    io = PageIO(str(mounted.path))
    rels = _pages(io, 1)
    buffers = [[memoryview(bytearray(SIZE))] for _ in rels]
    assert io.read_pages(rels, buffers, SIZE) == [True] * 8
    wait_until(lambda: mounted.stats()["hits"] == 8, timeout=5)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            ok = io.read_pages(rels, buffers, SIZE) == [True] * 8
            os.write(ready_w, b"1" if ok else b"0")
            time.sleep(5)  # alive, its mount working: its reads are reported meanwhile
            os._exit(0)
        finally:
            os._exit(2)
    try:
        assert os.read(ready_r, 1) == b"1"  # the child read all 8 through the plane
        wait_until(lambda: mounted.stats()["hits"] == 16, timeout=3)
    finally:
        os.kill(child, signal.SIGKILL)  # by its PID
        os.waitpid(child, 0)
        os.close(ready_r)
        os.close(ready_w)
        io.close()


_READ_AND_EXIT = """
import sys
import hicachefs_client.plane_reports as plane_reports
from hicachefs_client.page_io import PageIO
plane_reports.REPORT_INTERVAL_S = 60.0  # only the exit can send them
io = PageIO(sys.argv[1])
rels = sys.argv[2:]
assert io.read_pages(rels, [[memoryview(bytearray(%d))] for _ in rels], %d) == [True] * len(rels)
assert io.plane_attached()
""" % (SIZE, SIZE)


def test_reads_of_a_process_that_exits_without_close_are_reported(mounted):
    """A client whose process ends without ``close`` (SGLang's ranks exit so) had its last reads,
    up to half a second's or 4,096 of them, waiting for the reporter thread: a daemon thread, it
    died with the interpreter and the reads were never counted (hits, recency), though the mount
    worked."""
    io = PageIO(str(mounted.path))
    try:
        rels = _pages(io, 1)
    finally:
        io.close()
    before = mounted.stats()["hits"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _READ_AND_EXIT, str(mounted.path), *rels], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: mounted.stats()["hits"] == before + len(rels), timeout=3)


def test_reads_noted_after_the_attachment_was_let_go_are_sent_at_close(mount_factory, monkeypatch):
    """The reporter thread lets go of an attachment whose index moved (it grew) while a reader
    copies through it: the reader notes its reads after that, and the client closes. Its last
    reads went nowhere, for want of an attachment, though their daemon still ran."""
    monkeypatch.setattr(plane_reports, "REPORT_INTERVAL_S", 60.0)  # only close sends them
    mount = mount_factory("--memory", "64M")
    reader, writer = PageIO(str(mount.path)), PageIO(str(mount.path))
    rels = _pages(reader, 1)
    buffers = [[memoryview(bytearray(SIZE))] for _ in rels]
    plane = reader.plane
    note = plane.reports.note

    def note_after_the_index_moved(token, reads, misses=0):
        for batch in range(24):  # another client's writes grow the index past its first rows: it moves
            keys = [f"{0x80 + batch:02x}{i:062x}" for i in range(64)]
            assert writer.publish_pages("m/f/tp0of1/other", keys, [[memoryview(bytes(8192))]] * 64, 8192) == [True] * 64
        assert not plane.let_go_if_gone()  # the reporter thread's round, just then
        note(token, reads, misses)

    monkeypatch.setattr(plane.reports, "note", note_after_the_index_moved)
    try:
        assert reader.read_pages(rels, buffers, SIZE) == [True] * 8
    finally:
        reader.close()
        writer.close()
    wait_until(lambda: mount.stats()["hits"] == 8, timeout=3)


def test_reads_the_reporter_thread_is_sending_are_sent_before_close_returns(mount_factory, monkeypatch):
    """``close`` sends what is left to report, but not what the reporter thread had just taken
    and not yet sent: close returned before it (the hits lagged), and the plane it closed made
    the thread's report go nowhere (lost)."""
    monkeypatch.setattr(plane_reports, "MAX_REPORT", 8)  # the thread takes the 8 reads at once
    mount = mount_factory("--memory", "64M")
    reader = PageIO(str(mount.path))
    rels = _pages(reader, 1)
    buffers = [[memoryview(bytearray(SIZE))] for _ in rels]
    plane, taken, closed = reader.plane, threading.Event(), threading.Event()
    report = plane.report

    def report_once_closed(reads):
        if threading.current_thread().name == "hicachefs-plane":
            taken.set()
            closed.wait(1.0)  # the reads are the thread's, not yet sent, while close runs
        report(reads)

    monkeypatch.setattr(plane, "report", report_once_closed)
    assert reader.read_pages(rels, buffers, SIZE) == [True] * 8
    taken.wait()
    reader.close()
    closed.set()
    assert mount.stats()["hits"] == 8
