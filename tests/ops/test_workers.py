"""``--workers N``: worker processes read the mount's FUSE requests and forward them to the
daemon that owns the store (``daemon/workers.py``). Any worker answers any request with the
same bytes; a worker that dies takes the mount down (clients get ENOTCONN, they do not hang)
and the next mount is warm; SIGTERM ends every process and writes the RAM tier down once."""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import os
import signal
import subprocess
import sys
import threading

import pytest
import xxhash

from hicachefs.testing import mounting
from hicachefs.testing.workload import content, exists_answer, exists_handle, exists_query, send_exists
from pages import as_nobody, fetch_pages, ingest_batch, ingest_status, publish, read_page

POOL = "model/bfloat16-page_first-64/tp0of1/kv"
#: How long a client may wait on a mount whose worker died before the test calls it a hang.
DEAD_MOUNT_TIMEOUT_S = 30


def disk_flags(tmp_path, memory: str = "64M", *extra: str) -> list[str]:
    disk = tmp_path / "disk"
    disk.mkdir(exist_ok=True)
    return ["--memory", memory, "--disk", str(disk), "--disk-size", "256M", "--workers", "2", *extra]


def stored_pages(mount: mounting.Mount, prefix: str, seed: int, count: int) -> list[tuple[str, bytes]]:
    """``count`` pages of 1 MiB published in the mount's pool: (path, bytes)."""
    pool = mount.page_dir()
    pages = [(f"{POOL}/{prefix}{i:03d}", content(seed + i, 1 << 20)) for i in range(count)]
    for path, data in pages:
        publish(pool, path.rsplit("/", 1)[1], data)
    return pages


def client(mount: mounting.Mount, rank: int) -> list[tuple[str, bytes]]:
    """One client's traffic of every kind; the pages it published (path, bytes)."""
    pool = mount.page_dir()
    ours = []
    for i in range(24):  # write + rename, then read back
        data = content(rank * 1000 + i, (1 << 20) if i % 2 else 4096 + i)
        publish(pool, f"r{rank}-p{i:03d}", data)
        ours.append((f"{POOL}/r{rank}-p{i:03d}", data))
    for path, data in ours:
        assert read_page(mount.path / path) == data
    # 128 KiB pages and pages of a little over 1 MiB, which begin in one WRITE request and end in
    # the next: workers copy their bytes into the drafts and checksum the pages they complete.
    sizes = [(128 << 10) if i % 2 else (1 << 20) + 4096 * i + 1 for i in range(16)]
    batch = [(f"{POOL}/r{rank}-in{i:03d}", content(rank * 1000 + 500 + i, size)) for i, size in enumerate(sizes)]
    fd = os.open(mount.path / ".hicachefs" / "ingest", os.O_RDWR)
    try:
        assert ingest_batch(fd, batch) == 16 + sum(len(f"{len(d)} {p}\n") for p, d in batch) + sum(sizes)
        assert ingest_status(fd) == (16, 0)
    finally:
        os.close(fd)
    for path, data in batch:  # the checksum the page is stored with is that of its bytes
        stored = os.getxattr(mount.path / path, "user.hicachefs.checksum").decode()
        assert stored == f"xxh3_64:{xxhash.xxh3_64_intdigest(data):016x}", path
    ours += batch
    fd = os.open(mount.path / ".hicachefs" / "fetch", os.O_RDWR)
    try:
        assert fetch_pages(fd, [(p, len(d)) for p, d in ours]) == b"".join(d for _, d in ours)
    finally:
        os.close(fd)
    for path, _ in ours[:4]:
        os.unlink(mount.path / path)
    return ours[4:]


def test_two_clients_are_served_by_both_workers_with_every_byte_right(mount_factory, tmp_path):
    mount = mount_factory(*disk_flags(tmp_path))
    assert len(mount.worker_pids) == 2 and all(mounting.alive(pid) for pid in mount.worker_pids)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        kept = [page for pages in pool.map(client, [mount, mount], [1, 2]) for page in pages]
    names = sorted(os.listdir(mount.path / POOL))
    assert names == sorted(path.rsplit("/", 1)[1] for path, _ in kept)
    for path, data in kept:  # every page, from RAM (shared memory) or the disk (sent inline)
        assert read_page(mount.path / path) == data
    stats = mount.stats()
    by_worker = stats["requests_by_worker"]
    assert set(by_worker) == {"1", "2"} and all(sum(ops.values()) > 0 for ops in by_worker.values())
    assert sum(sum(ops.values()) for ops in by_worker.values()) == sum(stats["requests"].values())
    metrics = (mount.path / ".hicachefs" / "metrics").read_text()
    for worker in ("1", "2"):
        assert f'hicachefs_worker_requests_total{{operation="read",worker="{worker}"}}' in metrics
    top = subprocess.run([sys.executable, "-m", "hicachefs.cli", "top", str(mount.path), "--count", "1",
                          "--interval", "0.2"], capture_output=True, text=True, timeout=60)
    shown = [line.split() for line in top.stdout.splitlines()]
    assert [row[0] for row in shown if len(row) == 3 and row[0] in ("1", "2")] == ["1", "2"], top.stdout


