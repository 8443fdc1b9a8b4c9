"""A start after a crash scans the disk arena and shows how it goes on the terminal of
``hicachefs mount`` and in the log; a start after ``hicachefs umount`` loads the index snapshot
and says so in one line. Either way every page reads back. Off a terminal (a log, a pipe), a
long scan prints its progress every few seconds, and so does a long fill of the RAM tier."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from hicachefs.cli import recovery_display
from hicachefs.daemon import recovery_reporter
from hicachefs.store.tier import RecoveryProgress
from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import publish, read_page

PAGES = 120


def hicachefs(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hicachefs.cli", *args], capture_output=True, text=True,
                          timeout=120, **kwargs)


def mount_on_a_terminal(args: list[str]) -> tuple[int, str]:
    """Run ``hicachefs mount`` with a pseudo-terminal as its terminal: (exit status, all it wrote)."""
    controller, terminal = os.openpty()
    command = subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "mount", *args],
                               stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True)
    os.close(terminal)
    screen = b""
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                chunk = os.read(controller, 1 << 16)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not chunk:
                break
            screen += chunk
        status = command.wait(timeout=10)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        os.close(controller)
    return status, screen.decode()


def test_a_crash_scans_with_progress_and_umount_makes_the_next_start_warm(mount_factory, tmp_path):
    flags = ["--memory", "64M", "--disk", str(tmp_path / "ssd"), "--disk-size", "256M", "--write-through"]
    mount = mount_factory(*flags)
    pool = mount.page_dir()
    pages = {f"k{i}": content(i, 1 << 20) for i in range(PAGES)}
    for key, data in pages.items():
        publish(pool, key, data)
    mounting.kill(mount)

    scan_log, warm_log = tmp_path / "scan.log", tmp_path / "warm.log"
    status, screen = mount_on_a_terminal([str(mount.path), *flags, "--log-file", str(scan_log)])
    scanned = mounting.Mount(mount.path, scan_log, flags)
    try:
        assert status == 0, screen
        scanned.pid = int(re.search(r"mounted .* \(pid (\d+),", screen)[1])
        # Why it scans, then the progress redrawn in place (pages found, time left), the outcome over it.
        assert screen.startswith("hicachefs: rebuilding the disk index by scanning the arena: "
                                 "it was not unmounted cleanly\r\n"), screen
        progress = re.findall(r"\rhicachefs: scanning: ([\d,]+) pages found, \d+% done, about \d+ s left", screen)
        assert progress and all(0 < int(found.replace(",", "")) <= PAGES for found in progress), screen
        outcome = re.search(r"\rhicachefs: scanned the disk arena: ([\d,]+) pages in [\d.]+ s *\r\n", screen)
        assert outcome and int(outcome[1].replace(",", "")) == PAGES, screen
        assert screen[outcome.end():].startswith(f"hicachefs: mounted {mount.path} (pid ")
        log = scan_log.read_text()
        assert "INFO hicachefs.daemon.recovery_reporter: rebuilding the disk index by scanning the arena: " \
               "it was not unmounted cleanly\n" in log
        assert re.search(r" INFO hicachefs.daemon.recovery_reporter: scanning: [\d,]+ pages found, \d+% done, "
                         r"about \d+ s left\n", log)
        assert f"INFO hicachefs.daemon.recovery_reporter: scanned the disk arena: {PAGES} pages in " in log
        for key, data in pages.items():
            assert read_page(pool / key) == data
        result = hicachefs("umount", str(mount.path))
        assert result.returncode == 0, result.stderr
    finally:
        mounting.stop(scanned)
    assert not mounting.unexpected_log_lines(scanned)

    result = hicachefs("mount", str(mount.path), *flags, "--log-file", str(warm_log))
    warm = mounting.Mount(mount.path, warm_log, flags)
    try:
        assert result.returncode == 0 and result.stderr == "", result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == 2, result.stdout
        assert re.fullmatch(rf"hicachefs: loaded the disk index from its snapshot: {PAGES} pages in [\d.]+ s", lines[0])
        assert lines[1].startswith(f"hicachefs: mounted {mount.path} (pid ")
        warm.pid = int(re.search(r"\(pid (\d+),", lines[1])[1])
        assert lines[0].removeprefix("hicachefs: ") in warm_log.read_text()
        assert "scanning" not in warm_log.read_text()
        for key, data in pages.items():
            assert read_page(pool / key) == data
        assert mounting.Mount(mount.path, warm_log, flags).stats()["tiers"]["disk"]["pages"] == PAGES
    finally:
        mounting.stop(warm)
    assert not mounting.unexpected_log_lines(warm)


class Clock:
    """Stands in for ``time`` in the recovery reporter and display: the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def off_a_terminal(monkeypatch, caplog):
    """The daemon's reporter and the command's display off a terminal, joined by a pipe, on a
    clock the test moves: (clock, reporter, display, what the display printed)."""
    clock = Clock()
    monkeypatch.setattr(recovery_reporter, "time", clock)
    monkeypatch.setattr(recovery_display, "time", clock)
    caplog.set_level(logging.INFO, "hicachefs")
    read_end, write_end = os.pipe()
    out = io.StringIO()
    return clock, recovery_reporter.Reporter(write_end), recovery_display.Display(read_end, out), out


