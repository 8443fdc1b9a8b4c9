"""What the kernel's mount table says is mounted where; removing a mount whose daemon died or
hangs.

``os.path.ismount`` cannot be trusted with a FUSE mount whose daemon is gone: once the
kernel's cached attributes expire, stat on it fails with ENOTCONN and it answers False.
/proc/self/mounts still lists the mount; this module reads it. Nothing here touches a mount
without a deadline: a stat of a mount whose daemon is stopped never returns
(``os.path.realpath`` of its mountpoint included).

A mount whose daemon does not answer is removed by aborting its FUSE connection (the kernel
fails every request waiting on it, and every later one, with ECONNABORTED), then unmounting it.
The connection's control files live in the fusectl filesystem at ``/sys/fs/fuse/connections``;
where it is not mounted (systemd mounts it at boot, a container may not), the abort mounts it in
a private mount namespace of its own, leaving the host's mounts as they were.

Thread-safe; ``remove`` and ``abort`` run helpers (``fusermount3``, ``unshare``) and block
until they return.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import subprocess

from . import deadline

FSTYPE = "fuse.hicachefs"
#: What stat on a FUSE mount answers once its daemon is gone.
DEAD_ERRNOS = frozenset({errno.ENOTCONN, errno.ECONNABORTED})
FUSE_CONNECTIONS = "/sys/fs/fuse/connections"
MOUNTINFO = "/proc/self/mountinfo"


class Answer(enum.Enum):
    """How a mount's daemon answers: it does, it is gone, or it does not answer in time."""

    LIVE = "live"
    DEAD = "dead"
    SILENT = "silent"


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _entries() -> list[tuple[str, str, str, str]]:
    """(mount point, type, major:minor, superblock options) of every mount, in mount order, from
    mountinfo."""
    entries = []
    with open(MOUNTINFO, errors="surrogateescape") as mountinfo:  # paths are bytes: any mount's may not be UTF-8
        for line in mountinfo:  # "42 27 0:39 / /mnt rw,nosuid - fuse.hicachefs hicachefs rw,user_id=0,..."
            fields, _, rest = line.partition(" - ")
            fields, rest = fields.split(), rest.split()
            if len(fields) >= 5 and rest:
                entries.append((_unescape(fields[4]), rest[0], fields[2], rest[2] if len(rest) > 2 else ""))
    return entries


def resolve(path: str | os.PathLike) -> str:
    """``os.path.realpath(path)``, except that a mount point is not looked at: its parent is
    resolved and a name the mount table lists as a mount point is taken as it is."""
    absolute = os.path.abspath(path)
    parent, name = os.path.split(absolute)
    if not name:
        return absolute
    candidate = os.path.join(os.path.realpath(parent), name)
    if any(target == candidate for target, *_ in _entries()):
        return candidate
    return os.path.realpath(candidate)


def _topmost(path: str | os.PathLike) -> tuple[str, str] | None:
    target = resolve(path)
    found = None
    for mountpoint, fstype, device, _ in _entries():
        if mountpoint == target:
            found = (fstype, device)  # later lines are mounted on top of earlier ones
    return found


def device(path: str | os.PathLike) -> str | None:
    """The ``major:minor`` of the topmost mount at ``path``, or None: tells one mount at a path
    from a later one at the same path."""
    found = _topmost(path)
    return None if found is None else found[1]


def device_mounted(device: str) -> bool:
    """Whether a mount of ``device`` (``major:minor``) is still in this namespace: one detached
    by a lazy unmount is gone from it at once, though its FUSE connection lives on."""
    return any(found == device for _, _, found, _ in _entries())


def filesystem_type(path: str | os.PathLike) -> str | None:
    """The type of the topmost mount at ``path`` (like ``fuse.hicachefs``), or None."""
    found = _topmost(path)
    return None if found is None else found[0]


def owner(path: str | os.PathLike) -> int | None:
    """The user who made the topmost FUSE mount at ``path`` (its ``user_id`` option), or None."""
    return _user_id(_options(path))


def closed_to_caller(path: str | os.PathLike) -> int | None:
    """The user who made the topmost FUSE mount at ``path`` where the kernel lets no one else
    in, root included: that user is not the caller and the mount has no ``allow_other`` (every
    request of another user is refused with EACCES). None where the caller may use it."""
    options = _options(path)
    user = _user_id(options)
    if user is None or user == os.getuid() or "allow_other" in options:
        return None
    return user


def _options(path: str | os.PathLike) -> list[str]:
    """The superblock options of the topmost mount at ``path`` (none where nothing is mounted)."""
    target = resolve(path)
    found: list[str] = []
    for mountpoint, _, _, options in _entries():
        if mountpoint == target:
            found = options.split(",")
    return found


def _user_id(options: list[str]) -> int | None:
    users = [option.removeprefix("user_id=") for option in options if option.startswith("user_id=")]
    return int(users[0]) if users and users[0].isdigit() else None


def answer(path: str | os.PathLike) -> Answer:
    """How the daemon of the FUSE mount at ``path`` answers an open of its root directory: the
    kernel asks the daemon for that every time, while stat may be answered from its cache."""
    try:
        deadline.call(lambda: os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY)))
    except deadline.NoAnswer:
        return Answer.SILENT
    except OSError as exc:
        return Answer.DEAD if exc.errno in DEAD_ERRNOS else Answer.LIVE
    return Answer.LIVE


def remove(path: str | os.PathLike) -> None:
    """Unmount ``path``, lazily if a process still has files open under it. Raises OSError
    (with fusermount3's complaint) if it is still mounted afterwards."""
    path = resolve(path)
    result = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True)
    if result.returncode != 0:
        result = subprocess.run(["fusermount3", "-uz", path], capture_output=True, text=True)
    if filesystem_type(path) is not None:
        raise OSError(errno.EBUSY, result.stderr.strip() or "still mounted", path)


def abort(path: str | os.PathLike) -> None:
    """Abort the FUSE connection of the mount at ``path``: every request waiting on its daemon,
    and every later one, fails with ECONNABORTED. Raises OSError if that cannot be done."""
    found = _topmost(path)
    if found is None or not found[0].startswith("fuse"):
        raise OSError(errno.EINVAL, "not a FUSE mount", str(path))
    major, minor = (int(part) for part in found[1].split(":"))
    connection = str(major << 20 | minor)  # fusectl names a connection by the kernel's dev_t
    control = os.path.join(FUSE_CONNECTIONS, connection, "abort")
    if any(fstype == "fusectl" for _, fstype, *_ in _entries()):
        with open(control, "w") as abort_file:
            abort_file.write("1")
        return
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount -t fusectl fusectl {FUSE_CONNECTIONS} && echo 1 > "{control}"'],
        capture_output=True, text=True, timeout=30,
    )
    if result.returncode != 0:
        raise OSError(errno.EIO, result.stderr.strip() or f"could not write {control}", str(path))
