"""``hicachefs umount``: SIGTERM to the daemon, which unmounts and exits; a mount whose daemon is
gone is removed, and one whose daemon does not answer, answers its config read with an error,
or does not act has its FUSE connection aborted first. A mount another user made without
allow_other, whose config the caller may not read, has its daemon found by its command line.
Blocks until the daemon is gone: once its
mount is gone the daemon writes its RAM tier down, which for a large tier takes minutes, so
``umount`` waits as long as the daemon makes progress (``_activity``), says how it goes on
stderr now and then, and gives up only after ``STALL_S`` without any.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import deadline, mount_table
from .arguments import UsageError

#: How long the daemon, its mount gone, may make no progress before ``umount`` gives up on it;
#: the environment variable ``HICACHEFS_UMOUNT_STALL_S`` sets another (tests).
STALL_S = 60.0
#: While the daemon writes its RAM tier down, a line on stderr after this long, then every
#: ``REPORT_EVERY_S``.
FIRST_REPORT_S = 1.0
REPORT_EVERY_S = 10.0
#: After SIGTERM a daemon finishes the requests in flight and unmounts at once (writing the RAM
#: tier down comes after); a mount still there after this long has a daemon that cannot act.
UNMOUNT_AFTER_SIGTERM_S = 10.0


def command(args: argparse.Namespace) -> int:
    stall_s = _stall_window()
    mountpoint = mount_table.resolve(args.mountpoint)
    fstype = mount_table.filesystem_type(mountpoint)
    if fstype is None:
        raise UsageError(f"{args.mountpoint} is not mounted")
    if fstype != mount_table.FSTYPE:
        raise UsageError(f"{args.mountpoint} is a mount of type {fstype}, not hicachefs")
    owner = mount_table.closed_to_caller(mountpoint)
    if owner is not None:
        return _stop_closed(mountpoint, owner, stall_s)
    try:
        pid, disk = _daemon_of(mountpoint)
    except deadline.NoAnswer as exc:
        return _abort_and_remove(mountpoint, exc.about(mountpoint))
    except OSError as exc:
        if exc.errno not in mount_table.DEAD_ERRNOS:  # a daemon that answers, but not as one should
            return _abort_and_remove(mountpoint, f"{mountpoint}: its daemon answered the read of its config "
                                                 f"with {errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})")
        return _remove(mountpoint, f"removed the dead mount at {mountpoint} (its daemon was gone)",
                       f"cannot remove the dead mount at {mountpoint}")
    except ValueError as exc:  # a config that names no process of the mount's user
        return _abort_and_remove(mountpoint, f"{mountpoint}: {exc}")
    return _stop(mountpoint, pid, disk, stall_s)


def _stop(mountpoint: str, pid: int, disk: bool, stall_s: float) -> int:
    """SIGTERM to the mount's daemon ``pid`` (``disk``: it has a disk tier to write down to);
    wait for the mount to go, then for the daemon to end while it makes progress."""
    try:
        os.kill(pid, signal.SIGTERM)
    except PermissionError:
        print(f"hicachefs: {mountpoint}: not permitted to stop its daemon (pid {pid}); "
              "only root and the daemon's user may", file=sys.stderr)
        return 1
    except ProcessLookupError:  # it ended since it answered; its mount goes with it, or is dead
        pass
    signalled = time.monotonic()
    while mount_table.filesystem_type(mountpoint) is not None:
        if time.monotonic() > signalled + UNMOUNT_AFTER_SIGTERM_S:
            return _abort_and_remove(mountpoint, f"{mountpoint}: daemon {pid} did not unmount it within "
                                                 f"{UNMOUNT_AFTER_SIGTERM_S:g} s of SIGTERM")
        time.sleep(0.05)
    if not _wait_for_exit(pid, stall_s, disk):
        doing = "writing its RAM tier down" if disk else "exiting"
        print(f"hicachefs: unmounted {mountpoint}, but daemon {pid} made no progress {doing} for {stall_s:g} s; "
              "gave up waiting for it (it still runs)", file=sys.stderr)
        return 1
    print(f"hicachefs: unmounted {mountpoint}")
    return 0


def _stop_closed(mountpoint: str, owner: int, stall_s: float) -> int:
    """Stop the daemon of a mount made by ``owner`` without allow_other, whose config the kernel
    does not let the caller read (root included: EACCES). Taken for a daemon answering wrongly,
    its connection was aborted and the command returned while the daemon still wrote its RAM
    tier down, and the owner's next mount was refused. The daemon is found by its command line."""
    daemons = _daemons_by_command_line(mountpoint, owner)
    if len(daemons) > 1:  # one left by an unmount that could not stop it, and the mount's own: which is not known
        pids = ", ".join(str(pid) for pid, _ in daemons)
        print(f"hicachefs: {mountpoint}: {len(daemons)} daemons of uid {owner} name this mountpoint (pids {pids}), "
              f"one left from an earlier mount there: {closed_hint(owner, 'umount')}", file=sys.stderr)
        return 1
    if not daemons:
        print(f"hicachefs: {mountpoint}: {closed_hint(owner, 'umount')}", file=sys.stderr)
        return 1
    pid, disk = daemons[0]
    return _stop(mountpoint, pid, disk, stall_s)


