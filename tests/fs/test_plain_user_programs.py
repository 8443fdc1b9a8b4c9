"""The plain user's programs run wherever the checkout is (issue 29): a clone inside a 0700
directory (``mktemp -d``, ``/root``) keeps uid 65534 from its ``.venv`` and its files, which
made the tests that attack a mount as that user fail with PermissionError."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from hicachefs_testing import attacks


@pytest.fixture
def unreachable_interpreter(tmp_path, monkeypatch):
    """The tests' interpreter as a checkout in a 0700 directory has it (pytest's ``tmp_path``
    is one): only root can reach it."""
    assert os.stat(tmp_path).st_mode & 0o777 == 0o700
    python = tmp_path / "checkout" / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))


@pytest.fixture
def listed_directory():
    directory = Path(tempfile.mkdtemp(prefix="hicachefs-listed-"))
    try:
        directory.chmod(0o755)
        for i in range(3):
            (directory / f"f{i}").touch()
        yield directory
    finally:
        shutil.rmtree(directory)


def test_an_attack_runs_as_the_plain_user_when_the_checkout_is_out_of_its_reach(unreachable_interpreter,
                                                                              listed_directory):
    with attacks.start("listing-storm", listed_directory) as storm:
        storm.wait_round()
        figures = storm.finish()
    assert figures["rounds"] >= 2 and figures["errors"] == {}


def test_a_script_runs_as_the_plain_user_with_the_exists_helpers(unreachable_interpreter):
    done = attacks.run_script("import os, plain_user; print(os.getuid(), len(plain_user.costly_request(25)))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(attacks.NOBODY), "25"]
