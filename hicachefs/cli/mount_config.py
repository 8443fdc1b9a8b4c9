"""The mount command's flags, checked, as the daemon's configuration.

Every check that can fail runs here, before anything is mounted: sizes against each other and
against the host's memory and disk, the disk and shared directories (writable, not inside the
mountpoint, an arena that is ours and free), the metrics address, FUSE itself
(and what fusermount3 refuses a user other than root), the log file.
Each failure is a ``UsageError`` naming the first problem, and takes back the directories the
checks made (a missing ``--disk`` or ``--shared`` and its parents): refused flags leave nothing
behind. Blocks for at most ``SHARED_PROBE_TIMEOUT_S`` on a shared filesystem that does not answer.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path

from ..daemon.config import DaemonConfig
from ..daemon.listen_address import check_can_listen, parse_listen_address
from ..store import ArenaRefused
from ..store.shared import engine_checks
from .. import mount_table
from .arguments import UsageError, parse_size
from ..mount_table import Answer

MIN_MEMORY = 16 << 20
DEFAULT_MAX_PAGE = 64 << 20
#: The reaper looks for abandoned temporary files every quarter of --temp-timeout (at most every
#: 5 s). Below a second it would wake more than 4 times a second (an idle daemon measured on the
#: 2-core VM: 0.001 s, every 0.25 ms, took 4.9-8 % of a core; 1 s took 0.1 %; 60 s 0.0 %), and a
#: file that a client on a loaded host closes and renames a moment later could be discarded in
#: between.
MIN_TEMP_TIMEOUT_S = 1.0
#: docs/contract.md: a temporary file nobody renamed is discarded at the latest 60 s after its last close.
MAX_TEMP_TIMEOUT_S = 60.0
#: How long mount waits for the shared filesystem to answer a test write.
SHARED_PROBE_TIMEOUT_S = 5.0
#: fusermount3's configuration: whether a user other than root may mount with allow_other.
FUSE_CONF = "/etc/fuse.conf"


def daemon_config(args: argparse.Namespace, mountpoint: Path) -> DaemonConfig:
    """Validate the mount command's flags for the (checked) ``mountpoint``; raises UsageError
    naming the first problem."""
    memory = parse_size(args.memory)
    if memory < MIN_MEMORY:
        raise UsageError(f"--memory {args.memory} is below the minimum of 16M")
    _check_memory_available(memory, args.memory)
    # The RAM arena is cut into slabs of at most 1/8 of it, and a page must fit in one slab.
    max_page = parse_size(args.max_page_size) if args.max_page_size else min(DEFAULT_MAX_PAGE, memory // 8)
    if not 0 < max_page <= memory // 8:
        raise UsageError(f"--max-page-size {args.max_page_size} must be above 0 and at most 1/8 of --memory")
    made = _MadeDirectories()
    try:
        disk_dir, disk_bytes = _disk_tier(args, max_page, mountpoint, made)
        shared_dir, shared_bytes, shared_warning = _shared_tier(args, max_page, mountpoint, made)
        if args.write_through and disk_dir is None:
            raise UsageError("--write-through needs a disk tier (--disk and --disk-size)")
        _check_temp_timeout(args.temp_timeout)
        metrics_listen = None if args.metrics_listen is None else _metrics_listen(args.metrics_listen)
        _check_fuse()
        _check_plain_user_mount(mountpoint, args.fuse_options)
        log_file = None if args.foreground else (args.log_file or _default_log_file(mountpoint))
        if log_file is not None:
            if mountpoint in Path(log_file).resolve().parents:
                raise UsageError(f"--log-file {args.log_file} is inside the mountpoint: the mount would hide it")
            _check_log_file(log_file, args.log_file)
    except UsageError:
        made.take_back()
        raise
    if shared_warning is not None:  # (said once the mount is known to go ahead)
        print(f"hicachefs: warning: {shared_warning}", file=sys.stderr)
    return DaemonConfig(
        mountpoint=str(mountpoint),
        memory_bytes=memory,
        disk_dir=disk_dir,
        disk_bytes=disk_bytes,
        write_through=args.write_through,
        shared_dir=shared_dir,
        shared_bytes=shared_bytes,
        max_page_size=max_page,
        log_level=args.log_level,
        log_file=log_file,
        temp_timeout_s=args.temp_timeout,
        kernel_cache=args.kernel_cache,
        metrics_listen=metrics_listen,
        fuse_options=tuple(args.fuse_options),
    )


def check_mountpoint(mountpoint: Path, given: str, dead_ok: bool = False) -> bool:
    """An empty directory with nothing mounted on it; with ``dead_ok``, a hicachefs mount whose
    daemon is gone passes too (True: the caller removes it, then checks again)."""
    fstype = mount_table.filesystem_type(mountpoint)
    if fstype is not None:
        answer = mount_table.answer(mountpoint)
        if dead_ok and fstype == mount_table.FSTYPE and answer is Answer.DEAD:
            return True
        how = {Answer.DEAD: " whose daemon is gone", Answer.SILENT: " whose daemon does not answer"}.get(answer, "")
        raise UsageError(f"mountpoint {given} is already a mount point ({fstype}{how})")
    try:
        if not mountpoint.is_dir():
            raise UsageError(f"mountpoint {given} is not an existing directory")
        empty = not any(mountpoint.iterdir())
    except OSError as exc:
        raise UsageError(f"mountpoint {given} cannot be read: {exc.strerror}") from None
    if not empty:
        raise UsageError(f"mountpoint {given} is not empty")
    return False


def hold_mountpoint(mountpoint: Path, given: str) -> int:
    """Lock the (checked, unmounted) mountpoint directory against another ``hicachefs mount``
    of it until the caller closes the returned descriptor: two commands at once both passed
    ``check_mountpoint`` before either had mounted, and the second mount stacked over the
    first. The lock is on the directory under the mount, which a later command only reaches
    while nothing is mounted; one that finished mounting meanwhile is refused by the check."""
    try:
        fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"mountpoint {given} cannot be opened: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError(f"mountpoint {given} is being mounted by another hicachefs mount") from None
    try:
        check_mountpoint(mountpoint, given)
    except UsageError:
        os.close(fd)
        raise
    return fd


def _check_memory_available(memory: int, given: str) -> None:
    """The RAM tier is mapped and populated at start; more than the host can give would kill
    the daemon after this command returned."""
    available = _meminfo_bytes("MemAvailable")
    if available is not None and memory > available:
        raise UsageError(f"--memory {given} is more than the {available / (1 << 30):.1f} GiB "
                         f"of memory this host has available")


def _meminfo_bytes(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                name, _, value = line.partition(":")
                if name == field:
                    return int(value.split()[0]) << 10  # kB
    except OSError:
        pass
    return None


def _metrics_listen(address: str) -> str:
    """The address in full (``127.0.0.1:9100`` for ``9100``), once it is known to be free."""
    try:
        host, port = parse_listen_address(address)
        check_can_listen(host, port)
    except ValueError as exc:
        raise UsageError(f"--metrics-listen {exc}") from None
    except OSError as exc:
        raise UsageError(f"--metrics-listen {address}: cannot listen there ({exc.strerror})") from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _MadeDirectories:
    """The directories the checks made, deepest first, to be taken back if the mount is refused."""

    def __init__(self) -> None:
        self._made: list[Path] = []

    @staticmethod
    def missing(directory: Path) -> list[Path]:
        """What ``mkdir -p directory`` would make, deepest first."""
        return [path for path in (directory, *directory.parents) if not path.exists()]

    def add(self, made: list[Path]) -> None:
        self._made = made + self._made

    def take_back(self) -> None:
        for path in self._made:
            try:
                path.rmdir()  # only if still empty: nothing of anyone else's goes
            except OSError:
                pass


def _disk_tier(args: argparse.Namespace, max_page: int, mountpoint: Path,
               made: _MadeDirectories) -> tuple[str | None, int]:
    """The disk directory, made if missing, checked writable and free for this daemon: its
    arena, if any, is ours and held by no other daemon (the daemon checks again as it opens it)."""
    if (args.disk is None) != (args.disk_size is None):
        raise UsageError("--disk and --disk-size go together")
    if args.disk is None:
        return None, 0
    size = parse_size(args.disk_size)
    from ..store import smallest_disk  # numpy with it, as check_disk_dir below

    if size < smallest_disk(max_page):
        page = args.max_page_size or f"{max_page / (1 << 20):g}M (the default at this --memory)"
        raise UsageError(f"--disk-size {args.disk_size} is too small for --max-page-size {page}: the disk tier "
                         "needs 3 regions that each hold the largest page, so give --disk-size "
                         f"{-(-smallest_disk(max_page) // (1 << 20))}M or more, or a smaller --max-page-size")
    disk = Path(args.disk).resolve()
    if disk == mountpoint or mountpoint in disk.parents:
        raise UsageError(f"--disk {args.disk} is the mountpoint or inside it: the mount would hide the disk tier")
    _refuse_inside_a_mount(f"--disk {args.disk}", disk)
    try:
        if disk.exists() and not disk.is_dir():
            raise UsageError(f"--disk {args.disk} is not a directory")
        missing = made.missing(disk)
        disk.mkdir(parents=True, exist_ok=True)
        made.add(missing)
        with tempfile.NamedTemporaryFile(dir=disk, prefix=".hicachefs-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"disk directory {args.disk} cannot be written: {exc.strerror}") from None
    from ..store import check_disk_dir  # the disk tier's code, numpy with it: only a --disk mount needs it

    try:
        check_disk_dir(disk)
    except ArenaRefused as exc:
        raise UsageError(f"--disk {args.disk}: {exc}") from None
    except OSError as exc:  # one root may not open either (immutable), or another user's
        raise UsageError(f"--disk {args.disk}: {exc.filename} cannot be opened: {exc.strerror}") from None
    existing = sum(f.stat().st_size for f in disk.glob("*.arena"))
    free = shutil.disk_usage(disk).free
    if size > free + existing:
        raise UsageError(f"--disk-size {args.disk_size} is more than the {free / (1 << 30):.1f} GiB free "
                         f"in {args.disk}")
    return str(disk), size


def _shared_tier(args: argparse.Namespace, max_page: int, mountpoint: Path,
                 made: _MadeDirectories) -> tuple[str | None, int | None, str | None]:
    """The shared directory, made if missing and checked writable, its size, and what to warn of.
    A filesystem that does not answer in time is not an error: the tier starts unavailable and
    the daemon retries it. One on a local filesystem is not either (a single host may try the
    tier so), but is warned of: it is what a distributed filesystem not mounted yet leaves."""
    if args.shared is None:
        if args.shared_size is not None:
            raise UsageError("--shared-size needs --shared")
        return None, None, None
    size = None if args.shared_size is None else parse_size(args.shared_size)
    if size is not None and size < max_page:
        raise UsageError(f"--shared-size {args.shared_size} is smaller than --max-page-size")
    shared = Path(args.shared).resolve()
    if shared == mountpoint or mountpoint in shared.parents:
        raise UsageError(f"--shared {args.shared} is inside the mountpoint")
    _refuse_inside_a_mount(f"--shared {args.shared}", shared)
    probe = _ProbeWrite(shared)
    probe.start()
    probe.join(SHARED_PROBE_TIMEOUT_S)
    if probe.is_alive():
        print(f"hicachefs: the shared filesystem at {args.shared} does not answer; the shared tier "
              "starts unavailable and is retried", file=sys.stderr)
        return str(shared), size, None
    made.add(probe.made)
    if probe.error is not None:
        if probe.error.errno in (errno.EEXIST, errno.ENOTDIR):  # (mkdir's answer where a file stands)
            raise UsageError(f"--shared {args.shared} is not a directory")
        raise UsageError(f"shared directory {args.shared} cannot be written: {probe.error.strerror}")
    local = engine_checks.local_mount(str(shared))
    return str(shared), size, None if local is None else f"--shared {engine_checks.local_warning(args.shared, local)}"


class _ProbeWrite(threading.Thread):
    """Make the directory and a file in it, in a thread: a hung filesystem must not hang us."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.error: OSError | None = None
        self.made: list[Path] = []  # the directories it made, deepest first

    def run(self) -> None:
        try:
            missing = _MadeDirectories.missing(self.directory)
            self.directory.mkdir(parents=True, exist_ok=True)
            self.made = missing
            with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".hicachefs-probe-"):
                pass
        except OSError as exc:
            self.error = exc


