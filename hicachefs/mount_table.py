"""What the kernel's mount table says is mounted where, and removing a mount whose daemon died.

``os.path.ismount`` cannot be trusted with a FUSE mount whose daemon is gone: once the
kernel's cached attributes expire, stat on it fails with ENOTCONN and it answers False.
/proc/self/mounts still lists the mount; this module reads it.
Thread-safe; ``remove`` runs ``fusermount3`` and blocks until it returns.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess

FSTYPE = "fuse.hicachefs"
#: What stat on a FUSE mount answers once its daemon is gone.
DEAD_ERRNOS = frozenset({errno.ENOTCONN, errno.ECONNABORTED})


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: str | os.PathLike) -> str | None:
    """The type of the topmost mount at ``path`` (like ``fuse.hicachefs``), or None."""
    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) >= 3 and _unescape(fields[1]) == target:
                found = fields[2]  # later lines are mounted on top of earlier ones
    return found


def is_dead(path: str | os.PathLike) -> bool:
    """True if ``path`` is a FUSE mount whose daemon no longer answers. Opens the directory:
    the kernel asks the daemon for that every time, while stat may be answered from its cache."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY))
    except OSError as exc:
        return exc.errno in DEAD_ERRNOS
    return False


def remove(path: str | os.PathLike) -> None:
    """Unmount ``path``, lazily if a process still has files open under it. Raises OSError
    (with fusermount3's complaint) if it is still mounted afterwards."""
    path = os.path.realpath(path)
    result = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True)
    if result.returncode != 0:
        result = subprocess.run(["fusermount3", "-uz", path], capture_output=True, text=True)
    if filesystem_type(path) is not None:
        raise OSError(errno.EBUSY, result.stderr.strip() or "still mounted", path)
