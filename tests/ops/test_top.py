"""``hicachefs top``: the rates it shows add up to what was moved while it ran."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from rich.console import Console

from hicachefs.cli import top as top_command
from hicachefs_testing import mounting
from hicachefs_testing.workload import content, fill_writing_share
from pages import publish

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def start_top(mountpoint: Path, count: int, interval: float = 1.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "top", str(mountpoint), "--count", str(count),
                             "--interval", str(interval)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_first_view(top: subprocess.Popen) -> str:
    """Lines up to the end of the first view, which a fresh mount ends with 'errors: none'."""
    lines = []
    while not lines or lines[-1].strip() != "errors: none":
        line = top.stdout.readline()
        assert line, "top ended before its first view: " + top.stderr.read()
        lines.append(line)
    return "".join(lines)


def views(text: str) -> list[dict]:
    """Each plain-text view as {'seconds', 'hit rate', table title -> {row name -> {column -> cell}}}."""
    parsed = []
    for chunk in text.split("hicachefs top ")[1:]:
        lines = chunk.splitlines()
        blank = next(i for i, line in enumerate(lines) if not line.strip())
        summary, lines = "\n".join(lines[:blank]), lines[blank:]  # the summary ends at a blank line
        view = {"seconds": float(re.search(r"over ([\d.]+) s", summary)[1]),
                "hit rate": re.search(r"hit rate (\S+)", summary)[1]}
        table = None  # tables are drawn between blank lines: header, a rule, rows
        for line in lines:
            stripped = line.strip()
            if not stripped:
                table = None
            elif not stripped.startswith("─"):
                cells = re.split(r"\s{2,}", stripped)
                if table is None:
                    table, columns = view.setdefault(cells[0], {}), cells
                else:
                    table[cells[0]] = dict(zip(columns[1:], cells[1:]))
        parsed.append(view)
    return parsed


def quantity(cell: str) -> float:
    """'16.0 MiB' -> bytes, '12.5' -> 12.5, '-' -> 0."""
    if cell == "-":
        return 0.0
    number, _, unit = cell.partition(" ")
    return float(number) * UNITS.get(unit, 1)


def moved(frames: list[dict], table: str, row: str, column: str) -> float:
    """A rate integrated over the views: how much of it happened while top ran."""
    return sum(quantity(v[table][row][column]) * v["seconds"] for v in frames if row in v.get(table, {}))


def read_uncached(path: Path) -> bytes:
    """Read a page from the daemon, not from the kernel's page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.pread(fd, 1 << 24, 0)
    finally:
        os.close(fd)


def test_rates_add_up_to_the_pages_written_and_read(mounted):
    pool = mounted.page_dir()
    pages, size = 16, 1 << 20
    top = start_top(mounted.path, count=4)
    first = read_first_view(top)
    writes_before = mounted.stats()["requests"].get("write", 0)
    for i in range(pages):
        publish(pool, f"k{i}", content(i, size))
    writes = mounted.stats()["requests"]["write"] - writes_before
    for i in range(pages):
        assert len(read_uncached(pool / f"k{i}")) == size
    out, err = top.communicate(timeout=60)
    assert top.returncode == 0 and err == ""
    frames = views(first + out)
    assert len(frames) == 4
    assert views(first)[0]["per second"]["memory"]["in"] == "0 B"
    later = frames[1:]
    assert moved(later, "per second", "memory", "in") == pytest.approx(pages * size, rel=0.05)
    assert moved(later, "per second", "memory", "out") == pytest.approx(pages * size, rel=0.05)
    assert moved(later, "tier", "memory", "hits/s") == pytest.approx(pages, rel=0.05)
    for op in ("create", "rename"):
        assert moved(later, "FUSE request", op, "per s") == pytest.approx(pages, rel=0.05), op
    # At most 1 MiB per write request; an unaligned buffer takes two.
    assert writes >= pages and moved(later, "FUSE request", "write", "per s") == pytest.approx(writes, rel=0.05)
    assert {v["hit rate"] for v in later} <= {"100.0", "-"} and "100.0" in {v["hit rate"] for v in later}
    last = frames[-1]["tier"]["memory"]
    assert (last["pages"], last["used"], last["capacity"]) == (str(pages), "16.0 MiB", "64.0 MiB")  # the fixture's --memory
    assert all("errors: none" in v for v in frames)


