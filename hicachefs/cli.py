"""``hicachefs mount | umount | stats | top``: validate everything, then act.

Every check that can fail runs before anything is mounted, and each failure is one line on
stderr with exit code 2 (bad input) or 1 (the operation failed). ``hicachefs SOURCE
MOUNTPOINT -o OPTIONS``, the form mount(8) and fstab use through ``mount.fuse3``, is the
mount command (``mount_options``). While it waits for the mount, ``mount`` shows how the daemon
rebuilds the disk index (``recovery_progress``).

Every command that reads a mount does so with a deadline (``deadline``): a daemon that does not
answer (stopped, hung) gets one line saying so, and ``umount`` then aborts its FUSE connection
and removes the mount. Output cut off by its reader (``hicachefs stats MP | head``) ends the
command with one line too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from . import deadline, mount_options, mount_table
from .daemon import DaemonConfig
from .metrics_endpoint import check_can_listen, parse_listen_address
from .mount_table import Answer
from .recovery_progress import Display
from .store.device import ArenaRefused
from .store.ssd_tier import check_disk_dir

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MIN_MEMORY = 16 << 20
DEFAULT_MAX_PAGE = 64 << 20
MOUNT_TIMEOUT_S = 60.0
UMOUNT_TIMEOUT_S = 60.0
#: After SIGTERM a daemon finishes the requests in flight and unmounts at once (writing the RAM
#: tier down comes after); a mount still there after this long has a daemon that cannot act.
UNMOUNT_AFTER_SIGTERM_S = 10.0
#: The reaper looks for abandoned temporary files every quarter of --temp-timeout (at most every
#: 5 s). Below a second it would wake more than 4 times a second (an idle daemon measured on the
#: 2-core VM: 0.001 s, every 0.25 ms, took 4.9-8 % of a core; 1 s took 0.1 %; 60 s 0.0 %), and a
#: file that a client on a loaded host closes and renames a moment later could be discarded in
#: between.
MIN_TEMP_TIMEOUT_S = 1.0
#: DESIGN.md: a temporary file nobody renamed is discarded at the latest 60 s after its last close.
MAX_TEMP_TIMEOUT_S = 60.0
#: How long mount waits for the shared filesystem to answer a test write.
SHARED_PROBE_TIMEOUT_S = 5.0


class UsageError(Exception):
    """A bad flag, size or path: reported in one line, exit status 2, nothing mounted."""


def parse_size(text: str) -> int:
    """'64G' -> bytes; K, M, G, T are powers of 1024, an optional trailing B or iB is allowed."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"bad size {text!r}: use a number with K, M, G or T, like 64G")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hicachefs", description="An L3 KV-cache store for SGLang, as a filesystem.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    mount = commands.add_parser("mount", help="mount a store (returns once the mount is live)")
    mount.add_argument("mountpoint")
    # For --help only: parse_args has already turned every -o into the flags below.
    mount.add_argument("-o", metavar="OPTIONS", dest="options_", action="append",
                       help="the flags below as name=value options, comma-separated, like mount(8) "
                            "takes them: memory=8G,disk=/nvme/hc,disk_size=200G,write_through")
    mount.add_argument("--memory", default="1G", help="RAM tier size (default 1G)")
    mount.add_argument("--disk", help="directory for the SSD tier's arena file")
    mount.add_argument("--disk-size", help="SSD tier size, required with --disk")
    mount.add_argument("--write-through", action="store_true", help="also write every page to disk at publish")
    mount.add_argument("--shared", metavar="DIR",
                       help="a directory on a distributed filesystem that other hosts' daemons use too")
    mount.add_argument("--shared-size", metavar="SIZE",
                       help="the shared tier's size bound (default: the filesystem's free space)")
    mount.add_argument("--no-kernel-cache", dest="kernel_cache", action="store_false",
                       help="serve every read from the daemon; the kernel keeps no copy of pages")
    mount.add_argument("--max-page-size", help="largest page accepted (default 64M, or 1/8 of --memory if smaller)")
    mount.add_argument("--foreground", action="store_true", help="stay attached; log to stderr")
    mount.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                       type=str.upper)
    mount.add_argument("--log-file", help="where a background daemon logs (default: in the temp dir)")
    mount.add_argument("--temp-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="discard an unpublished temporary file this long after its last close (default 60)")
    mount.add_argument("--metrics-listen", metavar="HOST:PORT",
                       help="serve Prometheus metrics at http://HOST:PORT/metrics (PORT alone: 127.0.0.1)")
    mount.set_defaults(fuse_options=())
    umount = commands.add_parser("umount", help="unmount cleanly (RAM tier written down to disk)")
    umount.add_argument("mountpoint")
    stats = commands.add_parser("stats", help="print the store's statistics")
    stats.add_argument("mountpoint")
    stats.add_argument("--json", action="store_true", help="print the raw JSON")
    top = commands.add_parser("top", help="a live view of rates, tiers and requests (Ctrl-C quits)")
    top.add_argument("mountpoint")
    top.add_argument("--count", type=int, metavar="N", help="print N views as plain text, then exit")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="seconds between views (default 1)")
    return parser


