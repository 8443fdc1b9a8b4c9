"""The command line: validation before anything is mounted, umount, stats, and what the light
commands load."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from hicachefs_testing import mounting
from pages import publish, wait_until


def hicachefs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hicachefs.cli", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flags, message", [
    (["--memory", "lots"], "bad size"),
    (["--memory", "1M"], "minimum"),
    (["--max-page-size", "2G"], "--max-page-size"),
    (["--memory", "64M", "--max-page-size", "16M"], "1/8 of --memory"),
    (["--disk", "/tmp"], "go together"),
    (["--write-through"], "needs a disk tier"),
    (["--bogus"], "unrecognized"),
    (["--disk", "/proc/hicachefs", "--disk-size", "1G"], "cannot be written"),
    (["--disk", "/etc/passwd", "--disk-size", "1G"], "--disk /etc/passwd is not a directory"),
    (["--temp-timeout", "0.001"], "--temp-timeout 0.001 is below the minimum of 1 second"),
    (["-o", "temp_timeout=0.5"], "--temp-timeout 0.5 is below the minimum of 1 second"),
    (["--temp-timeout", "61"], "--temp-timeout 61 is above the maximum of 60 seconds"),
    (["--temp-timeout", "nan"], "--temp-timeout nan is not a number of seconds"),
    (["--log-file", "/nonexistent/dir/log"], "--log-file /nonexistent/dir/log: cannot write there (No such file or directory)"),
    (["--log-file", "/tmp"], "--log-file /tmp: cannot write there (Is a directory)"),
])
def test_bad_flags_give_one_line_and_mount_nothing(tmp_path, flags, message):
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = hicachefs("mount", str(mountpoint), *flags)
    mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)  # a refusal that did not happen leaves no daemon behind
    assert result.returncode == 2 and not mounted
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["stats", "--json"], ["stats"], ["top", "--count", "2", "--interval", "0.1"]])
def test_output_closed_early_gives_one_line(mounted, command):
    """As ``hicachefs stats MP | head`` does once head has what it wants."""
    publish(mounted.page_dir(), "k", b"x" * 4096)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "hicachefs.cli", command[0], str(mounted.path), *command[1:]],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert result.returncode == 1
    assert result.stderr == "hicachefs: the output was closed before all of it was written (broken pipe)\n"


@pytest.mark.parametrize("typo", ["unmount", "stat", "status"])
def test_a_mistyped_command_mounts_nothing(tmp_path, typo):
    """Without -o (which mount.fuse3 always passes) a first word that is not a command is not the
    helper form's SOURCE: ``hicachefs unmount MP`` mounted a new store at MP, once unmounted."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = hicachefs(typo, str(mountpoint))
    mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)
    assert not mounted and (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"hicachefs: argument command: invalid choice: '{typo}' "
                             "(choose from 'mount', 'umount', 'stats', 'top')\n")


def test_bad_mountpoints(tmp_path, mounted):
    assert "not an existing directory" in hicachefs("mount", str(tmp_path / "nope")).stderr
    full = tmp_path / "full"
    full.mkdir()
    (full / "file").write_text("x")
    assert "not empty" in hicachefs("mount", str(full)).stderr
    busy = hicachefs("mount", str(mounted.path))
    assert busy.returncode == 2 and "already a mount point" in busy.stderr


def test_umount_and_stats_commands(mount_factory):
    mount = mount_factory("--memory", "64M")
    publish(mount.page_dir(), "k", b"x" * 4096)
    table = hicachefs("stats", str(mount.path))
    assert table.returncode == 0 and "memory" in table.stdout and "capacity" in table.stdout
    raw = json.loads(hicachefs("stats", str(mount.path), "--json").stdout)
    assert raw["pages"] == 1
    result = hicachefs("umount", str(mount.path))
    assert result.returncode == 0, result.stderr
    assert not os.path.ismount(mount.path)
    assert not mounting.alive(mount.pid)
    assert hicachefs("umount", str(mount.path)).returncode == 2


def test_stats_of_a_daemon_that_does_not_report_a_field_shows_it_unknown_not_zero(mount_factory):
    """During an upgrade the new command reads the old daemon, whose tiers have no ``free_bytes``:
    its table said 0B free on every tier of a nearly empty store."""
    from hicachefs.cli.stats import format_stats

    mount = mount_factory("--memory", "64M")
    publish(mount.page_dir(), "k", b"x" * 4096)
    facts = json.loads(hicachefs("stats", str(mount.path), "--json").stdout)
    header, memory = format_stats(facts).splitlines()[:2]
    free = header.split().index("free")
    assert memory.split()[free] not in ("0B", "-")
    for counters in facts["tiers"].values():
        del counters["free_bytes"]
    header, memory = format_stats(facts).splitlines()[:2]
    assert memory.split()[0] == "memory" and memory.split()[free] == "-"