def _check_temp_timeout(seconds: float) -> None:
    if math.isnan(seconds):
        raise UsageError(f"--temp-timeout {seconds:g} is not a number of seconds")
    if seconds < MIN_TEMP_TIMEOUT_S:
        raise UsageError(f"--temp-timeout {seconds:g} is below the minimum of {MIN_TEMP_TIMEOUT_S:g} second")
    if seconds > MAX_TEMP_TIMEOUT_S:
        raise UsageError(f"--temp-timeout {seconds:g} is above the maximum of {MAX_TEMP_TIMEOUT_S:g} seconds")


def _refuse_inside_a_mount(what: str, path: Path) -> None:
    """A disk tier, shared tier or log file inside another hicachefs mount (as the mount table
    says: nothing there is touched): its files would become pages of that mount, evicted or
    read-only, and the next start could not open them."""
    holder = engine_checks.mount_of(str(path))
    if holder is not None and holder.fstype == mount_table.FSTYPE:
        raise UsageError(f"{what} is inside the hicachefs mount at {holder.mountpoint}: its files are pages there")


def _check_log_file(path: str, given: str | None) -> None:
    """The background daemon logs to ``path``: one it cannot append to fails here, in one line;
    so do a FIFO or socket (opening one waits for a reader, for good) and a place in another
    hicachefs mount (the file would become a page there, and could not be appended to)."""
    where = f"--log-file {given}" if given else f"the log file {path}"
    _refuse_inside_a_mount(where, Path(path).resolve())
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    except OSError as exc:
        raise UsageError(f"{where}: cannot write there ({exc.strerror})") from None
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise UsageError(f"{where} is a FIFO or socket, not a file")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644))
    except OSError as exc:
        raise UsageError(f"{where}: cannot write there ({exc.strerror})") from None


