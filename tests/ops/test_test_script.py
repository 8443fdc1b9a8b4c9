"""``scripts/test.sh`` runs every pytest run it has, whatever the ones before did, reports each,
and fails at the end if any failed (issue 29: it stopped at the first that failed).

It runs here in a copy of the checkout's ``scripts/`` beside a set-up that does nothing and a
``.venv/bin/python`` that notes how it was called and fails the runs it is told to."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
#: The fake interpreter: one line per call ("<workers> <arguments>"), and the exit status that
#: FAIL_WITHOUT_WORKERS / FAIL_WITH_WORKERS give the runs without and with HICACHEFS_TEST_WORKERS.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "${HICACHEFS_TEST_WORKERS:-none} $*" >> "$(dirname "$0")/../../calls"
if [ -n "${HICACHEFS_TEST_WORKERS:-}" ]; then exit "${FAIL_WITH_WORKERS:-0}"; fi
exit "${FAIL_WITHOUT_WORKERS:-0}"
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPTS / "test.sh", tmp_path / "scripts" / "test.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("#!/usr/bin/env bash\nexit 0\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    for script in (python, tmp_path / "scripts" / "setup.sh"):
        script.chmod(0o755)
    return tmp_path


def run_test_sh(checkout: Path, *args: str, **fail: str) -> tuple[int, list[str], list[str]]:
    """Run the copy's test.sh: its exit status, the lines of its summary, the fake's calls."""
    done = subprocess.run(["bash", str(checkout / "scripts" / "test.sh"), *args], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **fail})
    summary = done.stdout[done.stdout.index("test.sh:"):].splitlines()
    return done.returncode, summary, (checkout / "calls").read_text().splitlines()


def test_a_failing_run_does_not_stop_the_next_and_fails_the_script(checkout):
    status, summary, calls = run_test_sh(checkout, FAIL_WITHOUT_WORKERS="1")
    assert [call.split()[0] for call in calls] == ["none", "2"]
    assert summary == ["test.sh: 2 pytest run(s)", "  FAILED (exit 1): the whole suite",
                       "  passed: a subset with --workers 2"]
    assert status != 0


def test_a_failing_last_run_fails_the_script(checkout):
    status, summary, _ = run_test_sh(checkout, FAIL_WITH_WORKERS="3")
    assert summary[1:] == ["  passed: the whole suite", "  FAILED (exit 3): a subset with --workers 2"]
    assert status != 0


def test_all_runs_passing_pass_the_script(checkout):
    status, summary, calls = run_test_sh(checkout)
    assert len(calls) == 2 and summary[1:] == ["  passed: the whole suite", "  passed: a subset with --workers 2"]
    assert status == 0


def test_arguments_make_one_run_of_them(checkout):
    status, summary, calls = run_test_sh(checkout, "tests/fs/test_cli.py", "-k", "bad", FAIL_WITHOUT_WORKERS="1")
    assert calls == ["none -m pytest -q -p no:cacheprovider tests/fs/test_cli.py -k bad"]
    assert summary == ["test.sh: 1 pytest run(s)", "  FAILED (exit 1): pytest tests/fs/test_cli.py -k bad"]
    assert status != 0