def test_demotions_promotions_and_disk_reads_show(mount_factory, tmp_path):
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "ssd"), "--disk-size", "64M")
    pool = mount.page_dir()
    top = start_top(mount.path, count=4)
    first = read_first_view(top)
    before = mount.stats()["tiers"]
    for i in range(24):  # more than the RAM tier holds: the oldest move down
        publish(pool, f"k{i}", content(i, 1 << 20))
    for _ in range(3):  # a disk page is promoted on its second read, then served from RAM
        for i in range(4):
            read_uncached(pool / f"k{i}")
    out, err = top.communicate(timeout=60)
    assert top.returncode == 0 and err == ""
    after = mount.stats()["tiers"]
    later = views(first + out)[1:]

    def grown(tier, key):
        return after[tier][key] - before[tier][key]

    assert grown("memory", "demotions") > 0 and grown("memory", "promotions") > 0
    assert moved(later, "per second", "memory", "demotions") == pytest.approx(grown("memory", "demotions"), rel=0.05)
    assert moved(later, "per second", "memory", "promotions") == pytest.approx(grown("memory", "promotions"), rel=0.05)
    assert moved(later, "per second", "disk", "in") == pytest.approx(grown("disk", "bytes_in"), rel=0.05)
    assert moved(later, "per second", "disk", "out") == pytest.approx(grown("disk", "bytes_out"), rel=0.05)
    assert moved(later, "tier", "disk", "hits/s") == pytest.approx(grown("disk", "hits"), rel=0.05)
    assert moved(later, "tier", "memory", "hits/s") == pytest.approx(grown("memory", "hits"), rel=0.05)
    assert grown("memory", "hits") >= 4
    memory_hit_rates = {v["tier"]["memory"]["hit rate"] for v in later} - {"-"}
    assert memory_hit_rates and all(float(r.split()[0]) < 100 for r in memory_hit_rates)
    assert views(first + out)[-1]["tier"]["disk"]["pages"] == str(mount.stats()["tiers"]["disk"]["pages"])


def _read_until_closed(controller: int, deadline: float) -> bytes:
    """What the terminal shows until its other side is closed or ``deadline``: read as a terminal
    does, since a full terminal holds a writer's last screens (and the one that leaves the
    alternate screen) until they are read."""
    shown = b""
    while select.select([controller], [], [], max(0.0, deadline - time.monotonic()))[0]:
        try:
            chunk = os.read(controller, 1 << 16)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        shown += chunk
    return shown


def test_on_a_terminal_it_redraws_until_ctrl_c(mounted):
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # the size is the pty's
    environment["PYTHONFAULTHANDLER"] = "1"  # a top that outlives its Ctrl-C shows where it is (SIGABRT below)
    top = subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "top", str(mounted.path), "--interval", "0.3"],
                           stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True, env=environment)
    os.close(terminal)
    screen = b""
    try:
        deadline = time.monotonic() + 30
        while screen.count(b"hicachefs top") < 3 and time.monotonic() < deadline:
            screen += os.read(controller, 1 << 16)
        top.send_signal(signal.SIGINT)
        screen += _read_until_closed(controller, time.monotonic() + 10)  # as top ends
        try:
            top.wait(timeout=10)
        except subprocess.TimeoutExpired:
            top.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack to the terminal
            stacks = _read_until_closed(controller, time.monotonic() + 5).decode(errors="replace")
            pytest.fail(f"top did not end within 20 s of Ctrl-C; where it was:\n{stacks[-4000:]}")
        assert top.returncode == 0
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(controller)
    text = screen.decode(errors="replace")
    assert screen.count(b"hicachefs top") >= 3
    assert "\x1b[?1049h" in text and "\x1b[?1049l" in text  # drawn on the alternate screen, then left
    assert "Traceback" not in text
    for heading in ("tier", "pages", "used", "capacity", "hit rate", "per second", "promotions", "FUSE request"):
        assert heading in text, heading  # whole: the view fits 80 columns
    assert " memory " in text and "…" not in text


