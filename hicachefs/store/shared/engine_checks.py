"""What the shared tier needs from the filesystem under it, checked once at start where it can be.

Any engine must give (docs/shared-tier.md, "What it needs from its filesystem"):
- close-to-open consistency: what one host closed or fsync'd, another host that opens the file
  afterwards reads whole;
- rename atomic within a directory, replacing its target;
- attribute and entry caches, negative entries included, of at most 1 s, so that a page published
  on one host is found on the others within 2 s;
- a close that returns once the data is stored, not before (no write-back caching): otherwise
  another host can find a page whose bytes are not there, and a host that dies loses them.
The first two cannot be seen from one host. The caches and write-back can, on the engines that
say what they use: JuiceFS (the ``.config`` file at its mount root), GlusterFS (its client's
command line) and NFS (its mount options); on others nothing is checked. What can be seen too is
a directory on a local filesystem (``local_mount``): no other host sees it, which is what a
distributed filesystem not mounted yet, or a typing slip, leaves.

``settings`` reads /proc and, for JuiceFS, a file on the shared filesystem: it blocks (the tier
calls it through its guard). Pure otherwise; thread-safe.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

#: The longest a cache may keep what another host changed, for the 2 s visibility target.
MAX_CACHE_S = 1.0
MOUNTINFO = "/proc/self/mountinfo"
#: Filesystems that live on this host alone: a shared tier there reaches no other host.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "zfs", "vfat", "exfat",
                               "tmpfs", "ramfs", "overlay"})


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    fstype: str
    source: str  # what is mounted (a volume's server and name, a block device)
    options: dict[str, str]  # the filesystem's own options ("super options"); flags map to ""
    mount_id: int  # unique in the mount namespace: a mount made again gets another
    root: str = "/"  # the directory of the filesystem mounted there (a bind mount's, a JuiceFS --subdir's)


@dataclass(frozen=True)
class Settings:
    """What one engine's mount uses, as far as it could be read."""

    engine: str
    caches_s: dict[str, float]  # e.g. {"attribute cache": 1.0}
    writeback: bool = False

    def problems(self) -> list[str]:
        found = [f"{label} {seconds:g} s (at most {MAX_CACHE_S:g} s)"
                 for label, seconds in self.caches_s.items() if seconds > MAX_CACHE_S]
        if self.writeback:
            found.append("write-back caching (a close returns before the data is stored)")
        return found

    def describe(self) -> str:
        caches = ", ".join(f"{label} {seconds:g} s" for label, seconds in self.caches_s.items())
        return f"{caches}, write-back {'on' if self.writeback else 'off'}"


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)


def find_mount(path: str, mountinfo: str) -> Mount | None:
    """The mount ``path`` lies on, from the text of /proc/self/mountinfo (the deepest one)."""
    best = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        mountpoint = _unescape(fields[4])
        after = fields[fields.index("-") + 1:]
        inside = path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")
        if inside and len(after) >= 3 and (best is None or len(mountpoint) >= len(best.mountpoint)):
            options = dict(option.partition("=")[::2] for option in after[2].split(","))
            best = Mount(mountpoint, after[0], _unescape(after[1]), options, int(fields[0]), _unescape(fields[3]))
    return best


def juicefs_settings(config: dict) -> Settings:
    """From JuiceFS's ``.config``: durations in nanoseconds. An open cache reuses an open
    file's attributes unchecked, so it counts as an attribute cache too."""
    seconds = {"attribute cache": config.get("AttrTimeout", 0), "entry cache": config.get("EntryTimeout", 0),
               "directory entry cache": config.get("DirEntryTimeout", 0),
               "negative entry cache": config.get("NegEntryTimeout", 0),
               "open cache": config.get("Meta", {}).get("OpenCache", 0)}
    return Settings("JuiceFS", {label: ns / 1e9 for label, ns in seconds.items()},
                    bool(config.get("Chunk", {}).get("Writeback", False)))


def glusterfs_settings(argv: list[str]) -> Settings:
    """From the GlusterFS client's command line (its defaults where it says nothing)."""
    given = dict(arg[2:].partition("=")[::2] for arg in argv if arg.startswith("--") and "=" in arg)
    return Settings("GlusterFS", {label: float(given.get(option, default)) for label, option, default in (
        ("attribute cache", "attribute-timeout", 1), ("entry cache", "entry-timeout", 1),
        ("negative entry cache", "negative-timeout", 0))})


def nfs_settings(options: dict[str, str]) -> Settings:
    """From NFS mount options (the kernel lists only those that differ from its defaults)."""
    if "noac" in options:
        return Settings("NFS", {"attribute cache": 0.0, "entry cache": 0.0, "negative entry cache": 0.0})
    files = float(options.get("acregmax", options.get("actimeo", 60)))
    directories = float(options.get("acdirmax", options.get("actimeo", 60)))
    negative = 0.0 if options.get("lookupcache") in ("none", "pos", "positive") else directories
    return Settings("NFS", {"attribute cache": files, "entry cache": directories, "negative entry cache": negative})


def _glusterfs_client(mountpoint: str) -> list[str] | None:
    """The command line of the GlusterFS client serving ``mountpoint`` (it names the mountpoint
    last), or None when this process cannot see it (another PID namespace)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                argv = file.read().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if argv and os.path.basename(argv[0]).startswith("glusterfs") and argv[-1] == mountpoint:
            return argv
    return None


def mount_of(path: str) -> Mount | None:
    """The mount ``path`` lies on, from this process's /proc/self/mountinfo."""
    with open(MOUNTINFO, errors="surrogateescape") as file:  # paths are bytes: any mount's may not be UTF-8
        return find_mount(os.path.realpath(path), file.read())


def local_mount(path: str) -> Mount | None:
    """The mount ``path`` lies on if it is a local filesystem (``LOCAL_FILESYSTEMS``), else None."""
    mount = mount_of(path)
    return mount if mount is not None and mount.fstype in LOCAL_FILESYSTEMS else None


def local_warning(path: str, mount: Mount) -> str:
    """What to tell of a shared directory on a local filesystem, in one line."""
    return (f"{path} is on a local filesystem ({mount.fstype} at {mount.mountpoint}): no other host sees "
            "the pages there (is the distributed filesystem mounted?)")


def settings(path: str) -> Settings | None:
    """What the engine under ``path`` uses; None for a filesystem it cannot tell about, or
    settings it cannot read (JuiceFS's ``.config`` is root's alone)."""
    mount = mount_of(path)
    try:
        return _settings_of(mount) if mount is not None else None
    except (ValueError, TypeError, AttributeError):
        return None  # a format this module does not know


def _settings_of(mount: Mount) -> Settings | None:
    if mount.fstype == "fuse.juicefs":
        for name in (".config", ".jfs.config"):  # the second with --prefix-internal
            try:
                with open(os.path.join(mount.mountpoint, name)) as file:
                    return juicefs_settings(json.load(file))
            except (FileNotFoundError, PermissionError):
                continue
        return None  # --hide-internal, or not root
    if mount.fstype == "fuse.glusterfs":
        argv = _glusterfs_client(mount.mountpoint)
        return glusterfs_settings(argv) if argv is not None else None
    if mount.fstype in ("nfs", "nfs4"):
        return nfs_settings(mount.options)
    return None
