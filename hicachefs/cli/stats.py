"""``hicachefs stats``: the mount's ``.hicachefs/stats`` as a table a person reads, or as JSON.

Reads the stats file once, with a deadline (``deadline.NoAnswer`` when the daemon does not
answer), in the caller's thread. Imports nothing heavy: a look at a busy host's store should
cost milliseconds (0.03 s to start and import, against 0.23 s with the daemon's modules, on the
2-core development VM).
"""

from __future__ import annotations

import argparse
import errno
import json
from pathlib import Path

from .. import deadline, mount_table
from .arguments import CommandFailed, UsageError
from .umount import closed_hint


def read_stats(mountpoint: Path) -> dict:
    """The mount's stats file, parsed; CommandFailed when the mount's daemon is gone, UsageError
    when it cannot be read otherwise (not a hicachefs mount) or is not hicachefs statistics."""
    path = Path(mountpoint, ".hicachefs", "stats")
    try:
        return json.loads(deadline.read_bytes(path))
    except OSError as exc:
        raise _unreadable(mountpoint, path, exc) from None
    except ValueError:
        raise UsageError(f"{path} is not hicachefs statistics") from None


def _unreadable(mountpoint: Path, path: Path, exc: OSError) -> Exception:
    """Why the stats file could not be read, in words the user acts on: looked up in the mount
    table only now, so that a mount reached by another path (``/proc/PID/root/...``) still works."""
    if exc.errno in mount_table.DEAD_ERRNOS:
        return CommandFailed(f"{mountpoint}: its daemon is gone (a dead mount; hicachefs umount removes it)")
    fstype = mount_table.filesystem_type(mount_table.resolve(mountpoint))
    if fstype is None:
        return UsageError(f"{mountpoint} is not a hicachefs mount")
    if fstype != mount_table.FSTYPE:
        return UsageError(f"{mountpoint} is a mount of type {fstype}, not hicachefs")
    owner = mount_table.closed_to_caller(mountpoint)
    if exc.errno == errno.EACCES and owner is not None:  # FUSE lets only its user in, root included
        return CommandFailed(f"{mountpoint}: {closed_hint(owner, 'stats')}")
    return UsageError(f"cannot read {path}: {exc.strerror}")


def command(args: argparse.Namespace) -> int:
    facts = read_stats(args.mountpoint)
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
        return 0
    print(format_stats(facts))
    return 0


def format_stats(facts: dict) -> str:
    """A table a person reads: one row per tier, then the totals. A field the daemon does not
    report (a daemon of an earlier release, during an upgrade) shows as ``-``: shown as 0, an
    old daemon's every tier read as full."""
    tiers = facts.get("tiers", {})
    fields = ["capacity_bytes", "used_bytes", "free_bytes", "pages", "hits", "misses", "evictions",
              "demotions", "promotions", "checksum_failures"]
    rows = [["tier", *[f.replace("_bytes", "").replace("_", " ") for f in fields]]]
    for tier, counters in tiers.items():
        rows.append([tier, *["-" if f not in counters else _human(counters[f], f.endswith("bytes")) for f in fields]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    errors = facts.get("errors") or {}
    lines.append(f"free: {_human(facts.get('free_bytes', 0), True)}   "
                 f"errors: {', '.join(f'{k} {v}' for k, v in sorted(errors.items())) or 'none'}")
    shared = _shared_failures(tiers.get("shared"))
    if shared:
        lines.append(shared)
    return "\n".join(lines)


def _shared_failures(shared: dict | None) -> str:
    """A line for a shared tier whose writes or calls failed, with the last error: the errors
    line counts refused requests only, and said 'none' for a daemon that could write nothing to
    the shared directory (another uid's), its pages reaching no other host."""
    if not shared or not (shared.get("write_failures") or shared.get("io_errors")):
        return ""
    return (f"shared tier: write failures {shared.get('write_failures', 0)}, "
            f"I/O errors {shared.get('io_errors', 0)}; last error: {shared.get('last_error') or 'none'}")


def _human(value: int, is_bytes: bool) -> str:
    if not is_bytes:
        return str(value)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return str(value)