def test_workers_read_a_fetch_batch_mostly_alone_and_only_from_its_own_request(mount_factory):
    mount = mount_factory("--memory", "512M", "--workers", "2")  # 16 MiB of pages pinned ahead
    pool = mount.page_dir()
    batches = [stored_pages(mount, "a", 0, 40), stored_pages(mount, "b", 100, 40)]
    before = mount.stats()
    fd = os.open(mount.path / ".hicachefs" / "fetch", os.O_RDWR)
    try:
        for batch in batches:  # the same handle, a new request: nothing of the last one's pages
            assert fetch_pages(fd, [(p, len(d)) for p, d in batch]) == b"".join(d for _, d in batch)
        os.write(fd, f"{1 << 20} {batches[0][5][0]}\n{1 << 20} {POOL}/b001\n".encode())
        assert os.pread(fd, 1 << 20, 0) == batches[0][5][1]
        os.unlink(pool / "b001")  # pinned by the window of that read: still read whole, one version
        assert os.pread(fd, 1 << 20, 1 << 20) == batches[1][1][1]
        os.write(fd, f"{1 << 20} {batches[0][5][0]}\n{1 << 20} {POOL}/b001\n".encode())
        assert os.pread(fd, 2 << 20, 0) == batches[0][5][1]  # gone now: the answer ends at it
        lines = [f"{len(d)} {p}\n".encode() for p, d in batches[0][:3]]
        os.write(fd, lines[0])  # a request in two writes: the second adds to the first
        os.write(fd, lines[1] + lines[2])
        assert os.pread(fd, 3 << 20, 0) == b"".join(d for _, d in batches[0][:3])
    finally:
        os.close(fd)
    after = mount.stats()
    alone = sum(after["reads_answered_alone"].values()) - sum(before["reads_answered_alone"].values())
    reads = after["requests"]["read"] - before["requests"]["read"]
    # 87 READs of the handle (and those of the stats): all but a few alone, the first of each
    # request's too (its first pages are pinned when the request is written).
    assert 80 <= alone and reads >= 87
    assert sum(ops.get("read", 0) for ops in after["requests_by_worker"].values()) == after["requests"]["read"]
    metrics = (mount.path / ".hicachefs" / "metrics").read_text()
    assert "hicachefs_worker_reads_answered_alone_total" in metrics


def test_fetch_handles_open_at_once_each_read_only_their_own_request(mount_factory):
    mount = mount_factory("--memory", "256M", "--workers", "2")
    pages = stored_pages(mount, "h", 300, 24)
    handles = [os.open(mount.path / ".hicachefs" / "fetch", os.O_RDWR) for _ in range(8)]
    try:
        for n, fd in enumerate(handles):  # every request written before any is read
            os.write(fd, b"".join(f"{1 << 20} {p}\n".encode() for p, _ in pages[n * 3 : n * 3 + 3]))
        for part in range(3):  # then read a page of each in turn
            for n, fd in enumerate(handles):
                assert os.pread(fd, 1 << 20, part << 20) == pages[n * 3 + part][1], (n, part)
        first, other = handles[:2]
        os.write(first, f"{1 << 20} {pages[0][0]}\n{1 << 20} {pages[1][0]}\n".encode())
        assert os.pread(first, 1 << 20, 0) == pages[0][1]  # a worker answers it alone
        os.write(other, f"{1 << 20} {pages[2][0]}\n".encode())  # another handle's window meanwhile
        os.write(first, f"{1 << 20} {pages[5][0]}\n".encode())  # read, so this is a new request
        assert os.pread(first, 1 << 20, 0) == pages[5][1]
    finally:
        for fd in handles:
            os.close(fd)