def test_stats_and_the_log_tell_of_a_shared_tier_no_page_could_be_written_to(mount_factory, tmp_path):
    """A daemon that could write nothing to its shared directory (another uid's daemon had made
    its directories 0755) logged nothing, and its stats ended 'errors: none': only the raw JSON
    counted the failures. Here the pools' directories cannot be made: a file holds their name."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "model").write_bytes(b"")
    mount = mount_factory("--memory", "64M", "--shared", str(shared))
    publish(mount.page_dir(), "k", b"x" * 4096)
    wait_until(lambda: mount.stats()["tiers"]["shared"]["write_failures"] == 1, timeout=10)
    table = hicachefs("stats", str(mount.path)).stdout
    assert re.search(r"^shared tier: write failures 1, I/O errors \d+; last error: NotADirectoryError: "
                     r"\[Errno 20\] Not a directory: '.*/shared/model/", table, re.M), table
    assert " WARNING hicachefs.store.shared.tier: shared tier: writing page " \
           "'model/bfloat16-page_first-64/tp0of1/kv/k' failed: [Errno 20] Not a directory" in mount.log_text()


def test_stats_and_top_without_a_daemon_say_so_in_one_line(mount_factory, tmp_path):
    """A path that is not a hicachefs mount is bad input (2); a mount whose daemon is gone is the
    daemon's failure (1), as one that does not answer is. Both said 'cannot read
    PATH/.hicachefs/stats: Transport endpoint is not connected' (or 'No such file...'), exit 2."""
    plain = tmp_path / "plain"
    plain.mkdir()
    for command in (["stats", str(plain)], ["top", str(plain), "--count", "1"]):
        assert (lambda r: (r.returncode, r.stdout, r.stderr))(hicachefs(*command)) == (
            2, "", f"hicachefs: {plain} is not a hicachefs mount\n")
    proc = hicachefs("stats", "/proc")
    assert (proc.returncode, proc.stderr) == (2, "hicachefs: /proc is a mount of type proc, not hicachefs\n")
    mount = mount_factory("--memory", "64M")
    os.kill(mount.pid, signal.SIGKILL)  # the daemon this test started, by its PID
    assert mounting.wait_gone(mount.pid, 30)
    gone = f"hicachefs: {mount.path}: its daemon is gone (a dead mount; hicachefs umount removes it)\n"
    try:
        for command in (["stats", str(mount.path)], ["top", str(mount.path), "--count", "1"]):
            assert (lambda r: (r.returncode, r.stdout, r.stderr))(hicachefs(*command)) == (1, "", gone)
    finally:
        mounting.unmount_path(mount.path)  # the factory's stop may see it live still (cached attributes)


def test_help_says_what_the_exit_statuses_mean():
    shown = hicachefs("--help")
    assert shown.returncode == 0
    assert "exit status: 0" in " ".join(shown.stdout.split()), shown.stdout


#: What only the daemon needs: a look at a busy host's store must not pay for loading these.
DAEMON_ONLY = {"pyfuse3", "trio", "numpy"}


def _imported(importtime: str) -> set[str]:
    """The top-level names of the modules a ``python -X importtime`` run imported (its stderr)."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0]
            for line in importtime.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("command, shows", [(["stats"], "capacity"), (["stats", "--json"], '"pages": 1'),
                                            (["top", "--count", "1", "--interval", "0.1"], "hicachefs top"),
                                            (["umount"], "unmounted")])
def test_stats_top_and_umount_load_neither_fuse_nor_trio_nor_numpy(mount_factory, command, shows):
    mount = mount_factory("--memory", "64M")
    publish(mount.page_dir(), "k", b"x" * 4096)
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "hicachefs.cli", command[0], str(mount.path),
                             *command[1:]], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and shows in result.stdout, result.stdout + result.stderr[-2000:]
    modules = _imported(result.stderr)
    assert {"hicachefs", "json"} <= modules  # the import log was read
    assert not modules & DAEMON_ONLY, f"hicachefs {command[0]} imported {sorted(modules & DAEMON_ONLY)}"


def test_restart_with_disk_tier_keeps_pages(mount_factory, tmp_path):
    disk = tmp_path / "ssd"
    flags = ["--memory", "64M", "--disk", str(disk), "--disk-size", "256M"]
    mount = mount_factory(*flags)
    pool = mount.page_dir()
    pages = {f"k{i}": os.urandom(1 << 20) for i in range(10)}
    for key, data in pages.items():
        publish(pool, key, data)
    mounting.stop(mount)
    again = mount_factory(*flags, path=mount.path)
    pool = again.page_dir()
    assert sorted(os.listdir(pool)) == sorted(pages)
    tiers = {subprocess.run(["getfattr", "--only-values", "-n", "user.hicachefs.tier", str(pool / k)],
                            capture_output=True, text=True).stdout for k in pages}
    assert tiers == {"disk"}
    for key, data in pages.items():
        assert (pool / key).read_bytes() == data
