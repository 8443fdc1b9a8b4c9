"""The request files under a plain user's attack (issue 20, item 2): the memory held for exists
and fetch requests across all handles is bounded, a request over the budget is refused at once
with ENOBUFS and nothing else is touched, and 4 processes sending 8 MiB exists queries do not
hold up another client's small requests (here 2 MiB queries, 200 steps each: what holds the
daemon is a step, not a query; ``scripts/stress.py``'s plain-user mode sends 8 MiB)."""

from __future__ import annotations

import contextlib
import errno
import time

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs.control.fetch import MAX_FETCH_REQUEST
from hicachefs_testing import attacks
from hicachefs_testing.plain_user import COSTLY_LINE, costly_request
from hicachefs_testing.workload import content, exists_query, publish

#: Before item 2, 250 held requests took the daemon from 317 MiB to 2.37 GiB.
HELD_REQUESTS = 100
#: Costliest exists requests of the maximum a plain user may hold at once (request_limits).
SHARE = 4
GROWTH_BOUND = 96 << 20
#: Another client's requests while 4 exists storms run: before item 2 the probe's median was
#: 50-60 ms and its p99 over 100 ms (the issue: p50 62 ms, p99 130 ms).
STORMS = 4
#: Each storm's query: far past one step. 8 MiB queries took the test 30-40 s on 2 cores.
STORM_REQUEST = MAX_EXISTS_REQUEST // 4
MEDIAN_LATENCY_S = 0.01
P99_LATENCY_S = 0.06


def _probe_pool(mount) -> tuple[str, list[str]]:
    pool = mount.page_dir()
    keys = [f"{i:064x}" for i in range(64)]
    for i, key in enumerate(keys):
        publish(pool, key, content(i, 4096))
    return str(pool.relative_to(mount.path)), keys


def test_held_requests_of_a_plain_user_are_refused_past_the_budget(public_mount):
    pool, keys = _probe_pool(public_mount)
    before = attacks.rss(public_mount.pid)
    request = MAX_EXISTS_REQUEST - len(COSTLY_LINE)  # just under the maximum
    with attacks.start("held-requests", public_mount.path, HELD_REQUESTS, request) as held:
        holding = attacks.rss(public_mount.pid)
        asked = exists_query(public_mount.path, [f"{pool}/{keys[0]}", f"{pool}/none"])  # root, meanwhile
        figures = held.finish()
    growth = holding - before
    print(f"{HELD_REQUESTS} held requests: the daemon grew by {growth / 2**20:.1f} MiB; "
          f"refused {figures['errors']}")
    assert asked == "10"
    assert growth < GROWTH_BOUND, f"{HELD_REQUESTS} held exists requests took {growth >> 20} MiB"
    assert figures["errors"].get("ENOBUFS", 0) >= HELD_REQUESTS - SHARE, figures["errors"]
    assert set(figures["errors"]) == {"ENOBUFS"}, figures["errors"]


def test_a_refused_request_ends_and_the_handle_takes_the_next(public_mount):
    """Once a plain user holds its share, its next large request fails at its first write with
    ENOBUFS, at once; later writes and the read fail the same way; then the handle answers a
    small request. The share is given back when a handle holding it closes."""
    pool, keys = _probe_pool(public_mount)
    small = f"{pool}/{keys[0]}\n{pool}/none\n".encode()
    script = f"""
import os
from plain_user import costly_request, exists_answer, send_exists
exists = {str(public_mount.path / ".hicachefs" / "exists")!r}
def refused(call):
    try:
        call()
    except OSError as exc:
        return exc.errno
    return 0
large = costly_request({MAX_EXISTS_REQUEST} - 10)
holders = [os.open(exists, os.O_RDWR) for _ in range({SHARE})]
for holder in holders:
    send_exists(holder, large)
fd = os.open(exists, os.O_RDWR)
print(refused(lambda: os.write(fd, large[: 1 << 20])))
print(refused(lambda: os.write(fd, {small!r})))
print(refused(lambda: os.read(fd, 100)))
os.write(fd, {small!r})
print(exists_answer(fd))
os.close(holders.pop())
send_exists(fd, large)
print(len(exists_answer(fd)))
"""
    done = attacks.run_script(script)
    assert done.returncode == 0, done.stderr
    lines = len(costly_request(MAX_EXISTS_REQUEST - 10).splitlines())
    assert done.stdout.split("\n")[:-1] == [str(errno.ENOBUFS)] * 3 + ["b'10\\n'", str(lines + 1)]


