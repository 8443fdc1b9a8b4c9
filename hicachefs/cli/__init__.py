"""``hicachefs mount | umount | stats | top``: validate everything, then act.

Every check that can fail runs before anything is mounted, and each failure is one line on
stderr with exit code 2 (bad input) or 1 (the operation failed). ``hicachefs SOURCE
MOUNTPOINT -o OPTIONS``, the form mount(8) and fstab use through ``mount.fuse3``, is the
mount command (``mount_options``). While it waits for the mount, ``mount`` shows how the daemon
rebuilds the disk index (``recovery_display``).

Every command that reads a mount does so with a deadline (``deadline``): a daemon that does not
answer (stopped, hung) gets one line saying so, and ``umount`` then aborts its FUSE connection
and removes the mount. Output cut off by its reader (``hicachefs stats MP | head``) ends the
command with one line too.

Each command is a module of this package with a ``command(args)``, imported only when it runs:
``mount`` loads the store and the daemon's modules, ``top`` rich; ``stats`` and ``umount`` load
neither, nor pyfuse3, trio or numpy (``tests/fs/test_cli.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from .. import deadline, mount_table
from .arguments import CommandFailed, UsageError, parse_args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        status = importlib.import_module(f"{__name__}.{args.command}").command(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, rather than at exit
        return status
    except UsageError as exc:
        print(f"hicachefs: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"hicachefs: {exc}", file=sys.stderr)
        return 1
    except deadline.NoAnswer as exc:  # stats, top: the daemon stopped answering
        print(f"hicachefs: {exc.about(mount_table.resolve(args.mountpoint))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback
        print("hicachefs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``| head``); what is still buffered has nowhere to go.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        with contextlib.suppress(OSError):
            print("hicachefs: the output was closed before all of it was written (broken pipe)", file=sys.stderr)
        return 1
