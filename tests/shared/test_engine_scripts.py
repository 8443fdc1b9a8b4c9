"""How the tests bring an engine's script up and down: an ``up`` that fails in any way, running
past its time included, is a start failure (the fixtures then run ``down`` and skip), and leaves
no process of the script's running."""

import os
import time

import pytest

from hicachefs_testing.engine import Engine, EngineDidNotStart, alive

SLOW_UP = """#!/bin/sh
mkdir -p "$2"
if [ "$1" = up ]; then
  sleep 60 &
  echo $! > "$2/child.pid"
  wait
fi
"""


def test_an_up_that_runs_past_its_time_is_a_start_failure_and_leaves_no_process(tmp_path):
    script = tmp_path / "slow.sh"
    script.write_text(SLOW_UP)
    script.chmod(0o755)

    class Slow(Engine):
        name = "Slow"

    Slow.script = str(script)  # an absolute path: SCRIPTS / it is it
    directory = tmp_path / "volume"
    with pytest.raises(EngineDidNotStart):
        Slow.run_script("up", directory, timeout=1)
    child = int((directory / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not alive(child)
    finally:
        if alive(child):
            os.kill(child, 9)
