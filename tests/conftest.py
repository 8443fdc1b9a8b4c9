"""Shared fixtures: real mounts of the daemon in temporary directories.

A missing /dev/fuse is a failure here, not a skip: every FUSE test mounts for real.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hicachefs_testing import mounting  # noqa: E402


@pytest.fixture
def mount_factory(tmp_path):
    """Mount hicachefs with given flags; every mount made is stopped and removed at teardown.

    ``mount_factory(*flags, path=None)`` returns a ``mounting.Mount``. Remounting the same
    path (after ``mounting.stop`` or ``mounting.kill``) is allowed.
    """
    assert os.path.exists("/dev/fuse"), "/dev/fuse is missing: FUSE tests cannot run"
    mounts: list[mounting.Mount] = []

    def make(*flags: str, path: Path | None = None) -> mounting.Mount:
        index = len(mounts)
        mount = mounting.start(path or tmp_path / f"mnt{index}", tmp_path / f"daemon{index}.log", list(flags))
        mounts.append(mount)
        return mount

    yield make
    failures = []
    for mount in mounts:
        mounting.stop(mount)
        failures += mounting.unexpected_log_lines(mount)
    assert not failures, "the daemon logged errors:\n" + "\n".join(failures)


@pytest.fixture
def public_mount_factory(mount_factory):
    """Like ``mount_factory``, for mounts other users can reach: pytest's temporary directories
    are 0700."""
    reachable = Path(tempfile.mkdtemp(prefix="hicachefs-other-user-"))
    mounts: list[mounting.Mount] = []

    def make(*flags: str) -> mounting.Mount:
        mounts.append(mount_factory(*flags, path=reachable / f"mnt{len(mounts)}"))
        return mounts[-1]

    try:
        reachable.chmod(0o755)
        yield make
    finally:
        for mount in mounts:
            mounting.stop(mount)  # before its directory goes; the factory's stop is then a no-op
        shutil.rmtree(reachable, ignore_errors=True)


@pytest.fixture
def public_mount(public_mount_factory):
    """A mount (64 MiB RAM) other users can reach."""
    return public_mount_factory("--memory", "64M")


#: The RAM tier of the plain mount fixtures. A mount faults its whole RAM tier in at start
#: (``store/ram/fill.py``) and gives it back at its stop: at 512 MiB that was 0.4 s of a core
#: more per mount than at 64 MiB, over some 300 mounts of the suite.
FIXTURE_MEMORY = "64M"


@pytest.fixture
def hicachefs_mount(mount_factory) -> Path:
    """A live mount with a 64 MiB RAM tier and no disk tier; yields its path."""
    return mount_factory("--memory", FIXTURE_MEMORY).path


@pytest.fixture
def mounted(mount_factory) -> mounting.Mount:
    """Like ``hicachefs_mount`` but yields the Mount (pid, log, stats)."""
    return mount_factory("--memory", FIXTURE_MEMORY)


@pytest.fixture
def demo(monkeypatch):
    """scripts/demo.py as a module, with the client's default (no SGLang needed) kept local."""
    monkeypatch.setenv("HICACHEFS_CLIENT_WITHOUT_SGLANG", "")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    return importlib.import_module("demo")
