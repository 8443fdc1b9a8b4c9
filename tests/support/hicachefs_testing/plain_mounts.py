"""``hicachefs`` run by a plain user (uid 65534) who may mount: FUSE opened to that user for
the length of a ``with``, and the command run as it from a copy of the code it can reach.

``fuse_for`` changes what root set for the whole host (/dev/fuse's mode, and
``user_allow_other`` in /etc/fuse.conf) and always puts both back as they were. The plain
user's daemon needs pyfuse3, so it runs the tests' own interpreter: where that is out of the
plain user's reach (a ``.venv`` in a 0700 directory) a test skips, as it does when not root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import hicachefs
from hicachefs_testing.attacks import NOBODY

DEV_FUSE = "/dev/fuse"
FUSE_CONF = "/etc/fuse.conf"
#: The code the plain user runs a copy of.
CODE = Path(hicachefs.__file__).parent


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
    env = {"PYTHONPATH": str(home.parent / "code"), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    reach = subprocess.run([sys.executable, "-c", "import pyfuse3"], user=NOBODY, group=NOBODY,
                           env=env, capture_output=True)
    if reach.returncode != 0:
        pytest.skip(f"the plain user cannot run {sys.executable} with pyfuse3")
    return subprocess.run([sys.executable, "-m", "hicachefs.cli", *args], env=env, cwd=home.parent / "code",
                          user=user, group=user, capture_output=True, text=True, timeout=timeout)