@pytest.mark.parametrize("args, message", [
    (["/proc"], "hicachefs: /proc is a mount of type proc, not hicachefs"),
    (["MOUNT", "--count", "0"], "--count must be at least 1"),
    (["MOUNT", "--interval", "0"], "--interval must be from 0.1"),
])
def test_bad_input_gives_one_line(mounted, args, message):
    args = [str(mounted.path) if a == "MOUNT" else a for a in args]
    result = subprocess.run([sys.executable, "-m", "hicachefs.cli", "top", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert mounting.alive(mounted.pid)


def test_the_ram_shares_show_what_they_hold_of_what_they_may(mount_factory):
    """Issue 31: top shows the RAM budget's shares; files being written show in theirs."""
    mount = mount_factory("--memory", "64M")
    held = fill_writing_share(mount.page_dir(), 1 << 20)
    top = start_top(mount.path, count=1)
    out, err = top.communicate(timeout=60)
    assert top.returncode == 0 and err == ""
    shares = views(out)[-1]["RAM share"]
    assert shares["writing"] == {"held": "32.0 MiB", "of": "32.0 MiB"}
    assert shares["pins"]["held"] == "0 B" and quantity(shares["pins"]["of"]) == 12 << 20
    assert set(shares) == {"writing", "reserved_ahead", "pins", "pins_of_others", "kernel_pushes", "write_behind",
                           "private_reads", "private_reads_of_others"}
    for path in held:
        os.unlink(path)


def test_over_a_restart_it_shows_what_the_new_daemon_counted(mount_factory):
    mount = mount_factory("--memory", "16M", "--no-kernel-cache")
    pool = mount.page_dir()
    for i in range(10):
        publish(pool, f"old{i}", content(i, 1 << 16))
        read_uncached(pool / f"old{i}")  # 10 hits the old daemon counts before top's first read
    top = start_top(mount.path, count=1, interval=4.0)
    time.sleep(0.5)  # its first read, of the old daemon
    mounting.stop(mount)
    mount = mount_factory("--memory", "16M", "--no-kernel-cache", path=mount.path)
    pool = mount.page_dir()
    for i in range(30):
        publish(pool, f"new{i}", content(i, 1 << 16))
        read_uncached(pool / f"new{i}")
    assert mount.stats()["tiers"]["memory"]["hits"] == 30
    out, err = top.communicate(timeout=60)
    assert top.returncode == 0, err
    assert moved(views(out), "tier", "memory", "hits/s") == pytest.approx(30, rel=0.05)
    assert moved(views(out), "FUSE request", "create", "per s") == pytest.approx(30, rel=0.05)


def test_over_a_restart_of_a_daemon_that_does_not_say_who_it_is_no_rate_is_negative():
    """A daemon older than the stats' ``daemon`` field, restarted between two reads: the reads
    were taken for one daemon's, and top showed negative rates (found by review)."""
    def sample(hits: int, reads: int, taken: float) -> top_command.Sample:
        return top_command.Sample({"pages": 1, "misses": 0, "errors": {}, "requests": {"read": reads},
                                   "tiers": {"memory": {"hits": hits, "bytes_out": hits << 16}}}, taken)

    console = Console(width=80, record=True)
    console.print(top_command.render(Path("/mnt"), sample(10, 50, 0.0), sample(3, 4, 1.0)))
    shown = console.export_text()
    assert not re.search(r"-\d", shown) and "3.00" in shown, shown
