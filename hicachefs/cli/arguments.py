"""The command line's grammar: the commands, their flags, sizes, and the mount(8) form.

Pure parsing: no I/O, no check of what a path or size is good for (``mount_config`` does that
for ``mount``). Every problem is a ``UsageError``, which the command line reports in one line.
Pure functions: thread-safe.
"""

from __future__ import annotations

import argparse
import math
import re

from . import mount_options

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class UsageError(Exception):
    """A bad flag, size or path: reported in one line, exit status 2, nothing mounted."""


class CommandFailed(Exception):
    """The operation failed for a reason that is not the input (a mount whose daemon is gone):
    reported in one line, exit status 1."""



def parse_size(text: str) -> int:
    """'64G' -> bytes; K, M, G, T are powers of 1024, an optional trailing B or iB is allowed."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"bad size {text!r}: use a number with K, M, G or T, like 64G")
    size = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if not math.isfinite(size) or size >= 1 << 63:
        raise UsageError(f"bad size {text!r}: too large")
    return int(size)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hicachefs", description="An L3 KV-cache store for SGLang, as a filesystem.",
                     epilog="exit status: 0 done; 1 the operation failed (a daemon that is gone, does not "
                            "answer, or did not start); 2 bad input (a flag, size or path, a path that is "
                            "not a hicachefs mount); 130 interrupted.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    mount = commands.add_parser("mount", help="mount a store (returns once the mount is live)")
    mount.add_argument("mountpoint")
    # For --help only: parse_args has already turned every -o into the flags below.
    mount.add_argument("-o", metavar="OPTIONS", dest="options_", action="append",
                       help="the flags below as name=value options, comma-separated, like mount(8) "
                            "takes them: memory=8G,disk=/nvme/hc,disk_size=200G,write_through")
    mount.add_argument("--memory", default="1G", help="RAM tier size, at least 16M (default 1G); sizes take K, M, G, T")
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
    mount.add_argument("--log-file", help="where a background daemon logs (default: in $XDG_RUNTIME_DIR/hicachefs/, "
                                          "else in hicachefs-UID/ in the temp dir)")
    mount.add_argument("--temp-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="discard an unpublished temporary file this long after its last close (1 to 60, default 60)")
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
                     help="seconds between views (0.1 to 3600, default 1)")
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
