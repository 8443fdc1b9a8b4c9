"""The ``-o`` form of ``hicachefs mount``, as ``mount -t fuse.hicachefs`` and fstab give it.

mount(8) runs fuse3's ``mount.fuse3`` for type ``fuse.hicachefs``, which runs
``hicachefs SOURCE MOUNTPOINT -o OPTIONS`` with the shell's default PATH (mount(8) clears
PATH, so the command must be in a directory like /usr/local/bin). ``as_mount_command`` turns
that form into ``hicachefs mount MOUNTPOINT -o OPTIONS``; SOURCE is only a label and ignored.
Without ``-o`` the first word is taken for a command, and one that is not is refused.

Each ``hicachefs mount`` flag is an option spelt with underscores, the way FUSE's own options
are: ``--disk-size 200G`` is ``disk_size=200G``, ``--write-through`` is ``write_through``.
Generic mount options are passed to the kernel with the FUSE mount (``KERNEL_FLAGS``) or
ignored when they mean something only to mount(8), fstab or systemd (``IGNORED``, ``x-*``).
Anything else is a UsageError naming the option. Pure functions: thread-safe, no I/O.
"""

from __future__ import annotations

#: Mount flags with the same meaning on any filesystem; libfuse passes them to the kernel.
KERNEL_FLAGS = frozenset({"rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "sync",
                          "async", "dirsync", "noatime", "nodiratime", "allow_other"})
#: Options for mount(8), fstab or systemd, and atime policies that FUSE leaves to the daemon
#: (which keeps atime as the page's last read).
IGNORED = frozenset({"defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
                     "_netdev", "nofail", "relatime", "norelatime", "strictatime",
                     "nostrictatime", "atime", "diratime", "lazytime", "nolazytime"})
IGNORED_PREFIXES = ("x-", "comment=")
#: The command line's subcommands; any other first word is the helper form's SOURCE.
COMMANDS = frozenset({"mount", "umount", "stats", "top"})


class OptionError(ValueError):
    """An -o option that hicachefs does not take, or takes otherwise; the message says which."""


def as_mount_command(argv: list[str]) -> list[str]:
    """``SOURCE MOUNTPOINT -o OPTIONS`` (the mount.fuse3 form) -> ``mount MOUNTPOINT ...``. The
    form needs its -o, which mount.fuse3 always passes (mount(8) gives at least ``rw``): without
    it the first word is a mistyped command, and ``hicachefs unmount MP`` mounted a new store."""
    if len(argv) >= 3 and argv[0] not in COMMANDS and not argv[0].startswith("-") \
            and any(arg.startswith("-o") for arg in argv[2:]):
        return ["mount", *argv[1:]]
    return argv


def expand(argv: list[str], flags: dict[str, bool]) -> tuple[list[str], list[str]]:
    """Replace every ``-o OPTIONS`` (or ``-oOPTIONS``) in a mount command line by the flags it
    stands for. ``flags`` maps each mount flag's option name (``disk_size``) to whether it
    takes a value. Returns the new argv and the kernel flags; raises OptionError."""
    out: list[str] = []
    kernel: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "-o":
            text = next(args, None)
            if text is None:
                raise OptionError("-o needs a comma-separated list of options")
        elif arg.startswith("-o"):
            text = arg[2:]
        else:
            out.append(arg)
            continue
        more_flags, more_kernel = parse(text, flags)
        out += more_flags
        kernel += more_kernel
    return out, kernel


def parse(text: str, flags: dict[str, bool]) -> tuple[list[str], list[str]]:
    """One ``-o`` list (``memory=8G,disk=/d,disk_size=200G,write_through,nosuid``) -> the
    mount command's flags and the kernel flags."""
    argv: list[str] = []
    kernel: list[str] = []
    for option in filter(None, text.split(",")):
        name, has_value, value = option.partition("=")
        if name in flags:
            if flags[name] != bool(has_value):
                need = f"a value ({name}=...)" if flags[name] else f"no value (just {name})"
                raise OptionError(f"mount option {name} takes {need}")
            flag = "--" + name.replace("_", "-")
            argv.append(f"{flag}={value}" if has_value else flag)  # '=' keeps a value like '-x' a value
        elif option in KERNEL_FLAGS:
            kernel.append(option)
        elif option in IGNORED or option.startswith(IGNORED_PREFIXES):
            continue
        elif option == "ro":
            raise OptionError("mount option ro: a hicachefs mount is always writable")
        elif "-" in name and name.replace("-", "_") in flags:
            raise OptionError(f"unknown mount option {name}: write it {name.replace('-', '_')}")
        else:
            raise OptionError(f"unknown mount option {name}")
    return argv, kernel
