"""The request files under a plain user's attack (issue 20, item 2): the memory held for exists
and fetch requests across all handles is bounded, a request over the budget is refused at once
with ENOBUFS and nothing else is touched, and 4 processes sending 8 MiB exists queries do not
hold up another client's small requests (here 2 MiB queries, 200 steps each: what holds the
daemon is a step, not a query; ``scripts/stress.py``'s plain-user mode sends 8 MiB)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs.control.fetch import MAX_FETCH_REQUEST
from hicachefs.posix.handles import OPEN_BY_USER
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


#: Snapshot handles a plain user tries to hold open at once: 20,000 of ``metrics`` (6 KiB each)
#: took the daemon from 110 to 240 MiB, and it did not give the memory back after they closed.
HELD_SNAPSHOTS = 20_000
#: Processes that hold them (a process may hold as many descriptors as its hard limit, often 4,096).
SNAPSHOT_HOLDERS = 8


def holding(path: str, flags: str, holders: int, each: int) -> str:
    """Python source, to run as a plain user: ``holders`` processes each open ``path`` (``flags``)
    up to ``each`` times or until refused, and hold what they opened until the source closes
    ``done_w``; it prints one line: the handles held and the errors that stopped them."""
    return f"""
import errno, os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
each = min(hard - 16, {each})
done_r, done_w = os.pipe()  # closed by this process (or its end): every holder lets go
reports = []
for _ in range({holders}):
    report_r, report_w = os.pipe()
    if os.fork() == 0:
        os.close(done_w)
        held, failure = [], 0
        try:
            while len(held) < each:
                held.append(os.open({path!r}, {flags}))
        except OSError as exc:
            failure = exc.errno
        os.write(report_w, f"{{len(held)}} {{failure}}".encode())
        os.read(done_r, 1)
        os._exit(0)
    reports.append(os.read(report_r, 100).split())
print(sum(int(held) for held, _ in reports), sorted({{errno.errorcode.get(int(failure), "none") for _, failure in reports}}), flush=True)
"""


def test_snapshot_handles_a_plain_user_holds_open_are_refused_past_its_share(public_mount):
    """``stats``, ``metrics`` and ``config`` are rendered at open and kept until close: a plain
    user holding them open by the thousand grew the daemon without bound. They count against
    the user's share of the request files' memory: an open past it fails with ENOBUFS, and the
    share comes back when they close."""
    metrics = str(public_mount.path / ".hicachefs" / "metrics")
    script = holding(metrics, "os.O_RDONLY", SNAPSHOT_HOLDERS, HELD_SNAPSHOTS // SNAPSHOT_HOLDERS) + f"""
os.close(done_w)
for _ in reports:
    os.wait()
print(len(open({metrics!r}, "rb").read()) > 0)
"""
    done = attacks.run_script(script, timeout=240)
    assert done.returncode == 0, done.stderr
    counts, again = done.stdout.split("\n")[:2]
    held, refusals = counts.split(" ", 1)
    assert int(held) < HELD_SNAPSHOTS and "ENOBUFS" in refusals, (held, refusals)
    assert again == "True"  # the share came back once they closed


def test_open_files_a_plain_user_may_hold_are_bounded(public_mount):
    """Every open file costs the daemon memory, which only descriptors bounded: a plain user
    (holding exists handles, which hold no request) gets EMFILE past its number of open files,
    root is not refused meanwhile, and the user may open again once its files are closed."""
    exists = str(public_mount.path / ".hicachefs" / "exists")
    script = holding(exists, "os.O_RDWR", 5, OPEN_BY_USER // 4 + 64) + f"""
sys.stdin.readline()
os.close(done_w)
for _ in reports:
    os.wait()
os.close(os.open({exists!r}, os.O_RDWR))
print("opened again", flush=True)
"""
    holder = subprocess.Popen([attacks.SYSTEM_PYTHON, "-s", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, user=attacks.NOBODY, group=attacks.NOBODY, cwd="/")
    try:
        held, refusals = holder.stdout.readline().split(" ", 1)
        assert int(held) == OPEN_BY_USER and "EMFILE" in refusals, (held, refusals)
        os.close(os.open(exists, os.O_RDWR))  # root is not counted
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "opened again"
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