def test_a_plain_users_exists_storms_do_not_delay_other_clients(public_mount, tmp_path):
    pool, keys = _probe_pool(public_mount)
    probe = attacks.start_probe(public_mount.path, pool, keys, tmp_path / "probe-stop")
    try:
        with contextlib.ExitStack() as running:
            storms = [running.enter_context(storm)
                      for storm in attacks.start("exists-storm", public_mount.path, STORM_REQUEST, count=STORMS)]
            started = time.monotonic()
            for storm in storms:  # a query of each, all four at once
                storm.wait_round()
            ended = time.monotonic()
            figures = [storm.finish() for storm in storms]
    finally:
        samples = probe.finish()
    answered = sum(f["rounds"] - sum(f["errors"].values()) for f in figures)
    took = attacks.during(samples, started, ended)
    median, p99 = attacks.percentile(took, 0.5), attacks.percentile(took, 0.99)
    for kind in ("stat", "read", "stats", "exists"):
        of_kind = attacks.during(samples, started, ended, kind)
        print(f"{kind}: median {attacks.percentile(of_kind, 0.5) * 1e3:.2f} ms, "
              f"p99 {attacks.percentile(of_kind, 0.99) * 1e3:.1f} ms")
    print(f"{len(took)} requests during {STORMS} exists storms ({answered} {STORM_REQUEST >> 20} MiB queries answered, "
          f"refused {[f['errors'] for f in figures]}): median {median * 1e3:.2f} ms, p99 {p99 * 1e3:.1f} ms, "
          f"worst {max(took) * 1e3:.1f} ms")
    assert answered >= 2 * STORMS, f"the storms' own queries were not answered: {figures}"
    assert len(took) >= 20, f"the other client made only {len(took)} requests during the storms"
    assert median < MEDIAN_LATENCY_S and p99 < P99_LATENCY_S, \
        f"other clients waited behind the storms: median {median * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"


def test_a_plain_users_fetch_request_is_bounded_by_the_same_share(public_mount):
    """A fetch request of the maximum of short lines would take some 80 MiB once parsed: it is
    refused with ENOBUFS at the write that goes over, and so is the read that follows; the
    handle then serves a small one."""
    pool, keys = _probe_pool(public_mount)
    script = f"""
import os
MAX_FETCH_REQUEST = {MAX_FETCH_REQUEST}
fd = os.open({str(public_mount.path / ".hicachefs" / "fetch")!r}, os.O_RDWR)
line = b"64 a/b/c/d/e\\n"
request = line * (MAX_FETCH_REQUEST // len(line))
sent = 0
try:
    while sent < len(request):
        sent += os.write(fd, request[sent : sent + (1 << 20)])
    print(0, sent)
except OSError as exc:
    print(exc.errno, sent)
try:
    os.pread(fd, 1 << 20, 0)
except OSError as exc:
    print(exc.errno)
os.write(fd, b"4096 {pool}/{keys[1]}\\n")
print(len(os.pread(fd, 1 << 20, 0)))
"""
    done = attacks.run_script(script)
    assert done.returncode == 0, done.stderr
    refusal, read, answer = done.stdout.split("\n")[:3]
    failed, sent = map(int, refusal.split())
    assert failed == errno.ENOBUFS and sent < 4 << 20, refusal
    assert int(read) == errno.ENOBUFS
    assert answer == "4096"