def _check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise UsageError("/dev/fuse is missing: load the fuse module (modprobe fuse)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        # libfuse opens it itself before it would try fusermount3: no mount for this user.
        raise UsageError("/dev/fuse cannot be opened by this user (only root may mount here): "
                         "run as root, or let users open /dev/fuse")
    if shutil.which("fusermount3") is None:
        raise UsageError("fusermount3 is missing: install the fuse3 package")


def _check_plain_user_mount(mountpoint: Path, fuse_options) -> None:
    """What fusermount3 refuses a user other than root, said here in one line: refused there,
    the daemon failed and the user read 'daemon failed', fusermount3's reason a stray line of
    its log."""
    if os.getuid() == 0:
        return
    if "allow_other" in fuse_options and not _user_allow_other():
        raise UsageError(f"-o allow_other: only root may give it unless {FUSE_CONF} has a line "
                         "user_allow_other: ask root to add it, or mount without allow_other")
    if mount_table.filesystem_type(mountpoint) is None and not os.access(mountpoint, os.W_OK):  # (a dead
        # mount's own directory answers ENOTCONN: it is removed first, and fusermount3 says the rest)
        raise UsageError(f"mountpoint {mountpoint} is not writable by this user, and fusermount3 mounts "
                         "only on a directory its user may write: mount on a directory of your own")


def _user_allow_other() -> bool:
    """Whether fuse.conf lets users other than root mount with allow_other."""
    try:
        with open(FUSE_CONF) as conf:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in conf)
    except OSError:
        return False


