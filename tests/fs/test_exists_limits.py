"""The exists query's documented maximum: a request at the maximum is answered without holding
up other clients or growing the daemon's memory; a larger one fails with EFBIG, at the write and
at the read that follows, and the handle then takes a new request."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs_testing.workload import exists_answer, exists_handle, send_exists
from pages import publish

POOL = "model/bfloat16-page_first-64/tp0of1/kv"
#: The issue's target is 100 ms; a loaded 2-core CI box adds scheduling delays of its own.
WORST_LATENCY_S = 0.5


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM in /proc/PID/status")


def test_a_request_at_the_maximum_delays_no_other_client(mounted, tmp_path):
    """While one client asks about ``MAX_EXISTS_REQUEST`` bytes of the costliest lines (short
    five-part paths: every one is looked up), another process stats, opens, reads and queries.
    None of its requests may wait longer than ``WORST_LATENCY_S`` (the target is 100 ms; the
    bound leaves room for a loaded 2-core CI machine), and the daemon's peak memory grows by
    little more than the request and its answer."""
    pool = mounted.page_dir()
    keys = [f"{i:064x}" for i in range(64)]
    for key in keys:
        publish(pool, key, os.urandom(64 << 10))
    line = b"a/b/c/d/e\n"
    request = line * (MAX_EXISTS_REQUEST // len(line)) + b"\n" * (MAX_EXISTS_REQUEST % len(line))
    assert len(request) == MAX_EXISTS_REQUEST
    stop = tmp_path / "stop"
    probe = subprocess.Popen([sys.executable, "-m", "hicachefs_testing.latency_probe", str(mounted.path), POOL,
                              ",".join(keys), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout.readline().strip() == "started"  # the daemon has served each kind once
        peak_before = _peak_rss(mounted.pid)
        with exists_handle(mounted.path) as fd:
            send_exists(fd, request)
            started = time.monotonic()
            answer = exists_answer(fd)
            answered = time.monotonic()
    finally:
        stop.touch()
        try:
            out, _ = probe.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            probe.kill()
            raise
    assert probe.returncode == 0
    lines = request.count(b"\n")
    assert answer == b"0" * lines + b"\n"
    samples = json.loads(out.strip().splitlines()[-1])
    during = [(took, kind) for start, took, kind in samples if start <= answered and start + took >= started]
    worst, kind = max(during)
    print(f"{len(during)} requests while the query ran ({answered - started:.2f} s); worst {worst * 1000:.0f} ms")
    assert worst < WORST_LATENCY_S, f"a {kind} waited {worst * 1000:.0f} ms behind the exists query"
    assert len(during) >= 8, f"the other client made only {len(during)} requests while the query ran " \
                             f"({answered - started:.2f} s)"
    growth = _peak_rss(mounted.pid) - peak_before
    assert growth < 8 * MAX_EXISTS_REQUEST, f"the daemon's peak memory grew by {growth >> 20} MiB"


def test_a_request_over_the_maximum_fails_at_the_write_and_the_read(mounted):
    publish(mounted.page_dir(), "a", b"1")
    present = f"{POOL}/a\n".encode()
    with exists_handle(mounted.path) as fd:
        send_exists(fd, present * (MAX_EXISTS_REQUEST // len(present)))
        with pytest.raises(OSError) as write_error:
            send_exists(fd, present * 2)
        assert write_error.value.errno == errno.EFBIG
        with pytest.raises(OSError) as more_writes:  # the failed request takes nothing more
            os.write(fd, present)
        assert more_writes.value.errno == errno.EFBIG
        with pytest.raises(OSError) as read_error:  # no answer for a truncated request
            os.read(fd, 1 << 20)
        assert read_error.value.errno == errno.EFBIG
        os.write(fd, present + f"{POOL}/b\n".encode())  # the next write starts a new request
        assert exists_answer(fd) == b"10\n"
