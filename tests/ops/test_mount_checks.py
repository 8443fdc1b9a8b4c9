"""What ``hicachefs mount`` and ``umount`` check first: a mount whose daemon was killed
(``umount`` removes it, ``mount`` cleans it and mounts), a live mount, the host's memory."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import io
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from hicachefs import mount_table
from hicachefs.cli import mount as mount_command
from hicachefs.cli.recovery_display import Display
from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import publish, read_page


STUCK_DAEMON = Path(__file__).with_name("stuck_daemon.py")


def hicachefs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hicachefs.cli", *args], capture_output=True, text=True, timeout=120)


def kill_daemon(mount: mounting.Mount) -> None:
    os.kill(mount.pid, signal.SIGKILL)
    assert mounting.wait_gone(mount.pid, 10)
    assert mounting.is_mounted(mount.path)
    with pytest.raises(OSError) as dead:
        os.listdir(mount.path)
    assert dead.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)


def test_umount_removes_a_dead_mount(mount_factory):
    mount = mount_factory("--memory", "32M")
    kill_daemon(mount)
    result = hicachefs("umount", str(mount.path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"hicachefs: removed the dead mount at {mount.path} (its daemon was gone)\n"
    assert not mounting.is_mounted(mount.path)
    again = hicachefs("umount", str(mount.path))
    assert again.returncode == 2 and again.stderr == f"hicachefs: {mount.path} is not mounted\n"


def test_mount_over_a_dead_mount_cleans_it_and_serves_the_disk_tier(mount_factory, tmp_path):
    flags = ["--memory", "32M", "--disk", str(tmp_path / "ssd"), "--disk-size", "128M", "--write-through"]
    mount = mount_factory(*flags)
    pool = mount.page_dir()
    pages = {f"k{i}": content(i, 1 << 20) for i in range(4)}
    for key, data in pages.items():
        publish(pool, key, data)
    kill_daemon(mount)

    log = tmp_path / "again.log"
    result = hicachefs("mount", str(mount.path), *flags, "--log-file", str(log))
    again = mounting.Mount(mount.path, log, flags)
    try:
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        lines = result.stdout.splitlines()
        assert lines[0] == f"hicachefs: removed the dead mount at {mount.path} (its daemon was gone)"
        assert lines[1] == "hicachefs: rebuilding the disk index by scanning the arena: it was not unmounted cleanly"
        assert lines[2].startswith("hicachefs: scanned the disk arena: 4 pages in ")
        assert lines[3].startswith(f"hicachefs: mounted {mount.path}") and len(lines) == 4
        again.pid = int(lines[3].split("pid ")[1].split(",")[0])
        for key, data in pages.items():
            assert read_page(pool / key) == data
    finally:
        mounting.stop(again)
    assert not mounting.unexpected_log_lines(again)


def test_mount_over_a_live_mount_is_refused(mounted):
    result = hicachefs("mount", str(mounted.path), "--memory", "32M")
    assert result.returncode == 2
    assert result.stderr == f"hicachefs: mountpoint {mounted.path} is already a mount point (fuse.hicachefs)\n"


def test_a_daemon_whose_mount_raced_another_refuses_instead_of_stacking(mounted, tmp_path):
    """A daemon that finds its path mounted since its command's checks (by a daemon started
    another way, or by mount(8)) refuses instead of mounting on top: the mount below would serve
    nobody while it held its memory and its clients' files."""
    config = json.loads((mounted.path / ".hicachefs" / "config").read_text())
    del config["pid"]
    config["log_file"] = str(tmp_path / "late.log")
    late = subprocess.Popen([sys.executable, "-m", "hicachefs.daemon", json.dumps(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        late.wait(30)
    except subprocess.TimeoutExpired:  # it mounted on top and serves: stop it (by its pid)
        late.terminate()
        late.wait(60)
        pytest.fail("a second daemon mounted on top of the live mount")
    assert late.returncode == 1
    assert f"mountpoint {mounted.path} is already a mount point" in (tmp_path / "late.log").read_text()
    assert json.loads((mounted.path / ".hicachefs" / "config").read_text())["pid"] == mounted.pid


def test_two_mounts_of_one_path_at_once_mount_it_once(tmp_path):
    """Run at once, whichever comes second is refused in one line (being mounted, or mounted);
    both said "mounted" before, one mount stacked on the other."""
    path = tmp_path / "mnt"
    path.mkdir()
    commands = [subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "mount", str(path), "--memory", "32M",
                                  "--log-file", str(tmp_path / f"daemon{i}.log")],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [command.communicate(timeout=120) for command in commands]
    daemons = [int(pid) for out, _ in results for pid in re.findall(r"\(pid (\d+),", out)]
    try:
        stacked = [line for line in Path("/proc/self/mounts").read_text().splitlines()
                   if line.split()[1] == str(path)]
        assert len(stacked) == 1, results
        assert sorted(command.returncode for command in commands) == [0, 2], results
        refused = [err for command, (_, err) in zip(commands, results) if command.returncode == 2][0]
        assert refused.startswith(f"hicachefs: mountpoint {path} ") and refused.count("\n") == 1, refused
    finally:
        for pid in daemons:  # every daemon that said it mounted, by its pid
            os.kill(pid, signal.SIGTERM)
            mounting.wait_gone(pid, 60)
        while mounting.is_mounted(path):
            mounting.unmount_path(path)


def test_memory_beyond_what_the_host_has_is_refused_up_front(tmp_path):
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    log = tmp_path / "daemon.log"
    result = hicachefs("mount", str(mountpoint), "--memory", "10T", "--log-file", str(log))
    assert result.returncode == 2
    assert result.stderr.startswith("hicachefs: --memory 10T is more than the ")
    assert result.stderr.endswith(" GiB of memory this host has available\n") and result.stderr.count("\n") == 1
    assert not mounting.is_mounted(mountpoint) and not log.exists()  # no daemon was started


def test_a_disk_too_small_for_the_largest_page_is_refused_naming_the_size_that_works(tmp_path, mount_factory):
    """--disk-size 16M at --memory 64M (pages of up to 8M) mounted, and pages of 8M were evicted
    from RAM while the disk stayed empty (found by review): the tier takes three regions that
    each hold the largest page."""
    mountpoint, disk = tmp_path / "mnt", tmp_path / "ssd"
    mountpoint.mkdir()
    result = hicachefs("mount", str(mountpoint), "--memory", "64M", "--disk", str(disk), "--disk-size", "16M")
    mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)
    assert result.returncode == 2 and not mounted
    assert result.stderr == ("hicachefs: --disk-size 16M is too small for --max-page-size 8M (the default at this "
                             "--memory): the disk tier needs 3 regions that each hold the largest page, so give "
                             "--disk-size 25M or more, or a smaller --max-page-size\n")
    mount = mount_factory("--memory", "64M", "--disk", str(disk), "--disk-size", "25M", path=mountpoint)
    assert mount.stats()["tiers"]["disk"]["capacity_bytes"] >= 3 * (8 << 20)


@pytest.mark.parametrize("flag", ["--memory", "--max-page-size", "--disk-size", "--shared-size"])
def test_an_enormous_size_is_one_line(tmp_path, flag):
    """A size of 400 digits became a float's infinity and a traceback (OverflowError)."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    extra = {"--disk-size": ["--disk", str(tmp_path / "d")],
             "--shared-size": ["--shared", str(tmp_path / "s")]}.get(flag, [])
    result = hicachefs("mount", str(mountpoint), *extra, flag, "9" * 400 + "G")
    mounting.stop_if_mounted(mountpoint)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "too large" in result.stderr


def test_a_log_file_inside_the_mountpoint_is_refused(tmp_path):
    """A log file in the mountpoint is hidden by the mount, and stays behind after it, so the
    next mount of the same directory fails with 'not empty'."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = hicachefs("mount", str(mountpoint), "--memory", "32M", "--log-file", str(mountpoint / "log"))
    mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)
    assert result.returncode == 2 and not mounted, result.stdout + result.stderr
    assert "--log-file" in result.stderr and result.stderr.count("\n") == 1
    assert list(mountpoint.iterdir()) == []


@pytest.mark.parametrize("kind", ["a FIFO", "a directory", "a file in another hicachefs mount"])
def test_a_log_file_the_daemon_could_not_append_to_is_refused_in_one_line(tmp_path, mounted, kind):
    """Opening a FIFO waits for a reader: mount hung for good, saying nothing; a file in another
    hicachefs mount became an empty page there and mount ended in a traceback."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    if kind == "a FIFO":
        log = tmp_path / "fifo"
        os.mkfifo(log)
    elif kind == "a directory":
        log = tmp_path / "dir"
        log.mkdir()
    else:
        log = mounted.page_dir() / "daemon-log"
    result = hicachefs("mount", str(mountpoint), "--memory", "32M", "--log-file", str(log))
    was_mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)
    assert result.returncode == 2 and not was_mounted, result.stdout + result.stderr
    assert "--log-file" in result.stderr and result.stderr.count("\n") == 1
    if kind == "a file in another hicachefs mount":
        assert not log.exists() and mounted.stats()["pages"] == 0


NOBODY = 65534


def mount_with_the_default_log(mountpoint: Path, temp_dir: Path,
                               runtime_dir: Path | None = None) -> tuple[subprocess.CompletedProcess, bool]:
    """``hicachefs mount`` without ``--log-file``, ``temp_dir`` its temp dir and ``runtime_dir``
    its ``$XDG_RUNTIME_DIR`` (none by default); whether it mounted (the mount is taken down)."""
    env = {name: value for name, value in os.environ.items() if name != "XDG_RUNTIME_DIR"}
    if runtime_dir is not None:
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    result = subprocess.run([sys.executable, "-m", "hicachefs.cli", "mount", str(mountpoint), "--memory", "32M"],
                            env={**env, "TMPDIR": str(temp_dir)}, capture_output=True, text=True, timeout=120)
    was_mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)
    return result, was_mounted


@pytest.mark.parametrize("planted", ["another user's directory", "a symlink"])
def test_a_name_planted_where_the_default_log_once_was_does_not_matter(tmp_path, planted):
    """The default log was ``hicachefs-<mountpoint>.log`` in the temp dir, a name any local user
    could take first: their directory there kept the mount out (exit status 2), and their
    symlink had the daemon append its log to the file it named."""
    temp_dir, mountpoint = tmp_path / "tmp", tmp_path / "mnt"
    temp_dir.mkdir()
    mountpoint.mkdir()
    name = "hicachefs-" + re.sub(r"[^A-Za-z0-9]+", "-", str(mountpoint)).strip("-") + ".log"
    notes = tmp_path / "notes"
    notes.write_text("my notes\n")
    if planted == "a symlink":
        (temp_dir / name).symlink_to(notes)
    else:
        (temp_dir / name).mkdir()
        os.chown(temp_dir / name, NOBODY, NOBODY)
    result, was_mounted = mount_with_the_default_log(mountpoint, temp_dir)
    assert result.returncode == 0 and was_mounted, result.stdout + result.stderr
    log = temp_dir / f"hicachefs-{os.geteuid()}" / name
    assert f"log {log})" in result.stdout and "starting" in log.read_text()
    assert notes.read_text() == "my notes\n"


def test_root_with_another_users_runtime_dir_logs_in_its_own_directory(tmp_path):
    """Root run with a plain user's XDG_RUNTIME_DIR (``sudo -E``, ``su`` without ``-``) made its
    log directory in that user's, who could swap it for one holding a symlink to any file, which
    root's daemon then appended its log to (found by review)."""
    temp_dir, mountpoint, theirs = tmp_path / "tmp", tmp_path / "mnt", tmp_path / "run-user"
    for directory in (temp_dir, mountpoint, theirs):
        directory.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    result, was_mounted = mount_with_the_default_log(mountpoint, temp_dir, runtime_dir=theirs)
    assert result.returncode == 0 and was_mounted, result.stdout + result.stderr
    assert list(theirs.iterdir()) == []
    assert f"log {temp_dir / f'hicachefs-{os.geteuid()}'}/" in result.stdout


def test_root_with_another_users_temp_dir_logs_in_a_place_of_its_own(tmp_path):
    """Root run with a plain user's TMPDIR: that user could rename root's ``hicachefs-0`` away
    from the directory they own and put one holding a symlink in its place, which root's
    daemon followed at its next reopen (found by review). The log goes in /tmp then."""
    mountpoint, theirs = tmp_path / "mnt", tmp_path / "their-tmp"
    for directory in (mountpoint, theirs):
        directory.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    result, was_mounted = mount_with_the_default_log(mountpoint, theirs)
    log = Path(result.stdout.split("log ")[-1].rstrip(")\n")) if "log " in result.stdout else None
    try:
        assert result.returncode == 0 and was_mounted, result.stdout + result.stderr
        assert list(theirs.iterdir()) == [] and log.parent == Path("/tmp", f"hicachefs-{os.geteuid()}")
    finally:
        if log is not None and log.parent.name.startswith("hicachefs-"):
            log.unlink(missing_ok=True)


@pytest.mark.parametrize("squat", ["another user's", "a symlink", "one others may write to"])
def test_a_default_log_directory_taken_by_another_user_is_passed_by(tmp_path, squat):
    """The default log's directory, ``hicachefs-<uid>`` in the temp dir, made first by another
    user (or as a symlink to a directory of theirs, or open to others) would let them plant the
    log file there; refused, it kept root's mount out (found by review). The log goes in a new
    directory of the user's own beside it, and theirs is left alone."""
    temp_dir, mountpoint, theirs = tmp_path / "tmp", tmp_path / "mnt", tmp_path / "theirs"
    for directory in (temp_dir, mountpoint, theirs):
        directory.mkdir()
    squatted = temp_dir / f"hicachefs-{os.geteuid()}"
    if squat == "a symlink":
        squatted.symlink_to(theirs)
    else:
        squatted.mkdir()
        if squat == "another user's":
            os.chown(squatted, NOBODY, NOBODY)
        else:
            squatted.chmod(0o777)
    result, was_mounted = mount_with_the_default_log(mountpoint, temp_dir)
    assert result.returncode == 0 and was_mounted, result.stdout + result.stderr
    log = Path(result.stdout.split("log ")[-1].rstrip(")\n"))
    assert log.parent.parent == temp_dir and log.parent.name.startswith(f"hicachefs-{os.geteuid()}-")
    found = log.parent.lstat()
    assert found.st_uid == os.geteuid() and found.st_mode & 0o777 == 0o700 and "starting" in log.read_text()
    assert list(theirs.iterdir()) == [] and [path.name for path in squatted.iterdir()] == []
    again, _ = mount_with_the_default_log(mountpoint, temp_dir)  # the same directory, not one more a mount
    assert f"log {log})" in again.stdout and len(list(temp_dir.iterdir())) == 2


@pytest.mark.parametrize("flag", ["--disk", "--shared"])
def test_a_tier_inside_another_hicachefs_mount_is_refused_in_one_line(tmp_path, mounted, flag):
    """A disk tier in another mount's pool was accepted: its arena became a read-only page of
    that mount, evicted with the rest, and the next start could not open it (EPERM)."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    where = mounted.page_dir() / "tier"
    sizes = ["--disk-size", "64M"] if flag == "--disk" else []
    result = hicachefs("mount", str(mountpoint), "--memory", "32M", "--max-page-size", "1M", flag, str(where), *sizes)
    was_mounted = mounting.is_mounted(mountpoint)
    mounting.stop_if_mounted(mountpoint)
    assert result.returncode == 2 and not was_mounted, result.stdout + result.stderr
    assert f"{flag} {where} is inside the hicachefs mount at {mounted.path}" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not where.exists() and mounted.stats()["pages"] == 0


def test_a_shared_tier_naming_a_file_says_so(tmp_path):
    """It said "cannot be written: File exists" (mkdir's answer), where --disk says what is wrong."""
    mountpoint, file = tmp_path / "mnt", tmp_path / "file"
    mountpoint.mkdir()
    file.write_bytes(b"not a directory")
    result = hicachefs("mount", str(mountpoint), "--memory", "32M", "--shared", str(file))
    mounting.stop_if_mounted(mountpoint)
    assert result.returncode == 2 and result.stderr == f"hicachefs: --shared {file} is not a directory\n"


def _daemon_of(pid: int, timeout: float) -> int:
    """The daemon that ``hicachefs mount`` (process ``pid``) started, waited for."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in children.read_text().split():
            try:
                if b"hicachefs.daemon" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
            except FileNotFoundError:  # a helper that ended (ldconfig, run by ctypes)
                continue
        time.sleep(0.001)
    raise AssertionError(f"process {pid} started no daemon within {timeout} s")


def _signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits to be delivered to process ``pid`` (a stopped one keeps it)."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = int(re.search(r"^ShdPnd:\s*([0-9a-f]+)", status, re.M)[1], 16)
    return bool(pending & (1 << (signum - 1)))


def test_ctrl_c_while_mount_waits_stops_its_daemon_in_one_line(tmp_path):
    """Ctrl-C while ``hicachefs mount`` waits for its daemon: one line, status 130, and the
    daemon it started stopped (it runs in a session of its own, so it went on, and mounted
    seconds later, after a KeyboardInterrupt traceback). The daemon is held stopped from its
    start until the command has signalled it, so that the command is surely still waiting
    (a fill of 4 GiB took 10 s here at times, 1 s at others)."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    # As from a terminal: a test run in the background (test.sh's lanes) ignores SIGINT, and so
    # would the command it starts.
    command = subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "mount", str(mountpoint), "--memory", "64M",
                                "--log-file", str(tmp_path / "daemon.log")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    daemon = None
    try:
        daemon = _daemon_of(command.pid, 30)
        os.kill(daemon, signal.SIGSTOP)
        # Stopped once it is scheduled: a SIGTERM before that kills it outright (a busy host).
        while Path(f"/proc/{daemon}/stat").read_text().rsplit(") ", 1)[1][0] != "T":
            time.sleep(0.001)
        assert not mounting.is_mounted(mountpoint)
        command.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while not _signal_pending(daemon, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _signal_pending(daemon, signal.SIGTERM), "the command did not stop its daemon"
        os.kill(daemon, signal.SIGCONT)
        _, err = command.communicate(timeout=60)
        assert "Traceback" not in err, err
        assert command.returncode == 130 and err.count("\n") == 1, err
        assert f"(pid {daemon})" in err, err
        assert mounting.wait_gone(daemon, 10)
        assert not mounting.is_mounted(mountpoint)
    finally:
        if daemon is not None and mounting.alive(daemon):
            os.kill(daemon, signal.SIGCONT)  # a test that failed above left it stopped
        if command.poll() is None:
            command.kill()
            command.wait()
        if daemon is not None and not mounting.wait_gone(daemon, 0):  # it goes on and mounts
            deadline = time.monotonic() + 20
            while not mounting.is_mounted(mountpoint) and time.monotonic() < deadline:
                time.sleep(0.2)
        mounting.stop_if_mounted(mountpoint)


def test_ctrl_c_ends_a_daemon_that_sigkill_cannot_end(tmp_path, monkeypatch):
    """A daemon taken down after Ctrl-C (or a bad first answer) that SIGKILL does not end, a
    thread of it waiting in the kernel on its own mount: the command waited for it without end
    (seen once in CI: a Ctrl-C'd mount still there 60 s later). Its mount's connection is
    aborted, the daemon ends, and the dead mount it left is removed. (Nothing here stats the
    mountpoint: a stat waits for good on a mount whose daemon reads no more.)"""
    monkeypatch.setattr(mount_command, "STOP_TIMEOUT_S", 1.0)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    daemon = subprocess.Popen([sys.executable, str(STUCK_DAEMON), str(mountpoint)], stdout=subprocess.PIPE,
                              text=True)
    outcome: list[str] = []
    taking_down = threading.Thread(target=lambda: outcome.append(mount_command._take_down(daemon, str(mountpoint))),
                                   daemon=True)
    try:
        assert daemon.stdout.readline() == "stuck\n"
        taking_down.start()
        taking_down.join(30)
        assert not taking_down.is_alive(), "the take-down still waits for the daemon"
        assert outcome == ["and removed the mount it left"] and daemon.returncode == -signal.SIGKILL
        assert mount_table.filesystem_type(mountpoint) is None
    finally:
        if mount_table.filesystem_type(mountpoint) is not None:
            mount_table.abort(mountpoint)  # what ends the daemon where the take-down did not
        daemon.kill()
        daemon.wait(10)
        if taking_down.ident is not None:
            taking_down.join(10)
        if mount_table.filesystem_type(mountpoint) is not None:
            mount_table.remove(mountpoint)


def test_a_refused_mount_takes_back_the_directories_it_made(tmp_path):
    """The checks make a missing --disk and --shared directory (and their parents) before they
    know whether the mount goes ahead; a refused mount left them behind."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "theirs").write_bytes(b"x")
    result = hicachefs("mount", str(mountpoint), "--memory", "32M", "--disk", str(tmp_path / "a" / "b" / "arena"),
                       "--disk-size", "100T")
    assert result.returncode == 2 and "--disk-size 100T is more than" in result.stderr, result.stderr
    result = hicachefs("mount", str(mountpoint), "--memory", "32M", "--disk", str(kept / "new" / "arena"),
                       "--disk-size", "64M", "--shared", str(tmp_path / "s" / "t"), "--metrics-listen", "not-a-port")
    assert result.returncode == 2 and "--metrics-listen" in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not mounting.is_mounted(mountpoint)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kept", "mnt"]
    assert [path.name for path in kept.iterdir()] == ["theirs"]


def test_a_shared_directory_on_a_local_filesystem_is_warned_of_and_mounts(tmp_path):
    """A --shared directory on the host's own filesystem (the distributed one not mounted yet, a
    typing slip) was taken silently, the pages it got reaching no other host."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    shared = tmp_path / "cephfs" / "hicache"  # as if /mnt/cephfs were not mounted
    result = hicachefs("mount", str(mountpoint), "--memory", "32M", "--shared", str(shared),
                       "--log-file", str(tmp_path / "daemon.log"))
    try:
        assert result.returncode == 0, result.stderr
        warnings = [line for line in result.stderr.splitlines() if "local filesystem" in line]
        assert len(warnings) == 1 and warnings[0].startswith(f"hicachefs: warning: --shared {shared} is on a local "
                                                             "filesystem"), result.stderr
        assert "no other host sees" in warnings[0]
        assert "no other host sees" in (tmp_path / "daemon.log").read_text()
        pool = mountpoint / "m" / "f" / "tp0of1" / "kv"
        pool.mkdir(parents=True)
        publish(pool, "ab" * 32, content("p", 4096))
        assert read_page(pool / ("ab" * 32)) == content("p", 4096)
    finally:
        mounting.stop_if_mounted(mountpoint)


def _mounts_at(path: Path) -> int:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        return sum(line.split()[1] == target for line in mounts)


def test_a_second_mount_while_the_first_is_starting_is_refused(tmp_path):
    """Two ``hicachefs mount`` of one mountpoint at once (a script run twice, fstab and the
    systemd unit): both passed the checks before either had mounted, both said 'mounted', and
    the second mount stacked over the first, whose pages nobody could reach any more; a
    ``hicachefs umount`` then waited 10 s and aborted. The first daemon is held stopped before
    it mounts, so that the second command surely comes while the first is starting."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    first = subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "mount", str(mountpoint), "--memory", "32M",
                              "--log-file", str(tmp_path / "first.log")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon = None
    try:
        daemon = _daemon_of(first.pid, 30)
        os.kill(daemon, signal.SIGSTOP)
        second = hicachefs("mount", str(mountpoint), "--memory", "32M", "--log-file", str(tmp_path / "second.log"))
        os.kill(daemon, signal.SIGCONT)
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr == f"hicachefs: mountpoint {mountpoint} is being mounted by another hicachefs mount\n"
        assert _mounts_at(mountpoint) == 1
    finally:
        if daemon is not None and mounting.alive(daemon):
            os.kill(daemon, signal.SIGCONT)
        if first.poll() is None:
            first.kill()
            first.wait()
        for _ in range(3):  # what mounted, stacked ones too, top first
            mounting.stop_if_mounted(mountpoint)
        if daemon is not None and mounting.alive(daemon):  # under a stacked mount, out of reach
            os.kill(daemon, signal.SIGTERM)
            mounting.wait_gone(daemon, 20)
        for _ in range(3):
            mounting.unmount_path(mountpoint)


def test_umount_by_a_plain_user_is_one_line_and_leaves_the_mount(tmp_path):
    """Only root and the daemon's user may stop the daemon. A plain user's ``hicachefs umount``
    got a PermissionError traceback from the SIGTERM it tried to send."""
    import shutil
    import tempfile

    from hicachefs_testing.attacks import NOBODY, SYSTEM_PYTHON
    import hicachefs

    reachable = Path(tempfile.mkdtemp(prefix="hicachefs-umount-"))  # tmp_path is in a 0700 directory
    try:
        os.chmod(reachable, 0o755)
        shutil.copytree(Path(hicachefs.__file__).parent, reachable / "code" / "hicachefs",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (reachable / "mnt").mkdir()
        mount = mounting.start(reachable / "mnt", tmp_path / "daemon.log", ["--memory", "32M"])
        try:
            result = subprocess.run([SYSTEM_PYTHON, "-s", "-m", "hicachefs.cli", "umount", str(mount.path)],
                                    env={"PYTHONPATH": str(reachable / "code")}, cwd=reachable / "code",
                                    user=NOBODY, group=NOBODY,
                                    capture_output=True, text=True, timeout=60)
            assert "Traceback" not in result.stderr, result.stderr
            assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
            assert f"pid {mount.pid}" in result.stderr and "not permitted" in result.stderr, result.stderr
            assert mounting.is_mounted(mount.path) and mounting.alive(mount.pid)
        finally:
            mounting.stop(mount)
    finally:
        shutil.rmtree(reachable)


@pytest.mark.skipif(os.stat("/dev/fuse").st_mode & 0o006 == 0o006, reason="any user may open /dev/fuse here")
def test_mount_by_a_user_who_cannot_open_dev_fuse_is_one_line(tmp_path):
    """Where /dev/fuse is root's only (mode 0600, as in containers), libfuse cannot mount for
    anyone else, not even through fusermount3. The command's check looked only for the file,
    so the daemon started, failed, and the user got 'the daemon exited with status 1: daemon
    failed' and a log holding a RuntimeError traceback."""
    import shutil
    import tempfile

    from hicachefs_testing.attacks import NOBODY, SYSTEM_PYTHON
    import hicachefs

    reachable = Path(tempfile.mkdtemp(prefix="hicachefs-devfuse-"))  # tmp_path is in a 0700 directory
    try:
        os.chmod(reachable, 0o755)
        shutil.copytree(Path(hicachefs.__file__).parent, reachable / "code" / "hicachefs",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("mnt", "logs"):
            (reachable / name).mkdir()
            os.chown(reachable / name, NOBODY, NOBODY)
        result = subprocess.run([SYSTEM_PYTHON, "-s", "-m", "hicachefs.cli", "mount", str(reachable / "mnt"),
                                 "--memory", "32M", "--log-file", str(reachable / "logs" / "log")],
                                env={"PYTHONPATH": str(reachable / "code")}, cwd=reachable / "code",
                                user=NOBODY, group=NOBODY, capture_output=True, text=True, timeout=60)
        mounted = mounting.is_mounted(reachable / "mnt")
        mounting.stop_if_mounted(reachable / "mnt")
        assert not mounted
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stdout + result.stderr
        assert "/dev/fuse" in result.stderr, result.stderr
    finally:
        shutil.rmtree(reachable)


@pytest.mark.parametrize("where", ["a directory of mode 0311", "under a directory of mode 0700"])
def test_a_mountpoint_the_user_cannot_list_is_one_line(tmp_path, where):
    """A mountpoint directory its user may not read (mode 0311, root's), or not even reach:
    the checks listed it, or asked whether it is a directory, and the command died with a
    PermissionError traceback."""
    import shutil
    import tempfile

    from hicachefs_testing.attacks import NOBODY, SYSTEM_PYTHON
    import hicachefs

    reachable = Path(tempfile.mkdtemp(prefix="hicachefs-unlisted-"))  # tmp_path is in a 0700 directory
    try:
        os.chmod(reachable, 0o755)
        shutil.copytree(Path(hicachefs.__file__).parent, reachable / "code" / "hicachefs",
                        ignore=shutil.ignore_patterns("__pycache__"))
        mountpoint = reachable / "mnt" if "0311" in where else reachable / "closed" / "mnt"
        mountpoint.mkdir(parents=True)
        os.chmod(mountpoint if "0311" in where else mountpoint.parent, 0o311 if "0311" in where else 0o700)
        result = subprocess.run([SYSTEM_PYTHON, "-s", "-m", "hicachefs.cli", "mount", str(mountpoint),
                                 "--memory", "32M", "--log-file", os.devnull],
                                env={"PYTHONPATH": str(reachable / "code")}, cwd=reachable / "code",
                                user=NOBODY, group=NOBODY, capture_output=True, text=True, timeout=60)
        mounted = mounting.is_mounted(mountpoint)
        mounting.stop_if_mounted(mountpoint)
        assert not mounted
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert f"mountpoint {mountpoint} cannot be read" in result.stderr, result.stderr
    finally:
        shutil.rmtree(reachable)


_SLOW_START = """
import json, os, sys, time
fd = int(sys.argv[1])
for i in range(12):  # a scan saying how it goes for 2.4 s, then a daemon that never mounts
    os.write(fd, (json.dumps({"text": f"scanning: {i}", "kind": "progress"}) + "\\n").encode())
    time.sleep(0.2)
time.sleep(60)
"""


def test_the_mount_waits_while_the_start_says_how_it_goes_and_stops_a_daemon_that_never_mounts(
        tmp_path, monkeypatch, capsys):
    """A scan of millions of small pages after a crash outlasted the wait (60 s and a second per
    GiB): the command said the mount did not come up and left its daemon running, which mounted
    seconds later, the retry refused as "already a mount point" (found by review). The wait goes
    on while the daemon says how its start goes, and a daemon that has not mounted by its end
    is stopped."""
    monkeypatch.setattr(mount_command, "MOUNT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(mount_command, "PROGRESS_GRACE_S", 1.0, raising=False)
    monkeypatch.setattr(mount_command, "STOP_TIMEOUT_S", 1.0)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    read_end, write_end = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", _SLOW_START, str(write_end)], pass_fds=(write_end,))
    os.close(write_end)
    config = types.SimpleNamespace(mountpoint=str(mountpoint), log_file=str(tmp_path / "log"), memory_bytes=0,
                                   disk_bytes=0)
    try:
        started = time.monotonic()
        status = mount_command._wait(child, config, Display(read_end, out=io.StringIO()))
        waited = time.monotonic() - started
        assert status == 1 and waited > 2.4 and child.poll() is not None
        said = capsys.readouterr().err
        assert f"did not come up within {waited:.0f} s (the daemon said nothing of its start for 1 s)" in said, said
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