def reporter_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hicachefs.daemon.recovery_reporter"]


def test_off_a_terminal_a_long_scan_prints_progress_every_few_seconds(off_a_terminal, caplog):
    clock, reporter, display, out = off_a_terminal
    gib = 1 << 30
    reporter(RecoveryProgress("scan", "its index snapshot is missing", 0, 0, 0, 0.0, False))
    for second in range(1, 21):  # a 20 s scan of 20 GiB, one report a second
        clock.now += 1
        reporter(RecoveryProgress("scan", "its index snapshot is missing", 1000 * second, second * gib, 20 * gib,
                                  float(second), False))
        display.poll()
    reporter(RecoveryProgress("scan", "its index snapshot is missing", 20_000, 20 * gib, 20 * gib, 20.0, True))
    reporter.close()
    display.close()
    assert out.getvalue().splitlines() == [
        "hicachefs: rebuilding the disk index by scanning the arena: its index snapshot is missing",
        "hicachefs: scanning: 5,000 pages found, 25% done, about 15 s left",
        "hicachefs: scanning: 10,000 pages found, 50% done, about 10 s left",
        "hicachefs: scanning: 15,000 pages found, 75% done, about 5 s left",
        "hicachefs: scanning: 20,000 pages found, 100% done, about 0 s left",
        "hicachefs: scanned the disk arena: 20,000 pages in 20.0 s",
    ]
    logged = reporter_log(caplog)
    assert logged[0] == "rebuilding the disk index by scanning the arena: its index snapshot is missing"
    assert logged[1:-1] == [f"scanning: {n:,} pages found, {n // 200}% done, about {20 - n // 1000} s left"
                            for n in (1000, 6000, 11000, 16000)]
    assert logged[-1] == "scanned the disk arena: 20,000 pages in 20.0 s"


def test_a_long_fill_of_the_ram_tier_says_how_far_it_has_come(off_a_terminal, caplog):
    clock, reporter, display, out = off_a_terminal
    gib = 1 << 30
    reporter(RecoveryProgress("fill", "", 0, 0, 10 * gib, 1.0, False))
    for second in range(1, 11):  # 10 GiB in 10 s, one report a second
        clock.now += 1
        reporter(RecoveryProgress("fill", "", 0, second * gib, 10 * gib, float(second), second == 10))
        display.poll()
    reporter.close()
    display.close()
    assert out.getvalue().splitlines() == [
        "hicachefs: filling the RAM tier's 10.0 GiB of memory before the mount serves",
        "hicachefs: filling memory: 50% done, about 5 s left",
        "hicachefs: filled the RAM tier's 10.0 GiB of memory in 10.0 s",
    ]
    assert reporter_log(caplog) == ["filling the RAM tier's 10.0 GiB of memory before the mount serves",
                      "filling memory: 10% done, about 9 s left", "filling memory: 60% done, about 4 s left",
                      "filled the RAM tier's 10.0 GiB of memory in 10.0 s"]