def _mount_flags(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """The mount command's flags as -o option names (``disk_size``), each with whether it
    takes a value. argparse has no public listing of a parser's options: ``_actions`` it is."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        option[2:].replace("-", "_"): action.nargs != 0
        for action in commands.choices["mount"]._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


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
    disk_dir, disk_bytes = _disk_tier(args, max_page, mountpoint)
    shared_dir, shared_bytes = _shared_tier(args, max_page, mountpoint)
    if args.write_through and disk_dir is None:
        raise UsageError("--write-through needs a disk tier (--disk and --disk-size)")
    _check_temp_timeout(args.temp_timeout)
    metrics_listen = None if args.metrics_listen is None else _metrics_listen(args.metrics_listen)
    _check_fuse()
    log_file = None if args.foreground else (args.log_file or _default_log_file(mountpoint))
    if log_file is not None:
        _check_log_file(log_file, args.log_file)
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
    if not mountpoint.is_dir():
        raise UsageError(f"mountpoint {given} is not an existing directory")
    if any(mountpoint.iterdir()):
        raise UsageError(f"mountpoint {given} is not empty")
    return False


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


def _disk_tier(args: argparse.Namespace, max_page: int, mountpoint: Path) -> tuple[str | None, int]:
    """The disk directory, made if missing, checked writable and free for this daemon: its
    arena, if any, is ours and held by no other daemon (the daemon checks again as it opens it)."""
    if (args.disk is None) != (args.disk_size is None):
        raise UsageError("--disk and --disk-size go together")
    if args.disk is None:
        return None, 0
    size = parse_size(args.disk_size)
    if size < max_page:
        raise UsageError(f"--disk-size {args.disk_size} is smaller than --max-page-size")
    disk = Path(args.disk).resolve()
    if disk == mountpoint or mountpoint in disk.parents:
        raise UsageError(f"--disk {args.disk} is the mountpoint or inside it: the mount would hide the disk tier")
    try:
        disk.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=disk, prefix=".hicachefs-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"disk directory {args.disk} cannot be written: {exc.strerror}") from None
    try:
        check_disk_dir(disk)
    except ArenaRefused as exc:
        raise UsageError(f"--disk {args.disk}: {exc}") from None
    existing = sum(f.stat().st_size for f in disk.glob("*.arena"))
    free = shutil.disk_usage(disk).free
    if size > free + existing:
        raise UsageError(f"--disk-size {args.disk_size} is more than the {free >> 30} GiB free in {args.disk}")
    return str(disk), size


def _shared_tier(args: argparse.Namespace, max_page: int, mountpoint: Path) -> tuple[str | None, int | None]:
    """The shared directory, made if missing and checked writable. A filesystem that does not
    answer in time is not an error: the tier starts unavailable and the daemon retries it."""
    if args.shared is None:
        if args.shared_size is not None:
            raise UsageError("--shared-size needs --shared")
        return None, None
    size = None if args.shared_size is None else parse_size(args.shared_size)
    if size is not None and size < max_page:
        raise UsageError(f"--shared-size {args.shared_size} is smaller than --max-page-size")
    shared = Path(args.shared).resolve()
    if shared == mountpoint or mountpoint in shared.parents:
        raise UsageError(f"--shared {args.shared} is inside the mountpoint")
    probe = _ProbeWrite(shared)
    probe.start()
    probe.join(SHARED_PROBE_TIMEOUT_S)
    if probe.is_alive():
        print(f"hicachefs: the shared filesystem at {args.shared} does not answer; the shared tier "
              "starts unavailable and is retried", file=sys.stderr)
    elif probe.error is not None:
        raise UsageError(f"shared directory {args.shared} cannot be written: {probe.error.strerror}")
    return str(shared), size


class _ProbeWrite(threading.Thread):
    """Make the directory and a file in it, in a thread: a hung filesystem must not hang us."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
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


def _check_log_file(path: str, given: str | None) -> None:
    """The background daemon logs to ``path``: one it cannot append to fails here, in one line."""
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        where = f"--log-file {given}" if given else f"the log file {path}"
        raise UsageError(f"{where}: cannot write there ({exc.strerror})") from None


def _check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise UsageError("/dev/fuse is missing: load the fuse module (modprobe fuse)")
    if shutil.which("fusermount3") is None:
        raise UsageError("fusermount3 is missing: install the fuse3 package")


def _default_log_file(mountpoint: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(mountpoint)).strip("-") or "root"
    return str(Path(tempfile.gettempdir()) / f"hicachefs-{slug}.log")


def mount(args: argparse.Namespace) -> int:
    mountpoint = Path(mount_table.resolve(args.mountpoint))
    dead_mount = check_mountpoint(mountpoint, args.mountpoint, dead_ok=True)
    config = daemon_config(args, mountpoint)
    if dead_mount:
        try:
            mount_table.remove(config.mountpoint)
        except OSError as exc:
            raise UsageError(f"cannot remove the dead mount at {args.mountpoint}: {exc.strerror}") from None
        print(f"hicachefs: removed the dead mount at {config.mountpoint} (its daemon was gone)")
        check_mountpoint(mountpoint, args.mountpoint)
    if args.foreground:
        from . import daemon

        daemon.setup_logging(config)
        return daemon.run(config)
    progress_read, progress_write = os.pipe()  # the daemon tells how rebuilding the disk index goes
    try:
        with open(config.log_file, "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "hicachefs.daemon", json.dumps(asdict(config)), str(progress_write)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                pass_fds=(progress_write,),
            )
    finally:
        os.close(progress_write)
    progress = Display(progress_read)
    # Populating the RAM arena and scanning the disk tier take time in proportion to their size.
    timeout = MOUNT_TIMEOUT_S + (config.memory_bytes + config.disk_bytes) / (1 << 30)
    until = time.monotonic() + timeout
    control = Path(config.mountpoint, ".hicachefs", "config")
    while time.monotonic() < until:
        progress.poll()
        if child.poll() is not None:
            progress.close()
            reason = _last_error(config.log_file)
            print(f"hicachefs: the daemon exited with status {child.returncode}{reason}; see {config.log_file}",
                  file=sys.stderr)
            return 1
        if mount_table.filesystem_type(config.mountpoint) == mount_table.FSTYPE:
            try:
                live = deadline.call(control.exists)
            except deadline.NoAnswer as exc:
                progress.close()
                print(f"hicachefs: {_no_answer(config.mountpoint, exc)} once mounted; see {config.log_file}",
                      file=sys.stderr)
                return 1
            if live:
                progress.close()
                print(f"hicachefs: mounted {config.mountpoint} (pid {child.pid}, log {config.log_file})")
                return 0
        time.sleep(0.05)
    progress.close()
    print(f"hicachefs: the mount did not come up within {timeout:.0f} s; see {config.log_file}",
          file=sys.stderr)
    return 1


def _last_error(log_file: str) -> str:
    """': MESSAGE' of the last ERROR line in the daemon's log (its reason for exiting), or ''."""
    try:
        with open(log_file, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 65536))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in lines if " ERROR " in line]
    return ": " + errors[-1].split(": ", 1)[-1] if errors else ""