def closed_hint(owner: int, command: str) -> str:
    """What to do about a mount that ``mount_table.closed_to_caller`` says ``owner`` made."""
    return f"mounted by uid {owner} without allow_other: run hicachefs {command} as that user"


def _daemons_by_command_line(mountpoint: str, owner: int) -> list[tuple[int, bool]]:
    """The processes of ``owner`` whose command line is a daemon's (``python -m hicachefs.daemon
    CONFIG_JSON ...``) for ``mountpoint``, each with whether its config has a disk tier."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != owner:
                continue
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            at = argv.index(b"hicachefs.daemon")
            config = json.loads(argv[at + 1]) if argv[at - 1] == b"-m" else None
        except (OSError, ValueError, IndexError):
            continue  # gone since, or not a daemon
        if isinstance(config, dict) and config.get("mountpoint") == mountpoint:
            found.append((int(entry.name), bool(config.get("disk_dir"))))
    return found


def _daemon_of(mountpoint: str) -> tuple[int, bool]:
    """The daemon's pid, and whether it has a disk tier to write down to, from the mount's
    config; ValueError, in words, when the config names no process of the user who made the
    mount: any user may mount a FUSE filesystem typed hicachefs and write its config, and root's
    umount signalled whatever it named (-1: every process)."""
    try:
        config = json.loads(deadline.read_bytes(Path(mountpoint, ".hicachefs", "config")))
        pid, disk = config["pid"], bool(config.get("disk_dir"))
    except (ValueError, KeyError, TypeError):
        raise ValueError("its config is not a hicachefs daemon's (no pid in it)") from None
    if type(pid) is not int or pid <= 0:
        raise ValueError(f"its config names pid {pid!r}, not a process")
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return pid, disk  # gone since: nothing is signalled
    owner = mount_table.owner(mountpoint)
    if uid != owner:
        raise ValueError(f"its config names pid {pid}, a process of uid {uid}, not of the user who "
                         f"mounted it (uid {owner})")
    return pid, disk


def _stall_window() -> float:
    """``STALL_S``, or the seconds ``HICACHEFS_UMOUNT_STALL_S`` sets."""
    text = os.environ.get("HICACHEFS_UMOUNT_STALL_S")
    if text is None:
        return STALL_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise UsageError(f"HICACHEFS_UMOUNT_STALL_S={text!r} is not a positive number of seconds")
    return seconds


def _wait_for_exit(pid: int, stall_s: float, disk: bool) -> bool:
    """Wait for the daemon to end, as long as it makes progress, saying now and then on stderr
    how its write-down goes (``disk``: it has a disk tier; else it only frees its memory); False
    once it made none for ``stall_s``."""
    started = last_progress = time.monotonic()
    report_at = started + FIRST_REPORT_S
    first = last = _activity(pid)
    born = _start_time(pid)
    while _alive(pid) and _start_time(pid) == born:  # not a later process given its number
        now, activity = time.monotonic(), _activity(pid)
        if activity != last or activity[2]:
            last, last_progress = activity, now
        elif now > last_progress + stall_s:
            return False
        if now >= report_at:
            written = (activity[0] - first[0]) / (1 << 20)
            doing = (f"writing its RAM tier down to disk: {written:.0f} MiB written" if disk
                     else "freeing its memory (it has no disk tier)")
            print(f"hicachefs: daemon {pid} is {doing}, {now - started:.0f} s so far", file=sys.stderr)
            report_at = now + REPORT_EVERY_S
        time.sleep(0.05)
    return True


def _activity(pid: int) -> tuple[int, int, bool]:
    """What the process has done so far: bytes it wrote (``/proc/PID/io``'s wchar, 0 where only
    root may read it), CPU ticks it used, and whether it waits on a device now (state D: an
    fsync of the arena shows neither)."""
    try:
        written = int(re.search(r"^wchar: (\d+)$", Path(f"/proc/{pid}/io").read_text(), re.M)[1])
    except (OSError, TypeError):
        written = 0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return written, 0, False
    return written, int(fields[11]) + int(fields[12]), fields[0] == "D"


def _abort_and_remove(mountpoint: str, why: str) -> int:
    """Abort the mount's FUSE connection, which fails every request waiting on its daemon, then
    unmount it; the daemon, if it ever runs again, finds its mount gone and exits. Where the
    abort cannot be done (a plain user's, fusectl not mounted: only root may mount it), the
    mount is unmounted all the same: giving up kept a user from removing their own hung
    daemon's mount, and from mounting there again."""
    try:
        mount_table.abort(mountpoint)
    except (OSError, subprocess.TimeoutExpired) as exc:
        unaborted = f"{why}; could not abort its FUSE connection ({getattr(exc, 'strerror', None) or 'timed out'})"
        return _remove(mountpoint, f"{unaborted}, so unmounted it with fusermount3 (its daemon left as it is)",
                       f"{unaborted}, nor remove the mount")
    return _remove(mountpoint, f"{why}; aborted its FUSE connection and removed the mount",
                   f"{why}; could not remove the mount")


def _remove(mountpoint: str, removed: str, failed: str) -> int:
    """Remove the mount; one line either way."""
    try:
        mount_table.remove(mountpoint)
    except OSError as exc:
        print(f"hicachefs: {failed}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"hicachefs: {removed}")
    return 0


def _start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (``/proc/PID/stat``, field 22)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False
