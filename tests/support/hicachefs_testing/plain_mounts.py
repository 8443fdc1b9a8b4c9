"""``hicachefs`` run by a plain user (uid 65534) who may mount: FUSE opened to that user for
the length of a ``with``, and the command run as it from a copy of the code it can reach.

``fuse_for`` changes what root set for the whole host (/dev/fuse's mode, and
``user_allow_other`` in /etc/fuse.conf) and always puts both back as they were. The plain
user runs the interpreter the tests' own stands on, with copies of hicachefs and of the
packages it imports where any user can read them: the tests' ``.venv`` may lie in a checkout
of mode 0700 (as CI's clone does), out of that user's reach. Where it is not root, a test skips.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest

import hicachefs
from hicachefs_testing.attacks import NOBODY

DEV_FUSE = "/dev/fuse"
FUSE_CONF = "/etc/fuse.conf"
#: The code the plain user runs a copy of.
CODE = Path(hicachefs.__file__).parent
#: The interpreter the tests' own stands on (a .venv's is a link to it), which any user may run.
PYTHON = os.path.realpath(sys.executable)
#: The packages hicachefs's commands and daemon import, besides the standard library.
PACKAGES = ("pyfuse3", "trio", "outcome", "sniffio", "attr", "attrs", "idna", "sortedcontainers", "numpy",
            "numpy.libs", "xxhash", "prometheus_client")


@functools.cache
def _packages() -> Path:
    """``PACKAGES`` copied once into a directory any user can read, removed at exit."""
    site = Path(pyfuse3.__file__).parents[1]  # the tests' site-packages
    copy = Path(tempfile.mkdtemp(prefix="hicachefs-plain-packages-"))
    atexit.register(shutil.rmtree, copy, True)
    os.chmod(copy, 0o755)
    for name in PACKAGES:
        for found in [site / name, *site.glob(f"{name}.cpython-*.so")]:
            if found.is_dir():
                shutil.copytree(found, copy / found.name, ignore=shutil.ignore_patterns("__pycache__"))
            elif found.exists():
                shutil.copy2(found, copy / found.name)
    return copy


def plain_env(home: Path) -> dict[str, str]:
    """The environment the plain user runs hicachefs in (see the module docstring)."""
    return {"PYTHONPATH": f"{home.parent / 'code'}:{_packages()}", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@contextlib.contextmanager
def fuse_for(user_allow_other: bool) -> Iterator[None]:
    """/dev/fuse open to the plain user, and /etc/fuse.conf with ``user_allow_other`` or
    without it; both as they were afterwards."""
    if os.geteuid() != 0:
        pytest.skip("only root may open /dev/fuse to another user")
    device = os.stat(DEV_FUSE)
    conf = Path(FUSE_CONF).read_bytes() if os.path.exists(FUSE_CONF) else None
    try:
        os.chmod(DEV_FUSE, device.st_mode & 0o7777 | 0o006)  # its group's users keep theirs
        lines = [line for line in (conf or b"").decode().splitlines() if line.strip() != "user_allow_other"]
        Path(FUSE_CONF).write_text("".join(f"{line}\n" for line in lines + ["user_allow_other"] * user_allow_other))
        yield
    finally:
        os.chmod(DEV_FUSE, device.st_mode & 0o7777)
        if conf is None:
            os.unlink(FUSE_CONF)
        else:
            Path(FUSE_CONF).write_bytes(conf)


@contextlib.contextmanager
def plain_user_directory() -> Iterator[Path]:
    """A directory of the plain user's (``mnt`` made in it), under one any user can reach, with
    a copy of the code at ``code``; removed afterwards, any mount of it first."""
    top = Path(tempfile.mkdtemp(prefix="hicachefs-plain-"))  # tmp_path is in a 0700 directory
    try:
        os.chmod(top, 0o755)
        shutil.copytree(CODE, top / "code" / "hicachefs",
                        ignore=shutil.ignore_patterns("__pycache__"))
        home = top / "home"
        (home / "mnt").mkdir(parents=True)
        for path in (home, home / "mnt"):
            os.chown(path, NOBODY, NOBODY)
        yield home
    finally:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            mountpoint = line.split()[1]
            if mountpoint.startswith(f"{top}/"):
                if subprocess.run(["fusermount3", "-u", mountpoint]).returncode != 0:
                    subprocess.run(["fusermount3", "-uz", mountpoint])
        shutil.rmtree(top)


def hicachefs(home: Path, *args: str, user: int = NOBODY, timeout: float = 60) -> subprocess.CompletedProcess:
    """``hicachefs ARGS`` run as ``user`` (root with ``user=0``) from the copy of the code beside
    ``home``; skips where the tests' interpreter is out of the plain user's reach."""
    return subprocess.run([PYTHON, "-m", "hicachefs.cli", *args], env=plain_env(home), cwd=home.parent / "code",
                          user=user, group=user, capture_output=True, text=True, timeout=timeout)


def daemon_pid(mounted: subprocess.CompletedProcess) -> int:
    """The daemon's pid that ``hicachefs mount`` names ("mounted ... (pid N, log ...)")."""
    return int(mounted.stdout.split("(pid ")[1].split(",")[0])