def _default_log_file(mountpoint: Path) -> str:
    """The log of a mount without ``--log-file``, in ``_default_log_directory``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(mountpoint)).strip("-") or "root"
    return str(_default_log_directory() / f"hicachefs-{slug}.log")


def _safe_place(path: str, uid: int) -> Path | None:
    """``path`` resolved, where it and every directory above it belong to ``uid`` or root and no
    one else may change them (written by others only with the sticky bit); else None. Root run
    with a plain user's XDG_RUNTIME_DIR or TMPDIR (``sudo -E``, ``su`` without ``-``) made its
    log directory where that user could swap it, or a symlink above it, for one holding a
    symlink to any file, which root's daemon then appended its log to (found by reviews)."""
    if not os.path.isabs(path):
        return None
    resolved = Path(os.path.realpath(path))
    for directory in (resolved, *resolved.parents):
        try:
            found = os.stat(directory)
        except OSError:
            return None
        if (not stat.S_ISDIR(found.st_mode) or found.st_uid not in (0, uid)
                or (found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX)):
            return None
    return resolved if os.access(resolved, os.W_OK | os.X_OK) else None  # (root's, kept by su: not this user's)


def _default_log_directory() -> Path:
    """``hicachefs`` in ``$XDG_RUNTIME_DIR``, else ``hicachefs-<uid>`` in the temp dir, else in
    /tmp, in the first of those places that is this user's or root's alone (``_safe_place``): a
    directory of this user's own, made 0700, or, where another user took that name first, a
    new one beside it (``hicachefs-<uid>-XXXXXXXX``; their directory kept root's mount out). The
    log was a name in the temp dir itself, which any local user could take first: their file
    kept the mount out, and their symlink had the daemon (root's too) append its log to the
    file it named."""
    uid = os.geteuid()
    places = [(os.environ.get("XDG_RUNTIME_DIR", ""), "hicachefs"), (tempfile.gettempdir(), f"hicachefs-{uid}"),
              ("/tmp", f"hicachefs-{uid}")]
    for place, name in ((_safe_place(path, uid), name) for path, name in places):
        if place is None:
            continue
        directory = place / name
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        found = os.lstat(directory)
        if stat.S_ISDIR(found.st_mode) and found.st_uid == uid and not found.st_mode & 0o077:
            return directory
        for earlier in sorted(place.glob(f"{name}-*")):  # one made so before: used again, not piled up
            try:
                found = os.lstat(earlier)
            except OSError:  # (gone since: another user's, coming and going)
                continue
            if stat.S_ISDIR(found.st_mode) and found.st_uid == uid and not found.st_mode & 0o077:
                return earlier
        try:  # the name taken by another user, or not private: a directory of this user's beside it
            return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=place))
        except OSError:
            continue
    raise UsageError("no place for the log of this user's own (XDG_RUNTIME_DIR, the temp dir, /tmp): "
                     "give --log-file")