def test_a_start_with_another_disk_size_says_that_the_disk_tiers_pages_are_dropped(mount_factory, tmp_path):
    """A changed --disk-size formats the arena anew (operations.md): the mount said only 'the
    arena is new', as on a first start, so a mistyped size emptied the disk tier without a word.
    Found by a review helper."""
    ssd = tmp_path / "ssd"
    mount = mount_factory("--memory", "32M", "--disk", str(ssd), "--disk-size", "128M", "--write-through")
    publish(mount.page_dir(), "k", content(1, 4096))
    assert hicachefs("umount", str(mount.path)).returncode == 0
    log = tmp_path / "again.log"
    with mounted_again(mount.path, ssd, log) as (result, _):
        said = ("the arena was made with --disk-size 134,217,728 bytes, not 67,108,864: its pages are dropped")
        assert said in result.stdout.splitlines()[0], result.stdout
        assert said in log.read_text() and " WARNING " in log.read_text()
        assert not (mount.path / "model" / "bfloat16-page_first-64" / "tp0of1" / "kv" / "k").exists()


@contextlib.contextmanager
def mounted_again(path, ssd, log):
    """``hicachefs mount`` at ``path`` again on the disk tier in ``ssd`` (64 MiB), logging to
    ``log``: its command's result and its mount, unmounted after."""
    result = hicachefs("mount", str(path), "--memory", "32M", "--disk", str(ssd), "--disk-size", "64M",
                       "--log-file", str(log))
    again = mounting.Mount(path, log, [])
    try:
        assert result.returncode == 0, result.stderr
        again.pid = int(re.search(r"\(pid (\d+),", result.stdout)[1])
        yield result, again
    finally:
        mounting.stop(again)


@pytest.mark.parametrize("damaged", [(0,), (0, 3584)], ids=["one copy", "both copies"])
def test_a_bit_flipped_in_the_arenas_superblock_loses_no_page_while_one_copy_holds(mount_factory, tmp_path,
                                                                                  damaged):
    """A bit flipped in the superblock's file id made the next start lose every disk page,
    silently (found by review). With one of its two copies whole the page is served after
    ``hicachefs umount`` and a new mount; with both damaged the mount says the pages are
    dropped, and the daemon starts and serves."""
    ssd = tmp_path / "ssd"
    mount = mount_factory("--memory", "32M", "--disk", str(ssd), "--disk-size", "64M", "--write-through")
    publish(mount.page_dir(), "k", content(1, 4096))
    assert hicachefs("umount", str(mount.path)).returncode == 0
    with open(ssd / "hicachefs.arena", "r+b") as arena:
        for copy in damaged:
            arena.seek(copy + 32 + 2)  # in the file id
            byte = arena.read(1)[0]
            arena.seek(copy + 32 + 2)
            arena.write(bytes([byte ^ 0x10]))
    log = tmp_path / "again.log"
    with mounted_again(mount.path, ssd, log) as (result, again):
        page = again.page_dir() / "k"
        if damaged == (0,):
            assert "loaded the disk index from its snapshot: 1 pages" in result.stdout, result.stdout
            assert read_page(page) == content(1, 4096)
        else:
            said = "its superblock is damaged (no copy of it holds): what it held is dropped"
            assert said in result.stdout.splitlines()[0] and said in log.read_text(), result.stdout
            assert not page.exists()
            publish(again.page_dir(), "k", content(2, 4096))
            assert read_page(page) == content(2, 4096)
