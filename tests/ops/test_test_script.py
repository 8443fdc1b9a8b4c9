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
#: The fake interpreter: one line per call (its arguments), and the exit status that FAIL_SHARED
#: gives the run of the shared tier's tests, and FAIL_OTHERS every other run.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../../calls"
case " $* " in *" tests/shared "*) exit "${FAIL_SHARED:-0}" ;; esac
exit "${FAIL_OTHERS:-0}"
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


NAMESPACE = "the namespace, the store and SGLang's cache"
SHARED = "the shared tier"
CLIENT = "the client"
OTHERS = "operations and reliability"


def test_a_failing_run_does_not_stop_the_next_and_fails_the_script(checkout):
    status, summary, calls = run_test_sh(checkout, FAIL_OTHERS="1")
    assert sorted(calls) == sorted([
        "-m pytest -q -p no:cacheprovider --durations=8 tests/fs tests/store tests/sglang tests/test_mounting.py "
        "tests/test_name_rules.py",
        "-m pytest -q -p no:cacheprovider --durations=8 tests/shared",
        "-m pytest -q -p no:cacheprovider --durations=8 tests/client tests/scripts",
        "-m pytest -q -p no:cacheprovider --durations=8 tests/ops tests/reliability"])
    assert summary == ["test.sh: 4 pytest run(s)", f"  FAILED (exit 1): {NAMESPACE}", f"  passed: {SHARED}",
                       f"  FAILED (exit 1): {CLIENT}", f"  FAILED (exit 1): {OTHERS}"]
    assert status != 0


def test_a_failing_last_run_of_a_lane_fails_the_script(checkout):
    status, summary, _ = run_test_sh(checkout, FAIL_SHARED="3")
    assert summary[1:] == [f"  passed: {NAMESPACE}", f"  FAILED (exit 3): {SHARED}", f"  passed: {CLIENT}",
                           f"  passed: {OTHERS}"]
    assert status != 0


def test_all_runs_passing_pass_the_script(checkout):
    status, summary, calls = run_test_sh(checkout)
    assert len(calls) == 4 and summary[1:] == [f"  passed: {NAMESPACE}", f"  passed: {SHARED}", f"  passed: {CLIENT}",
                                               f"  passed: {OTHERS}"]
    assert status == 0


def test_arguments_make_one_run_of_them(checkout):
    status, summary, calls = run_test_sh(checkout, "tests/fs/test_cli.py", "-k", "bad", FAIL_OTHERS="1")
    assert calls == ["-m pytest -q -p no:cacheprovider --durations=8 tests/fs/test_cli.py -k bad"]
    assert summary == ["test.sh: 1 pytest run(s)", "  FAILED (exit 1): pytest tests/fs/test_cli.py -k bad"]
    assert status != 0


def test_every_test_of_the_suite_is_in_a_run():
    """The runs name their directories: a new one must be given a lane, or CI never runs it."""
    tests = SCRIPTS.parent / "tests"
    places = {f"tests/{path.relative_to(tests).parts[0]}" for path in tests.rglob("test_*.py")}
    lanes = (SCRIPTS / "test.sh").read_text()
    assert places and not {place for place in places if f" {place}" not in lanes and f"|{place}" not in lanes}
