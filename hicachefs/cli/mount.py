"""``hicachefs mount``: check the flags, start the daemon, return once the mount answers.

In the background form the daemon is ``python -m hicachefs.daemon CONFIG_JSON PROGRESS_FD`` in
a session of its own, logging to its log file; this command waits for the mount to answer
(polling the mount table and, with a deadline, the mount's control file), showing meanwhile
what the daemon reports through the pipe PROGRESS_FD about rebuilding the disk index.
``--foreground`` runs the daemon in this process instead. A dead hicachefs mount on the
mountpoint (its daemon gone) is removed first. Runs in the caller's thread and blocks until the
mount answers: at most ``MOUNT_TIMEOUT_S`` and a second per GiB of the tiers, and on while the
daemon says how its start goes (a scan of millions of small pages takes longer); a daemon that
has not mounted by then is stopped.
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .. import deadline, mount_table
from .arguments import UsageError
from .mount_config import check_mountpoint, daemon_config, hold_mountpoint
from .recovery_display import Display

MOUNT_TIMEOUT_S = 60.0
#: How long a daemon this command takes down has to end after SIGTERM.
STOP_TIMEOUT_S = 10.0
#: How long a daemon has to end after SIGKILL before its mount's connection is aborted.
KILL_TIMEOUT_S = 5.0
#: How long the wait goes on past its timeout after the daemon last said how its start goes.
PROGRESS_GRACE_S = 30.0


def command(args: argparse.Namespace) -> int:
    mountpoint = Path(mount_table.resolve(args.mountpoint))
    dead_mount = check_mountpoint(mountpoint, args.mountpoint, dead_ok=True)
    # Held until the mount answers (or, in the foreground, the daemon ends): a second mount
    # command of this mountpoint meanwhile passed every check and stacked a mount over this one.
    hold = None if dead_mount else hold_mountpoint(mountpoint, args.mountpoint)
    try:
        config = daemon_config(args, mountpoint)
        if dead_mount:
            try:
                mount_table.remove(config.mountpoint)
            except OSError as exc:
                raise UsageError(f"cannot remove the dead mount at {args.mountpoint}: {exc.strerror}") from None
            print(f"hicachefs: removed the dead mount at {config.mountpoint} (its daemon was gone)")
            check_mountpoint(mountpoint, args.mountpoint)
            hold = hold_mountpoint(mountpoint, args.mountpoint)
        return _mount(args, config)
    finally:
        if hold is not None:
            os.close(hold)


def _mount(args: argparse.Namespace, config) -> int:
    if args.foreground:
        from ..daemon import daemon  # pyfuse3 and trio: only the foreground form runs them here

        daemon.setup_logging(config)
        return daemon.run(config)
    progress_read, progress_write = os.pipe()  # the daemon tells how rebuilding the disk index goes
    # A Ctrl-C while the daemon is being started is kept until this command can stop it: raised
    # in between, it left the new daemon running, and mounting, without a word. (Where SIGINT is
    # ignored, as for a command a script started in the background, it stays ignored.)
    interrupted = []
    deferred = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if deferred:
        signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        with open(config.log_file, "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "hicachefs.daemon", json.dumps(asdict(config)), str(progress_write)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                pass_fds=(progress_write,),
            )
        progress = Display(progress_read)
    except BaseException:
        if deferred:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        raise
    finally:
        os.close(progress_write)
    try:
        if deferred:  # from here a Ctrl-C raises where it is caught below
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if interrupted:
            raise KeyboardInterrupt
        return _wait(child, config, progress)
    except KeyboardInterrupt:  # Ctrl-C while waiting: the operator gave up on this mount
        progress.close()
        removed = _take_down(child, config.mountpoint)
        print(f"hicachefs: interrupted; stopped the daemon (pid {child.pid}), {removed}", file=sys.stderr)
        return 130


def _wait(child: subprocess.Popen, config, progress: Display) -> int:
    """Wait for the daemon's mount to answer; the command's exit status."""
    # Populating the RAM arena and scanning the disk tier take time in proportion to their size.
    timeout = MOUNT_TIMEOUT_S + (config.memory_bytes + config.disk_bytes) / (1 << 30)
    started = time.monotonic()
    until = started + timeout
    control = Path(config.mountpoint, ".hicachefs", "config")
    while time.monotonic() < max(until, progress.heard + PROGRESS_GRACE_S):  # on while a scan goes on
        progress.poll()
        if child.poll() is not None:
            progress.close()
            reason = _last_error(config.log_file)
            print(f"hicachefs: the daemon exited with status {child.returncode}{reason}; see {config.log_file}",
                  file=sys.stderr)
            return 1
        if mount_table.filesystem_type(config.mountpoint) == mount_table.FSTYPE:
            try:
                live = deadline.call(functools.partial(_served_by, control)) == child.pid
            except deadline.NoAnswer as exc:
                progress.close()
                print(f"hicachefs: {exc.about(config.mountpoint)} once mounted; see {config.log_file}",
                      file=sys.stderr)
                return 1
            except OSError as exc:  # a daemon that answers, but not as one should: take it down
                progress.close()
                removed = _take_down(child, config.mountpoint)
                print(f"hicachefs: {config.mountpoint} came up, but its daemon answered a look at {control.name} "
                      f"with {exc.strerror}; stopped it (pid {child.pid}), {removed}; see {config.log_file}",
                      file=sys.stderr)
                return 1
            if live:
                progress.close()
                print(f"hicachefs: mounted {config.mountpoint} (pid {child.pid}, log {config.log_file})")
                return 0
        time.sleep(0.05)
    progress.close()
    removed = _take_down(child, config.mountpoint)  # else it mounted later all the same, the command said it failed
    print(f"hicachefs: the mount did not come up within {time.monotonic() - started:.0f} s (the daemon said nothing "
          f"of its start for {time.monotonic() - progress.heard:.0f} s); stopped the daemon (pid {child.pid}), "
          f"{removed}; see {config.log_file}", file=sys.stderr)
    return 1


def _served_by(control: Path) -> int | None:
    """The pid of the daemon that serves the mount whose config file is ``control``; None while
    it has none (not mounted yet). Another daemon's mount there is not this command's: two
    commands run at once took the first daemon's mount each for their own, and the second said
    "mounted" naming a daemon that then failed, or mounted on top."""
    try:
        return json.loads(control.read_bytes())["pid"]
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    except (ValueError, KeyError, TypeError):
        return None


def _take_down(child: subprocess.Popen, mountpoint: str) -> str:
    """Stop the daemon this command started (SIGTERM, then SIGKILL past ``STOP_TIMEOUT_S``) and
    remove its mount if it left one; what became of the mount, in words. A daemon that SIGKILL
    does not end within ``KILL_TIMEOUT_S`` has a thread waiting in the kernel on its own mount (a
    request the dead loop read and never answered, or a notification that waits for it): only
    aborting the mount's connection ends it, and the wait for it had no end."""
    child.terminate()
    try:
        child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        if not _ended(child):
            if mount_table.filesystem_type(mountpoint) == mount_table.FSTYPE:
                try:
                    mount_table.abort(mountpoint)
                except (OSError, subprocess.TimeoutExpired):
                    pass  # said below, if it does not end
            if not _ended(child):
                return "though it has not ended: a thread of it waits in the kernel"
    if mount_table.filesystem_type(mountpoint) is None:
        return "and nothing is mounted"
    try:
        mount_table.remove(mountpoint)
    except OSError as exc:
        return f"but could not remove the mount it left: {exc.strerror}"
    return "and removed the mount it left"


def _ended(child: subprocess.Popen) -> bool:
    """Whether the process, signalled to end, did within ``KILL_TIMEOUT_S``."""
    try:
        child.wait(KILL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _last_error(log_file: str) -> str:
    """': MESSAGE' of the last ERROR line in the daemon's log (its reason for exiting), or ''.
    Where fusermount3 refused the mount, its own line (written to the log as it was, not as an
    ERROR) is the reason: the daemon's says only that it failed."""
    try:
        with open(log_file, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 65536))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if " INFO hicachefs: starting: " in line]
    lines = lines[starts[-1]:] if starts else lines  # this daemon's lines, not an earlier one's
    refusals = [line for line in lines if line.startswith("fusermount3: ")]
    if refusals:
        return f": fusermount3 refused the mount ({refusals[-1].removeprefix('fusermount3: ')})"
    errors = [line for line in lines if " ERROR " in line]
    return ": " + errors[-1].split(": ", 1)[-1] if errors else ""