def umount(args: argparse.Namespace) -> int:
    """SIGTERM to the daemon, which unmounts and exits; a mount whose daemon is gone is removed,
    and one whose daemon does not answer or act has its FUSE connection aborted first."""
    mountpoint = mount_table.resolve(args.mountpoint)
    fstype = mount_table.filesystem_type(mountpoint)
    if fstype is None:
        raise UsageError(f"{args.mountpoint} is not mounted")
    if fstype != mount_table.FSTYPE:
        raise UsageError(f"{args.mountpoint} is a {fstype} mount, not hicachefs")
    try:
        pid = json.loads(deadline.read_bytes(Path(mountpoint, ".hicachefs", "config")))["pid"]
    except deadline.NoAnswer as exc:
        return _abort_and_remove(mountpoint, _no_answer(mountpoint, exc))
    except OSError as exc:
        if exc.errno not in mount_table.DEAD_ERRNOS:
            raise UsageError(f"cannot read the daemon's config in {args.mountpoint}: {exc.strerror}") from None
        return _remove(mountpoint, f"removed the dead mount at {mountpoint} (its daemon was gone)",
                       f"cannot remove the dead mount at {mountpoint}")
    os.kill(pid, signal.SIGTERM)
    signalled = time.monotonic()
    while time.monotonic() < signalled + UMOUNT_TIMEOUT_S:
        mounted = mount_table.filesystem_type(mountpoint) is not None
        if not mounted and not _alive(pid):
            print(f"hicachefs: unmounted {mountpoint}")
            return 0
        if mounted and time.monotonic() > signalled + UNMOUNT_AFTER_SIGTERM_S:
            return _abort_and_remove(mountpoint, f"{mountpoint}: daemon {pid} did not unmount it within "
                                                 f"{UNMOUNT_AFTER_SIGTERM_S:g} s of SIGTERM")
        time.sleep(0.05)
    print(f"hicachefs: daemon {pid} did not finish within {UMOUNT_TIMEOUT_S:.0f} s", file=sys.stderr)
    return 1


