"""Refusals (issue 29, item 9): a user refused again and again grows the daemon's log by a line
per kind now and then, not a line per refusal; every refusal is counted in stats, by kind and
user, and so is every line left out. Files dropped unpublished (a failed write) are logged
the same way, their names escaped."""

from __future__ import annotations

import logging
import os

import pytest

from hicachefs.posix.refusal_log import RefusalLog
from pages import as_nobody, publish

REFUSALS = 200


def test_a_plain_users_refusals_are_counted_each_and_logged_once_per_kind(public_mount):
    pool = public_mount.page_dir()
    publish(pool, "k", b"page")
    script = f"""
import errno, os
for _ in range({REFUSALS}):
    try:
        os.mkdir({str(public_mount.path / "x")!r})
    except PermissionError:
        pass
for _ in range(3):
    try:
        os.setxattr({str(pool / "k")!r}, "user.mine", b"1")
    except OSError as exc:
        assert exc.errno == errno.ENOTSUP, exc
"""
    done = as_nobody("/usr/bin/python3", "-c", script)
    assert done.returncode == 0, done.stderr
    try:
        (pool / "deeper").mkdir()  # root, refused as well (pools hold pages): its own line
    except PermissionError:
        pass
    warnings = [line for line in public_mount.log_text().splitlines() if " WARNING " in line]
    assert [line for line in warnings if "EACCES" in line and "[uid 65534]" in line] != []
    assert len([line for line in warnings if "EACCES" in line]) == 1, warnings
    assert len([line for line in warnings if "ENOTSUP" in line]) == 1, warnings
    assert [line for line in warnings if "EPERM" in line and "[uid 0]" in line] != [], warnings
    stats = public_mount.stats()
    assert stats["errors_by_user"]["65534"] == {"EACCES": REFUSALS, "ENOTSUP": 3}
    assert stats["errors_by_user"]["0"]["EPERM"] == 1
    assert stats["errors"]["EACCES"] == REFUSALS
    assert stats["errors_not_logged"] == REFUSALS - 1 + 2


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_after_the_interval_one_line_says_how_many_were_left_out(caplog):
    clock = Clock()
    refusals = RefusalLog(logging.getLogger("hicachefs.test"), interval_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="hicachefs.test"):
        for _ in range(50):
            refusals.refused("ENOBUFS", 65534, logging.WARNING, "write%r: %s", (1, 0), "ENOBUFS")
            clock.now += 0.125  # exact in binary: the 51st comes 10 s after the first
        refusals.refused("ENOBUFS", 1000, logging.WARNING, "write%r: %s", (2, 0), "ENOBUFS")
        clock.now += 3.75
        refusals.refused("ENOBUFS", 65534, logging.WARNING, "write%r: %s", (1, 0), "ENOBUFS")
        refusals.refused("EFBIG", 65534, logging.WARNING, "write%r: %s", (1, 0), "EFBIG")
    assert [r.getMessage() for r in caplog.records] == [
        "write(1, 0): ENOBUFS [uid 65534]",
        "write(2, 0): ENOBUFS [uid 1000]",
        "write(1, 0): ENOBUFS [uid 65534; 49 more ENOBUFS like it not logged in the last 10 s]",
        "write(1, 0): EFBIG [uid 65534]",
    ]
    counts = refusals.statistics()
    assert counts.by_user == {"65534": {"EFBIG": 1, "ENOBUFS": 51}, "1000": {"ENOBUFS": 1}}
    assert counts.not_logged == 49


def test_a_reason_naming_a_page_with_a_newline_forges_no_line(caplog):
    """A refusal's reason, or a dropped file's error, often names the page: logged with %s, a
    name holding a newline started a line of its own (found by review)."""
    refusals = RefusalLog(logging.getLogger("hicachefs.test"), clock=Clock())
    forged = "m/f/s/p/k\n2026-01-01 00:00:00,000 WARNING hicachefs: forged\x85fusermount3: forged\u2028too"
    with caplog.at_level(logging.WARNING, logger="hicachefs.test"):
        refusals.refused("EIO", 0, logging.WARNING, "rename%r: %s (%s)", (1, 2), "EIO", forged)
        refusals.refused("publish failed", None, logging.WARNING, "could not publish at close: %s",
                         OSError(5, forged))
    assert len(caplog.records) == 2
    assert all("\\n2026-01-01" in record.getMessage() for record in caplog.records)  # escaped
    assert not [line for line in caplog.text.splitlines() if line.startswith(("2026-01-01", "fusermount3", "too"))]


def _write_too_large(path, blob: bytes) -> None:
    """Root writes a page over the maximum size straight under its key: the write fails (EFBIG)
    and the file is dropped at its close, unpublished."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError):  # a write that failed halfway is a short one first
            while True:
                os.write(fd, blob)
    finally:
        os.close(fd)


def test_files_dropped_unpublished_grow_the_log_by_a_few_lines_and_forge_none(mount_factory):
    mount = mount_factory("--memory", "16M")  # pages of 2 MiB at most
    pool = mount.page_dir()
    blob = b"x" * (3 << 20)
    _write_too_large(pool / "evil\n2026-01-01 00:00:00,000 WARNING hicachefs: forged line", blob)
    before = len(mount.log_text())
    for i in range(REFUSALS):
        _write_too_large(pool / f"big{i}", blob)
    assert len(mount.log_text()) - before < 1000, mount.log_text()[before:][:2000]
    assert not [line for line in mount.log_text().splitlines() if line.startswith("2026-01-01")]
    assert "evil\\n2026-01-01" in mount.log_text()
    assert os.listdir(pool) == []
    dropped = [line for line in mount.log_text().splitlines() if "not publishing" in line]
    assert dropped and all(f"[uid {os.getuid()}" in line for line in dropped), dropped  # who wrote them