def test_idle_fetch_handles_leave_the_ram_tier_room_for_writes(mount_factory):
    mount = mount_factory("--memory", "16M", "--workers", "2")  # room for some 14 pages of 1 MiB
    pages = stored_pages(mount, "i", 900, 12)
    handles = [os.open(mount.path / ".hicachefs" / "fetch", os.O_RDWR) for _ in pages]
    try:
        for fd, (path, _) in zip(handles, pages):  # each request's page pinned for the workers
            os.write(fd, f"{1 << 20} {path}\n".encode())
        newer = stored_pages(mount, "j", 950, 12)  # room made by evicting the older pages
        for path, data in newer:
            assert read_page(mount.path / path) == data
    finally:
        for fd in handles:
            os.close(fd)


def test_a_plain_users_fetch_handle_pins_no_pages_ahead(public_mount_factory):
    mount = public_mount_factory("--memory", "256M", "--workers", "2")
    pages = stored_pages(mount, "n", 700, 8)
    request = "".join(f"{1 << 20} {p}\n" for p, _ in pages)
    script = (f"import hashlib, mmap, os; fd = os.open({str(mount.path / '.hicachefs' / 'fetch')!r}, os.O_RDWR); "
              f"os.write(fd, {request!r}.encode()); buffer = mmap.mmap(-1, {8 << 20}); "  # page-aligned: 1 MiB READs
              f"print(os.preadv(fd, [buffer], 0), hashlib.sha256(buffer).hexdigest())")
    expected = f"{8 << 20} {hashlib.sha256(b''.join(d for _, d in pages)).hexdigest()}"

    def alone() -> int:
        return sum(mount.stats()["reads_answered_alone"].values())

    before = alone()
    result = as_nobody("/usr/bin/python3.11", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected
    assert alone() == before  # each of its 8 READs went to the owner: nothing pinned ahead of them
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == expected
    assert alone() == before + 8  # the store's own client's: all 8 answered alone


def test_pages_read_from_the_disk_tier_come_back_whole(mount_factory, tmp_path):
    mount = mount_factory(*disk_flags(tmp_path, "16M"))
    pool = mount.page_dir()
    pages = [(f"p{i:03d}", content(i, 1 << 20)) for i in range(40)]  # more than RAM: some demoted
    for name, data in pages:
        publish(pool, name, data)
    assert os.getxattr(pool / pages[0][0], "user.hicachefs.tier") == b"disk"
    for name, data in pages:
        assert read_page(pool / name) == data


def test_a_big_pool_lists_whole(mount_factory, tmp_path):
    mount = mount_factory("--memory", "64M", "--workers", "2")
    pool = mount.page_dir()
    for i in range(1500):
        publish(pool, f"page-{i:05d}", content(i, 64))
    assert sorted(os.listdir(pool)) == [f"page-{i:05d}" for i in range(1500)]
    assert subprocess.run(["ls", "-l", str(pool)], capture_output=True, text=True, timeout=60).stdout.count("\n") == 1501


def test_a_small_request_is_answered_while_large_ones_keep_every_worker_waiting(mount_factory):
    """Four 8 MiB exists queries are answered a step at a time, taking turns (some 0.7 s each
    here); with one request at a time per worker, both workers waited on them and a one-line
    query sent meanwhile came after two of them (390 ms). A worker now takes further requests
    while one waits on the owner."""
    mount = mount_factory("--memory", "64M", "--workers", "2")
    mount.page_dir()
    names = [f"{POOL}/{i:064x}" for i in range(8 * 1024 * 1024 // 110)]  # just under 8 MiB
    sent, answered = threading.Barrier(5), []

    def large() -> None:
        with exists_handle(mount.path) as fd:
            send_exists(fd, "".join(name + "\n" for name in names).encode())
            sent.wait(30)
            assert exists_answer(fd) == b"0" * len(names) + b"\n"
            answered.append("large")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        larges = [pool.submit(large) for _ in range(4)]
        sent.wait(30)
        assert exists_query(mount.path, [f"{POOL}/missing"]) == "0"
        answered.append("small")
        for done in larges:
            done.result(timeout=120)
    assert answered[0] == "small", answered


def test_a_worker_that_dies_takes_the_mount_down_and_the_remount_is_warm(mount_factory, tmp_path):
    flags = disk_flags(tmp_path, "64M", "--write-through")
    mount = mount_factory(*flags)
    # The other worker's answer to a request the abort dropped finds no one waiting for it.
    mount.expected_log_errors += ["aborting its FUSE connection", "fuse_reply_* failed"]
    pool = mount.page_dir()
    pages = [(f"p{i:03d}", content(i, 256 << 10)) for i in range(20)]
    for name, data in pages:
        publish(pool, name, data)
    failures: list[OSError] = []
    reading = threading.Event()

    def traffic() -> None:
        try:
            while True:
                for name, data in pages:
                    assert read_page(pool / name) == data
                    reading.set()
        except OSError as exc:
            failures.append(exc)

    clients = [threading.Thread(target=traffic, daemon=True) for _ in range(2)]
    for thread in clients:
        thread.start()
    assert reading.wait(30)
    os.kill(mount.worker_pids[0], signal.SIGKILL)
    for thread in clients:
        thread.join(DEAD_MOUNT_TIMEOUT_S)
        assert not thread.is_alive(), "a client hung on the mount of a dead worker"
    assert [exc.errno in (errno.ENOTCONN, errno.ECONNABORTED) for exc in failures] == [True, True]
    assert mounting.wait_gone(mount.pid, 60) and not any(mounting.alive(pid) for pid in mount.worker_pids)
    assert "worker 1 (pid %d) was killed by SIGKILL" % mount.worker_pids[0] in mount.log_text()

    again = mount_factory(*flags, path=mount.path)
    assert "loaded" in again.log_text() or "scann" in again.log_text()
    for name, data in pages:
        assert read_page(again.path / pool.relative_to(mount.path) / name) == data


def test_a_crashed_owner_takes_its_workers_with_it_quietly(mount_factory, tmp_path):
    flags = disk_flags(tmp_path, "64M", "--write-through")
    mount = mount_factory(*flags)
    pool = mount.page_dir()
    pages = [(f"p{i:03d}", content(i, 256 << 10)) for i in range(20)]
    for name, data in pages:
        publish(pool, name, data)
    reading = threading.Event()

    def traffic() -> None:
        try:
            while True:
                for name, _ in pages:
                    os.stat(pool / name)
                    read_page(pool / name)
                    reading.set()
        except OSError:
            pass  # the mount is dead

    clients = [threading.Thread(target=traffic, daemon=True) for _ in range(4)]
    for thread in clients:
        thread.start()
    assert reading.wait(30)
    mounting.kill(mount)  # SIGKILL to the owner, while both workers forward requests
    for thread in clients:
        thread.join(DEAD_MOUNT_TIMEOUT_S)
        assert not thread.is_alive(), "a client hung on the mount of a dead owner"
    assert not any(mounting.alive(pid) for pid in mount.worker_pids)
    again = mount_factory(*flags, path=mount.path)  # the fixture checks both logs hold no error
    for name, data in pages:
        assert read_page(again.path / pool.relative_to(mount.path) / name) == data


def test_sigterm_ends_every_process_and_writes_the_ram_tier_down_once(mount_factory, tmp_path):
    flags = disk_flags(tmp_path)
    mount = mount_factory(*flags)
    pool = mount.page_dir()
    pages = [(f"p{i:03d}", content(i, 1 << 20)) for i in range(16)]
    for name, data in pages:
        publish(pool, name, data)
    assert mount.stats()["tiers"]["disk"]["pages"] == 0  # in RAM only, until the stop
    mounting.stop(mount)
    assert not mounting.alive(mount.pid) and not any(mounting.alive(pid) for pid in mount.worker_pids)
    assert not mounting.is_mounted(mount.path)
    log = mount.log_text()
    assert log.count("SIGTERM: finishing requests in flight") == 1 and log.count("store closed") == 1

    again = mount_factory(*flags, path=mount.path)
    assert "loaded the disk index from its snapshot: 16 pages" in again.log_text()
    assert again.stats()["tiers"]["disk"]["pages"] == 16
    for name, data in pages:
        assert read_page(again.path / pool.relative_to(mount.path) / name) == data


@pytest.mark.parametrize("value", ["0", "65", "-1", "two", "1.5", ""])
def test_a_bad_worker_count_is_refused_and_nothing_is_mounted(tmp_path, value):
    target = tmp_path / "mnt"
    target.mkdir()
    for how in (["--workers", value], ["-o", f"workers={value}"]):
        result = subprocess.run([sys.executable, "-m", "hicachefs.cli", "mount", str(target), "--memory", "16M",
                                 "--log-file", str(tmp_path / "log"), *how],
                                capture_output=True, text=True, timeout=60)
        try:
            assert result.returncode != 0
            assert "--workers" in result.stderr and "from 1 to 64" in result.stderr
            assert not mounting.is_mounted(target)
        finally:
            mounting.stop_if_mounted(target)