def _no_answer(mountpoint: str | Path, exc: deadline.NoAnswer) -> str:
    return f"{mountpoint}: its daemon did not answer within {exc.seconds:g} s"


def _abort_and_remove(mountpoint: str, why: str) -> int:
    """Abort the mount's FUSE connection, which fails every request waiting on its daemon, then
    unmount it; the daemon, if it ever runs again, finds its mount gone and exits."""
    return _remove(mountpoint, f"{why}; aborted its FUSE connection and removed the mount",
                   f"{why}; could not remove the mount", abort=True)


def _remove(mountpoint: str, removed: str, failed: str, abort: bool = False) -> int:
    """Remove the mount (aborting its FUSE connection first, with ``abort``); one line either way."""
    try:
        if abort:
            mount_table.abort(mountpoint)
        mount_table.remove(mountpoint)
    except OSError as exc:
        print(f"hicachefs: {failed}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"hicachefs: {removed}")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def stats(args: argparse.Namespace) -> int:
    path = Path(args.mountpoint, ".hicachefs", "stats")
    try:
        facts = json.loads(deadline.read_bytes(path))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError:
        raise UsageError(f"{path} is not hicachefs statistics") from None
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
        return 0
    print(format_stats(facts))
    return 0


def format_stats(facts: dict) -> str:
    """A table a person reads: one row per tier, then the totals."""
    tiers = facts.get("tiers", {})
    fields = ["capacity_bytes", "used_bytes", "pages", "hits", "misses", "evictions",
              "demotions", "promotions", "checksum_failures"]
    rows = [["tier", *[f.replace("_bytes", "").replace("_", " ") for f in fields]]]
    for tier, counters in tiers.items():
        rows.append([tier, *[_human(counters.get(f, 0), f.endswith("bytes")) for f in fields]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    errors = facts.get("errors") or {}
    lines.append(f"free: {_human(facts.get('free_bytes', 0), True)}   "
                 f"errors: {', '.join(f'{k} {v}' for k, v in sorted(errors.items())) or 'none'}")
    return "\n".join(lines)


def _human(value: int, is_bytes: bool) -> str:
    if not is_bytes:
        return str(value)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return str(value)


def top(args: argparse.Namespace) -> int:
    from . import top as live_view  # rich is only needed here

    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    if not 0.1 <= args.interval <= 3600:
        raise UsageError("--interval must be from 0.1 to 3600 seconds")
    try:
        return live_view.run(Path(args.mountpoint), args.count, args.interval)
    except live_view.StatsUnreadable as exc:
        raise UsageError(str(exc)) from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, with the mount.fuse3 form and every -o list turned into flags."""
    parser = build_parser()
    argv = mount_options.as_mount_command(argv)
    kernel: list[str] = []
    if argv[:1] == ["mount"]:
        try:
            argv, kernel = mount_options.expand(argv, _mount_flags(parser))
        except mount_options.OptionError as exc:
            raise UsageError(str(exc)) from None
    args = parser.parse_args(argv)
    if args.command == "mount":
        args.fuse_options = kernel
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        status = {"mount": mount, "umount": umount, "stats": stats, "top": top}[args.command](args)
        sys.stdout.flush()  # here, where a closed pipe is caught, rather than at exit
        return status
    except UsageError as exc:
        print(f"hicachefs: {exc}", file=sys.stderr)
        return 2
    except deadline.NoAnswer as exc:  # stats, top: the daemon stopped answering
        print(f"hicachefs: {_no_answer(mount_table.resolve(args.mountpoint), exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (``| head``); what is still buffered has nowhere to go.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        with contextlib.suppress(OSError):
            print("hicachefs: the output was closed before all of it was written (broken pipe)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
